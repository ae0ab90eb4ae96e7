/* The (gated) delta-rule kernels of linattn.ops.delta.native (see ops/native/common.h, which
 * tiles.h and ahead.h include on their own). */
#ifndef LA_TILES_H
#include "../native/tiles.h"
#endif
#ifndef LA_AHEAD_H
#include "../native/ahead.h"
#endif

/* ------------------------------------------------ the (gated) delta rule, forward, float32
 * Per value head, state S (K x V, rows of V floats), token t with strength beta_t, row decays
 * a_i = exp(g_t + gk_t,i) (a missing gate counts as 0: a scalar gate g alone gives one a for
 * every row, per-key gates gk (Kimi Delta Attention) one per row) and q~ = s q_t, k~ = k_t
 * (each divided by sqrt(sum x^2 + 1e-6) first with l2norm):
 *     S' = diag(a) S,  u = beta_t (v_t - S'^T k~),  S <- S' + k~ u^T,
 *     o_t = S^T q~ = S'^T q~ + (q~ . k~) u,   where S'^T x = S^T (a o x).
 * Column j of S, u and o depends on column j of S and v_t only, so the kernels walk one block
 * of columns (GDR_NB vectors) at a time, through all the tokens of a chunk of GDR_TC: the block
 * stays in L1, and the pass that writes token t's state also sums (a_{t+1} o k~_{t+1})^T S and
 * (a_{t+1} o q~_{t+1})^T S for the next token (with a scalar gate, k~^T S and q~^T S, times a
 * afterwards): a token a pass over S would cost one load, one store and four vector operations
 * per element with a gate, three without; the row scale is applied in the update. One pass
 * carries two tokens (gdr_cols, gdr_update_pair): the second token's sums over the state
 * before the pair follow from the first's u, so a pass loads and stores S once for two tokens
 * and takes seven vector operations an element for both (six without a gate): with a scalar
 * gate 0.82x the time of a pass a token in cache, 0.80-0.88x from memory (16 heads x 4,096
 * tokens, K = V = 64; Intel Xeon family 6, AVX-512; the AVX2 build 0.90x and 0.96x); with
 * per-key gates ~0.87x either way (AVX2 0.93x in cache). Its rounding differs from the
 * token-by-token recurrence's by float32 roundings of those sums. The passes run with
 * subnormals flushed (la_subnormals_off): products of two decays, or of a decay near e^-87 and
 * a row, would otherwise cost microcode assists on every element (20-50x the time). (The pass
 * a token at a time, gdr_cols before ad8e666, was the baseline of those ratios.)
 * This is the sequential recurrence in float32 arithmetic: at K = V = 64 it needs fewer
 * operations per token (3 K V multiply-adds + K V multiplies) than the chunked WY form
 * (3 K V + C (3 K / 2 + V) multiply-adds) and no triangular solve. (bfloat16 rows on AMX
 * tiles take the chunked form instead, its products at ~16x the FMA rate: chunk_dp, tiles.h.)
 * Grouped value attention (GVA): G consecutive value heads share one q/k head (value head n
 * reads q/k head n / G), indexed in place, never copied.
 * The step is T = 1. */
#if LA_W == 8 || (LA_W == 4 && !(defined(__ARM_NEON) || defined(__ARM_NEON__)))
#define GDR_NB 2 /* 16 registers: u, two sums and a row of S per vector, plus broadcasts */
#else
#define GDR_NB 4 /* 32 registers (AVX-512, NEON), or scalars */
#endif
#define GDR_TC 64 /* tokens prepared at a time (normalised q, k; gates) */
/* tokens of the chunked form on tiles (chunk_dp): two per GDR_TC. 64 at a time took 13 us a
 * 64 tokens where two chunks of 32 took 11 (a C harness, one head, K = V 64, Intel Xeon with
 * AMX): the (I + L)^-1 substitution and the C x C blocks grow with the chunk's square */
#define GDR_DP_C 32
#define GDR_EPS 1e-6f
/* gate modes: none, one scalar decay per token, a decay per row (per-key gates, with or
 * without the scalar one folded in) */
#define GDR_PLAIN 0
#define GDR_SCALAR 1
#define GDR_ROWS 2

/* Floats of work la_gdr_forward needs for a head dimension K: per prepared token q~ (a o q~
 * with per-key gates), k~, a o k~, the row decays (K each), a, beta, q~ . k~; then k~ . k~ and
 * k~ . q~ with the next token's (gdr_cols) in 4 KiB, so that what callers place after it
 * keeps the offsets modulo 4 KiB it had without them (512 bytes further on, the bfloat16
 * forward's rows and tiles took 1.02-1.03x the time: 4K aliasing). */
long la_gdr_work(long K) { return GDR_TC * (4 * K + 3) + 1024; }

/* kacc = S^T kn, qacc = S^T qn over the block of nb vectors at S (rows of V). */
static inline __attribute__((always_inline)) void gdr_dots(int nb, long K, const float *S,
                                                           long V, const float *kn,
                                                           const float *qn, vf *kacc,
                                                           vf *qacc) {
    vf ka[GDR_NB], qa[GDR_NB];
    for (int j = 0; j < nb; ++j) ka[j] = qa[j] = vsplat(0.0f);
    for (long i = 0; i < K; ++i) {
        vf ki = vsplat(kn[i]), qi = vsplat(qn[i]);
        for (int j = 0; j < nb; ++j) {
            vf s = vload(S + i * V + j * W);
            ka[j] += ki * s;
            qa[j] += qi * s;
        }
    }
    for (int j = 0; j < nb; ++j) kacc[j] = ka[j], qacc[j] = qa[j];
}

