/* Stand-alone check of la_gdr_forward (the (gated) delta rule in src/linattn/ops/delta/kernels.c)
 * against a naive double-precision recurrence, without Python or torch, for building the kernel
 * in every vector form (-DLA_W=1/4/8/16 or whatever the -m flags pick) and on other ISAs (an
 * aarch64 build under qemu), as tests/c/native_harness.c does for the linear-attention kernels:
 *
 *   cc -O3 -march=native -o /tmp/gdr_harness tests/c/gdr_harness.c -lm && /tmp/gdr_harness
 *
 * Reference, per head: a = exp(g_t) (1 without g), qn = s q_t, kn = k_t (each divided by
 * sqrt(sum x^2 + 1e-6) first with l2norm), u = beta_t (v_t - a S^T kn), S <- a S + kn u^T,
 * o_t = S^T qn. Checked: gated and not, l2norm and not, (K, V) with K not a multiple of any
 * width, T = 0, 1, 5, 64 (one token chunk), 65 and 150 (partial chunks), head and token strides
 * larger than the rows, S_out apart from S_in and in place, and the columns computed in two
 * calls (v0, v1) as threads share a head; la_gdr_step (T = 1, contiguous) against
 * la_gdr_forward bit for bit. Buffers carry NaN guards past their ends and in the gaps between
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

static void reference(long N, long T, long K, long V, const float *q, long qs, long qt,
                      const float *k, long ks, long kt, const float *v, long vs, long vt,
                      const float *beta, const float *g, float scale, int l2norm,
                      const float *S0, double *S, double *o) {
    double *qn = malloc(K * sizeof(double)), *kn = malloc(K * sizeof(double));
    double *u = malloc(V * sizeof(double)), *kS = malloc(V * sizeof(double));
    for (long n = 0; n < N; ++n) {
        double *Sn = S + n * K * V;
        for (long i = 0; i < K * V; ++i) Sn[i] = S0[n * K * V + i];
        for (long t = 0; t < T; ++t) {
            const float *qr = q + n * qs + t * qt, *kr = k + n * ks + t * kt;
            double nq = 0, nk = 0;
            for (long i = 0; i < K; ++i) nq += (double)qr[i] * qr[i], nk += (double)kr[i] * kr[i];
            double cq = l2norm ? 1.0 / sqrt(nq + 1e-6) : 1.0, ck = l2norm ? 1.0 / sqrt(nk + 1e-6) : 1.0;
            for (long i = 0; i < K; ++i) qn[i] = scale * cq * qr[i], kn[i] = ck * kr[i];
            double a = g ? exp((double)g[n * T + t]) : 1.0, b = beta[n * T + t];
            for (long j = 0; j < V; ++j) {
                kS[j] = 0;
                for (long i = 0; i < K; ++i) kS[j] += kn[i] * Sn[i * V + j];
                u[j] = b * ((double)v[n * vs + t * vt + j] - a * kS[j]);
            }
            for (long i = 0; i < K; ++i)
                for (long j = 0; j < V; ++j) Sn[i * V + j] = a * Sn[i * V + j] + kn[i] * u[j];
            for (long j = 0; j < V; ++j) {
                double s = 0;
                for (long i = 0; i < K; ++i) s += qn[i] * Sn[i * V + j];
                o[(n * T + t) * V + j] = s;
            }
        }
    }
    free(qn), free(kn), free(u), free(kS);
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

static void run(long N, long T, long K, long V, int gated, int l2norm, int mode) {
    /* mode 0: S_out apart; 1: in place; 2: in place, columns in two calls */
    char cfg[160];
    snprintf(cfg, sizeof cfg, "N=%ld T=%ld K=%ld V=%ld gated=%d l2norm=%d mode=%d W=%d", N, T,
             K, V, gated, l2norm, mode, W);
    long qt = K + 3, qs = T * qt + 5, vt = V + 2, vs = T * vt + 7, ot = V + 1, os = T * ot + 3;
    long nq = N * qs, nv = N * vs, no = N * os;
    float *q = guarded_alloc(nq), *k = guarded_alloc(nq), *v = guarded_alloc(nv);
    float *o = guarded_alloc(no), *beta = guarded_alloc(N * T), *g = guarded_alloc(N * T);
    float *S0 = guarded_alloc(N * K * V), *S = guarded_alloc(N * K * V);
    float *work = guarded_alloc(la_gdr_work(K));
    float kscale = l2norm ? 1.0f : 1.0f / sqrtf((float)K);
    for (long n = 0; n < N; ++n)
        for (long t = 0; t < T; ++t) {
            for (long i = 0; i < K; ++i) {
                q[n * qs + t * qt + i] = uni(-1, 1) * kscale * 1.7f;
                k[n * qs + t * qt + i] = uni(-1, 1) * kscale * 1.7f;
            }
            for (long j = 0; j < V; ++j) v[n * vs + t * vt + j] = uni(-1, 1);
            beta[n * T + t] = uni(0, 1);
            g[n * T + t] = uni(-1, 0);
        }
    for (long i = 0; i < N * K * V; ++i) S0[i] = uni(-0.3, 0.3);
    float *S0copy = malloc((size_t)(N * K * V + 1) * sizeof(float));
    memcpy(S0copy, S0, (size_t)(N * K * V) * sizeof(float));
    float scale = 1.0f / sqrtf((float)K);
    double *Sref = malloc((size_t)(N * K * V + 1) * sizeof(double));
    double *oref = malloc((size_t)(N * T * V + 1) * sizeof(double));
    reference(N, T, K, V, q, qs, qt, k, qs, qt, v, vs, vt, beta, gated ? g : NULL, scale, l2norm,
              S0, Sref, oref);
    const float *gp = gated ? g : NULL;
    int rc = 0;
    if (mode == 0) {
        rc |= gdr_forward(q, qs, qt, k, qs, qt, v, vs, vt, beta, T, gp, T, N, T, K, V, 0, V,
                          scale, l2norm, S0, S, o, os, ot, NULL, 0, NULL, 0, 0, work);
    } else {
        memcpy(S, S0, (size_t)(N * K * V) * sizeof(float));
        long mid = mode == 2 ? (V / W / 2) * W : V;
        rc |= gdr_forward(q, qs, qt, k, qs, qt, v, vs, vt, beta, T, gp, T, N, T, K, V, 0, mid,
                          scale, l2norm, S, S, o, os, ot, NULL, 0, NULL, 0, 0, work);
        if (mode == 2)
            rc |= gdr_forward(q, qs, qt, k, qs, qt, v, vs, vt, beta, T, gp, T, N, T, K, V, mid,
                              V, scale, l2norm, S, S, o, os, ot, NULL, 0, NULL, 0, 0, work);
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
    if (mode == 0) /* S_in untouched */
        expect("S_in kept", memcmp(S0, S0copy, (size_t)(N * K * V) * sizeof(float)) ? 1.0 : 0.0,
               cfg);
    free(S0copy);
    free(q), free(k), free(v), free(o), free(beta), free(g), free(S0), free(S), free(work);
    free(Sref), free(oref);
}

