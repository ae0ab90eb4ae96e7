/* Stand-alone checks of the (gated) delta rule's kernels (src/linattn/ops/delta/kernels.c and
 * its backward part), without Python or torch:
 *
 *   cc -O3 -march=native -o /tmp/delta_harness tests/c/delta_harness.c -lm && /tmp/delta_harness
 *
 * for building the kernels in every vector form (-DLA_W=1/4/8/16 or whatever the -m flags pick)
 * and on other ISAs (an aarch64 build under qemu), as tests/c/native_harness.c does for the
 * linear-attention kernels. Two parts, each from its own seed, each with its PASS or FAIL line:
 *
 * 1. la_gdr_forward against a naive double-precision recurrence. Reference, per value head n (q/k
 * head n / G: grouped value attention): row decays a_i = exp(g_t + gk_t,i) (a missing gate counts
 * as 0), qn = s q_t, kn = k_t (each divided by sqrt(sum x^2 + 1e-6) first with l2norm), S' =
 * diag(a) S, u = beta_t (v_t - S'^T kn), S <- S' + kn u^T, o_t = S^T qn. Checked: no gate, a
 * scalar gate, per-key gates (KDA, with a reset gk = -inf and a decay below the subnormal flush)
 * and both, l2norm and not, G = 1, 2, 3, (K, V) with K not a multiple of any width, T = 0, 1, 5,
 * 64 (one token chunk), 65 and 150 (partial chunks), head and token strides larger than the rows,
 * S_out apart from S_in and in place, the columns computed in two calls (v0, v1) as threads share
 * a head, and the heads in two calls split inside a group (g0); la_gdr_step (T = 1, contiguous)
 * against la_gdr_forward bit for bit, with and without GVA and per-key gates. Buffers carry NaN
 * guards past their ends and in the gaps between rows, which must come back untouched (and, if
 * read, spread NaN into results). Errors are max |kernel - reference| / max |reference| per array;
 * above FWD_TOL the run fails.
 *
 * 2. la_gdr_backward (ops/delta/kernels_backward.c) and what la_gdr_forward saves for it (the
 * state before each chunk of GDR_TC tokens, and w = v - a S^T k~ per token), against a naive
 * double-precision reverse pass over every stored state. The double reference is itself checked
 * against central finite differences of the double forward on small problems (so that the
 * derivation, not only its transcription into the kernel, is tested). Loss: L = sum_t dout_t . o_t
 * + <dS, S_T>. Checked: gated and not, l2norm and not, K not a multiple of any width (7, 20) and
 * wider than a register tile (80), V of one to four blocks of 16, T = 0, 1, 5, 64 (one chunk), 65
 * and 150 (partial chunks), dS given or NULL, head and token strides larger than the rows, and NaN
 * guards around every output (only the rows may be written). Errors are max |kernel - reference| /
 * max |reference| per array; above BWD_TOL the run fails.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/linattn/ops/delta/kernels.c"

/* Through volatile pointers: what runs is the code a shared library exports, not a clone
 * specialised for this file's constants. */
static __typeof__(la_gdr_forward) *volatile gdr_forward = la_gdr_forward;
static __typeof__(la_gdr_backward) *volatile gdr_backward = la_gdr_backward;

#define FWD_TOL 2e-5 /* la_gdr_forward */
#define BWD_TOL 1e-4 /* la_gdr_backward */
/* each part starts from its own seed again (main) */
#define HARNESS_SEED 0x2545F4914F6CDD1Dull
#include "harness_common.h"

static void fwd_expect(const char *what, double err, const char *cfg) {
    expect_within(what, err, FWD_TOL, cfg);
}

/* ------------------------------------------------------------------ 1. la_gdr_forward */
static void fwd_reference(long N, long G, long T, long K, long V, const float *q, long qs, long qt,
                      const float *k, long ks, long kt, const float *v, long vs, long vt,
                      const float *beta, const float *g, const float *gk, float scale,
                      int l2norm, const float *S0, double *S, double *o) {
    double *qn = malloc(K * sizeof(double)), *kn = malloc(K * sizeof(double));
    double *u = malloc(V * sizeof(double)), *kS = malloc(V * sizeof(double));
    double *a = malloc(K * sizeof(double));
    for (long n = 0; n < N; ++n) {
        double *Sn = S + n * K * V;
        long m = n / G;
        for (long i = 0; i < K * V; ++i) Sn[i] = S0[n * K * V + i];
        for (long t = 0; t < T; ++t) {
            const float *qr = q + m * qs + t * qt, *kr = k + m * ks + t * kt;
            double nq = 0, nk = 0;
            for (long i = 0; i < K; ++i) nq += (double)qr[i] * qr[i], nk += (double)kr[i] * kr[i];
            double cq = l2norm ? 1.0 / sqrt(nq + 1e-6) : 1.0, ck = l2norm ? 1.0 / sqrt(nk + 1e-6) : 1.0;
            for (long i = 0; i < K; ++i) qn[i] = scale * cq * qr[i], kn[i] = ck * kr[i];
            for (long i = 0; i < K; ++i)
                a[i] = (g ? exp((double)g[n * T + t]) : 1.0)
                       * (gk ? exp((double)gk[(n * T + t) * K + i]) : 1.0);
            double b = beta[n * T + t];
            for (long i = 0; i < K; ++i)
                for (long j = 0; j < V; ++j) Sn[i * V + j] *= a[i];
            for (long j = 0; j < V; ++j) {
                kS[j] = 0;
                for (long i = 0; i < K; ++i) kS[j] += kn[i] * Sn[i * V + j];
                u[j] = b * ((double)v[n * vs + t * vt + j] - kS[j]);
            }
            for (long i = 0; i < K; ++i)
                for (long j = 0; j < V; ++j) Sn[i * V + j] += kn[i] * u[j];
            for (long j = 0; j < V; ++j) {
                double s = 0;
                for (long i = 0; i < K; ++i) s += qn[i] * Sn[i * V + j];
                o[(n * T + t) * V + j] = s;
            }
        }
    }
    free(qn), free(kn), free(u), free(kS), free(a);
}

/* max |got - want| / max |want| over rows of V (got: stride gs per row). */
static double fwd_rel_err(const float *got, long gs, const double *want, long rows, long V) {
    double m = 1e-3, e = 0;
    for (long r = 0; r < rows; ++r)
        for (long j = 0; j < V; ++j) {
            double w = want[r * V + j], d = fabs((double)got[r * gs + j] - w);
            if (fabs(w) > m) m = fabs(w);
            if (!(d <= e)) e = d; /* NaN: e becomes NaN, which fails the check */
        }
    return e / m;
}

