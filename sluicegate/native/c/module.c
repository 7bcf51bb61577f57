/* The library's hooks: what Envoy calls, passed on to the kind of filter the object
 * belongs to (filter_kind.h). The filters are in usage_filter.c, model_filter.c and
 * forwarded_headers.c. */
#include <string.h>

#include "envoy_abi.h"
#include "filter_kind.h"
#include "module.h"

#define EXPORT __attribute__((visibility("default")))

static const sg_filter_kind *const KINDS[] = {&sg_usage_reader, &sg_model_reader,
                                              &sg_forwarded_headers};

static const sg_filter_kind *kind_of(const void *object) {
  return ((const sg_object *)object)->kind;
}

EXPORT const char *envoy_dynamic_module_on_program_init(void) { return SG_ABI_VERSION; }

EXPORT sg_config_module envoy_dynamic_module_on_http_filter_config_new(
    sg_config_envoy config_envoy, sg_envoy_buffer name, sg_envoy_buffer config) {
  for (size_t k = 0; k < sizeof KINDS / sizeof *KINDS; k++) {
    const char *known = KINDS[k]->name;
    if (name.length == strlen(known) && memcmp(name.ptr, known, name.length) == 0)
      return KINDS[k]->config_new(config.ptr, config.length);
  }
  return NULL;
}

EXPORT void envoy_dynamic_module_on_http_filter_config_destroy(sg_config_module config) {
  if (config != NULL) kind_of(config)->config_destroy((void *)config);
}

EXPORT sg_filter_module envoy_dynamic_module_on_http_filter_new(sg_config_module config,
                                                                sg_filter_envoy envoy) {
  return kind_of(config)->filter_new((void *)config, envoy);
}

EXPORT void envoy_dynamic_module_on_http_filter_destroy(sg_filter_module module) {
  kind_of(module)->filter_destroy((void *)module);
}

EXPORT int envoy_dynamic_module_on_http_filter_request_headers(sg_filter_envoy envoy,
                                                               sg_filter_module module,
                                                               bool end_of_stream) {
  return kind_of(module)->request_headers(envoy, (void *)module, end_of_stream);
}

EXPORT int envoy_dynamic_module_on_http_filter_request_body(sg_filter_envoy envoy,
                                                            sg_filter_module module,
                                                            bool end_of_stream) {
  return kind_of(module)->request_body(envoy, (void *)module, end_of_stream);
}

EXPORT int envoy_dynamic_module_on_http_filter_request_trailers(sg_filter_envoy envoy,
                                                                sg_filter_module module) {
  return kind_of(module)->request_trailers(envoy, (void *)module);
}

EXPORT int envoy_dynamic_module_on_http_filter_response_headers(sg_filter_envoy envoy,
                                                                sg_filter_module module,
                                                                bool end_of_stream) {
  return kind_of(module)->response_headers(envoy, (void *)module, end_of_stream);
}

EXPORT int envoy_dynamic_module_on_http_filter_response_body(sg_filter_envoy envoy,
                                                             sg_filter_module module,
                                                             bool end_of_stream) {
  return kind_of(module)->response_body(envoy, (void *)module, end_of_stream);
}

EXPORT int envoy_dynamic_module_on_http_filter_response_trailers(sg_filter_envoy envoy,
                                                                 sg_filter_module module) {
  return kind_of(module)->response_trailers(envoy, (void *)module);
}

EXPORT void envoy_dynamic_module_on_http_filter_stream_complete(sg_filter_envoy envoy,
                                                                sg_filter_module module) {
  const sg_filter_kind *kind = kind_of(module);
  if (kind->stream_complete != NULL) kind->stream_complete(envoy, (void *)module);
}

/* Hooks Envoy requires that no filter here does anything in (declared with their real
 * parameters, from Envoy's header). */
EXPORT void envoy_dynamic_module_on_http_filter_http_callout_done(
    sg_filter_envoy envoy, sg_filter_module module, uint64_t callout_id, int result,
    sg_envoy_header *headers, size_t headers_size, sg_envoy_buffer *body_chunks,
    size_t body_chunks_size) {}

EXPORT void envoy_dynamic_module_on_http_filter_http_stream_headers(
    sg_filter_envoy envoy, sg_filter_module module, uint64_t stream_id,
    sg_envoy_header *headers, size_t headers_size, bool end_stream) {}

EXPORT void envoy_dynamic_module_on_http_filter_http_stream_data(
    sg_filter_envoy envoy, sg_filter_module module, uint64_t stream_id,
    const sg_envoy_buffer *data, size_t data_count, bool end_stream) {}

EXPORT void envoy_dynamic_module_on_http_filter_http_stream_trailers(
    sg_filter_envoy envoy, sg_filter_module module, uint64_t stream_id,
    sg_envoy_header *trailers, size_t trailers_size) {}

EXPORT void envoy_dynamic_module_on_http_filter_http_stream_complete(sg_filter_envoy envoy,
                                                                     sg_filter_module module,
                                                                     uint64_t stream_id) {}

EXPORT void envoy_dynamic_module_on_http_filter_http_stream_reset(sg_filter_envoy envoy,
                                                                  sg_filter_module module,
                                                                  uint64_t stream_id,
                                                                  int reason) {}

EXPORT void envoy_dynamic_module_on_http_filter_scheduled(sg_filter_envoy envoy,
                                                          sg_filter_module module,
                                                          uint64_t event_id) {}

EXPORT void envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    sg_filter_envoy envoy, sg_filter_module module) {}

EXPORT void envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    sg_filter_envoy envoy, sg_filter_module module) {}
