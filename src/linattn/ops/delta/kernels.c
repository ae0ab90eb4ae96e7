/* The (gated) delta-rule kernels of linattn.ops.delta.native (see ops/native/common.h). */
#ifndef LA_COMMON_H
#include "../native/common.h"
#endif

/* ------------------------------------------------ the (gated) delta rule, forward, float32
 * Per head, state S (K x V, rows of V floats), token t with log-gate g_t (none: 0), strength
 * beta_t and q~ = s q_t, k~ = k_t (each divided by sqrt(sum x^2 + 1e-6) first with l2norm):
 *     a = exp(g_t),  u = beta_t (v_t - a S^T k~),  S <- a S + k~ u^T,
 *     o_t = S^T q~ = a (S_old^T q~) + (q~ . k~) u.
 * Column j of S, u and o depends on column j of S and v_t only, so the kernels walk one block
 * of columns (GDR_NB vectors) at a time, through all the tokens of a chunk of GDR_TC: the block
 * stays in L1, and the pass that writes token t's state also sums k~_{t+1}^T S and
 * q~_{t+1}^T S for the next token, so each token costs one pass over S (one load, one store
 * and four multiply-adds per element with a gate, three without). This is the sequential
 * recurrence, exact in float32 arithmetic: at K = V = 64 it needs fewer operations per token
 * (3 K V multiply-adds + K V multiplies) than the chunked WY form (3 K V + C (3 K / 2 + V)
 * multiply-adds) and no triangular solve.
 * The step is T = 1. */
#if LA_W == 8 || (LA_W == 4 && !(defined(__ARM_NEON) || defined(__ARM_NEON__)))
#define GDR_NB 2 /* 16 registers: u, two sums and a row of S per vector, plus broadcasts */
#else
#define GDR_NB 4 /* 32 registers (AVX-512, NEON), or scalars */
#endif
#define GDR_TC 64 /* tokens prepared at a time (normalised q, k; gates) */
#define GDR_EPS 1e-6f

/* Floats of work la_gdr_forward needs for a head dimension K. */
long la_gdr_work(long K) { return GDR_TC * (2 * K + 3); }

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

/* Sout[i] = a Sin[i] + kn[i] u (i < K) over the block (a = 1 unless gated); with next, also
 * kacc = Sout^T kn1 and qacc = Sout^T qn1 (the next token's sums). Sout may be Sin. */
static inline __attribute__((always_inline)) void gdr_update(int nb, int gated, int next,
                                                             long K, const float *Sin,
                                                             float *Sout, long V, float a,
                                                             const float *kn, const vf *u,
                                                             const float *kn1,
                                                             const float *qn1, vf *kacc,
                                                             vf *qacc) {
    vf ka[GDR_NB], qa[GDR_NB], av = vsplat(a);
    for (int j = 0; j < nb; ++j) ka[j] = qa[j] = vsplat(0.0f);
    for (long i = 0; i < K; ++i) {
        vf ki = vsplat(kn[i]);
        vf k1 = vsplat(next ? kn1[i] : 0.0f), q1 = vsplat(next ? qn1[i] : 0.0f);
        for (int j = 0; j < nb; ++j) {
            vf s = vload(Sin + i * V + j * W);
            s = gated ? av * s + ki * u[j] : s + ki * u[j];
            vstore(Sout + i * V + j * W, s);
            if (next) {
                ka[j] += k1 * s;
                qa[j] += q1 * s;
            }
        }
    }
    if (next)
        for (int j = 0; j < nb; ++j) kacc[j] = ka[j], qacc[j] = qa[j];
}

/* Tokens [0, Tc) of one head's prepared chunk (qn, kn rows of K; a, b, qk one per token) over
 * the block of nb vectors of columns at Sin / Sout / v / o (offset to the block already): the
 * first token reads Sin, every token writes Sout (which may be Sin). v, o: token strides vt,
 * ot. */
static inline __attribute__((always_inline)) void gdr_cols(int nb, int gated, long Tc, long K,
                                                           long V, const float *qn,
                                                           const float *kn, const float *a,
                                                           const float *b, const float *qk,
                                                           const float *v, long vt,
                                                           const float *Sin, float *Sout,
                                                           float *o, long ot) {
    vf ka[GDR_NB], qa[GDR_NB], u[GDR_NB];
    gdr_dots(nb, K, Sin, V, kn, qn, ka, qa);
    for (long t = 0; t < Tc; ++t) {
        float at = gated ? a[t] : 1.0f;
        vf bt = vsplat(b[t]), qkt = vsplat(qk[t]);
        for (int j = 0; j < nb; ++j) {
            vf vj = vload(v + t * vt + j * W);
            u[j] = gated ? bt * (vj - at * ka[j]) : bt * (vj - ka[j]);
            vstore(o + t * ot + j * W, (gated ? at * qa[j] : qa[j]) + qkt * u[j]);
        }
        const float *src = t == 0 ? Sin : Sout;
        if (t + 1 < Tc)
            gdr_update(nb, gated, 1, K, src, Sout, V, at, kn + t * K, u, kn + (t + 1) * K,
                       qn + (t + 1) * K, ka, qa);
        else
            gdr_update(nb, gated, 0, K, src, Sout, V, at, kn + t * K, u, NULL, NULL, ka, qa);
    }
}

