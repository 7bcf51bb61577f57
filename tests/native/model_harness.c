/* A mock of Envoy's side of the dynamic module ABI, driving the model reader
 * (model_filter.c, with model_walk.c) through its kind (sg_model_reader, filter_kind.h) as
 * Envoy 1.40 does; built and run by test_model_filter.py. The kind is called directly, not
 * through module.c, so the usage reader is not linked. Modes:
 *   config   stdin: configurations, hex, one a line; out: 1 (made) or 0 a line
 *   cases    stdin: the translator's configuration, hex, on one line; fixed scenarios
 *   fuzz N S stdin: the same; N random requests, seed S, each checked against invariants
 *            and against the same request sent whole
 *   replay   stdin: the same, then requests, one a line (test_model_reader_lua.py), each
 *            sent whole (its body in one data frame that ends the stream); out: a line a
 *            request with what the filter wrote (mode_replay says how both are written)
 * The scenarios and the fuzz assume the facts test_model_filter.py translates (FACTS):
 * tenants acme (standard, every model), beta (interactive, auto: gpt-4o, held-model,
 * org/m1) and gamma (batch: gpt-4o-mini); classes interactive, standard, batch; gpt-4o
 * and org/m1 ask a stream's usage; held-model is held; estimates and scenarios on. Every
 * name the filter writes or reads (metadata keys, headers, lanes, problems) is taken from
 * the configuration, as the filter takes it.
 * Exits non-zero (a failed check, a sanitizer) on a failure. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envoy_abi.h"
#include "filter_kind.h"

#define KIND sg_model_reader

/* ---- bytes ---------------------------------------------------------------------------- */

typedef struct {
  char *p; /* kept NUL-terminated, for printing */
  size_t n, cap;
} bytes_t;

static void bytes_insert(bytes_t *b, size_t at, const void *p, size_t n) {
  if (b->n + n + 1 > b->cap) {
    b->cap = (b->n + n + 1) * 2;
    b->p = realloc(b->p, b->cap);
    if (b->p == NULL) abort();
  }
  memmove(b->p + at + n, b->p + at, b->n - at);
  if (n > 0) memcpy(b->p + at, p, n);
  b->n += n;
  b->p[b->n] = 0;
}

static void bytes_add(bytes_t *b, const void *p, size_t n) { bytes_insert(b, b->n, p, n); }
static void bytes_addz(bytes_t *b, const char *s) { bytes_add(b, s, strlen(s)); }
static void bytes_repeat(bytes_t *b, char c, size_t n) {
  for (size_t i = 0; i < n; i++) bytes_add(b, &c, 1);
}

static bool same(const char *a, size_t an, const char *b, size_t bn) {
  return an == bn && (an == 0 || memcmp(a, b, an) == 0);
}

/* ---- the stream's state in the mock: one stream at a time ----------------------------- */

static char ENVOY_STREAM; /* Envoy's object for the stream: only its address is passed */
#define ENVOY ((sg_filter_envoy)&ENVOY_STREAM)

static enum { NO_HOOK, IN_HEADERS, IN_BODY, IN_TRAILERS } hook;

static void dump(void);
#define CHECK(cond)                                                    \
  do {                                                                 \
    if (!(cond)) {                                                     \
      dump();                                                          \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                         \
    }                                                                  \
  } while (0)

/* The request headers: a multimap in Envoy's order. Each value is an allocation of
 * exactly its length (a read past it is ASan's); an empty one has a pointer too, as
 * Envoy's (HeaderString's data()) has. */
typedef struct {
  char *key;
  char *value;
  size_t length;
} header_t;
#define MAX_HEADERS 64
static header_t headers[MAX_HEADERS];
static size_t nheaders;

static void header_add(const char *key, size_t key_length, const char *value, size_t length) {
  CHECK(nheaders < MAX_HEADERS);
  header_t *h = &headers[nheaders++];
  h->key = malloc(key_length + 1);
  h->value = malloc(length > 0 ? length : 1); /* never NULL, as Envoy's */
  if (h->key == NULL || h->value == NULL) abort();
  memcpy(h->key, key, key_length);
  h->key[key_length] = 0;
  if (length > 0) memcpy(h->value, value, length);
  h->length = length;
}

static void header_remove(const char *key, size_t key_length) {
  size_t kept = 0;
  for (size_t h = 0; h < nheaders; h++) {
    if (same(headers[h].key, strlen(headers[h].key), key, key_length)) {
      free(headers[h].key);
      free(headers[h].value);
    } else {
      headers[kept++] = headers[h];
    }
  }
  nheaders = kept;
}

/* A body as Envoy holds it: slices, each its own allocation (NULL for an empty one). */
typedef struct {
  char *ptr;
  size_t length;
} slice_t;
typedef struct {
  slice_t *slices;
  size_t count, cap;
  bool exists; /* the buffered body: absent until Envoy first buffers */
} body_t;
static body_t received; /* the current body hook's data (none outside a body hook) */
static body_t buffered; /* what Envoy buffered for the filter (decodingBuffer()) */

static void body_push(body_t *b, slice_t s) {
  if (b->count == b->cap) {
    b->cap = b->cap * 2 + 16;
    b->slices = realloc(b->slices, b->cap * sizeof *b->slices);
    if (b->slices == NULL) abort();
  }
  b->slices[b->count++] = s;
}

static void body_add(body_t *b, const char *p, size_t n) {
  slice_t s = {NULL, n};
  if (n > 0) {
    s.ptr = malloc(n);
    if (s.ptr == NULL) abort();
    memcpy(s.ptr, p, n);
  }
  body_push(b, s);
}

static void body_move(body_t *to, body_t *from) {
  for (size_t i = 0; i < from->count; i++) body_push(to, from->slices[i]);
  from->count = 0;
}

static size_t body_size(const body_t *b) {
  size_t n = 0;
  for (size_t i = 0; i < b->count; i++) n += b->slices[i].length;
  return n;
}

/* A drained byte is gone: its slice is poisoned and freed (the rest of a slice drained in
 * part moves to a new allocation), so a pointer the filter kept into it is ASan's. */
static void slice_free(slice_t *s) {
  if (s->ptr != NULL) memset(s->ptr, 0xAA, s->length);
  free(s->ptr);
  *s = (slice_t){NULL, 0};
}

static void body_drain(body_t *b, size_t bytes) {
  size_t gone = 0;
  while (bytes > 0 && gone < b->count) {
    slice_t *s = &b->slices[gone];
    if (bytes >= s->length) {
      bytes -= s->length;
      slice_free(s);
      gone++;
    } else {
      size_t left = s->length - bytes;
      char *rest = malloc(left);
      if (rest == NULL) abort();
      memcpy(rest, s->ptr + bytes, left);
      slice_free(s);
      *s = (slice_t){rest, left};
      bytes = 0;
    }
  }
  memmove(b->slices, b->slices + gone, (b->count - gone) * sizeof *b->slices);
  b->count -= gone;
}

static void body_emit(body_t *b, bytes_t *into) {
  for (size_t i = 0; i < b->count; i++) {
    bytes_add(into, b->slices[i].ptr, b->slices[i].length);
    slice_free(&b->slices[i]);
  }
  b->count = 0;
}

static void body_free(body_t *b) {
  for (size_t i = 0; i < b->count; i++) slice_free(&b->slices[i]);
  free(b->slices);
  *b = (body_t){0};
}

/* The dynamic metadata the filter wrote (one namespace: the configuration's). */
typedef struct {
  char *key;
  size_t key_length;
  bool is_bool, flag;
  char *value;
  size_t length;
  int writes;
} meta_t;
#define MAX_META 32
static meta_t metas[MAX_META];
static size_t nmeta;

static bytes_t out;         /* the body Envoy sent on */
static bool stopped;        /* the filter holds the request (headers or data) */
static int clears;          /* clear_route_cache calls */
static int headers_status;  /* what the headers hook returned */
static int stops;           /* body hooks that returned StopIterationAndBuffer */
static int sets_client, sets_usage, sets_length, sets_path; /* set_header calls, by header */

/* ---- the configuration's names ---------------------------------------------------------- */

#define MAX_SETTINGS 256
static char *setting_text; /* a copy of the configuration, its lines cut at `=` and `\n` */
static const char *setting_keys[MAX_SETTINGS], *setting_values[MAX_SETTINGS];
static size_t nsettings;

static void settings_load(const char *text, size_t length) {
  setting_text = malloc(length + 1);
  if (setting_text == NULL) abort();
  memcpy(setting_text, text, length);
  setting_text[length] = 0;
  char *line = setting_text;
  while (*line) {
    char *end = strchr(line, '\n'), *eq = strchr(line, '=');
    if (end != NULL) *end = 0;
    if (eq != NULL && (end == NULL || eq < end) && nsettings < MAX_SETTINGS) {
      *eq = 0;
      setting_keys[nsettings] = line;
      setting_values[nsettings++] = eq + 1;
    }
    if (end == NULL) break;
    line = end + 1;
  }
}

