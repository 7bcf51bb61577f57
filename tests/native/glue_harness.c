/* A mock of Envoy's side of the dynamic module ABI, driving usage_filter.c (included
 * whole, to reach its static functions) through the library's hooks (module.c) as Envoy
 * does; built and run by test_usage_filter.py. Modes:
 *   media    stdin: content types, hex, one a line; out: "<json> <stream>" a line
 *   config   stdin: filter configurations, hex, one a line; out: 1 (made) or 0 a line
 *   cases    fixed scenarios (assert)
 *   fuzz N S N random bodies, seed S, through the hooks, compared with the scanner alone
 * Exits non-zero (an assert, a sanitizer) on a failure. */
#include "usage_filter.c"
#include "module.h"

#include <assert.h>
#include <stdio.h>

/* ---- the mock: one stream at a time ---- */

typedef struct {
  char *ptr; /* NULL for an empty slice, as Envoy may give */
  size_t length;
} slice_t;

#define MAX_SLICES 4096
static slice_t body[MAX_SLICES]; /* the current hook's received body */
static size_t nslices;
static char *out; /* what the client got */
static size_t outn, outcap;
static bool in_body_hook, in_trailers_hook, refuse_chunks;
static const char *usage_header, *content_type, *injected;
static bool has_content_length;
#define MAX_META 16
static char meta_keys[MAX_META][48];
static double meta_values[MAX_META];
static int nmeta, meta_writes;

static void emit(const char *p, size_t n) {
  if (outn + n > outcap) {
    outcap = (outn + n) * 2 + 64;
    out = realloc(out, outcap);
    assert(out != NULL);
  }
  if (n > 0) memcpy(out + outn, p, n);
  outn += n;
}

static void add_slice(const char *p, size_t n) {
  assert(nslices < MAX_SLICES);
  body[nslices].ptr = n > 0 ? malloc(n) : NULL;
  if (n > 0) memcpy(body[nslices].ptr, p, n);
  body[nslices++].length = n;
}

/* What Envoy sends on after a body hook: the body as the filter left it. */
static void flush_body(void) {
  for (size_t i = 0; i < nslices; i++) {
    emit(body[i].ptr, body[i].length);
    free(body[i].ptr);
  }
  nslices = 0;
}

static bool key_is(sg_module_buffer key, const char *word) {
  return key.length == strlen(word) && memcmp(key.ptr, word, key.length) == 0;
}

bool envoy_dynamic_module_callback_http_get_header(sg_filter_envoy f, int type,
                                                  sg_module_buffer key, sg_envoy_buffer *value,
                                                  size_t index, size_t *count) {
  const char *v = NULL;
  if (type == SG_REQUEST_HEADERS && key_is(key, "x-sluicegate-usage")) v = usage_header;
  if (type == SG_RESPONSE_HEADERS && key_is(key, "content-type")) v = content_type;
  if (v == NULL) return false;
  value->ptr = *v ? v : NULL; /* an empty value without bytes */
  value->length = strlen(v);
  return true;
}

bool envoy_dynamic_module_callback_http_set_header(sg_filter_envoy f, int type,
                                                  sg_module_buffer key, sg_module_buffer value) {
  assert(type == SG_RESPONSE_HEADERS && key_is(key, "content-length") && value.length == 0);
  has_content_length = false;
  return true;
}

/* The forwarded headers filter's (linked with the library's other filters, never called
 * here: headers_harness.c drives it). */
size_t envoy_dynamic_module_callback_http_get_headers_size(sg_filter_envoy f, int type) {
  abort();
}

bool envoy_dynamic_module_callback_http_get_headers(sg_filter_envoy f, int type,
                                                    sg_envoy_header *headers) {
  abort();
}

bool envoy_dynamic_module_callback_http_add_header(sg_filter_envoy f, int type,
                                                  sg_module_buffer key, sg_module_buffer value) {
  abort();
}

size_t envoy_dynamic_module_callback_http_get_body_chunks_size(sg_filter_envoy f, int type) {
  assert(type == SG_RECEIVED_RESPONSE_BODY && in_body_hook);
  return nslices;
}

