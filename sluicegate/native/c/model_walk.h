/* The model reader's reading of a request body, apart from Envoy (model_filter.c talks to
 * Envoy). The rules are the Lua model reader's
 * (sluicegate/xds/translate/model_reader.py), which are the routing stage's
 * (filters/request_facts.py) for the members both read. */
#ifndef SLUICEGATE_MODEL_WALK_H
#define SLUICEGATE_MODEL_WALK_H

#include <stdbool.h>
#include <stddef.h>

/* At most this many members are read (wire.BODY_READ_MEMBERS), each named in fewer than
 * SG_MAX_MEMBER_NAME bytes. */
#define SG_MAX_MEMBERS 32
#define SG_MAX_MEMBER_NAME 64

/* A raw JSON value in the body: its first byte and length; start NULL when absent. */
typedef struct {
  const char *start;
  size_t length;
} sg_span;

/* The member names read, in one string of comma-separated names. */
typedef struct sg_members sg_members;
sg_members *sg_members_new(const char *names, size_t length);
void sg_members_free(sg_members *members);
/* The index of `name` among them, or -1. */
int sg_member_index(const sg_members *members, const char *name, size_t length);
/* The name of member `m` (an index among them) and, in *length, its length. */
const char *sg_member_name(const sg_members *members, int m, size_t *length);

/* What the walk found: each member's first value, and the first member repeated (-1:
 * none). */
typedef struct {
  sg_span found[SG_MAX_MEMBERS];
  int repeated;
} sg_walk;

/* Walks the top level of the body s[0..n): NULL and `out` filled, or the problem of a
 * body the reader refuses: "json" (not JSON as the reader reads it: broken structure,
 * trailing text, a key with an escape or a non-ASCII byte, a key that is a read member
 * in another case) or "object" (one whole JSON value that is not an object). */
const char *sg_walk_body(const sg_members *members, const char *s, size_t n, sg_walk *out);

/* Lua's %s: the bytes a scalar ends at (with , } and ]), and what a class and a query
 * parameter's name are trimmed of. */
bool sg_is_lua_space(char c);
/* Whether a raw value is exactly `word`. */
bool sg_raw_is(sg_span v, const char *word);
/* Whether raw[0..n) is all of one JSON number. */
bool sg_is_number(const char *raw, size_t n);
/* A member's whole number from 1 to `most`: 0 when absent or null, -1 for anything else. */
long long sg_counted(sg_span raw, long long most);
/* Whether a log-probabilities member asks for them: present and not false, null, "",
 * a zero number, [] or {}. */
bool sg_asks_logprobs(sg_span raw);
/* The input estimate (filters/estimate.py) over these values' bytes: ASCII bytes / 4,
 * rounded up once, plus, per value, the larger of its UTF-8 lead bytes and its other
 * non-ASCII bytes / 4 rounded up. */
long long sg_input_estimate(const sg_span *values, size_t count);
/* Whether the path, without its query and trailing slashes, ends with one of the
 * comma-separated suffixes. */
bool sg_endpoint_in(const char *path, size_t path_length, const char *suffixes,
                    size_t suffixes_length);

#endif