/* Sout[i] = a_i Sin[i] + kn[i] u (i < K) over the block (a_i = 1 for GDR_PLAIN, a for
 * GDR_SCALAR, ar[i] for GDR_ROWS): a chunk's last token of an odd count. Sout may be Sin. */
static inline __attribute__((always_inline)) void gdr_update_one(int nb, int mode, long K,
                                                                 const float *Sin, float *Sout,
                                                                 long V, float a,
                                                                 const float *ar,
                                                                 const float *kn,
                                                                 const vf *u) {
    vf av = vsplat(a);
    for (long i = 0; i < K; ++i) {
        vf ki = vsplat(kn[i]), ai = mode == GDR_ROWS ? vsplat(ar[i]) : av;
        for (int j = 0; j < nb; ++j) {
            vf s = vload(Sin + i * V + j * W);
            vstore(Sout + i * V + j * W, mode != GDR_PLAIN ? ai * s + ki * u[j] : s + ki * u[j]);
        }
    }
}

/* Two tokens a pass over the block: Sout = A o Sin + k0 u0^T + k1 u1^T, with a scalar gate
 * A = a_t a_{t+1}, with per-key gates (GDR_ROWS) the row Ar = a_t o a_{t+1}, and with either
 * k0 = a_{t+1} o k~_t (made by gdr_prep; k~_t without a gate); with `next`
 * 1 or 2, also the sums of the next one or two tokens, S^T kx2, S^T qx2 (and kx3, qx3) in
 * acc[0..1] (and acc[2..3]). */
static inline __attribute__((always_inline)) void gdr_update_pair(int nb, int mode, int next,
                                                              long K, const float *Sin,
                                                              float *Sout, long V, float A,
                                                              const float *Ar,
                                                              const float *k0, const vf *u0,
                                                              const float *k1, const vf *u1,
                                                              const float *kx2,
                                                              const float *qx2,
                                                              const float *kx3,
                                                              const float *qx3, vf acc[4][GDR_NB]) {
    vf a0[GDR_NB], a1[GDR_NB], a2[GDR_NB], a3[GDR_NB], Av = vsplat(A);
    for (int j = 0; j < nb; ++j) a0[j] = a1[j] = a2[j] = a3[j] = vsplat(0.0f);
    for (long i = 0; i < K; ++i) {
        vf c0 = vsplat(k0[i]), c1 = vsplat(k1[i]), ai = mode == GDR_ROWS ? vsplat(Ar[i]) : Av;
        vf x2 = vsplat(next >= 1 ? kx2[i] : 0.0f), y2 = vsplat(next >= 1 ? qx2[i] : 0.0f);
        vf x3 = vsplat(next >= 2 ? kx3[i] : 0.0f), y3 = vsplat(next >= 2 ? qx3[i] : 0.0f);
        for (int j = 0; j < nb; ++j) {
            vf s = vload(Sin + i * V + j * W);
            s = mode != GDR_PLAIN ? ai * s + c0 * u0[j] : s + c0 * u0[j];
            s += c1 * u1[j];
            vstore(Sout + i * V + j * W, s);
            if (next >= 1) {
                a0[j] += x2 * s;
                a1[j] += y2 * s;
            }
            if (next >= 2) {
                a2[j] += x3 * s;
                a3[j] += y3 * s;
            }
        }
    }
    for (int j = 0; j < nb; ++j) acc[0][j] = a0[j], acc[1][j] = a1[j], acc[2][j] = a2[j],
                                 acc[3][j] = a3[j];
}

/* Tokens [0, Tc) of one head's prepared chunk (qn, kn, kx, ar rows of K; a, b, qk, kk, kq one
 * per token; see gdr_prep) over the block of nb vectors of columns at Sin / Sout / v / o
 * (offset to the block already): the first token reads Sin, every token writes Sout (which may
 * be Sin). v, o: token strides vt, ot. With wo (token stride wt), also each token's w = v_t -
 * S'^T k~ (u = beta w), which the backward reads instead of recomputing S^T k~. Two tokens a
 * pass (gdr_update_pair), the last of an odd count alone: with a scalar gate or none
 *   S_t^T k_{t+1} = a_t S_{t-1}^T k_{t+1} + (k_t . k_{t+1}) u_t,
 *   S_t^T q_{t+1} = a_t S_{t-1}^T q_{t+1} + (k_t . q_{t+1}) u_t,
 * so both tokens' u and o come from sums over the state before the pair (kk, kq: the dots of
 * each token's k~ with the next token's k~ and q~, from gdr_prep). With per-key gates the
 * decays sit in the vectors summed (kx = kd, qn: a o k~, a o q~, and for a pair's second
 * token a_t o a_{t+1} o k~, q~ alike) and in kk, kq (a_{t+1} o k~_{t+1} . k~_t, ...): gdr_prep
 * makes them, and the update's rows (ar: a_t o a_{t+1} for the pair's first token, a_{t+1} o
 * k~_t for its second). */
