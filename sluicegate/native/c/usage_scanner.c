/* The usage reader's scanning (usage_scanner.h says what; this file how).
 *
 * Everything is a state machine fed a byte (or a run of bytes) at a time, so a chunk may
 * end anywhere: inside a number, a key, a line end, a pattern. Memory per scanner is
 * fixed, but for the cut's held bytes (bounded by CUT_MAX_HELD). */
#include "usage_scanner.h"

#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- names --------------------------------------------------------------------- */

/* The Responses API's usage, `response.usage.<these>`: fixed by the API, so not
 * configured (the metadata keys are the same words). */
static const char *const RESPONSE_MEMBERS[2] = {"input_tokens", "output_tokens"};

struct sg_names {
  size_t members; /* slots [0, members) are usage.<member> */
  size_t slots;
  char keys[SG_MAX_SLOTS][SG_MAX_NAME];
  size_t lengths[SG_MAX_SLOTS];
  size_t response_slot[2]; /* where response.usage.<RESPONSE_MEMBERS[i]> goes */
};

static int find_key(const sg_names *names, const char *key, size_t length) {
  for (size_t slot = 0; slot < names->slots; slot++)
    if (names->lengths[slot] == length && memcmp(names->keys[slot], key, length) == 0)
      return (int)slot;
  return -1;
}

static bool add_key(sg_names *names, const char *key, size_t length) {
  if (length == 0 || length >= SG_MAX_NAME || names->slots == SG_MAX_SLOTS ||
      find_key(names, key, length) >= 0)
    return false;
  memcpy(names->keys[names->slots], key, length);
  names->keys[names->slots][length] = 0;
  names->lengths[names->slots++] = length;
  return true;
}

SG_EXPORT sg_names *sg_names_new(const char *members, size_t length) {
  sg_names *names = calloc(1, sizeof *names);
  if (names == NULL) return NULL;
  size_t start = 0;
  for (size_t i = 0; i <= length; i++) {
    if (i < length && members[i] != ',') continue;
    if (names->slots == SG_MAX_MEMBERS || !add_key(names, members + start, i - start)) {
      free(names);
      return NULL;
    }
    start = i + 1;
  }
  names->members = names->slots;
  for (size_t r = 0; r < 2; r++) {
    size_t len = strlen(RESPONSE_MEMBERS[r]);
    int slot = find_key(names, RESPONSE_MEMBERS[r], len);
    if (slot < 0) {
      add_key(names, RESPONSE_MEMBERS[r], len); /* room: SG_MAX_SLOTS leaves two */
      slot = (int)names->slots - 1;
    }
    names->response_slot[r] = (size_t)slot;
  }
  return names;
}

SG_EXPORT void sg_names_free(sg_names *names) { free(names); }
SG_EXPORT size_t sg_names_slots(const sg_names *names) { return names->slots; }
SG_EXPORT const char *sg_names_key(const sg_names *names, size_t slot) {
  return slot < names->slots ? names->keys[slot] : NULL;
}

/* ---- a streaming JSON reader ----------------------------------------------------- */

/* Structure checked: brackets nest and match, keys are strings followed by `:`,
 * members and elements are separated by `,`, literals are true/false/null, numbers
 * have JSON's form, and after the top-level value only whitespace. Not checked: control
 * bytes inside strings, the form of escapes (`\x`, `\u` without four hex digits pass)
 * and UTF-8. A key written with an escape (`"us\u0061ge"`) is not recognised. */

#define JSON_MAX_DEPTH 512
#define TOKEN_MAX 64 /* a longer number is not a count: read past, not taken */

enum json_state { J_VALUE, J_FIRST_KEY, J_KEY, J_COLON, J_AFTER, J_FIRST_ELEM, J_DONE, J_ERROR };
enum json_token { T_NONE, T_STRING, T_KEY, T_NUMBER, T_LITERAL };
/* What the object at a depth is, for the usage paths (depths 1 to 3 only). */
enum json_context { C_OTHER, C_TOP, C_USAGE, C_RESPONSE, C_RESPONSE_USAGE };
/* What the value after the key just read is. */
enum json_pending { P_NONE, P_USAGE, P_RESPONSE, P_RESPONSE_USAGE, P_MEMBER, P_RESPONSE_MEMBER };