bool envoy_dynamic_module_callback_http_get_body_chunks(sg_filter_envoy f, int type,
                                                        sg_envoy_buffer *chunks) {
  assert(type == SG_RECEIVED_RESPONSE_BODY && in_body_hook);
  if (refuse_chunks) return false;
  for (size_t i = 0; i < nslices; i++) chunks[i] = (sg_envoy_buffer){body[i].ptr, body[i].length};
  return true;
}

bool envoy_dynamic_module_callback_http_drain_body(sg_filter_envoy f, int type, size_t bytes) {
  assert(type == SG_RECEIVED_RESPONSE_BODY && in_body_hook);
  while (bytes > 0) {
    assert(nslices > 0);
    size_t d = bytes < body[0].length ? bytes : body[0].length;
    size_t left = body[0].length - d;
    char *rest = left > 0 ? malloc(left) : NULL;
    if (left > 0) memcpy(rest, body[0].ptr + d, left);
    if (body[0].ptr) memset(body[0].ptr, 0xAA, body[0].length); /* a drained slice is gone */
    free(body[0].ptr);
    body[0] = (slice_t){rest, left};
    bytes -= d;
    if (left == 0) memmove(body, body + 1, --nslices * sizeof *body);
  }
  while (nslices > 0 && body[0].length == 0) memmove(body, body + 1, --nslices * sizeof *body);
  return true;
}

bool envoy_dynamic_module_callback_http_append_body(sg_filter_envoy f, int type,
                                                   sg_module_buffer data) {
  if (type == SG_BUFFERED_RESPONSE_BODY) { /* the trailers hook: before the trailers */
    assert(in_trailers_hook);
    emit(data.ptr, data.length);
    return true;
  }
  assert(type == SG_RECEIVED_RESPONSE_BODY && in_body_hook);
  add_slice(data.ptr, data.length);
  return true;
}

bool envoy_dynamic_module_callback_http_get_metadata_string(sg_filter_envoy f, int source,
                                                           sg_module_buffer ns,
                                                           sg_module_buffer key,
                                                           sg_envoy_buffer *value) {
  assert(source == SG_METADATA_DYNAMIC && key_is(ns, "sluicegate"));
  const char *v = key_is(key, "injected") ? injected : NULL;
  if (v == NULL) return false;
  *value = (sg_envoy_buffer){v, strlen(v)};
  return true;
}

void envoy_dynamic_module_callback_http_set_dynamic_metadata_number(sg_filter_envoy f,
                                                                    sg_module_buffer ns,
                                                                    sg_module_buffer key,
                                                                    double value) {
  assert(key_is(ns, "sluicegate.usage") && key.length < sizeof meta_keys[0]);
  meta_writes++;
  for (int i = 0; i < nmeta; i++)
    if (key_is(key, meta_keys[i])) {
      meta_values[i] = value;
      return;
    }
  assert(nmeta < MAX_META);
  memcpy(meta_keys[nmeta], key.ptr, key.length);
  meta_keys[nmeta][key.length] = 0;
  meta_values[nmeta++] = value;
}

/* The request side, which only the model reader uses (model_harness.c mocks it). */
size_t envoy_dynamic_module_callback_http_get_body_size(sg_filter_envoy f, int type) {
  abort();
}
void envoy_dynamic_module_callback_http_set_dynamic_metadata_string(sg_filter_envoy f,
                                                                    sg_module_buffer ns,
                                                                    sg_module_buffer key,
                                                                    sg_module_buffer value) {
  abort();
}
void envoy_dynamic_module_callback_http_set_dynamic_metadata_bool(sg_filter_envoy f,
                                                                  sg_module_buffer ns,
                                                                  sg_module_buffer key,
                                                                  bool value) {
  abort();
}
void envoy_dynamic_module_callback_http_clear_route_cache(sg_filter_envoy f) { abort(); }

static bool meta(const char *key, double *value) {
  for (int i = 0; i < nmeta; i++)
    if (strcmp(meta_keys[i], key) == 0) {
      *value = meta_values[i];
      return true;
    }
  return false;
}

/* ---- driving ---- */

static const char CONFIG[] =
    "usage_header=x-sluicegate-usage\nby_log=log\nby_stream=stream\nby_chunks=stream-chunks\n"
    "by_nobody=observer,none\n"
    "namespace=sluicegate\ninjected=injected\ninjected_value=cut-it\n"
    "usage_namespace=sluicegate.usage\ncount_key=content_events\n"
    "members=prompt_tokens,completion_tokens,input_tokens,output_tokens\n";
