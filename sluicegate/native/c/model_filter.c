/* The model reader: an Envoy HTTP filter (dynamic module, filter name "model_reader") in
 * place of the Lua model reader, which is its specification
 * (sluicegate/xds/translate/model_reader.py: every rule here is one of its rules, in its
 * order; model_walk.c reads the body, this file talks to Envoy).
 *
 * For the fast lane and routing without Python (docs/fast-lane.md): it reads the client
 * Envoy's key check named (`client_header`: "<lane>/<tenant>/<key name>"), waits for the
 * request's whole body, reads its top-level `model`, `stream`, output caps, `n` and
 * prompt members, and writes into the `namespace` metadata what the routes match on and
 * the limits charge (the model, stream, priority class, tenant, token estimate), or the
 * `meta_problem` of a body or client it refuses; it names the usage reader in
 * `usage_header`, asks a stream's usage for its client where the routes need it (the
 * body spliced), and clears the route cache so the request matches again. First it
 * removes the `query_credentials` from the path, as the routing stage does.
 *
 * Its configuration is `key=value` lines (xds/translate/native.py writes them from wire's
 * names); `class`, `asks_usage`, `held` and `tenant` may repeat.
 *
 * Never fatal: a body it has no memory to copy is left unread (no route serves it). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envoy_abi.h"
#include "filter_kind.h"
#include "model_walk.h"

/* ---- configuration --------------------------------------------------------------- */

enum {
  S_NAMESPACE, S_CLIENT_HEADER, S_PRIORITY_HEADER, S_SCENARIO_HEADER, S_USAGE_HEADER,
  S_MEMBERS, S_CAPS, S_LOGPROBS, S_PROMPT, S_ENDPOINTS, S_USAGE_ENDPOINTS, S_INCLUDE_USAGE,
  S_DEFAULT_MAX_TOKENS, S_MAX_OUTPUT_TOKENS, S_MAX_N, S_LOG_MAX_OUTPUT_TOKENS,
  S_MAX_SCENARIO_ASKED, S_ESTIMATES, S_SCENARIOS, S_LANE_EXACT, S_LANE_FAST, S_NO_CLASS,
  S_UNKNOWN_CLIENT, S_MODEL_NOT_ALLOWED, S_INVALID_PRIORITY, S_DUPLICATE_PREFIX,
  S_MAX_TOKENS_PREFIX, S_BY_STREAM, S_BY_LOG, S_BY_UNREAD, S_BY_CHUNKS, S_META_MODEL,
  S_META_STREAM, S_META_PROBLEM, S_META_PRIORITY, S_META_TENANT, S_META_KEY_NAME,
  S_META_SCENARIO_ASKED, S_META_ESTIMATE_INPUT, S_META_ESTIMATE_OUTPUT,
  S_META_ESTIMATE_TOKENS, S_META_AUTO_LANE, S_META_CHARGED_TENANT, S_META_USAGE_INJECTED,
  S_INJECTED_VALUE, S_QUERY_CREDENTIALS, S_COUNT
};
static const char *const SETTINGS[S_COUNT] = {
    "namespace", "client_header", "priority_header", "scenario_header", "usage_header",
    "members", "caps", "logprobs", "prompt", "endpoints", "usage_endpoints", "include_usage",
    "default_max_tokens", "max_output_tokens", "max_n", "log_max_output_tokens",
    "max_scenario_asked", "estimates", "scenarios", "lane_exact", "lane_fast", "no_class",
    "unknown_client", "model_not_allowed", "invalid_priority", "duplicate_prefix",
    "max_tokens_prefix", "by_stream", "by_log", "by_unread", "by_chunks", "meta_model",
    "meta_stream", "meta_problem", "meta_priority", "meta_tenant", "meta_key_name",
    "meta_scenario_asked", "meta_estimate_input", "meta_estimate_output",
    "meta_estimate_tokens", "meta_auto_lane", "meta_charged_tenant", "meta_usage_injected",
    "injected_value", "query_credentials",
};
/* The settings that are numbers (at least 0; `estimates` and `scenarios` 0 or 1). */
static const int NUMBERS[] = {S_DEFAULT_MAX_TOKENS, S_MAX_OUTPUT_TOKENS, S_MAX_N,
                              S_LOG_MAX_OUTPUT_TOKENS, S_MAX_SCENARIO_ASKED, S_ESTIMATES,
                              S_SCENARIOS};

/* The longest problem setting; with a member's name (shorter than SG_MAX_MEMBER_NAME) it
 * fits refuse()'s buffer. */
#define MAX_PROBLEM_PREFIX 64
/* The largest output allowance and n it takes (wire's are far smaller). */
#define MAX_CONFIGURED_NUMBER 1000000000LL

/* The longest query credential name it takes (wire's are far shorter). */
#define MAX_CREDENTIAL 64

/* A list of names, kept sorted (or in their order, for the classes). */
typedef struct {
  sg_module_buffer *items;
  size_t count;
} names_t;

typedef struct {
  sg_module_buffer name;
  sg_module_buffer priority;
  size_t rank; /* of its priority among the classes */
  bool automatic;
  bool every_model;
  names_t models;
} tenant_t;

