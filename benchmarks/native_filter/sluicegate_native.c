/* sluicegate's model reader, routing subset, as an Envoy dynamic module (a benchmark:
 * benchmarks/native_filter_cost.py; the product's reader is the Lua filter that
 * sluicegate/xds/translate/model_reader.py generates).
 *
 * Two HTTP filters, chosen by the filter_name of the DynamicModuleFilter:
 *
 * - "pass": Continue everywhere (what a dynamic module costs by itself);
 * - "model": buffers the request body, walks the top level of the JSON object as the Lua
 *   reader does (a string skipped to its closing quote, honouring backslashes; a nested
 *   value by its brackets; no value parsed), and writes into the `sluicegate` dynamic
 *   metadata namespace `model` (string) and `stream` (bool), or `body_problem` for a body
 *   it refuses (json, object, model, model_type, stream, n, duplicate_<member>,
 *   max_tokens_<member>: the routes answering them are named after them), sets
 *   x-sluicegate-usage by the Lua reader's rule (stream / log / none), for a stream whose
 *   client did not ask for its usage (of a model in asks_usage, on an endpoint that takes
 *   the option) splices "stream_options":{"include_usage":true}, after the body's opening
 *   brace (usage_injected, stream-chunks), and clears the route cache. Its filter_config
 *   (a StringValue) is lines of "default_max_tokens=<n>", "max_output_tokens=<n>"
 *   (admission's) and "asks_usage=<model>" (one a model).
 *
 * Not done here (the Lua reader does them): tenants (the key check's client header,
 * priority classes, models allowed, auto tenants' held models), token estimates and the
 * scenario a client asks for. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi_subset.h"

#define EXPORT __attribute__((visibility("default")))

/* The members the reader reads (wire.BODY_READ_MEMBERS); a repeated one is refused. */
enum {
  M_MODEL, M_STREAM, M_STREAM_OPTIONS, M_N, M_MAX_COMPLETION_TOKENS, M_MAX_TOKENS,
  M_MAX_OUTPUT_TOKENS, M_MESSAGES, M_PROMPT, M_INPUT, M_INSTRUCTIONS, M_TOOLS, M_FUNCTIONS,
  M_LOGPROBS, M_TOP_LOGPROBS, M_COUNT
};
static const char *const MEMBERS[M_COUNT] = {
    "model", "stream", "stream_options", "n", "max_completion_tokens", "max_tokens",
    "max_output_tokens", "messages", "prompt", "input", "instructions", "tools", "functions",
    "logprobs", "top_logprobs",
};
static const int CAPS[] = {M_MAX_COMPLETION_TOKENS, M_MAX_TOKENS, M_MAX_OUTPUT_TOKENS};
static const int LOGPROBS[] = {M_LOGPROBS, M_TOP_LOGPROBS};
static const char *const ENDPOINTS[] = {"/chat/completions", "/completions", "/responses"};
static const char *const USAGE_ENDPOINTS[] = {"/chat/completions", "/completions"};
static const char INCLUDE_USAGE[] = "\"stream_options\":{\"include_usage\":true},";
#define MAX_N 128
#define LOG_MAX_OUTPUT_TOKENS 4096
#define MAX_DEPTH 1024 /* nesting deeper than this is refused as not JSON */

enum { KIND_PASS, KIND_MODEL };

typedef struct {
  int kind;
  long long default_max_tokens;
  long long max_output_tokens;
  char **asks_usage; /* models every route of which asks a stream's usage */
  size_t asks_usage_count;
} config_t;

static sg_module_buffer text(const char *s) { return (sg_module_buffer){s, strlen(s)}; }

/* ---- the walk --------------------------------------------------------------------- */

typedef struct {
  const char *start; /* first byte of the raw value, NULL when absent */
  size_t length;
} span_t;

typedef struct {
  span_t found[M_COUNT];
  int repeated; /* the first member seen twice, or -1 */
} members_t;

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