/* gates: 0 none, 1 scalar g, 2 per-key gk, 3 both */
static void fwd_run(long NQ, long G, long T, long K, long V, int gates, int l2norm, int mode) {
    /* mode 0: S_out apart; 1: in place; 2: in place, columns in two calls; 3: S_out apart,
     * the heads in two calls split at value head N / 2 + (G > 1), inside a group when G > 1 */
    char cfg[180];
    long N = NQ * G; /* value heads; NQ q/k heads */
    snprintf(cfg, sizeof cfg, "N=%ld G=%ld T=%ld K=%ld V=%ld gates=%d l2norm=%d mode=%d W=%d", N,
             G, T, K, V, gates, l2norm, mode, W);
    long qt = K + 3, qs = T * qt + 5, vt = V + 2, vs = T * vt + 7, ot = V + 1, os = T * ot + 3;
    long nq = NQ * qs, nv = N * vs, no = N * os;
    float *q = guarded_f32(nq), *k = guarded_f32(nq), *v = guarded_f32(nv);
    float *o = guarded_f32(no), *beta = guarded_f32(N * T), *g = guarded_f32(N * T);
    float *gk = guarded_f32(N * T * K);
    float *S0 = guarded_f32(N * K * V), *S = guarded_f32(N * K * V);
    float *work = guarded_f32(la_gdr_work(K));
    float kscale = l2norm ? 1.0f : 1.0f / sqrtf((float)K);
    for (long m = 0; m < NQ; ++m)
        for (long t = 0; t < T; ++t)
            for (long i = 0; i < K; ++i) {
                q[m * qs + t * qt + i] = uni(-1, 1) * kscale * 1.7f;
                k[m * qs + t * qt + i] = uni(-1, 1) * kscale * 1.7f;
            }
    for (long n = 0; n < N; ++n)
        for (long t = 0; t < T; ++t) {
            for (long j = 0; j < V; ++j) v[n * vs + t * vt + j] = uni(-1, 1);
            beta[n * T + t] = uni(0, 1);
            g[n * T + t] = uni(-1, 0);
            for (long i = 0; i < K; ++i) gk[(n * T + t) * K + i] = uni(-0.5, 0);
            if (t == 3) gk[(n * T + t) * K + (n % K)] = -INFINITY; /* a reset of one row */
            if (t == 4) gk[(n * T + t) * K + K - 1] = -95.0f; /* below the subnormal flush */
        }
    for (long i = 0; i < N * K * V; ++i) S0[i] = uni(-0.3, 0.3);
    float *S0copy = malloc((size_t)(N * K * V + 1) * sizeof(float));
    memcpy(S0copy, S0, (size_t)(N * K * V) * sizeof(float));
    float scale = 1.0f / sqrtf((float)K);
    double *Sref = malloc((size_t)(N * K * V + 1) * sizeof(double));
    double *oref = malloc((size_t)(N * T * V + 1) * sizeof(double));
    const float *gp = gates & 1 ? g : NULL, *gkp = gates & 2 ? gk : NULL;
    fwd_reference(N, G, T, K, V, q, qs, qt, k, qs, qt, v, vs, vt, beta, gp, gkp, scale, l2norm, S0,
              Sref, oref);
    /* beta and g as the kernel reads them: (N, T) rows, or in modes 1 and 3 fla's (T, N) order
     * (token stride N: read in place) */
    long bs = mode & 1 ? 1 : T, bt = mode & 1 ? N : 1;
    float *bx = guarded_f32(N * T), *gx = guarded_f32(N * T);
    for (long n = 0; n < N; ++n)
        for (long t = 0; t < T; ++t)
            bx[n * bs + t * bt] = beta[n * T + t], gx[n * bs + t * bt] = g[n * T + t];
    const float *gxp = gp ? gx : NULL;
    int rc = 0;
    if (mode == 0) {
        rc |= gdr_forward(q, qs, qt, k, qs, qt, G, 0, v, vs, vt, bx, bs, bt, gxp, bs, bt, gkp,
                          T * K, K, N, T, K, V, 0, V, scale, l2norm, S0, S, o, os, ot, NULL, 0,
                          NULL, 0, 0, NULL, work);
    } else if (mode == 3) {
        long h = N / 2 + (G > 1), m = h / G, g0 = h % G;
        rc |= gdr_forward(q, qs, qt, k, qs, qt, G, 0, v, vs, vt, bx, bs, bt, gxp, bs, bt, gkp,
                          T * K, K, h, T, K, V, 0, V, scale, l2norm, S0, S, o, os, ot, NULL, 0,
                          NULL, 0, 0, NULL, work);
        rc |= gdr_forward(q + m * qs, qs, qt, k + m * qs, qs, qt, G, g0, v + h * vs, vs, vt,
                          bx + h * bs, bs, bt, gxp ? gxp + h * bs : NULL, bs, bt,
                          gkp ? gkp + h * T * K : NULL, T * K, K, N - h, T, K, V, 0, V, scale,
                          l2norm, S0 + h * K * V, S + h * K * V, o + h * os, os, ot, NULL, 0,
                          NULL, 0, 0, NULL, work);
    } else {
        memcpy(S, S0, (size_t)(N * K * V) * sizeof(float));
        long mid = mode == 2 ? (V / W / 2) * W : V;
        rc |= gdr_forward(q, qs, qt, k, qs, qt, G, 0, v, vs, vt, bx, bs, bt, gxp, bs, bt, gkp,
                          T * K, K, N, T, K, V, 0, mid, scale, l2norm, S, S, o, os, ot, NULL, 0,
                          NULL, 0, 0, NULL, work);
        if (mode == 2)
            rc |= gdr_forward(q, qs, qt, k, qs, qt, G, 0, v, vs, vt, bx, bs, bt, gxp, bs, bt,
                              gkp, T * K, K, N, T, K, V, mid, V, scale, l2norm, S, S, o, os, ot,
                              NULL, 0, NULL, 0, 0, NULL, work);
    }
    free(bx), free(gx);
    ++checks;
    if (rc) {
        ++failures;
        printf("FAIL %s: rc %d\n", cfg, rc);
    }
    double eo = 0;
    for (long n = 0; n < N; ++n) {
        double e = fwd_rel_err(o + n * os, ot, oref + n * T * V, T, V);
        if (!(e <= eo)) eo = e;
    }
    fwd_expect("o", eo, cfg);
    fwd_expect("S", fwd_rel_err(S, V, Sref, N * K, V), cfg);
    expect_guards("o", o, N, os, T, ot, V, no, cfg); /* only the rows of each head written */
    expect_guards("S", S, 1, N * K * V, N * K, V, V, N * K * V, cfg);
    if (mode == 0 || mode == 3) /* S_in untouched */
        expect(!memcmp(S0, S0copy, (size_t)(N * K * V) * sizeof(float)), "S_in kept", cfg);
    free(S0copy);
    free(q), free(k), free(v), free(o), free(beta), free(g), free(gk), free(S0), free(S);
    free(work), free(Sref), free(oref);
}

/* ----------------------------------------------------------------- 2. la_gdr_backward */
/* One problem in double, contiguous: q, k (T, K), v (T, V), beta, g (T; g NULL: ungated),
 * S0 (K, V). */
typedef struct {
    long T, K, V;
    int l2norm;
    double scale;
    const double *q, *k, *v, *beta, *g, *S0;
} problem;

/* The forward: o (T, V) and, if S is not NULL, every state S[t] (T + 1 of K x V; S[0] = S0).
 * Returns the final state in fin (K x V). */
static void ref_forward(const problem *p, double *o, double *S, double *fin) {
    long K = p->K, V = p->V;
    double *cur = malloc((size_t)(K * V) * sizeof(double)), *kn = malloc(K * sizeof(double));
    double *qn = malloc(K * sizeof(double)), *u = malloc(V * sizeof(double));
    memcpy(cur, p->S0, (size_t)(K * V) * sizeof(double));
    if (S) memcpy(S, cur, (size_t)(K * V) * sizeof(double));
    for (long t = 0; t < p->T; ++t) {
        const double *qr = p->q + t * K, *kr = p->k + t * K;
        double nq = 0, nk = 0;
        for (long i = 0; i < K; ++i) nq += qr[i] * qr[i], nk += kr[i] * kr[i];
        double cq = p->l2norm ? 1 / sqrt(nq + 1e-6) : 1, ck = p->l2norm ? 1 / sqrt(nk + 1e-6) : 1;
        for (long i = 0; i < K; ++i) qn[i] = p->scale * cq * qr[i], kn[i] = ck * kr[i];
        double a = p->g ? exp(p->g[t]) : 1, b = p->beta[t];
        for (long j = 0; j < V; ++j) {
            double s = 0;
            for (long i = 0; i < K; ++i) s += kn[i] * cur[i * V + j];
            u[j] = b * (p->v[t * V + j] - a * s);
        }
        for (long i = 0; i < K; ++i)
            for (long j = 0; j < V; ++j) cur[i * V + j] = a * cur[i * V + j] + kn[i] * u[j];
        for (long j = 0; j < V; ++j) {
            double s = 0;
            for (long i = 0; i < K; ++i) s += qn[i] * cur[i * V + j];
            o[t * V + j] = s;
        }
        if (S) memcpy(S + (t + 1) * K * V, cur, (size_t)(K * V) * sizeof(double));
    }
    memcpy(fin, cur, (size_t)(K * V) * sizeof(double));
    free(cur), free(kn), free(qn), free(u);
}

