/* The usage reader: an Envoy HTTP filter (dynamic module, filter name "usage_reader")
 * in place of json_to_metadata, sse_to_metadata and the stream usage Lua filter
 * (sluicegate/xds/translate/usage.py and stream_usage.py are its specification;
 * usage_scanner.c does the reading, this file talks to Envoy).
 *
 * Who reads an answer is the request's `usage_header` (set by the routing stage):
 * `by_log` a JSON answer, `by_stream` an event stream, `by_chunks` an event stream also
 * cut (usage injected); one of `by_nobody`: nothing; absent or another value: whichever
 * the answer's media type is, a stream cut as its metadata asks (Envoy's readers each
 * ran on their media type then). An answer not of the reader's media type passes
 * untouched. Nothing is held back but a cut's unfinished event.
 *
 * Every stream read is counted (its events that carried text), with or without a
 * reservation (docs/native-filters.md, "Every stream counted").
 *
 * Never fatal: a failed allocation stops the reading (the bytes pass as they came). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "envoy_abi.h"
#include "filter_kind.h"
#include "usage_scanner.h"

#define FILTER_NAME "usage_reader"

/* ---- configuration --------------------------------------------------------------- */

enum {
  K_USAGE_HEADER, K_BY_LOG, K_BY_STREAM, K_BY_CHUNKS, K_BY_NOBODY, K_NAMESPACE, K_INJECTED,
  K_INJECTED_VALUE, K_USAGE_NAMESPACE, K_COUNT_KEY, K_MEMBERS, K_COUNT
};
static const char *const KEYS[K_COUNT] = {
    "usage_header", "by_log", "by_stream", "by_chunks", "by_nobody", "namespace", "injected",
    "injected_value", "usage_namespace", "count_key", "members",
};

typedef struct {
  const sg_filter_kind *kind; /* first: filter_kind.h */
  char *values[K_COUNT]; /* each NUL-terminated, all required */
  size_t lengths[K_COUNT];
  sg_names *names;
} config_t;

static sg_module_buffer setting(const config_t *config, int key) {
  return (sg_module_buffer){config->values[key], config->lengths[key]};
}

static void config_free(config_t *config) {
  if (config == NULL) return;
  for (int k = 0; k < K_COUNT; k++) free(config->values[k]);
  sg_names_free(config->names);
  free(config);
}

/* One `key=value` line; false for an unknown or repeated key, or no memory. */
static bool config_line(config_t *config, const char *line, size_t length) {
  const char *eq = memchr(line, '=', length);
  if (eq == NULL) return false;
  size_t key_length = (size_t)(eq - line), value_length = length - key_length - 1;
  for (int k = 0; k < K_COUNT; k++) {
    if (strlen(KEYS[k]) != key_length || memcmp(KEYS[k], line, key_length) != 0) continue;
    if (config->values[k] != NULL || value_length == 0) return false;
    config->values[k] = malloc(value_length + 1);
    if (config->values[k] == NULL) return false;
    memcpy(config->values[k], eq + 1, value_length);
    config->values[k][value_length] = 0;
    config->lengths[k] = value_length;
    return true;
  }
  return false;
}

/* The lines of `text` (empty lines skipped); NULL when one is wrong or one is missing. */
static config_t *config_parse(const char *text, size_t length) {
  config_t *config = calloc(1, sizeof *config);
  if (config == NULL) return NULL;
  size_t start = 0;
  for (size_t i = 0; i <= length; i++) {
    if (i < length && text[i] != '\n') continue;
    size_t end = i;
    if (end > start && text[end - 1] == '\r') end--;
    if (end > start && !config_line(config, text + start, end - start)) {
      config_free(config);
      return NULL;
    }
    start = i + 1;
  }
  for (int k = 0; k < K_COUNT; k++)
    if (config->values[k] == NULL) {
      config_free(config);
      return NULL;
    }
  config->names = sg_names_new(config->values[K_MEMBERS], config->lengths[K_MEMBERS]);
  if (config->names == NULL) {
    config_free(config);
    return NULL;
  }
  return config;
}

/* ---- media types ------------------------------------------------------------------- */

