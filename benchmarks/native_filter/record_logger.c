/* An experiment, not the product: what a native access logger costs Envoy's worker to
 * read and format the request record (session 19; benchmarks/record_log_cost.py, arms
 * "native logger"). Envoy 1.40 loads access loggers as dynamic modules too
 * (envoy.access_loggers.dynamic_modules). This one reads what the record reads (the
 * response code, flags, attempts, route, and each metadata field named in its config,
 * `<namespace>:<key>` a line, as wire.RECORD_METADATA_FIELDS names them) and formats
 * them into a buffer of its worker's, which it then drops: there is no transport. The
 * logger named "empty" reads nothing (what Envoy's dispatch to a module costs).
 *
 * The callbacks' signatures were read from the 1.40 binary's code (objdump): the
 * metadata getters take (logger, namespace {ptr, len}, key {ptr, len}, out*) and return
 * whether the value was of that kind; the response code and attempt count come back as
 * 32-bit values, the flags as 64. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef struct {
  const char *ptr;
  size_t length;
} buffer_t;

bool envoy_dynamic_module_callback_access_logger_get_dynamic_metadata(void *logger, buffer_t ns,
                                                                      buffer_t key, buffer_t *out);
bool envoy_dynamic_module_callback_access_logger_get_dynamic_metadata_number(void *logger,
                                                                             buffer_t ns,
                                                                             buffer_t key,
                                                                             double *out);
uint32_t envoy_dynamic_module_callback_access_logger_get_response_code(void *logger);
uint64_t envoy_dynamic_module_callback_access_logger_get_response_flags(void *logger);
uint32_t envoy_dynamic_module_callback_access_logger_get_attempt_count(void *logger);
bool envoy_dynamic_module_callback_access_logger_get_route_name(void *logger, buffer_t *out);

#define MAX_FIELDS 64

typedef struct {
  bool empty;
  size_t count;
  buffer_t ns[MAX_FIELDS];
  buffer_t key[MAX_FIELDS];
  char text[4096]; /* the config's lines, which ns/key point into */
} config_t;

static _Thread_local char record[8192];
static volatile size_t sink;

EXPORT const char *envoy_dynamic_module_on_program_init(void) { return "v0.2.0"; }

EXPORT void *envoy_dynamic_module_on_access_logger_config_new(void *config_envoy, buffer_t name,
                                                              buffer_t config) {
  (void)config_envoy;
  config_t *made = calloc(1, sizeof *made);
  if (made == NULL || config.length >= sizeof made->text) {
    free(made);
    return NULL;
  }
  made->empty = name.length == 5 && memcmp(name.ptr, "empty", 5) == 0;
  memcpy(made->text, config.ptr, config.length);
  char *line = made->text;
  while (*line != '\0' && made->count < MAX_FIELDS) {
    char *end = strchr(line, '\n');
    char *colon = strchr(line, ':');
    if (end == NULL) end = line + strlen(line);
    if (colon != NULL && colon < end) {
      made->ns[made->count] = (buffer_t){line, (size_t)(colon - line)};
      made->key[made->count] = (buffer_t){colon + 1, (size_t)(end - colon - 1)};
      made->count++;
    }
    line = *end == '\0' ? end : end + 1;
  }
  return made;
}

EXPORT void envoy_dynamic_module_on_access_logger_config_destroy(void *config) { free(config); }

EXPORT void *envoy_dynamic_module_on_access_logger_new(void *config, void *logger_envoy) {
  (void)logger_envoy;
  return config; /* nothing per worker */
}

EXPORT void envoy_dynamic_module_on_access_logger_destroy(void *logger) { (void)logger; }

static size_t put(size_t at, const char *text, size_t length) {
  if (at + length + 1 >= sizeof record) return at;
  memcpy(record + at, text, length);
  record[at + length] = '\n';
  return at + length + 1;
}

EXPORT void envoy_dynamic_module_on_access_logger_log(void *logger_envoy, void *logger,
                                                      int log_type) {
  const config_t *config = logger;
  (void)log_type;
  if (config->empty) return;
  char number[64];
  size_t at = 0;
  buffer_t value;
  if (envoy_dynamic_module_callback_access_logger_get_route_name(logger_envoy, &value))
    at = put(at, value.ptr, value.length);
  int n = snprintf(number, sizeof number, "%u\n%llu\n%u",
                   envoy_dynamic_module_callback_access_logger_get_response_code(logger_envoy),
                   (unsigned long long)envoy_dynamic_module_callback_access_logger_get_response_flags(logger_envoy),
                   envoy_dynamic_module_callback_access_logger_get_attempt_count(logger_envoy));
  at = put(at, number, (size_t)n);
  for (size_t i = 0; i < config->count; i++) {
    double found;
    if (envoy_dynamic_module_callback_access_logger_get_dynamic_metadata(
            logger_envoy, config->ns[i], config->key[i], &value)) {
      at = put(at, value.ptr, value.length);
    } else if (envoy_dynamic_module_callback_access_logger_get_dynamic_metadata_number(
                   logger_envoy, config->ns[i], config->key[i], &found)) {
      n = snprintf(number, sizeof number, "%.17g", found);
      at = put(at, number, (size_t)n);
    } else {
      at = put(at, "-", 1);
    }
  }
#ifdef SG_SHOW_FIRST /* to check by eye that the fields are read: -DSG_SHOW_FIRST */
  static _Atomic int shown;
  if (shown++ == 0) fprintf(stderr, "record_logger: %.*s\n", (int)at, record);
#endif
  sink += at;
}
