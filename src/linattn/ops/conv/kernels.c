/* The short causal depthwise convolution of linattn.ops.conv.native (see ops/native/common.h).
 *
 * Per channel c and token t of a sequence, with `width` taps and the width - 1 inputs before
 * the sequence's first token taken from its initial state (zeros without one):
 *
 *     y[t, c] = act(bias[c] + sum_{j < width} w[c, j] x[t - (width - 1) + j, c])
 *
 * act the identity or SiLU, sums in float32 whatever the dtype of x, the weights, the bias and
 * the states (float32, bfloat16 or float16 each: LA_F32, LA_BF16, LA_F16), one rounding to
 * y's dtype. Layout: x and y are (B, T, D) with contiguous channels and any batch and token
 * strides (a (B, D, T) tensor transposed is such a view); weights (D, width), bias (D,) and the
 * states (N, D, width - 1) (channel-major, as the causal-conv1d package keeps them) with any
 * strides. Each token's output is a handful of multiply-adds per channel, vectorised across
 * channels: the pass runs at the speed of memory (read x once, write y once). The rows of a
 * block of CV_CB channels that the taps read again stay in L1.
 *
 * Sequences: without `seg`, row b of the batch is one sequence (initial and final state b);
 * with it, nseg segments (b, t0, t1, n) of four longs each: tokens [t0, t1) of row b are one
 * sequence, which starts from state n (n < 0: from zeros, and no final state) — packed
 * sequences (cu_seqlens) and causal-conv1d's seq_idx.
 *
 * The decoding step (la_conv_step) shifts a state of slen >= width - 1 columns left by one,
 * appends x_t and returns the output of the last width - 1 columns and x_t, in one pass. */
#ifndef LA_COMMON_H
#include "../native/common.h"
#endif

#define CV_CB 8192 /* channels per block (the weights of a block transposed in the work) */
#define CV_TB 8    /* tokens per chunk of the register-blocked main loop */

/* Floats of work la_conv_forward needs for `width` taps: the block's weights (width x CV_CB),
 * bias (CV_CB) and history (width - 1 rows of CV_CB). */
long la_conv_work(long width) { return (2 * width + 1) * CV_CB; }

/* y[t, c] for c in [0, nc) of one block and the tokens [ta, tb) whose taps all lie in x (row t
 * at x + t * xt), with a constant width <= 4: per vector of channels its weights, bias and the
 * sliding window of inputs stay in registers through a chunk of CV_TB tokens, so each output
 * vector costs one load of x, `width` multiply-adds and one store; the chunk's rows are read
 * in order (CV_TB + width - 1 streams through memory). */
static inline __attribute__((always_inline)) void cv_rows(long width, int xdt, int ydt,
                                                          int act, long ta, long tb,
                                                          const void *x, long xt, void *y,
                                                          long yt, long nc, const float *wt,
                                                          const float *bb) {
    const long nv = nc - nc % W;
    for (long t0 = ta; t0 < tb; t0 += CV_TB) {
        const long t1 = tb - t0 < CV_TB ? tb : t0 + CV_TB;
        for (long c = 0; c < nv; c += W) {
            vf wv[4], win[4];
            for (long j = 0; j < width; ++j) wv[j] = vload(wt + j * CV_CB + c);
            const vf bv = vload(bb + c);
            for (long j = 0; j + 1 < width; ++j)
                win[j] = vload_dt(x, (t0 - (width - 1) + j) * xt + c, xdt);
            if (t1 - t0 == CV_TB) { /* a whole chunk: unrolled, its activations interleaved */
                vf acc[CV_TB];
#pragma GCC unroll 16
                for (long i = 0; i < CV_TB; ++i) {
                    win[width - 1] = vload_dt(x, (t0 + i) * xt + c, xdt);
                    acc[i] = bv;
                    for (long j = 0; j < width; ++j) acc[i] += wv[j] * win[j];
                    for (long j = 0; j + 1 < width; ++j) win[j] = win[j + 1];
                }
#pragma GCC unroll 16
                for (long i = 0; i < CV_TB; ++i)
                    vstore_dt(y, (t0 + i) * yt + c, act ? vsilu(acc[i]) : acc[i], ydt);
                continue;
            }
            for (long t = t0; t < t1; ++t) {
                win[width - 1] = vload_dt(x, t * xt + c, xdt);
                vf acc = bv;
                for (long j = 0; j < width; ++j) acc += wv[j] * win[j];
                if (act) acc = vsilu(acc);
                vstore_dt(y, t * yt + c, acc, ydt);
                for (long j = 0; j + 1 < width; ++j) win[j] = win[j + 1];
            }
        }
        for (long t = t0; t < t1; ++t)
            for (long c = nv; c < nc; ++c) {
                float acc = bb[c];
                for (long j = 0; j < width; ++j)
                    acc += wt[j * CV_CB + c] * load_dt(x, (t - (width - 1) + j) * xt + c, xdt);
                store_dt(y, t * yt + c, act ? ssilu(acc) : acc, ydt);
            }
    }
}