/* L = sum dout . o + <dS, S_T> (dS NULL: 0). */
static double ref_loss(const problem *p, const double *dout, const double *dS) {
    long T = p->T, K = p->K, V = p->V;
    double *o = malloc((size_t)(T * V + 1) * sizeof(double));
    double *fin = malloc((size_t)(K * V) * sizeof(double)), L = 0;
    ref_forward(p, o, NULL, fin);
    for (long i = 0; i < T * V; ++i) L += dout[i] * o[i];
    if (dS)
        for (long i = 0; i < K * V; ++i) L += dS[i] * fin[i];
    free(o), free(fin);
    return L;
}

/* The gradients of L, the naive reverse pass over every stored state: dq, dk (T, K), dv
 * (T, V), dbeta, dg (T), dS0 (K, V). */
static void ref_backward(const problem *p, const double *dout, const double *dS, double *dq,
                         double *dk, double *dv, double *dbeta, double *dg, double *dS0) {
    long T = p->T, K = p->K, V = p->V;
    double *S = malloc((size_t)((T + 1) * K * V) * sizeof(double));
    double *o = malloc((size_t)(T * V + 1) * sizeof(double)), *D = dS0;
    double *fin = malloc((size_t)(K * V) * sizeof(double));
    double *qn = malloc(K * sizeof(double)), *kn = malloc(K * sizeof(double));
    double *u = malloc(V * sizeof(double)), *wv = malloc(V * sizeof(double));
    double *du = malloc(V * sizeof(double)), *dqn = malloc(K * sizeof(double));
    double *dkn = malloc(K * sizeof(double));
    ref_forward(p, o, S, fin);
    for (long i = 0; i < K * V; ++i) D[i] = dS ? dS[i] : 0;
    for (long t = T - 1; t >= 0; --t) {
        const double *qr = p->q + t * K, *kr = p->k + t * K, *Sp = S + t * K * V;
        const double *St = S + (t + 1) * K * V, *go = dout + t * V;
        double nq = 0, nk = 0;
        for (long i = 0; i < K; ++i) nq += qr[i] * qr[i], nk += kr[i] * kr[i];
        double cq = p->l2norm ? 1 / sqrt(nq + 1e-6) : 1, ck = p->l2norm ? 1 / sqrt(nk + 1e-6) : 1;
        for (long i = 0; i < K; ++i) qn[i] = p->scale * cq * qr[i], kn[i] = ck * kr[i];
        double a = p->g ? exp(p->g[t]) : 1, b = p->beta[t];
        for (long j = 0; j < V; ++j) {
            double s = 0;
            for (long i = 0; i < K; ++i) s += kn[i] * Sp[i * V + j];
            wv[j] = p->v[t * V + j] - a * s;
            u[j] = b * wv[j];
        }
        for (long i = 0; i < K; ++i) /* o_t = S_t^T qn */
            for (long j = 0; j < V; ++j) D[i * V + j] += qn[i] * go[j];
        for (long i = 0; i < K; ++i) {
            dqn[i] = 0;
            for (long j = 0; j < V; ++j) dqn[i] += St[i * V + j] * go[j];
        }
        double db = 0;
        for (long j = 0; j < V; ++j) { /* S_t = a S_{t-1} + kn u^T, u = b (v - a S_{t-1}^T kn) */
            du[j] = 0;
            for (long i = 0; i < K; ++i) du[j] += D[i * V + j] * kn[i];
            dv[t * V + j] = b * du[j];
            db += wv[j] * du[j];
        }
        dbeta[t] = db;
        double da = 0;
        for (long i = 0; i < K; ++i) {
            dkn[i] = 0;
            for (long j = 0; j < V; ++j) {
                double dp = -b * du[j]; /* p = a S_{t-1}^T kn */
                dkn[i] += D[i * V + j] * u[j] + a * Sp[i * V + j] * dp;
                double e = D[i * V + j] + kn[i] * dp; /* the gradient of a S_{t-1} */
                da += e * Sp[i * V + j];
                D[i * V + j] = a * e;
            }
        }
        dg[t] = p->g ? a * da : 0;
        for (long i = 0; i < K; ++i) dqn[i] *= p->scale;
        double pq = 0, pk = 0; /* through the L2 norms */
        for (long i = 0; i < K; ++i) pq += cq * qr[i] * dqn[i], pk += kn[i] * dkn[i];
        for (long i = 0; i < K; ++i) {
            dq[t * K + i] = p->l2norm ? cq * (dqn[i] - cq * qr[i] * pq) : dqn[i];
            dk[t * K + i] = p->l2norm ? ck * (dkn[i] - kn[i] * pk) : dkn[i];
        }
    }
    free(S), free(o), free(fin), free(qn), free(kn), free(u), free(wv), free(du), free(dqn);
    free(dkn);
}

/* max |a - b| / max(|b|, 1e-3) over n values. */
static double rel(const double *a, const double *b, long n) {
    double m = 1e-3, e = 0;
    for (long i = 0; i < n; ++i) {
        if (fabs(b[i]) > m) m = fabs(b[i]);
        double d = fabs(a[i] - b[i]);
        if (!(d <= e)) e = d;
    }
    return e / m;
}

/* The reference's gradients against central differences of ref_loss, every input. */
static void check_reference(long T, long K, long V, int gated, int l2norm) {
    char cfg[96];
    snprintf(cfg, sizeof cfg, "reference vs finite differences T=%ld K=%ld V=%ld gated=%d "
             "l2norm=%d", T, K, V, gated, l2norm);
    long nq = T * K, nv = T * V, nS = K * V;
    double *x = malloc((size_t)(2 * nq + nv + 2 * T + nS) * sizeof(double));
    double *q = x, *k = q + nq, *v = k + nq, *beta = v + nv, *g = beta + T, *S0 = g + T;
    double *dout = malloc((size_t)nv * sizeof(double)), *dS = malloc((size_t)nS * sizeof(double));
    double kscale = l2norm ? 1 : 1 / sqrt((double)K);
    for (long i = 0; i < nq; ++i) q[i] = uni(-1, 1) * kscale, k[i] = uni(-1, 1) * kscale;
    for (long i = 0; i < nv; ++i) v[i] = uni(-1, 1), dout[i] = uni(-1, 1);
    for (long t = 0; t < T; ++t) beta[t] = uni(0.1, 0.9), g[t] = uni(-1, -0.1);
    for (long i = 0; i < nS; ++i) S0[i] = uni(-0.5, 0.5), dS[i] = uni(-1, 1);
    problem p = {T, K, V, l2norm, 0.7, q, k, v, beta, gated ? g : NULL, S0};
    double *grad = malloc((size_t)(2 * nq + nv + 2 * T + nS) * sizeof(double));
    ref_backward(&p, dout, dS, grad, grad + nq, grad + 2 * nq, grad + 2 * nq + nv,
                 grad + 2 * nq + nv + T, grad + 2 * nq + nv + 2 * T);
    long n = 2 * nq + nv + 2 * T + nS;
    double *fd = malloc((size_t)n * sizeof(double)), h = 1e-6;
    for (long i = 0; i < n; ++i) {
        double keep = x[i];
        x[i] = keep + h;
        double up = ref_loss(&p, dout, dS);
        x[i] = keep - h;
        double down = ref_loss(&p, dout, dS);
        x[i] = keep;
        fd[i] = (up - down) / (2 * h);
        if (!gated && i >= 2 * nq + nv + T && i < 2 * nq + nv + 2 * T) fd[i] = 0; /* no g */
    }
    expect_within("gradients", rel(grad, fd, n), 1e-6, cfg);
    free(x), free(dout), free(dS), free(grad), free(fd);
}