/* The value of setting `key` (the first, for a repeated one). */
static const char *setting(const char *key) {
  for (size_t s = 0; s < nsettings; s++)
    if (strcmp(setting_keys[s], key) == 0) return setting_values[s];
  fprintf(stderr, "no setting %s in the configuration\n", key);
  abort();
}

static bool key_is(sg_module_buffer key, const char *word) {
  return same(key.ptr, key.length, word, strlen(word));
}

/* ---- Envoy's callbacks ------------------------------------------------------------------ */

bool envoy_dynamic_module_callback_http_get_header(sg_filter_envoy f, int type,
                                                  sg_module_buffer key, sg_envoy_buffer *value,
                                                  size_t index, size_t *count) {
  CHECK(f == ENVOY && hook != NO_HOOK && type == SG_REQUEST_HEADERS);
  size_t seen = 0;
  *value = (sg_envoy_buffer){NULL, 0};
  for (size_t h = 0; h < nheaders; h++) {
    if (!key_is(key, headers[h].key)) continue;
    if (seen++ == index) *value = (sg_envoy_buffer){headers[h].value, headers[h].length};
  }
  if (count != NULL) *count = seen; /* Envoy sets it even when `index` is past the last */
  return index < seen;
}

bool envoy_dynamic_module_callback_http_set_header(sg_filter_envoy f, int type,
                                                  sg_module_buffer key, sg_module_buffer value) {
  CHECK(f == ENVOY && hook != NO_HOOK && type == SG_REQUEST_HEADERS);
  /* The filter sets four headers only, each to a value a header may hold. */
  if (key_is(key, setting("client_header"))) sets_client++;
  else if (key_is(key, setting("usage_header"))) sets_usage++;
  else if (key_is(key, "content-length")) sets_length++;
  else if (key_is(key, ":path")) sets_path++;
  else CHECK(!"a header the filter does not set");
  for (size_t i = 0; i < value.length; i++)
    CHECK(value.ptr[i] != 0 && value.ptr[i] != '\r' && value.ptr[i] != '\n');
  header_remove(key.ptr, key.length);
  if (value.ptr != NULL && value.length > 0) /* an empty value removes the header */
    header_add(key.ptr, key.length, value.ptr, value.length);
  return true;
}

/* The received body exists in a body hook only (Envoy's current_request_body_); the
 * buffered one once Envoy has buffered (decodingBuffer()). */
static body_t *body_of(int type) {
  CHECK(type == SG_RECEIVED_REQUEST_BODY || type == SG_BUFFERED_REQUEST_BODY);
  if (type == SG_RECEIVED_REQUEST_BODY) return hook == IN_BODY ? &received : NULL;
  return buffered.exists ? &buffered : NULL;
}

size_t envoy_dynamic_module_callback_http_get_body_chunks_size(sg_filter_envoy f, int type) {
  CHECK(f == ENVOY && hook != NO_HOOK);
  body_t *b = body_of(type);
  return b != NULL ? b->count : 0;
}

bool envoy_dynamic_module_callback_http_get_body_chunks(sg_filter_envoy f, int type,
                                                        sg_envoy_buffer *chunks) {
  CHECK(f == ENVOY && hook != NO_HOOK);
  body_t *b = body_of(type);
  if (b == NULL) return false;
  for (size_t i = 0; i < b->count; i++)
    chunks[i] = (sg_envoy_buffer){b->slices[i].ptr, b->slices[i].length};
  return true;
}

size_t envoy_dynamic_module_callback_http_get_body_size(sg_filter_envoy f, int type) {
  CHECK(f == ENVOY && hook != NO_HOOK);
  body_t *b = body_of(type);
  return b != NULL ? body_size(b) : 0;
}

bool envoy_dynamic_module_callback_http_drain_body(sg_filter_envoy f, int type, size_t bytes) {
  CHECK(f == ENVOY && hook != NO_HOOK);
  body_t *b = body_of(type);
  if (b == NULL) return false;
  body_drain(b, bytes); /* at most what it holds, as Envoy */
  return true;
}

bool envoy_dynamic_module_callback_http_append_body(sg_filter_envoy f, int type,
                                                   sg_module_buffer data) {
  CHECK(f == ENVOY && hook != NO_HOOK);
  body_t *b = body_of(type);
  if (type == SG_RECEIVED_REQUEST_BODY && b == NULL) return false;
  if (b == NULL) { /* Envoy's addDecodedData: a buffered body made */
    buffered.exists = true;
    b = &buffered;
  }
  body_add(b, data.ptr, data.length);
  return true;
}

static meta_t *meta_put(sg_module_buffer ns, sg_module_buffer key) {
  CHECK(hook != NO_HOOK && key_is(ns, setting("namespace")));
  for (size_t m = 0; m < nmeta; m++)
    if (same(metas[m].key, metas[m].key_length, key.ptr, key.length)) {
      metas[m].writes++;
      free(metas[m].value);
      metas[m].value = NULL;
      return &metas[m];
    }
  CHECK(nmeta < MAX_META);
  meta_t *m = &metas[nmeta++];
  *m = (meta_t){malloc(key.length + 1), key.length, false, false, NULL, 0, 1};
  if (m->key == NULL) abort();
  memcpy(m->key, key.ptr, key.length);
  m->key[key.length] = 0;
  return m;
}

void envoy_dynamic_module_callback_http_set_dynamic_metadata_string(sg_filter_envoy f,
                                                                    sg_module_buffer ns,
                                                                    sg_module_buffer key,
                                                                    sg_module_buffer value) {
  CHECK(f == ENVOY);
  meta_t *m = meta_put(ns, key);
  m->is_bool = false;
  m->value = malloc(value.length + 1);
  if (m->value == NULL) abort();
  if (value.length > 0) memcpy(m->value, value.ptr, value.length);
  m->value[value.length] = 0;
  m->length = value.length;
}

void envoy_dynamic_module_callback_http_set_dynamic_metadata_bool(sg_filter_envoy f,
                                                                  sg_module_buffer ns,
                                                                  sg_module_buffer key,
                                                                  bool value) {
  CHECK(f == ENVOY);
  meta_t *m = meta_put(ns, key);
  m->is_bool = true;
  m->flag = value;
}

void envoy_dynamic_module_callback_http_clear_route_cache(sg_filter_envoy f) {
  CHECK(f == ENVOY && hook != NO_HOOK);
  clears++;
}

/* ---- what a stream did ------------------------------------------------------------------ */

/* Everything the filter changed, in one text: the metadata (in its keys' order), the
 * headers (in order), the route cache cleared, the body sent on. */
static void describe(bytes_t *into) {
  into->n = 0;
  bytes_addz(into, "");
  bool done[MAX_META] = {false};
  for (size_t k = 0; k < nmeta; k++) {
    size_t first = MAX_META;
    for (size_t m = 0; m < nmeta; m++)
      if (!done[m] && (first == MAX_META || strcmp(metas[m].key, metas[first].key) < 0))
        first = m;
    done[first] = true;
    const meta_t *m = &metas[first];
    char line[64];
    snprintf(line, sizeof line, "meta %d ", m->writes);
    bytes_addz(into, line);
    bytes_addz(into, m->key);
    if (m->is_bool) {
      bytes_addz(into, m->flag ? " = bool true\n" : " = bool false\n");
    } else {
      bytes_addz(into, " = \"");
      bytes_add(into, m->value, m->length);
      bytes_addz(into, "\"\n");
    }
  }
  for (size_t h = 0; h < nheaders; h++) {
    bytes_addz(into, "header ");
    bytes_addz(into, headers[h].key);
    bytes_addz(into, ": ");
    bytes_add(into, headers[h].value, headers[h].length);
    bytes_addz(into, "\n");
  }
  char line[160];
  snprintf(line, sizeof line, "clears %d, sets client %d usage %d length %d path %d\nbody [",
           clears, sets_client, sets_usage, sets_length, sets_path);
  bytes_addz(into, line);
  bytes_add(into, out.p, out.n);
  bytes_addz(into, "]\n");
}

static void dump(void) {
  static bool dumping;
  if (dumping) return;
  dumping = true;
  bytes_t d = {0};
  describe(&d);
  fprintf(stderr, "the stream (headers hook %d, %d stops, hook %d):\n%.*s", headers_status,
          stops, (int)hook, (int)(d.n > 4000 ? 4000 : d.n), d.p);
  free(d.p);
  dumping = false;
}

static void reset_stream(void) {
  for (size_t h = 0; h < nheaders; h++) free(headers[h].key), free(headers[h].value);
  nheaders = 0;
  for (size_t m = 0; m < nmeta; m++) free(metas[m].key), free(metas[m].value);
  nmeta = 0;
  body_free(&received);
  body_free(&buffered);
  out.n = 0;
  stopped = false;
  clears = headers_status = stops = 0;
  sets_client = sets_usage = sets_length = sets_path = 0;
}

static const meta_t *meta_find(const char *setting_key) {
  const char *name = setting(setting_key);
  for (size_t m = 0; m < nmeta; m++)
    if (strcmp(metas[m].key, name) == 0) return &metas[m];
  return NULL;
}