/* Any width: each output vector reads its taps from the rows (in cache) and the weights. */
static void cv_rows_wide(long width, int xdt, int ydt, int act, long ta, long tb,
                         const void *x, long xt, void *y, long yt, long nc, const float *wt,
                         const float *bb) {
    const long nv = nc - nc % W;
    for (long t = ta; t < tb; ++t) {
        const long r0 = (t - (width - 1)) * xt, yo = t * yt;
        for (long c = 0; c < nv; c += W) {
            vf acc = vload(bb + c);
            for (long j = 0; j < width; ++j)
                acc += vload(wt + j * CV_CB + c) * vload_dt(x, r0 + j * xt + c, xdt);
            if (act) acc = vsilu(acc);
            vstore_dt(y, yo + c, acc, ydt);
        }
        for (long c = nv; c < nc; ++c) {
            float acc = bb[c];
            for (long j = 0; j < width; ++j)
                acc += wt[j * CV_CB + c] * load_dt(x, r0 + j * xt + c, xdt);
            store_dt(y, yo + c, act ? ssilu(acc) : acc, ydt);
        }
    }
}

static void cv_rows_any(long width, int xdt, int ydt, int act, long ta, long tb, const void *x,
                        long xt, void *y, long yt, long nc, const float *wt, const float *bb) {
/* the common widths and dtypes with constants (the taps unrolled, no dtype branches) */
#define CV_(wd, dt)                                                                           \
    if (width == wd && xdt == dt && ydt == dt) {                                              \
        cv_rows(wd, dt, dt, act, ta, tb, x, xt, y, yt, nc, wt, bb);                           \
        return;                                                                               \
    }
    CV_(4, LA_F32) CV_(4, LA_BF16) CV_(4, LA_F16)
    CV_(3, LA_F32) CV_(3, LA_BF16) CV_(3, LA_F16)
    CV_(2, LA_F32) CV_(2, LA_BF16) CV_(2, LA_F16)
#undef CV_
    if (width <= 4)
        cv_rows(width, xdt, ydt, act, ta, tb, x, xt, y, yt, nc, wt, bb);
    else
        cv_rows_wide(width, xdt, ydt, act, ta, tb, x, xt, y, yt, nc, wt, bb);
}

/* The first tokens of a sequence, whose taps reach back before t0 into the history rows
 * (hist: width - 1 rows of CV_CB floats, row k the input (width - 1 - k) positions before t0).
 * At most width - 1 tokens: the taps' sources chosen per token. */