static char lower(char c) { return c >= 'A' && c <= 'Z' ? (char)(c + 32) : c; }

static bool starts_folded(const char *s, size_t n, const char *word) {
  size_t len = strlen(word);
  if (n < len) return false;
  for (size_t i = 0; i < len; i++)
    if (lower(s[i]) != word[i]) return false;
  return true;
}

/* RE2's \s. */
static bool is_re_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f';
}

static bool is_subtype_byte(char c) {
  c = lower(c);
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '+' || c == '-';
}

/* wire.JSON_MEDIA_TYPE_REGEX, matched whole:
 * (?i)\s*application/([a-z0-9.+-]*\+)?json\s*(;.*)? */
static bool json_media(sg_envoy_buffer type) {
  const char *s = type.ptr;
  size_t n = type.length, i = 0;
  while (i < n && is_re_space(s[i])) i++;
  if (!starts_folded(s + i, n - i, "application/")) return false;
  i += strlen("application/");
  size_t start = i;
  while (i < n && is_subtype_byte(s[i])) i++;
  size_t len = i - start;
  if (len < 4 || !starts_folded(s + i - 4, 4, "json")) return false;
  if (len > 4 && s[i - 5] != '+') return false;
  while (i < n && is_re_space(s[i])) i++;
  return i == n || (s[i] == ';' && memchr(s + i, '\n', n - i) == NULL); /* `.`: not LF */
}

/* sse_to_metadata's rule: the type before any `;`, trimmed, is text/event-stream. */
static bool event_stream_media(sg_envoy_buffer type) {
  const char *s = type.ptr;
  size_t n = type.length, i = 0;
  if (n == 0) return false; /* and s may be NULL */
  const char *semicolon = memchr(s, ';', n);
  if (semicolon != NULL) n = (size_t)(semicolon - s);
  while (i < n && (s[i] == ' ' || s[i] == '\t')) i++;
  while (n > i && (s[n - 1] == ' ' || s[n - 1] == '\t')) n--;
  return n - i == strlen("text/event-stream") && starts_folded(s + i, n - i, "text/event-stream");
}

/* ---- the filter -------------------------------------------------------------------- */

/* Who reads this answer, by the request's usage header. */
enum { READ_NONE, READ_ANY, READ_JSON, READ_STREAM, READ_CHUNKS };

#define NOTHING_WRITTEN SIZE_MAX

/* Slices of a chunk the filter's array has room for at first (grown when a chunk has
 * more, and kept for the next). */
#define SLICES_AT_FIRST 16

typedef struct {
  const sg_filter_kind *kind; /* first: filter_kind.h */
  const config_t *config;
  int reader;
  sg_scanner *scanner; /* from the response's headers, when it is read */
  bool counts;
  size_t written_count; /* NOTHING_WRITTEN until the count is first written */
  sg_envoy_buffer *slices; /* a chunk's slices, reused chunk after chunk */
  size_t slice_capacity;
} filter_t;

/* What Envoy gets when a filter cannot be made: reads nothing, never freed. */
static const filter_t INERT = {&sg_usage_reader, NULL, READ_NONE, NULL, false, 0, NULL, 0};

static sg_module_buffer text(const char *s) { return (sg_module_buffer){s, strlen(s)}; }

static bool same(sg_envoy_buffer value, const config_t *config, int key) {
  return value.length == config->lengths[key] &&
         memcmp(value.ptr, config->values[key], value.length) == 0;
}

/* Whether `value` is one of the comma-separated names of setting `key`. */
static bool in_list(sg_envoy_buffer value, const config_t *config, int key) {
  const char *list = config->values[key];
  size_t length = config->lengths[key], start = 0;
  for (size_t i = 0; i <= length; i++) {
    if (i < length && list[i] != ',') continue;
    if (i - start == value.length && (value.length == 0 ||
                                      memcmp(list + start, value.ptr, value.length) == 0))
      return true;
    start = i + 1;
  }
  return false;
}

