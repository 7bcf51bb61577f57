/* The model reader's walk over a request body's top level (model_walk.h).
 *
 * A string is skipped to its closing quote (backslashes counted), a nested value by its
 * brackets, and nothing is parsed: the cost grows with the body's structure, not its
 * text. The rules are the Lua reader's, line for line (xds/translate/model_reader.py);
 * where the two differ it is said here. */
#include "model_walk.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Nesting deeper than this is refused as not JSON (the Lua reader has no bound; no
 * provider's parser takes such a body). Its stack of closers is one bit a level. */
#define MAX_DEPTH 65536

struct sg_members {
  size_t count;
  char *names[SG_MAX_MEMBERS];
  size_t lengths[SG_MAX_MEMBERS];
};

void sg_members_free(sg_members *members) {
  if (members == NULL) return;
  for (size_t m = 0; m < members->count; m++) free(members->names[m]);
  free(members);
}

sg_members *sg_members_new(const char *names, size_t length) {
  sg_members *members = calloc(1, sizeof *members);
  if (members == NULL) return NULL;
  size_t start = 0;
  for (size_t i = 0; i <= length; i++) {
    if (i < length && names[i] != ',') continue;
    size_t size = i - start;
    if (size == 0 || size >= SG_MAX_MEMBER_NAME || members->count == SG_MAX_MEMBERS) goto wrong;
    char *name = malloc(size);
    if (name == NULL) goto wrong;
    memcpy(name, names + start, size);
    members->names[members->count] = name;
    members->lengths[members->count++] = size;
    start = i + 1;
  }
  return members;
wrong:
  sg_members_free(members);
  return NULL;
}

int sg_member_index(const sg_members *members, const char *name, size_t length) {
  for (size_t m = 0; m < members->count; m++)
    if (members->lengths[m] == length && memcmp(members->names[m], name, length) == 0)
      return (int)m;
  return -1;
}

const char *sg_member_name(const sg_members *members, int m, size_t *length) {
  *length = members->lengths[m];
  return members->names[m];
}

bool sg_is_lua_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* JSON's whitespace, which the walk skips between tokens. */
static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

static size_t skip_space(const char *s, size_t n, size_t i) {
  while (i < n && is_space(s[i])) i++;
  return i;
}

/* The index of the quote closing the string opened at s[i], or n. */
static size_t string_end(const char *s, size_t n, size_t i) {
  size_t j = i + 1;
  for (;;) {
    const char *q = j < n ? memchr(s + j, '"', n - j) : NULL;
    if (q == NULL) return n;
    j = (size_t)(q - s);
    size_t k = j;
    while (k > i + 1 && s[k - 1] == '\\') k--;
    if ((j - k) % 2 == 0) return j;
    j++;
  }
}

/* The index of the last byte of the value starting at s[i], or n when it has none. */
static size_t value_end(const char *s, size_t n, size_t i) {
  char c = s[i];
  if (c == '"') return string_end(s, n, i);
  if (c == '{' || c == '[') {
    uint64_t braces[MAX_DEPTH / 64]; /* bit set: the level's closer is '}' */
    size_t depth = 0;
    for (size_t j = i; j < n; j++) {
      c = s[j];
      if (c == '"') {
        j = string_end(s, n, j);
        if (j == n) return n;
      } else if (c == '{' || c == '[') {
        if (depth == MAX_DEPTH) return n;
        uint64_t bit = (uint64_t)1 << (depth % 64);
        if (c == '{') braces[depth / 64] |= bit;
        else braces[depth / 64] &= ~bit;
        depth++;
      } else if (c == '}' || c == ']') {
        if (depth == 0) return n;
        depth--;
        bool brace = (braces[depth / 64] >> (depth % 64)) & 1;
        if (brace != (c == '}')) return n;
        if (depth == 0) return j;
      }
    }
    return n;
  }
  size_t j = i;
  while (j < n && s[j] != ',' && s[j] != '}' && s[j] != ']' && !sg_is_lua_space(s[j])) j++;
  if (j == i) return n;
  return j - 1; /* a scalar may end the text */
}

bool sg_is_number(const char *s, size_t n) {
  size_t i = 0;
  if (i < n && s[i] == '-') i++;
  if (i < n && s[i] == '0') {
    i++;
  } else if (i < n && s[i] >= '1' && s[i] <= '9') {
    while (i < n && s[i] >= '0' && s[i] <= '9') i++;
  } else {
    return false;
  }
  if (i + 1 < n && s[i] == '.' && s[i + 1] >= '0' && s[i + 1] <= '9') {
    i++;
    while (i < n && s[i] >= '0' && s[i] <= '9') i++;
  }
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    size_t k = i + 1;
    if (k < n && (s[k] == '+' || s[k] == '-')) k++;
    if (k < n && s[k] >= '0' && s[k] <= '9') {
      while (k < n && s[k] >= '0' && s[k] <= '9') k++;
      i = k;
    }
  }
  return i == n;
}

bool sg_raw_is(sg_span v, const char *word) {
  size_t len = strlen(word);
  return v.start != NULL && v.length == len && memcmp(v.start, word, len) == 0;
}

/* A top level that is not an object: "object" when it is one whole JSON value. */
static const char *not_object(const char *s, size_t n, size_t i) {
  size_t stop = value_end(s, n, i);
  if (stop == n || skip_space(s, n, stop + 1) != n) return "json";
  sg_span raw = {s + i, stop - i + 1};
  char c = s[i];
  if (c == '"' || c == '[' || sg_raw_is(raw, "true") || sg_raw_is(raw, "false") ||
      sg_raw_is(raw, "null") || sg_is_number(raw.start, raw.length))
    return "object";
  return "json";
}