/* Metadata `setting_key` names is the string `value`. */
static bool meta_is(const char *setting_key, const char *value) {
  const meta_t *m = meta_find(setting_key);
  return m != NULL && !m->is_bool && same(m->value, m->length, value, strlen(value));
}

static bool meta_bool(const char *setting_key, bool value) {
  const meta_t *m = meta_find(setting_key);
  return m != NULL && m->is_bool && m->flag == value;
}

static long long meta_number(const char *setting_key) {
  const meta_t *m = meta_find(setting_key);
  CHECK(m != NULL && !m->is_bool && m->length > 0 && m->length < 20);
  char *end = NULL;
  long long n = strtoll(m->value, &end, 10);
  CHECK(*end == 0);
  return n;
}

/* How many values header `key` has now; *first the first. */
static size_t header_values(const char *key, const header_t **first) {
  size_t n = 0;
  *first = NULL;
  for (size_t h = 0; h < nheaders; h++)
    if (strcmp(headers[h].key, key) == 0 && n++ == 0) *first = &headers[h];
  return n;
}

/* Header `key` has one value now, `value`. */
static bool header_is(const char *key, const char *value) {
  const header_t *h;
  return header_values(key, &h) == 1 && same(h->value, h->length, value, strlen(value));
}

/* ---- driving, as Envoy does ------------------------------------------------------------- */

typedef struct {
  const char *key, *value;
  size_t length;
} pair_t;

typedef struct {
  pair_t headers[24];
  size_t nheaders;
  bool content_length; /* sent with a content-length header (of the body's length) */
  const char *body;    /* NULL: the request ends with its headers */
  size_t length;
} request_t;

static void rq_header_n(request_t *rq, const char *key, const char *value, size_t length) {
  CHECK(rq->nheaders < sizeof rq->headers / sizeof *rq->headers);
  rq->headers[rq->nheaders++] = (pair_t){key, value, length};
}

static void rq_header(request_t *rq, const char *key, const char *value) {
  rq_header_n(rq, key, value, strlen(value));
}

enum { END_WITH_DATA, END_EMPTY_FRAME, END_TRAILERS };

typedef struct {
  size_t frame;    /* bytes a data frame at most (0: the whole body in one) */
  size_t slice;    /* bytes a slice at most (0: a frame in one) */
  bool random;     /* frames and slices of random sizes up to those, some empty */
  int ending;      /* END_*: the last data frame ends the stream, an empty frame, trailers */
  bool moves_last; /* Envoy 1.40's decodeData: data that ends the stream joins the buffered
                    * body (when there is one) before the hook, its received body empty */
} plan_t;

static const plan_t WHOLE = {0, 0, false, END_WITH_DATA, true};

static uint64_t rng = 88172645463325252ull;
static uint64_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

/* One data frame, p[0, n), through the body hook. */
static void data_hook(void *f, const char *p, size_t n, const plan_t *plan, bool end) {
  if (n == 0 && plan->random && rnd() % 4 == 0) body_add(&received, NULL, 0);
  for (size_t at = 0; at < n;) {
    size_t take = plan->slice == 0 ? n - at : plan->slice;
    if (plan->random) take = rnd() % 16 == 0 ? 0 : 1 + rnd() % take; /* empty ones too */
    if (take > n - at) take = n - at;
    body_add(&received, p + at, take);
    at += take;
  }
  if (end && buffered.exists && plan->moves_last) body_move(&buffered, &received);
  hook = IN_BODY;
  int status = KIND.request_body(ENVOY, f, end);
  hook = NO_HOOK;
  CHECK(status == SG_CONTINUE || (status == SG_BODY_STOP_ITERATION_AND_BUFFER && !end));
  if (status == SG_BODY_STOP_ITERATION_AND_BUFFER) { /* Envoy buffers the data */
    buffered.exists = true;
    body_move(&buffered, &received);
    stopped = true;
    stops++;
  } else if (stopped) { /* the data joins the buffered body, which goes on */
    body_move(&buffered, &received);
    body_emit(&buffered, &out);
    stopped = false;
  } else {
    body_emit(&received, &out);
  }
}

static void trailers_hook(void *f) {
  hook = IN_TRAILERS;
  int status = KIND.request_trailers(ENVOY, f);
  hook = NO_HOOK;
  CHECK(status == SG_CONTINUE);
  if (stopped) body_emit(&buffered, &out); /* the body goes on before the trailers */
  stopped = false;
}

/* One request through a new filter of `config`, its body sent as `plan` says. */
static void run(void *config, const request_t *rq, const plan_t *plan) {
  reset_stream();
  for (size_t h = 0; h < rq->nheaders; h++) {
    const pair_t *p = &rq->headers[h];
    header_add(p->key, strlen(p->key), p->value, p->length);
  }
  if (rq->content_length) {
    char digits[32];
    int n = snprintf(digits, sizeof digits, "%zu", rq->length);
    header_add("content-length", 14, digits, (size_t)n);
  }
  void *f = KIND.filter_new(config, ENVOY);
  CHECK(f != NULL);
  hook = IN_HEADERS;
  headers_status = KIND.request_headers(ENVOY, f, rq->body == NULL);
  hook = NO_HOOK;
  CHECK(headers_status == SG_CONTINUE ||
        (headers_status == SG_HEADERS_STOP_ITERATION && rq->body != NULL));
  stopped = headers_status != SG_CONTINUE;
  if (rq->body != NULL) {
    size_t at = 0, n = rq->length;
    for (;;) {
      size_t take = plan->frame == 0 ? n - at : plan->frame;
      if (plan->random && take > 0) take = rnd() % 8 == 0 ? 0 : 1 + rnd() % take;
      if (take > n - at) take = n - at;
      bool last = at + take == n;
      data_hook(f, rq->body + at, take, plan, last && plan->ending == END_WITH_DATA);
      at += take;
      if (last) break;
    }
    if (plan->ending == END_EMPTY_FRAME) data_hook(f, NULL, 0, plan, true);
    if (plan->ending == END_TRAILERS) trailers_hook(f);
  }
  KIND.filter_destroy(f);
  CHECK(!stopped); /* Envoy got the whole request on */
  CHECK(received.count == 0 && buffered.count == 0);
}

/* `body` with the configuration's include_usage member after its first `{`. */
static void spliced(const char *body, size_t n, bytes_t *into) {
  into->n = 0;
  bytes_add(into, body, n);
  const char *brace = memchr(body, '{', n);
  CHECK(brace != NULL);
  const char *member = setting("include_usage");
  bytes_insert(into, (size_t)(brace - body) + 1, member, strlen(member));
}

/* ---- modes ------------------------------------------------------------------------------ */

static size_t unhex(const char *line, char *into) {
  size_t n = 0;
  for (size_t i = 0; line[i] && line[i + 1] && line[i] != '\n'; i += 2) {
    unsigned byte;
    if (sscanf(line + i, "%2x", &byte) != 1) break;
    into[n++] = (char)byte;
  }
  return n;
}

/* A line of stdin, whole (NULL at the end); the caller frees it. */
static char *read_line(void) {
  bytes_t line = {0};
  int c;
  while ((c = getchar()) != EOF && c != '\n') {
    char ch = (char)c;
    bytes_add(&line, &ch, 1);
  }
  if (c == EOF && line.n == 0) {
    free(line.p);
    return NULL;
  }
  bytes_addz(&line, "");
  return line.p;
}

/* A configuration made from text[0, n) (a copy freed at once: the filter keeps its own). */
static void *new_config(const char *text, size_t n) {
  char *copy = malloc(n > 0 ? n : 1);
  if (copy == NULL) abort();
  if (n > 0) memcpy(copy, text, n);
  void *config = KIND.config_new(copy, n);
  memset(copy, 0, n);
  free(copy);
  return config;
}

static int mode_config(void) {
  char *line;
  while ((line = read_line()) != NULL) {
    char *text = malloc(strlen(line) / 2 + 1);
    if (text == NULL) abort();
    size_t n = unhex(line, text);
    void *config = new_config(text, n);
    printf("%d\n", config != NULL);
    if (config != NULL) KIND.config_destroy(config);
    free(text);
    free(line);
  }
  return 0;
}

/* The configuration on stdin (one hex line), made, its names loaded. */
static bytes_t config_text;
static void *load_config(void) {
  char *line = read_line();
  CHECK(line != NULL);
  char *text = malloc(strlen(line) / 2 + 1);
  if (text == NULL) abort();
  size_t n = unhex(line, text);
  bytes_add(&config_text, text, n);
  free(text);
  free(line);
  settings_load(config_text.p, config_text.n);
  void *config = new_config(config_text.p, config_text.n);
  CHECK(config != NULL);
  return config;
}

/* The configuration with its first line starting with `prefix` replaced by `line` (or
 * dropped, when `line` is NULL; appended when none starts so); made or not. */