/* max |got - want| / max |want| over H heads of R rows of F (got: strides hs, rs). */
static double rel_err(const float *got, long hs, long rs, const double *want, long H, long R,
                      long F) {
    double m = 1e-3, e = 0;
    for (long n = 0; n < H; ++n)
        for (long r = 0; r < R; ++r)
            for (long c = 0; c < F; ++c) {
                double w = want[(n * R + r) * F + c], d = fabs((double)got[n * hs + r * rs + c] - w);
                if (fabs(w) > m) m = fabs(w);
                if (!(d <= e)) e = d;
            }
    return e / m;
}

static void bwd_run(long N, long T, long K, long V, int gated, int l2norm, int with_dS) {
    char cfg[160];
    snprintf(cfg, sizeof cfg, "N=%ld T=%ld K=%ld V=%ld gated=%d l2norm=%d dS=%d W=%d", N, T, K,
             V, gated, l2norm, with_dS, W);
    long TC = la_gdr_chunk(), nc = (T + TC - 1) / TC;
    /* inputs with gaps between rows and heads */
    long qt = K + 3, qs = T * qt + 5, vt = V + 2, vs = T * vt + 7, ot = V + 1, os = T * ot + 3;
    long wt = V + 5, ws = T * wt + 1, gt = V + 3, gs_ = T * gt + 2, cs = nc * K * V + 9;
    long dqt = K + 1, dqs = T * dqt + 4, dvt = V + 4, dvs = T * dvt + 1, bst = T + 3;
    float *q = guarded_f32(N * qs), *k = guarded_f32(N * qs), *v = guarded_f32(N * vs);
    float *beta = guarded_f32(N * T), *g = guarded_f32(N * T), *o = guarded_f32(N * os);
    float *S0 = guarded_f32(N * K * V), *S = guarded_f32(N * K * V);
    float *ck = guarded_f32(N * cs), *w = guarded_f32(N * ws), *go = guarded_f32(N * gs_);
    float *dS = guarded_f32(N * K * V), *dS0 = guarded_f32(N * K * V);
    float *dq = guarded_f32(N * dqs), *dk = guarded_f32(N * dqs), *dv = guarded_f32(N * dvs);
    float *db = guarded_f32(N * bst), *dg = guarded_f32(N * bst);
    float *work = guarded_f32(la_gdr_work(K)), *bwork = guarded_f32(la_gdr_backward_work(K, V));
    float kscale = l2norm ? 1.0f : 1.0f / sqrtf((float)K), scale = 1.0f / sqrtf((float)K);
    for (long n = 0; n < N; ++n)
        for (long t = 0; t < T; ++t) {
            for (long i = 0; i < K; ++i) {
                q[n * qs + t * qt + i] = uni(-1, 1) * kscale * 1.7f;
                k[n * qs + t * qt + i] = uni(-1, 1) * kscale * 1.7f;
            }
            for (long j = 0; j < V; ++j)
                v[n * vs + t * vt + j] = uni(-1, 1), go[n * gs_ + t * gt + j] = uni(-1, 1);
            beta[n * T + t] = uni(0, 1);
            g[n * T + t] = uni(-1, 0);
        }
    for (long i = 0; i < N * K * V; ++i) S0[i] = uni(-0.3, 0.3), dS[i] = uni(-1, 1);
    const float *gp = gated ? g : NULL;
    int rc = gdr_forward(q, qs, qt, k, qs, qt, 1, 0, v, vs, vt, beta, T, 1, gp, T, 1, NULL, 0, 0,
                         N, T, K, V, 0, V, scale, l2norm, S0, S, o, os, ot, ck, cs, w, ws, wt, NULL,
                         work);
    rc |= gdr_backward(q, qs, qt, k, qs, qt, beta, T, gp, T, N, T, K, V, scale, l2norm, ck, cs,
                       w, ws, wt, go, gs_, gt, with_dS ? dS : NULL, dS0, dq, dqs, dqt, dk, dqs,
                       dqt, dv, dvs, dvt, db, bst, gated ? dg : NULL, bst, LA_F32, bwork);
    ++checks;
    if (rc) {
        ++failures;
        printf("FAIL %s: rc %d\n", cfg, rc);
    }
    /* the reference, head by head */
    double *x = malloc((size_t)(2 * T * K + T * V + 2 * T + K * V + 1) * sizeof(double));
    double *rq = x, *rk = rq + T * K, *rv = rk + T * K, *rb = rv + T * V, *rg = rb + T;
    double *rS0 = rg + T;
    double *rgo = malloc((size_t)(T * V + 1) * sizeof(double));
    double *rdS = malloc((size_t)(K * V) * sizeof(double));
    double *want = malloc((size_t)N * (2 * T * K + T * V + 2 * T + K * V + 1) * sizeof(double));
    long per = 2 * T * K + T * V + 2 * T + K * V;
    double *wS = malloc((size_t)(N * (K * V + nc * K * V + T * V) + 1) * sizeof(double));
    for (long n = 0; n < N; ++n) {
        for (long t = 0; t < T; ++t) {
            for (long i = 0; i < K; ++i)
                rq[t * K + i] = q[n * qs + t * qt + i], rk[t * K + i] = k[n * qs + t * qt + i];
            for (long j = 0; j < V; ++j)
                rv[t * V + j] = v[n * vs + t * vt + j], rgo[t * V + j] = go[n * gs_ + t * gt + j];
            rb[t] = beta[n * T + t], rg[t] = g[n * T + t];
        }
        for (long i = 0; i < K * V; ++i) rS0[i] = S0[n * K * V + i], rdS[i] = dS[n * K * V + i];
        problem p = {T, K, V, l2norm, scale, rq, rk, rv, rb, gated ? rg : NULL, rS0};
        double *gw = want + n * per;
        ref_backward(&p, rgo, with_dS ? rdS : NULL, gw, gw + T * K, gw + 2 * T * K,
                     gw + 2 * T * K + T * V, gw + 2 * T * K + T * V + T,
                     gw + 2 * T * K + T * V + 2 * T);
        /* what the forward saves: the checkpoints and w, from every stored state */
        double *Sall = malloc((size_t)((T + 1) * K * V) * sizeof(double));
        double *oo = malloc((size_t)(T * V + 1) * sizeof(double));
        double *fin = malloc((size_t)(K * V) * sizeof(double));
        ref_forward(&p, oo, Sall, fin);
        double *wc = wS + n * (nc * K * V + T * V);
        for (long c = 0; c < nc; ++c)
            memcpy(wc + c * K * V, Sall + c * TC * K * V, (size_t)(K * V) * sizeof(double));
        double *ww = wc + nc * K * V;
        for (long t = 0; t < T; ++t) {
            double nk = 0;
            for (long i = 0; i < K; ++i) nk += rk[t * K + i] * rk[t * K + i];
            double ckk = l2norm ? 1 / sqrt(nk + 1e-6) : 1, a = gated ? exp(rg[t]) : 1;
            for (long j = 0; j < V; ++j) {
                double s = 0;
                for (long i = 0; i < K; ++i) s += ckk * rk[t * K + i] * Sall[t * K * V + i * V + j];
                ww[t * V + j] = rv[t * V + j] - a * s;
            }
        }
        free(Sall), free(oo), free(fin);
    }
    /* compare, per array over all heads: the reference arrays are head-major blocks of per */
    double *tmp = malloc((size_t)(N * (T * K + T * V + K * V + nc * K * V) + 1) * sizeof(double));
#define GATHER(off, len)                                                                      \
    for (long n = 0; n < N; ++n) memcpy(tmp + n * (len), want + n * per + (off), (size_t)(len) * sizeof(double));
    GATHER(0, T * K)
    expect_within("dq", rel_err(dq, dqs, dqt, tmp, N, T, K), BWD_TOL, cfg);
    GATHER(T * K, T * K)
    expect_within("dk", rel_err(dk, dqs, dqt, tmp, N, T, K), BWD_TOL, cfg);
    GATHER(2 * T * K, T * V)
    expect_within("dv", rel_err(dv, dvs, dvt, tmp, N, T, V), BWD_TOL, cfg);
    GATHER(2 * T * K + T * V, T)
    expect_within("dbeta", rel_err(db, bst, 1, tmp, N, 1, T), BWD_TOL, cfg);
    if (gated) {
        GATHER(2 * T * K + T * V + T, T)
        expect_within("dg", rel_err(dg, bst, 1, tmp, N, 1, T), BWD_TOL, cfg);
    }
    GATHER(2 * T * K + T * V + 2 * T, K * V)
    expect_within("dS0", rel_err(dS0, K * V, V, tmp, N, K, V), BWD_TOL, cfg);
#undef GATHER
    for (long n = 0; n < N; ++n)
        memcpy(tmp + n * nc * K * V, wS + n * (nc * K * V + T * V),
               (size_t)(nc * K * V) * sizeof(double));
    expect_within("checkpoints", rel_err(ck, cs, V, tmp, N, nc * K, V), 2e-5, cfg);
    for (long n = 0; n < N; ++n)
        memcpy(tmp + n * T * V, wS + n * (nc * K * V + T * V) + nc * K * V,
               (size_t)(T * V) * sizeof(double));
    expect_within("w", rel_err(w, ws, wt, tmp, N, T, V), 2e-5, cfg);
    expect_guards("checkpoints", ck, N, cs, nc * K, V, V, N * cs, cfg);
    expect_guards("w", w, N, ws, T, wt, V, N * ws, cfg);
    expect_guards("dq", dq, N, dqs, T, dqt, K, N * dqs, cfg);
    expect_guards("dk", dk, N, dqs, T, dqt, K, N * dqs, cfg);
    expect_guards("dv", dv, N, dvs, T, dvt, V, N * dvs, cfg);
    expect_guards("dbeta", db, N, bst, 1, T, T, N * bst, cfg);
    expect_guards("dg", dg, gated ? N : 0, bst, 1, T, T, N * bst, cfg);
    expect_guards("dS0", dS0, 1, N * K * V, N * K, V, V, N * K * V, cfg);
    free(tmp), free(x), free(rgo), free(rdS), free(want), free(wS);
    free(q), free(k), free(v), free(beta), free(g), free(o), free(S0), free(S), free(ck), free(w);
    free(go), free(dS), free(dS0), free(dq), free(dk), free(dv), free(db), free(dg), free(work);
    free(bwork);
}

