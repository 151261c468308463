/* The report's per-agent numbers, for _report.pyx's agent_columns: speeds and distances to the
   ego as straight loops over columns, which the compiler turns into vector instructions (four
   doubles at a time on AVX2; `restrict`: the columns never overlap the outputs). The scalar loop
   they replace computed both per agent among the label count and two histograms (8.0 ns an
   agent on this machine, 6.3-6.5 ns with these; see agent_columns). The same operations in the same order as numpy's
   `np.sqrt(x * x + y * y)` in float64 (built with -ffp-contract=off: no fused multiply-add), so
   the same bits: correctly rounded sqrt, multiply and add are the same in vector or scalar
   registers. */
#ifndef L5_AGENTS_H
#define L5_AGENTS_H
#include <math.h>
#include <stddef.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define L5_AGENT_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define L5_AGENT_CLONES
#endif

/* out[i] = sqrt(vx[i]^2 + vy[i]^2), the float32 velocities taken as float64 */
L5_AGENT_CLONES
static void l5_speeds(const float* restrict vx, const float* restrict vy, double* restrict out, ptrdiff_t n) {
    for (ptrdiff_t i = 0; i < n; i++) {
        double a = vx[i], b = vy[i];
        out[i] = sqrt(a * a + b * b);
    }
}

/* out[i] = sqrt((cx[i] - ex)^2 + (cy[i] - ey)^2): one frame's agents, its ego at (ex, ey) */
L5_AGENT_CLONES
static void l5_dists(const double* restrict cx, const double* restrict cy, double ex, double ey,
                     double* restrict out, ptrdiff_t n) {
    for (ptrdiff_t i = 0; i < n; i++) {
        double dx = cx[i] - ex, dy = cy[i] - ey;
        out[i] = sqrt(dx * dx + dy * dy);
    }
}
#endif