static const char MEMBERS[] = "prompt_tokens,completion_tokens,input_tokens,output_tokens";

static sg_config_module new_config(const char *text, size_t length) {
  return envoy_dynamic_module_on_http_filter_config_new(
      NULL, (sg_envoy_buffer){FILTER_NAME, strlen(FILTER_NAME)}, (sg_envoy_buffer){text, length});
}

static void reset_stream(void) {
  outn = 0;
  nmeta = meta_writes = 0;
  nslices = 0;
  has_content_length = true;
  refuse_chunks = false;
}

static sg_filter_module start(sg_config_module config, bool headers_end) {
  sg_filter_module f = envoy_dynamic_module_on_http_filter_new(config, NULL);
  envoy_dynamic_module_on_http_filter_request_headers(NULL, f, true);
  envoy_dynamic_module_on_http_filter_response_headers(NULL, f, headers_end);
  return f;
}

/* One body hook with `pieces` slices of p[0, n) (cut at random when `cuts`). */
static uint64_t rng = 88172645463325252ull;
static uint64_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static void data_hook(sg_filter_module f, const char *p, size_t n, size_t pieces, bool end) {
  size_t at = 0;
  for (size_t s = 0; s < pieces; s++) {
    size_t take = s == pieces - 1 ? n - at : (n - at) / (pieces - s);
    if (take > 0 && s != pieces - 1 && (rnd() & 1)) take = rnd() % (n - at + 1);
    add_slice(p + at, take);
    at += take;
  }
  in_body_hook = true;
  envoy_dynamic_module_on_http_filter_response_body(NULL, f, end);
  in_body_hook = false;
  flush_body();
}

static void trailers_hook(sg_filter_module f) {
  in_trailers_hook = true;
  envoy_dynamic_module_on_http_filter_response_trailers(NULL, f);
  in_trailers_hook = false;
}

/* The scanner alone over the whole body: the bytes passed, the count, the usage. */
typedef struct {
  char *passed;
  size_t length, count;
  double values[SG_MAX_SLOTS];
  bool present[SG_MAX_SLOTS];
} reference_t;

static void reference(const sg_names *names, int flags, const char *p, size_t n,
                      reference_t *r) {
  sg_scanner *s = sg_scanner_new(names, SG_SSE, flags);
  if (n > 0) sg_scanner_push(s, p, n);
  sg_scanner_finish(s);
  const char *o;
  size_t l;
  if (!sg_scanner_take(s, &o, &l)) o = p, l = n;
  r->passed = malloc(l + 1);
  if (l > 0) memcpy(r->passed, o, l);
  r->length = l;
  r->count = sg_scanner_count(s);
  for (size_t k = 0; k < sg_names_slots(names); k++)
    r->present[k] = sg_scanner_value(s, k, &r->values[k]);
  sg_scanner_free(s);
}

/* `passed` is `data` without at most one run of bytes. */
static bool at_most_one_run_removed(const char *data, size_t n, const char *passed, size_t m) {
  if (m > n) return false;
  size_t head = 0;
  while (head < m && data[head] == passed[head]) head++;
  size_t gone = n - m;
  return memcmp(data + head + gone, passed + head, m - head) == 0;
}

static bool contains(const char *p, size_t n, const char *word) {
  size_t w = strlen(word);
  for (size_t i = 0; i + w <= n; i++)
    if (memcmp(p + i, word, w) == 0) return true;
  return false;
}

/* ---- modes ---- */

static size_t unhex(const char *line, char *into) {
  size_t n = 0;
  for (size_t i = 0; line[i] && line[i + 1] && line[i] != '\n'; i += 2) {
    unsigned byte;
    sscanf(line + i, "%2x", &byte);
    into[n++] = (char)byte;
  }
  return n;
}

static int mode_media(void) {
  static char line[8192], type[4096];
  while (fgets(line, sizeof line, stdin)) {
    size_t n = unhex(line, type);
    sg_envoy_buffer b = {n > 0 ? type : NULL, n};
    printf("%d %d\n", json_media(b), event_stream_media(b));
  }
  return 0;
}