/* gdr_cols specialised for constant (nb, gated): the sums stay in registers. */
static void gdr_cols_any(int nb, int gated, long Tc, long K, long V, const float *qn,
                         const float *kn, const float *a, const float *b, const float *qk,
                         const float *v, long vt, const float *Sin, float *Sout, float *o,
                         long ot) {
/* Cases beyond this ISA's GDR_NB are constant-false (and never asked for). */
#define G_(c, gt)                                                                             \
    case c * 2 + gt:                                                                          \
        if (c <= GDR_NB)                                                                      \
            gdr_cols(c <= GDR_NB ? c : GDR_NB, gt, Tc, K, V, qn, kn, a, b, qk, v, vt, Sin,    \
                     Sout, o, ot);                                                            \
        break;
    switch (nb * 2 + gated) {
        G_(1, 0) G_(1, 1) G_(2, 0) G_(2, 1) G_(3, 0) G_(3, 1) G_(4, 0) G_(4, 1)
        default: break;
    }
#undef G_
}

/* Prepare Tc tokens: qn = s q (/ |q|), kn = k (/ |k|), a = exp(g) (1 without g), b = beta,
 * qk = qn . kn. q, k: token strides qt, kt; beta, g: one float per token. */
static void gdr_prep(long Tc, long K, const float *q, long qt, const float *k, long kt,
                     const float *beta, const float *g, float scale, int l2norm, float *qn,
                     float *kn, float *a, float *b, float *qk) {
    for (long t = 0; t < Tc; ++t) {
        const float *qr = q + t * qt, *kr = k + t * kt;
        float sq = scale, sk = 1.0f;
        if (l2norm) {
            sq *= 1.0f / sqrtf(dot(qr, qr, K) + GDR_EPS);
            sk = 1.0f / sqrtf(dot(kr, kr, K) + GDR_EPS);
        }
        scale_row(qn + t * K, 0, 0, qr, sq, K);
        scale_row(kn + t * K, 0, 0, kr, sk, K);
        /* a subnormal decay (g in (-104, -87]) would make subnormal states, which cost
         * microcode assists in every later pass: 0 instead (sexp_nonpos flushes below -87) */
        a[t] = g ? sexp_nonpos(g[t]) : 1.0f;
        b[t] = beta[t];
        qk[t] = dot(qn + t * K, kn + t * K, K);
    }
}

/* The (gated) delta rule over T tokens of N heads (T = 1: one decoding step), columns
 * [v0, v1) of the state and the output (all V columns: v0 = 0, v1 = V; a subset lets threads
 * share one head). q, k: rows of K with head strides qs, ks and token strides qt, kt; v, o:
 * rows of V (head strides vs, os; token strides vt, ot); beta, g: T floats per head (head
 * strides bs, gs), g NULL for the ungated rule; S_in, S_out: (N, K, V) contiguous, S_out may
 * be S_in (in place). work: la_gdr_work(K) floats. Returns 0, or -1 on sizes it does not take
 * (V, v0, v1 multiples of the vector width W, 0 <= v0 <= v1 <= V, K >= 1). */
static int la_gdr_forward(const float *q, long qs, long qt, const float *k, long ks, long kt,
                   const float *v, long vs, long vt, const float *beta, long bs, const float *g,
                   long gs, long N, long T, long K, long V, long v0, long v1, float scale,
                   int l2norm, const float *S_in, float *S_out, float *o, long os, long ot,
                   float *work) {
    if (K < 1 || V % W || v0 % W || v1 % W || v0 < 0 || v1 > V || v0 > v1 || N < 0 || T < 0)
        return -1;
    float *qn = work, *kn = qn + GDR_TC * K, *a = kn + GDR_TC * K, *b = a + GDR_TC;
    float *qk = b + GDR_TC;
    for (long n = 0; n < N; ++n) {
        const float *Sin = S_in + n * K * V;
        float *Sout = S_out + n * K * V;
        if (T == 0 && Sin != Sout)
            for (long i = 0; i < K; ++i)
                memcpy(Sout + i * V + v0, Sin + i * V + v0, (size_t)(v1 - v0) * sizeof(float));
        for (long t0 = 0; t0 < T; t0 += GDR_TC) {
            long Tc = T - t0 < GDR_TC ? T - t0 : GDR_TC;
            gdr_prep(Tc, K, q + n * qs + t0 * qt, qt, k + n * ks + t0 * kt, kt,
                     beta + n * bs + t0, g ? g + n * gs + t0 : NULL, scale, l2norm, qn, kn, a,
                     b, qk);
            for (long j0 = v0; j0 < v1; j0 += GDR_NB * W) {
                int nb = (v1 - j0) / W < GDR_NB ? (int)((v1 - j0) / W) : GDR_NB;
                gdr_cols_any(nb, g != NULL, Tc, K, V, qn, kn, a, b, qk,
                             v + n * vs + t0 * vt + j0, vt, (t0 == 0 ? Sin : Sout) + j0,
                             Sout + j0, o + n * os + t0 * ot + j0, ot);
            }
        }
    }
    return 0;
}