static int reader_of(const config_t *config, sg_filter_envoy envoy) {
  sg_envoy_buffer value = {NULL, 0};
  if (!envoy_dynamic_module_callback_http_get_header(
          envoy, SG_REQUEST_HEADERS, setting(config, K_USAGE_HEADER), &value, 0, NULL))
    return READ_ANY;
  if (same(value, config, K_BY_LOG)) return READ_JSON;
  if (same(value, config, K_BY_STREAM)) return READ_STREAM;
  if (same(value, config, K_BY_CHUNKS)) return READ_CHUNKS;
  return in_list(value, config, K_BY_NOBODY) ? READ_NONE : READ_ANY;
}

static bool metadata_string(const filter_t *f, sg_filter_envoy envoy, int key,
                            sg_envoy_buffer *value) {
  return envoy_dynamic_module_callback_http_get_metadata_string(
      envoy, SG_METADATA_DYNAMIC, setting(f->config, K_NAMESPACE), setting(f->config, key),
      value);
}

static void write_count(filter_t *f, sg_filter_envoy envoy, size_t count) {
  envoy_dynamic_module_callback_http_set_dynamic_metadata_number(
      envoy, setting(f->config, K_USAGE_NAMESPACE), setting(f->config, K_COUNT_KEY),
      (double)count);
  f->written_count = count;
}

/* The count as it stands, if it changed since it was last written: at the stream's end,
 * or when it stops being read. Once a stream, not after every event: a long generation
 * has thousands, each a metadata write in Envoy (RESULTS.md, "Every stream counted"). */
static void write_final_count(filter_t *f, sg_filter_envoy envoy) {
  if (f->counts && f->scanner != NULL && sg_scanner_count(f->scanner) != f->written_count)
    write_count(f, envoy, sg_scanner_count(f->scanner));
}

/* The values committed since the last write (a usage event's, a few a stream). */
static void write_usage(filter_t *f, sg_filter_envoy envoy) {
  const sg_names *names = f->config->names;
  unsigned changed = sg_scanner_changed(f->scanner);
  for (size_t slot = 0; changed != 0 && slot < sg_names_slots(names); slot++) {
    double value;
    if (!(changed & (1u << slot)) || !sg_scanner_value(f->scanner, slot, &value)) continue;
    envoy_dynamic_module_callback_http_set_dynamic_metadata_number(
        envoy, setting(f->config, K_USAGE_NAMESPACE), text(sg_names_key(names, slot)), value);
  }
}

/* For a stream marked by_chunks: cut, if the request's metadata says its usage was
 * injected. */
static int chunk_flags(filter_t *f, sg_filter_envoy envoy) {
  sg_envoy_buffer value = {NULL, 0};
  sg_module_buffer cut = setting(f->config, K_INJECTED_VALUE);
  if (metadata_string(f, envoy, K_INJECTED, &value) && value.length == cut.length &&
      memcmp(value.ptr, cut.ptr, cut.length) == 0)
    return SG_CUT;
  return 0;
}

/* The scanner for this answer, or none (0: not read). */
static void start_reading(filter_t *f, sg_filter_envoy envoy) {
  sg_envoy_buffer type = {NULL, 0};
  bool typed = envoy_dynamic_module_callback_http_get_header(
      envoy, SG_RESPONSE_HEADERS, text("content-type"), &type, 0, NULL);
  bool json = !typed || json_media(type), stream = typed && event_stream_media(type);
  int kind = -1, flags = 0;
  if (json && (f->reader == READ_JSON || f->reader == READ_ANY)) kind = SG_JSON;
  if (stream && f->reader == READ_STREAM) kind = SG_SSE, flags = SG_COUNT;
  if (stream && (f->reader == READ_CHUNKS || f->reader == READ_ANY))
    kind = SG_SSE, flags = chunk_flags(f, envoy) | SG_COUNT;
  if (kind < 0) return;
  f->slices = calloc(SLICES_AT_FIRST, sizeof *f->slices);
  if (f->slices == NULL) return;
  f->slice_capacity = SLICES_AT_FIRST;
  f->scanner = sg_scanner_new(f->config->names, kind, flags);
  if (f->scanner == NULL) return;
  /* A cut makes the body shorter than a provider's content-length: without it the answer
   * goes chunked (the Lua's rule). */
  if (flags & SG_CUT)
    envoy_dynamic_module_callback_http_set_header(envoy, SG_RESPONSE_HEADERS,
                                                  text("content-length"), text(""));
  /* Written once, at the end (write_final_count), even if 0: off the first token's path. */
  if (flags & SG_COUNT) {
    f->counts = true;
    f->written_count = NOTHING_WRITTEN;
  }
}