static size_t skip_space(const char *s, size_t n, size_t i) {
  while (i < n && is_space(s[i])) i++;
  return i;
}

/* The index of the quote closing the string opened at s[i], or n. */
static size_t string_end(const char *s, size_t n, size_t i) {
  size_t j = i + 1;
  for (;;) {
    const char *q = j < n ? memchr(s + j, '"', n - j) : NULL;
    if (q == NULL) return n;
    j = (size_t)(q - s);
    size_t k = j;
    while (k > i + 1 && s[k - 1] == '\\') k--;
    if ((j - k) % 2 == 0) return j;
    j++;
  }
}

/* The index of the last byte of the value starting at s[i], or n when it has none. */
static size_t value_end(const char *s, size_t n, size_t i) {
  char c = s[i];
  if (c == '"') return string_end(s, n, i);
  if (c == '{' || c == '[') {
    char closers[MAX_DEPTH];
    size_t depth = 0;
    for (size_t j = i; j < n; j++) {
      c = s[j];
      if (c == '"') {
        j = string_end(s, n, j);
        if (j == n) return n;
      } else if (c == '{' || c == '[') {
        if (depth == MAX_DEPTH) return n;
        closers[depth++] = c == '{' ? '}' : ']';
      } else if (c == '}' || c == ']') {
        if (depth == 0 || closers[depth - 1] != c) return n;
        if (--depth == 0) return j;
      }
    }
    return n;
  }
  size_t j = i;
  while (j < n && s[j] != ',' && s[j] != '}' && s[j] != ']' && !is_space(s[j]) && s[j] != '\v' &&
         s[j] != '\f')
    j++;
  if (j == i) return n;
  return j - 1; /* a scalar may end the text */
}

static int is_number(const char *s, size_t n) {
  size_t i = 0;
  if (i < n && s[i] == '-') i++;
  if (i < n && s[i] == '0') {
    i++;
  } else if (i < n && s[i] >= '1' && s[i] <= '9') {
    while (i < n && s[i] >= '0' && s[i] <= '9') i++;
  } else {
    return 0;
  }
  if (i < n && s[i] == '.' && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '9') {
    i++;
    while (i < n && s[i] >= '0' && s[i] <= '9') i++;
  }
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    size_t k = i + 1;
    if (k < n && (s[k] == '+' || s[k] == '-')) k++;
    if (k < n && s[k] >= '0' && s[k] <= '9') {
      while (k < n && s[k] >= '0' && s[k] <= '9') k++;
      i = k;
    }
  }
  return i == n;
}

static int raw_is(span_t v, const char *word) {
  size_t len = strlen(word);
  return v.start != NULL && v.length == len && memcmp(v.start, word, len) == 0;
}

/* A top level that is not an object: "object" when it is one whole JSON value. */
static const char *not_object(const char *s, size_t n, size_t i) {
  size_t stop = value_end(s, n, i);
  if (stop == n || skip_space(s, n, stop + 1) != n) return "json";
  span_t raw = {s + i, stop - i + 1};
  char c = s[i];
  if (c == '"' || c == '[' || raw_is(raw, "true") || raw_is(raw, "false") ||
      raw_is(raw, "null") || is_number(raw.start, raw.length))
    return "object";
  return "json";
}

static int member_index(const char *key, size_t len) {
  for (int m = 0; m < M_COUNT; m++)
    if (strlen(MEMBERS[m]) == len && memcmp(MEMBERS[m], key, len) == 0) return m;
  return -1;
}

static int folded_member(const char *key, size_t len) {
  char lower[32];
  if (len >= sizeof lower) return 0;
  for (size_t k = 0; k < len; k++)
    lower[k] = (key[k] >= 'A' && key[k] <= 'Z') ? (char)(key[k] + 32) : key[k];
  return member_index(lower, len) >= 0;
}