static void cv_head(long width, int xdt, int ydt, int act, long t0, long tb, const void *x,
                    long xt, void *y, long yt, long nc, const float *wt, const float *bb,
                    const float *hist) {
    const long nv = nc - nc % W;
    for (long t = t0; t < tb; ++t) {
        for (long c = 0; c < nv; c += W) {
            vf acc = vload(bb + c);
            for (long j = 0; j < width; ++j) {
                long p = t - (width - 1) + j;
                vf v = p >= t0 ? vload_dt(x, p * xt + c, xdt)
                               : vload(hist + (p - t0 + width - 1) * CV_CB + c);
                acc += vload(wt + j * CV_CB + c) * v;
            }
            vstore_dt(y, t * yt + c, act ? vsilu(acc) : acc, ydt);
        }
        for (long c = nv; c < nc; ++c) {
            float acc = bb[c];
            for (long j = 0; j < width; ++j) {
                long p = t - (width - 1) + j;
                float v = p >= t0 ? load_dt(x, p * xt + c, xdt)
                                  : hist[(p - t0 + width - 1) * CV_CB + c];
                acc += wt[j * CV_CB + c] * v;
            }
            store_dt(y, t * yt + c, act ? ssilu(acc) : acc, ydt);
        }
    }
}

/* dst[i] = src[i0 + i * stride] as float32 (i < n), src of dtype dt (a row of weights, a
 * column of states), or zeros where src is NULL: one loop per dtype. */
static void cv_gather(float *dst, long n, const void *src, long i0, long stride, int dt) {
    if (!src) {
        memset(dst, 0, (size_t)n * sizeof(float));
    } else if (dt == LA_F32) {
        for (long i = 0; i < n; ++i) dst[i] = ((const float *)src)[i0 + i * stride];
    } else if (dt == LA_BF16) {
        for (long i = 0; i < n; ++i) dst[i] = bf2f(((const u16 *)src)[i0 + i * stride]);
    } else {
        for (long i = 0; i < n; ++i) dst[i] = h2f(((const u16 *)src)[i0 + i * stride]);
    }
}

/* dst[d0 + i * dstride] = src[s0 + i] (i < n) from x's dtype sdt to the state's ddt: the
 * elements themselves where the dtypes agree (a state holds inputs exactly). */
static void cv_scatter(void *dst, long d0, long dstride, int ddt, const void *src, long s0,
                       int sdt, long n) {
    if (ddt == sdt && ddt == LA_F32) {
        for (long i = 0; i < n; ++i) ((float *)dst)[d0 + i * dstride] = ((const float *)src)[s0 + i];
    } else if (ddt == sdt) {
        for (long i = 0; i < n; ++i) ((u16 *)dst)[d0 + i * dstride] = ((const u16 *)src)[s0 + i];
    } else {
        for (long i = 0; i < n; ++i) store_dt(dst, d0 + i * dstride, load_dt(src, s0 + i, sdt), ddt);
    }
}

/* The convolution over channels [c0, c1) of every sequence (see the top of this file). x, y:
 * (B, T, D), batch strides xb, yb, token strides xt, yt, contiguous channels, dtypes xdt, ydt;
 * w (D, width) strides wd, wj; bias (D,) stride bs or NULL; act 1: SiLU; s0 the initial
 * states (N, D, width - 1), strides s0n, s0c, s0k, or NULL (zeros); sf the final states (the
 * last width - 1 inputs of each sequence, the history included where it is shorter), same
 * form, or NULL; sf may be s0 (updated in place). work: la_conv_work(width) floats. Returns 0,
 * or -1 on sizes it does not take (nothing written). */