static bool made_with(const char *prefix, const char *line) {
  bytes_t text = {0};
  bool replaced = false;
  size_t at = 0;
  while (at < config_text.n) {
    const char *start = config_text.p + at;
    const char *end = memchr(start, '\n', config_text.n - at);
    size_t length = end ? (size_t)(end - start) + 1 : config_text.n - at;
    if (!replaced && prefix != NULL && strncmp(start, prefix, strlen(prefix)) == 0) {
      replaced = true;
      if (line != NULL) bytes_addz(&text, line), bytes_addz(&text, "\n");
    } else {
      bytes_add(&text, start, length);
    }
    at += length;
  }
  if (!replaced && line != NULL) bytes_addz(&text, line), bytes_addz(&text, "\n");
  CHECK(replaced || prefix == NULL || line != NULL);
  void *config = new_config(text.p, text.n);
  free(text.p);
  if (config == NULL) return false;
  KIND.config_destroy(config);
  return true;
}

static const char PLAIN[] =
    "{\"model\":\"gpt-4o-mini\",\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}";
static const char MESSAGES[] = "[{\"role\":\"user\",\"content\":\"hello\"}]";
static const char STREAM[] = "{\"model\":\"gpt-4o\",\"stream\":true,"
                             "\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}";

/* A request to `path` (NULL: none) from `client` (NULL: no client header) with `body`
 * (NULL: none), a content-length with it. */
static request_t request(const char *path, const char *client, const char *body) {
  request_t rq = {0};
  if (path != NULL) rq_header(&rq, ":path", path);
  if (client != NULL) rq_header(&rq, setting("client_header"), client);
  if (body != NULL) {
    rq.body = body;
    rq.length = strlen(body);
    rq.content_length = true;
  }
  return rq;
}

static char *client_of(const char *lane, const char *tenant, const char *key) {
  static char named[8][128];
  static int next;
  char *into = named[next++ % 8];
  snprintf(into, sizeof named[0], "%s/%s/%s", setting(lane), tenant, key);
  return into;
}

/* Nothing written, no header set, the route cache kept, the body sent on as it came. */
static void expect_untouched(const request_t *rq) {
  CHECK(nmeta == 0 && clears == 0 && sets_client + sets_usage + sets_length == 0);
  CHECK(rq->body == NULL || same(out.p, out.n, rq->body, rq->length));
}

/* A refusal: `problem` written once, the class `class` (NULL: none), the cache cleared
 * once, the body as it came; with a fast-lane client, its tenant and key. */
static void expect_refused(const request_t *rq, const char *problem, const char *class,
                           const char *tenant) {
  CHECK(meta_is("meta_problem", problem));
  CHECK(class == NULL ? meta_find("meta_priority") == NULL : meta_is("meta_priority", class));
  CHECK(tenant == NULL ? meta_find("meta_tenant") == NULL : meta_is("meta_tenant", tenant));
  CHECK(nmeta == 1u + (class != NULL) + 2u * (tenant != NULL));
  CHECK(clears == 1 && sets_client + sets_usage + sets_length == 0);
  CHECK(same(out.p, out.n, rq->body, rq->length));
}

static void check_splice_cases(void *config) {
  bytes_t want = {0};
  spliced(STREAM, strlen(STREAM), &want);
  char length[32];
  snprintf(length, sizeof length, "%zu", want.n);
  request_t rq = request("/v1/chat/completions", client_of("lane_fast", "acme", "k1"), STREAM);
  /* One slice; 1-byte slices over hooks of 5 bytes and of 1; ended with the last data,
   * by an empty frame or by trailers; with Envoy 1.40's last-frame move and without. */
  const plan_t plans[] = {
      WHOLE,
      {0, 1, false, END_WITH_DATA, true},
      {5, 1, false, END_WITH_DATA, true},
      {5, 1, false, END_WITH_DATA, false},
      {1, 1, false, END_WITH_DATA, true},
      {5, 1, false, END_EMPTY_FRAME, true},
      {5, 1, false, END_EMPTY_FRAME, false},
      {5, 1, false, END_TRAILERS, true},
      {0, 0, false, END_TRAILERS, true},
      {0, 1, false, END_TRAILERS, true},
      {7, 3, true, END_TRAILERS, true},
  };
  for (size_t p = 0; p < sizeof plans / sizeof *plans; p++) {
    run(config, &rq, &plans[p]);
    CHECK(same(out.p, out.n, want.p, want.n));
    CHECK(header_is("content-length", length) && sets_length == 1);
    CHECK(meta_is("meta_usage_injected", setting("injected_value")));
    CHECK(header_is(setting("usage_header"), setting("by_chunks")));
    CHECK(meta_is("meta_model", "gpt-4o") && meta_bool("meta_stream", true));
    CHECK(meta_is("meta_charged_tenant", "acme") && clears == 1);
    CHECK(headers_status == SG_HEADERS_STOP_ITERATION);
  }
  /* The path's query and trailing slashes do not count; no client header is asked too. */
  rq = request("/v1/completions/?stream=1", NULL, STREAM);
  run(config, &rq, &WHOLE);
  CHECK(same(out.p, out.n, want.p, want.n) && meta_find("meta_usage_injected") != NULL);
  CHECK(meta_find("meta_tenant") == NULL && meta_find("meta_charged_tenant") == NULL);
  /* Not asked: a client that asked (stream_options, even null), an endpoint without
   * usage events, a model whose routes do not ask, no path. */
  const char *const bodies[] = {
      "{\"model\":\"gpt-4o\",\"stream\":true,\"stream_options\":null}", STREAM, STREAM,
      "{\"model\":\"gpt-4o-mini\",\"stream\":true}", STREAM};
  const char *const paths[] = {"/v1/chat/completions", "/v1/responses", "/v1/embeddings",
                               "/v1/chat/completions", NULL};
  for (size_t c = 0; c < sizeof bodies / sizeof *bodies; c++) {
    rq = request(paths[c], client_of("lane_fast", "acme", "k1"), bodies[c]);
    run(config, &rq, &(plan_t){3, 2, false, END_TRAILERS, true});
    CHECK(same(out.p, out.n, rq.body, rq.length) && sets_length == 0);
    CHECK(meta_find("meta_usage_injected") == NULL && meta_bool("meta_stream", true));
    CHECK(header_is(setting("usage_header"), setting("by_stream")) && clears == 1);
  }
  free(want.p);
}