typedef struct {
  uint8_t state, token, pending, pending_index;
  uint8_t context[4];
  bool escaped, key_escaped, token_long, top_object;
  unsigned depth;
  uint8_t objects[JSON_MAX_DEPTH / 8]; /* a bit per depth: an object (else an array) */
  char token_text[TOKEN_MAX];
  size_t token_length;
  /* Staged until the document is whole. */
  double usage[SG_MAX_MEMBERS];
  unsigned usage_mask;
  double response[2];
  unsigned response_mask;
} json_t;

static void json_reset(json_t *j) { memset(j, 0, sizeof *j); }

static bool json_whole(const json_t *j) { return j->state == J_DONE && j->top_object; }

static bool is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static bool in_object(const json_t *j) {
  unsigned d = j->depth;
  return (j->objects[d / 8] >> (d % 8)) & 1;
}

static enum json_context context_here(const json_t *j) {
  return j->depth < 4 ? (enum json_context)j->context[j->depth] : C_OTHER;
}

static void fail(json_t *j) { j->state = J_ERROR; }

static void after_value(json_t *j) {
  j->pending = P_NONE;
  j->state = j->depth == 0 ? J_DONE : J_AFTER;
}

static void open_container(json_t *j, bool object) {
  if (j->depth + 1 >= JSON_MAX_DEPTH) return fail(j);
  if (j->depth == 0 && object) j->top_object = true;
  unsigned d = ++j->depth;
  if (object)
    j->objects[d / 8] |= (uint8_t)(1u << (d % 8));
  else
    j->objects[d / 8] &= (uint8_t) ~(1u << (d % 8));
  if (d < 4) {
    enum json_context context = C_OTHER;
    if (object && d == 1) context = C_TOP;
    if (object && j->pending == P_USAGE) context = C_USAGE;
    if (object && j->pending == P_RESPONSE) context = C_RESPONSE;
    if (object && j->pending == P_RESPONSE_USAGE) context = C_RESPONSE_USAGE;
    j->context[d] = (uint8_t)context;
  }
  j->pending = P_NONE;
  j->state = object ? J_FIRST_KEY : J_FIRST_ELEM;
}

static void close_container(json_t *j, bool object) {
  if (j->depth == 0 || in_object(j) != object) return fail(j);
  j->depth--;
  after_value(j);
}

static bool token_is(const json_t *j, const char *word) {
  size_t len = strlen(word);
  return !j->token_long && j->token_length == len && memcmp(j->token_text, word, len) == 0;
}

/* What a key means where it stands; a later key replaces what an earlier one staged. */
static void read_key(json_t *j, const sg_names *names) {
  j->pending = P_NONE;
  if (j->key_escaped || j->token_long) return;
  switch (context_here(j)) {
    case C_TOP:
      if (token_is(j, "usage")) j->pending = P_USAGE, j->usage_mask = 0;
      if (token_is(j, "response")) j->pending = P_RESPONSE, j->response_mask = 0;
      return;
    case C_RESPONSE:
      if (token_is(j, "usage")) j->pending = P_RESPONSE_USAGE, j->response_mask = 0;
      return;
    case C_USAGE:
      for (size_t m = 0; m < names->members; m++)
        if (token_is(j, names->keys[m])) {
          j->pending = P_MEMBER, j->pending_index = (uint8_t)m;
          j->usage_mask &= ~(1u << m);
        }
      return;
    case C_RESPONSE_USAGE:
      for (size_t r = 0; r < 2; r++)
        if (token_is(j, RESPONSE_MEMBERS[r])) {
          j->pending = P_RESPONSE_MEMBER, j->pending_index = (uint8_t)r;
          j->response_mask &= ~(1u << r);
        }
      return;
    default:
      return;
  }
}

