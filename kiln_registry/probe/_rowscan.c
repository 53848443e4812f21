/* The check-only scan of one compact prompt-logprobs rows array, in one pass over the bytes.
 *
 * Owns ``check``: the verdict of ``candidate_scan.check_rows_array`` for the layout vLLM and
 * the reference teacher write,
 *
 *     [null,{"<id>":{"logprob":<number>,"rank":<int>,"decoded_token":"<string>"},...},...]
 *
 * returning the index past the array, or -1 where it does not decide.  It accepts a strict
 * subset of what the numpy scan accepts (tests/probe/test_rows_scan_c.py holds it to that):
 * anything outside the common forms returns -1 and the caller runs the numpy scan, which
 * passes, defers to the strict parser, or refuses.  So this file never refuses, and it never
 * passes a body the strict parser refuses.
 *
 * Rules, each the numpy scan's:
 * - ids are 1..8 canonical digits below ``vocab``; ranks 1..8 canonical digits in
 *   1..``vocab``;
 * - a logprob is a JSON number of at most 31 bytes that is <= 0 and finite as float32; here
 *   only ``-I[.F][(e|E)-X]`` with ``I`` at most 30 digits (so below 1e30) and the unsigned
 *   zeros ``0[.000][(e|E)-X]`` are taken, everything else returns -1;
 * - a decoded token is a JSON string: no byte below 0x20, strict UTF-8 (no overlong form,
 *   no encoded surrogate, nothing past U+10FFFF), escapes from ``"\/bfnrtu``, ``\u`` with
 *   four hex digits, every high surrogate escape directly followed by a low one and no low
 *   one alone (serde_json refuses a lone surrogate);
 * - rows are ``{...}`` objects, each opened by ``{"``; there are exactly ``rows`` of them,
 *   none wider than ``k + 1``, none repeating an id; at most ``max_candidates`` candidates
 *   in all;
 * - the array closes with ``}}]`` and at least two bytes follow it in ``body`` (the numpy
 *   scan reads six bytes past each candidate).
 *
 * Bounded: one forward pass, every read checked against the body's end; a row's ids are
 * kept in a buffer of ``k + 1`` entries (``k`` below MAX_K) and marked in a bit set of
 * ``vocab`` bits (at most MAX_VOCAB, 2 MiB), cleared as each row closes.
 * The interpreter lock is released during the pass (the body is an immutable bytes).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_K 65536
#define MAX_VOCAB (1 << 24) /* domain.limits.MAX_VOCAB_SIZE */
#define DEFER (-1)