typedef struct {
  const sg_filter_kind *kind; /* first: filter_kind.h */
  char *values[S_COUNT];      /* each NUL-terminated, all required */
  size_t lengths[S_COUNT];
  long long numbers[S_COUNT];
  sg_members *members;
  int model, stream, stream_options, n; /* indices among the members */
  int caps[SG_MAX_MEMBERS], logprobs[SG_MAX_MEMBERS], prompt[SG_MAX_MEMBERS];
  size_t cap_count, logprob_count, prompt_count;
  names_t classes; /* highest first */
  names_t asks_usage, held;
  names_t query_credentials; /* sorted; none longer than longest_credential bytes */
  size_t longest_credential;
  tenant_t *tenants; /* sorted by name */
  size_t tenant_count;
  char *text; /* the configuration, which the lists point into */
} config_t;

static sg_module_buffer setting(const config_t *config, int key) {
  return (sg_module_buffer){config->values[key], config->lengths[key]};
}

static sg_module_buffer text_of(const char *s) { return (sg_module_buffer){s, strlen(s)}; }

static bool same_bytes(sg_module_buffer a, const char *b, size_t b_length) {
  return a.length == b_length && memcmp(a.ptr, b, b_length) == 0;
}

static int compare_names(const void *a, const void *b) {
  const sg_module_buffer *x = a, *y = b;
  size_t n = x->length < y->length ? x->length : y->length;
  int c = memcmp(x->ptr, y->ptr, n);
  if (c != 0) return c;
  return x->length < y->length ? -1 : x->length > y->length;
}

static bool names_add(names_t *names, const char *ptr, size_t length) {
  sg_module_buffer *grown = realloc(names->items, (names->count + 1) * sizeof *grown);
  if (grown == NULL) return false;
  names->items = grown;
  names->items[names->count++] = (sg_module_buffer){ptr, length};
  return true;
}

static void names_sort(names_t *names) {
  if (names->count > 1) qsort(names->items, names->count, sizeof *names->items, compare_names);
}

static bool names_has(const names_t *names, const char *ptr, size_t length) {
  sg_module_buffer key = {ptr, length};
  return names->count > 0 &&
         bsearch(&key, names->items, names->count, sizeof *names->items, compare_names) != NULL;
}

/* The rank of a class among the classes (0 is the highest), or SIZE_MAX. */
static size_t class_rank(const config_t *config, const char *ptr, size_t length) {
  for (size_t c = 0; c < config->classes.count; c++)
    if (same_bytes(config->classes.items[c], ptr, length)) return c;
  return SIZE_MAX;
}

static void config_free(config_t *config) {
  if (config == NULL) return;
  for (int k = 0; k < S_COUNT; k++) free(config->values[k]);
  sg_members_free(config->members);
  free(config->classes.items);
  free(config->asks_usage.items);
  free(config->held.items);
  free(config->query_credentials.items);
  for (size_t t = 0; t < config->tenant_count; t++) free(config->tenants[t].models.items);
  free(config->tenants);
  free(config->text);
  free(config);
}

/* The tab-separated fields of a `tenant` line: its name, priority class, 1 if auto,
 * then `all` (every model) or `only` and the models it may use (none, or some: any name,
 * `all` and `*` among them, is a model's). */
static bool tenant_line(config_t *config, char *line, size_t length) {
  tenant_t tenant = {0};
  size_t field = 0, start = 0;
  for (size_t i = 0; i <= length; i++) {
    if (i < length && line[i] != '\t') continue;
    const char *value = line + start;
    size_t size = i - start;
    start = i + 1;
    if (size == 0) goto wrong;
    if (field == 0) {
      tenant.name = (sg_module_buffer){value, size};
    } else if (field == 1) {
      tenant.priority = (sg_module_buffer){value, size};
    } else if (field == 2) {
      if (size != 1 || (value[0] != '0' && value[0] != '1')) goto wrong;
      tenant.automatic = value[0] == '1';
    } else if (field == 3) {
      if (size == 3 && memcmp(value, "all", 3) == 0) tenant.every_model = true;
      else if (!(size == 4 && memcmp(value, "only", 4) == 0)) goto wrong;
    } else {
      if (tenant.every_model || !names_add(&tenant.models, value, size)) goto wrong;
    }
    field++;
  }
  if (field < 4) goto wrong;
  names_sort(&tenant.models);
  tenant_t *grown = realloc(config->tenants, (config->tenant_count + 1) * sizeof *grown);
  if (grown == NULL) goto wrong;
  config->tenants = grown;
  config->tenants[config->tenant_count++] = tenant;
  return true;
wrong:
  free(tenant.models.items);
  return false;
}

/* One `key=value` line; false for an unknown or repeated key, or no memory. */
static bool config_line(config_t *config, char *line, size_t length) {
  char *eq = memchr(line, '=', length);
  if (eq == NULL) return false;
  size_t key_length = (size_t)(eq - line), value_length = length - key_length - 1;
  const char *value = eq + 1;
  sg_module_buffer key = {line, key_length};
  if (same_bytes(key, "tenant", 6)) return tenant_line(config, eq + 1, value_length);
  if (value_length == 0) return false;
  if (same_bytes(key, "class", 5)) return names_add(&config->classes, value, value_length);
  if (same_bytes(key, "asks_usage", 10))
    return names_add(&config->asks_usage, value, value_length);
  if (same_bytes(key, "held", 4)) return names_add(&config->held, value, value_length);
  for (int k = 0; k < S_COUNT; k++) {
    if (!same_bytes(key, SETTINGS[k], strlen(SETTINGS[k]))) continue;
    if (config->values[k] != NULL) return false;
    config->values[k] = malloc(value_length + 1);
    if (config->values[k] == NULL) return false;
    memcpy(config->values[k], value, value_length);
    config->values[k][value_length] = 0;
    config->lengths[k] = value_length;
    return true;
  }
  return false;
}

