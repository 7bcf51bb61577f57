/* What a provider receives: an upstream Envoy HTTP filter (dynamic module, filter name
 * "forwarded_headers") in place of the header_mutation filters of
 * sluicegate/xds/translate/forwarded_headers.py, which is its specification: on every
 * attempt it removes each request header that is neither a pseudo-header nor on the
 * attempt's provider's allowlist, and those it withholds, then sets that provider's fixed
 * headers (each replacing
 * every value the request had, as header_mutation's OVERWRITE_IF_EXISTS_OR_ADD does).
 *
 * Envoy's header_mutation can only remove by a name matcher, so the translator writes "not
 * on the list" as a union of RE2 complements, each matched against every header of every
 * attempt; here a name is compared with the list itself.
 *
 * Configuration (`key=value` lines; forwarded_headers.native_forwarded_headers_config
 * writes them):
 *   provider_header=<name>   the header naming the attempt's provider (required, once)
 *   provider=<name>          starts the block of that provider
 *   allow=<name>|<prefix>*   a header the block's provider receives as the client sent it
 *   withhold=<name>          a header it does not receive even so (another provider of
 *                            the route sets it: a retry would carry that one's value)
 *   set=<name>:<value>       a fixed header of the block's provider
 * Lines before the first `provider=` are the block for a provider no block names (or an
 * attempt with no provider header): the translator writes the built-in list there, and a
 * route whose providers all receive the same has that block alone.
 *
 * Fails closed: an attempt with no memory for its object or for a long list of its
 * headers, or whose removal does not take (a name Envoy's map does not hold as written),
 * is held: neither its headers nor its body nor its trailers go on, until its timeout. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "envoy_abi.h"
#include "filter_kind.h"

typedef struct {
  const char *ptr;
  size_t length;
} text_t;

typedef struct {
  text_t provider; /* empty for the block of any other provider */
  size_t first_allow, allows; /* a run of config->allow */
  size_t first_withhold, withholds; /* a run of config->withhold */
  size_t first_set, sets;     /* a run of config->set_name / set_value */
} block_t;

typedef struct {
  const sg_filter_kind *kind; /* first: filter_kind.h */
  char *text;                 /* the configuration, its lines NUL-split; every text_t points here */
  text_t provider_header;
  text_t *allow; /* a name, or a prefix still ending in '*' */
  text_t *withhold;
  text_t *set_name, *set_value;
  block_t *blocks; /* blocks[0] is the block for any other provider */
  size_t block_count;
} config_t;

/* An attempt: its configuration, and whether it is held (fails closed). */
typedef struct {
  const sg_filter_kind *kind; /* first: filter_kind.h */
  const config_t *config;
  bool held;
} attempt_t;

/* Every attempt with no memory for its object: held from the start (never written:
 * its `held` is already true). */
static const attempt_t HELD = {&sg_forwarded_headers, NULL, true};

/* At most this many header entries are listed on the stack; more go to the heap. */
#define STACK_HEADERS 128

static bool equal(text_t a, const char *ptr, size_t length) {
  return a.length == length && memcmp(a.ptr, ptr, length) == 0;
}

static bool is_token_byte(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || strchr("!#$%&'*+-.^_`|~", c);
}

/* A lower-case header name (RFC 9110 token, so '*' too), or when `prefix`, a name and a
 * trailing '*' (the prefix's stem may not be empty: "*" would allow every name). */
static bool valid_name(text_t name, bool prefix) {
  size_t length = name.length;
  if (prefix && length > 0 && name.ptr[length - 1] == '*') length--; /* a stem, not empty */
  if (length == 0) return false;
  for (size_t i = 0; i < length; i++)
    if (name.ptr[i] == 0 || !is_token_byte(name.ptr[i])) return false;
  return true;
}

/* A fixed header's value as config validation takes it: visible ASCII and spaces (never
 * a byte Envoy's header map refuses: NUL, CR, LF, other controls). */
static bool valid_value(text_t value) {
  if (value.length == 0) return false;
  for (size_t i = 0; i < value.length; i++)
    if (value.ptr[i] < ' ' || value.ptr[i] > '~') return false;
  return true;
}

static void config_free(config_t *config) {
  if (config == NULL) return;
  free(config->text);
  free(config->allow);
  free(config->withhold);
  free(config->set_name);
  free(config->set_value);
  free(config->blocks);
  free(config);
}

/* How many lines start with `key=` (an upper bound for the arrays). */
static size_t count_lines(const char *text, size_t length, const char *key) {
  size_t count = 0, key_length = strlen(key);
  for (size_t i = 0; i < length; i++)
    if ((i == 0 || text[i - 1] == '\n') && length - i >= key_length &&
        memcmp(text + i, key, key_length) == 0)
      count++;
  return count;
}