/* The members read (and the first repeated one), or a problem. */
static const char *members(const char *s, size_t n, members_t *out) {
  memset(out, 0, sizeof *out);
  out->repeated = -1;
  size_t i = skip_space(s, n, 0);
  if (i == n) return "json";
  if (s[i] != '{') return not_object(s, n, i);
  i = skip_space(s, n, i + 1);
  if (i < n && s[i] == '}') return skip_space(s, n, i + 1) != n ? "json" : NULL;
  for (;;) {
    if (i == n || s[i] != '"') return "json";
    size_t e = string_end(s, n, i);
    if (e == n) return "json";
    const char *key = s + i + 1;
    size_t key_len = e - i - 1;
    for (size_t k = 0; k < key_len; k++)
      if (key[k] == '\\' || (unsigned char)key[k] >= 128) return "json";
    int m = member_index(key, key_len);
    if (m < 0 && folded_member(key, key_len)) return "json";
    i = skip_space(s, n, e + 1);
    if (i == n || s[i] != ':') return "json";
    size_t start = skip_space(s, n, i + 1);
    if (start == n) return "json";
    size_t stop = value_end(s, n, start);
    if (stop == n) return "json";
    if (m >= 0) {
      if (out->found[m].start != NULL) {
        if (out->repeated < 0) out->repeated = m;
      } else {
        out->found[m] = (span_t){s + start, stop - start + 1};
      }
    }
    i = skip_space(s, n, stop + 1);
    if (i == n) return "json";
    if (s[i] == '}') return skip_space(s, n, i + 1) != n ? "json" : NULL;
    if (s[i] != ',') return "json";
    i = skip_space(s, n, i + 1);
  }
}

/* A whole number from 1 to `most`: 0 when absent or null, -1 when anything else. */
static long long counted(span_t raw, long long most) {
  if (raw.start == NULL || raw_is(raw, "null")) return 0;
  if (raw.length > 15 || raw.start[0] < '1' || raw.start[0] > '9') return -1;
  long long value = 0;
  for (size_t k = 0; k < raw.length; k++) {
    if (raw.start[k] < '0' || raw.start[k] > '9') return -1;
    value = value * 10 + (raw.start[k] - '0');
  }
  return value <= most ? value : -1;
}

/* Whether the path, without its query and trailing slashes, ends with an endpoint. */
static int endpoint_in(sg_envoy_buffer path, const char *const *endpoints, size_t count) {
  if (path.ptr == NULL) return 0;
  size_t n = 0;
  while (n < path.length && path.ptr[n] != '?') n++;
  while (n > 0 && path.ptr[n - 1] == '/') n--;
  for (size_t e = 0; e < count; e++) {
    size_t len = strlen(endpoints[e]);
    if (n >= len && memcmp(path.ptr + n - len, endpoints[e], len) == 0) return 1;
  }
  return 0;
}

static int asks_usage(const config_t *config, const char *name, size_t len) {
  for (size_t m = 0; m < config->asks_usage_count; m++)
    if (strlen(config->asks_usage[m]) == len && memcmp(config->asks_usage[m], name, len) == 0)
      return 1;
  return 0;
}

/* The body replaced by `s` with INCLUDE_USAGE after its first `{` (content-length too). */
static void splice_include_usage(sg_filter_envoy filter, const char *s, size_t n) {
  const char *brace = memchr(s, '{', n);
  size_t at = (size_t)(brace - s) + 1, extra = sizeof INCLUDE_USAGE - 1;
  char *spliced = malloc(n + extra);
  memcpy(spliced, s, at);
  memcpy(spliced + at, INCLUDE_USAGE, extra);
  memcpy(spliced + at + extra, s + at, n - at);
  /* s may point into Envoy's buffers: copied before they are drained. */
  int types[2] = {SG_BUFFERED_REQUEST_BODY, SG_RECEIVED_REQUEST_BODY};
  for (int t = 0; t < 2; t++) {
    size_t size = envoy_dynamic_module_callback_http_get_body_size(filter, types[t]);
    if (size > 0) envoy_dynamic_module_callback_http_drain_body(filter, types[t], size);
  }
  sg_module_buffer whole = {spliced, n + extra};
  /* Into this hook's data; in the trailers hook, which has none, into the buffered body. */
  if (!envoy_dynamic_module_callback_http_append_body(filter, SG_RECEIVED_REQUEST_BODY, whole))
    envoy_dynamic_module_callback_http_append_body(filter, SG_BUFFERED_REQUEST_BODY, whole);
  free(spliced);
  char length[32];
  int written = snprintf(length, sizeof length, "%zu", n + extra);
  envoy_dynamic_module_callback_http_set_header(filter, SG_REQUEST_HEADERS,
                                                text("content-length"),
                                                (sg_module_buffer){length, (size_t)written});
}