/* Each comma-separated name of setting `key` as its index among the members, into
 * `into`; false when one is not a member. */
static bool member_list(config_t *config, int key, int *into, size_t *count) {
  const char *names = config->values[key];
  size_t length = config->lengths[key], start = 0;
  *count = 0;
  for (size_t i = 0; i <= length; i++) {
    if (i < length && names[i] != ',') continue;
    int m = sg_member_index(config->members, names + start, i - start);
    if (m < 0 || *count == SG_MAX_MEMBERS) return false;
    into[(*count)++] = m;
    start = i + 1;
  }
  return true;
}

/* The comma-separated names of `query_credentials`, sorted; false when one is empty or
 * longer than MAX_CREDENTIAL, or there is no memory. */
static bool credential_list(config_t *config) {
  const char *names = config->values[S_QUERY_CREDENTIALS];
  size_t length = config->lengths[S_QUERY_CREDENTIALS], start = 0;
  for (size_t i = 0; i <= length; i++) {
    if (i < length && names[i] != ',') continue;
    if (i == start || i - start > MAX_CREDENTIAL ||
        !names_add(&config->query_credentials, names + start, i - start))
      return false;
    if (i - start > config->longest_credential) config->longest_credential = i - start;
    start = i + 1;
  }
  names_sort(&config->query_credentials);
  return true;
}

static bool config_check(config_t *config) {
  for (int k = 0; k < S_COUNT; k++)
    if (config->values[k] == NULL) return false;
  for (size_t i = 0; i < sizeof NUMBERS / sizeof *NUMBERS; i++) {
    const char *value = config->values[NUMBERS[i]];
    char *end = NULL;
    long long number = strtoll(value, &end, 10);
    if (*end != 0 || number < 0 || config->lengths[NUMBERS[i]] > 15) return false;
    config->numbers[NUMBERS[i]] = number;
  }
  if (config->numbers[S_ESTIMATES] > 1 || config->numbers[S_SCENARIOS] > 1) return false;
  /* An allowance (a cap times n) and an estimate stay far inside a long long. */
  const int bounded[] = {S_DEFAULT_MAX_TOKENS, S_MAX_OUTPUT_TOKENS, S_MAX_N};
  for (size_t i = 0; i < sizeof bounded / sizeof *bounded; i++)
    if (config->numbers[bounded[i]] > MAX_CONFIGURED_NUMBER) return false;
  /* A refusal's problem is written from a buffer of its own (refuse()). */
  const int problems[] = {S_UNKNOWN_CLIENT, S_MODEL_NOT_ALLOWED, S_INVALID_PRIORITY,
                          S_DUPLICATE_PREFIX, S_MAX_TOKENS_PREFIX};
  for (size_t i = 0; i < sizeof problems / sizeof *problems; i++)
    if (config->lengths[problems[i]] > MAX_PROBLEM_PREFIX) return false;
  config->members = sg_members_new(config->values[S_MEMBERS], config->lengths[S_MEMBERS]);
  if (config->members == NULL) return false;
  const sg_members *members = config->members;
  config->model = sg_member_index(members, "model", 5);
  config->stream = sg_member_index(members, "stream", 6);
  config->stream_options = sg_member_index(members, "stream_options", 14);
  config->n = sg_member_index(members, "n", 1);
  if (config->model < 0 || config->stream < 0 || config->stream_options < 0 || config->n < 0)
    return false;
  if (!member_list(config, S_CAPS, config->caps, &config->cap_count) ||
      !member_list(config, S_LOGPROBS, config->logprobs, &config->logprob_count) ||
      !member_list(config, S_PROMPT, config->prompt, &config->prompt_count))
    return false;
  names_sort(&config->asks_usage);
  names_sort(&config->held);
  if (!credential_list(config)) return false;
  if (config->tenant_count > 0 && config->classes.count == 0) return false;
  for (size_t t = 0; t < config->tenant_count; t++) {
    tenant_t *tenant = &config->tenants[t];
    tenant->rank = class_rank(config, tenant->priority.ptr, tenant->priority.length);
    if (tenant->rank == SIZE_MAX) return false;
  }
  if (config->tenant_count > 1)
    qsort(config->tenants, config->tenant_count, sizeof *config->tenants, compare_names);
  for (size_t t = 1; t < config->tenant_count; t++)
    if (compare_names(&config->tenants[t - 1], &config->tenants[t]) == 0) return false;
  return true;
}

/* The lines of `text` (empty lines skipped); NULL when one is wrong or one is missing. */
static config_t *config_parse(const char *text, size_t length) {
  config_t *config = calloc(1, sizeof *config);
  if (config == NULL) return NULL;
  config->kind = &sg_model_reader;
  /* The lists point into this copy. */
  config->text = malloc(length + 1);
  if (config->text == NULL) goto wrong;
  memcpy(config->text, text, length);
  config->text[length] = 0;
  size_t start = 0;
  for (size_t i = 0; i <= length; i++) {
    if (i < length && config->text[i] != '\n') continue;
    size_t end = i;
    if (end > start && config->text[end - 1] == '\r') end--;
    if (end > start && !config_line(config, config->text + start, end - start)) goto wrong;
    start = i + 1;
  }
  if (!config_check(config)) goto wrong;
  return config;
wrong:
  config_free(config);
  return NULL;
}

