/* The JSON type of every value l5dask reads of a perception table, from the table's bytes.

   DuckDB's JSON reader parses a table straight into typed columns, but it casts what does not fit:
   a list where a string belongs becomes the string '["lidar"]', a number where a name belongs
   becomes '5', a string where a timestamp belongs becomes its number. Checking the types in
   DuckDB (json_type per value, in SQL) parses every value a second time. This scan reads the bytes
   once, in C, and looks only at the first byte of each declared key's value (and of each element
   of a declared list). What it beats, by how much (python benchmarks/json_types.py: a 286 MB
   sample_annotation.json, one thread): 0.195 s, against 1.68 s for DuckDB's json_type check
   (8.6x), on top of DuckDB's own parse of the declared columns (0.65 s).

   It vouches only for what it can read plainly: a top-level array of objects whose keys hold no
   escape (a key spelled with \u escapes could be another key to DuckDB); anything else, and JSON
   it cannot follow, returns L5_JSON_UNSURE and the caller checks the types with Python's json instead.
   It never validates JSON: DuckDB does, before or after. No recursion: nesting is counted, and
   past L5_JSON_MAX_DEPTH it says so. */
#ifndef L5_JSONTYPES_H
#define L5_JSONTYPES_H
#include <stdint.h>
#include <string.h>

/* what a declared column holds */
enum { L5_KIND_STRING = 1, L5_KIND_NUMBER = 2, L5_KIND_BOOL = 3, L5_KIND_STRINGS = 4, L5_KIND_NUMBERS = 5 };
/* what a value was found to be */
enum { L5_T_NULL = 0, L5_T_STRING = 1, L5_T_NUMBER = 2, L5_T_BOOL = 3, L5_T_ARRAY = 4, L5_T_OBJECT = 5, L5_T_OTHER = 6 };
/* the outcome */
enum { L5_JSON_OK = 0, L5_JSON_MISMATCH = 1, L5_JSON_UNSURE = 2, L5_JSON_TOO_DEEP = 3, L5_JSON_DUPLICATE = 4 };
#define L5_JSON_MAX_DEPTH 64

typedef struct {
    int64_t row;      /* the row (object) at fault */
    int64_t key;      /* the declared key's index */
    int64_t element;  /* the list element at fault, -1 for the value itself */
    int64_t found;    /* L5_T_... */
    int64_t offset;   /* the byte of the value at fault */
} l5_json_fault;

static inline const uint8_t* l5_ws(const uint8_t* p, const uint8_t* end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    return p;
}

static inline int l5_type_of(uint8_t c) {
    if (c == '"') return L5_T_STRING;
    if (c == '[') return L5_T_ARRAY;
    if (c == '{') return L5_T_OBJECT;
    if (c == 't' || c == 'f') return L5_T_BOOL;
    if (c == 'n') return L5_T_NULL;
    if (c == '-' || (c >= '0' && c <= '9')) return L5_T_NUMBER;
    return L5_T_OTHER;
}

/* past the string whose opening quote is at p; NULL if it does not end */
static inline const uint8_t* l5_skip_string(const uint8_t* p, const uint8_t* end) {
    p++;
    while (p < end) {
        const uint8_t* q = (const uint8_t*)memchr(p, '"', (size_t)(end - p));
        if (!q) return NULL;
        /* a quote preceded by an odd number of backslashes is escaped */
        const uint8_t* b = q;
        while (b > p && b[-1] == '\\') b--;
        if (((q - b) & 1) == 0) return q + 1;
        p = q + 1;
    }
    return NULL;
}

/* past the value at p (string, array, object or scalar); NULL if it does not end or nests
   deeper than `room` more levels (then *deep is set) */
static const uint8_t* l5_skip_value(const uint8_t* p, const uint8_t* end, int room, int* deep) {
    if (p >= end) return NULL;
    if (*p == '"') return l5_skip_string(p, end);
    if (*p == '[' || *p == '{') {
        int depth = 0;
        uint8_t prev = 0; /* the last byte that is no whitespace */
        while (p < end) {
            uint8_t c = *p;
            if (c == '"') {
                p = l5_skip_string(p, end);
                if (!p) return NULL;
                prev = '"';
                continue;
            }
            if (c == '[' || c == '{') {
                if (++depth > room) {
                    *deep = 1;
                    return NULL;
                }
            } else if (c == ']' || c == '}') {
                /* a comma before a closing bracket: no JSON, which DuckDB reads (found by fuzzing):
                   not vouched for, and json refuses it */
                if (prev == ',') return NULL;
                if (--depth == 0) return p + 1;
            }
            if (c != ' ' && c != '\n' && c != '\r' && c != '\t') prev = c;
            p++;
        }
        return NULL;
    }
    while (p < end && *p != ',' && *p != ']' && *p != '}' && *p != ' ' && *p != '\n' && *p != '\r' && *p != '\t') p++;
    return p;
}