static int la_conv_forward(const void *x, long xb, long xt, int xdt, void *y, long yb, long yt,
                           int ydt, long B, long T, long D, long width, long c0, long c1,
                           const void *w, long wd, long wj, int wdt, const void *bias, long bs,
                           int bdt, int act, const long *seg, long nseg, const void *s0,
                           long s0n, long s0c, long s0k, int s0dt, void *sf, long sfn, long sfc,
                           long sfk, int sfdt, float *work) {
    if (width < 1 || B < 0 || T < 0 || D < 0 || c0 < 0 || c1 > D || c0 > c1 || nseg < 0)
        return -1;
    const int e[3] = {4, 2, 2}; /* bytes per element of each dtype code */
    if (xdt < 0 || xdt > 2 || ydt < 0 || ydt > 2 || wdt < 0 || wdt > 2 || bdt < 0 || bdt > 2
        || s0dt < 0 || s0dt > 2 || sfdt < 0 || sfdt > 2)
        return -1;
    float *wt = work, *bb = wt + width * CV_CB, *hist = bb + CV_CB;
    long h = width - 1, ns = seg ? nseg : B;
    for (long s = 0; seg && s < ns; ++s) /* every segment checked before anything is written */
        if (seg[4 * s] < 0 || seg[4 * s] >= B || seg[4 * s + 1] < 0 || seg[4 * s + 2] > T
            || seg[4 * s + 1] > seg[4 * s + 2])
            return -1;
    for (long cb = c0; cb < c1; cb += CV_CB) {
        long nc = c1 - cb < CV_CB ? c1 - cb : CV_CB;
        for (long j = 0; j < width; ++j) cv_gather(wt + j * CV_CB, nc, w, cb * wd + j * wj, wd, wdt);
        cv_gather(bb, nc, bias, cb * bs, bs, bdt);
        for (long s = 0; s < ns; ++s) {
            long b = seg ? seg[4 * s] : s, t0 = seg ? seg[4 * s + 1] : 0;
            long t1 = seg ? seg[4 * s + 2] : T, n = seg ? seg[4 * s + 3] : s;
            const int from_state = s0 && n >= 0;
            for (long k = 0; k < h; ++k)
                cv_gather(hist + k * CV_CB, nc, from_state ? s0 : NULL,
                          n * s0n + cb * s0c + k * s0k, s0c, s0dt);
            /* this block's columns of row b: pointers offset in bytes by the element size */
            const char *xr = (const char *)x + (b * xb + cb) * e[xdt];
            char *yr = (char *)y + (b * yb + cb) * e[ydt];
            long ta = t0 + h < t1 ? t0 + h : t1; /* the first token whose taps are all in x */
            cv_head(width, xdt, ydt, act, t0, ta, xr, xt, yr, yt, nc, wt, bb, hist);
            cv_rows_any(width, xdt, ydt, act, ta, t1, xr, xt, yr, yt, nc, wt, bb);
            if (!sf || n < 0) continue;
            for (long k = 0; k < h; ++k) { /* column k: input t1 - h + k, or history */
                long p = t1 - h + k, d0 = n * sfn + cb * sfc + k * sfk;
                if (p >= t0)
                    cv_scatter(sf, d0, sfc, sfdt, xr, p * xt, xdt, nc);
                else
                    for (long c = 0; c < nc; ++c)
                        store_dt(sf, d0 + c * sfc, hist[(p - t0 + h) * CV_CB + c], sfdt);
            }
        }
    }
    return 0;
}

/* One decoding step of one channel: the taps of the last width - 1 state columns and xc, and
 * the state shifted left by one with xc appended (in place when so is si: each column is read
 * before it is written). Returns the sum before the activation. */
static inline __attribute__((always_inline)) float cv_step_channel(long width, long slen,
                                                                   int sdt, int wdt, float xc,
                                                                   float acc, const void *w,
                                                                   long wo, long wj,
                                                                   const void *si, long io,
                                                                   long sik, void *so, long oo,
                                                                   long sok) {
    long h = width - 1;
    for (long j = 0; j < h; ++j)
        acc += load_dt(w, wo + j * wj, wdt) * load_dt(si, io + (slen - h + j) * sik, sdt);
    acc += load_dt(w, wo + h * wj, wdt) * xc;
    for (long k = 0; k + 1 < slen; ++k) store_dt(so, oo + k * sok, load_dt(si, io + (k + 1) * sik, sdt), sdt);
    if (slen > 0) store_dt(so, oo + (slen - 1) * sok, xc, sdt);
    return acc;
}

/* Channels [0, D) of one batch row, in vectors of W: each lane's sum from cv_step_channel, the
 * bias and SiLU vectorised. */
