/* A mock of Envoy's side of the dynamic module ABI for the forwarded headers filter
 * (sluicegate/native/c/forwarded_headers.c): a request header map as Envoy keeps it (an
 * ordered list of entries, each name and value its own allocation, freed when removed, so
 * AddressSanitizer catches a filter that reads an entry it removed), and the filter's
 * hooks called on it as Envoy calls them.
 *
 * stdin, line by line:
 *   config            the lines up to "." are a configuration; prints "ok" or "refused"
 *   request           the lines up to "." are a request's headers, "name<TAB>value";
 *                     the filter's request hooks run on them (headers, then a body that
 *                     ends the stream, then trailers, as Envoy would call them after a
 *                     hold too); prints what each returned, then the headers left, then "."
 * A request uses the last configuration that was not refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envoy_abi.h"
#include "filter_kind.h"

typedef struct {
  char *key, *value;
  size_t key_length, value_length;
} entry_t;

static entry_t *entries;
static size_t entry_count, entry_capacity;

static char *copy(const char *ptr, size_t length) {
  char *out = malloc(length + 1);
  if (out == NULL) abort();
  memcpy(out, ptr, length);
  out[length] = 0;
  return out;
}

static void add_entry(const char *key, size_t key_length, const char *value,
                      size_t value_length) {
  if (entry_count == entry_capacity) {
    entry_capacity = entry_capacity ? 2 * entry_capacity : 8;
    entries = realloc(entries, entry_capacity * sizeof *entries);
    if (entries == NULL) abort();
  }
  entries[entry_count++] = (entry_t){copy(key, key_length), copy(value, value_length),
                                     key_length, value_length};
}

static bool same_key(const entry_t *e, const char *key, size_t length) {
  return e->key_length == length && memcmp(e->key, key, length) == 0;
}

static void clear_entries(void) {
  for (size_t i = 0; i < entry_count; i++) {
    free(entries[i].key);
    free(entries[i].value);
  }
  entry_count = 0;
}

/* ---- Envoy's callbacks, on the one request header map ---- */

bool envoy_dynamic_module_callback_http_get_header(sg_filter_envoy f, int type,
                                                  sg_module_buffer key, sg_envoy_buffer *value,
                                                  size_t index, size_t *count) {
  size_t seen = 0;
  *value = (sg_envoy_buffer){NULL, 0};
  for (size_t i = 0; i < entry_count; i++) {
    if (!same_key(&entries[i], key.ptr, key.length)) continue;
    if (seen++ == index) *value = (sg_envoy_buffer){entries[i].value, entries[i].value_length};
  }
  if (count != NULL) *count = seen;
  return value->ptr != NULL;
}

/* Envoy's setHeaderValueImpl: the name copied first (LowerCaseString); an empty value
 * removes every entry of the name, another replaces the first entry's value or adds one. */
bool envoy_dynamic_module_callback_http_set_header(sg_filter_envoy f, int type,
                                                  sg_module_buffer key, sg_module_buffer value) {
  char *name = copy(key.ptr, key.length);
  for (size_t i = 0; i < key.length; i++)
    if (name[i] >= 'A' && name[i] <= 'Z') name[i] = (char)(name[i] + 32);
  if (value.ptr == NULL || value.length == 0) {
    size_t kept = 0;
    for (size_t i = 0; i < entry_count; i++) {
      if (same_key(&entries[i], name, key.length)) {
        free(entries[i].key);
        free(entries[i].value);
      } else {
        entries[kept++] = entries[i];
      }
    }
    entry_count = kept;
  } else {
    bool found = false;
    for (size_t i = 0; i < entry_count && !found; i++)
      if (same_key(&entries[i], name, key.length)) {
        free(entries[i].value);
        entries[i].value = copy(value.ptr, value.length);
        entries[i].value_length = value.length;
        found = true;
      }
    if (!found) add_entry(name, key.length, value.ptr, value.length);
  }
  free(name);
  return true;
}

bool envoy_dynamic_module_callback_http_add_header(sg_filter_envoy f, int type,
                                                  sg_module_buffer key, sg_module_buffer value) {
  if (value.ptr == NULL || value.length == 0) return false;
  add_entry(key.ptr, key.length, value.ptr, value.length);
  return true;
}

size_t envoy_dynamic_module_callback_http_get_headers_size(sg_filter_envoy f, int type) {
  return entry_count;
}

bool envoy_dynamic_module_callback_http_get_headers(sg_filter_envoy f, int type,
                                                    sg_envoy_header *headers) {
  for (size_t i = 0; i < entry_count; i++)
    headers[i] = (sg_envoy_header){entries[i].key, entries[i].key_length, entries[i].value,
                                   entries[i].value_length};
  return true;
}

/* ---- the driver ---- */

static char *read_block(size_t *length) {
  char *text = NULL, line[65536];
  size_t size = 0;
  while (fgets(line, sizeof line, stdin) != NULL) {
    if (strcmp(line, ".\n") == 0) break;
    size_t n = strlen(line);
    text = realloc(text, size + n + 1);
    if (text == NULL) abort();
    memcpy(text + size, line, n);
    size += n;
    text[size] = 0;
  }
  *length = size;
  return text == NULL ? copy("", 0) : text;
}

int main(void) {
  const sg_filter_kind *kind = &sg_forwarded_headers;
  void *config = NULL;
  char command[64];
  while (fgets(command, sizeof command, stdin) != NULL) {
    size_t length;
    char *block = read_block(&length);
    if (strcmp(command, "config\n") == 0) {
      void *made = kind->config_new(block, length);
      printf("%s\n", made == NULL ? "refused" : "ok");
      if (made != NULL) {
        if (config != NULL) kind->config_destroy(config);
        config = made;
      }
    } else if (strcmp(command, "request\n") == 0 && config != NULL) {
      for (char *line = block; *line;) {
        char *end = strchr(line, '\n'), *tab = strchr(line, '\t');
        if (tab == NULL || tab > end) abort();
        add_entry(line, (size_t)(tab - line), tab + 1, (size_t)(end - tab - 1));
        line = end + 1;
      }
      void *filter = kind->filter_new(config, NULL);
      int headers = kind->request_headers(NULL, filter, false);
      int body = kind->request_body(NULL, filter, false);
      int trailers = kind->request_trailers(NULL, filter);
      kind->filter_destroy(filter);
      printf("%d %d %d\n", headers, body, trailers);
      for (size_t i = 0; i < entry_count; i++) printf("%s\t%s\n", entries[i].key, entries[i].value);
      printf(".\n");
      clear_entries();
    } else {
      abort();
    }
    free(block);
    fflush(stdout);
  }
  if (config != NULL) kind->config_destroy(config);
  free(entries);
  return 0;
}