static inline __attribute__((always_inline)) void gdr_cols(int nb, int mode, long Tc, long K,
                                                            long V, const float *qn,
                                                            const float *kn, const float *kx,
                                                            const float *ar, const float *a,
                                                            const float *b, const float *qk,
                                                            const float *kk, const float *kq,
                                                            const float *v, long vt,
                                                            const float *Sin, float *Sout,
                                                            float *o, long ot, float *wo,
                                                            long wt, const la_ahead *pf) {
    vf acc[4][GDR_NB], u0[GDR_NB], u1[GDR_NB];
    /* the first pair's (or token's) sums over Sin */
    gdr_dots(nb, K, Sin, V, kx, qn, acc[0], acc[1]);
    if (Tc > 1) gdr_dots(nb, K, Sin, V, kx + K, qn + K, acc[2], acc[3]);
    long t = 0;
    for (; t + 1 < Tc; t += 2) {
        la_fetch_ahead(pf, t, nb * W);
        la_fetch_ahead(pf, t + 1, nb * W);
        float a0 = mode == GDR_SCALAR ? a[t] : 1.0f, a1 = mode == GDR_SCALAR ? a[t + 1] : 1.0f;
        vf av0 = vsplat(a0), av1 = vsplat(a1), b0 = vsplat(b[t]), b1 = vsplat(b[t + 1]);
        vf qk0 = vsplat(qk[t]), qk1 = vsplat(qk[t + 1]), kkv = vsplat(kk[t]), kqv = vsplat(kq[t]);
        for (int j = 0; j < nb; ++j) {
            vf w0 = vload(v + t * vt + j * W) - av0 * acc[0][j];
            vf uu = b0 * w0;
            vstore(o + t * ot + j * W, av0 * acc[1][j] + qk0 * uu);
            vf w1 = vload(v + (t + 1) * vt + j * W) - av1 * (av0 * acc[2][j] + kkv * uu);
            u1[j] = b1 * w1;
            vstore(o + (t + 1) * ot + j * W,
                   av1 * (av0 * acc[3][j] + kqv * uu) + qk1 * u1[j]);
            if (wo) {
                vstore(wo + t * wt + j * W, w0);
                vstore(wo + (t + 1) * wt + j * W, w1);
            }
            u0[j] = uu; /* (a_{t+1} is in the row k0) */
        }
        const float *src = t == 0 ? Sin : Sout;
        long left = Tc - (t + 2);
        const float *k2 = kx + (t + 2) * K, *q2 = qn + (t + 2) * K, *Ar = ar + t * K;
        const float *k0 = mode == GDR_PLAIN ? kn + t * K : ar + (t + 1) * K;
        float A = a0 * a1;
        if (left >= 2)
            gdr_update_pair(nb, mode, 2, K, src, Sout, V, A, Ar, k0, u0, kn + (t + 1) * K, u1, k2,
                        q2, k2 + K, q2 + K, acc);
        else if (left == 1)
            gdr_update_pair(nb, mode, 1, K, src, Sout, V, A, Ar, k0, u0, kn + (t + 1) * K, u1, k2,
                        q2, NULL, NULL, acc);
        else
            gdr_update_pair(nb, mode, 0, K, src, Sout, V, A, Ar, k0, u0, kn + (t + 1) * K, u1,
                        NULL, NULL, NULL, NULL, acc);
    }
    if (t < Tc) { /* the last token of an odd count: its sums are acc[0], acc[1] */
        la_fetch_ahead(pf, t, nb * W);
        float at = mode == GDR_SCALAR ? a[t] : 1.0f;
        vf av = vsplat(at), bt = vsplat(b[t]), qkt = vsplat(qk[t]);
        for (int j = 0; j < nb; ++j) {
            vf wj = vload(v + t * vt + j * W) - av * acc[0][j];
            u0[j] = bt * wj;
            if (wo) vstore(wo + t * wt + j * W, wj);
            vstore(o + t * ot + j * W, av * acc[1][j] + qkt * u0[j]);
        }
        gdr_update_one(nb, mode, K, t == 0 ? Sin : Sout, Sout, V, at, ar + t * K, kn + t * K, u0);
    }
}

/* gdr_cols specialised for constant (nb, mode): the sums stay in registers. */
static void gdr_cols_any(int nb, int mode, long Tc, long K, long V, const float *qn,
                         const float *kn, const float *kd, const float *ar, const float *a,
                         const float *b, const float *qk, const float *kk, const float *kq,
                         const float *v, long vt, const float *Sin, float *Sout, float *o,
                         long ot, float *wo, long wt, const la_ahead *pf) {
/* Cases beyond this ISA's GDR_NB are constant-false (and never asked for). */
#define G_(c, m)                                                                              \
    case c * 3 + m:                                                                           \
        if (c <= GDR_NB)                                                                      \
            gdr_cols(c <= GDR_NB ? c : GDR_NB, m, Tc, K, V, qn, kn, m == GDR_ROWS ? kd : kn,  \
                     ar, a, b, qk, kk, kq, v, vt, Sin, Sout, o, ot, wo, wt, pf);              \
        break;
    switch (nb * 3 + mode) {
        G_(1, 0) G_(1, 1) G_(1, 2) G_(2, 0) G_(2, 1) G_(2, 2)
        G_(3, 0) G_(3, 1) G_(3, 2) G_(4, 0) G_(4, 1) G_(4, 2)
        default: break;
    }
#undef G_
}

/* Prepare Tc tokens: qn = s q (/ |q|), kn = k (/ |k|), b = beta, qk = qn . kn; without gk,
 * a = exp(g) (1 without g); with gk (token stride gkt), the row decays ar = exp(g + gk) (rows of
 * K), kd = ar o kn, and qn scaled by ar in place (after qk). Then, for each pair (t, t + 1) of
 * gdr_cols (t even): kk[t], kq[t] = kn_t . kn_{t+1} and kn_t . qn_{t+1} (with gk: kn_t .
 * kd_{t+1} and kn_t . qn_{t+1}, the decays in); with a scalar gate the row ar_{t+1} =
 * a_{t+1} kn_t; with gk, in place, kd_{t+1} and qn_{t+1} times ar_t, ar_t = ar_t o ar_{t+1}
 * and ar_{t+1} = ar_{t+1} o kn_t. q, k: token strides qt, kt; beta, g: bt, gt. */