/* JSON's number form: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static bool number_form(const char *s, size_t n) {
  size_t i = 0;
  if (i < n && s[i] == '-') i++;
  if (i < n && s[i] == '0') {
    i++;
  } else if (i < n && s[i] >= '1' && s[i] <= '9') {
    while (i < n && is_digit(s[i])) i++;
  } else {
    return false;
  }
  if (i < n && s[i] == '.') {
    if (++i == n || !is_digit(s[i])) return false;
    while (i < n && is_digit(s[i])) i++;
  }
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    if (++i < n && (s[i] == '+' || s[i] == '-')) i++;
    if (i == n || !is_digit(s[i])) return false;
    while (i < n && is_digit(s[i])) i++;
  }
  return i == n;
}

/* A number of JSON's form as a double, without strtod (whose decimal point follows the
 * process's locale); false when it is beyond a double's range (not a count: not taken).
 * Whole numbers up to 2^53 are exact; others near enough. At most TOKEN_MAX digits, so
 * the mantissa is below 1e64 and the work bounded: the exponent is clamped to +-400
 * before scaling (past either end the answer is the same: out of range, or 0). */
static bool number_value(const char *s, size_t n, double *value) {
  size_t i = 0;
  bool negative = s[0] == '-';
  if (negative) i++;
  double mantissa = 0;
  long exponent = 0;
  for (; i < n && is_digit(s[i]); i++) mantissa = mantissa * 10 + (s[i] - '0');
  if (i < n && s[i] == '.')
    for (i++; i < n && is_digit(s[i]); i++, exponent--) mantissa = mantissa * 10 + (s[i] - '0');
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    bool down = s[++i] == '-';
    if (s[i] == '+' || s[i] == '-') i++;
    long e = 0;
    for (; i < n && is_digit(s[i]); i++)
      if (e < 100000) e = e * 10 + (s[i] - '0');
    exponent += down ? -e : e;
  }
  if (mantissa == 0) exponent = 0; /* 0e99999 is 0 */
  if (exponent > 400) return false; /* a mantissa of 1 or more: over 1e400 */
  if (exponent < -400) exponent = -400; /* under 1e-336: 0, as at -400 */
  for (; exponent > 0; exponent--) mantissa *= 10;
  for (; exponent < 0; exponent++) mantissa /= 10;
  if (mantissa > DBL_MAX) return false; /* infinity */
  *value = negative ? -mantissa : mantissa;
  return true;
}

static void end_scalar(json_t *j) {
  if (j->token == T_LITERAL) {
    if (!token_is(j, "true") && !token_is(j, "false") && !token_is(j, "null")) return fail(j);
  } else if (!j->token_long) {
    if (!number_form(j->token_text, j->token_length)) return fail(j);
    /* A value only where one is read: a usage member's. */
    double value;
    bool member = j->pending == P_MEMBER || j->pending == P_RESPONSE_MEMBER;
    if (member && number_value(j->token_text, j->token_length, &value)) {
      if (j->pending == P_MEMBER) {
        j->usage[j->pending_index] = value;
        j->usage_mask |= 1u << j->pending_index;
      } else {
        j->response[j->pending_index] = value;
        j->response_mask |= 1u << j->pending_index;
      }
    }
  }
  j->token = T_NONE;
  after_value(j);
}

static void start_token(json_t *j, uint8_t token, char first) {
  j->token = token;
  j->token_length = 0;
  j->token_long = false;
  j->key_escaped = false;
  j->escaped = false;
  if (token == T_NUMBER || token == T_LITERAL) j->token_text[j->token_length++] = first;
}

static void start_value(json_t *j, char c) {
  if (c == '{') return open_container(j, true);
  if (c == '[') return open_container(j, false);
  if (c == '"') return start_token(j, T_STRING, c);
  if (c == '-' || is_digit(c)) return start_token(j, T_NUMBER, c);
  if (c == 't' || c == 'f' || c == 'n') return start_token(j, T_LITERAL, c);
  fail(j);
}

/* A structural byte: outside strings and scalars. */
static void structural(json_t *j, char c) {
  if (is_json_space(c)) return;
  switch (j->state) {
    case J_FIRST_ELEM:
      if (c == ']') return close_container(j, false);
      return start_value(j, c);
    case J_VALUE:
      return start_value(j, c);
    case J_FIRST_KEY:
      if (c == '}') return close_container(j, true);
      /* fall through */
    case J_KEY:
      if (c == '"') return start_token(j, T_KEY, c);
      return fail(j);
    case J_COLON:
      if (c == ':') {
        j->state = J_VALUE;
        return;
      }
      return fail(j);
    case J_AFTER:
      if (c == ',') {
        j->state = in_object(j) ? J_KEY : J_VALUE;
        return;
      }
      if (c == '}' || c == ']') return close_container(j, c == '}');
      return fail(j);
    default: /* J_DONE: only whitespace may follow; J_ERROR stays */
      return fail(j);
  }
}