/* ---- headers and metadata ------------------------------------------------------------ */

/* A request header as the Lua reader gets it, into *value: its values joined by commas
 * (`joined` holds an allocation to free when it has several); false when absent. An
 * empty value is present (Envoy may give it no pointer). */
static bool header(sg_filter_envoy envoy, sg_module_buffer name, sg_envoy_buffer *value,
                   char **joined) {
  size_t count = 0;
  *joined = NULL;
  *value = (sg_envoy_buffer){NULL, 0};
  if (!envoy_dynamic_module_callback_http_get_header(envoy, SG_REQUEST_HEADERS, name, value, 0,
                                                     &count))
    return false;
  if (count <= 1) return true;
  size_t total = 0;
  for (size_t v = 0; v < count; v++) {
    sg_envoy_buffer each = {NULL, 0};
    envoy_dynamic_module_callback_http_get_header(envoy, SG_REQUEST_HEADERS, name, &each, v,
                                                  NULL);
    total += each.length + 1;
  }
  char *all = malloc(total);
  if (all == NULL) return true; /* the first value alone */
  size_t at = 0;
  for (size_t v = 0; v < count; v++) {
    sg_envoy_buffer each = {NULL, 0};
    envoy_dynamic_module_callback_http_get_header(envoy, SG_REQUEST_HEADERS, name, &each, v,
                                                  NULL);
    if (v > 0) all[at++] = ',';
    if (each.length > 0) memcpy(all + at, each.ptr, each.length);
    at += each.length;
  }
  *joined = all;
  *value = (sg_envoy_buffer){all, at};
  return true;
}

static void put_string(const config_t *config, sg_filter_envoy envoy, int key,
                       sg_module_buffer value) {
  envoy_dynamic_module_callback_http_set_dynamic_metadata_string(
      envoy, setting(config, S_NAMESPACE), setting(config, key), value);
}

static void put_bool(const config_t *config, sg_filter_envoy envoy, int key, bool value) {
  envoy_dynamic_module_callback_http_set_dynamic_metadata_bool(
      envoy, setting(config, S_NAMESPACE), setting(config, key), value);
}

static void put_count(const config_t *config, sg_filter_envoy envoy, int key, long long n) {
  char digits[32];
  int written = snprintf(digits, sizeof digits, "%lld", n);
  put_string(config, envoy, key, (sg_module_buffer){digits, (size_t)written});
}

/* A refusal: the problem (`problem`, then the member named `member`, if any) the route
 * answering it is named after, and the class the record gets (NULL: none). */
static void refuse_member(const config_t *config, sg_filter_envoy envoy,
                          sg_module_buffer problem, int member, const sg_module_buffer *class) {
  char value[128];
  size_t b = 0;
  const char *name = member < 0 ? NULL : sg_member_name(config->members, member, &b);
  if (problem.length + b > sizeof value) return; /* none is this long (config_check) */
  memcpy(value, problem.ptr, problem.length);
  if (b > 0) memcpy(value + problem.length, name, b);
  put_string(config, envoy, S_META_PROBLEM, (sg_module_buffer){value, problem.length + b});
  if (class != NULL) put_string(config, envoy, S_META_PRIORITY, *class);
  envoy_dynamic_module_callback_http_clear_route_cache(envoy);
}

static void refuse(const config_t *config, sg_filter_envoy envoy, sg_module_buffer problem,
                   const sg_module_buffer *class) {
  refuse_member(config, envoy, problem, -1, class);
}

/* ---- the query string ---------------------------------------------------------------- */

static int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Whether the query parameter s[0..n) is a credential: its name (to its first `=`) read
 * by the routing stage's rule (filters/request_limits.py's credential_name: `+` a space,
 * each `%XX` its byte, ASCII whitespace trimmed, ASCII letters in lower case, `-` as `_`)
 * is one of `query_credentials`. No credential holds whitespace, so a name with some
 * inside it is none. */
static bool is_credential(const config_t *config, const char *s, size_t n) {
  char name[MAX_CREDENTIAL];
  size_t length = 0;
  bool spaced = false; /* whitespace after the name's first other byte */
  for (size_t i = 0; i < n && s[i] != '='; i++) {
    char c = s[i];
    if (c == '+') {
      c = ' ';
    } else if (c == '%' && i + 2 < n && hex_digit(s[i + 1]) >= 0 && hex_digit(s[i + 2]) >= 0) {
      c = (char)(hex_digit(s[i + 1]) * 16 + hex_digit(s[i + 2]));
      i += 2;
    }
    if (sg_is_lua_space(c)) { /* ASCII whitespace, as Python's bytes.strip() */
      spaced = length > 0;
      continue;
    }
    if (spaced || length == config->longest_credential) return false;
    name[length++] = c >= 'A' && c <= 'Z' ? (char)(c + 32) : c == '-' ? '_' : c;
  }
  return names_has(&config->query_credentials, name, length);
}

/* The request's path without its credential parameters (filters/request_limits.py's
 * without_query_credentials: the rest kept byte for byte), set in place of `:path` when
 * it had any. */
