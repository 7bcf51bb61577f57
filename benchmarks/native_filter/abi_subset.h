/* What sluicegate_native.c uses of Envoy's dynamic module ABI (Envoy 1.40, HTTP
 * filters): the product's declarations (sluicegate/native/c/envoy_abi.h, checked against
 * the envoy binary's symbols and argument registers), and the request-side ones only this
 * experiment uses, declared by hand from Envoy's abi.h and checked the same way (x86-64
 * System V: a {ptr, length} struct passed by value takes two integer registers while two
 * are left, else it goes whole on the stack).
 *
 * Hooks are ours (exported by the module, called by Envoy); callbacks are Envoy's. */
#ifndef SLUICEGATE_ABI_SUBSET_H
#define SLUICEGATE_ABI_SUBSET_H

#include "../../sluicegate/native/c/envoy_abi.h"

/* Which body a body callback reads: the data of the current hook, or what Envoy
 * buffered in earlier hooks (after StopIterationAndBuffer). */
enum { SG_RECEIVED_REQUEST_BODY = 0, SG_BUFFERED_REQUEST_BODY = 1 };

/* Return values of the hooks (Envoy's FilterHeadersStatus / FilterDataStatus /
 * FilterTrailersStatus, in that order). */
enum { SG_HEADERS_CONTINUE = 0, SG_HEADERS_STOP_ITERATION = 1 };
enum { SG_BODY_CONTINUE = 0, SG_BODY_STOP_ITERATION_AND_BUFFER = 1 };
enum { SG_TRAILERS_CONTINUE = 0 };

size_t envoy_dynamic_module_callback_http_get_body_size(sg_filter_envoy filter, int body_type);
void envoy_dynamic_module_callback_http_set_dynamic_metadata_string(sg_filter_envoy filter,
                                                                    sg_module_buffer ns,
                                                                    sg_module_buffer key,
                                                                    sg_module_buffer value);
void envoy_dynamic_module_callback_http_set_dynamic_metadata_bool(sg_filter_envoy filter,
                                                                  sg_module_buffer ns,
                                                                  sg_module_buffer key,
                                                                  bool value);
void envoy_dynamic_module_callback_http_clear_route_cache(sg_filter_envoy filter);

#endif