/* One line of a parsed configuration; false when it is wrong. */
static bool config_line(config_t *config, char *line, size_t length) {
  char *eq = memchr(line, '=', length);
  if (eq == NULL) return false;
  text_t key = {line, (size_t)(eq - line)};
  text_t value = {eq + 1, length - key.length - 1};
  block_t *block = &config->blocks[config->block_count - 1];
  if (equal(key, "provider_header", 15)) {
    if (config->provider_header.ptr != NULL || !valid_name(value, false)) return false;
    config->provider_header = value;
  } else if (equal(key, "provider", 8)) {
    if (value.length == 0) return false;
    for (size_t b = 1; b < config->block_count; b++)
      if (equal(config->blocks[b].provider, value.ptr, value.length)) return false;
    block = &config->blocks[config->block_count++];
    *block = (block_t){value, block[-1].first_allow + block[-1].allows, 0,
                       block[-1].first_withhold + block[-1].withholds, 0,
                       block[-1].first_set + block[-1].sets, 0};
  } else if (equal(key, "allow", 5)) {
    if (!valid_name(value, true)) return false;
    config->allow[block->first_allow + block->allows++] = value;
  } else if (equal(key, "withhold", 8)) {
    if (!valid_name(value, false)) return false;
    config->withhold[block->first_withhold + block->withholds++] = value;
  } else if (equal(key, "set", 3)) {
    char *colon = memchr(value.ptr, ':', value.length);
    if (colon == NULL) return false;
    text_t name = {value.ptr, (size_t)(colon - value.ptr)};
    text_t set = {colon + 1, value.length - name.length - 1};
    if (!valid_name(name, false) || !valid_value(set)) return false;
    config->set_name[block->first_set + block->sets] = name;
    config->set_value[block->first_set + block->sets++] = set;
  } else {
    return false;
  }
  return true;
}

/* The configuration from `text`; NULL when a line is wrong, the provider header is
 * missing, or there is no memory. */
static config_t *config_parse(const char *text, size_t length) {
  config_t *config = calloc(1, sizeof *config);
  if (config == NULL) return NULL;
  config->kind = &sg_forwarded_headers;
  size_t allows = count_lines(text, length, "allow="), sets = count_lines(text, length, "set=");
  size_t withholds = count_lines(text, length, "withhold=");
  size_t blocks = count_lines(text, length, "provider=") + 1;
  config->text = malloc(length + 1);
  config->allow = calloc(allows + 1, sizeof *config->allow);
  config->withhold = calloc(withholds + 1, sizeof *config->withhold);
  config->set_name = calloc(sets + 1, sizeof *config->set_name);
  config->set_value = calloc(sets + 1, sizeof *config->set_value);
  config->blocks = calloc(blocks, sizeof *config->blocks);
  if (config->text == NULL || config->allow == NULL || config->withhold == NULL ||
      config->set_name == NULL || config->set_value == NULL || config->blocks == NULL) {
    config_free(config);
    return NULL;
  }
  memcpy(config->text, text, length);
  config->text[length] = 0;
  config->block_count = 1;
  size_t start = 0;
  for (size_t i = 0; i <= length; i++) {
    if (i < length && text[i] != '\n') continue;
    size_t end = i;
    if (end > start && text[end - 1] == '\r') end--;
    config->text[end] = 0;
    if (end > start && !config_line(config, config->text + start, end - start)) {
      config_free(config);
      return NULL;
    }
    start = i + 1;
  }
  if (config->provider_header.ptr == NULL) {
    config_free(config);
    return NULL;
  }
  return config;
}

/* ---- the allowlist ------------------------------------------------------------------ */

/* The block of the provider the provider header names. With two values, none: Envoy's
 * matcher (the composite filter this replaces) reads them joined by a comma, which names
 * no provider. */
static const block_t *block_for(const config_t *config, sg_filter_envoy envoy) {
  sg_envoy_buffer provider = {NULL, 0};
  sg_module_buffer key = {config->provider_header.ptr, config->provider_header.length};
  size_t values = 0;
  if (envoy_dynamic_module_callback_http_get_header(envoy, SG_REQUEST_HEADERS, key, &provider,
                                                    0, &values) &&
      values == 1)
    for (size_t b = 1; b < config->block_count; b++)
      if (equal(config->blocks[b].provider, provider.ptr, provider.length))
        return &config->blocks[b];
  return &config->blocks[0];
}

/* Whether the header `name` reaches the block's provider as the client sent it. */
static bool allowed(const config_t *config, const block_t *block, const char *name,
                    size_t length) {
  if (length > 0 && name[0] == ':') return true; /* pseudo-headers are Envoy's */
  for (size_t w = block->first_withhold; w < block->first_withhold + block->withholds; w++)
    if (equal(config->withhold[w], name, length)) return false;
  for (size_t a = block->first_allow; a < block->first_allow + block->allows; a++) {
    text_t entry = config->allow[a];
    if (entry.ptr[entry.length - 1] == '*') {
      if (length >= entry.length - 1 && memcmp(name, entry.ptr, entry.length - 1) == 0)
        return true;
    } else if (equal(entry, name, length)) {
      return true;
    }
  }
  return false;
}

