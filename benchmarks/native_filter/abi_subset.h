/* What sluicegate_native.c uses of Envoy's dynamic module ABI (Envoy 1.40, HTTP
 * filters): the product's declarations (sluicegate/native/c/envoy_abi.h, checked against
 * the envoy binary's symbols and argument registers), which since session 20 hold the
 * request side too (the product's model reader, model_filter.c, uses it).
 *
 * Hooks are ours (exported by the module, called by Envoy); callbacks are Envoy's. */
#ifndef SLUICEGATE_ABI_SUBSET_H
#define SLUICEGATE_ABI_SUBSET_H

#include "../../sluicegate/native/c/envoy_abi.h"

enum { SG_HEADERS_CONTINUE = 0 };
enum { SG_BODY_CONTINUE = 0 };
enum { SG_TRAILERS_CONTINUE = 0 };

#endif
