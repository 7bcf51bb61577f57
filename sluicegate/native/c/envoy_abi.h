/* The part of Envoy's dynamic module ABI (Envoy 1.40, "v0.2.0", HTTP filters) that
 * the library's filters use, declared by hand (names shortened to sg_*; Envoy's header is not
 * vendored). Each callback was checked against the 1.40 binary: its symbol exported
 * (nm -D), and its argument registers and the enum values it switches on read from its
 * disassembly (x86-64 System V: a {ptr, length} struct by value takes two integer
 * registers while two are left, else it goes on the stack; a double goes in xmm0).
 * The hooks' parameters follow Envoy's header (source/extensions/dynamic_modules/abi);
 * Envoy resolves each hook by name when it loads the filter, and refuses the filter when
 * one it requires is missing.
 *
 * Hooks are ours (exported by the module, called by Envoy); callbacks are Envoy's. */
#ifndef SLUICEGATE_ENVOY_ABI_H
#define SLUICEGATE_ENVOY_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What Envoy 1.40 expects (its log: "Dynamic module ABI version v0.2.0 matched"). */
#define SG_ABI_VERSION "v0.2.0"

/* Opaque handles: Envoy's objects (envoy) and ours (module). */
typedef void *sg_config_envoy;
typedef const void *sg_config_module;
typedef void *sg_filter_envoy;
typedef const void *sg_filter_module;

/* Bytes owned by Envoy, valid until the current hook returns (or, for metadata, until
 * it is changed). */
typedef struct {
  const char *ptr;
  size_t length;
} sg_envoy_buffer;

/* Bytes owned by the module, passed to Envoy (which copies them). */
typedef struct {
  const char *ptr;
  size_t length;
} sg_module_buffer;

/* A header owned by Envoy (the forwarded headers filter lists a request's). */
typedef struct {
  const char *key_ptr;
  size_t key_length;
  const char *value_ptr;
  size_t value_length;
} sg_envoy_header;

/* envoy_dynamic_module_type_http_header_type: which header map. */
enum { SG_REQUEST_HEADERS = 0, SG_REQUEST_TRAILERS = 1, SG_RESPONSE_HEADERS = 2 };
/* envoy_dynamic_module_type_http_body_type: the data of the current hook ("received")
 * or what Envoy buffered ("buffered"). */
enum {
  SG_RECEIVED_REQUEST_BODY = 0,
  SG_BUFFERED_REQUEST_BODY = 1,
  SG_RECEIVED_RESPONSE_BODY = 2,
  SG_BUFFERED_RESPONSE_BODY = 3
};
/* envoy_dynamic_module_type_metadata_source: the stream's dynamic metadata. */
enum { SG_METADATA_DYNAMIC = 0 };

/* Return values of the hooks (Envoy's FilterHeadersStatus / FilterDataStatus /
 * FilterTrailersStatus): Continue is 0 in each; the model reader also waits for a
 * request's whole body (StopIteration on its headers, StopIterationAndBuffer on its
 * data). */
enum { SG_CONTINUE = 0 };
enum { SG_HEADERS_STOP_ITERATION = 1 };
enum { SG_BODY_STOP_ITERATION_AND_BUFFER = 1 };
/* What the forwarded headers filter holds an attempt with (FilterDataStatus
 * StopIterationNoBuffer, FilterTrailersStatus StopIteration): nothing passes. */
enum { SG_BODY_STOP_ITERATION_NO_BUFFER = 3 };
enum { SG_TRAILERS_STOP_ITERATION = 1 };

/* ---- callbacks (Envoy's) ---- */

/* The `index`th value of header `key` (lower case) into *value; false when absent.
 * `count`, if not NULL, gets how many values the header has. */
bool envoy_dynamic_module_callback_http_get_header(sg_filter_envoy filter, int header_type,
                                                  sg_module_buffer key, sg_envoy_buffer *value,
                                                  size_t index, size_t *count);
/* Sets header `key` to `value`; an empty value (NULL or length 0) removes the header. */
bool envoy_dynamic_module_callback_http_set_header(sg_filter_envoy filter, int header_type,
                                                  sg_module_buffer key, sg_module_buffer value);
/* How many entries a header map has (a name with two values is two), and every entry, in
 * the map's order, into an array that long (pointers into Envoy's map, valid until the
 * map changes). */
size_t envoy_dynamic_module_callback_http_get_headers_size(sg_filter_envoy filter,
                                                           int header_type);
bool envoy_dynamic_module_callback_http_get_headers(sg_filter_envoy filter, int header_type,
                                                    sg_envoy_header *headers);
/* Adds a value of header `key` (copied), after any it has. */
bool envoy_dynamic_module_callback_http_add_header(sg_filter_envoy filter, int header_type,
                                                  sg_module_buffer key, sg_module_buffer value);
/* A body's slices: how many, then the slices into an array that long. */
size_t envoy_dynamic_module_callback_http_get_body_chunks_size(sg_filter_envoy filter,
                                                               int body_type);
bool envoy_dynamic_module_callback_http_get_body_chunks(sg_filter_envoy filter, int body_type,
                                                        sg_envoy_buffer *chunks);
/* Removes `bytes` from the front of a body; appends `data` (copied) at its end. */
bool envoy_dynamic_module_callback_http_drain_body(sg_filter_envoy filter, int body_type,
                                                  size_t bytes);
bool envoy_dynamic_module_callback_http_append_body(sg_filter_envoy filter, int body_type,
                                                   sg_module_buffer data);
/* A string of metadata (source: SG_METADATA_DYNAMIC) into *value; false when absent or
 * not a string. */
bool envoy_dynamic_module_callback_http_get_metadata_string(sg_filter_envoy filter, int source,
                                                           sg_module_buffer ns,
                                                           sg_module_buffer key,
                                                           sg_envoy_buffer *value);
/* Sets a number in the stream's dynamic metadata (the namespace made if absent). */
void envoy_dynamic_module_callback_http_set_dynamic_metadata_number(sg_filter_envoy filter,
                                                                    sg_module_buffer ns,
                                                                    sg_module_buffer key,
                                                                    double value);

/* A body's size in bytes. */
size_t envoy_dynamic_module_callback_http_get_body_size(sg_filter_envoy filter, int body_type);
/* Sets a string or a bool in the stream's dynamic metadata (the namespace made if absent). */
void envoy_dynamic_module_callback_http_set_dynamic_metadata_string(sg_filter_envoy filter,
                                                                    sg_module_buffer ns,
                                                                    sg_module_buffer key,
                                                                    sg_module_buffer value);
void envoy_dynamic_module_callback_http_set_dynamic_metadata_bool(sg_filter_envoy filter,
                                                                  sg_module_buffer ns,
                                                                  sg_module_buffer key,
                                                                  bool value);
/* The request matches its route again (after the metadata routes match on changed). */
void envoy_dynamic_module_callback_http_clear_route_cache(sg_filter_envoy filter);

#endif