static int mode_config(void) {
  static char line[16384], text[8192];
  while (fgets(line, sizeof line, stdin)) {
    size_t n = unhex(line, text);
    sg_config_module config = new_config(text, n);
    printf("%d\n", config != NULL);
    envoy_dynamic_module_on_http_filter_config_destroy(config);
  }
  return 0;
}

static const char USAGE_EVENT[] =
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":3}}\n\n";
static const char TEXT_EVENT[] = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n";

static void expect_out(const char *want) {
  if (outn != strlen(want) || memcmp(out, want, outn) != 0) {
    fprintf(stderr, "got  [%.*s]\nwant [%s]\n", (int)outn, out, want);
    assert(!"the client's bytes");
  }
}

static int mode_cases(void) {
  sg_config_module config = new_config(CONFIG, strlen(CONFIG));
  assert(config != NULL);
  assert(envoy_dynamic_module_on_http_filter_config_new(
             NULL, (sg_envoy_buffer){"other", 5}, (sg_envoy_buffer){CONFIG, strlen(CONFIG)}) ==
         NULL);
  usage_header = "stream-chunks", content_type = "text/event-stream";
  injected = "cut-it";
  double v;

  /* Held bytes and an empty end-of-stream data frame (Envoy's HTTP/1 codec ends every
   * chunked body so), and an empty frame mid-stream: each byte once. */
  reset_stream();
  sg_filter_module f = start(config, false);
  data_hook(f, "data: a\n\ndata: b", 16, 1, false);
  data_hook(f, NULL, 0, 0, false);
  data_hook(f, NULL, 0, 1, false); /* one empty slice */
  data_hook(f, NULL, 0, 0, true);
  expect_out("data: a\n\ndata: b");
  envoy_dynamic_module_on_http_filter_destroy(f);

  /* The same, ended by trailers. */
  reset_stream();
  f = start(config, false);
  data_hook(f, "data: a\n\ndata: b", 16, 3, false);
  trailers_hook(f);
  expect_out("data: a\n\ndata: b");
  envoy_dynamic_module_on_http_filter_destroy(f);

  /* The usage event cut, in a chunk of 100 one-byte slices, then 1000. */
  for (size_t pieces = 100; pieces <= 1000; pieces *= 10) {
    reset_stream();
    f = start(config, false);
    static char chunk[4096];
    size_t n = (size_t)snprintf(chunk, sizeof chunk, "%s%s%s", TEXT_EVENT, USAGE_EVENT, TEXT_EVENT);
    data_hook(f, chunk, n, pieces, true);
    static char want[4096];
    snprintf(want, sizeof want, "%s%s", TEXT_EVENT, TEXT_EVENT);
    expect_out(want);
    assert(!has_content_length);
    assert(meta("prompt_tokens", &v) && v == 11 && meta("content_events", &v) && v == 2);
    envoy_dynamic_module_on_http_filter_destroy(f);
  }

  /* A headers-only answer with the cut armed: no body hook; its count (0) written. */
  reset_stream();
  f = start(config, true);
  assert(!has_content_length && meta("content_events", &v) && v == 0);
  envoy_dynamic_module_on_http_filter_destroy(f);
  reset_stream();
  f = start(config, true);
  trailers_hook(f); /* and trailers with no body */
  expect_out("");
  envoy_dynamic_module_on_http_filter_destroy(f);

  /* Envoy refuses a chunk's slices: the reading stops, the count as it stood written;
   * every byte passes (the held ones after that chunk), none cut, nothing more written. */
  reset_stream();
  f = start(config, false);
  data_hook(f, TEXT_EVENT, strlen(TEXT_EVENT), 1, false);
  data_hook(f, "data: 1\n\ndata: x", 16, 1, false);
  refuse_chunks = true;
  data_hook(f, "y\n", 2, 2, false);
  refuse_chunks = false;
  assert(meta("content_events", &v) && v == 1);
  int writes = meta_writes;
  data_hook(f, USAGE_EVENT, strlen(USAGE_EVENT), 1, true);
  envoy_dynamic_module_on_http_filter_stream_complete(NULL, f);
  static char want[4096];
  snprintf(want, sizeof want, "%sdata: 1\n\ny\ndata: x%s", TEXT_EVENT, USAGE_EVENT);
  expect_out(want);
  assert(meta_writes == writes);
  envoy_dynamic_module_on_http_filter_destroy(f);

  /* A stream reset midway (no end of stream, no trailers): its count is written when
   * Envoy completes the stream, before it logs it; nothing before (not on the first
   * token's path either). */
  reset_stream();
  f = start(config, false);
  data_hook(f, TEXT_EVENT, strlen(TEXT_EVENT), 1, false);
  data_hook(f, TEXT_EVENT, strlen(TEXT_EVENT), 1, false);
  assert(!meta("content_events", &v));
  envoy_dynamic_module_on_http_filter_stream_complete(NULL, f);
  assert(meta("content_events", &v) && v == 2);
  envoy_dynamic_module_on_http_filter_destroy(f);

  /* An ended stream's count is written once, at its end: Envoy's completing it after
   * that writes nothing more. */
  reset_stream();
  f = start(config, false);
  data_hook(f, TEXT_EVENT, strlen(TEXT_EVENT), 1, true);
  assert(meta("content_events", &v) && v == 1);
  writes = meta_writes;
  envoy_dynamic_module_on_http_filter_stream_complete(NULL, f);
  assert(meta_writes == writes);
  envoy_dynamic_module_on_http_filter_destroy(f);

  /* A stream only read (its client asked for usage, or nobody did), no reservation:
   * counted too, for the record's output when no usage comes; nothing cut. */
  usage_header = "stream";
  reset_stream();
  f = start(config, false);
  data_hook(f, TEXT_EVENT, strlen(TEXT_EVENT), 1, false);
  data_hook(f, TEXT_EVENT, strlen(TEXT_EVENT), 2, true);
  snprintf(want, sizeof want, "%s%s", TEXT_EVENT, TEXT_EVENT);
  expect_out(want);
  assert(has_content_length && meta("content_events", &v) && v == 2);
  assert(!meta("prompt_tokens", &v));
  envoy_dynamic_module_on_http_filter_destroy(f);
  usage_header = "stream-chunks";

  /* Not an event stream, or not this reader's: untouched. */
  content_type = "application/json";
  reset_stream();
  f = start(config, false);
  data_hook(f, USAGE_EVENT, strlen(USAGE_EVENT), 2, true);
  expect_out(USAGE_EVENT);
  assert(has_content_length);
  envoy_dynamic_module_on_http_filter_destroy(f);

  /* A JSON answer read by its media type (no usage header). */
  usage_header = NULL;
  reset_stream();
  f = start(config, false);
  const char *answer = "{\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":9e400}}";
  data_hook(f, answer, strlen(answer), 5, false);
  data_hook(f, NULL, 0, 0, true);
  expect_out(answer);
  assert(meta("prompt_tokens", &v) && v == 7 && !meta("completion_tokens", &v));
  envoy_dynamic_module_on_http_filter_destroy(f);

  /* A reader name nobody in Envoy reads: the answer passes unread. */
  usage_header = "observer";
  reset_stream();
  f = start(config, false);
  data_hook(f, answer, strlen(answer), 1, true);
  expect_out(answer);
  assert(nmeta == 0);
  envoy_dynamic_module_on_http_filter_destroy(f);

  /* A name it does not know (a newer routing stage's): read by its media type, a stream
   * cut as its metadata asks, as Envoy's readers each ran on their media type. */
  usage_header = "newer";
  reset_stream();
  f = start(config, false);
  data_hook(f, answer, strlen(answer), 1, true);
  assert(meta("prompt_tokens", &v) && v == 7);
  envoy_dynamic_module_on_http_filter_destroy(f);
  content_type = "text/event-stream", injected = "cut-it";
  reset_stream();
  f = start(config, false);
  data_hook(f, USAGE_EVENT, strlen(USAGE_EVENT), 1, true);
  expect_out("");
  assert(!has_content_length);
  envoy_dynamic_module_on_http_filter_destroy(f);

  envoy_dynamic_module_on_http_filter_config_destroy(config);
  printf("ok\n");
  return 0;
}