/* Whether a key read in ASCII lower case is a member (and so would be read as one by a
 * parser that folds case, as Go's encoding/json does). */
static bool folded_member(const sg_members *members, const char *key, size_t len) {
  char lower[SG_MAX_MEMBER_NAME];
  if (len >= sizeof lower) return false; /* longer than any member */
  for (size_t k = 0; k < len; k++)
    lower[k] = (key[k] >= 'A' && key[k] <= 'Z') ? (char)(key[k] + 32) : key[k];
  return sg_member_index(members, lower, len) >= 0;
}

const char *sg_walk_body(const sg_members *members, const char *s, size_t n, sg_walk *out) {
  memset(out, 0, sizeof *out);
  out->repeated = -1;
  size_t i = skip_space(s, n, 0);
  if (i == n) return "json";
  if (s[i] != '{') return not_object(s, n, i);
  i = skip_space(s, n, i + 1);
  if (i < n && s[i] == '}') return skip_space(s, n, i + 1) != n ? "json" : NULL;
  for (;;) {
    if (i == n || s[i] != '"') return "json";
    size_t e = string_end(s, n, i);
    if (e == n) return "json";
    const char *key = s + i + 1;
    size_t key_len = e - i - 1;
    for (size_t k = 0; k < key_len; k++)
      if (key[k] == '\\' || (unsigned char)key[k] >= 128) return "json";
    int m = sg_member_index(members, key, key_len);
    if (m < 0 && folded_member(members, key, key_len)) return "json";
    i = skip_space(s, n, e + 1);
    if (i == n || s[i] != ':') return "json";
    size_t start = skip_space(s, n, i + 1);
    if (start == n) return "json";
    size_t stop = value_end(s, n, start);
    if (stop == n) return "json";
    if (m >= 0) {
      if (out->found[m].start != NULL) {
        if (out->repeated < 0) out->repeated = m;
      } else {
        out->found[m] = (sg_span){s + start, stop - start + 1};
      }
    }
    i = skip_space(s, n, stop + 1);
    if (i == n) return "json";
    if (s[i] == '}') return skip_space(s, n, i + 1) != n ? "json" : NULL;
    if (s[i] != ',') return "json";
    i = skip_space(s, n, i + 1);
  }
}

long long sg_counted(sg_span raw, long long most) {
  if (raw.start == NULL || sg_raw_is(raw, "null")) return 0;
  if (raw.length > 15 || raw.start[0] < '1' || raw.start[0] > '9') return -1;
  long long value = 0;
  for (size_t k = 0; k < raw.length; k++) {
    if (raw.start[k] < '0' || raw.start[k] > '9') return -1;
    value = value * 10 + (raw.start[k] - '0');
  }
  return value <= most ? value : -1;
}

/* Whether a JSON number's value is zero, as Lua's tonumber reads it (a tiny one
 * underflows to zero). */
static bool number_is_zero(const char *s, size_t n) {
  char local[64], *text = n < sizeof local ? local : malloc(n + 1);
  if (text == NULL) return false; /* no memory: read as asked, the safe side */
  memcpy(text, s, n);
  text[n] = 0;
  bool zero = strtod(text, NULL) == 0;
  if (text != local) free(text);
  return zero;
}

/* Lua's %s inside [] and {}: the pattern "^%[%s*%]$". */
static bool empty_brackets(sg_span raw, char open, char close) {
  if (raw.length < 2 || raw.start[0] != open || raw.start[raw.length - 1] != close)
    return false;
  for (size_t k = 1; k + 1 < raw.length; k++)
    if (!sg_is_lua_space(raw.start[k])) return false;
  return true;
}

bool sg_asks_logprobs(sg_span raw) {
  if (raw.start == NULL || sg_raw_is(raw, "false") || sg_raw_is(raw, "null") || sg_raw_is(raw, "\"\""))
    return false;
  /* The Lua reader asks tonumber(raw) ~= 0, which reads hexadecimal too: a body with a
   * hexadecimal number is not JSON, and its provider refuses it. */
  if (sg_is_number(raw.start, raw.length) && number_is_zero(raw.start, raw.length))
    return false;
  return !empty_brackets(raw, '[', ']') && !empty_brackets(raw, '{', '}');
}

long long sg_input_estimate(const sg_span *values, size_t count) {
  long long ascii = 0, other = 0;
  for (size_t v = 0; v < count; v++) {
    if (values[v].start == NULL) continue;
    long long high = 0, leads = 0;
    for (size_t k = 0; k < values[v].length; k++) {
      unsigned char c = (unsigned char)values[v].start[k];
      high += c >= 128;
      leads += c >= 192;
    }
    ascii += (long long)values[v].length - high;
    /* Bytes that start no character (not UTF-8, which a provider may still take)
     * count as four to a token. */
    long long quarter = (high + 3) / 4;
    other += leads > quarter ? leads : quarter;
  }
  return (ascii + 3) / 4 + other;
}

bool sg_endpoint_in(const char *path, size_t path_length, const char *suffixes,
                    size_t suffixes_length) {
  if (path == NULL) return false;
  size_t n = 0;
  while (n < path_length && path[n] != '?') n++;
  while (n > 0 && path[n - 1] == '/') n--;
  size_t start = 0;
  for (size_t i = 0; i <= suffixes_length; i++) {
    if (i < suffixes_length && suffixes[i] != ',') continue;
    size_t len = i - start;
    if (len > 0 && n >= len && memcmp(path + n - len, suffixes + start, len) == 0) return true;
    start = i + 1;
  }
  return false;
}