static int mode_cases(void) {
  void *config = load_config();

  /* A fast-lane tenant's plain chat: its tenant, key, class, model, stream, estimate and
   * charged tenant written; its answer's usage read from the log; matched again once. */
  request_t rq = request("/v1/chat/completions", client_of("lane_fast", "acme", "k1"), PLAIN);
  const plan_t plain_plans[] = {WHOLE, {4, 2, false, END_TRAILERS, true},
                                {9, 0, false, END_EMPTY_FRAME, false}};
  for (size_t p = 0; p < sizeof plain_plans / sizeof *plain_plans; p++) {
    run(config, &rq, &plain_plans[p]);
    CHECK(meta_is("meta_tenant", "acme") && meta_is("meta_key_name", "k1"));
    CHECK(meta_is("meta_priority", "standard") && meta_is("meta_model", "gpt-4o-mini"));
    CHECK(meta_bool("meta_stream", false) && meta_is("meta_charged_tenant", "acme"));
    long long input = (long long)(strlen(MESSAGES) + 3) / 4;
    CHECK(meta_number("meta_estimate_input") == input);
    CHECK(meta_number("meta_estimate_output") == atoll(setting("default_max_tokens")));
    CHECK(meta_number("meta_estimate_tokens") == input + atoll(setting("default_max_tokens")));
    CHECK(nmeta == 9 && meta_find("meta_auto_lane") == NULL);
    CHECK(header_is(setting("usage_header"), setting("by_log")));
    CHECK(clears == 1 && sets_usage == 1 && sets_length == 0 && sets_client == 0);
    CHECK(same(out.p, out.n, PLAIN, strlen(PLAIN)));
    CHECK(headers_status == SG_HEADERS_STOP_ITERATION && (stops > 0) == (p > 0));
  }
  /* Log probabilities asked, a cap over the log's limit, or no generation endpoint:
   * no usage read from the log. */
  const char *const unread[] = {
      "{\"model\":\"gpt-4o\",\"logprobs\":true}", "{\"model\":\"gpt-4o\",\"top_logprobs\":2}",
      "{\"model\":\"gpt-4o\",\"max_tokens\":4096,\"n\":2}"};
  for (size_t u = 0; u < sizeof unread / sizeof *unread; u++) {
    rq = request("/v1/responses", NULL, unread[u]);
    run(config, &rq, &WHOLE);
    CHECK(header_is(setting("usage_header"), setting("by_unread")) && clears == 1);
  }
  const char *const logged[] = {
      "{\"model\":\"gpt-4o\",\"logprobs\":false,\"top_logprobs\":0}",
      "{\"model\":\"gpt-4o\",\"logprobs\":null,\"top_logprobs\":[ ]}",
      "{\"model\":\"gpt-4o\",\"max_tokens\":2048,\"n\":2}"};
  for (size_t l = 0; l < sizeof logged / sizeof *logged; l++) {
    rq = request("/v1/responses", NULL, logged[l]);
    run(config, &rq, &WHOLE);
    CHECK(header_is(setting("usage_header"), setting("by_log")) && clears == 1);
  }
  rq = request("/v1/embeddings", NULL, PLAIN);
  run(config, &rq, &WHOLE);
  CHECK(header_is(setting("usage_header"), setting("by_unread")));
  CHECK(nmeta == 5); /* model, stream, the three estimates: no client */
  /* The first cap sent is the allowance, per choice. */
  rq = request("/v1/chat/completions", NULL,
               "{\"model\":\"m\",\"max_output_tokens\":null,\"max_tokens\":7,\"n\":3,"
               "\"max_completion_tokens\":null}");
  run(config, &rq, &WHOLE);
  CHECK(meta_number("meta_estimate_output") == 21);
  /* Prompt members' bytes: ASCII / 4 rounded up once, plus per value the larger of its
   * lead bytes and its other high bytes / 4 rounded up. */
  rq = request("/v1/chat/completions", NULL,
               "{\"model\":\"m\",\"prompt\":\"\xc3\xa9t\xc3\xa9\","
               "\"input\":\"\x80\x80\x80\x80\x80\"}");
  run(config, &rq, &WHOLE);
  /* ASCII: 3 + 2 quotes and t, 2 tokens; leads: 2 (the é's); five other high bytes: 2. */
  CHECK(meta_number("meta_estimate_input") == 2 + 2 + 2);

  check_splice_cases(config);

  /* An exact-lane client: the routing stage's; nothing written, no body held. */
  rq = request("/v1/chat/completions", client_of("lane_exact", "acme", "k1"), STREAM);
  run(config, &rq, &(plan_t){3, 1, false, END_WITH_DATA, true});
  expect_untouched(&rq);
  CHECK(headers_status == SG_CONTINUE && stops == 0);
  run(config, &rq, &(plan_t){3, 1, false, END_TRAILERS, true});
  expect_untouched(&rq);
  CHECK(headers_status == SG_CONTINUE && stops == 0);
  rq = request("/v1/chat/completions", client_of("lane_exact", "nobody", "k"), NULL);
  run(config, &rq, &WHOLE);
  expect_untouched(&rq);

  /* No body (the headers end the request): a tenant's class only, the one it asked
   * ignored, as the routing stage leaves it; without a client, nothing. */
  rq = request("/v1/models", client_of("lane_fast", "gamma", "k3"), NULL);
  rq_header(&rq, setting("priority_header"), "interactive");
  run(config, &rq, &WHOLE);
  CHECK(meta_is("meta_tenant", "gamma") && meta_is("meta_key_name", "k3"));
  CHECK(meta_is("meta_priority", "batch") && nmeta == 3);
  CHECK(clears == 0 && sets_usage == 0 && headers_status == SG_CONTINUE);
  rq = request("/v1/models", NULL, NULL);
  run(config, &rq, &WHOLE);
  expect_untouched(&rq);
  /* An empty body (its frames empty): the same, after waiting for it. */
  rq = request("/v1/models", client_of("lane_fast", "gamma", "k3"), "");
  run(config, &rq, &(plan_t){0, 0, false, END_EMPTY_FRAME, true});
  CHECK(meta_is("meta_priority", "batch") && nmeta == 3 && clears == 0);
  CHECK(headers_status == SG_HEADERS_STOP_ITERATION);
  run(config, &rq, &(plan_t){0, 0, false, END_TRAILERS, true});
  CHECK(meta_is("meta_priority", "batch") && nmeta == 3 && clears == 0);

  /* A client the key check named that is no tenant's, or not "<lane>/<tenant>/<key>":
   * refused at the headers, the body not held. */
  const char *const unknown[][2] = {
      {"lane_fast", "/nobody/k9"}, {"lane_fast", "/acme"},       {NULL, ""},
      {"lane_fast", "/acme/k1/x"}, {"lane_fast", "//k1"},        {NULL, "/acme/k1"},
      {"lane_fast", "/acme/"},     {NULL, "other/acme/k1"},      {NULL, "fastacmek1"},
      {"lane_exact", "/acme/k1/x"}, {"lane_exact", "//k1"},      {"lane_fast", "/Acme/k1"},
  };
  for (size_t u = 0; u < sizeof unknown / sizeof *unknown; u++) {
    char named[64];
    snprintf(named, sizeof named, "%s%s", unknown[u][0] ? setting(unknown[u][0]) : "",
             unknown[u][1]);
    rq = request("/v1/chat/completions", named, PLAIN);
    run(config, &rq, &(plan_t){4, 1, false, END_WITH_DATA, true});
    expect_refused(&rq, setting("unknown_client"), NULL, NULL);
    CHECK(headers_status == SG_CONTINUE && stops == 0);
  }
  /* A repeated client header is read as Envoy's Lua reads it, its values joined. */
  rq = request("/v1/chat/completions", client_of("lane_fast", "acme", "k1"), PLAIN);
  rq_header(&rq, setting("client_header"), client_of("lane_fast", "acme", "k1"));
  run(config, &rq, &WHOLE);
  expect_refused(&rq, setting("unknown_client"), NULL, NULL);

  /* Refused bodies: the problem written once, a tenant's class as none. */
  const char *const refused[][2] = {
      {"{\"model\":1}", "model_type"},
      {"{\"model\":\"\"}", "model"},
      {"{\"stream\":true}", "model"},
      {"{\"model\":\"a\",\"model\":\"b\"}", "duplicate_model"},
      {"{\"model\":\"a\",\"messages\":[],\"messages\":[]}", "duplicate_messages"},
      {"{\"model\":\"gpt-4o\",\"max_tokens\":0}", "max_tokens_max_tokens"},
      {"{\"model\":\"gpt-4o\",\"max_completion_tokens\":4097}",
       "max_tokens_max_completion_tokens"},
      {"{\"model\":\"gpt-4o\",\"max_output_tokens\":1.5}", "max_tokens_max_output_tokens"},
      {"{\"model\":\"gpt-4o\",\"n\":129}", "n"},
      {"{\"model\":\"gpt-4o\",\"stream\":\"yes\"}", "stream"},
      {"[1]", "object"},
      {" \"x\" ", "object"},
      {"{\"model\":\"gpt-4o\"", "json"},
      {"{\"Model\":\"x\"}", "json"},
      {"{\"mod\\u0065l\":\"x\"}", "json"},
      {"{\"model\":\"x\"} x", "json"},
      {"nope", "json"},
      {"   ", "json"},
  };
  for (size_t r = 0; r < sizeof refused / sizeof *refused; r++) {
    rq = request("/v1/chat/completions", client_of("lane_fast", "acme", "k1"), refused[r][0]);
    run(config, &rq, &(plan_t){2, 1, false, END_TRAILERS, true});
    expect_refused(&rq, refused[r][1], setting("no_class"), "acme");
    rq = request("/v1/chat/completions", NULL, refused[r][0]);
    run(config, &rq, &WHOLE);
    expect_refused(&rq, refused[r][1], NULL, NULL);
  }
  /* A model the tenant may not use: its class recorded. */
  rq = request("/v1/chat/completions", client_of("lane_fast", "gamma", "k3"), STREAM);
  run(config, &rq, &WHOLE);
  expect_refused(&rq, setting("model_not_allowed"), "batch", "gamma");
  /* A class above the tenant's, or none: refused without one. */
  const char *const invalid[] = {"interactive", "gold", "standard,interactive", " x "};
  for (size_t i = 0; i < sizeof invalid / sizeof *invalid; i++) {
    rq = request("/v1/chat/completions", client_of("lane_fast", "acme", "k1"), PLAIN);
    rq_header(&rq, setting("priority_header"), invalid[i]);
    run(config, &rq, &WHOLE);
    expect_refused(&rq, setting("invalid_priority"), setting("no_class"), "acme");
  }
  /* Its own or a lower one: the last of its values, trimmed, in lower case. */
  const char *const asked[][3] = {
      {" Batch\t", NULL, "batch"},         {"STANDARD", NULL, "standard"},
      {"", NULL, "standard"},              {"interactive", "batch", "batch"},
      {"gold, batch \v", NULL, "batch"},   {"batch,", NULL, "standard"},
  };
  for (size_t a = 0; a < sizeof asked / sizeof *asked; a++) {
    rq = request("/v1/chat/completions", client_of("lane_fast", "acme", "k1"), PLAIN);
    rq_header(&rq, setting("priority_header"), asked[a][0]);
    if (asked[a][1] != NULL) rq_header(&rq, setting("priority_header"), asked[a][1]);
    run(config, &rq, &WHOLE);
    CHECK(meta_is("meta_priority", asked[a][2]) && meta_find("meta_problem") == NULL);
  }

  /* An auto tenant's held model: the client renamed into the exact lane, nothing else
   * (the routing stage decides it). */
  const char *held = "{\"model\":\"held-model\",\"stream\":true,\"messages\":[]}";
  rq = request("/v1/chat/completions", client_of("lane_fast", "beta", "k2"), held);
  run(config, &rq, &(plan_t){6, 2, false, END_WITH_DATA, true});
  CHECK(header_is(setting("client_header"), client_of("lane_exact", "beta", "k2")));
  CHECK(sets_client == 1 && sets_usage == 0 && sets_length == 0 && clears == 0);
  CHECK(meta_is("meta_tenant", "beta") && meta_is("meta_key_name", "k2") && nmeta == 2);
  CHECK(same(out.p, out.n, held, strlen(held)));
  /* Its other models: charged as the auto lane's; `\/` read as `/`. */
  rq = request("/v1/chat/completions", client_of("lane_fast", "beta", "k2"),
               "{\"model\":\"org\\/m1\",\"max_tokens\":5}");
  run(config, &rq, &WHOLE);
  CHECK(meta_is("meta_model", "org/m1") && meta_bool("meta_auto_lane", true));
  CHECK(meta_is("meta_priority", "interactive") && meta_is("meta_charged_tenant", "beta"));
  CHECK(header_is(setting("client_header"), client_of("lane_fast", "beta", "k2")));
  /* Another tenant's held model is its own (only an auto tenant's is held). */
  rq = request("/v1/chat/completions", client_of("lane_fast", "acme", "k1"), held);
  run(config, &rq, &WHOLE);
  CHECK(meta_is("meta_model", "held-model") && meta_find("meta_auto_lane") == NULL);
  CHECK(sets_client == 0 && clears == 1);

  /* The scenario asked: as it came (an empty one too), its values joined, cut. */
  static char long_scenario[300];
  memset(long_scenario, 's', sizeof long_scenario - 1);
  size_t most = (size_t)atoll(setting("max_scenario_asked"));
  const char *const scenarios[][3] = {
      {"s1", NULL, "s1"}, {"", NULL, ""}, {"s1", "s2", "s1,s2"}, {long_scenario, NULL, NULL}};
  for (size_t s = 0; s < sizeof scenarios / sizeof *scenarios; s++) {
    rq = request("/v1/chat/completions", NULL, PLAIN);
    rq_header(&rq, setting("scenario_header"), scenarios[s][0]);
    if (scenarios[s][1] != NULL) rq_header(&rq, setting("scenario_header"), scenarios[s][1]);
    run(config, &rq, &WHOLE);
    const meta_t *m = meta_find("meta_scenario_asked");
    CHECK(m != NULL && !m->is_bool);
    if (scenarios[s][2] != NULL) CHECK(same(m->value, m->length, scenarios[s][2],
                                            strlen(scenarios[s][2])));
    else CHECK(m->length == most && memcmp(m->value, long_scenario, most) == 0);
  }
  rq = request("/v1/chat/completions", NULL, PLAIN);
  run(config, &rq, &WHOLE);
  CHECK(meta_find("meta_scenario_asked") == NULL);

  /* A model name longer than the filter's stack copy. */
  bytes_t big = {0};
  bytes_addz(&big, "{\"model\":\"");
  bytes_repeat(&big, 'm', 1000);
  bytes_addz(&big, "\\/x\"}");
  rq = request("/v1/chat/completions", NULL, big.p);
  run(config, &rq, &(plan_t){100, 7, false, END_TRAILERS, true});
  const meta_t *model = meta_find("meta_model");
  CHECK(model != NULL && model->length == 1002 && memcmp(model->value + 1000, "/x", 2) == 0);
  free(big.p);

  /* Configurations refused: a setting missing, repeated, empty or unknown; a line with
   * no `=`; a tenant with too few fields, an empty one, an auto flag not 0 or 1, or a
   * class that is not one; a list naming a non-member; a number that is none. */
  CHECK(made_with(NULL, NULL));
  CHECK(!made_with("namespace=", NULL));
  CHECK(!made_with("include_usage=", NULL));
  CHECK(!made_with(NULL, "namespace=again"));
  CHECK(!made_with("namespace=", "namespace="));
  CHECK(!made_with(NULL, "bogus=1"));
  CHECK(!made_with(NULL, "bogus"));
  CHECK(!made_with(NULL, "tenant=zeta\tstandard"));
  CHECK(!made_with(NULL, "tenant=zeta"));
  CHECK(!made_with(NULL, "tenant="));
  CHECK(!made_with(NULL, "tenant=zeta\tstandard\t\tall"));
  CHECK(!made_with(NULL, "tenant=zeta\tstandard\t2\tall"));
  CHECK(!made_with(NULL, "tenant=zeta\tgold\t0\tall"));
  CHECK(!made_with(NULL, "tenant=zeta\tstandard\t0\tall\tgpt-4o"));
  CHECK(!made_with(NULL, "tenant=zeta\tstandard\t0\t*")); /* neither all nor only */
  CHECK(!made_with(NULL, "tenant=zeta\tstandard\t0")); /* no fourth field */
  CHECK(made_with(NULL, "tenant=zeta\tstandard\t0\tonly")); /* it may use no model */
  CHECK(made_with(NULL, "tenant=zeta\tstandard\t0\tonly\t*\tall")); /* models' names */
  CHECK(!made_with("caps=", "caps=max_tokens,bogus"));
  CHECK(!made_with("caps=", "caps=max_tokens,"));
  CHECK(!made_with("prompt=", "prompt=messages,Prompt"));
  CHECK(!made_with("members=", "members=stream,stream_options,n"));
  CHECK(!made_with("max_n=", "max_n=-1"));
  CHECK(!made_with("max_n=", "max_n=12x"));
  CHECK(!made_with("max_n=", "max_n=1234567890123456"));
  CHECK(!made_with("class=", "class="));
  CHECK(!made_with("held=", "held="));
  /* A tenant's class missing from the classes. */
  CHECK(!made_with("class=interactive", "class=other"));
  CHECK(!made_with("class=batch", NULL));

  KIND.config_destroy(config);
  free(config_text.p);
  free(setting_text);
  reset_stream();
  free(out.p);
  printf("ok\n");
  return 0;
}