static void gdr_prep(long Tc, long K, const float *q, long qt, const float *k, long kt,
                     const float *beta, long bt, const float *g, long gt, const float *gk,
                     long gkt, float scale,
                     int l2norm, float *qn, float *kn, float *kd, float *ar, float *a,
                     float *b, float *qk, float *kk, float *kq) {
    for (long t = 0; t < Tc; ++t) {
        const float *qr = q + t * qt, *kr = k + t * kt;
        float *qt_ = qn + t * K, *kt_ = kn + t * K;
        float sq = scale, sk = 1.0f;
        if (l2norm) {
            sq *= 1.0f / sqrtf(dot(qr, qr, K) + GDR_EPS);
            sk = 1.0f / sqrtf(dot(kr, kr, K) + GDR_EPS);
        }
        scale_row(qt_, 0, 0, qr, sq, K);
        scale_row(kt_, 0, 0, kr, sk, K);
        b[t] = beta[t * bt];
        qk[t] = dot(qt_, kt_, K);
        if (gk) {
            /* exp flushed to 0 below -87 (sexp_nonpos / vexp_nonpos; -inf, a reset, is 0) */
            const float *gr = gk + t * gkt;
            float gt_ = g ? g[t * gt] : 0.0f, *at = ar + t * K, *kdt = kd + t * K;
            long i = 0;
            for (; i + W <= K; i += W) {
                vf e = vexp_nonpos(vload(gr + i) + gt_);
                vstore(at + i, e);
                vstore(kdt + i, e * vload(kt_ + i));
                vstore(qt_ + i, e * vload(qt_ + i));
            }
            for (; i < K; ++i) {
                at[i] = sexp_nonpos(gr[i] + gt_);
                kdt[i] = at[i] * kt_[i];
                qt_[i] *= at[i];
            }
            a[t] = 1.0f;
        } else {
            /* a subnormal decay (g in (-104, -87]) would make subnormal states, which cost
             * microcode assists in every later pass: 0 instead (sexp_nonpos flushes below -87) */
            a[t] = g ? sexp_nonpos(g[t * gt]) : 1.0f;
        }
    }
    for (long t = 0; t + 1 < Tc; t += 2) { /* for two tokens a pass (gdr_cols) */
        const float *k0 = kn + t * K;
        float *a0 = ar + t * K, *a1 = a0 + K; /* (unused rows without per-key gates) */
        if (!gk) {
            kk[t] = dot(k0, kn + (t + 1) * K, K), kq[t] = dot(k0, qn + (t + 1) * K, K);
            if (g) /* the update's row a_{t+1} k~_t */
                for (long i = 0; i < K; ++i) a1[i] = a[t + 1] * k0[i];
            continue;
        }
        /* per-key gates: the second token's sums and the pair's update rows */
        float *kd1 = kd + (t + 1) * K, *q1 = qn + (t + 1) * K;
        kk[t] = dot(k0, kd1, K), kq[t] = dot(k0, q1, K);
        for (long i = 0; i < K; ++i) {
            float x0 = a0[i], x1 = a1[i];
            kd1[i] *= x0, q1[i] *= x0;         /* a_t o a_{t+1} o k~_{t+1}, ... q~_{t+1} */
            a0[i] = x0 * x1, a1[i] = x1 * k0[i]; /* a_t o a_{t+1}, a_{t+1} o k~_t */
        }
    }
}

/* The sizes la_gdr_forward and its 16-bit form (gdr_forward_widened) refuse, returning -1:
 * one condition for both, so that they take the same calls. */
static inline int gdr_refused(long K, long V, long v0, long v1, long N, long T, long G,
                              long g0) {
    return K < 1 || V % W || v0 % W || v1 % W || v0 < 0 || v1 > V || v0 > v1 || N < 0 || T < 0
           || G < 1 || g0 < 0 || g0 >= G;
}

/* The (gated) delta rule over T tokens of N value heads (T = 1: one decoding step), columns
 * [v0, v1) of the state and the output (all V columns: v0 = 0, v1 = V; a subset lets threads
 * share one head). q, k: rows of K with head strides qs, ks and token strides qt, kt, one q/k
 * head per G value heads (grouped value attention, G >= 1): value head n reads q/k head
 * (g0 + n) / G from q, k, where g0 (0 <= g0 < G) is the place of value head 0 in its group (a
 * part of the heads starting inside a group). v, o: rows of V (head strides vs, os; token
 * strides vt, ot); beta, g: a float per token (head strides bs, gs, token strides bt, gt:
 * fla's (B, T, H) read in place), g NULL for no scalar gate; gk: per-key log-gates, rows of K
 * (head and token strides gks, gkt), NULL for none; S_in, S_out: (N, K, V) contiguous, S_out
 * may be S_in (in place). What the backward
 * (la_gdr_backward, scalar gates only) reads, where a gradient is wanted: ckpt (head stride cs)
 * the state before each chunk of GDR_TC tokens (ceil(T / GDR_TC) states of K x V), w (head and
 * token strides ws, wt; rows of V) each token's w = v_t - S'^T k~; both NULL otherwise. next:
 * NULL, or rows to ask for from memory while the last chunk runs (a caller's next chunk). work:
 * la_gdr_work(K) floats. Returns 0, or -1 on sizes it does not take (V, v0, v1 multiples of
 * the vector width W, 0 <= v0 <= v1 <= V, K >= 1, G >= 1, 0 <= g0 < G). */