/* rows (H, R, F) of dtype dt at x (head stride hs, row stride rs) as a dense double array */
static double *dense_dt(const void *x, int dt, long hs, long rs, long H, long R, long F) {
    double *d = malloc((size_t)(H * R * F + 1) * sizeof(double));
    for (long n = 0; n < H; ++n)
        for (long r = 0; r < R; ++r)
            for (long c = 0; c < F; ++c) d[(n * R + r) * F + c] = load_dt(x, n * hs + r * rs + c, dt);
    return d;
}

/* |a - b| / max |b| over rows (H, R, F) of dtype dt, both with strides hs, rs */
static double err_dt(const void *a, const void *b, int dt, long hs, long rs, long H, long R,
                     long F) {
    double *x = dense_dt(a, dt, hs, rs, H, R, F), *y = dense_dt(b, dt, hs, rs, H, R, F);
    double m = 1e-30, e = 0;
    for (long i = 0; i < H * R * F; ++i) {
        if (fabs(y[i]) > m) m = fabs(y[i]);
        double d = fabs(x[i] - y[i]);
        if (!(d <= e)) e = d;
    }
    free(x), free(y);
    return e / m;
}

/* The training path on 16-bit rows (dt): la_gdr_forward_call with ckpt and w on 16-bit q, k,
 * v (each chunk widened), and la_gdr_backward reading 16-bit q, k and dout and writing 16-bit
 * dq, dk, dv, against the float32 passes on the same values (16-bit ones, widened): the
 * checkpoints, w, dbeta, dg and dS0 the same float32 arithmetic, o and the gradients that of
 * float32 rounded once to dt. Strided rows, as bwd_run's. */
