/* A dynamic module that does nothing: the filter "pass", Continue everywhere (what a
 * dynamic module costs Envoy by itself; benchmarks/native_filter_cost.py, arm "plain + C
 * pass"). Until session 20 it also had "model", the routing subset of the model reader,
 * which the product's native model reader (sluicegate/native/c/model_filter.c) replaced. */
#include <string.h>

#include "abi_subset.h"

#define EXPORT __attribute__((visibility("default")))

static const int PASS = 1;

EXPORT const char *envoy_dynamic_module_on_program_init(void) { return SG_ABI_VERSION; }

EXPORT sg_config_module envoy_dynamic_module_on_http_filter_config_new(
    sg_config_envoy config_envoy, sg_envoy_buffer name, sg_envoy_buffer config) {
  (void)config_envoy;
  (void)config;
  if (name.length == 4 && memcmp(name.ptr, "pass", 4) == 0) return &PASS;
  return NULL;
}

EXPORT void envoy_dynamic_module_on_http_filter_config_destroy(sg_config_module config) {
  (void)config;
}

EXPORT sg_filter_module envoy_dynamic_module_on_http_filter_new(sg_config_module config,
                                                                sg_filter_envoy filter) {
  (void)filter;
  return config;
}

EXPORT void envoy_dynamic_module_on_http_filter_destroy(sg_filter_module module) { (void)module; }

/* Every other hook Envoy requires: nothing to do (their arguments are not read, so only
 * the return value matters: 0 is Continue where there is one). */
#define NOOP(name) \
  EXPORT int envoy_dynamic_module_on_http_filter_##name(void) { return 0; }
NOOP(request_headers)
NOOP(request_body)
NOOP(request_trailers)
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
