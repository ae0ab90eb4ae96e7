/* Stand-alone check of la_gdr_forward (the (gated) delta rule in src/linattn/ops/delta/kernels.c)
 * against a naive double-precision recurrence, without Python or torch, for building the kernel
 * in every vector form (-DLA_W=1/4/8/16 or whatever the -m flags pick) and on other ISAs (an
 * aarch64 build under qemu), as tests/c/native_harness.c does for the linear-attention kernels:
 *
 *   cc -O3 -march=native -o /tmp/gdr_harness tests/c/gdr_harness.c -lm && /tmp/gdr_harness
 *
 * Reference, per value head n (q/k head n / G: grouped value attention): row decays
 * a_i = exp(g_t + gk_t,i) (a missing gate counts as 0), qn = s q_t, kn = k_t (each divided by
 * sqrt(sum x^2 + 1e-6) first with l2norm), S' = diag(a) S, u = beta_t (v_t - S'^T kn),
 * S <- S' + kn u^T, o_t = S^T qn. Checked: no gate, a scalar gate, per-key gates (KDA, with a
 * reset gk = -inf and a decay below the subnormal flush) and both, l2norm and not, G = 1, 2, 3,
 * (K, V) with K not a multiple of any width, T = 0, 1, 5, 64 (one token chunk), 65 and 150
 * (partial chunks), head and token strides larger than the rows, S_out apart from S_in and in
 * place, the columns computed in two calls (v0, v1) as threads share a head, and the heads in
 * two calls split inside a group (g0); la_gdr_step (T = 1, contiguous) against la_gdr_forward
 * bit for bit, with and without GVA and per-key gates. Buffers carry NaN guards past their ends and in the gaps between
 * rows, which must come back untouched (and, if read, spread NaN into results).
 * Errors are max |kernel - reference| / max |reference| per array; above TOL the run fails.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/linattn/ops/delta/kernels.c"

/* Through a volatile pointer: what runs is the code a shared library exports, not a clone
 * specialised for this file's constants. */
static __typeof__(la_gdr_forward) *volatile gdr_forward = la_gdr_forward;

#define TOL 2e-5
#define GUARD 64
#define GUARD_BITS 0x7FC0DEADu

static unsigned long long rng = 0x2545F4914F6CDD1Dull;
static double urand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}
static float uni(double lo, double hi) { return (float)(lo + (hi - lo) * urand()); }

static float guard_value(void) {
    float f;
    unsigned u = GUARD_BITS;
    memcpy(&f, &u, 4);
    return f;
}
/* n floats plus GUARD, all set to the guard value. */
static float *guarded_alloc(long n) {
    float *p = malloc((size_t)(n + GUARD) * sizeof(float));
    float gv = guard_value();
    for (long i = 0; i < n + GUARD; ++i) p[i] = gv;
    return p;
}
static int is_guard(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u == GUARD_BITS;
}

static int failures = 0, checks = 0;

static void expect(const char *what, double err, const char *cfg) {
    ++checks;
    if (!(err <= TOL)) {
        ++failures;
        printf("FAIL %s: %s error %.3g\n", cfg, what, err);
    }
}

/* H blocks (head stride hs) of rows of F floats (row stride rs > F, R rows each), total floats
 * plus GUARD allocated: everything outside the rows must still hold guards. */
static void expect_guards(const char *what, const float *p, long H, long hs, long R, long rs,
                          long F, long total, const char *cfg) {
    long bad = 0;
    for (long i = 0; i < total + GUARD; ++i) {
        long n = i / hs, r = (i % hs) / rs, c = (i % hs) % rs;
        int inside = n < H && r < R && c < F;
        if (!inside && !is_guard(p[i])) ++bad;
    }
    ++checks;
    if (bad) {
        ++failures;
        printf("FAIL %s: %s: %ld guard values overwritten\n", cfg, what, bad);
    }
}