static void bwd16_run(long N, long T, long K, long V, int gated, int l2norm, int dt) {
    char cfg[160];
    snprintf(cfg, sizeof cfg, "16-bit dt=%d N=%ld T=%ld K=%ld V=%ld gated=%d l2norm=%d W=%d", dt,
             N, T, K, V, gated, l2norm, W);
    long TC = la_gdr_chunk(), nc = (T + TC - 1) / TC;
    long qt = K + 3, qs = T * qt + 5, vt = V + 2, vs = T * vt + 7, ot = V + 1, os = T * ot + 3;
    long wt = V + 5, ws = T * wt + 1, cs = nc * K * V + 9, dqt = K + 1, dqs = T * dqt + 4;
    long dvt = V + 4, dvs = T * dvt + 1;
    /* the inputs in both dtypes: [0] float32, [1] dt */
    void *q[2], *k[2], *v[2], *o[2], *go[2], *dq[2], *dk[2], *dv[2];
    float *ck[2], *w[2], *S[2], *dS0[2], *db[2], *dg[2];
    for (int d = 0; d < 2; ++d) {
        size_t es = d ? 2 : 4;
        q[d] = calloc((size_t)(N * qs), es), k[d] = calloc((size_t)(N * qs), es);
        v[d] = calloc((size_t)(N * vs), es), o[d] = calloc((size_t)(N * os), es);
        go[d] = calloc((size_t)(N * os), es), dq[d] = calloc((size_t)(N * dqs), es);
        dk[d] = calloc((size_t)(N * dqs), es), dv[d] = calloc((size_t)(N * dvs), es);
        ck[d] = calloc((size_t)(N * cs), 4), w[d] = calloc((size_t)(N * ws), 4);
        S[d] = calloc((size_t)(N * K * V), 4), dS0[d] = calloc((size_t)(N * K * V), 4);
        db[d] = calloc((size_t)(N * T), 4), dg[d] = calloc((size_t)(N * T), 4);
    }
    float *beta = malloc((size_t)(N * T + 1) * 4), *g = malloc((size_t)(N * T + 1) * 4);
    float *S0 = malloc((size_t)(N * K * V) * 4), *dS = malloc((size_t)(N * K * V) * 4);
    float kscale = l2norm ? 1.0f : 1.0f / sqrtf((float)K), scale = 1.0f / sqrtf((float)K);
#define PUT(x, at, val)                                          \
    do {                                                         \
        store_dt(x[1], at, (float)(val), dt);                    \
        ((float *)x[0])[at] = load_dt(x[1], at, dt); /* exact */ \
    } while (0)
    for (long n = 0; n < N; ++n)
        for (long t = 0; t < T; ++t) {
            for (long i = 0; i < K; ++i) {
                PUT(q, n * qs + t * qt + i, uni(-1, 1) * kscale * 1.7f);
                PUT(k, n * qs + t * qt + i, uni(-1, 1) * kscale * 1.7f);
            }
            for (long j = 0; j < V; ++j) {
                PUT(v, n * vs + t * vt + j, uni(-1, 1));
                PUT(go, n * os + t * ot + j, uni(-1, 1));
            }
            beta[n * T + t] = uni(0, 1), g[n * T + t] = uni(-1, 0);
        }
#undef PUT
    for (long i = 0; i < N * K * V; ++i) S0[i] = uni(-0.3, 0.3), dS[i] = uni(-1, 1);
    const float *gp = gated ? g : NULL;
    float *work = calloc((size_t)la_gdr_forward_work(K, V, dt), 4);
    float *bwork = calloc((size_t)la_gdr_backward_work(K, V), 4);
    int rc = 0;
    for (int d = 0; d < 2; ++d) {
        la_gdr_forward_args fa = {
            .q = q[d], .qs = qs, .qt = qt, .k = k[d], .ks = qs, .kt = qt, .G = 1, .g0 = 0,
            .v = v[d], .vs = vs, .vt = vt, .beta = beta, .bs = T, .bt = 1, .g = gp, .gs = T,
            .gt = 1, .dt = d ? dt : LA_F32, .N = N, .T = T, .K = K, .V = V, .v0 = 0, .v1 = V,
            .scale = scale, .l2norm = l2norm, .S_in = S0, .S_out = S[d], .o = o[d], .os = os,
            .ot = ot, .ckpt = ck[d], .cs = cs, .w = w[d], .ws = ws, .wt = wt, .work = work};
        rc |= la_gdr_forward_call(&fa);
        rc |= gdr_backward(q[d], qs, qt, k[d], qs, qt, beta, T, gp, T, N, T, K, V, scale,
                           l2norm, ck[d], cs, w[d], ws, wt, go[d], os, ot, dS, dS0[d], dq[d],
                           dqs, dqt, dk[d], dqs, dqt, dv[d], dvs, dvt, db[d], T,
                           gated ? dg[d] : NULL, T, d ? dt : LA_F32, bwork);
    }
    ++checks;
    if (rc) {
        ++failures;
        printf("FAIL %s: rc %d\n", cfg, rc);
    }
    /* the float32 run's o and gradients rounded to dt, as the 16-bit run should have them */
    void *r[4] = {calloc((size_t)(N * os), 2), calloc((size_t)(N * dqs), 2),
                  calloc((size_t)(N * dqs), 2), calloc((size_t)(N * dvs), 2)};
    void *f[4] = {o[0], dq[0], dk[0], dv[0]};
    long len[4] = {N * os, N * dqs, N * dqs, N * dvs};
    for (int a = 0; a < 4; ++a)
        for (long i = 0; i < len[a]; ++i) store_dt(r[a], i, ((float *)f[a])[i], dt);
    /* the same float32 arithmetic in one build: equal (the 16-bit results to the float32 ones
     * rounded, but for a subnormal, which the vector rounding flushes and the scalar keeps) */
    const double same = 1e-30;
    expect_within("o", err_dt(o[1], r[0], dt, os, ot, N, T, V), same, cfg);
    expect_within("dq", err_dt(dq[1], r[1], dt, dqs, dqt, N, T, K), same, cfg);
    expect_within("dk", err_dt(dk[1], r[2], dt, dqs, dqt, N, T, K), same, cfg);
    expect_within("dv", err_dt(dv[1], r[3], dt, dvs, dvt, N, T, V), same, cfg);
    expect_within("checkpoints", err_dt(ck[1], ck[0], LA_F32, cs, V, N, nc * K, V), same, cfg);
    expect_within("w", err_dt(w[1], w[0], LA_F32, ws, wt, N, T, V), same, cfg);
    expect_within("dbeta", err_dt(db[1], db[0], LA_F32, T, 1, N, 1, T), same, cfg);
    if (gated) expect_within("dg", err_dt(dg[1], dg[0], LA_F32, T, 1, N, 1, T), same, cfg);
    expect_within("dS0", err_dt(dS0[1], dS0[0], LA_F32, K * V, V, N, K, V), same, cfg);
    for (int a = 0; a < 4; ++a) free(r[a]);
    for (int d = 0; d < 2; ++d) {
        free(q[d]), free(k[d]), free(v[d]), free(o[d]), free(go[d]), free(dq[d]), free(dk[d]);
        free(dv[d]), free(ck[d]), free(w[d]), free(S[d]), free(dS0[d]), free(db[d]), free(dg[d]);
    }
    free(beta), free(g), free(S0), free(dS), free(work), free(bwork);
}

/* One part's verdict: its PASS line, or 1 after its FAIL line; the counters start again. */
static int verdict(const char *what, int tile, const char *tile_name) {
    int bad = failures != 0;
    if (bad)
        printf("FAIL: %d of %d checks, %s (W=%d)\n", failures, checks, what, W);
    else
        printf("PASS: %d checks, %s, W=%d, %s=%d\n", checks, what, W, tile_name, tile);
    failures = checks = 0;
    return bad;
}

