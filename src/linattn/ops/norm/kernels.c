/* The gated RMSNorm of linattn.ops.norm.native (see ops/native/common.h).
 *
 * Per row x (D values) with gate g, weight w (D,) and groups of G channels (G = D: the whole
 * row), in float32 whatever the dtypes of x, g, w and y (float32, bfloat16 or float16 each:
 * LA_F32, LA_BF16, LA_F16), one rounding to y's dtype:
 *
 *     norm before gate (Qwen3-Next, Qwen3.5, Kimi, fla):  y = x r w act(g),
 *     gate before norm (Mamba2):                          z = x act(g),  y = z r w,
 *
 * r = 1 / sqrt(mean over the group of x^2 (z^2) + eps), act SiLU or sigmoid. One pass per row
 * for the sums of squares and one for the scaled, gated write, both vectorised over the row
 * (a row is in L1 for the second pass); the gate before the norm keeps z in a row buffer so
 * that the activation is computed once. Rows are independent: threads take blocks of them. */
#ifndef LA_COMMON_H
#include "../native/common.h"
#endif

enum { NM_SILU = 0, NM_SIGMOID = 1 };

/* Floats of work la_norm_forward needs for rows of D: z, when the gate comes first. */
long la_norm_work(long D) { return D > 0 ? D : 1; }

static inline __attribute__((always_inline)) vf nm_vact(int act, vf g) {
    return act == NM_SIGMOID ? vsigmoid(g) : vsilu(g);
}
static inline __attribute__((always_inline)) float nm_sact(int act, float g) {
    return act == NM_SIGMOID ? ssigmoid(g) : ssilu(g);
}

/* x[i] in double, times act(g[i]) when the gate comes first (zfirst): z without a float's
 * range. */
static inline double nm_wide(const void *x, long i, int xdt, const void *g, long gi, int gdt,
                             int act, int zfirst) {
    double v = load_dt(x, i, xdt);
    return zfirst ? v * (double)nm_sact(act, load_dt(g, gi, gdt)) : v;
}

/* Rows [0, R) (row strides xr, gr, yr; contiguous channels); the dtypes constant in the
 * specialisations. g NULL: no gate; w NULL: no weight. */
static inline __attribute__((always_inline)) void nm_rows(int xdt, int gdt, int wdt, int ydt,
                                                          const void *x, long xr, const void *g,
                                                          long gr, void *y, long yr,
                                                          const void *w, long R, long D, long G,
                                                          float eps, int act, int before,
                                                          float *z) {
    const float invG = 1.0f / (float)G;
    const int zfirst = g && !before; /* z = x act(g) is normalised */
    for (long r = 0; r < R; ++r) {
        const long xo = r * xr, go = r * gr, yo = r * yr;
        for (long g0 = 0; g0 < D; g0 += G) {
            const long nv = G - G % W;
            vf acc = vsplat(0.0f);
            float ss = 0.0f;
            if (zfirst) {
                for (long j = 0; j < nv; j += W) {
                    vf v = vload_dt(x, xo + g0 + j, xdt) * nm_vact(act, vload_dt(g, go + g0 + j, gdt));
                    vstore(z + g0 + j, v);
                    acc += v * v;
                }
                for (long j = nv; j < G; ++j) {
                    float v = load_dt(x, xo + g0 + j, xdt) * nm_sact(act, load_dt(g, go + g0 + j, gdt));
                    z[g0 + j] = v;
                    ss += v * v;
                }
            } else {
                for (long j = 0; j < nv; j += W) {
                    vf v = vload_dt(x, xo + g0 + j, xdt);
                    acc += v * v;
                }
                for (long j = nv; j < G; ++j) {
                    float v = load_dt(x, xo + g0 + j, xdt);
                    ss += v * v;
                }
            }
            const float msq = (hsum(acc) + ss) * invG;
            if (!(msq <= 0x1p120f && msq >= 0x1p-100f) && msq == msq) {
                /* squares that overflowed (|x| ~ 1e19) or underflowed (|x| ~ 1e-30, eps 0),
                 * or an all-zero group: the group again in double, where the squares of floats
                 * are exact; a zero denominator (all zeros, eps 0) gives zeros. Ordinary rows
                 * never get here (nan rows neither: they stay nan). z = x act(g) is formed
                 * again in double too: in float it can itself overflow (1e20 silu(1e20)) or
                 * underflow. */
                double sd = 0.0;
                for (long j = 0; j < G; ++j) {
                    double v = nm_wide(x, xo + g0 + j, xdt, g, go + g0 + j, gdt, act, zfirst);
                    sd += v * v;
                }
                const double den = sqrt(sd / (double)G + (double)eps);
                for (long j = 0; j < G; ++j) {
                    long c = g0 + j;
                    double v = nm_wide(x, xo + c, xdt, g, go + c, gdt, act, zfirst);
                    v = den == 0.0 ? 0.0 : v / den;
                    if (w) v *= load_dt(w, c, wdt);
                    if (g && before) v *= nm_sact(act, load_dt(g, go + c, gdt));
                    store_dt(y, yo + c, (float)v, ydt);
                }
                continue;
            }
            const float rs = 1.0f / sqrtf(msq + eps);
            const vf rv = vsplat(rs);
            for (long j = 0; j < nv; j += W) {
                long c = g0 + j;
                vf v = (zfirst ? vload(z + c) : vload_dt(x, xo + c, xdt)) * rv;
                if (w) v *= vload_dt(w, c, wdt);
                if (g && before) v *= nm_vact(act, vload_dt(g, go + c, gdt));
                vstore_dt(y, yo + c, v, ydt);
            }
            for (long j = nv; j < G; ++j) {
                long c = g0 + j;
                float v = (zfirst ? z[c] : load_dt(x, xo + c, xdt)) * rs;
                if (w) v *= load_dt(w, c, wdt);
                if (g && before) v *= nm_sact(act, load_dt(g, go + c, gdt));
                store_dt(y, yo + c, v, ydt);
            }
        }
    }
}

