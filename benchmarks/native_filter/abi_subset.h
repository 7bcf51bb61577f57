/* The part of Envoy's dynamic module ABI (Envoy 1.40, HTTP filters) that
 * sluicegate_native.c uses, declared by hand from reading Envoy's abi.h and checked
 * against the envoy binary's exported symbols (nm -D) and, for the argument layout,
 * its disassembly (x86-64 System V: a {ptr, length} struct passed by value takes two
 * integer registers while two are left, else it goes whole on the stack).
 *
 * Hooks are ours (exported by the module, called by Envoy); callbacks are Envoy's. */
#ifndef SLUICEGATE_ABI_SUBSET_H
#define SLUICEGATE_ABI_SUBSET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Opaque handles: Envoy's objects (envoy_ptr) and ours (module_ptr). */
typedef void *sg_filter_config_envoy;
typedef const void *sg_filter_config_module;
typedef void *sg_filter_envoy;
typedef const void *sg_filter_module;

/* Bytes owned by Envoy, valid until the current hook returns. */
typedef struct {
  const char *ptr;
  size_t length;
} sg_envoy_buffer;

/* Bytes owned by the module, passed to Envoy (which copies them). */
typedef struct {
  const char *ptr;
  size_t length;
} sg_module_buffer;

/* Which header map a header callback acts on. */
enum { SG_REQUEST_HEADERS = 0 };

/* Which body a body callback reads: the data of the current hook, or what Envoy
 * buffered in earlier hooks (after StopIterationAndBuffer). */
enum { SG_RECEIVED_REQUEST_BODY = 0, SG_BUFFERED_REQUEST_BODY = 1 };

/* Return values of the hooks (Envoy's FilterHeadersStatus / FilterDataStatus /
 * FilterTrailersStatus, in that order). */
enum { SG_HEADERS_CONTINUE = 0, SG_HEADERS_STOP_ITERATION = 1 };
enum { SG_BODY_CONTINUE = 0, SG_BODY_STOP_ITERATION_AND_BUFFER = 1 };
enum { SG_TRAILERS_CONTINUE = 0 };

/* Callbacks (Envoy's). */
size_t envoy_dynamic_module_callback_http_get_body_chunks_size(sg_filter_envoy filter,
                                                               int body_type);
bool envoy_dynamic_module_callback_http_get_body_chunks(sg_filter_envoy filter, int body_type,
                                                        sg_envoy_buffer *chunks);
size_t envoy_dynamic_module_callback_http_get_body_size(sg_filter_envoy filter, int body_type);
bool envoy_dynamic_module_callback_http_get_header(sg_filter_envoy filter, int header_type,
                                                  sg_module_buffer key, sg_envoy_buffer *value,
                                                  size_t index, size_t *count);
bool envoy_dynamic_module_callback_http_set_header(sg_filter_envoy filter, int header_type,
                                                  sg_module_buffer key, sg_module_buffer value);
void envoy_dynamic_module_callback_http_set_dynamic_metadata_string(sg_filter_envoy filter,
                                                                    sg_module_buffer ns,
                                                                    sg_module_buffer key,
                                                                    sg_module_buffer value);
void envoy_dynamic_module_callback_http_set_dynamic_metadata_bool(sg_filter_envoy filter,
                                                                  sg_module_buffer ns,
                                                                  sg_module_buffer key,
                                                                  bool value);
void envoy_dynamic_module_callback_http_clear_route_cache(sg_filter_envoy filter);
bool envoy_dynamic_module_callback_http_drain_body(sg_filter_envoy filter, int body_type,
                                                  size_t bytes);
bool envoy_dynamic_module_callback_http_append_body(sg_filter_envoy filter, int body_type,
                                                   sg_module_buffer data);

#endif