static void forward_checks(void) {
    const long shapes[][2] = {{64, 64}, {20, 48}, {16, 16}, {7, 32}};
    const long Ts[] = {0, 1, 5, 64, 65, 150};
    unsigned long fpc = fp_control();
    for (unsigned s = 0; s < sizeof shapes / sizeof *shapes; ++s)
        for (unsigned t = 0; t < sizeof Ts / sizeof *Ts; ++t)
            for (int gates = 0; gates < 4; ++gates)
                for (int l2 = 0; l2 < 2; ++l2)
                    for (int mode = 0; mode < 4; ++mode)
                        fwd_run(s == 0 ? 3 : 2, 1 + (t + gates + l2 + mode) % 3, Ts[t], shapes[s][0],
                            shapes[s][1], gates, l2, mode);
    expect(fp_control() == fpc, "the floating-point control register handed back", "forward");
    /* la_gdr_forward_call on 16-bit rows (gdr_forward_widened), G = 2 value heads per q/k
     * head, gates scalar and per key: the float32 forward on the rounded values with o
     * rounded once, whole or in two column blocks, out of place; the same chunks of the same
     * function, so equal to the last bit */
    for (int dt = LA_BF16; dt <= LA_F16; ++dt)
        for (int split = 0; split < 2; ++split) {
            enum { FN = 4, FQ = 2, FT = 150, FK = 20, FV = 32 };
            static unsigned short q16[FQ * FT * FK], k16[FQ * FT * FK], v16[FN * FT * FV];
            static unsigned short o16[FN * FT * FV];
            static float qr[FQ * FT * FK], kr[FQ * FT * FK], vr[FN * FT * FV], gk[FN * FT * FK];
            static float b[FN * FT], g[FN * FT], S0[FN * FK * FV], S1[FN * FK * FV];
            static float S2[FN * FK * FV], o1[FN * FT * FV];
            float *wk = malloc((size_t)la_gdr_forward_work(FK, FV, dt) * sizeof(float));
            unsigned short *half[] = {q16, k16, v16};
            float *back[] = {qr, kr, vr};
            const long len[] = {FQ * FT * FK, FQ * FT * FK, FN * FT * FV};
            for (int a = 0; a < 3; ++a)
                for (long i = 0; i < len[a]; ++i) {
                    store_dt(half[a], i, uni(-1, 1), dt);
                    back[a][i] = load_dt(half[a], i, dt);
                }
            for (long i = 0; i < FN * FT; ++i) b[i] = uni(0, 1), g[i] = uni(-0.5, 0);
            for (long i = 0; i < FN * FT * FK; ++i) gk[i] = uni(-0.3, 0);
            for (long i = 0; i < FN * FK * FV; ++i) S0[i] = uni(-0.3, 0.3);
            long cuts[] = {0, split ? 16 : FV, FV};
            int rc = 0;
            for (int c = 0; c < 2; ++c) {
                if (cuts[c] == cuts[c + 1]) continue;
                la_gdr_forward_args a = {qr, FT * FK, FK, kr, FT * FK, FK, 2, 0, vr, FT * FV, FV,
                                         b, FT, 1, g, FT, 1, gk, FT * FK, FK, LA_F32, FN, FT,
                                         FK, FV,
                                         cuts[c], cuts[c + 1], 0.3f, 1, S0, S1, o1, FT * FV, FV,
                                         NULL, 0, NULL, 0, 0, wk};
                rc |= la_gdr_forward_call(&a);
                la_gdr_forward_args h = a;
                h.q = q16, h.k = k16, h.v = v16, h.dt = dt, h.S_out = S2, h.o = o16;
                rc |= la_gdr_forward_call(&h);
            }
            int same = rc == 0 && !memcmp(S1, S2, sizeof S1)
                       && rounded_once(o16, o1, FN * FT * FV, dt);
            ++checks;
            if (!same) {
                ++failures;
                printf("FAIL: la_gdr_forward in dtype %d (split %d, rc %d) is not the float32 "
                       "forward on its values\n", dt, split, rc);
            }
            free(wk);
        }
    /* la_gdr_step: la_gdr_forward with T = 1 on contiguous rows, bit for bit (a scalar gate;
     * then G = 2 value heads per q/k head with per-key gates too) */
    {
        enum { SN = 4, SK = 20, SV = 32 };
        static float q[SN * SK], k[SN * SK], v[SN * SV], b[SN], g[SN], gk[SN * SK];
        static float S0[SN * SK * SV], S1[SN * SK * SV], S2[SN * SK * SV], o1[SN * SV];
        static float o2[SN * SV], wk[3 * (64 * (4 * SK + 3) + 1024)]; /* 3 threads' shares */
        for (int i = 0; i < SN * SK; ++i) q[i] = uni(-1, 1), k[i] = uni(-1, 1), gk[i] = uni(-1, 0);
        gk[5] = -INFINITY;
        for (int i = 0; i < SN * SV; ++i) v[i] = uni(-1, 1);
        for (int i = 0; i < SN; ++i) b[i] = uni(0, 1), g[i] = uni(-1, 0);
        for (int i = 0; i < SN * SK * SV; ++i) S0[i] = uni(-0.3, 0.3);
        for (int G = 1; G <= 2; ++G) {
            const float *gkp = G == 2 ? gk : NULL;
            int rc = la_gdr_step(q, k, v, b, g, gkp, LA_F32, SN, G, SK, SV, 0.3f, 1, S0, S1, o1, wk, 1);
            rc |= gdr_forward(q, SK, SK, k, SK, SK, G, 0, v, SV, SV, b, 1, 1, g, 1, 1, gkp, SK, SK,
                              SN, 1, SK, SV, 0, SV, 0.3f, 1, S0, S2, o2, SV, SV, NULL, 0, NULL, 0,
                              0, NULL, wk);
            ++checks;
            if (rc || memcmp(S1, S2, sizeof S1) || memcmp(o1, o2, sizeof o1)) {
                ++failures;
                printf("FAIL: la_gdr_step differs from la_gdr_forward (G %d, rc %d)\n", G, rc);
            }
            /* and the reference (the step's q/k rows: token stride = head stride = SK) */
            double *Sref = malloc(sizeof(double) * SN * SK * SV), *oref = malloc(sizeof(double) * SN * SV);
            fwd_reference(SN, G, 1, SK, SV, q, SK, SK, k, SK, SK, v, SV, SV, b, g, gkp, 0.3f, 1, S0,
                      Sref, oref);
            fwd_expect("step o", fwd_rel_err(o1, SV, oref, SN, SV), G == 1 ? "step G=1" : "step G=2 gk");
            fwd_expect("step S", fwd_rel_err(S1, SV, Sref, SN * SK, SV), G == 1 ? "step G=1" : "step G=2 gk");
            free(Sref), free(oref);
            /* its heads in parts on 2 and 3 threads (la_parallel, OpenMP's threads where built
             * with -fopenmp, else the calling one; with 3, parts of one head,
             * starting inside a group at G = 2): each head runs the same code on the same
             * inputs whichever thread takes it, so the results are the one-thread step's */
            /* bfloat16 and float16 rows: read as float32 (exact), o rounded once, so the
             * float32 step on the rounded inputs with its o rounded the same way */
            for (int dt = LA_BF16; dt <= LA_F16; ++dt) {
                static unsigned short q16[SN * SK], k16[SN * SK], v16[SN * SV], b16[SN], g16[SN];
                static unsigned short gk16[SN * SK], o16[SN * SV];
                static float qr[SN * SK], kr[SN * SK], vr[SN * SV], br[SN], gr[SN], gkr[SN * SK];
                const float *src[] = {q, k, v, b, g, gk};
                unsigned short *half[] = {q16, k16, v16, b16, g16, gk16};
                float *back[] = {qr, kr, vr, br, gr, gkr};
                const long len[] = {SN * SK, SN * SK, SN * SV, SN, SN, SN * SK};
                for (int a = 0; a < 6; ++a)
                    for (long i = 0; i < len[a]; ++i) {
                        store_dt(half[a], i, src[a][i], dt);
                        back[a][i] = load_dt(half[a], i, dt);
                    }
                rc = la_gdr_step(qr, kr, vr, br, gr, G == 2 ? gkr : NULL, LA_F32, SN, G, SK, SV,
                                 0.3f, 1, S0, S1, o1, wk, 1);
                /* on 1, 2 and 3 threads: each part widens its own heads' rows (with 3, parts
                 * of one head, starting inside a group at G = 2) */
                for (int th = 1; th <= 3; ++th) {
                    float *wk16 = malloc(sizeof(float) * la_gdr_step_work(SN, G, SK, SV, th, dt));
                    int rc16 = la_gdr_step(q16, k16, v16, b16, g16, G == 2 ? gk16 : NULL, dt, SN,
                                           G, SK, SV, 0.3f, 1, S0, S2, o16, wk16, th);
                    free(wk16);
                    int same = rc == 0 && (rc16 == 0 || rc16 == 1)
                               && rounded_once(o16, o1, SN * SV, dt);
                    ++checks;
                    if (!same || memcmp(S1, S2, sizeof S1)) {
                        ++failures;
                        printf("FAIL: la_gdr_step in dtype %d on %d threads is not the float32 "
                               "step on its values (G %d, rc %d)\n", dt, th, G, rc16);
                    }
                }
                /* its value checks read the 16-bit rows as given: a NaN beta, a positive
                 * per-key gate (the last element: in the scalar tail where SN * SK is no whole
                 * number of vectors), and the outputs are not touched */
                float *wk16 = malloc(sizeof(float) * la_gdr_step_work(SN, G, SK, SV, 1, dt));
                unsigned short keep_b = b16[1], keep_gk = gk16[SN * SK - 1];
                float keep_s = S2[0];
                S2[0] = 12345.0f;
                store_dt(b16, 1, NAN, dt);
                int nan16 = la_gdr_step(q16, k16, v16, b16, g16, NULL, dt, SN, G, SK, SV, 0.3f, 1,
                                        S0, S2, o16, wk16, 1);
                b16[1] = keep_b;
                store_dt(gk16, SN * SK - 1, 0.125f, dt);
                int pos16 = la_gdr_step(q16, k16, v16, b16, g16, gk16, dt, SN, G, SK, SV, 0.3f, 1,
                                        S0, S2, o16, wk16, 1);
                gk16[SN * SK - 1] = keep_gk;
                free(wk16);
                ++checks;
                if (nan16 != -2 || pos16 != -3 || S2[0] != 12345.0f) {
                    ++failures;
                    printf("FAIL: la_gdr_step's value checks in dtype %d (%d %d)\n", dt, nan16,
                           pos16);
                }
                S2[0] = keep_s;
            }
            rc = la_gdr_step(q, k, v, b, g, gkp, LA_F32, SN, G, SK, SV, 0.3f, 1, S0, S1, o1, wk, 1);
            for (int th = 2; th <= 3; ++th) {
                rc = la_gdr_step(q, k, v, b, g, gkp, LA_F32, SN, G, SK, SV, 0.3f, 1, S0, S2, o2, wk, th);
                ++checks; /* (1: the other threads came late and took no part) */
                if ((rc != 0 && rc != 1) || memcmp(S1, S2, sizeof S1) || memcmp(o1, o2, sizeof o1)) {
                    ++failures;
                    printf("FAIL: la_gdr_step on %d threads differs from one (G %d, rc %d)\n", th,
                           G, rc);
                }
            }
        }
        /* the step's own value checks: a NaN beta is -2, a NaN or positive gate (scalar or
         * per-key) -3, and the outputs are not touched; a per-key -inf (a reset) is a gate */
        float nan = NAN, keep = S1[0];
        S1[0] = 12345.0f;
        b[1] = nan;
        int bad_beta = la_gdr_step(q, k, v, b, g, NULL, LA_F32, SN, 1, SK, SV, 0.3f, 1, S0, S1, o1, wk, 1);
        b[1] = 0.5f;
        g[2] = 0.25f;
        int pos_gate = la_gdr_step(q, k, v, b, g, NULL, LA_F32, SN, 1, SK, SV, 0.3f, 1, S0, S1, o1, wk, 1);
        g[2] = nan;
        int nan_gate = la_gdr_step(q, k, v, b, g, NULL, LA_F32, SN, 1, SK, SV, 0.3f, 1, S0, S1, o1, wk, 1);
        g[2] = -0.5f;
        gk[SN * SK - 1] = 0.125f;
        int pos_gk = la_gdr_step(q, k, v, b, g, gk, LA_F32, SN, 2, SK, SV, 0.3f, 1, S0, S1, o1, wk, 1);
        gk[SN * SK - 1] = nan;
        int nan_gk = la_gdr_step(q, k, v, b, NULL, gk, LA_F32, SN, 2, SK, SV, 0.3f, 1, S0, S1, o1, wk, 1);
        gk[SN * SK - 1] = -0.5f;
        int no_gate = la_gdr_step(q, k, v, b, NULL, NULL, LA_F32, SN, 1, SK, SV, 0.3f, 1, S0, S2, o2, wk, 1);
        int reset_gk = la_gdr_step(q, k, v, b, NULL, gk, LA_F32, SN, 2, SK, SV, 0.3f, 1, S0, S2, o2, wk, 1);
        ++checks;
        if (bad_beta != -2 || pos_gate != -3 || nan_gate != -3 || pos_gk != -3 || nan_gk != -3
            || no_gate != 0 || reset_gk != 0 || S1[0] != 12345.0f) {
            ++failures;
            printf("FAIL: la_gdr_step value checks (%d %d %d %d %d %d %d)\n", bad_beta, pos_gate,
                   nan_gate, pos_gk, nan_gk, no_gate, reset_gk);
        }
        S1[0] = keep;
    }
    /* sizes it must refuse: V not a multiple of W (W > 1), columns out of range, a group size
     * below 1, a place in the group outside it */
    float dummy[64] = {0};
    int refused = gdr_forward(dummy, 0, 0, dummy, 0, 0, 1, 0, dummy, 0, 0, dummy, 0, 1, NULL, 0,
                              1, NULL, 0, 0, 1, 1, 4, 16, 0, 32, 1.0f, 0, dummy, dummy, dummy, 0,
                              0, NULL, 0, NULL, 0, 0, NULL, dummy) == -1;
    if (W > 1)
        refused &= gdr_forward(dummy, 0, 0, dummy, 0, 0, 1, 0, dummy, 0, 0, dummy, 0, 1, NULL, 0,
                               1, NULL, 0, 0, 1, 1, 4, W + 1, 0, W + 1, 1.0f, 0, dummy, dummy,
                               dummy, 0, 0, NULL, 0, NULL, 0, 0, NULL, dummy) == -1;
    refused &= gdr_forward(dummy, 0, 0, dummy, 0, 0, 0, 0, dummy, 0, 0, dummy, 0, 1, NULL, 0, 1,
                           NULL, 0, 0, 1, 1, 4, 16, 0, 16, 1.0f, 0, dummy, dummy, dummy, 0, 0,
                           NULL, 0, NULL, 0, 0, NULL, dummy) == -1;
    refused &= gdr_forward(dummy, 0, 0, dummy, 0, 0, 2, 2, dummy, 0, 0, dummy, 0, 1, NULL, 0, 1,
                           NULL, 0, 0, 1, 1, 4, 16, 0, 16, 1.0f, 0, dummy, dummy, dummy, 0, 0,
                           NULL, 0, NULL, 0, 0, NULL, dummy) == -1;
    ++checks;
    if (!refused) {
        ++failures;
        printf("FAIL: bad sizes were not refused\n");
    }
}