static void reference(long N, long G, long T, long K, long V, const float *q, long qs, long qt,
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
static double rel_err(const float *got, long gs, const double *want, long rows, long V) {
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
static void run(long NQ, long G, long T, long K, long V, int gates, int l2norm, int mode) {
    /* mode 0: S_out apart; 1: in place; 2: in place, columns in two calls; 3: S_out apart,
     * the heads in two calls split at value head N / 2 + (G > 1), inside a group when G > 1 */
    char cfg[180];
    long N = NQ * G; /* value heads; NQ q/k heads */
    snprintf(cfg, sizeof cfg, "N=%ld G=%ld T=%ld K=%ld V=%ld gates=%d l2norm=%d mode=%d W=%d", N,
             G, T, K, V, gates, l2norm, mode, W);
    long qt = K + 3, qs = T * qt + 5, vt = V + 2, vs = T * vt + 7, ot = V + 1, os = T * ot + 3;
    long nq = NQ * qs, nv = N * vs, no = N * os;
    float *q = guarded_alloc(nq), *k = guarded_alloc(nq), *v = guarded_alloc(nv);
    float *o = guarded_alloc(no), *beta = guarded_alloc(N * T), *g = guarded_alloc(N * T);
    float *gk = guarded_alloc(N * T * K);
    float *S0 = guarded_alloc(N * K * V), *S = guarded_alloc(N * K * V);
    float *work = guarded_alloc(la_gdr_work(K));
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
    reference(N, G, T, K, V, q, qs, qt, k, qs, qt, v, vs, vt, beta, gp, gkp, scale, l2norm, S0,
              Sref, oref);
    int rc = 0;
    if (mode == 0) {
        rc |= gdr_forward(q, qs, qt, k, qs, qt, G, 0, v, vs, vt, beta, T, gp, T, gkp, T * K, K,
                          N, T, K, V, 0, V, scale, l2norm, S0, S, o, os, ot, NULL, 0, NULL, 0, 0,
                          work);
    } else if (mode == 3) {
        long h = N / 2 + (G > 1), m = h / G, g0 = h % G;
        rc |= gdr_forward(q, qs, qt, k, qs, qt, G, 0, v, vs, vt, beta, T, gp, T, gkp, T * K, K,
                          h, T, K, V, 0, V, scale, l2norm, S0, S, o, os, ot, NULL, 0, NULL, 0, 0,
                          work);
        rc |= gdr_forward(q + m * qs, qs, qt, k + m * qs, qs, qt, G, g0, v + h * vs, vs, vt,
                          beta + h * T, T, gp ? gp + h * T : NULL, T, gkp ? gkp + h * T * K : NULL,
                          T * K, K, N - h, T, K, V, 0, V, scale, l2norm, S0 + h * K * V,
                          S + h * K * V, o + h * os, os, ot, NULL, 0, NULL, 0, 0, work);
    } else {
        memcpy(S, S0, (size_t)(N * K * V) * sizeof(float));
        long mid = mode == 2 ? (V / W / 2) * W : V;
        rc |= gdr_forward(q, qs, qt, k, qs, qt, G, 0, v, vs, vt, beta, T, gp, T, gkp, T * K, K,
                          N, T, K, V, 0, mid, scale, l2norm, S, S, o, os, ot, NULL, 0, NULL, 0, 0,
                          work);
        if (mode == 2)
            rc |= gdr_forward(q, qs, qt, k, qs, qt, G, 0, v, vs, vt, beta, T, gp, T, gkp, T * K,
                              K, N, T, K, V, mid, V, scale, l2norm, S, S, o, os, ot, NULL, 0, NULL,
                              0, 0, work);
    }
    ++checks;
    if (rc) {
        ++failures;
        printf("FAIL %s: rc %d\n", cfg, rc);
    }
    double eo = 0;
    for (long n = 0; n < N; ++n) {
        double e = rel_err(o + n * os, ot, oref + n * T * V, T, V);
        if (!(e <= eo)) eo = e;
    }
    expect("o", eo, cfg);
    expect("S", rel_err(S, V, Sref, N * K, V), cfg);
    expect_guards("o", o, N, os, T, ot, V, no, cfg); /* only the rows of each head written */
    expect_guards("S", S, 1, N * K * V, N * K, V, V, N * K * V, cfg);
    if (mode == 0 || mode == 3) /* S_in untouched */
        expect("S_in kept", memcmp(S0, S0copy, (size_t)(N * K * V) * sizeof(float)) ? 1.0 : 0.0,
               cfg);
    free(S0copy);
    free(q), free(k), free(v), free(o), free(beta), free(g), free(gk), free(S0), free(S);
    free(work), free(Sref), free(oref);
}

int main(void) {
    const long shapes[][2] = {{64, 64}, {20, 48}, {16, 16}, {7, 32}};
    const long Ts[] = {0, 1, 5, 64, 65, 150};
    for (unsigned s = 0; s < sizeof shapes / sizeof *shapes; ++s)
        for (unsigned t = 0; t < sizeof Ts / sizeof *Ts; ++t)
            for (int gates = 0; gates < 4; ++gates)
                for (int l2 = 0; l2 < 2; ++l2)
                    for (int mode = 0; mode < 4; ++mode)
                        run(s == 0 ? 3 : 2, 1 + (t + gates + l2 + mode) % 3, Ts[t], shapes[s][0],
                            shapes[s][1], gates, l2, mode);
    /* la_gdr_step: la_gdr_forward with T = 1 on contiguous rows, bit for bit (a scalar gate;
     * then G = 2 value heads per q/k head with per-key gates too) */
    {
        enum { SN = 4, SK = 20, SV = 32 };
        static float q[SN * SK], k[SN * SK], v[SN * SV], b[SN], g[SN], gk[SN * SK];
        static float S0[SN * SK * SV], S1[SN * SK * SV], S2[SN * SK * SV], o1[SN * SV];
        static float o2[SN * SV], wk[64 * (4 * SK + 3)];
        for (int i = 0; i < SN * SK; ++i) q[i] = uni(-1, 1), k[i] = uni(-1, 1), gk[i] = uni(-1, 0);
        gk[5] = -INFINITY;
        for (int i = 0; i < SN * SV; ++i) v[i] = uni(-1, 1);
        for (int i = 0; i < SN; ++i) b[i] = uni(0, 1), g[i] = uni(-1, 0);
        for (int i = 0; i < SN * SK * SV; ++i) S0[i] = uni(-0.3, 0.3);
        for (int G = 1; G <= 2; ++G) {
            const float *gkp = G == 2 ? gk : NULL;
            int rc = la_gdr_step(q, k, v, b, g, gkp, SN, G, SK, SV, 0.3f, 1, S0, S1, o1, wk);
            rc |= gdr_forward(q, SK, SK, k, SK, SK, G, 0, v, SV, SV, b, 1, g, 1, gkp, SK, SK, SN,
                              1, SK, SV, 0, SV, 0.3f, 1, S0, S2, o2, SV, SV, NULL, 0, NULL, 0, 0,
                              wk);
            ++checks;
            if (rc || memcmp(S1, S2, sizeof S1) || memcmp(o1, o2, sizeof o1)) {
                ++failures;
                printf("FAIL: la_gdr_step differs from la_gdr_forward (G %d, rc %d)\n", G, rc);
            }
            /* and the reference (the step's q/k rows: token stride = head stride = SK) */
            double *Sref = malloc(sizeof(double) * SN * SK * SV), *oref = malloc(sizeof(double) * SN * SV);
            reference(SN, G, 1, SK, SV, q, SK, SK, k, SK, SK, v, SV, SV, b, g, gkp, 0.3f, 1, S0,
                      Sref, oref);
            expect("step o", rel_err(o1, SV, oref, SN, SV), G == 1 ? "step G=1" : "step G=2 gk");
            expect("step S", rel_err(S1, SV, Sref, SN * SK, SV), G == 1 ? "step G=1" : "step G=2 gk");
            free(Sref), free(oref);
        }
        /* the step's own value checks: a NaN beta is -2, a NaN or positive gate (scalar or
         * per-key) -3, and the outputs are not touched; a per-key -inf (a reset) is a gate */
        float nan = NAN, keep = S1[0];
        S1[0] = 12345.0f;
        b[1] = nan;
        int bad_beta = la_gdr_step(q, k, v, b, g, NULL, SN, 1, SK, SV, 0.3f, 1, S0, S1, o1, wk);
        b[1] = 0.5f;
        g[2] = 0.25f;
        int pos_gate = la_gdr_step(q, k, v, b, g, NULL, SN, 1, SK, SV, 0.3f, 1, S0, S1, o1, wk);
        g[2] = nan;
        int nan_gate = la_gdr_step(q, k, v, b, g, NULL, SN, 1, SK, SV, 0.3f, 1, S0, S1, o1, wk);
        g[2] = -0.5f;
        gk[SN * SK - 1] = 0.125f;
        int pos_gk = la_gdr_step(q, k, v, b, g, gk, SN, 2, SK, SV, 0.3f, 1, S0, S1, o1, wk);
        gk[SN * SK - 1] = nan;
        int nan_gk = la_gdr_step(q, k, v, b, NULL, gk, SN, 2, SK, SV, 0.3f, 1, S0, S1, o1, wk);
        gk[SN * SK - 1] = -0.5f;
        int no_gate = la_gdr_step(q, k, v, b, NULL, NULL, SN, 1, SK, SV, 0.3f, 1, S0, S2, o2, wk);
        int reset_gk = la_gdr_step(q, k, v, b, NULL, gk, SN, 2, SK, SV, 0.3f, 1, S0, S2, o2, wk);
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
    int refused = gdr_forward(dummy, 0, 0, dummy, 0, 0, 1, 0, dummy, 0, 0, dummy, 0, NULL, 0,
                              NULL, 0, 0, 1, 1, 4, 16, 0, 32, 1.0f, 0, dummy, dummy, dummy, 0, 0,
                              NULL, 0, NULL, 0, 0, dummy) == -1;
    if (W > 1)
        refused &= gdr_forward(dummy, 0, 0, dummy, 0, 0, 1, 0, dummy, 0, 0, dummy, 0, NULL, 0,
                               NULL, 0, 0, 1, 1, 4, W + 1, 0, W + 1, 1.0f, 0, dummy, dummy, dummy,
                               0, 0, NULL, 0, NULL, 0, 0, dummy) == -1;
    refused &= gdr_forward(dummy, 0, 0, dummy, 0, 0, 0, 0, dummy, 0, 0, dummy, 0, NULL, 0, NULL,
                           0, 0, 1, 1, 4, 16, 0, 16, 1.0f, 0, dummy, dummy, dummy, 0, 0, NULL, 0,
                           NULL, 0, 0, dummy) == -1;
    refused &= gdr_forward(dummy, 0, 0, dummy, 0, 0, 2, 2, dummy, 0, 0, dummy, 0, NULL, 0, NULL,
                           0, 0, 1, 1, 4, 16, 0, 16, 1.0f, 0, dummy, dummy, dummy, 0, 0, NULL, 0,
                           NULL, 0, 0, dummy) == -1;
    ++checks;
    if (!refused) {
        ++failures;
        printf("FAIL: bad sizes were not refused\n");
    }
    if (failures) {
        printf("FAIL: %d of %d checks (W=%d)\n", failures, checks, W);
        return 1;
    }
    printf("PASS: %d checks, la_gdr_forward, W=%d, GDR_NB=%d\n", checks, W, GDR_NB);
    return 0;
}