static void remove_query_credentials(const config_t *config, sg_filter_envoy envoy) {
  sg_envoy_buffer path = {NULL, 0};
  if (!envoy_dynamic_module_callback_http_get_header(envoy, SG_REQUEST_HEADERS,
                                                     text_of(":path"), &path, 0, NULL) ||
      path.length == 0)
    return;
  const char *mark = memchr(path.ptr, '?', path.length);
  if (mark == NULL || mark == path.ptr) return; /* every path Envoy passes starts with / */
  size_t target = (size_t)(mark - path.ptr), at = target + 1, kept = 0;
  char *sent = malloc(path.length);
  if (sent == NULL) return; /* the routing stage's rule cannot be kept: as sent */
  memcpy(sent, path.ptr, target);
  size_t length = target;
  bool removed = false;
  while (at <= path.length) {
    const char *amp = memchr(path.ptr + at, '&', path.length - at);
    size_t end = amp != NULL ? (size_t)(amp - path.ptr) : path.length;
    if (is_credential(config, path.ptr + at, end - at)) {
      removed = true;
    } else {
      sent[length++] = kept++ == 0 ? '?' : '&';
      memcpy(sent + length, path.ptr + at, end - at);
      length += end - at;
    }
    at = end + 1;
  }
  if (removed)
    envoy_dynamic_module_callback_http_set_header(envoy, SG_REQUEST_HEADERS, text_of(":path"),
                                                  (sg_module_buffer){sent, length});
  free(sent);
}

/* ---- the client ---------------------------------------------------------------------- */

enum { CLIENT_NONE, CLIENT_EXACT, CLIENT_UNKNOWN, CLIENT_FAST };

typedef struct {
  int lane;
  const tenant_t *tenant; /* CLIENT_FAST: its tenant */
} client_t;

static const tenant_t *find_tenant(const config_t *config, const char *name, size_t length) {
  sg_module_buffer key = {name, length};
  if (config->tenant_count == 0) return NULL;
  /* A tenant_t starts with its name, which compare_names reads. */
  return bsearch(&key, config->tenants, config->tenant_count, sizeof *config->tenants,
                 compare_names);
}

/* The client the key check named ("<lane>/<tenant>/<key name>"), its tenant's and key's
 * metadata written in the fast lane. */
static client_t client(const config_t *config, sg_filter_envoy envoy) {
  client_t found = {CLIENT_NONE, NULL};
  char *joined = NULL;
  sg_envoy_buffer named;
  if (!header(envoy, setting(config, S_CLIENT_HEADER), &named, &joined)) return found;
  found.lane = CLIENT_UNKNOWN;
  const char *first = named.length > 0 ? memchr(named.ptr, '/', named.length) : NULL;
  const char *second = first ? memchr(first + 1, '/', named.length - (size_t)(first + 1 - named.ptr)) : NULL;
  if (second != NULL && memchr(second + 1, '/', named.length - (size_t)(second + 1 - named.ptr)) == NULL) {
    sg_module_buffer lane = {named.ptr, (size_t)(first - named.ptr)};
    sg_module_buffer tenant = {first + 1, (size_t)(second - first - 1)};
    sg_module_buffer key = {second + 1, named.length - (size_t)(second + 1 - named.ptr)};
    if (lane.length > 0 && tenant.length > 0 && key.length > 0) {
      if (same_bytes(lane, config->values[S_LANE_EXACT], config->lengths[S_LANE_EXACT])) {
        found.lane = CLIENT_EXACT;
      } else if (same_bytes(lane, config->values[S_LANE_FAST], config->lengths[S_LANE_FAST])) {
        found.tenant = find_tenant(config, tenant.ptr, tenant.length);
        if (found.tenant != NULL) {
          found.lane = CLIENT_FAST;
          put_string(config, envoy, S_META_TENANT, found.tenant->name);
          put_string(config, envoy, S_META_KEY_NAME, key);
        }
      }
    }
  }
  free(joined);
  return found;
}


/* The class a client asked for in `priority_header` if it is its tenant's or below it,
 * the tenant's when it asked none; false for any other (the routing stage's
 * requested_class: the last comma-separated value, trimmed, in lower case). */
static bool priority(const config_t *config, sg_filter_envoy envoy, const tenant_t *tenant,
                     sg_module_buffer *class) {
  *class = tenant->priority;
  char *joined = NULL;
  sg_envoy_buffer asked;
  if (!header(envoy, setting(config, S_PRIORITY_HEADER), &asked, &joined)) return true;
  size_t start = asked.length;
  while (start > 0 && asked.ptr[start - 1] != ',') start--;
  size_t end = asked.length;
  while (start < end && sg_is_lua_space(asked.ptr[start])) start++;
  while (end > start && sg_is_lua_space(asked.ptr[end - 1])) end--;
  bool fits = true;
  if (end > start) {
    char lower[64];
    size_t length = end - start, rank = SIZE_MAX;
    if (length <= sizeof lower) {
      for (size_t k = 0; k < length; k++) {
        char c = asked.ptr[start + k];
        lower[k] = c >= 'A' && c <= 'Z' ? (char)(c + 32) : c;
      }
      rank = class_rank(config, lower, length);
    }
    fits = rank != SIZE_MAX && rank >= tenant->rank;
    if (fits) *class = config->classes.items[rank];
  }
  free(joined);
  return fits;
}

/* ---- the body ------------------------------------------------------------------------ */


/* The body with `include_usage` after its first `{`, in place of the body (and its
 * content-length); false when there was no memory (the body is as it was). */