static bool scalar_byte(char c) {
  return is_digit(c) || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E' ||
         (c >= 'a' && c <= 'z');
}

static void keep_token_byte(json_t *j, char c) {
  if (j->token_length < TOKEN_MAX)
    j->token_text[j->token_length++] = c;
  else
    j->token_long = true;
}

/* Inside a string: returns the bytes consumed (a run without quote or backslash at
 * once, for a value; a key's bytes are kept). */
static size_t string_bytes(json_t *j, const sg_names *names, const char *p, size_t n) {
  if (j->escaped) {
    j->escaped = false;
    if (j->token == T_KEY) j->key_escaped = true;
    return 1;
  }
  if (p[0] == '\\') {
    j->escaped = true;
    return 1;
  }
  if (p[0] == '"') {
    bool key = j->token == T_KEY;
    j->token = T_NONE;
    if (key) {
      read_key(j, names);
      j->state = J_COLON;
    } else {
      after_value(j);
    }
    return 1;
  }
  size_t i = 0;
  while (i < n && p[i] != '"' && p[i] != '\\') {
    if (j->token == T_KEY) keep_token_byte(j, p[i]);
    i++;
  }
  return i;
}

static void json_feed(json_t *j, const sg_names *names, const char *p, size_t n) {
  size_t i = 0;
  while (i < n && j->state != J_ERROR) {
    if (j->token == T_STRING || j->token == T_KEY) {
      i += string_bytes(j, names, p + i, n - i);
      continue;
    }
    char c = p[i++];
    if (j->token == T_NUMBER || j->token == T_LITERAL) {
      if (scalar_byte(c)) {
        keep_token_byte(j, c);
        continue;
      }
      end_scalar(j); /* then c is structural */
      if (j->state == J_ERROR) return;
    }
    structural(j, c);
  }
}

/* ---- Lua patterns, streamed -------------------------------------------------------- */

/* The last bytes seen, to ask whether they end with a literal (each pattern here ends
 * with `:`, so it is asked only there). */
typedef struct {
  char bytes[32];
  uint32_t seen;
} ring_t;

static void ring_push(ring_t *r, char c) { r->bytes[r->seen++ & 31] = c; }

static bool ring_ends_with(const ring_t *r, const char *literal, size_t len) {
  if (r->seen < len) return false;
  for (size_t k = 0; k < len; k++)
    if (r->bytes[(r->seen - 1 - k) & 31] != literal[len - 1 - k]) return false;
  return true;
}

