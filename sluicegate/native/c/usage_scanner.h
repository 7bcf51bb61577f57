/* The usage reader's scanning, without Envoy: the bytes of an answer in, the usage
 * values, the count of content events and (for a cut) the bytes to pass on out.
 *
 * One scanner per answer (not thread safe: Envoy runs a stream's hooks on one worker);
 * the names it matches (sg_names) are shared, read only once made.
 *
 * Two kinds:
 * - SG_JSON: the answer is one JSON document; `usage.<member>` numbers of its top-level
 *   object are taken at the end, only if the document is structurally whole.
 * - SG_SSE: an event stream; each event's data is a JSON document read the same way (and
 *   `response.usage.input_tokens` / `output_tokens`), committed at the event's end.
 *   SG_COUNT counts the `data:` lines that carry text (the stream usage Lua filter's
 *   rule, each line once); SG_CUT removes the first include_usage event (see
 *   sg_scanner_take).
 *
 * Exported with default visibility: the module (usage_filter.c) calls them, and tests
 * load libsluicegate_usage_scanner.so with ctypes. */
#ifndef SLUICEGATE_USAGE_SCANNER_H
#define SLUICEGATE_USAGE_SCANNER_H

#include <stdbool.h>
#include <stddef.h>

#define SG_EXPORT __attribute__((visibility("default")))

enum { SG_JSON = 0, SG_SSE = 1 };
enum { SG_COUNT = 1, SG_CUT = 2 };
/* sg_scanner_push's answer. */
enum { SG_OK = 0, SG_NOMEM = -1 };

#define SG_MAX_MEMBERS 8
#define SG_MAX_NAME 32 /* a member name's bytes, at most */
/* Output keys: the members, and the Responses API's two if not among them. */
#define SG_MAX_SLOTS (SG_MAX_MEMBERS + 2)

typedef struct sg_names sg_names;
typedef struct sg_scanner sg_scanner;

/* The members (`a,b,c`: 1 to SG_MAX_MEMBERS names of 1 to SG_MAX_NAME - 1 bytes each,
 * none repeated), or NULL when malformed or out of memory. */
SG_EXPORT sg_names *sg_names_new(const char *members, size_t length);
SG_EXPORT void sg_names_free(sg_names *names);
/* How many values a scanner of `names` reports, and the metadata key of each. */
SG_EXPORT size_t sg_names_slots(const sg_names *names);
SG_EXPORT const char *sg_names_key(const sg_names *names, size_t slot);

/* A scanner of kind SG_JSON or SG_SSE (flags: SG_COUNT | SG_CUT, SSE only), reading for
 * `names` (which must outlive it); NULL when out of memory. */
SG_EXPORT sg_scanner *sg_scanner_new(const sg_names *names, int kind, int flags);
SG_EXPORT void sg_scanner_free(sg_scanner *scanner);

/* The next bytes of the answer. With SG_CUT armed they are also kept until
 * sg_scanner_take. SG_NOMEM: the cut could not keep them; it is disarmed (the bytes
 * were still scanned for usage and count) and the caller passes them on itself, after
 * sg_scanner_held's bytes. */
SG_EXPORT int sg_scanner_push(sg_scanner *scanner, const char *bytes, size_t length);
/* The end of the answer: a JSON answer's usage is committed if whole; a stream's last
 * line without its end is counted; a cut's held bytes are all released. */
SG_EXPORT void sg_scanner_finish(sg_scanner *scanner);

/* The cut, after the pushes of one chunk (none for a hook without bytes: an empty data
 * frame, trailers): 0 when the chunk passes as it came; 1 when it is replaced by *out
 * (*length bytes, valid until the next push or take), the rest held back. */
SG_EXPORT int sg_scanner_take(sg_scanner *scanner, const char **out, size_t *length);
/* The bytes held back from earlier chunks (for the SG_NOMEM case), and forgets them. */
SG_EXPORT void sg_scanner_held(sg_scanner *scanner, const char **out, size_t *length);
/* Whether the cut has removed the usage event. */
SG_EXPORT bool sg_scanner_cut_done(const sg_scanner *scanner);

/* The values committed so far: a bit per slot whose value changed since the last call
 * (then forgotten), and each slot's value. */
SG_EXPORT unsigned sg_scanner_changed(sg_scanner *scanner);
SG_EXPORT bool sg_scanner_value(const sg_scanner *scanner, size_t slot, double *value);
/* Content events counted (SG_COUNT). */
SG_EXPORT size_t sg_scanner_count(const sg_scanner *scanner);

#endif