static const char T_LOGPROB[] = "\":{\"logprob\":";   /* after an id's digits */
static const char T_RANK[] = ",\"rank\":";             /* after a logprob */
static const char T_TOKEN[] = ",\"decoded_token\":\""; /* after a rank */

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static int hex_value(unsigned char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    c |= 0x20;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

static uint64_t load8(const unsigned char *at)
{
    uint64_t word;
    memcpy(&word, at, 8);
    return word;
}

/* How many ASCII digits follow b[q] (at most ``cap + 1`` are counted), eight at a time:
 * each byte XOR '0' is a digit's value below 10; adding 0x76 to its low seven bits sets the
 * high bit from 10 up, and the byte's own high bit marks 0x80 and above. */
static inline Py_ssize_t digit_run(const unsigned char *b, Py_ssize_t n, Py_ssize_t q, Py_ssize_t cap)
{
    const uint64_t high = 0x8080808080808080ULL;
    Py_ssize_t len = 0;
    while (len <= cap && q + len + 8 <= n) {
        uint64_t t = load8(b + q + len) ^ 0x3030303030303030ULL;
        uint64_t stop = (((t & ~high) + 0x7676767676767676ULL) | t) & high;
        if (stop != 0) return len + (__builtin_ctzll(stop) >> 3);
        len += 8;
    }
    while (len <= cap && q + len < n && is_digit(b[q + len])) len++;
    return len;
}

/* 1..8 canonical digits at *p in [low, high]; advances *p; -1 when not. */
static inline int64_t small_int(const unsigned char *b, Py_ssize_t n, Py_ssize_t *p, int64_t low,
                         int64_t high)
{
    Py_ssize_t at = *p, len = digit_run(b, n, at, 8);
    int64_t value = 0;
    if (len == 0 || len > 8 || (len > 1 && b[at] == '0')) return -1;
    for (Py_ssize_t i = 0; i < len; i++) value = value * 10 + (b[at + i] - '0');
    if (value < low || value > high) return -1;
    *p = at + len;
    return value;
}

/* A logprob in the forms described above; advances *p; 0 when not taken. */
static int logprob(const unsigned char *b, Py_ssize_t n, Py_ssize_t *p)
{
    Py_ssize_t at = *p, q = at, digits;
    int neg = q < n && b[q] == '-';
    q += neg;
    digits = digit_run(b, n, q, 30);
    if (digits == 0 || digits > 30 || (digits > 1 && b[q] == '0')) return 0;
    int zero = digits == 1 && b[q] == '0';
    q += digits;
    if (q < n && b[q] == '.') {
        q++;
        digits = digit_run(b, n, q, 31);
        if (digits == 0) return 0;
        for (Py_ssize_t i = 0; !neg && zero && i < digits; i++) zero = b[q + i] == '0';
        q += digits;
    }
    if (q < n && (b[q] | 0x20) == 'e') {
        q++;
        if (q >= n || b[q] != '-') return 0; /* a positive exponent: the numpy scan decides */
        q++;
        digits = digit_run(b, n, q, 31);
        if (digits == 0) return 0;
        q += digits;
    }
    if (q - at > 31 || (!neg && !zero)) return 0;
    *p = q;
    return 1;
}

/* A \uXXXX escape's code unit at b[at] (the backslash), or -1. */
static int32_t unit_at(const unsigned char *b, Py_ssize_t n, Py_ssize_t at)
{
    int32_t unit = 0;
    if (at + 6 > n || b[at] != '\\' || b[at + 1] != 'u') return -1;
    for (int i = 2; i < 6; i++) {
        int h = hex_value(b[at + i]);
        if (h < 0) return -1;
        unit = unit * 16 + h;
    }
    return unit;
}

/* The length of the strict UTF-8 sequence at b[at] (lead byte >= 0x80), or 0. */
static Py_ssize_t utf8_length(const unsigned char *b, Py_ssize_t n, Py_ssize_t at)
{
    unsigned char c = b[at], lo = 0x80, hi = 0xBF;
    Py_ssize_t len;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    if (at + len > n || b[at + 1] < lo || b[at + 1] > hi) return 0;
    for (Py_ssize_t i = 2; i < len; i++) {
        if (b[at + i] < 0x80 || b[at + i] > 0xBF) return 0;
    }
    return len;
}

/* A decoded token's string body from *p (past its opening quote) to its closing quote,
 * which *p is left on; 0 when not taken. */
static int token_text(const unsigned char *b, Py_ssize_t n, Py_ssize_t *p)
{
    Py_ssize_t q = *p;
    while (q < n) {
        unsigned char c = b[q];
        if (c == '"') {
            *p = q;
            return 1;
        }
        if (c < 0x20) return 0;
        if (c == '\\') {
            if (q + 1 >= n) return 0;
            unsigned char e = b[q + 1];
            if (e == 'u') {
                int32_t unit = unit_at(b, n, q);
                if (unit < 0 || (unit >= 0xDC00 && unit <= 0xDFFF)) return 0;
                if (unit >= 0xD800 && unit <= 0xDBFF) {
                    int32_t low = unit_at(b, n, q + 6);
                    if (low < 0xDC00 || low > 0xDFFF) return 0;
                    q += 12;
                } else {
                    q += 6;
                }
            } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' ||
                       e == 'r' || e == 't') {
                q += 2;
            } else {
                return 0;
            }
        } else if (c >= 0x80) {
            Py_ssize_t len = utf8_length(b, n, q);
            if (len == 0) return 0;
            q += len;
        } else {
            q++;
        }
    }
    return 0;
}

/* ``text`` (8..24 bytes) at *p, compared as overlapping 8-byte words; advances *p. */
static int literal(const unsigned char *b, Py_ssize_t n, Py_ssize_t *p, const char *text,
                   Py_ssize_t len)
{
    const unsigned char *at = b + *p, *t = (const unsigned char *)text;
    if (*p + len > n) return 0;
    uint64_t diff = load8(at) ^ load8(t);
    diff |= load8(at + len - 8) ^ load8(t + len - 8);
    if (len > 16) diff |= load8(at + 8) ^ load8(t + 8);
    if (diff != 0) return 0;
    *p += len;
    return 1;
}

