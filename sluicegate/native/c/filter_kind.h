/* One kind of filter in the library: what Envoy's hooks do for it (module.c dispatches).
 *
 * Envoy's hooks are the library's, one set for every filter it has; the filter a
 * DynamicModuleFilter names (`filter_name`) picks its kind when its configuration is
 * made. Every configuration and every filter object a kind makes starts with a pointer
 * to its kind, which is how module.c finds it again in the other hooks. */
#ifndef SLUICEGATE_FILTER_KIND_H
#define SLUICEGATE_FILTER_KIND_H

#include "envoy_abi.h"

typedef struct sg_filter_kind {
  const char *name; /* the filter_name that picks it */
  /* The configuration from the filter's filter_config, or NULL when it is wrong (Envoy
   * refuses the filter). */
  void *(*config_new)(const char *text, size_t length);
  void (*config_destroy)(void *config);
  /* Never NULL: a kind with no memory left returns an object that does nothing. */
  void *(*filter_new)(void *config, sg_filter_envoy envoy);
  void (*filter_destroy)(void *filter);
  int (*request_headers)(sg_filter_envoy envoy, void *filter, bool end_of_stream);
  int (*request_body)(sg_filter_envoy envoy, void *filter, bool end_of_stream);
  int (*request_trailers)(sg_filter_envoy envoy, void *filter);
  int (*response_headers)(sg_filter_envoy envoy, void *filter, bool end_of_stream);
  int (*response_body)(sg_filter_envoy envoy, void *filter, bool end_of_stream);
  int (*response_trailers)(sg_filter_envoy envoy, void *filter);
  /* The stream is over, ended or reset, before Envoy logs it; NULL: nothing to do. */
  void (*stream_complete)(sg_filter_envoy envoy, void *filter);
} sg_filter_kind;

/* The head of every configuration and filter object. */
typedef struct {
  const sg_filter_kind *kind;
} sg_object;

extern const sg_filter_kind sg_usage_reader; /* usage_filter.c */
extern const sg_filter_kind sg_model_reader; /* model_filter.c */
extern const sg_filter_kind sg_forwarded_headers; /* forwarded_headers.c */

#endif