static bool splice_include_usage(const config_t *config, sg_filter_envoy envoy, const char *s,
                                 size_t n) {
  const char *brace = memchr(s, '{', n);
  sg_module_buffer member = setting(config, S_INCLUDE_USAGE);
  size_t at = (size_t)(brace - s) + 1, total = n + member.length;
  char *spliced = malloc(total);
  if (spliced == NULL) return false;
  memcpy(spliced, s, at);
  memcpy(spliced + at, member.ptr, member.length);
  memcpy(spliced + at + member.length, s + at, n - at);
  /* s may point into Envoy's buffers: copied before they are drained. */
  int types[2] = {SG_BUFFERED_REQUEST_BODY, SG_RECEIVED_REQUEST_BODY};
  for (int t = 0; t < 2; t++) {
    size_t size = envoy_dynamic_module_callback_http_get_body_size(envoy, types[t]);
    if (size > 0) envoy_dynamic_module_callback_http_drain_body(envoy, types[t], size);
  }
  sg_module_buffer whole = {spliced, total};
  /* Into this hook's data; in the trailers hook, which has none, into the buffered body. */
  if (!envoy_dynamic_module_callback_http_append_body(envoy, SG_RECEIVED_REQUEST_BODY, whole))
    envoy_dynamic_module_callback_http_append_body(envoy, SG_BUFFERED_REQUEST_BODY, whole);
  free(spliced);
  char length[32];
  int written = snprintf(length, sizeof length, "%zu", total);
  envoy_dynamic_module_callback_http_set_header(envoy, SG_REQUEST_HEADERS,
                                                text_of("content-length"),
                                                (sg_module_buffer){length, (size_t)written});
  return true;
}

/* Who reads the answer's usage (filters/usage_reader.py, without reservations). */
static int reader(const config_t *config, sg_envoy_buffer path, const sg_walk *got, bool stream,
                  long long allowed) {
  if (stream) return S_BY_STREAM;
  if (!sg_endpoint_in(path.ptr, path.length, config->values[S_ENDPOINTS],
                      config->lengths[S_ENDPOINTS]))
    return S_BY_UNREAD;
  for (size_t l = 0; l < config->logprob_count; l++)
    if (sg_asks_logprobs(got->found[config->logprobs[l]])) return S_BY_UNREAD;
  if (allowed > config->numbers[S_LOG_MAX_OUTPUT_TOKENS]) return S_BY_UNREAD;
  return S_BY_LOG;
}

/* What follows the body's checks, once its model's name is known. */
static void handle_model(const config_t *config, sg_filter_envoy envoy, const char *s, size_t n,
                         const sg_walk *got, const tenant_t *tenant, sg_module_buffer model,
                         bool stream, long long allowed) {
  sg_module_buffer none = setting(config, S_NO_CLASS);
  if (tenant != NULL && !tenant->every_model &&
      !names_has(&tenant->models, model.ptr, model.length))
    return refuse(config, envoy, setting(config, S_MODEL_NOT_ALLOWED), &tenant->priority);
  if (tenant != NULL && tenant->automatic && names_has(&config->held, model.ptr, model.length)) {
    /* What only the routing stage enforces applies (a gate, a provider's limits): it
     * decides this request, as any exact-lane client's (it overwrites the metadata). The
     * client is renamed into the exact lane: "<exact>/<tenant>/<key name>", the rest of
     * the name as the key check wrote it. */
    char *joined = NULL;
    sg_envoy_buffer named;
    if (!header(envoy, setting(config, S_CLIENT_HEADER), &named, &joined)) return;
    const char *rest = memchr(named.ptr, '/', named.length); /* one: client() read it */
    size_t rest_length = named.length - (size_t)(rest - named.ptr);
    sg_module_buffer lane = setting(config, S_LANE_EXACT);
    char *renamed = malloc(lane.length + rest_length);
    if (renamed != NULL) {
      memcpy(renamed, lane.ptr, lane.length);
      memcpy(renamed + lane.length, rest, rest_length);
      envoy_dynamic_module_callback_http_set_header(
          envoy, SG_REQUEST_HEADERS, setting(config, S_CLIENT_HEADER),
          (sg_module_buffer){renamed, lane.length + rest_length});
    }
    free(renamed);
    free(joined);
    return;
  }
  if (tenant != NULL) {
    sg_module_buffer class;
    if (!priority(config, envoy, tenant, &class))
      return refuse(config, envoy, setting(config, S_INVALID_PRIORITY), &none);
    put_string(config, envoy, S_META_PRIORITY, class);
  }
  put_string(config, envoy, S_META_MODEL, model);
  put_bool(config, envoy, S_META_STREAM, stream);
  if (config->numbers[S_SCENARIOS]) {
    char *joined = NULL;
    sg_envoy_buffer scenario;
    if (header(envoy, setting(config, S_SCENARIO_HEADER), &scenario, &joined)) {
      /* Cut: no declared name is longer (the record judges it). */
      size_t most = (size_t)config->numbers[S_MAX_SCENARIO_ASKED];
      size_t length = scenario.length < most ? scenario.length : most;
      put_string(config, envoy, S_META_SCENARIO_ASKED, (sg_module_buffer){scenario.ptr, length});
    }
    free(joined);
  }
  if (config->numbers[S_ESTIMATES]) {
    sg_span values[SG_MAX_MEMBERS];
    for (size_t p = 0; p < config->prompt_count; p++) values[p] = got->found[config->prompt[p]];
    long long input = sg_input_estimate(values, config->prompt_count);
    put_count(config, envoy, S_META_ESTIMATE_INPUT, input);
    put_count(config, envoy, S_META_ESTIMATE_OUTPUT, allowed);
    put_count(config, envoy, S_META_ESTIMATE_TOKENS, input + allowed);
  }
  /* Last: the buckets charge a request only once all it is charged by is written. */
  if (tenant != NULL) {
    /* An auto tenant's charged request: its records are charged into the exact lane's
     * windows and noted for the lane steering (sluicegate.lanes). */
    if (tenant->automatic) put_bool(config, envoy, S_META_AUTO_LANE, true);
    put_string(config, envoy, S_META_CHARGED_TENANT, tenant->name);
  }
  sg_envoy_buffer path = {NULL, 0};
  envoy_dynamic_module_callback_http_get_header(envoy, SG_REQUEST_HEADERS, text_of(":path"),
                                                &path, 0, NULL);
  /* A stream whose client did not ask for its usage (no `stream_options` at all): asked
   * for it, spliced after the opening brace, and the event cut from the client's stream
   * by the usage reader (filters/usage_reader.py's with_usage_asked). */
  int read_by;
  if (stream && got->found[config->stream_options].start == NULL &&
      names_has(&config->asks_usage, model.ptr, model.length) &&
      sg_endpoint_in(path.ptr, path.length, config->values[S_USAGE_ENDPOINTS],
                     config->lengths[S_USAGE_ENDPOINTS]) &&
      splice_include_usage(config, envoy, s, n)) {
    put_string(config, envoy, S_META_USAGE_INJECTED, setting(config, S_INJECTED_VALUE));
    read_by = S_BY_CHUNKS;
  } else {
    read_by = reader(config, path, got, stream, allowed);
  }
  envoy_dynamic_module_callback_http_set_header(envoy, SG_REQUEST_HEADERS,
                                                setting(config, S_USAGE_HEADER),
                                                setting(config, read_by));
  envoy_dynamic_module_callback_http_clear_route_cache(envoy);
}