static inline __attribute__((always_inline)) void cv_step_row(
    long width, long slen, int xdt, int sdt, int wdt, int bdt, int ydt, int act, const void *x,
    void *y, long D, const void *w, long wd, long wj, const void *bias, long bs, const void *si,
    long sic, long sik, void *so, long soc, long sok) {
    float buf[W];
    long nv = D - D % W;
    for (long c0 = 0; c0 < nv; c0 += W) {
        for (long l = 0; l < W; ++l) {
            long c = c0 + l;
            buf[l] = cv_step_channel(width, slen, sdt, wdt, load_dt(x, c, xdt), 0.0f, w, c * wd,
                                     wj, si, c * sic, sik, so, c * soc, sok);
        }
        vf acc = vload(buf);
        if (bias) {
            if (bs == 1) {
                acc += vload_dt(bias, c0, bdt);
            } else {
                for (long l = 0; l < W; ++l) buf[l] = load_dt(bias, (c0 + l) * bs, bdt);
                acc += vload(buf);
            }
        }
        if (act) acc = vsilu(acc);
        vstore_dt(y, c0, acc, ydt);
    }
    for (long c = nv; c < D; ++c) {
        float acc = cv_step_channel(width, slen, sdt, wdt, load_dt(x, c, xdt),
                                    bias ? load_dt(bias, c * bs, bdt) : 0.0f, w, c * wd, wj, si,
                                    c * sic, sik, so, c * soc, sok);
        store_dt(y, c, act ? ssilu(acc) : acc, ydt);
    }
}

/* One row of a step with the common layout: state rows and weight rows contiguous (strides
 * (slen, 1) and (width, 1)), contiguous bias, one dtype throughout (constant here), slen <=
 * CV_SMAX. Per block of channels the block's state rows are first copied into a local buffer
 * (so the state may be updated in place while the loops below read it through restrict
 * pointers, which lets the compiler vectorise them with constant strides): the taps' sums,
 * SiLU and the stores in vectors, then each row written back shifted by one with x_t
 * appended. */
#define CV_SB 256
#define CV_SMAX 16
static inline __attribute__((always_inline)) void cv_step_dense(
    long width, long slen, int dt, int act, const void *x, void *y, long D, const void *w,
    const void *bias, const void *si, void *so) {
    const long h = width - 1;
    const int es = dt == LA_F32 ? 4 : 2;
    float tmp[CV_SB];
    float sbuf[CV_SB * CV_SMAX]; /* holds CV_SB rows of float32, or of 16-bit elements */
    for (long c0 = 0; c0 < D; c0 += CV_SB) {
        const long nc = D - c0 < CV_SB ? D - c0 : CV_SB;
        memcpy(sbuf, (const char *)si + c0 * slen * es, (size_t)(nc * slen * es));
        const void *sb = sbuf;
        for (long c = 0; c < nc; ++c) {
            long cc = c0 + c;
            float acc = bias ? load_dt(bias, cc, dt) : 0.0f;
            for (long j = 0; j < h; ++j)
                acc += load_dt(w, cc * width + j, dt) * load_dt(sb, c * slen + slen - h + j, dt);
            tmp[c] = acc + load_dt(w, cc * width + h, dt) * load_dt(x, cc, dt);
        }
        const long nv = nc - nc % W;
        for (long c = 0; c < nv; c += W) {
            vf a = vload(tmp + c);
            vstore_dt(y, c0 + c, act ? vsilu(a) : a, dt);
        }
        for (long c = nv; c < nc; ++c) store_dt(y, c0 + c, act ? ssilu(tmp[c]) : tmp[c], dt);
        if (dt == LA_F32) {
            float *restrict o = (float *)so + c0 * slen;
            const float *restrict sr = (const float *)sbuf;
            const float *restrict xr = (const float *)x + c0;
            for (long c = 0; c < nc; ++c)
                for (long k = 0; k < slen; ++k)
                    o[c * slen + k] = k + 1 < slen ? sr[c * slen + k + 1] : xr[c];
        } else {
            u16 *restrict o = (u16 *)so + c0 * slen;
            const u16 *restrict sr = (const u16 *)(const void *)sbuf;
            const u16 *restrict xr = (const u16 *)x + c0;
            for (long c = 0; c < nc; ++c)
                for (long k = 0; k < slen; ++k)
                    o[c * slen + k] = k + 1 < slen ? sr[c * slen + k + 1] : xr[c];
        }
    }
}