static int asks_logprobs(span_t raw) {
  if (raw.start == NULL || raw_is(raw, "false") || raw_is(raw, "null") || raw_is(raw, "\"\""))
    return 0;
  if (is_number(raw.start, raw.length)) {
    char number[64];
    if (raw.length < sizeof number) {
      memcpy(number, raw.start, raw.length);
      number[raw.length] = 0;
      if (strtod(number, NULL) == 0) return 0;
    }
  }
  if (raw.start[0] == '[' || raw.start[0] == '{') {
    size_t k = skip_space(raw.start, raw.length, 1);
    if (k == raw.length - 1) return 0; /* [] or {} */
  }
  return 1;
}

/* ---- the filter ------------------------------------------------------------------- */

static const char NAMESPACE[] = "sluicegate";

static void refuse(sg_filter_envoy filter, const char *problem, const char *member) {
  char value[64];
  size_t a = strlen(problem), b = member ? strlen(member) : 0;
  memcpy(value, problem, a);
  if (member) memcpy(value + a, member, b);
  envoy_dynamic_module_callback_http_set_dynamic_metadata_string(
      filter, text(NAMESPACE), text("body_problem"), (sg_module_buffer){value, a + b});
  envoy_dynamic_module_callback_http_clear_route_cache(filter);
}

static void read_body(const config_t *config, sg_filter_envoy filter, const char *s, size_t n) {
  members_t got;
  const char *problem = members(s, n, &got);
  if (problem != NULL) return refuse(filter, problem, NULL);
  if (got.repeated >= 0) return refuse(filter, "duplicate_", MEMBERS[got.repeated]);
  span_t model = got.found[M_MODEL];
  if (model.start == NULL || raw_is(model, "\"\"")) return refuse(filter, "model", NULL);
  if (model.start[0] != '"') return refuse(filter, "model_type", NULL);
  span_t stream_raw = got.found[M_STREAM];
  if (stream_raw.start != NULL && !raw_is(stream_raw, "true") && !raw_is(stream_raw, "false") &&
      !raw_is(stream_raw, "null"))
    return refuse(filter, "stream", NULL);
  bool stream = raw_is(stream_raw, "true");
  long long cap = 0;
  for (size_t c = 0; c < sizeof CAPS / sizeof *CAPS; c++) {
    long long value = counted(got.found[CAPS[c]], config->max_output_tokens);
    if (value < 0) return refuse(filter, "max_tokens_", MEMBERS[CAPS[c]]);
    if (cap == 0) cap = value;
  }
  long long choices = counted(got.found[M_N], MAX_N);
  if (choices < 0) return refuse(filter, "n", NULL);
  long long allowed = (cap ? cap : config->default_max_tokens) * (choices ? choices : 1);

  /* The name between the quotes, `\/` read as `/` (any other escape stays). */
  char stack_name[256];
  size_t raw_len = model.length - 2;
  char *name = raw_len < sizeof stack_name ? stack_name : malloc(raw_len + 1);
  size_t len = 0;
  for (size_t k = 1; k + 1 < model.length; k++) {
    if (model.start[k] == '\\' && k + 2 < model.length && model.start[k + 1] == '/') continue;
    name[len++] = model.start[k];
  }
  envoy_dynamic_module_callback_http_set_dynamic_metadata_string(
      filter, text(NAMESPACE), text("model"), (sg_module_buffer){name, len});
  int usage_asked = stream && got.found[M_STREAM_OPTIONS].start == NULL &&
                    asks_usage(config, name, len);
  if (name != stack_name) free(name);
  envoy_dynamic_module_callback_http_set_dynamic_metadata_bool(filter, text(NAMESPACE),
                                                               text("stream"), stream);

  /* Who reads the answer's usage (filters/usage_reader.py without reservations). */
  sg_envoy_buffer path = {NULL, 0};
  envoy_dynamic_module_callback_http_get_header(filter, SG_REQUEST_HEADERS, text(":path"),
                                                &path, 0, NULL);
  const char *reader = "log";
  if (usage_asked && endpoint_in(path, USAGE_ENDPOINTS, 2)) {
    splice_include_usage(filter, s, n);
    envoy_dynamic_module_callback_http_set_dynamic_metadata_string(
        filter, text(NAMESPACE), text("usage_injected"), text("true"));
    reader = "stream-chunks";
  } else if (stream) {
    reader = "stream";
  } else {
    if (!endpoint_in(path, ENDPOINTS, 3)) reader = "none";
    for (size_t l = 0; l < sizeof LOGPROBS / sizeof *LOGPROBS; l++)
      if (asks_logprobs(got.found[LOGPROBS[l]])) reader = "none";
    if (allowed > LOG_MAX_OUTPUT_TOKENS) reader = "none";
  }
  envoy_dynamic_module_callback_http_set_header(filter, SG_REQUEST_HEADERS,
                                                text("x-sluicegate-usage"), text(reader));
  envoy_dynamic_module_callback_http_clear_route_cache(filter);
}