static int la_gdr_forward(const float *q, long qs, long qt, const float *k, long ks, long kt,
                          long G, long g0, const float *v, long vs, long vt, const float *beta,
                          long bs, long bt, const float *g, long gs, long gt, const float *gk,
                          long gks, long gkt, long N, long T, long K, long V, long v0, long v1,
                          float scale, int l2norm, const float *S_in, float *S_out, float *o,
                          long os, long ot, float *ckpt, long cs, float *w, long ws, long wt,
                          const la_ahead *next, float *work) {
    if (gdr_refused(K, V, v0, v1, N, T, G, g0)) return -1;
    float *qn = work, *kn = qn + GDR_TC * K, *kd = kn + GDR_TC * K, *ar = kd + GDR_TC * K;
    float *a = ar + GDR_TC * K, *b = a + GDR_TC, *qk = b + GDR_TC, *kk = qk + GDR_TC;
    float *kq = kk + GDR_TC;
    int mode = gk ? GDR_ROWS : g ? GDR_SCALAR : GDR_PLAIN;
    unsigned long csr = la_subnormals_off();
    for (long n = 0; n < N; ++n) {
        const float *Sin = S_in + n * K * V;
        float *Sout = S_out + n * K * V;
        long m = (g0 + n) / G; /* this value head's q/k head */
        if (T == 0 && Sin != Sout) la_copy_cols(Sout, Sin, K, V, v0, v1);
        for (long t0 = 0; t0 < T; t0 += GDR_TC) {
            long Tc = T - t0 < GDR_TC ? T - t0 : GDR_TC;
            gdr_prep(Tc, K, q + m * qs + t0 * qt, qt, k + m * ks + t0 * kt, kt,
                     beta + n * bs + t0 * bt, bt, g ? g + n * gs + t0 * gt : NULL, gt,
                     gk ? gk + n * gks + t0 * gkt : NULL, gkt, scale, l2norm, qn, kn, kd, ar, a,
                     b, qk, kk, kq);
            if (ckpt) /* the state this chunk starts from, for the backward */
                la_copy_cols(ckpt + n * cs + (t0 / GDR_TC) * K * V, t0 == 0 ? Sin : Sout, K, V,
                             v0, v1);
            long t1 = t0 + Tc, Tn = T - t1 < GDR_TC ? T - t1 : GDR_TC; /* the next chunk */
            for (long j0 = v0; j0 < v1; j0 += GDR_NB * W) {
                int nb = (v1 - j0) / W < GDR_NB ? (int)((v1 - j0) / W) : GDR_NB;
                la_ahead ahead = la_chunk_ahead(
                    la_next_rows(q + m * qs, qt, k + m * ks, kt, v + n * vs + j0, vt,
                                 o + n * os + j0, ot, K, t1, Tn, j0 == v0),
                    next, Tn == 0 && n == N - 1, j0 == v0);
                gdr_cols_any(nb, mode, Tc, K, V, qn, kn, kd, ar, a, b, qk, kk, kq,
                             v + n * vs + t0 * vt + j0, vt, (t0 == 0 ? Sin : Sout) + j0,
                             Sout + j0, o + n * os + t0 * ot + j0, ot,
                             w ? w + n * ws + t0 * wt + j0 : NULL, wt, &ahead);
            }
        }
    }
    la_subnormals_restore(csr);
    return 0;
}

/* la_gdr_forward itself, for the step and the Python entry point: called through this
 * pointer, never a copy inlined or specialised for a call's constants (T = 1 in the step),
 * where the compiler may contract the multiply-adds differently (GCC's default
 * -ffp-contract=fast): so the step equals a one-token prefill bit for bit in every build, and a
 * step split over threads (la_gdr_forward's parts) equals one on the calling thread. */
static __typeof__(la_gdr_forward) *volatile gdr_forward_fn = la_gdr_forward;

/* la_gdr_forward on rows of dtype dt (LA_BF16, LA_F16: q, k, v and o; beta, the gates, the
 * states and what the backward reads, ckpt and w, float32, as the op's checks hand them):
 * each chunk of GDR_TC tokens of each head read into float32 rows first (exact; q, k rows of
 * K, v rows of V, in the scratch after la_gdr_work(K)) and o rounded once as it is written:
 * the same chunks of the same function as on float32 rows, without a widened copy of each
 * whole input and of o; the next chunk's 16-bit rows are asked for while this one runs
 * (la_next_rows16). A chunk is one checkpoint interval, so each call writes the checkpoint
 * before it (ckpt: head stride cs, NULL: none) and its tokens' w (strides ws, wt); the chunked
 * form on tiles (chunk_dp) makes no w and runs only without them. work:
 * la_gdr_forward_work(K, V, dt) floats. */
long la_gdr_forward_work(long K, long V, int dt) {
    return la_gdr_work(K) + (dt == LA_F32 ? 0 : GDR_TC * (2 * K + 2 * V + 2))
           + chunk_dp_scratch(dt, GDR_DP_C, K, V);
}