/* One decoding step of N heads with contiguous rows (q, k (N, K); v, o (N, V); beta, g (N)):
 * la_gdr_forward with T = 1, in fewer arguments. It also checks the step's values, which the
 * Python side then need not (a tensor reduction there costs more than this whole loop): returns
 * -2 if a beta is NaN, -3 if a log-gate is NaN or positive, before anything is written. */
static int la_gdr_step(const float *q, const float *k, const float *v, const float *beta,
                       const float *g, long N, long K, long V, float scale, int l2norm,
                       const float *S_in, float *S_out, float *o, float *work) {
    for (long n = 0; n < N; ++n) {
        if (beta[n] != beta[n]) return -2;
        if (g && !(g[n] <= 0.0f)) return -3;
    }
    return la_gdr_forward(q, K, K, k, K, K, v, V, V, beta, 1, g, 1, N, 1, K, V, 0, V, scale,
                          l2norm, S_in, S_out, o, V, V, work);
}

/* ------------------------------------------------------------------ the Python entry points
 * One argument struct per kernel (ops/native/common.h); linattn/ops/delta/native.py mirrors
 * each in ctypes and the layouts are checked against la_delta_abi when the library loads. */
#define LA_GDR_FORWARD_ARGS(X, la_s) \
    X(la_s, const float *, q, 'p') X(la_s, long, qs, 'l') X(la_s, long, qt, 'l') \
    X(la_s, const float *, k, 'p') X(la_s, long, ks, 'l') X(la_s, long, kt, 'l') \
    X(la_s, const float *, v, 'p') X(la_s, long, vs, 'l') X(la_s, long, vt, 'l') \
    X(la_s, const float *, beta, 'p') X(la_s, long, bs, 'l') X(la_s, const float *, g, 'p') \
    X(la_s, long, gs, 'l') X(la_s, long, N, 'l') X(la_s, long, T, 'l') X(la_s, long, K, 'l') \
    X(la_s, long, V, 'l') X(la_s, long, v0, 'l') X(la_s, long, v1, 'l') X(la_s, float, scale, 'f') \
    X(la_s, int, l2norm, 'i') X(la_s, const float *, S_in, 'p') X(la_s, float *, S_out, 'p') \
    X(la_s, float *, o, 'p') X(la_s, long, os, 'l') X(la_s, long, ot, 'l') X(la_s, float *, work, 'p')
LA_ARGS(la_gdr_forward_args, LA_GDR_FORWARD_ARGS)
int la_gdr_forward_call(const la_gdr_forward_args *a) {
    return (int)la_gdr_forward(a->q, a->qs, a->qt, a->k, a->ks, a->kt, a->v, a->vs, a->vt, a->beta,
            a->bs, a->g, a->gs, a->N, a->T, a->K, a->V, a->v0, a->v1, a->scale, a->l2norm, a->S_in,
            a->S_out, a->o, a->os, a->ot, a->work);
}

#define LA_GDR_STEP_ARGS(X, la_s) \
    X(la_s, const float *, q, 'p') X(la_s, const float *, k, 'p') X(la_s, const float *, v, 'p') \
    X(la_s, const float *, beta, 'p') X(la_s, const float *, g, 'p') X(la_s, long, N, 'l') \
    X(la_s, long, K, 'l') X(la_s, long, V, 'l') X(la_s, float, scale, 'f') X(la_s, int, l2norm, 'i') \
    X(la_s, const float *, S_in, 'p') X(la_s, float *, S_out, 'p') X(la_s, float *, o, 'p') \
    X(la_s, float *, work, 'p')
LA_ARGS(la_gdr_step_args, LA_GDR_STEP_ARGS)
int la_gdr_step_call(const la_gdr_step_args *a) {
    return (int)la_gdr_step(a->q, a->k, a->v, a->beta, a->g, a->N, a->K, a->V, a->scale, a->l2norm,
            a->S_in, a->S_out, a->o, a->work);
}

static const la_struct la_delta_structs[] = {
    LA_STRUCT_ENTRY(la_gdr_forward_args),
    LA_STRUCT_ENTRY(la_gdr_step_args),
};
LA_ABI_TABLE(la_delta_abi, la_delta_structs)
