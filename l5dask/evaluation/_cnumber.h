/* strtod in the "C" locale, whatever the process's LC_NUMERIC (glibc's strtod follows it: under
   a comma-decimal locale it stops at the '.' of "1.5"). The CSV number parser of _kernels.pyx
   calls l5_strtod_c; l5_c_numeric_init makes the locale once, when the module is loaded. It beats
   nothing: it is a correctness shim (Python's float() is the other way, per number, with the GIL),
   kept while the CSV parser of _csvrows.pyx is kept. */
#ifndef L5_CNUMBER_H
#define L5_CNUMBER_H
#include <locale.h>
#include <stdlib.h>
#if defined(__APPLE__)
#include <xlocale.h>
#endif

static locale_t l5_c_numeric = (locale_t)0;

static int l5_c_numeric_init(void) {
    if (!l5_c_numeric) l5_c_numeric = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    return l5_c_numeric != (locale_t)0;
}

/* 0 when the locale could not be made: the caller then takes its general (Python) parser */
static int l5_strtod_c(const char* s, char** end, double* out) {
    if (!l5_c_numeric) return 0;
    *out = strtod_l(s, end, l5_c_numeric);
    return 1;
}
#endif