static void backward_checks(void) {
    for (int gated = 0; gated < 2; ++gated)
        for (int l2 = 0; l2 < 2; ++l2) {
            check_reference(6, 3, 4, gated, l2);
            check_reference(3, 5, 2, gated, l2);
        }
    const long shapes[][2] = {{64, 64}, {20, 48}, {7, 16}, {80, 32}};
    const long Ts[] = {0, 1, 5, 64, 65, 150};
    for (unsigned s = 0; s < sizeof shapes / sizeof *shapes; ++s)
        for (unsigned t = 0; t < sizeof Ts / sizeof *Ts; ++t)
            for (int gated = 0; gated < 2; ++gated)
                for (int l2 = 0; l2 < 2; ++l2)
                    bwd_run(s == 0 ? 3 : 2, Ts[t], shapes[s][0], shapes[s][1], gated, l2,
                        (int)((t + s + gated) % 2));
    /* the 16-bit training path: chunks whole and cut, K a whole number of vectors or not */
    for (int dt = LA_BF16; dt <= LA_F16; ++dt)
        for (int gated = 0; gated < 2; ++gated) {
            bwd16_run(2, 150, 64, 64, gated, 1, dt);
            bwd16_run(3, 70, 20, 32, gated, gated, dt);
        }
    float dummy[64] = {0};
    ++checks;
    if (gdr_backward(dummy, 0, 0, dummy, 0, 0, dummy, 0, NULL, 0, 1, 1, 0, 16, 1.0f, 0, dummy, 0,
                     dummy, 0, 0, dummy, 0, 0, NULL, dummy, dummy, 0, 0, dummy, 0, 0, dummy, 0,
                     0, dummy, 0, NULL, 0, LA_F32, dummy) != -1) {
        ++failures;
        printf("FAIL: K = 0 was not refused\n");
    }
    if (W > 1) { /* 16-bit rows whose V is no whole number of vectors (dv is rounded in them);
                  * room for every array, should it run */
        float *b = calloc((size_t)la_gdr_backward_work(16, W + W / 2) + 4096, sizeof(float));
        ++checks;
        if (gdr_backward(b, 0, 0, b, 0, 0, b, 0, NULL, 0, 1, 1, 16, W + W / 2, 1.0f, 0, b, 0, b, 0, 0,
                         b, 0, 0, NULL, b, b, 0, 0, b, 0, 0, b, 0, 0, b, 0, NULL, 0, LA_BF16,
                         b + 4096) != -1) {
            ++failures;
            printf("FAIL: 16-bit rows with V %% W != 0 were not refused\n");
        }
        free(b);
    }
}

int main(void) {
    rng = 0x2545F4914F6CDD1Dull;
    forward_checks();
    int bad = verdict("la_gdr_forward", GDR_NB, "GDR_NB");
    rng = 0x9E3779B97F4A7C15ull;
    backward_checks();
    bad |= verdict("la_gdr_backward", GDB_KB, "GDB_KB");
    return bad;
}