/* ---- fuzz ------------------------------------------------------------------------------- */

static const char *const SEEDS[] = {
    "{\"model\":\"gpt-4o\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
    "{\"model\":\"gpt-4o-mini\",\"max_tokens\":100,\"n\":2,\"prompt\":\"x\",\"logprobs\":false}",
    "{\"model\":\"held-model\",\"messages\":[],\"stream\":true}",
    " {\"model\" : \"org\\/m1\" ,\"stream\":true, \"input\":\"\xc3\xa9\xe2\x82\xac\xff\"}\r\n",
    "{\"stream_options\":null,\"model\":\"gpt-4o\",\"stream\":true,\"max_completion_tokens\":4096,"
    "\"max_output_tokens\":5,\"top_logprobs\":0}",
    "{\"model\":\"gpt-4o\",\"tools\":[{\"a\":[1,2,{\"b\":\"c\\\"}]\"}]}],\"functions\":{},"
    "\"instructions\":\"\\\\\"}",
    "{\"model\":\"gpt-4o\",\"stream\":null,\"n\":null,\"max_tokens\":null,\"logprobs\":1e-400}",
    "{\"model\":\"org\\\\/m1\",\"n\":128,\"max_tokens\":4096}",
    "{ }",
    "[1,2,{\"model\":\"x\"}]",
    "\"model\"",
    "-0.5e+3",
    "{\"Model\":\"x\",\"model\":\"gpt-4o\"}",
};
#define SEED_COUNT (sizeof SEEDS / sizeof *SEEDS)

static const char *const FRAGMENTS[] = {
    "{", "}", "[", "]", "\"", "\\", ":", ",", " ", "\t", "\r\n", "\v", "null", "true", "false",
    "0", "1", "-1", "1e400", "\"model\":\"gpt-4o\",", "\"stream\":true,", "\"n\":1,",
    "\"messages\":[],", "\"stream_options\":{},", "\"max_tokens\":9,", "\"model\":",
    "\"model\":\"held-model\",", "\"logprobs\":true,", "\xff", "\xc3", "\0"};
#define FRAGMENT_COUNT (sizeof FRAGMENTS / sizeof *FRAGMENTS)

static void insert_fragment(bytes_t *b, size_t at) {
  size_t f = rnd() % FRAGMENT_COUNT;
  bytes_insert(b, at, FRAGMENTS[f], f == FRAGMENT_COUNT - 1 ? 1 : strlen(FRAGMENTS[f]));
}