static Py_ssize_t scan(const unsigned char *b, Py_ssize_t n, Py_ssize_t start, int64_t rows,
                       int64_t k, int64_t vocab, int64_t max_candidates, int32_t *row_ids,
                       uint64_t *seen)
{
    Py_ssize_t p = start, width = 0;
    int64_t seen_rows = 1, total = 0;
    if (start < 0 || start > n) return DEFER;
    if (n - p >= 6 && memcmp(b + p, "[null]", 6) == 0) return rows == 0 ? p + 6 : DEFER;
    if (n - p < 8 || memcmp(b + p, "[null,{\"", 8) != 0) return DEFER;
    p += 7;
    for (;;) {
        p++; /* the id's opening quote, checked by the link that led here */
        int64_t id = small_int(b, n, &p, 0, vocab - 1);
        if (id < 0 || !literal(b, n, &p, T_LOGPROB, sizeof T_LOGPROB - 1)) return DEFER;
        if (!logprob(b, n, &p) || !literal(b, n, &p, T_RANK, sizeof T_RANK - 1)) return DEFER;
        if (small_int(b, n, &p, 1, vocab) < 0) return DEFER;
        if (!literal(b, n, &p, T_TOKEN, sizeof T_TOKEN - 1) || !token_text(b, n, &p))
            return DEFER;
        if (width >= k + 1 || ++total > max_candidates) return DEFER;
        uint64_t bit = 1ULL << (id & 63);
        if (seen[id >> 6] & bit) return DEFER; /* an id repeated in its row */
        seen[id >> 6] |= bit;
        row_ids[width++] = (int32_t)id;
        /* p is on the token's closing quote; six bytes must follow it */
        if (p + 6 > n || b[p + 1] != '}') return DEFER;
        if (b[p + 2] == ',' && b[p + 3] == '"') {
            p += 3;
            continue;
        }
        if (b[p + 2] != '}') return DEFER;
        while (width > 0) { /* the row's ids leave the set */
            int32_t id = row_ids[--width];
            seen[id >> 6] &= ~(1ULL << (id & 63));
        }
        if (b[p + 3] == ']') return seen_rows == rows ? p + 4 : DEFER;
        if (b[p + 3] != ',' || b[p + 4] != '{' || b[p + 5] != '"') return DEFER;
        seen_rows++;
        p += 5;
    }
}

static PyObject *check(PyObject *self, PyObject *args)
{
    PyObject *body;
    Py_ssize_t start, end;
    long long rows, k, vocab, max_candidates;
    (void)self;
    /* bytes only: immutable, so the pass may run without the interpreter lock */
    if (!PyArg_ParseTuple(args, "O!nLLLL", &PyBytes_Type, &body, &start, &rows, &k, &vocab,
                          &max_candidates))
        return NULL;
    if (k < 0 || k >= MAX_K || vocab < 1 || vocab > MAX_VOCAB || rows < 0)
        return PyLong_FromSsize_t(DEFER);
    int32_t *row_ids = malloc(sizeof(int32_t) * (size_t)(k + 1));
    uint64_t *seen = calloc((size_t)(vocab + 63) / 64, sizeof(uint64_t));
    if (row_ids == NULL || seen == NULL) {
        free(row_ids);
        free(seen);
        return PyErr_NoMemory();
    }
    const unsigned char *bytes = (const unsigned char *)PyBytes_AS_STRING(body);
    Py_ssize_t size = PyBytes_GET_SIZE(body);
    Py_BEGIN_ALLOW_THREADS
    end = scan(bytes, size, start, rows, k, vocab, max_candidates, row_ids, seen);
    Py_END_ALLOW_THREADS
    free(row_ids);
    free(seen);
    return PyLong_FromSsize_t(end);
}

static PyMethodDef methods[] = {
    {"check", check, METH_VARARGS,
     "check(body, start, rows, k, vocab, max_candidates) -> the index past the rows array "
     "opening at body[start], or -1 where the numpy scan must decide."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rowscan",
    "The check-only rows-array scan in one pass (see _rowscan.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rowscan(void) { return PyModule_Create(&module); }