static int gdr_forward_widened(const void *q, long qs, long qt, const void *k, long ks, long kt,
                               long G, long g0, const void *v, long vs, long vt,
                               const float *beta, long bs, long bt, const float *g, long gs,
                               long gt, const float *gk, long gks, long gkt, int dt, long N,
                               long T, long K, long V, long v0, long v1, float scale, int l2norm,
                               const float *S_in, float *S_out, void *o, long os, long ot,
                               float *ckpt, long cs, float *w, long ws, long wt, float *work) {
    if (gdr_refused(K, V, v0, v1, N, T, G, g0)) return -1;
    float *qw = work + la_gdr_work(K), *kw = qw + GDR_TC * K, *vw = kw + GDR_TC * K;
    float *ow = vw + GDR_TC * V;
#if defined(LA_DP_BF16)
    /* a chunk's beta and g, consecutive, after chunk_dp's scratch (at ow + GDR_TC V) */
    float *bw = ow + GDR_TC * V + chunk_dp_scratch(dt, GDR_DP_C, K, V), *gw = bw + GDR_TC;
    /* whole chunks of bfloat16 rows without per-key gates on tiles: the chunked form
     * (chunk_dp in ops/native/tiles.h) */
    int chunked = !ckpt && !w /* (the chunked form makes no w for the backward) */
                  && chunk_dp_takes(dt, gk != NULL, GDR_DP_C, K, V, v0, v1, q, qs, qt, k, ks, kt);
    int held = chunked ? amx_hold() : 0; /* the tiles configured once for all the chunks */
#endif
    for (long n = 0; n < N; ++n) {
        const float *Sin = S_in + n * K * V;
        float *Sout = S_out + n * K * V;
        long m = (g0 + n) / G; /* this value head's q/k head */
        if (T == 0 && Sin != Sout) la_copy_cols(Sout, Sin, K, V, v0, v1);
        for (long t0 = 0; t0 < T; t0 += GDR_TC) {
            long Tc = T - t0 < GDR_TC ? T - t0 : GDR_TC;
            long t1 = t0 + Tc, Tn = T - t1 < GDR_TC ? T - t1 : GDR_TC;
            const u16 *q16 = q, *k16 = k, *v16 = v;
            la_ahead next = la_next_rows16(q16 + m * qs, qt, k16 + m * ks, kt, v16 + n * vs + v0,
                                           vt, (u16 *)o + n * os + v0, ot, K, v1 - v0, t1, Tn);
#if defined(LA_DP_BF16)
            if (chunked && Tc == GDR_TC) { /* chunk_dp (tiles.h) reads the 16-bit rows */
                /* and beta and g a float a token, consecutive (gathered where they are not) */
                const float *bc = beta + n * bs + t0 * bt, *gc = g ? g + n * gs + t0 * gt : NULL;
                if (bt != 1) {
                    for (long t = 0; t < Tc; ++t) bw[t] = bc[t * bt];
                    bc = bw;
                }
                if (gc && gt != 1) {
                    for (long t = 0; t < Tc; ++t) gw[t] = gc[t * gt];
                    gc = gw;
                }
                for (long c0 = 0; c0 < GDR_TC; c0 += GDR_DP_C) {
                    long t = t0 + c0;
                    chunk_dp(GDR_DP_C, K, V, q16 + m * qs + t * qt, qt, k16 + m * ks + t * kt,
                             kt, v16 + n * vs + t * vt, vt, gc ? gc + c0 : NULL, bc + c0, scale,
                             l2norm, GDR_EPS, t == 0 ? Sin : Sout, Sout, ow + c0 * V, &next, c0,
                             ow + GDR_TC * V);
                }
                la_narrowed_rows(o, n * os + t0 * ot, ot, ow, Tc, V, v0, v1, dt);
                continue;
            }
#endif
            la_widened_rows(qw, q, m * qs + t0 * qt, qt, Tc, K, dt);
            la_widened_rows(kw, k, m * ks + t0 * kt, kt, Tc, K, dt);
            la_widened_rows(vw, v, n * vs + t0 * vt, vt, Tc, V, dt);
            int rc = gdr_forward_fn(qw, 0, K, kw, 0, K, 1, 0, vw, 0, V,
                                    beta + n * bs + t0 * bt, 0, bt,
                                    g ? g + n * gs + t0 * gt : NULL, 0, gt,
                                    gk ? gk + n * gks + t0 * gkt : NULL, 0, gkt, 1, Tc, K, V,
                                    v0, v1, scale, l2norm, t0 == 0 ? Sin : Sout, Sout, ow, 0, V,
                                    ckpt ? ckpt + n * cs + t0 / GDR_TC * K * V : NULL, 0,
                                    w ? w + n * ws + t0 * wt : NULL, 0, wt, &next, work);
            if (rc) {
#if defined(LA_DP_BF16)
                amx_unhold(held);
#endif
                return rc;
            }
            la_narrowed_rows(o, n * os + t0 * ot, ot, ow, Tc, V, v0, v1, dt);
        }
    }
#if defined(LA_DP_BF16)
    amx_unhold(held);
#endif
    return 0;
}

/* One decoding step of N value heads with contiguous rows (q, k (N / G, K): one q/k head per G
 * value heads; v, o (N, V); beta, g (N); gk (N, K) or NULL), all of dtype dt (LA_F32,
 * LA_BF16, LA_F16; the state is float32): la_gdr_forward with T = 1, in fewer arguments, its
 * heads in parts on up to `threads` threads (la_parallel). Other dtypes: each part reads its
 * own heads' rows into float32 (exact) in its thread's scratch, and rounds its o once at the
 * end: the float32 step on the widened inputs. (Widened by the calling thread instead, every
 * other thread's rows had to come over from the calling core's cache: bfloat16 on two threads
 * then took longer than on one.) work: la_gdr_step_work(N, G, K, V, threads, dt) floats. It
 * also checks the step's values, which the Python side then need not (a tensor reduction
 * there costs more than this whole loop): returns -2 if a beta is NaN or infinite, -3 if a
 * log-gate (scalar or per-key) is NaN or positive, before anything is written; else 0, or 1
 * when it was split and the other threads were late (la_parallel). */