static void cv_step_dense_any(long width, long slen, int dt, int act, const void *x, void *y,
                              long D, const void *w, const void *bias, const void *si,
                              void *so) {
#define CD_(wd_, sl_, dt_)                                                                    \
    if (width == wd_ && slen == sl_ && dt == dt_) {                                           \
        cv_step_dense(wd_, sl_, dt_, act, x, y, D, w, bias, si, so);                          \
        return;                                                                               \
    }
    CD_(4, 4, LA_F32) CD_(4, 3, LA_F32) CD_(4, 4, LA_BF16) CD_(4, 3, LA_BF16)
    CD_(4, 4, LA_F16) CD_(4, 3, LA_F16) CD_(3, 3, LA_F32) CD_(3, 2, LA_F32)
    CD_(3, 3, LA_BF16) CD_(3, 2, LA_BF16) CD_(2, 2, LA_F32) CD_(2, 1, LA_F32)
    CD_(2, 2, LA_BF16) CD_(2, 1, LA_BF16)
#undef CD_
    cv_step_dense(width, slen, dt, act, x, y, D, w, bias, si, so);
}

/* One decoding step of B rows: x (B, D) (batch stride xb, contiguous channels), y (B, D)
 * (batch stride yb), the state si (B, D, slen) read and so (same shape) written — so may be si
 * (the update in place) —, slen >= width - 1; w, bias as in la_conv_forward. Returns 0, or -1
 * on sizes it does not take. */
static int la_conv_step(const void *x, long xb, int xdt, void *y, long yb, int ydt, long B,
                        long D, long width, long slen, const void *w, long wd, long wj, int wdt,
                        const void *bias, long bs, int bdt, int act, const void *si, long sib,
                        long sic, long sik, void *so, long sob, long soc, long sok, int sdt) {
    if (width < 1 || slen < width - 1 || B < 0 || D < 0)
        return -1;
    if (xdt < 0 || xdt > 2 || ydt < 0 || ydt > 2 || wdt < 0 || wdt > 2 || bdt < 0 || bdt > 2
        || sdt < 0 || sdt > 2)
        return -1;
    const int e[3] = {4, 2, 2};
    for (long b = 0; b < B; ++b) {
        const char *xr = (const char *)x + b * xb * e[xdt];
        char *yr = (char *)y + b * yb * e[ydt];
        const char *sr = (const char *)si + b * sib * e[sdt];
        char *orow = (char *)so + b * sob * e[sdt];
        if (sic == slen && sik == 1 && soc == slen && sok == 1 && wd == width && wj == 1
            && slen <= CV_SMAX
            && (!bias || (bs == 1 && bdt == xdt)) && sdt == xdt && wdt == xdt && ydt == xdt
            && (si == so || (const char *)si + B * sib * e[sdt] <= (const char *)so
                || (const char *)so + B * sob * e[sdt] <= (const char *)si)) {
            cv_step_dense_any(width, slen, xdt, act, xr, yr, D, w, bias, sr, orow);
            continue;
        }
/* the common cases with constants: widths 2-4, the state as long as the window or one shorter,
 * one dtype throughout */
#define CS_(wd_, sl_, dt)                                                                      \
        if (width == wd_ && slen == sl_ && xdt == dt && sdt == dt && wdt == dt && ydt == dt     \
            && (!bias || bdt == dt)) {                                                        \
            cv_step_row(wd_, sl_, dt, dt, dt, dt, dt, act, xr, yr, D, w, wd, wj, bias, bs, sr,  \
                        sic, sik, orow, soc, sok);                                            \
            continue;                                                                         \
        }
        CS_(4, 4, LA_F32) CS_(4, 3, LA_F32) CS_(4, 4, LA_BF16) CS_(4, 3, LA_BF16)
        CS_(3, 3, LA_F32) CS_(3, 2, LA_F32) CS_(2, 2, LA_F32) CS_(2, 1, LA_F32)
#undef CS_
        cv_step_row(width, slen, xdt, sdt, wdt, bdt, ydt, act, xr, yr, D, w, wd, wj, bias, bs,
                    sr, sic, sik, orow, soc, sok);
    }
    return 0;
}