/* The whole request body (what Envoy buffered, then the data of this hook), read. */
static void read_request(const config_t *config, sg_filter_envoy filter, bool with_received) {
  enum { MAX_CHUNKS = 64 };
  sg_envoy_buffer chunks[MAX_CHUNKS];
  size_t count = 0, total = 0;
  int types[2] = {SG_BUFFERED_REQUEST_BODY, SG_RECEIVED_REQUEST_BODY};
  sg_envoy_buffer *many = NULL;
  size_t want = 0;
  for (int t = 0; t < (with_received ? 2 : 1); t++)
    want += envoy_dynamic_module_callback_http_get_body_chunks_size(filter, types[t]);
  sg_envoy_buffer *into = want <= MAX_CHUNKS ? chunks : (many = malloc(want * sizeof *many));
  for (int t = 0; t < (with_received ? 2 : 1); t++) {
    size_t here = envoy_dynamic_module_callback_http_get_body_chunks_size(filter, types[t]);
    if (here == 0) continue;
    if (envoy_dynamic_module_callback_http_get_body_chunks(filter, types[t], into + count))
      count += here;
  }
  for (size_t c = 0; c < count; c++) total += into[c].length;
  if (total == 0) {
    free(many);
    return; /* routed by its path, as the Lua reader leaves a request without a body */
  }
  if (count == 1) {
    read_body(config, filter, into[0].ptr, into[0].length);
  } else {
    char *whole = malloc(total), *at = whole;
    for (size_t c = 0; c < count; c++) {
      memcpy(at, into[c].ptr, into[c].length);
      at += into[c].length;
    }
    read_body(config, filter, whole, total);
    free(whole);
  }
  free(many);
}

/* ---- hooks ------------------------------------------------------------------------ */

EXPORT const char *envoy_dynamic_module_on_program_init(void) { return SG_ABI_VERSION; }