/* Floats of one thread's scratch: the kernel's, then for 16-bit rows a part's inputs widened
 * and its o (a part of `per` value heads reads at most (per - 1) / G + 2 q/k heads: it may
 * start inside a group of G), in whole cache lines so that no two threads share one. */
static long gdr_step_slot(long N, long G, long K, long V, int threads, int dt) {
    long per = la_per_part(N, threads), nq = (per - 1) / G + 2;
    long widened = dt == LA_F32 ? 0 : 2 * nq * K + 2 * per * V + 2 * per + per * K;
    return la_lines(la_gdr_work(K) + widened);
}

long la_gdr_step_work(long N, long G, long K, long V, int threads, int dt) {
    return (threads > 1 ? threads : 1) * gdr_step_slot(N, G, K, V, threads, dt);
}

typedef struct {
    const void *q, *k, *v, *beta, *g, *gk;
    long N, G, K, V, per, slot;
    float scale;
    int l2norm, dt;
    const float *S_in;
    float *S_out;
    void *o;
    float *work;
} gdr_step_job;

static void gdr_step_part(void *ctx, long part, int slot) {
    const gdr_step_job *j = ctx;
    long K = j->K, V = j->V, G = j->G, n0 = part * j->per;
    long n = j->N - n0 < j->per ? j->N - n0 : j->per;
    long m0 = n0 / G, nq = (n0 + n - 1) / G - m0 + 1; /* the part's q/k heads */
    int dt = j->dt;
    float *work = j->work + slot * j->slot;
    const float *q, *k, *v, *beta, *g, *gk;
    float *o;
    if (dt == LA_F32) {
        q = (const float *)j->q + m0 * K, k = (const float *)j->k + m0 * K;
        v = (const float *)j->v + n0 * V, beta = (const float *)j->beta + n0;
        g = j->g ? (const float *)j->g + n0 : NULL;
        gk = j->gk ? (const float *)j->gk + n0 * K : NULL;
        o = (float *)j->o + n0 * V;
    } else { /* this part's rows, widened in this thread's scratch */
        float *f = work + la_gdr_work(K);
        q = la_widened(f, (const u16 *)j->q + m0 * K, nq * K, dt), f += nq * K;
        k = la_widened(f, (const u16 *)j->k + m0 * K, nq * K, dt), f += nq * K;
        v = la_widened(f, (const u16 *)j->v + n0 * V, n * V, dt), f += n * V;
        beta = la_widened(f, (const u16 *)j->beta + n0, n, dt), f += n;
        g = j->g ? la_widened(f, (const u16 *)j->g + n0, n, dt) : NULL, f += n;
        gk = j->gk ? la_widened(f, (const u16 *)j->gk + n0 * K, n * K, dt) : NULL, f += n * K;
        o = f;
    }
    /* value heads n0 .. n0 + n - 1: their first q/k head is m0, n0 % G their place there */
    gdr_forward_fn(q, K, K, k, K, K, G, n0 % G, v, V, V, beta, 1, 1, g, 1, 1, gk, K, K, n, 1, K,
                   V, 0, V, j->scale, j->l2norm, j->S_in + n0 * K * V, j->S_out + n0 * K * V, o,
                   V, V, NULL, 0, NULL, 0, 0, NULL, work);
    if (dt != LA_F32) la_narrowed((u16 *)j->o + n0 * V, o, 0, n * V, dt);
}

static int la_gdr_step(const void *q, const void *k, const void *v, const void *beta,
                       const void *g, const void *gk, int dt, long N, long G, long K, long V,
                       float scale, int l2norm, const float *S_in, float *S_out, void *o,
                       float *work, int threads) {
    if (K < 1 || V % W || N < 0 || G < 1 || dt < LA_F32 || dt > LA_F16) return -1;
    for (long n = 0; n < N; ++n) {
        float b = load_dt(beta, n, dt);
        if (!(b - b == 0.0f)) return -2; /* nan or +-inf */
    }
    if ((g && !la_all_nonpositive(g, N, dt)) || (gk && !la_all_nonpositive(gk, N * K, dt)))
        return -3;
    gdr_step_job job = {q, k, v, beta, g, gk, N, G, K, V, la_per_part(N, threads),
                        gdr_step_slot(N, G, K, V, threads, dt), scale, l2norm, dt, S_in, S_out,
                        o, work};
    return N > 0 ? la_parallel(gdr_step_part, &job, (N + job.per - 1) / job.per, threads) : 0;
}

#include "kernels_backward.c" /* la_gdr_backward and its helpers */

/* ------------------------------------------------------------------ the Python entry points
 * One argument struct per kernel (ops/native/common.h); linattn/ops/delta/native.py mirrors
 * each in ctypes and the layouts are checked against la_delta_abi when the library loads. */