/* ------------------------------------------------------------------ the Python entry points
 * One argument struct per kernel (ops/native/common.h); linattn/ops/conv/native.py mirrors
 * each in ctypes and the layouts are checked against la_conv_abi when the library loads. */
#define LA_CONV_FORWARD_ARGS(X, la_s) \
    X(la_s, const void *, x, 'p') X(la_s, long, xb, 'l') X(la_s, long, xt, 'l') \
    X(la_s, int, xdt, 'i') X(la_s, void *, y, 'p') X(la_s, long, yb, 'l') X(la_s, long, yt, 'l') \
    X(la_s, int, ydt, 'i') X(la_s, long, B, 'l') X(la_s, long, T, 'l') X(la_s, long, D, 'l') \
    X(la_s, long, width, 'l') X(la_s, long, c0, 'l') X(la_s, long, c1, 'l') \
    X(la_s, const void *, w, 'p') X(la_s, long, wd, 'l') X(la_s, long, wj, 'l') \
    X(la_s, int, wdt, 'i') X(la_s, const void *, bias, 'p') X(la_s, long, bs, 'l') \
    X(la_s, int, bdt, 'i') X(la_s, int, act, 'i') X(la_s, const long *, seg, 'p') \
    X(la_s, long, nseg, 'l') X(la_s, const void *, s0, 'p') X(la_s, long, s0n, 'l') \
    X(la_s, long, s0c, 'l') X(la_s, long, s0k, 'l') X(la_s, int, s0dt, 'i') \
    X(la_s, void *, sf, 'p') X(la_s, long, sfn, 'l') X(la_s, long, sfc, 'l') \
    X(la_s, long, sfk, 'l') X(la_s, int, sfdt, 'i') X(la_s, float *, work, 'p')
LA_ENTRY(la_conv_forward, LA_CONV_FORWARD_ARGS)

#define LA_CONV_STEP_ARGS(X, la_s) \
    X(la_s, const void *, x, 'p') X(la_s, long, xb, 'l') X(la_s, int, xdt, 'i') \
    X(la_s, void *, y, 'p') X(la_s, long, yb, 'l') X(la_s, int, ydt, 'i') X(la_s, long, B, 'l') \
    X(la_s, long, D, 'l') X(la_s, long, width, 'l') X(la_s, long, slen, 'l') \
    X(la_s, const void *, w, 'p') X(la_s, long, wd, 'l') X(la_s, long, wj, 'l') \
    X(la_s, int, wdt, 'i') X(la_s, const void *, bias, 'p') X(la_s, long, bs, 'l') \
    X(la_s, int, bdt, 'i') X(la_s, int, act, 'i') X(la_s, const void *, si, 'p') \
    X(la_s, long, sib, 'l') X(la_s, long, sic, 'l') X(la_s, long, sik, 'l') \
    X(la_s, void *, so, 'p') X(la_s, long, sob, 'l') X(la_s, long, soc, 'l') \
    X(la_s, long, sok, 'l') X(la_s, int, sdt, 'i')
LA_ENTRY(la_conv_step, LA_CONV_STEP_ARGS)

static const la_struct la_conv_structs[] = {
    LA_STRUCT_ENTRY(la_conv_forward_args),
    LA_STRUCT_ENTRY(la_conv_step_args),
};
LA_ABI_TABLE(la_conv_abi, la_conv_structs)