EXPORT sg_config_module envoy_dynamic_module_on_http_filter_config_new(
    sg_config_envoy config_envoy, sg_envoy_buffer name, sg_envoy_buffer config) {
  (void)config_envoy;
  config_t *made = calloc(1, sizeof *made);
  if (name.length == 4 && memcmp(name.ptr, "pass", 4) == 0) {
    made->kind = KIND_PASS;
    return made;
  }
  if (!(name.length == 5 && memcmp(name.ptr, "model", 5) == 0)) {
    free(made);
    return NULL;
  }
  made->kind = KIND_MODEL;
  made->default_max_tokens = 1024;
  made->max_output_tokens = 1000000;
  char *lines = malloc(config.length + 1), *next = NULL;
  memcpy(lines, config.ptr, config.length);
  lines[config.length] = 0;
  for (char *line = strtok_r(lines, "\n", &next); line; line = strtok_r(NULL, "\n", &next)) {
    char *eq = strchr(line, '=');
    if (eq == NULL) continue;
    *eq = 0;
    if (strcmp(line, "default_max_tokens") == 0) made->default_max_tokens = atoll(eq + 1);
    if (strcmp(line, "max_output_tokens") == 0) made->max_output_tokens = atoll(eq + 1);
    if (strcmp(line, "asks_usage") == 0) {
      made->asks_usage = realloc(made->asks_usage, (made->asks_usage_count + 1) * sizeof(char *));
      made->asks_usage[made->asks_usage_count++] = strdup(eq + 1);
    }
  }
  free(lines);
  return made;
}

EXPORT void envoy_dynamic_module_on_http_filter_config_destroy(sg_config_module config) {
  config_t *made = (config_t *)config;
  for (size_t m = 0; m < made->asks_usage_count; m++) free(made->asks_usage[m]);
  free(made->asks_usage);
  free(made);
}

/* No state per stream: the filter is its configuration. */
EXPORT sg_filter_module envoy_dynamic_module_on_http_filter_new(sg_config_module config,
                                                                sg_filter_envoy filter) {
  (void)filter;
  return config;
}

EXPORT void envoy_dynamic_module_on_http_filter_destroy(sg_filter_module module) { (void)module; }

EXPORT int envoy_dynamic_module_on_http_filter_request_headers(sg_filter_envoy filter,
                                                               sg_filter_module module,
                                                               bool end_of_stream) {
  (void)filter;
  const config_t *config = module;
  if (config->kind == KIND_PASS || end_of_stream) return SG_HEADERS_CONTINUE;
  return SG_HEADERS_STOP_ITERATION;
}

EXPORT int envoy_dynamic_module_on_http_filter_request_body(sg_filter_envoy filter,
                                                            sg_filter_module module,
                                                            bool end_of_stream) {
  const config_t *config = module;
  if (config->kind == KIND_PASS) return SG_BODY_CONTINUE;
  if (!end_of_stream) return SG_BODY_STOP_ITERATION_AND_BUFFER;
  read_request(config, filter, true);
  return SG_BODY_CONTINUE;
}

/* A body ended by trailers: all of it is buffered by now. */
EXPORT int envoy_dynamic_module_on_http_filter_request_trailers(sg_filter_envoy filter,
                                                                sg_filter_module module) {
  const config_t *config = module;
  if (config->kind == KIND_MODEL) read_request(config, filter, false);
  return SG_TRAILERS_CONTINUE;
}

/* Hooks Envoy requires that neither filter uses (their arguments are not read, so only
 * the return value matters: 0 is Continue where there is one). */
#define NOOP(name) \
  EXPORT int envoy_dynamic_module_on_http_filter_##name(void) { return 0; }
NOOP(response_headers)
NOOP(response_body)
NOOP(response_trailers)
NOOP(stream_complete)
NOOP(http_callout_done)
NOOP(http_stream_headers)
NOOP(http_stream_data)
NOOP(http_stream_trailers)
NOOP(http_stream_complete)
NOOP(http_stream_reset)
NOOP(scheduled)
NOOP(downstream_above_write_buffer_high_watermark)
NOOP(downstream_below_write_buffer_low_watermark)