#define LA_GDR_FORWARD_ARGS(X, la_s) \
    X(la_s, const void *, q, 'p') X(la_s, long, qs, 'l') X(la_s, long, qt, 'l') \
    X(la_s, const void *, k, 'p') X(la_s, long, ks, 'l') X(la_s, long, kt, 'l') \
    X(la_s, long, G, 'l') X(la_s, long, g0, 'l') \
    X(la_s, const void *, v, 'p') X(la_s, long, vs, 'l') X(la_s, long, vt, 'l') \
    X(la_s, const float *, beta, 'p') X(la_s, long, bs, 'l') X(la_s, long, bt, 'l') \
    X(la_s, const float *, g, 'p') X(la_s, long, gs, 'l') X(la_s, long, gt, 'l') \
    X(la_s, const float *, gk, 'p') X(la_s, long, gks, 'l') X(la_s, long, gkt, 'l') \
    X(la_s, int, dt, 'i') X(la_s, long, N, 'l') X(la_s, long, T, 'l') \
    X(la_s, long, K, 'l') X(la_s, long, V, 'l') X(la_s, long, v0, 'l') X(la_s, long, v1, 'l') \
    X(la_s, float, scale, 'f') X(la_s, int, l2norm, 'i') X(la_s, const float *, S_in, 'p') \
    X(la_s, float *, S_out, 'p') X(la_s, void *, o, 'p') X(la_s, long, os, 'l') \
    X(la_s, long, ot, 'l') X(la_s, float *, ckpt, 'p') X(la_s, long, cs, 'l') \
    X(la_s, float *, w, 'p') X(la_s, long, ws, 'l') X(la_s, long, wt, 'l') \
    X(la_s, float *, work, 'p')
LA_ARGS(la_gdr_forward_args, LA_GDR_FORWARD_ARGS)
int la_gdr_forward_call(const la_gdr_forward_args *a) {
    if (a->dt != LA_F32) /* 16-bit rows, a chunk at a time (with what the backward reads) */
        return a->dt < LA_F32 || a->dt > LA_F16 ? -1
               : gdr_forward_widened(a->q, a->qs, a->qt, a->k, a->ks, a->kt, a->G, a->g0, a->v,
                                     a->vs, a->vt, a->beta, a->bs, a->bt, a->g, a->gs, a->gt,
                                     a->gk, a->gks, a->gkt, a->dt, a->N, a->T, a->K, a->V,
                                     a->v0, a->v1, a->scale, a->l2norm, a->S_in, a->S_out,
                                     a->o, a->os, a->ot, a->ckpt, a->cs, a->w, a->ws, a->wt,
                                     a->work);
    return (int)gdr_forward_fn(a->q, a->qs, a->qt, a->k, a->ks, a->kt, a->G, a->g0, a->v, a->vs,
            a->vt, a->beta, a->bs, a->bt, a->g, a->gs, a->gt, a->gk, a->gks, a->gkt, a->N, a->T,
            a->K, a->V, a->v0, a->v1, a->scale, a->l2norm, a->S_in, a->S_out, a->o, a->os, a->ot,
            a->ckpt, a->cs, a->w, a->ws, a->wt, NULL, a->work);
}

#define LA_GDR_STEP_ARGS(X, la_s) \
    X(la_s, const void *, q, 'p') X(la_s, const void *, k, 'p') X(la_s, const void *, v, 'p') \
    X(la_s, const void *, beta, 'p') X(la_s, const void *, g, 'p') \
    X(la_s, const void *, gk, 'p') X(la_s, int, dt, 'i') X(la_s, long, N, 'l') \
    X(la_s, long, G, 'l') X(la_s, long, K, 'l') X(la_s, long, V, 'l') X(la_s, float, scale, 'f') \
    X(la_s, int, l2norm, 'i') X(la_s, const float *, S_in, 'p') X(la_s, float *, S_out, 'p') \
    X(la_s, void *, o, 'p') X(la_s, float *, work, 'p') X(la_s, int, threads, 'i')
LA_ENTRY(la_gdr_step, LA_GDR_STEP_ARGS)

#define LA_GDR_BACKWARD_ARGS(X, la_s) \
    X(la_s, const void *, q, 'p') X(la_s, long, qs, 'l') X(la_s, long, qt, 'l') \
    X(la_s, const void *, k, 'p') X(la_s, long, ks, 'l') X(la_s, long, kt, 'l') \
    X(la_s, const float *, beta, 'p') X(la_s, long, bs, 'l') X(la_s, const float *, g, 'p') \
    X(la_s, long, gs, 'l') X(la_s, long, N, 'l') X(la_s, long, T, 'l') X(la_s, long, K, 'l') \
    X(la_s, long, V, 'l') X(la_s, float, scale, 'f') X(la_s, int, l2norm, 'i') \
    X(la_s, const float *, ckpt, 'p') X(la_s, long, cs, 'l') X(la_s, const float *, w, 'p') \
    X(la_s, long, ws, 'l') X(la_s, long, wt, 'l') X(la_s, const void *, dout, 'p') \
    X(la_s, long, dos, 'l') X(la_s, long, dot, 'l') X(la_s, const float *, dS, 'p') \
    X(la_s, float *, dS0, 'p') X(la_s, void *, dq, 'p') X(la_s, long, dqs, 'l') \
    X(la_s, long, dqt, 'l') X(la_s, void *, dk, 'p') X(la_s, long, dks, 'l') \
    X(la_s, long, dkt, 'l') X(la_s, void *, dv, 'p') X(la_s, long, dvs, 'l') \
    X(la_s, long, dvt, 'l') X(la_s, float *, dbeta, 'p') X(la_s, long, dbs, 'l') \
    X(la_s, float *, dg, 'p') X(la_s, long, dgs, 'l') X(la_s, int, dt, 'i') \
    X(la_s, float *, work, 'p')
LA_ENTRY(la_gdr_backward, LA_GDR_BACKWARD_ARGS)

static const la_struct la_delta_structs[] = {
    LA_STRUCT_ENTRY(la_gdr_forward_args),
    LA_STRUCT_ENTRY(la_gdr_step_args),
    LA_STRUCT_ENTRY(la_gdr_backward_args),
};
LA_ABI_TABLE(la_delta_abi, la_delta_structs)