static void mutate(bytes_t *b) {
  size_t at = b->n > 0 ? rnd() % (b->n + 1) : 0;
  const char *brace = b->n > 0 ? memchr(b->p, '{', b->n) : NULL;
  switch (rnd() % 9) {
    case 0: /* a byte flipped: to any, or to one with a meaning */
      if (b->n > 0) b->p[rnd() % b->n] = rnd() & 1 ? (char)rnd() : "{}[]\",:\\ "[rnd() % 9];
      break;
    case 1: /* truncated */
      b->n = rnd() % (b->n + 1);
      bytes_addz(b, "");
      break;
    case 2: /* a member repeated (after the first brace) or a piece of the body doubled */
      if (brace != NULL && rnd() & 1) {
        insert_fragment(b, (size_t)(brace - b->p) + 1);
      } else if (b->n > 0) {
        size_t from = rnd() % b->n, length = 1 + rnd() % (b->n - from);
        char *piece = malloc(length);
        if (piece == NULL) abort();
        memcpy(piece, b->p + from, length);
        bytes_insert(b, at, piece, length);
        free(piece);
      }
      break;
    case 3: /* random brackets and quotes */
      for (size_t k = 1 + rnd() % 8; k > 0; k--) bytes_insert(b, at, &"[]{}\""[rnd() % 5], 1);
      break;
    case 4: /* random bytes */
      for (size_t k = 1 + rnd() % 8; k > 0; k--) {
        char c = (char)rnd();
        bytes_insert(b, at, &c, 1);
      }
      break;
    case 5: /* a range deleted */
      if (b->n > 0) {
        size_t from = rnd() % b->n, length = 1 + rnd() % (b->n - from);
        memmove(b->p + from, b->p + from + length, b->n - from - length);
        b->n -= length;
        bytes_addz(b, "");
      }
      break;
    case 6: case 7: /* a token */
      insert_fragment(b, at);
      break;
    default: /* two bytes swapped */
      if (b->n > 1) {
        size_t i = rnd() % b->n, j = rnd() % b->n;
        char c = b->p[i];
        b->p[i] = b->p[j];
        b->p[j] = c;
      }
  }
}

/* A body: a seed mutated, deep nesting, a long string or model, random bytes. */
static void make_body(bytes_t *b) {
  b->n = 0;
  bytes_addz(b, "");
  uint64_t kind = rnd() % 100;
  if (kind < 3) { /* nesting up to 100k, about the filter's bound, and a wrong closer */
    size_t depth = rnd() & 1 ? 65530 + rnd() % 12 : 1 + rnd() % 100000;
    bool top = rnd() % 4 == 0;
    if (!top) bytes_addz(b, "{\"model\":\"gpt-4o\",\"stream\":true,\"messages\":");
    for (size_t d = 0; d < depth; d++) {
      bool array = rnd() % 8 != 0;
      bytes_add(b, array ? "[" : "{\"a\":", array ? 1 : 5);
    }
    /* closers read back from the openers */
    size_t opened = b->n;
    for (size_t i = opened; i-- > 0 && depth > 0;) {
      if (b->p[i] == '[') bytes_addz(b, "]"), depth--;
      else if (b->p[i] == '{' && i + 1 < opened && b->p[i + 1] == '"') bytes_addz(b, "}"), depth--;
    }
    if (rnd() % 4 == 0 && b->n > 0) b->p[b->n - 1 - rnd() % (b->n < 100 ? b->n : 100)] ^= 0x06;
    if (!top) bytes_addz(b, "}");
  } else if (kind < 6) { /* a long string, escapes in it */
    bytes_addz(b, "{\"model\":\"gpt-4o\",\"stream\":true,\"prompt\":\"");
    size_t length = rnd() % 300000;
    for (size_t i = 0; i < length; i++) {
      uint64_t r = rnd() % 128;
      bytes_add(b, r > 1 ? "a" : r == 1 ? "\\\\" : "\\\"", r > 1 ? 1 : 2);
    }
    bytes_addz(b, "\"}");
  } else if (kind < 9) { /* a long model name, `\/` in it */
    bytes_addz(b, "{\"model\":\"");
    for (size_t i = rnd() % 2000; i > 0; i--) bytes_addz(b, rnd() % 4 ? "m" : "\\/");
    bytes_addz(b, "\",\"stream\":true}");
  } else if (kind < 14) { /* random bytes */
    for (size_t i = rnd() % 64; i > 0; i--) {
      char c = (char)rnd();
      bytes_add(b, &c, 1);
    }
    return;
  } else {
    bytes_addz(b, SEEDS[rnd() % SEED_COUNT]);
  }
  if (kind >= 9 && kind < 60)
    for (size_t m = rnd() % 4; m > 0; m--) mutate(b);
}

/* A value for a header: one of `choices`, a long one (`long_value`), or an empty one. */
static const char *pick(const char *const *choices, size_t n) { return choices[rnd() % n]; }

static char long_values[6][600];

/* Header `key`: absent (1 in 4), one value or two, each from `choices` or long. */
static void random_header(request_t *rq, const char *key, const char *const *choices, size_t n,
                          int slot) {
  if (rnd() % 4 == 0) return;
  for (int v = rnd() % 6 == 0 ? 2 : 1; v > 0; v--) {
    if (rnd() % 10 == 0) {
      char *value = long_values[slot * 2 + (v - 1)];
      size_t length = 1 + rnd() % (sizeof long_values[0] - 1);
      const char *head = pick(choices, n);
      memset(value, "ak/ ,"[rnd() % 5], length);
      memcpy(value, head, strlen(head) < length ? strlen(head) : length);
      rq_header_n(rq, key, value, length);
    } else {
      rq_header(rq, key, pick(choices, n));
    }
  }
}

/* The request's client header (as sent): one value, of the exact lane and three parts. */
static bool exact_client(const request_t *rq) {
  const pair_t *h = NULL;
  for (size_t p = 0; p < rq->nheaders; p++) {
    if (strcmp(rq->headers[p].key, setting("client_header")) != 0) continue;
    if (h != NULL) return false;
    h = &rq->headers[p];
  }
  if (h == NULL) return false;
  const char *lane = setting("lane_exact");
  size_t l = strlen(lane);
  if (h->length <= l + 1 || memcmp(h->value, lane, l) != 0 || h->value[l] != '/') return false;
  const char *rest = h->value + l + 1, *end = h->value + h->length;
  const char *slash = memchr(rest, '/', (size_t)(end - rest));
  return slash != NULL && slash > rest && slash + 1 < end &&
         memchr(slash + 1, '/', (size_t)(end - slash - 1)) == NULL;
}

/* What holds for any request: each key written once; a refusal or a reading, not both,
 * and the route cache cleared once for either; a usage event asked for exactly as the
 * Lua reader splices it; the estimate's sum; nothing at all for an exact-lane client. */
static void check_invariants(const request_t *rq, bool exact, const bytes_t *want) {
  for (size_t m = 0; m < nmeta; m++) CHECK(metas[m].writes == 1);
  const meta_t *problem = meta_find("meta_problem"), *model = meta_find("meta_model");
  const meta_t *injected = meta_find("meta_usage_injected");
  CHECK(clears <= 1 && !(problem != NULL && model != NULL));
  CHECK(clears == (problem != NULL || model != NULL));
  CHECK(sets_client <= 1 && sets_usage <= 1 && sets_length <= 1 && sets_path <= 1);
  CHECK(sets_usage == (model != NULL));
  if (sets_client) CHECK(model == NULL && problem == NULL && clears == 0);
  if (exact) {
    CHECK(nmeta == 0 && clears == 0 && sets_client + sets_usage + sets_length + sets_path == 0);
    CHECK(headers_status == SG_CONTINUE && stops == 0);
  }
  if (injected != NULL) {
    CHECK(meta_is("meta_usage_injected", setting("injected_value")));
    CHECK(same(out.p, out.n, want->p, want->n) && sets_length == 1);
    char length[32];
    snprintf(length, sizeof length, "%zu", want->n);
    CHECK(header_is("content-length", length));
    CHECK(header_is(setting("usage_header"), setting("by_chunks")));
    CHECK(meta_bool("meta_stream", true));
  } else {
    CHECK(rq->body == NULL || same(out.p, out.n, rq->body, rq->length));
    CHECK(sets_length == 0);
  }
  if (model != NULL) {
    long long input = meta_number("meta_estimate_input");
    long long output = meta_number("meta_estimate_output");
    CHECK(input >= 0 && output > 0 && meta_number("meta_estimate_tokens") == input + output);
  }
  const meta_t *charged = meta_find("meta_charged_tenant"), *tenant = meta_find("meta_tenant");
  if (charged != NULL)
    CHECK(model != NULL && tenant != NULL && same(charged->value, charged->length,
                                                  tenant->value, tenant->length));
  if (meta_find("meta_auto_lane") != NULL)
    CHECK(charged != NULL && meta_bool("meta_auto_lane", true));
}