static inline int l5_fits(int kind, int t) {
    if (t == L5_T_NULL) return 1; /* a missing value: the table checks say where one is not allowed */
    switch (kind) {
    case L5_KIND_STRING: return t == L5_T_STRING;
    case L5_KIND_NUMBER: return t == L5_T_NUMBER;
    case L5_KIND_BOOL: return t == L5_T_BOOL;
    default: return t == L5_T_ARRAY;
    }
}

/* Check the declared keys (nkeys of them: bytes keys[i], lengths lens[i], kinds kinds[i]) of every
   row of the JSON table in [start, end). */
static int l5_json_types(const uint8_t* start, const uint8_t* end, const uint8_t* const* keys, const int64_t* lens,
                         const int64_t* kinds, int64_t nkeys, l5_json_fault* fault) {
    const uint8_t* p = l5_ws(start, end);
    int deep = 0;
    int64_t row = 0;
    fault->row = fault->key = fault->element = -1;
    fault->found = L5_T_OTHER;
    fault->offset = 0;
    if (p >= end || *p != '[') return L5_JSON_UNSURE;
    p = l5_ws(p + 1, end);
    if (p < end && *p == ']') return L5_JSON_OK;
    for (;; row++) {
        p = l5_ws(p, end);
        if (p >= end || *p != '{') return L5_JSON_UNSURE;
        p = l5_ws(p + 1, end);
        uint64_t seen = 0; /* the declared keys met in this object (DuckDB refuses a key twice) */
        if (p < end && *p == '}') {
            p++;
        } else {
            for (;;) {
                if (p >= end || *p != '"') return L5_JSON_UNSURE;
                const uint8_t* k0 = p + 1;
                const uint8_t* k1 = l5_skip_string(p, end);
                if (!k1) return L5_JSON_UNSURE;
                int64_t klen = (k1 - 1) - k0;
                if (memchr(k0, '\\', (size_t)klen)) return L5_JSON_UNSURE; /* an escaped key */
                int64_t k = -1;
                for (int64_t i = 0; i < nkeys; i++)
                    if (lens[i] == klen && memcmp(keys[i], k0, (size_t)klen) == 0) {
                        k = i;
                        break;
                    }
                if (k >= 0) {
                    if ((seen >> k) & 1) {
                        fault->row = row, fault->key = k, fault->offset = k0 - 1 - start;
                        return L5_JSON_DUPLICATE;
                    }
                    seen |= (uint64_t)1 << k;
                }
                p = l5_ws(k1, end);
                if (p >= end || *p != ':') return L5_JSON_UNSURE;
                p = l5_ws(p + 1, end);
                if (p >= end) return L5_JSON_UNSURE;
                int t = l5_type_of(*p);
                if (k >= 0 && !l5_fits((int)kinds[k], t)) {
                    fault->row = row, fault->key = k, fault->found = t, fault->offset = p - start;
                    return L5_JSON_MISMATCH;
                }
                if (k >= 0 && t == L5_T_ARRAY) { /* a declared list: each element's type */
                    int want = kinds[k] == L5_KIND_STRINGS ? L5_T_STRING : L5_T_NUMBER;
                    int64_t e = 0;
                    p = l5_ws(p + 1, end);
                    if (p < end && *p == ']') {
                        p++;
                    } else {
                        for (;; e++) {
                            p = l5_ws(p, end);
                            if (p >= end || *p == ']') return L5_JSON_UNSURE; /* (after a comma: no JSON) */
                            int te = l5_type_of(*p);
                            if (te != want && te != L5_T_NULL) {
                                fault->row = row, fault->key = k, fault->element = e, fault->found = te;
                                fault->offset = p - start;
                                return L5_JSON_MISMATCH;
                            }
                            p = l5_skip_value(p, end, L5_JSON_MAX_DEPTH - 3, &deep);
                            if (!p) goto unsure;
                            p = l5_ws(p, end);
                            if (p < end && *p == ',') {
                                p++;
                                continue;
                            }
                            if (p < end && *p == ']') {
                                p++;
                                break;
                            }
                            return L5_JSON_UNSURE;
                        }
                    }
                } else {
                    p = l5_skip_value(p, end, L5_JSON_MAX_DEPTH - 2, &deep);
                    if (!p) goto unsure;
                }
                p = l5_ws(p, end);
                if (p < end && *p == ',') {
                    p = l5_ws(p + 1, end);
                    continue;
                }
                if (p < end && *p == '}') {
                    p++;
                    break;
                }
                return L5_JSON_UNSURE;
            }
        }
        p = l5_ws(p, end);
        if (p < end && *p == ',') {
            p++;
            continue;
        }
        if (p < end && *p == ']') return l5_ws(p + 1, end) == end ? L5_JSON_OK : L5_JSON_UNSURE;
        return L5_JSON_UNSURE;
    }
unsure:
    if (deep) {
        fault->row = row;
        return L5_JSON_TOO_DEEP;
    }
    return L5_JSON_UNSURE;
}
#endif