/* Removes every header off the block's list; false when it cannot (the headers cannot be
 * listed, or a removal did not take).
 *
 * Removing a name removes all its values, and Envoy frees their entries, so the listing
 * is taken again after each removal and read from its start (a removal may take an entry
 * before the one removed: Envoy removes by the name in lower case). A request carries a
 * few headers off the list. */
static bool remove_others(const config_t *config, const block_t *block, sg_filter_envoy envoy) {
  sg_envoy_header on_stack[STACK_HEADERS], *headers = on_stack;
  size_t capacity = STACK_HEADERS, before = SIZE_MAX;
  bool ok = true;
  for (;;) {
    size_t count = envoy_dynamic_module_callback_http_get_headers_size(envoy, SG_REQUEST_HEADERS);
    if (count >= before) { /* the last removal took nothing away */
      ok = false;
      break;
    }
    if (count == 0) break;
    if (count > capacity) {
      if (headers != on_stack) free(headers);
      headers = malloc(count * sizeof *headers);
      capacity = count;
      if (headers == NULL) {
        ok = false;
        break;
      }
    }
    if (!envoy_dynamic_module_callback_http_get_headers(envoy, SG_REQUEST_HEADERS, headers)) {
      ok = false;
      break;
    }
    size_t i = 0;
    while (i < count && allowed(config, block, headers[i].key_ptr, headers[i].key_length)) i++;
    if (i == count) break;
    /* Envoy copies the name before it removes the entry the name lies in. */
    sg_module_buffer name = {headers[i].key_ptr, headers[i].key_length};
    envoy_dynamic_module_callback_http_set_header(envoy, SG_REQUEST_HEADERS, name,
                                                  (sg_module_buffer){NULL, 0});
    before = count;
  }
  if (headers != on_stack) free(headers);
  return ok;
}

/* ---- the kind (module.c calls these from Envoy's hooks) --------------------------- */

static void *forwarded_config_new(const char *text, size_t length) {
  return config_parse(text, length);
}

static void forwarded_config_destroy(void *config) { config_free(config); }

static void *forwarded_filter_new(void *config, sg_filter_envoy envoy) {
  attempt_t *attempt = malloc(sizeof *attempt);
  if (attempt == NULL) return (void *)&HELD;
  *attempt = (attempt_t){&sg_forwarded_headers, config, false};
  return attempt;
}

static void forwarded_filter_destroy(void *module) {
  if (module != &HELD) free(module);
}

static int forwarded_request_headers(sg_filter_envoy envoy, void *module, bool end_of_stream) {
  attempt_t *attempt = module;
  if (attempt->held) return SG_HEADERS_STOP_ITERATION;
  const config_t *config = attempt->config;
  const block_t *block = block_for(config, envoy);
  if (!remove_others(config, block, envoy)) {
    attempt->held = true;
    return SG_HEADERS_STOP_ITERATION;
  }
  for (size_t s = block->first_set; s < block->first_set + block->sets; s++) {
    sg_module_buffer name = {config->set_name[s].ptr, config->set_name[s].length};
    sg_module_buffer value = {config->set_value[s].ptr, config->set_value[s].length};
    envoy_dynamic_module_callback_http_set_header(envoy, SG_REQUEST_HEADERS, name,
                                                  (sg_module_buffer){NULL, 0});
    envoy_dynamic_module_callback_http_add_header(envoy, SG_REQUEST_HEADERS, name, value);
  }
  return SG_CONTINUE;
}

/* A held attempt's body and trailers go nowhere either: Envoy would send its headers on
 * with them. */
static int forwarded_request_body(sg_filter_envoy envoy, void *module, bool end_of_stream) {
  return ((attempt_t *)module)->held ? SG_BODY_STOP_ITERATION_NO_BUFFER : SG_CONTINUE;
}

static int forwarded_request_trailers(sg_filter_envoy envoy, void *module) {
  return ((attempt_t *)module)->held ? SG_TRAILERS_STOP_ITERATION : SG_CONTINUE;
}

static int forwarded_pass(sg_filter_envoy envoy, void *module, bool end_of_stream) {
  return SG_CONTINUE;
}

static int forwarded_pass_trailers(sg_filter_envoy envoy, void *module) { return SG_CONTINUE; }

const sg_filter_kind sg_forwarded_headers = {
    .name = "forwarded_headers",
    .config_new = forwarded_config_new,
    .config_destroy = forwarded_config_destroy,
    .filter_new = forwarded_filter_new,
    .filter_destroy = forwarded_filter_destroy,
    .request_headers = forwarded_request_headers,
    .request_body = forwarded_request_body,
    .request_trailers = forwarded_request_trailers,
    .response_headers = forwarded_pass,
    .response_body = forwarded_pass,
    .response_trailers = forwarded_pass_trailers,
};
