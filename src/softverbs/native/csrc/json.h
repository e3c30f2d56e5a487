/* The little JSON that librdmacm speaks with the service's RDMA CM agent
 * (docs/service-protocol.md, "The RDMA CM").  Reading is lazy: a value is a
 * pointer into NUL-terminated text, and lookups scan from it.  Messages are
 * a few hundred bytes, so scanning costs less than building a tree.  Writing
 * appends to a fixed buffer and remembers overflow. */
#ifndef SV_JSON_H
#define SV_JSON_H

#include <stddef.h>
#include <stdint.h>

#define SV_HIDDEN __attribute__((visibility("hidden")))

/* --- reading ------------------------------------------------------------------------ */

/* Past one value and the whitespace after it; NULL if the text is malformed. */
SV_HIDDEN const char *js_skip(const char *p);
/* The value of ``key`` in the object at ``obj``; NULL if absent or not an object. */
SV_HIDDEN const char *js_get(const char *obj, const char *key);
/* Element ``i`` of the array at ``arr``; NULL if there is none. */
SV_HIDDEN const char *js_at(const char *arr, int i);
/* Is the value there and not null? */
SV_HIDDEN int js_present(const char *v);
/* The integer at ``v`` (0 if it is absent or not one). */
SV_HIDDEN long long js_int(const char *v);
/* ``key`` of ``obj`` as an integer, or ``dflt`` when absent or null. */
SV_HIDDEN long long js_int_of(const char *obj, const char *key, long long dflt);
/* The string at ``v`` into ``out`` (NUL-terminated, cut to ``cap``); its
 * length, or -1 if ``v`` is not a string. */
SV_HIDDEN long js_str(const char *v, char *out, size_t cap);
/* A hex string into bytes; how many, or -1 if ``v`` is not hex that fits. */
SV_HIDDEN long js_hex(const char *v, uint8_t *out, size_t cap);

/* --- writing ------------------------------------------------------------------------ */

struct jw {
	char *buf;
	size_t cap, len;
	int overflow;
};

SV_HIDDEN void jw_init(struct jw *w, char *buf, size_t cap);
/* Append formatted text (no escaping: for keys, numbers and punctuation). */
SV_HIDDEN void jw_raw(struct jw *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Append bytes as a hex string, quoted. */
SV_HIDDEN void jw_hex(struct jw *w, const void *data, size_t len);

#endif