/* The request's body s[0..n), read (the Lua reader's envoy_on_request after body()), for
 * `tenant`'s client (NULL: no tenant). */
static void read_body(const config_t *config, sg_filter_envoy envoy, const tenant_t *tenant,
                      const char *s, size_t n) {
  sg_module_buffer none = setting(config, S_NO_CLASS);
  /* A tenant's refusal before its class is known is recorded without one. */
  const sg_module_buffer *unclassed = tenant != NULL ? &none : NULL;
  sg_walk got;
  const char *problem = sg_walk_body(config->members, s, n, &got);
  if (problem != NULL) return refuse(config, envoy, text_of(problem), unclassed);
  if (got.repeated >= 0) {
    return refuse_member(config, envoy, setting(config, S_DUPLICATE_PREFIX), got.repeated,
                         unclassed);
  }
  sg_span model = got.found[config->model];
  if (model.start == NULL || sg_raw_is(model, "\"\""))
    return refuse(config, envoy, text_of("model"), unclassed);
  if (model.start[0] != '"') return refuse(config, envoy, text_of("model_type"), unclassed);
  sg_span stream_raw = got.found[config->stream];
  if (stream_raw.start != NULL && !sg_raw_is(stream_raw, "true") && !sg_raw_is(stream_raw, "false") &&
      !sg_raw_is(stream_raw, "null"))
    return refuse(config, envoy, text_of("stream"), unclassed);
  bool stream = sg_raw_is(stream_raw, "true");
  long long cap = 0;
  for (size_t c = 0; c < config->cap_count; c++) {
    long long value = sg_counted(got.found[config->caps[c]], config->numbers[S_MAX_OUTPUT_TOKENS]);
    if (value < 0)
      return refuse_member(config, envoy, setting(config, S_MAX_TOKENS_PREFIX), config->caps[c],
                           unclassed);
    if (cap == 0) cap = value;
  }
  long long choices = sg_counted(got.found[config->n], config->numbers[S_MAX_N]);
  if (choices < 0) return refuse(config, envoy, text_of("n"), unclassed);
  long long allowed =
      (cap ? cap : config->numbers[S_DEFAULT_MAX_TOKENS]) * (choices ? choices : 1);

  /* The name between the quotes, `\/` read as `/` (PHP writes it); any other escape
   * stays, and no model name holds one (validation), so no route serves it. */
  char stack_name[256];
  size_t raw_len = model.length - 2;
  char *name = raw_len < sizeof stack_name ? stack_name : malloc(raw_len + 1);
  if (name == NULL) return;
  size_t len = 0;
  for (size_t k = 1; k + 1 < model.length; k++) {
    if (model.start[k] == '\\' && k + 2 < model.length && model.start[k + 1] == '/') continue;
    name[len++] = model.start[k];
  }
  handle_model(config, envoy, s, n, &got, tenant, (sg_module_buffer){name, len}, stream,
               allowed);
  if (name != stack_name) free(name);
}

/* A request without a body (a listing, a GET): routed by its path, as the routing stage
 * leaves it; a tenant's class is written for its record. */
static void no_body(const config_t *config, sg_filter_envoy envoy, const tenant_t *tenant) {
  if (tenant != NULL) put_string(config, envoy, S_META_PRIORITY, tenant->priority);
}

