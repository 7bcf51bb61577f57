/* The hooks of Envoy's dynamic module ABI that module.c defines and that do something
 * (the others are empty): declared for module.c and for the tests' mocks of Envoy. */
#ifndef SLUICEGATE_MODULE_H
#define SLUICEGATE_MODULE_H

#include "envoy_abi.h"

const char *envoy_dynamic_module_on_program_init(void);
sg_config_module envoy_dynamic_module_on_http_filter_config_new(sg_config_envoy config_envoy,
                                                                sg_envoy_buffer name,
                                                                sg_envoy_buffer config);
void envoy_dynamic_module_on_http_filter_config_destroy(sg_config_module config);
sg_filter_module envoy_dynamic_module_on_http_filter_new(sg_config_module config,
                                                         sg_filter_envoy envoy);
void envoy_dynamic_module_on_http_filter_destroy(sg_filter_module module);
int envoy_dynamic_module_on_http_filter_request_headers(sg_filter_envoy envoy,
                                                        sg_filter_module module,
                                                        bool end_of_stream);
int envoy_dynamic_module_on_http_filter_request_body(sg_filter_envoy envoy,
                                                     sg_filter_module module, bool end_of_stream);
int envoy_dynamic_module_on_http_filter_request_trailers(sg_filter_envoy envoy,
                                                         sg_filter_module module);
int envoy_dynamic_module_on_http_filter_response_headers(sg_filter_envoy envoy,
                                                         sg_filter_module module,
                                                         bool end_of_stream);
int envoy_dynamic_module_on_http_filter_response_body(sg_filter_envoy envoy,
                                                      sg_filter_module module,
                                                      bool end_of_stream);
int envoy_dynamic_module_on_http_filter_response_trailers(sg_filter_envoy envoy,
                                                          sg_filter_module module);
void envoy_dynamic_module_on_http_filter_stream_complete(sg_filter_envoy envoy,
                                                         sg_filter_module module);

#endif