/* R rows of D channels in groups of G (G divides D): x, g, y with row strides xr, gr, yr and
 * contiguous channels, dtype codes xdt, gdt, ydt; g NULL (no gate) or w (D,) contiguous NULL
 * (no weight); act NM_SILU or NM_SIGMOID; before 1: the norm before the gate (y = x r w
 * act(g)), 0: after it (y = (x act(g)) r w). work: la_norm_work(D) floats. Returns 0, or -1 on
 * sizes it does not take. */
static int la_norm_forward(const void *x, long xr, int xdt, const void *g, long gr, int gdt,
                           void *y, long yr, int ydt, const void *w, int wdt, long R, long D,
                           long G, float eps, int act, int before, float *work) {
    if (R < 0 || D < 1 || G < 1 || D % G || (act != NM_SILU && act != NM_SIGMOID))
        return -1;
    if (xdt < 0 || xdt > 2 || gdt < 0 || gdt > 2 || ydt < 0 || ydt > 2 || wdt < 0 || wdt > 2)
        return -1;
/* one dtype throughout (the weight's may differ only when there is none): constants */
#define NM_(dt)                                                                               \
    if (xdt == dt && ydt == dt && (!g || gdt == dt) && (!w || wdt == dt)) {                   \
        nm_rows(dt, dt, dt, dt, x, xr, g, gr, y, yr, w, R, D, G, eps, act, before, work);     \
        return 0;                                                                             \
    }
    NM_(LA_F32) NM_(LA_BF16) NM_(LA_F16)
#undef NM_
    nm_rows(xdt, gdt, wdt, ydt, x, xr, g, gr, y, yr, w, R, D, G, eps, act, before, work);
    return 0;
}

/* ------------------------------------------------------------------ the Python entry points
 * One argument struct per kernel (ops/native/common.h); linattn/ops/norm/native.py mirrors it
 * in ctypes and the layout is checked against la_norm_abi when the library loads. */
#define LA_NORM_FORWARD_ARGS(X, la_s) \
    X(la_s, const void *, x, 'p') X(la_s, long, xr, 'l') X(la_s, int, xdt, 'i') \
    X(la_s, const void *, g, 'p') X(la_s, long, gr, 'l') X(la_s, int, gdt, 'i') \
    X(la_s, void *, y, 'p') X(la_s, long, yr, 'l') X(la_s, int, ydt, 'i') \
    X(la_s, const void *, w, 'p') X(la_s, int, wdt, 'i') X(la_s, long, R, 'l') \
    X(la_s, long, D, 'l') X(la_s, long, G, 'l') X(la_s, float, eps, 'f') X(la_s, int, act, 'i') \
    X(la_s, int, before, 'i') X(la_s, float *, work, 'p')
LA_ENTRY(la_norm_forward, LA_NORM_FORWARD_ARGS)

static const la_struct la_norm_structs[] = {
    LA_STRUCT_ENTRY(la_norm_forward_args),
};
LA_ABI_TABLE(la_norm_abi, la_norm_structs)