/* The received slices into f->slices (grown if need be): how many, or SIZE_MAX when they
 * cannot be had (no memory for a bigger array, or Envoy refused). */
static size_t slices(filter_t *f, sg_filter_envoy envoy) {
  size_t count =
      envoy_dynamic_module_callback_http_get_body_chunks_size(envoy, SG_RECEIVED_RESPONSE_BODY);
  if (count == 0) return 0;
  if (count > f->slice_capacity) {
    if (count > SIZE_MAX / 2 / sizeof *f->slices) return SIZE_MAX;
    size_t capacity = count > f->slice_capacity * 2 ? count : f->slice_capacity * 2;
    sg_envoy_buffer *grown = realloc(f->slices, capacity * sizeof *grown);
    if (grown == NULL) return SIZE_MAX;
    f->slices = grown;
    f->slice_capacity = capacity;
  }
  if (!envoy_dynamic_module_callback_http_get_body_chunks(envoy, SG_RECEIVED_RESPONSE_BODY,
                                                          f->slices))
    return SIZE_MAX;
  return count;
}

/* The cut could not keep a chunk: the held bytes go first, then the chunk as it came.
 * Appending copies the chunk's slices before the drain frees them (Envoy's buffer
 * keeps a slice's memory where it is while more is appended). */
static void pass_held_then(filter_t *f, sg_filter_envoy envoy, const sg_envoy_buffer *chunk,
                           size_t count) {
  const char *held;
  size_t held_length, total = 0;
  sg_scanner_held(f->scanner, &held, &held_length);
  if (held_length == 0) return; /* the chunk alone: it stays as it is */
  envoy_dynamic_module_callback_http_append_body(envoy, SG_RECEIVED_RESPONSE_BODY,
                                                 (sg_module_buffer){held, held_length});
  for (size_t c = 0; c < count; c++) {
    total += chunk[c].length;
    envoy_dynamic_module_callback_http_append_body(
        envoy, SG_RECEIVED_RESPONSE_BODY, (sg_module_buffer){chunk[c].ptr, chunk[c].length});
  }
  envoy_dynamic_module_callback_http_drain_body(envoy, SG_RECEIVED_RESPONSE_BODY, total);
}

/* The chunk replaced by what the cut lets through, when it changed it. */
static void pass_cut(filter_t *f, sg_filter_envoy envoy, size_t chunk_length, int body_type) {
  const char *out;
  size_t length;
  if (!sg_scanner_take(f->scanner, &out, &length)) return;
  if (chunk_length > 0)
    envoy_dynamic_module_callback_http_drain_body(envoy, body_type, chunk_length);
  if (length > 0)
    envoy_dynamic_module_callback_http_append_body(envoy, body_type,
                                                   (sg_module_buffer){out, length});
}

/* A chunk whose slices cannot be had (no memory for a bigger array, or Envoy refused
 * them): the reading stops, the chunk unread. The one case where a cut's held bytes
 * cannot go before the chunk (they cannot be put in front without the chunk's bytes):
 * they follow it. */
static void give_up(filter_t *f, sg_filter_envoy envoy) {
  write_final_count(f, envoy);
  const char *held;
  size_t held_length;
  sg_scanner_held(f->scanner, &held, &held_length);
  if (held_length > 0)
    envoy_dynamic_module_callback_http_append_body(envoy, SG_RECEIVED_RESPONSE_BODY,
                                                   (sg_module_buffer){held, held_length});
  sg_scanner_free(f->scanner);
  f->scanner = NULL;
}