static const char *const FRAGMENTS[] = {
    "data:", "data: ", "\n", "\r", "\r\n", "\n\n", "{", "}", "[", "]", ":", ",", "\"", "\\", " ",
    "1", "2.5", "-3e2", "0e99999", "null", "true", "\"usage\"", "\"usage\":", "\"choices\":",
    "[]", "\"prompt_tokens\":", "\"completion_tokens\":", "\"response\"", "\"type\":",
    "\"response.x.delta\"", "\"delta\":", "\"content\":", "\"text\":", "\"x\"", "[DONE]",
    "data: [DONE]", "event: e", ": c", "\xff", USAGE_EVENT, TEXT_EVENT,
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5}}\r\r",
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":6}}\r\n\r\n"};
#define FRAGMENT_COUNT (sizeof FRAGMENTS / sizeof *FRAGMENTS)

static int mode_fuzz(long iterations, uint64_t seed) {
  rng ^= seed * 0x9E3779B97F4A7C15ull;
  sg_config_module config = new_config(CONFIG, strlen(CONFIG));
  sg_names *names = sg_names_new(MEMBERS, strlen(MEMBERS));
  assert(config != NULL && names != NULL);
  static char b[1 << 15];
  usage_header = "stream-chunks", content_type = "text/event-stream";
  for (long it = 0; it < iterations; it++) {
    size_t n = 0, k = rnd() % 40;
    for (size_t i = 0; i < k; i++) {
      const char *piece = FRAGMENTS[rnd() % FRAGMENT_COUNT];
      memcpy(b + n, piece, strlen(piece));
      n += strlen(piece);
    }
    if (rnd() % 8 == 0) b[n++] = 0;
    /* The value the config names cuts; another ("true" too) does not. */
    injected = rnd() % 4 ? "cut-it" : rnd() & 1 ? "true" : "false";
    /* Every stream is counted (with or without a reservation). */
    int flags = (strcmp(injected, "cut-it") == 0 ? SG_CUT : 0) | SG_COUNT;
    reference_t r;
    reference(names, flags, b, n, &r);
    reset_stream();
    sg_filter_module f = start(config, false);
    int ending = (int)(rnd() % 3); /* with the last data; an empty data frame; trailers */
    size_t at = 0;
    while (at < n) {
      size_t take = 1 + rnd() % (rnd() & 1 ? 8 : 64);
      if (take > n - at) take = n - at;
      size_t pieces = rnd() % 16 == 0 ? 65 + rnd() % 40 : 1 + rnd() % 3;
      data_hook(f, b + at, take, pieces, at + take == n && ending == 0);
      if (rnd() % 8 == 0) data_hook(f, NULL, 0, rnd() % 2, false); /* an empty frame */
      at += take;
    }
    if (ending == 1 || (ending == 0 && n == 0)) data_hook(f, NULL, 0, rnd() % 2, true);
    if (ending == 2) trailers_hook(f);
    envoy_dynamic_module_on_http_filter_destroy(f);

    bool ok = at_most_one_run_removed(b, n, out, outn);
    if (!contains(b, n, "data: [DONE]")) /* else which bytes are cut depends on chunking */
      ok = ok && outn == r.length && memcmp(out, r.passed, outn) == 0;
    double v;
    ok = ok && meta("content_events", &v) && v == (double)r.count;
    for (size_t s = 0; s < sg_names_slots(names); s++) {
      bool present = meta(sg_names_key(names, s), &v);
      ok = ok && present == r.present[s] && (!present || v == r.values[s]);
    }
    ok = ok && has_content_length == !(flags & SG_CUT);
    if (!ok) {
      fprintf(stderr, "mismatch at %ld (ending %d, flags %d)\nbody [%.*s]\nout  [%.*s]\nref  [%.*s]\n",
              it, ending, flags, (int)n, b, (int)outn, out, (int)r.length, r.passed);
      return 1;
    }
    free(r.passed);
  }
  sg_names_free(names);
  envoy_dynamic_module_on_http_filter_config_destroy(config);
  free(out);
  printf("ok %ld\n", iterations);
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "media") == 0) return mode_media();
  if (argc >= 2 && strcmp(argv[1], "config") == 0) return mode_config();
  if (argc >= 2 && strcmp(argv[1], "cases") == 0) return mode_cases();
  if (argc >= 4 && strcmp(argv[1], "fuzz") == 0)
    return mode_fuzz(atol(argv[2]), (uint64_t)atoll(argv[3]));
  fprintf(stderr, "usage: %s media|config|cases|fuzz N SEED\n", argv[0]);
  return 2;
}