/* The whole request body (what Envoy buffered, and the data of this hook), read. */
static void read_request(const config_t *config, sg_filter_envoy envoy, const tenant_t *tenant,
                         bool with_received) {
  enum { MAX_CHUNKS = 64 };
  sg_envoy_buffer chunks[MAX_CHUNKS];
  int types[2] = {SG_BUFFERED_REQUEST_BODY, SG_RECEIVED_REQUEST_BODY};
  int kinds = with_received ? 2 : 1;
  size_t want = 0;
  for (int t = 0; t < kinds; t++)
    want += envoy_dynamic_module_callback_http_get_body_chunks_size(envoy, types[t]);
  sg_envoy_buffer *many = NULL, *into = chunks;
  if (want > MAX_CHUNKS) {
    into = many = malloc(want * sizeof *many);
    if (many == NULL) return;
  }
  size_t count = 0, total = 0;
  for (int t = 0; t < kinds; t++) {
    size_t here = envoy_dynamic_module_callback_http_get_body_chunks_size(envoy, types[t]);
    if (here == 0 || count + here > want) continue;
    if (envoy_dynamic_module_callback_http_get_body_chunks(envoy, types[t], into + count))
      count += here;
  }
  for (size_t c = 0; c < count; c++) total += into[c].length;
  if (total == 0) {
    no_body(config, envoy, tenant);
  } else if (count == 1) {
    read_body(config, envoy, tenant, into[0].ptr, into[0].length);
  } else {
    char *whole = malloc(total);
    if (whole != NULL) {
      size_t at = 0;
      for (size_t c = 0; c < count; c++) {
        if (into[c].length > 0) memcpy(whole + at, into[c].ptr, into[c].length);
        at += into[c].length;
      }
      read_body(config, envoy, tenant, whole, total);
      free(whole);
    }
  }
  free(many);
}

/* ---- the kind (module.c calls these from Envoy's hooks) ------------------------------ */

static void *model_config_new(const char *text, size_t length) {
  return config_parse(text, length);
}

static void model_config_destroy(void *config) { config_free(config); }

/* A stream's filter: whether it waits for the request's body, and the tenant of its
 * client (NULL: none), read from its headers. */
typedef struct {
  const sg_filter_kind *kind; /* first: filter_kind.h */
  const config_t *config;
  bool reads_body;
  const tenant_t *tenant;
} filter_t;

/* What Envoy gets when a filter cannot be made (no memory): reads nothing, so the request
 * is not routed by its model (no route serves it). Never freed. */
static const filter_t INERT = {&sg_model_reader, NULL, false, NULL};

static void *model_filter_new(void *config, sg_filter_envoy envoy) {
  filter_t *f = malloc(sizeof *f);
  if (f == NULL) return (void *)&INERT;
  *f = (filter_t){&sg_model_reader, config, false, NULL};
  return f;
}

static void model_filter_destroy(void *filter) {
  if (filter != &INERT) free(filter);
}

static int model_request_headers(sg_filter_envoy envoy, void *filter, bool end_of_stream) {
  if (filter == &INERT) return SG_CONTINUE;
  filter_t *f = filter;
  client_t who = client(f->config, envoy);
  if (who.lane == CLIENT_EXACT) return SG_CONTINUE; /* the routing stage decides it */
  remove_query_credentials(f->config, envoy);
  if (who.lane == CLIENT_UNKNOWN) {
    refuse(f->config, envoy, setting(f->config, S_UNKNOWN_CLIENT), NULL);
    return SG_CONTINUE;
  }
  f->tenant = who.lane == CLIENT_FAST ? who.tenant : NULL;
  if (end_of_stream) {
    no_body(f->config, envoy, f->tenant);
    return SG_CONTINUE;
  }
  f->reads_body = true;
  return SG_HEADERS_STOP_ITERATION;
}

/* Only a request whose headers said so is read (Envoy calls the body hooks of every
 * request with a body). */
static int model_request_body(sg_filter_envoy envoy, void *filter, bool end_of_stream) {
  filter_t *f = filter;
  if (!f->reads_body) return SG_CONTINUE;
  if (!end_of_stream) return SG_BODY_STOP_ITERATION_AND_BUFFER;
  f->reads_body = false;
  read_request(f->config, envoy, f->tenant, true);
  return SG_CONTINUE;
}

/* A body ended by trailers: all of it is buffered by now. */
static int model_request_trailers(sg_filter_envoy envoy, void *filter) {
  filter_t *f = filter;
  if (!f->reads_body) return SG_CONTINUE;
  f->reads_body = false;
  read_request(f->config, envoy, f->tenant, false);
  return SG_CONTINUE;
}

static int model_response_headers(sg_filter_envoy envoy, void *filter, bool end_of_stream) {
  return SG_CONTINUE;
}

static int model_response_body(sg_filter_envoy envoy, void *filter, bool end_of_stream) {
  return SG_CONTINUE;
}

static int model_response_trailers(sg_filter_envoy envoy, void *filter) { return SG_CONTINUE; }

const sg_filter_kind sg_model_reader = {
    .name = "model_reader",
    .config_new = model_config_new,
    .config_destroy = model_config_destroy,
    .filter_new = model_filter_new,
    .filter_destroy = model_filter_destroy,
    .request_headers = model_request_headers,
    .request_body = model_request_body,
    .request_trailers = model_request_trailers,
    .response_headers = model_response_headers,
    .response_body = model_response_body,
    .response_trailers = model_response_trailers,
};
