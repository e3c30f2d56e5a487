/* The little JSON of json.h. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

static const char *ws(const char *p)
{
	while (p && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
		p++;
	return p;
}

static const char *skip_string(const char *p)
{
	for (p++; *p && *p != '"'; p++)
		if (*p == '\\' && !*++p)
			return NULL;
	return *p == '"' ? p + 1 : NULL;
}

/* Past the members of an object or the elements of an array at p ('{' or '['). */
static const char *skip_container(const char *p)
{
	char close = *p == '{' ? '}' : ']';
	p = ws(p + 1);
	if (p && *p == close)
		return p + 1;
	while (p && *p) {
		if (close == '}') {
			if (*p != '"')
				return NULL;
			p = ws(skip_string(p));
			if (!p || *p != ':')
				return NULL;
			p = ws(p + 1);
		}
		p = js_skip(p);
		if (!p)
			return NULL;
		if (*p == close)
			return p + 1;
		if (*p != ',')
			return NULL;
		p = ws(p + 1);
	}
	return NULL;
}

const char *js_skip(const char *p)
{
	p = ws(p);
	if (!p || !*p)
		return NULL;
	if (*p == '"')
		return ws(skip_string(p));
	if (*p == '{' || *p == '[')
		return ws(skip_container(p));
	const char *start = p;
	while (*p && (isalnum((unsigned char)*p) || *p == '-' || *p == '+' || *p == '.'))
		p++;
	return p == start ? NULL : ws(p);
}

const char *js_get(const char *obj, const char *key)
{
	obj = ws(obj);
	if (!obj || *obj != '{')
		return NULL;
	size_t klen = strlen(key);
	const char *p = ws(obj + 1);
	while (p && *p == '"') {
		const char *name = p + 1, *end = skip_string(p);
		if (!end)
			return NULL;
		p = ws(end);
		if (!p || *p != ':')
			return NULL;
		p = ws(p + 1);
		if ((size_t)(end - 1 - name) == klen && !memcmp(name, key, klen))
			return p;
		p = js_skip(p);
		if (!p || *p != ',')
			return NULL;
		p = ws(p + 1);
	}
	return NULL;
}

const char *js_at(const char *arr, int i)
{
	arr = ws(arr);
	if (!arr || *arr != '[')
		return NULL;
	const char *p = ws(arr + 1);
	if (!p || *p == ']')
		return NULL;
	for (; i > 0; i--) {
		p = js_skip(p);
		if (!p || *p != ',')
			return NULL;
		p = ws(p + 1);
	}
	return p;
}

int js_present(const char *v)
{
	v = ws(v);
	return v && *v && strncmp(v, "null", 4) != 0;
}

long long js_int(const char *v)
{
	v = ws(v);
	if (!v || (*v != '-' && !isdigit((unsigned char)*v)))
		return 0;
	return strtoll(v, NULL, 10);
}

long long js_int_of(const char *obj, const char *key, long long dflt)
{
	const char *v = js_get(obj, key);
	return js_present(v) ? js_int(v) : dflt;
}

long js_str(const char *v, char *out, size_t cap)
{
	v = ws(v);
	if (!v || *v != '"' || !cap)
		return -1;
	size_t n = 0;
	for (v++; *v && *v != '"'; v++) {
		char c = *v;
		if (c == '\\') {
			c = *++v;
			if (c == 'n')
				c = '\n';
			else if (c == 't')
				c = '\t';
			else if (c == 'u') {	/* the agent writes ASCII: \u00XX at most */
				char hex[5] = {0};
				for (int i = 0; i < 4 && v[1]; i++)
					hex[i] = *++v;
				c = (char)strtol(hex, NULL, 16);
			} else if (!c)
				return -1;
		}
		if (n + 1 < cap)
			out[n] = c;
		n++;
	}
	out[n < cap ? n : cap - 1] = '\0';
	return *v == '"' ? (long)n : -1;
}

long js_hex(const char *v, uint8_t *out, size_t cap)
{
	v = ws(v);
	if (!v || *v != '"')
		return -1;
	size_t n = 0;
	for (v++; isxdigit((unsigned char)v[0]) && isxdigit((unsigned char)v[1]); v += 2) {
		if (n == cap)
			return -1;
		char byte[3] = {v[0], v[1], 0};
		out[n++] = (uint8_t)strtoul(byte, NULL, 16);
	}
	return *v == '"' ? (long)n : -1;
}

void jw_init(struct jw *w, char *buf, size_t cap)
{
	w->buf = buf;
	w->cap = cap;
	w->len = 0;
	w->overflow = 0;
	if (cap)
		buf[0] = '\0';
}

void jw_raw(struct jw *w, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(w->buf + w->len, w->cap - w->len, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= w->cap - w->len) {
		w->overflow = 1;
		w->len = w->cap - 1;
		return;
	}
	w->len += (size_t)n;
}

void jw_hex(struct jw *w, const void *data, size_t len)
{
	const uint8_t *b = data;
	jw_raw(w, "\"");
	for (size_t i = 0; i < len && !w->overflow; i++)
		jw_raw(w, "%02x", b[i]);
	jw_raw(w, "\"");
}