/* Lua's %s. */
static bool is_lua_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* The keys of text (the Lua's KEYS); the last is `"delta":`, special for the Responses API. */
static const char *const TEXT_KEYS[] = {"\"content\":", "\"reasoning_content\":", "\"reasoning\":",
                                        "\"refusal\":", "\"arguments\":",         "\"text\":",
                                        "\"delta\":"};
#define TEXT_KEY_COUNT (sizeof TEXT_KEYS / sizeof *TEXT_KEYS)
#define DELTA_KEY (TEXT_KEY_COUNT - 1)
static const char TYPE_KEY[] = "\"type\":";
static const char RESPONSE_PREFIX[] = "\"response.";

/* The Lua's has_text on one `data:` line, a byte at a time:
 * - has_string(key): some `key` followed by %s*, a quote and a byte that is not a quote;
 * - the first `"type":%s*"response.` decides alone: the type's text up to the next quote
 *   must end with `.delta`, and has_string(`"delta":`) must hold. */
enum { AFTER_NONE, AFTER_KEY, AFTER_QUOTE };
enum { TYPE_SEARCH, TYPE_SPACE, TYPE_PREFIX, TYPE_TEXT, TYPE_DECIDED };

typedef struct {
  ring_t ring;
  uint8_t after, type, prefix_at;
  bool after_delta, any_text, delta_text, type_found, type_delta;
} text_t;

static void text_reset(text_t *t) { memset(t, 0, sizeof *t); }

static void text_after_key(text_t *t, char c) {
  if (t->after == AFTER_KEY) {
    if (c == '"')
      t->after = AFTER_QUOTE;
    else if (!is_lua_space(c))
      t->after = AFTER_NONE;
  } else if (t->after == AFTER_QUOTE) {
    if (c != '"') {
      t->any_text = true;
      if (t->after_delta) t->delta_text = true;
    }
    t->after = AFTER_NONE;
  }
}

static void text_type(text_t *t, char c) {
  if (t->type == TYPE_SPACE) {
    if (c == '"')
      t->type = TYPE_PREFIX, t->prefix_at = 1;
    else if (!is_lua_space(c))
      t->type = TYPE_SEARCH;
  } else if (t->type == TYPE_PREFIX) {
    if (c != RESPONSE_PREFIX[t->prefix_at])
      t->type = TYPE_SEARCH;
    else if (++t->prefix_at == sizeof RESPONSE_PREFIX - 1)
      t->type = TYPE_TEXT, t->type_found = true;
  } else if (t->type == TYPE_TEXT && c == '"') {
    t->type_delta = ring_ends_with(&t->ring, ".delta", 6); /* the bytes before the quote */
    t->type = TYPE_DECIDED;
  }
}

static void text_byte(text_t *t, char c) {
  text_after_key(t, c);
  text_type(t, c);
  ring_push(&t->ring, c);
  if (c != ':') return;
  for (size_t k = 0; k < TEXT_KEY_COUNT; k++)
    if (ring_ends_with(&t->ring, TEXT_KEYS[k], strlen(TEXT_KEYS[k]))) {
      t->after = AFTER_KEY;
      t->after_delta = k == DELTA_KEY;
      break;
    }
  if (t->type == TYPE_SEARCH && ring_ends_with(&t->ring, TYPE_KEY, sizeof TYPE_KEY - 1))
    t->type = TYPE_SPACE;
}

static bool text_result(const text_t *t) {
  return t->type_found ? t->type_delta && t->delta_text : t->any_text;
}

/* The Lua's include_usage event test, per event: `"usage":%s*{` and
 * `"choices":%s*%[%s*%]` both somewhere in it. */
enum { USAGE_SEARCH, USAGE_SPACE, USAGE_FOUND };
enum { CHOICES_SEARCH, CHOICES_SPACE, CHOICES_OPEN, CHOICES_FOUND };

typedef struct {
  ring_t ring;
  uint8_t usage, choices;
} usage_event_t;

static void usage_event_byte(usage_event_t *u, char c) {
  if (u->usage == USAGE_SPACE && !is_lua_space(c)) u->usage = c == '{' ? USAGE_FOUND : USAGE_SEARCH;
  if (u->choices == CHOICES_SPACE && !is_lua_space(c))
    u->choices = c == '[' ? CHOICES_OPEN : CHOICES_SEARCH;
  else if (u->choices == CHOICES_OPEN && !is_lua_space(c))
    u->choices = c == ']' ? CHOICES_FOUND : CHOICES_SEARCH;
  ring_push(&u->ring, c);
  if (c != ':') return;
  if (u->usage == USAGE_SEARCH && ring_ends_with(&u->ring, "\"usage\":", 8)) u->usage = USAGE_SPACE;
  if (u->choices == CHOICES_SEARCH && ring_ends_with(&u->ring, "\"choices\":", 10))
    u->choices = CHOICES_SPACE;
}

static bool usage_event_found(const usage_event_t *u) {
  return u->usage == USAGE_FOUND && u->choices == CHOICES_FOUND;
}

/* ---- the scanner ----------------------------------------------------------------- */

/* A held event longer than this is passed on and the cut given up (the Lua holds without
 * bound): no include_usage event is near this size. */
#define CUT_MAX_HELD (1u << 20)
static const char DONE_LINE[] = "data: [DONE]";

enum { LINE_START, LINE_FIELD, LINE_VALUE_START, LINE_VALUE, LINE_IGNORE };
enum { CUT_OFF, CUT_ARMED, CUT_SWALLOW_LF };

typedef struct {
  uint8_t state;
  bool found, found_cr;       /* the usage event, whole; whether it ended with a CR */
  bool last_end_cr;           /* the last event ended at a CR (a LF next belongs to it) */
  char *buf;                  /* held bytes, then this chunk's */
  size_t length, capacity;
  size_t consumed;            /* bytes of buf given out by the last take */
  size_t held;                /* bytes held over from earlier chunks */
  size_t event_start, boundary, cut_start, cut_end;
  usage_event_t event;
} cut_t;

struct sg_scanner {
  const sg_names *names;
  int kind, flags;
  bool finished;
  json_t json;
  /* SSE framing */
  uint8_t line;
  bool cr;               /* the last byte was a CR ending a line */
  char field[4];
  uint8_t field_length;  /* 5: longer than "data" */
  bool data_line;
  size_t data_lines;     /* in this event */
  text_t text;
  size_t count;
  cut_t cut;
  /* committed values */
  double values[SG_MAX_SLOTS];
  unsigned present, changed;
};

SG_EXPORT sg_scanner *sg_scanner_new(const sg_names *names, int kind, int flags) {
  sg_scanner *s = calloc(1, sizeof *s);
  if (s == NULL) return NULL;
  s->names = names;
  s->kind = kind;
  s->flags = kind == SG_SSE ? flags : 0;
  if (s->flags & SG_CUT) s->cut.state = CUT_ARMED;
  return s;
}

SG_EXPORT void sg_scanner_free(sg_scanner *s) {
  if (s == NULL) return;
  free(s->cut.buf);
  free(s);
}

static void commit(sg_scanner *s) {
  const json_t *j = &s->json;
  for (size_t m = 0; m < s->names->members; m++)
    if (j->usage_mask & (1u << m)) {
      s->values[m] = j->usage[m];
      s->present |= 1u << m;
      s->changed |= 1u << m;
    }
  /* `response.usage` is a stream's path (sse_to_metadata's rules); json_to_metadata's
   * are `usage.<member>` alone. */
  for (size_t r = 0; r < 2 && s->kind == SG_SSE; r++)
    if (j->response_mask & (1u << r)) {
      size_t slot = s->names->response_slot[r];
      s->values[slot] = j->response[r];
      s->present |= 1u << slot;
      s->changed |= 1u << slot;
    }
}

/* -- the cut's bookkeeping (positions are in cut.buf) -- */

static bool cut_active(const sg_scanner *s) { return s->cut.state != CUT_OFF; }

static void cut_event_end(sg_scanner *s, size_t end, bool at_cr) {
  cut_t *c = &s->cut;
  if (c->state == CUT_ARMED && !c->found && usage_event_found(&c->event)) {
    c->found = true;
    c->found_cr = at_cr;
    c->cut_start = c->event_start;
    c->cut_end = end;
  }
  c->boundary = c->event_start = end;
  c->last_end_cr = at_cr;
  memset(&c->event, 0, sizeof c->event);
}

/* A LF after the CR that ended an event: part of that event's blank line. */
static void cut_extend_event(sg_scanner *s, size_t end) {
  cut_t *c = &s->cut;
  if (!c->last_end_cr) return;
  if (c->found && c->cut_end == end - 1) c->cut_end = end, c->found_cr = false;
  if (c->boundary == end - 1) c->boundary = c->event_start = end;
  c->last_end_cr = false;
}

/* -- SSE framing -- */

static void data_line_start(sg_scanner *s) {
  if (s->data_lines++ > 0) json_feed(&s->json, s->names, "\n", 1); /* lines joined by LF */
  s->data_line = true;
  text_reset(&s->text);
}

static void data_line_end(sg_scanner *s) {
  if ((s->flags & SG_COUNT) && text_result(&s->text)) s->count++;
  s->data_line = false;
}

static void event_end(sg_scanner *s) {
  if (s->data_lines > 0 && json_whole(&s->json)) commit(s);
  json_reset(&s->json);
  s->data_lines = 0;
}

static bool field_is_data(const sg_scanner *s) {
  return s->field_length == 4 && memcmp(s->field, "data", 4) == 0;
}

/* A line ended at `at` (the terminator's position in cut.buf, when the cut keeps bytes). */
static void line_end(sg_scanner *s, size_t at, bool cr) {
  if (s->line == LINE_START) {
    event_end(s);
    if (cut_active(s)) cut_event_end(s, at + 1, cr);
  } else {
    if (s->line == LINE_FIELD && field_is_data(s)) data_line_start(s); /* `data` alone */
    if (s->data_line) data_line_end(s);
  }
  s->line = LINE_START;
  s->field_length = 0;
}

static void field_byte(sg_scanner *s, char c) {
  if (c == ':') {
    if (field_is_data(s)) {
      data_line_start(s);
      s->line = LINE_VALUE_START;
    } else {
      s->line = LINE_IGNORE;
    }
    return;
  }
  if (s->field_length < 4)
    s->field[s->field_length++] = c;
  else
    s->field_length = 5;
}

static void value_run(sg_scanner *s, const char *p, size_t n) {
  json_feed(&s->json, s->names, p, n);
  if (s->flags & SG_COUNT)
    for (size_t k = 0; k < n; k++) text_byte(&s->text, p[k]);
}

/* Bytes of a line up to (not with) its end: how many. */
static size_t line_run(const char *p, size_t n) {
  size_t i = 0;
  while (i < n && p[i] != '\n' && p[i] != '\r') i++;
  return i;
}

/* Frames p[0, n) (cut.buf positions from `base`); each byte also goes to the cut's
 * pattern test while it is armed. */
static void sse_feed(sg_scanner *s, const char *p, size_t n, size_t base) {
  size_t i = 0;
  while (i < n) {
    char c = p[i];
    bool arm = s->cut.state == CUT_ARMED;
    if (s->cr) {
      s->cr = false;
      if (c == '\n') {
        if (arm) usage_event_byte(&s->cut.event, c);
        if (cut_active(s)) cut_extend_event(s, base + i + 1);
        i++;
        continue;
      }
    }
    if (c == '\n' || c == '\r') {
      if (arm) usage_event_byte(&s->cut.event, c);
      line_end(s, base + i, c == '\r');
      s->cr = c == '\r';
      i++;
      continue;
    }
    size_t run = 1;
    switch (s->line) {
      case LINE_START:
        s->line = c == ':' ? LINE_IGNORE : LINE_FIELD;
        if (s->line == LINE_FIELD) field_byte(s, c);
        break;
      case LINE_FIELD:
        field_byte(s, c);
        break;
      case LINE_VALUE_START:
        s->line = LINE_VALUE;
        if (c == ' ') break; /* the one space after the colon is not the value's */
        /* fall through */
      case LINE_VALUE:
        run = line_run(p + i, n - i);
        value_run(s, p + i, run);
        break;
      default: /* LINE_IGNORE */
        run = line_run(p + i, n - i);
        break;
    }
    if (arm)
      for (size_t k = 0; k < run; k++) usage_event_byte(&s->cut.event, p[i + k]);
    i += run;
  }
}

/* -- the cut's buffer -- */

/* Drops what the last take gave out, so buf starts with the held bytes. */
static void cut_compact(cut_t *c) {
  if (c->consumed == 0) return;
  size_t gone = c->consumed;
  memmove(c->buf, c->buf + gone, c->length - gone);
  c->length -= gone;
  c->event_start = c->event_start > gone ? c->event_start - gone : 0;
  c->boundary = c->boundary > gone ? c->boundary - gone : 0;
  c->consumed = 0;
}

static bool cut_reserve(cut_t *c, size_t more) {
  if (more <= c->capacity - c->length) return true;
  if (more > SIZE_MAX / 2 - c->length) return false;
  size_t capacity = c->capacity ? c->capacity : 4096;
  while (capacity < c->length + more) capacity *= 2;
  char *grown = realloc(c->buf, capacity);
  if (grown == NULL) return false;
  c->buf = grown;
  c->capacity = capacity;
  return true;
}

SG_EXPORT int sg_scanner_push(sg_scanner *s, const char *bytes, size_t length) {
  if (s->finished) return SG_OK;
  int result = SG_OK;
  size_t base = 0;
  if (cut_active(s)) {
    cut_compact(&s->cut);
    base = s->cut.length;
    if (cut_reserve(&s->cut, length)) {
      if (length > 0) memcpy(s->cut.buf + base, bytes, length); /* bytes may be NULL */
      s->cut.length += length;
    } else {
      s->cut.state = CUT_OFF; /* the caller passes the held bytes and this chunk */
      result = SG_NOMEM;
    }
  }
  if (s->kind == SG_JSON)
    json_feed(&s->json, s->names, bytes, length);
  else
    sse_feed(s, bytes, length, base);
  return result;
}

SG_EXPORT void sg_scanner_finish(sg_scanner *s) {
  if (s->finished) return;
  if (s->kind == SG_JSON && json_whole(&s->json)) commit(s);
  if (s->kind == SG_SSE) {
    /* A last line without its end: counted, as the Lua counts a chunk's last line; its
     * event, not ended by a blank line, is not dispatched (the SSE spec drops it). */
    if (s->line == LINE_FIELD && field_is_data(s)) data_line_start(s);
    if (s->data_line) data_line_end(s);
  }
  s->finished = true;
}

/* The whole events of buf (and, as the Lua, a last `data: [DONE]` not yet ended). */
static size_t cut_whole(cut_t *c, bool finished) {
  size_t tail = c->length - c->boundary;
  if (finished || tail > CUT_MAX_HELD) {
    c->state = CUT_OFF; /* all passes, and from now on untouched */
    return c->length;
  }
  if (tail >= sizeof DONE_LINE - 1 &&
      memcmp(c->buf + c->boundary, DONE_LINE, sizeof DONE_LINE - 1) == 0) {
    /* What follows starts afresh, as the Lua's next chunk does. */
    c->event_start = c->length;
    memset(&c->event, 0, sizeof c->event);
    return c->length;
  }
  return c->boundary;
}

/* The bytes without the usage event; everything after it passes from now on. */
static void cut_remove(cut_t *c, const char **out, size_t *length) {
  memmove(c->buf + c->cut_start, c->buf + c->cut_end, c->length - c->cut_end);
  *out = c->buf;
  *length = c->length - (c->cut_end - c->cut_start);
  /* A CR-ended event cut at the very end: a LF first in the next chunk is its. */
  c->state = c->found_cr && c->cut_end == c->length ? CUT_SWALLOW_LF : CUT_OFF;
  c->consumed = c->length;
  c->held = 0;
}

SG_EXPORT int sg_scanner_take(sg_scanner *s, const char **out, size_t *length) {
  cut_t *c = &s->cut;
  *out = NULL;
  *length = 0;
  if (c->state == CUT_OFF) return 0;
  /* What the last take gave out goes now, not only at the next push: a hook with no bytes
   * (an empty data frame, trailers) takes with no push before it. */
  cut_compact(c);
  if (c->state == CUT_SWALLOW_LF) {
    if (c->length == c->consumed) return 0; /* an empty chunk: still waiting */
    bool lf = c->buf[c->consumed] == '\n';
    *out = c->buf + c->consumed + 1;
    *length = c->length - c->consumed - 1;
    c->consumed = c->length;
    c->state = CUT_OFF;
    return lf;
  }
  if (c->found) {
    cut_remove(c, out, length);
    return 1;
  }
  size_t whole = cut_whole(c, s->finished);
  bool changed = c->held > 0 || whole < c->length;
  *out = c->buf;
  *length = whole;
  c->consumed = whole;
  c->held = c->length - whole;
  return changed;
}

SG_EXPORT void sg_scanner_held(sg_scanner *s, const char **out, size_t *length) {
  cut_t *c = &s->cut;
  *out = c->buf + c->consumed;
  *length = c->held;
  c->consumed = c->length = c->held = 0;
  c->state = CUT_OFF;
}

SG_EXPORT bool sg_scanner_cut_done(const sg_scanner *s) { return s->cut.found; }

SG_EXPORT unsigned sg_scanner_changed(sg_scanner *s) {
  unsigned changed = s->changed;
  s->changed = 0;
  return changed;
}

SG_EXPORT bool sg_scanner_value(const sg_scanner *s, size_t slot, double *value) {
  if (slot >= SG_MAX_SLOTS || !(s->present & (1u << slot))) return false;
  *value = s->values[slot];
  return true;
}

SG_EXPORT size_t sg_scanner_count(const sg_scanner *s) { return s->count; }