int main(void) {
    const long shapes[][2] = {{64, 64}, {20, 48}, {16, 16}, {7, 32}};
    const long Ts[] = {0, 1, 5, 64, 65, 150};
    for (unsigned s = 0; s < sizeof shapes / sizeof *shapes; ++s)
        for (unsigned t = 0; t < sizeof Ts / sizeof *Ts; ++t)
            for (int gated = 0; gated < 2; ++gated)
                for (int l2 = 0; l2 < 2; ++l2)
                    for (int mode = 0; mode < 3; ++mode)
                        run(s == 0 ? 3 : 2, Ts[t], shapes[s][0], shapes[s][1], gated, l2, mode);
    /* la_gdr_step: la_gdr_forward with T = 1 on contiguous rows, bit for bit */
    {
        enum { SN = 3, SK = 20, SV = 32 };
        static float q[SN * SK], k[SN * SK], v[SN * SV], b[SN], g[SN], S0[SN * SK * SV];
        static float S1[SN * SK * SV], S2[SN * SK * SV], o1[SN * SV], o2[SN * SV], wk[64 * 43];
        for (int i = 0; i < SN * SK; ++i) q[i] = uni(-1, 1), k[i] = uni(-1, 1);
        for (int i = 0; i < SN * SV; ++i) v[i] = uni(-1, 1);
        for (int i = 0; i < SN; ++i) b[i] = uni(0, 1), g[i] = uni(-1, 0);
        for (int i = 0; i < SN * SK * SV; ++i) S0[i] = uni(-0.3, 0.3);
        int rc = la_gdr_step(q, k, v, b, g, SN, SK, SV, 0.3f, 1, S0, S1, o1, wk);
        rc |= gdr_forward(q, SK, SK, k, SK, SK, v, SV, SV, b, 1, g, 1, SN, 1, SK, SV, 0, SV, 0.3f,
                          1, S0, S2, o2, SV, SV, NULL, 0, NULL, 0, 0, wk);
        ++checks;
        if (rc || memcmp(S1, S2, sizeof S1) || memcmp(o1, o2, sizeof o1)) {
            ++failures;
            printf("FAIL: la_gdr_step differs from la_gdr_forward (rc %d)\n", rc);
        }
        /* the step's own value checks: a NaN beta is -2, a NaN or positive gate -3, and the
         * outputs are not touched */
        float nan = NAN, keep = S1[0];
        S1[0] = 12345.0f;
        b[1] = nan;
        int bad_beta = la_gdr_step(q, k, v, b, g, SN, SK, SV, 0.3f, 1, S0, S1, o1, wk);
        b[1] = 0.5f;
        g[2] = 0.25f;
        int pos_gate = la_gdr_step(q, k, v, b, g, SN, SK, SV, 0.3f, 1, S0, S1, o1, wk);
        g[2] = nan;
        int nan_gate = la_gdr_step(q, k, v, b, g, SN, SK, SV, 0.3f, 1, S0, S1, o1, wk);
        int no_gate = la_gdr_step(q, k, v, b, NULL, SN, SK, SV, 0.3f, 1, S0, S2, o2, wk);
        ++checks;
        if (bad_beta != -2 || pos_gate != -3 || nan_gate != -3 || no_gate != 0
            || S1[0] != 12345.0f) {
            ++failures;
            printf("FAIL: la_gdr_step value checks (%d %d %d %d)\n", bad_beta, pos_gate,
                   nan_gate, no_gate);
        }
        S1[0] = keep;
    }
    /* sizes it must refuse: V not a multiple of W (W > 1), columns out of range */
    float dummy[64] = {0};
    int refused = gdr_forward(dummy, 0, 0, dummy, 0, 0, dummy, 0, 0, dummy, 0, NULL, 0, 1, 1, 4,
                              16, 0, 32, 1.0f, 0, dummy, dummy, dummy, 0, 0, NULL, 0, NULL, 0, 0,
                              dummy) == -1;
    if (W > 1)
        refused &= gdr_forward(dummy, 0, 0, dummy, 0, 0, dummy, 0, 0, dummy, 0, NULL, 0, 1, 1, 4,
                               W + 1, 0, W + 1, 1.0f, 0, dummy, dummy, dummy, 0, 0, NULL, 0, NULL, 0, 0,
                              dummy) == -1;
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