static void read_chunk(filter_t *f, sg_filter_envoy envoy, bool end_of_stream) {
  size_t count = slices(f, envoy);
  if (count == SIZE_MAX) return give_up(f, envoy);
  const sg_envoy_buffer *chunk = f->slices;
  size_t total = 0;
  bool kept = true;
  for (size_t c = 0; c < count; c++) {
    total += chunk[c].length;
    if (sg_scanner_push(f->scanner, chunk[c].ptr, chunk[c].length) != SG_OK) kept = false;
  }
  if (end_of_stream) sg_scanner_finish(f->scanner);
  if (kept)
    pass_cut(f, envoy, total, SG_RECEIVED_RESPONSE_BODY);
  else
    pass_held_then(f, envoy, chunk, count);
  write_usage(f, envoy);
  if (end_of_stream) write_final_count(f, envoy);
}

/* ---- the kind (module.c calls these from Envoy's hooks) --------------------------- */

static void *usage_config_new(const char *text, size_t length) {
  config_t *config = config_parse(text, length);
  if (config != NULL) config->kind = &sg_usage_reader;
  return config;
}

static void usage_config_destroy(void *config) { config_free(config); }

static void *usage_filter_new(void *config, sg_filter_envoy envoy) {
  filter_t *f = calloc(1, sizeof *f);
  if (f == NULL) return (void *)&INERT;
  f->kind = &sg_usage_reader;
  f->config = config;
  /* An answer whose request this filter did not see (a reply an earlier filter made)
   * has no usage header: read by its media type. */
  f->reader = READ_ANY;
  return f;
}

static void usage_filter_destroy(void *module) {
  if (module == &INERT) return;
  filter_t *f = module;
  sg_scanner_free(f->scanner);
  free(f->slices);
  free(f);
}

static int usage_request_headers(sg_filter_envoy envoy, void *module, bool end_of_stream) {
  if (module == &INERT) return SG_CONTINUE;
  filter_t *f = module;
  f->reader = reader_of(f->config, envoy);
  return SG_CONTINUE;
}

static int usage_request_body(sg_filter_envoy envoy, void *module, bool end_of_stream) {
  return SG_CONTINUE;
}

static int usage_request_trailers(sg_filter_envoy envoy, void *module) { return SG_CONTINUE; }

static int usage_response_headers(sg_filter_envoy envoy, void *module, bool end_of_stream) {
  if (module == &INERT) return SG_CONTINUE;
  filter_t *f = module;
  if (f->reader == READ_NONE || f->scanner != NULL) return SG_CONTINUE;
  start_reading(f, envoy);
  if (end_of_stream) write_final_count(f, envoy); /* no body */
  return SG_CONTINUE;
}

static int usage_response_body(sg_filter_envoy envoy, void *module, bool end_of_stream) {
  if (module == &INERT) return SG_CONTINUE;
  filter_t *f = module;
  if (f->scanner != NULL) read_chunk(f, envoy, end_of_stream);
  return SG_CONTINUE;
}

/* Trailers end the body: what the cut still holds goes before them. */
static int usage_response_trailers(sg_filter_envoy envoy, void *module) {
  if (module == &INERT) return SG_CONTINUE;
  filter_t *f = module;
  if (f->scanner == NULL) return SG_CONTINUE;
  sg_scanner_finish(f->scanner);
  pass_cut(f, envoy, 0, SG_BUFFERED_RESPONSE_BODY);
  write_usage(f, envoy);
  write_final_count(f, envoy);
  return SG_CONTINUE;
}

/* Every stream, before Envoy logs it: a stream reset midway (a client that left, a
 * provider that broke off) has no end, so its count as it stood is written here (an
 * ended stream's was written at its end). */
static void usage_stream_complete(sg_filter_envoy envoy, void *module) {
  if (module == &INERT) return;
  write_final_count(module, envoy);
}

const sg_filter_kind sg_usage_reader = {
    .name = FILTER_NAME,
    .config_new = usage_config_new,
    .config_destroy = usage_config_destroy,
    .filter_new = usage_filter_new,
    .filter_destroy = usage_filter_destroy,
    .request_headers = usage_request_headers,
    .request_body = usage_request_body,
    .request_trailers = usage_request_trailers,
    .response_headers = usage_response_headers,
    .response_body = usage_response_body,
    .response_trailers = usage_response_trailers,
    .stream_complete = usage_stream_complete,
};