static int mode_fuzz(long iterations, uint64_t seed) {
  rng ^= seed * 0x9E3779B97F4A7C15ull;
  void *config = load_config();
  static const char *const paths[] = {
      "/v1/chat/completions", "/v1/chat/completions/?stream=1", "/v1/completions",
      "/v1/responses", "/v1/embeddings", "", "?", "/chat/completions//", "?/v1/completions"};
  char fast_acme[64], fast_beta[64], fast_gamma[64], exact_acme[64], exact_other[64];
  snprintf(fast_acme, sizeof fast_acme, "%s", client_of("lane_fast", "acme", "k1"));
  snprintf(fast_beta, sizeof fast_beta, "%s", client_of("lane_fast", "beta", "k2"));
  snprintf(fast_gamma, sizeof fast_gamma, "%s", client_of("lane_fast", "gamma", "k3"));
  snprintf(exact_acme, sizeof exact_acme, "%s", client_of("lane_exact", "acme", "k1"));
  snprintf(exact_other, sizeof exact_other, "%s", client_of("lane_exact", "x", "y"));
  const char *const clients[] = {
      fast_acme, fast_acme, fast_beta, fast_beta, fast_gamma, exact_acme, exact_other,
      "fast/nobody/k", "fast/acme", "", "fast/acme/k1/x", "fast//k", "abc", "fast/acme/",
      "exact/acme/"};
  const char *const priorities[] = {"interactive", "standard", "batch", " Batch\t", "BATCH",
                                    "bogus", "", ",", "batch,", "a,interactive", "\v"};
  const char *const scenarios[] = {"s1", "", "a,b", "x y"};
  bytes_t body = {0}, want = {0}, whole = {0}, sliced = {0};
  /* What the requests came to (stderr): that the fuzz reaches every outcome. */
  long read = 0, refused = 0, injected = 0, held = 0, exact_lane = 0, untouched = 0;
  for (long it = 0; it < iterations; it++) {
    make_body(&body);
    request_t rq = {0};
    if (rnd() % 8) rq_header(&rq, ":path", pick(paths, sizeof paths / sizeof *paths));
    /* A tenant's client half the time (the first five), else any; a class asked less. */
    if (rnd() & 1) rq_header(&rq, setting("client_header"), clients[rnd() % 5]);
    else random_header(&rq, setting("client_header"), clients, sizeof clients / sizeof *clients, 0);
    if (rnd() & 1)
      random_header(&rq, setting("priority_header"), priorities,
                    sizeof priorities / sizeof *priorities, 1);
    random_header(&rq, setting("scenario_header"), scenarios,
                  sizeof scenarios / sizeof *scenarios, 2);
    if (rnd() % 8 == 0) rq_header(&rq, setting("usage_header"), "observer");
    if (rnd() % 16) { /* a request with a body, most often */
      rq.body = body.p;
      rq.length = body.n;
      rq.content_length = rnd() % 8 != 0;
    }
    if (rq.body != NULL && memchr(body.p, '{', body.n) != NULL) spliced(body.p, body.n, &want);

    /* Sent whole first, then in random frames and slices: the same done. */
    bool exact = exact_client(&rq);
    run(config, &rq, &WHOLE);
    check_invariants(&rq, exact, &want);
    describe(&whole);
    read += meta_find("meta_model") != NULL;
    refused += meta_find("meta_problem") != NULL;
    injected += meta_find("meta_usage_injected") != NULL;
    held += sets_client;
    exact_lane += exact;
    untouched += nmeta == 0;
    if (rq.body == NULL) continue;
    plan_t plan = {0, 0, true, (int)(rnd() % 3), rnd() % 4 != 0};
    if (body.n > 4096) {
      plan.frame = 1 + rnd() % 65536;
      plan.slice = 1 + rnd() % 8192;
    } else {
      plan.frame = 1 + rnd() % (rnd() & 1 ? 8 : 256);
      plan.slice = 1 + rnd() % (rnd() & 1 ? 3 : 64);
    }
    run(config, &rq, &plan);
    check_invariants(&rq, exact, &want);
    describe(&sliced);
    if (!same(whole.p, whole.n, sliced.p, sliced.n)) {
      fprintf(stderr, "request %ld: sliced (frame %zu, slice %zu, ending %d, moves %d) differs\n"
                      "whole:\n%.*s\nsliced:\n%.*s\n",
              it, plan.frame, plan.slice, plan.ending, plan.moves_last,
              (int)(whole.n > 4000 ? 4000 : whole.n), whole.p,
              (int)(sliced.n > 4000 ? 4000 : sliced.n), sliced.p);
      return 1;
    }
  }
  KIND.config_destroy(config);
  free(body.p), free(want.p), free(whole.p), free(sliced.p);
  free(config_text.p);
  free(setting_text);
  reset_stream();
  free(out.p);
  fprintf(stderr, "read %ld, refused %ld, usage asked %ld, held %ld, exact lane %ld, "
          "nothing written %ld\n", read, refused, injected, held, exact_lane, untouched);
  printf("ok %ld\n", iterations);
  return 0;
}

/* ---- replay ----------------------------------------------------------------------------- */

/* A hex digit's value, or -1. */
static int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* The bytes of the hex text p[0, n) into `into` (NUL-terminated); false when it is none. */
static bool unhex_field(const char *p, size_t n, bytes_t *into) {
  into->n = 0;
  bytes_addz(into, "");
  if (n % 2 != 0) return false;
  for (size_t i = 0; i < n; i += 2) {
    int hi = hex_digit(p[i]), lo = hex_digit(p[i + 1]);
    if (hi < 0 || lo < 0) return false;
    char c = (char)(hi * 16 + lo);
    bytes_add(into, &c, 1);
  }
  return true;
}

/* p[0, n) in hex, `.` for none (so no field is empty). */
static void put_hex(const char *p, size_t n) {
  if (n == 0) fputs(".", stdout);
  for (size_t i = 0; i < n; i++) printf("%02x", (unsigned char)p[i]);
}

/* What the filter set of header `key` (`sets` calls): the calls and its value now. */
static void print_set_header(const char *key, int sets) {
  if (sets == 0) return;
  const header_t *h;
  header_values(key, &h);
  printf(" H ");
  put_hex(key, strlen(key));
  printf(" %d ", sets);
  if (h == NULL) fputs("-", stdout); /* removed (an empty value): never, for these */
  else put_hex(h->value, h->length);
}

/* Requests, one a line of fields separated by a space: the body (hex; `-` for none, the
 * request ending with its headers; `.` for an empty one), then the headers in order, each
 * `name:value` in hex (an empty value `name:`). A content-length goes with a body.
 * Out, a line each: `C clears`, then each metadata key written (in the order first
 * written) `M key writes s value` (a string) or `M key writes b 0|1` (a boolean), each
 * header the filter set `H name sets value` (the value it has now; client, usage,
 * content-length and :path headers only: the mock refuses any other), and `B body` when what went
 * on differs from the body sent (a splice); every name and value in hex, `.` when empty.
 * A line that is no request ends the run with a failure. */
static int mode_replay(void) {
  void *config = load_config();
  bytes_t body = {0}, names[24] = {{0}}, values[24] = {{0}};
  long requests = 0;
  char *line;
  while ((line = read_line()) != NULL) {
    request_t rq = {0};
    const char *at = line;
    size_t field = 0;
    for (;;) {
      const char *end = strchr(at, ' ');
      size_t n = end != NULL ? (size_t)(end - at) : strlen(at);
      if (field == 0) {
        CHECK(n > 0);
        if (n == 1 && at[0] == '-') {
          rq.body = NULL;
        } else {
          CHECK(unhex_field(at, n == 1 && at[0] == '.' ? 0 : n, &body));
          rq.body = body.p;
          rq.length = body.n;
          rq.content_length = true;
        }
      } else {
        size_t h = field - 1;
        CHECK(h < sizeof names / sizeof *names);
        const char *colon = memchr(at, ':', n);
        CHECK(colon != NULL && colon > at);
        CHECK(unhex_field(at, (size_t)(colon - at), &names[h]));
        CHECK(unhex_field(colon + 1, n - (size_t)(colon + 1 - at), &values[h]));
        CHECK(strlen(names[h].p) == names[h].n); /* a name holds no NUL */
        rq_header_n(&rq, names[h].p, values[h].p, values[h].n);
      }
      field++;
      if (end == NULL) break;
      at = end + 1;
    }
    run(config, &rq, &WHOLE);
    printf("C %d", clears);
    for (size_t m = 0; m < nmeta; m++) {
      printf(" M ");
      put_hex(metas[m].key, metas[m].key_length);
      printf(" %d ", metas[m].writes);
      if (metas[m].is_bool) {
        printf("b %d", metas[m].flag ? 1 : 0);
      } else {
        printf("s ");
        put_hex(metas[m].value, metas[m].length);
      }
    }
    print_set_header(setting("client_header"), sets_client);
    print_set_header(setting("usage_header"), sets_usage);
    print_set_header("content-length", sets_length);
    print_set_header(":path", sets_path);
    if (rq.body != NULL && !same(out.p, out.n, rq.body, rq.length)) {
      printf(" B ");
      put_hex(out.p, out.n);
    }
    printf("\n");
    requests++;
    free(line);
  }
  KIND.config_destroy(config);
  free(body.p);
  for (size_t h = 0; h < sizeof names / sizeof *names; h++) free(names[h].p), free(values[h].p);
  free(config_text.p);
  free(setting_text);
  reset_stream();
  free(out.p);
  fprintf(stderr, "replayed %ld\n", requests);
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "config") == 0) return mode_config();
  if (argc >= 2 && strcmp(argv[1], "cases") == 0) return mode_cases();
  if (argc >= 4 && strcmp(argv[1], "fuzz") == 0)
    return mode_fuzz(atol(argv[2]), (uint64_t)atoll(argv[3]));
  if (argc >= 2 && strcmp(argv[1], "replay") == 0) return mode_replay();
  fprintf(stderr, "usage: %s config|cases|fuzz N SEED|replay (a configuration on stdin)\n",
          argv[0]);
  return 2;
}
