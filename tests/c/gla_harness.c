/* Stand-alone check of the GLA kernels (la_gla_forward, la_gla_backward, la_gla_step in
 * src/linattn/ops/gated/kernels.c) against a naive double-precision recurrence, without Python
 * or torch, for building them in every vector form (-DLA_W=1/4/8/16 or whatever the -m flags
 * pick) and on other ISAs (aarch64 under qemu), as tests/c/delta_harness.c does for the delta rule:
 *
 *   cc -O3 -march=native -o /tmp/gla_harness tests/c/gla_harness.c -lm && /tmp/gla_harness
 *
 * Reference, per head: a_t,i = exp(g_t + gk_t,i), S_t = diag(a_t) S_{t-1} + k_t v_t^T,
 * o_t = s S_t^T q_t, every state kept; the backward walks them in reverse:
 * dS_t = diag(a_{t+1}) dS_{t+1} + s q_t do_t^T, dq_t = s S_t do_t, dk_t = dS_t v_t,
 * dv_t = dS_t^T k_t, dgk_t,i = a_t,i sum_j dS_t,ij S_{t-1},ij, dg_t = sum_i dgk_t,i, and the
 * initial state's gradient diag(a_1) dS_1. That reference backward is itself checked against
 * central differences of the reference forward (a loss sum w.o + sum W.S_T) on a small case.
 * Checked: no gate, a scalar gate, per-key gates, both, hard resets (g = -inf) and decays that
 * flush (g near -90); (K, V) with K not a multiple of any width; T = 0, 1, 5, 64, 65, 150; chunks
 * C = 1, 7, 16, 64; head and token strides larger than the rows; the checkpoints against the
 * reference's states; S_out apart from S_in and in place; the forward's columns in two calls
 * (v0, v1) as threads share a head; the backward with and without a final-state gradient and in
 * place (dS_out = dS_in); la_gla_step against la_gla_forward bit for bit and its gate checks.
 * Buffers carry NaN guards past their ends and in the gaps between rows, which must come back
 * untouched. Errors are max |kernel - reference| / max |reference| per array; above TOL the
 * run fails.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/linattn/ops/gated/kernels.c"

/* Through volatile pointers: what runs is the code a shared library exports, not a clone
 * specialised for this file's constants. */
static __typeof__(la_gla_forward) *volatile gla_forward = la_gla_forward;
static __typeof__(la_gla_backward) *volatile gla_backward = la_gla_backward;

#define TOL 3e-5
#define HARNESS_SEED 0x2545F4914F6CDD1Dull
#include "harness_common.h"

/* max |got - want| / max |want| over H heads of R rows of F (got: head stride gs, row stride
 * gr; want contiguous). */
static double rel_err(const float *got, long gs, long gr, const double *want, long H, long R,
                      long F) {
    double m = 1e-3, e = 0;
    for (long n = 0; n < H; ++n)
        for (long r = 0; r < R; ++r)
            for (long j = 0; j < F; ++j) {
                double w = want[(n * R + r) * F + j], d = fabs((double)got[n * gs + r * gr + j] - w);
                if (fabs(w) > m) m = fabs(w);
                if (!(d <= e)) e = d; /* NaN: e becomes NaN, which fails the check */
            }
    return e / m;
}

/* One problem: N heads, inputs with padded strides. */
typedef struct {
    long N, T, K, V, qt, qs, vt, vs, gkt, gks, ot, os;
    float *q, *k, *v, *g, *gk, *S0, *dout, *dSf;
    int use_g, use_gk;
    float scale;
} problem;

static double ref_decay(const problem *p, long n, long t, long i) {
    double x = 0;
    if (p->use_g) x += p->g[n * p->T + t];
    if (p->use_gk) x += p->gk[n * p->gks + t * p->gkt + i];
    return exp(x);
}

/* States Sall (N, T + 1, K, V) (index 0: the initial state), outputs o (N, T, V). */
static void ref_forward(const problem *p, double *Sall, double *o) {
    long N = p->N, T = p->T, K = p->K, V = p->V;
    for (long n = 0; n < N; ++n) {
        double *S = Sall + n * (T + 1) * K * V;
        for (long i = 0; i < K * V; ++i) S[i] = p->S0[n * K * V + i];
        for (long t = 0; t < T; ++t) {
            double *Sp = S + t * K * V, *Sn = Sp + K * V;
            const float *qr = p->q + n * p->qs + t * p->qt, *kr = p->k + n * p->qs + t * p->qt;
            const float *vr = p->v + n * p->vs + t * p->vt;
            for (long i = 0; i < K; ++i) {
                double a = ref_decay(p, n, t, i);
                for (long j = 0; j < V; ++j) Sn[i * V + j] = a * Sp[i * V + j] + (double)kr[i] * vr[j];
            }
            for (long j = 0; j < V; ++j) {
                double s = 0;
                for (long i = 0; i < K; ++i) s += (double)qr[i] * Sn[i * V + j];
                o[(n * T + t) * V + j] = p->scale * s;
            }
        }
    }
}

/* Gradients of sum dout.o + sum dSf.S_T (dSf may be NULL): dq, dk (N, T, K), dv (N, T, V),
 * dg (N, T), dgk (N, T, K), dS0 (N, K, V). */
static void ref_backward(const problem *p, const double *Sall, const float *dSf, double *dq,
                         double *dk, double *dv, double *dg, double *dgk, double *dS0) {
    long N = p->N, T = p->T, K = p->K, V = p->V;
    double *dS = malloc((size_t)(K * V + 1) * sizeof(double));
    for (long n = 0; n < N; ++n) {
        const double *S = Sall + n * (T + 1) * K * V;
        for (long i = 0; i < K * V; ++i) dS[i] = dSf ? dSf[n * K * V + i] : 0.0;
        for (long t = T - 1; t >= 0; --t) {
            const double *St = S + (t + 1) * K * V, *Sp = S + t * K * V;
            const float *qr = p->q + n * p->qs + t * p->qt, *kr = p->k + n * p->qs + t * p->qt;
            const float *vr = p->v + n * p->vs + t * p->vt, *dr = p->dout + (n * T + t) * V;
            double gsum = 0;
            for (long i = 0; i < K; ++i) {
                double sq = 0, sk = 0, sg = 0;
                for (long j = 0; j < V; ++j) {
                    double *d = dS + i * V + j;
                    *d += p->scale * (double)qr[i] * dr[j];
                    sq += St[i * V + j] * dr[j];
                    sk += *d * vr[j];
                    sg += *d * Sp[i * V + j];
                }
                double a = ref_decay(p, n, t, i);
                dq[(n * T + t) * K + i] = p->scale * sq;
                dk[(n * T + t) * K + i] = sk;
                dgk[(n * T + t) * K + i] = a * sg;
                gsum += a * sg;
            }
            dg[n * T + t] = gsum;
            for (long j = 0; j < V; ++j) {
                double s = 0;
                for (long i = 0; i < K; ++i) s += (double)kr[i] * dS[i * V + j];
                dv[(n * T + t) * V + j] = s;
            }
            for (long i = 0; i < K; ++i) {
                double a = ref_decay(p, n, t, i);
                for (long j = 0; j < V; ++j) dS[i * V + j] *= a;
            }
        }
        for (long i = 0; i < K * V; ++i) dS0[n * K * V + i] = dS[i];
    }
    free(dS);
}

static problem make(long N, long T, long K, long V, int use_g, int use_gk, int strong) {
    problem p = {N, T, K, V, 0};
    p.qt = K + 3, p.qs = T * p.qt + 5, p.vt = V + 2, p.vs = T * p.vt + 7;
    p.gkt = K + 1, p.gks = T * p.gkt + 2, p.ot = V + 1, p.os = T * p.ot + 3;
    p.use_g = use_g, p.use_gk = use_gk, p.scale = 1.0f / sqrtf((float)K);
    p.q = guarded_f32(N * p.qs), p.k = guarded_f32(N * p.qs);
    p.v = guarded_f32(N * p.vs), p.g = guarded_f32(N * T);
    p.gk = guarded_f32(N * p.gks), p.S0 = guarded_f32(N * K * V);
    p.dout = guarded_f32(N * T * V), p.dSf = guarded_f32(N * K * V);
    for (long n = 0; n < N; ++n)
        for (long t = 0; t < T; ++t) {
            for (long i = 0; i < K; ++i) {
                p.q[n * p.qs + t * p.qt + i] = uni(-1, 1);
                p.k[n * p.qs + t * p.qt + i] = uni(-1, 1);
                p.gk[n * p.gks + t * p.gkt + i] = uni(-0.7, 0);
            }
            for (long j = 0; j < V; ++j) p.v[n * p.vs + t * p.vt + j] = uni(-1, 1);
            for (long j = 0; j < V; ++j) p.dout[(n * T + t) * V + j] = uni(-1, 1);
            p.g[n * T + t] = uni(-0.3, 0);
            if (strong && t % 17 == 3) p.g[n * T + t] = -INFINITY; /* a hard reset */
            if (strong && t % 11 == 5) p.g[n * T + t] = -90.0f;    /* a decay that flushes */
        }
    for (long i = 0; i < N * K * V; ++i) p.S0[i] = uni(-0.5, 0.5), p.dSf[i] = uni(-0.5, 0.5);
    return p;
}

static void release(problem *p) {
    free(p->q), free(p->k), free(p->v), free(p->g), free(p->gk), free(p->S0), free(p->dout);
    free(p->dSf);
}

static void run(long N, long T, long K, long V, long C, int use_g, int use_gk, int strong,
                int mode) {
    /* forward mode 0: S_out apart; 1: in place; 2: in place, columns in two calls. Backward:
     * mode 0 with the final-state gradient; 1 without; 2 with it, in place. */
    char cfg[200];
    snprintf(cfg, sizeof cfg, "N=%ld T=%ld K=%ld V=%ld C=%ld g=%d gk=%d strong=%d mode=%d W=%d",
             N, T, K, V, C, use_g, use_gk, strong, mode, W);
    problem p = make(N, T, K, V, use_g, use_gk, strong);
    long nc = (T + C - 1) / C, cks = nc * K * V + 9;
    float *S = guarded_f32(N * K * V), *o = guarded_f32(N * p.os);
    float *ckpt = guarded_f32(N * cks), *work = guarded_f32(la_gla_work(K, C));
    double *Sall = malloc((size_t)(N * (T + 1) * K * V + 1) * sizeof(double));
    double *oref = malloc((size_t)(N * T * V + 1) * sizeof(double));
    ref_forward(&p, Sall, oref);
    const float *g = use_g ? p.g : NULL, *gk = use_gk ? p.gk : NULL;
    float *S0copy = malloc((size_t)(N * K * V + 1) * sizeof(float));
    memcpy(S0copy, p.S0, (size_t)(N * K * V) * sizeof(float));
    int rc = 0;
    if (mode == 0) {
        rc |= gla_forward(p.q, p.qs, p.qt, p.k, p.qs, p.qt, p.v, p.vs, p.vt, g, T, gk, p.gks,
                          p.gkt, N, T, K, V, 0, V, C, p.scale, p.S0, S, o, p.os, p.ot, ckpt, cks, NULL,
                          work);
    } else {
        memcpy(S, p.S0, (size_t)(N * K * V) * sizeof(float));
        long mid = mode == 2 ? (V / W / 2) * W : V;
        rc |= gla_forward(p.q, p.qs, p.qt, p.k, p.qs, p.qt, p.v, p.vs, p.vt, g, T, gk, p.gks,
                          p.gkt, N, T, K, V, 0, mid, C, p.scale, S, S, o, p.os, p.ot, ckpt, cks, NULL,
                          work);
        if (mode == 2)
            rc |= gla_forward(p.q, p.qs, p.qt, p.k, p.qs, p.qt, p.v, p.vs, p.vt, g, T, gk, p.gks,
                              p.gkt, N, T, K, V, mid, V, C, p.scale, S, S, o, p.os, p.ot, ckpt,
                              cks, NULL, work);
    }
    ++checks;
    if (rc) {
        ++failures;
        printf("FAIL %s: forward rc %d\n", cfg, rc);
    }
    expect_within("o", rel_err(o, p.os, p.ot, oref, N, T, V), TOL, cfg);
    double *Sfin = malloc((size_t)(N * K * V + 1) * sizeof(double));
    double *Sck = malloc((size_t)(N * nc * K * V + 1) * sizeof(double));
    for (long n = 0; n < N; ++n) {
        memcpy(Sfin + n * K * V, Sall + (n * (T + 1) + T) * K * V, (size_t)(K * V) * sizeof(double));
        for (long c = 0; c < nc; ++c)
            memcpy(Sck + (n * nc + c) * K * V, Sall + (n * (T + 1) + c * C) * K * V,
                   (size_t)(K * V) * sizeof(double));
    }
    expect_within("S", rel_err(S, K * V, V, Sfin, N, K, V), TOL, cfg);
    if (nc) expect_within("checkpoints", rel_err(ckpt, cks, V, Sck, N, nc * K, V), TOL, cfg);
    expect_guards("o", o, N, p.os, T, p.ot, V, N * p.os, cfg);
    expect_guards("S", S, 1, N * K * V, N * K, V, V, N * K * V, cfg);
    expect_guards("checkpoints", ckpt, N, cks, nc * K, V, V, N * cks, cfg);
    if (mode == 0)
        expect(!memcmp(p.S0, S0copy, (size_t)(N * K * V) * sizeof(float)), "S_in kept", cfg);

    /* backward */
    long dqt = K + 2, dqs = T * dqt + 3, dvt = V + 3, dvs = T * dvt + 1, dgs = T + 4;
    long dgkt = K + 5, dgks = T * dgkt + 2;
    float *dq = guarded_f32(N * dqs), *dk = guarded_f32(N * dqs);
    float *dv = guarded_f32(N * dvs);
    float *dg = guarded_f32(N * dgs), *dgk = guarded_f32(N * dgks);
    float *dS0 = guarded_f32(N * K * V);
    double *rq = malloc((size_t)(N * T * K + 1) * sizeof(double));
    double *rk = malloc((size_t)(N * T * K + 1) * sizeof(double));
    double *rv = malloc((size_t)(N * T * V + 1) * sizeof(double));
    double *rg = malloc((size_t)(N * T + 1) * sizeof(double));
    double *rgk = malloc((size_t)(N * T * K + 1) * sizeof(double));
    double *rS0 = malloc((size_t)(N * K * V + 1) * sizeof(double));
    const float *dSf = mode == 1 ? NULL : p.dSf;
    ref_backward(&p, Sall, dSf, rq, rk, rv, rg, rgk, rS0);
    if (mode == 2) memcpy(dS0, p.dSf, (size_t)(N * K * V) * sizeof(float));
    rc = gla_backward(p.q, p.qs, p.qt, p.k, p.qs, p.qt, p.v, p.vs, p.vt, g, T, gk, p.gks, p.gkt,
                      p.dout, T * V, V, N, T, K, V, C, p.scale, ckpt, cks,
                      mode == 2 ? dS0 : dSf, dS0, dq, dqs, dqt, dk, dqs, dqt, dv, dvs, dvt,
                      use_g ? dg : NULL, dgs, use_gk ? dgk : NULL, dgks, dgkt, LA_F32, work);
    ++checks;
    if (rc) {
        ++failures;
        printf("FAIL %s: backward rc %d\n", cfg, rc);
    }
    expect_within("dq", rel_err(dq, dqs, dqt, rq, N, T, K), TOL, cfg);
    expect_within("dk", rel_err(dk, dqs, dqt, rk, N, T, K), TOL, cfg);
    expect_within("dv", rel_err(dv, dvs, dvt, rv, N, T, V), TOL, cfg);
    expect_within("dS0", rel_err(dS0, K * V, V, rS0, N, K, V), TOL, cfg);
    expect_guards("dq", dq, N, dqs, T, dqt, K, N * dqs, cfg);
    expect_guards("dk", dk, N, dqs, T, dqt, K, N * dqs, cfg);
    expect_guards("dv", dv, N, dvs, T, dvt, V, N * dvs, cfg);
    expect_guards("dS0", dS0, 1, N * K * V, N * K, V, V, N * K * V, cfg);
    if (use_g) {
        expect_within("dg", rel_err(dg, dgs, 1, rg, N, T, 1), TOL, cfg);
        expect_guards("dg", dg, N, dgs, T, 1, 1, N * dgs, cfg);
    } else {
        expect_guards("dg untouched", dg, 0, 1, 0, 1, 0, N * dgs, cfg);
    }
    if (use_gk) {
        expect_within("dgk", rel_err(dgk, dgks, dgkt, rgk, N, T, K), TOL, cfg);
        expect_guards("dgk", dgk, N, dgks, T, dgkt, K, N * dgks, cfg);
    } else {
        expect_guards("dgk untouched", dgk, 0, 1, 0, 1, 0, N * dgks, cfg);
    }
    free(dq), free(dk), free(dv), free(dg), free(dgk), free(dS0);
    free(rq), free(rk), free(rv), free(rg), free(rgk), free(rS0);
    free(S0copy), free(S), free(o), free(ckpt), free(work), free(Sall), free(oref), free(Sfin);
    free(Sck);
    release(&p);
}

/* The reference backward against central differences of the reference forward. */
static void check_reference(void) {
    problem p = make(1, 6, 3, 2, 1, 1, 0);
    long T = p.T, K = p.K, V = p.V;
    double *Sall = malloc((size_t)((T + 1) * K * V) * sizeof(double));
    double *o = malloc((size_t)(T * V) * sizeof(double));
    double *dq = malloc((size_t)(T * K) * sizeof(double)), *dk = malloc((size_t)(T * K) * sizeof(double));
    double *dv = malloc((size_t)(T * V) * sizeof(double)), *dg = malloc((size_t)T * sizeof(double));
    double *dgk = malloc((size_t)(T * K) * sizeof(double)), *dS0 = malloc((size_t)(K * V) * sizeof(double));
    ref_forward(&p, Sall, o);
    ref_backward(&p, Sall, p.dSf, dq, dk, dv, dg, dgk, dS0);
    /* (parameter, analytic gradient) pairs */
    struct { float *x; double grad; } probes[] = {
        {p.q + 2 * p.qt + 1, dq[2 * K + 1]}, {p.k + 4 * p.qt + 2, dk[4 * K + 2]},
        {p.v + 1 * p.vt + 1, dv[1 * V + 1]}, {p.g + 3, dg[3]},
        {p.gk + 2 * p.gkt + 0, dgk[2 * K + 0]}, {p.S0 + 4, dS0[4]},
        {p.gk + 0 * p.gkt + 2, dgk[2]}, {p.k + 5 * p.qt + 0, dk[5 * K]},
    };
    for (unsigned i = 0; i < sizeof probes / sizeof *probes; ++i) {
        float keep = *probes[i].x;
        double h = 1e-3, L[2];
        for (int side = 0; side < 2; ++side) {
            *probes[i].x = keep + (float)(side ? h : -h);
            ref_forward(&p, Sall, o);
            double s = 0;
            for (long t = 0; t < T * V; ++t) s += o[t] * p.dout[t];
            for (long j = 0; j < K * V; ++j) s += Sall[T * K * V + j] * p.dSf[j];
            L[side] = s;
        }
        double x1 = (double)(float)(keep + (float)h), x0 = (double)(float)(keep - (float)h);
        *probes[i].x = keep;
        double fd = (L[1] - L[0]) / (x1 - x0), err = fabs(fd - probes[i].grad);
        ++checks;
        if (!(err <= 1e-5 * (1 + fabs(fd)))) {
            ++failures;
            printf("FAIL: reference backward, probe %u: analytic %.9g, differences %.9g\n", i,
                   probes[i].grad, fd);
        }
    }
    free(Sall), free(o), free(dq), free(dk), free(dv), free(dg), free(dgk), free(dS0);
    release(&p);
}

int main(void) {
    check_reference();
    const long shapes[][2] = {{64, 64}, {20, 48}, {16, 16}, {7, 32}};
    const long Ts[] = {0, 1, 5, 64, 65, 150};
    const long Cs[] = {64, 16, 7, 1};
    const int gates[][3] = {{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {1, 1, 0}, {1, 0, 1}, {1, 1, 1}};
    unsigned long fpc = fp_control();
    for (unsigned s = 0; s < sizeof shapes / sizeof *shapes; ++s)
        for (unsigned t = 0; t < sizeof Ts / sizeof *Ts; ++t)
            for (unsigned gi = 0; gi < sizeof gates / sizeof *gates; ++gi)
                for (int mode = 0; mode < 3; ++mode) {
                    long C = Cs[(s + t + gi + mode) % 4];
                    if (C == 1 && Ts[t] > 65) C = 16; /* keep the run short */
                    run(s == 0 ? 3 : 2, Ts[t], shapes[s][0], shapes[s][1], C, gates[gi][0],
                        gates[gi][1], gates[gi][2], mode);
                }
    expect(fp_control() == fpc, "the floating-point control register handed back", "forward");
    /* la_gla_forward_call on 16-bit rows (gla_forward_widened): the float32 forward on the
     * rounded values with o rounded once, whole or in two column blocks; the same chunks of
     * the same function, so equal to the last bit */
    for (int dt = LA_BF16; dt <= LA_F16; ++dt)
        for (int split = 0; split < 2; ++split) {
            enum { FN = 2, FT = 150, FK = 20, FV = 32, FC = 16 };
            static unsigned short q16[FN * FT * FK], k16[FN * FT * FK], v16[FN * FT * FV];
            static unsigned short o16[FN * FT * FV];
            static float qr[FN * FT * FK], kr[FN * FT * FK], vr[FN * FT * FV], gk[FN * FT * FK];
            static float g[FN * FT], S0[FN * FK * FV], S1[FN * FK * FV], S2[FN * FK * FV];
            static float o1[FN * FT * FV];
            float *wk = malloc((size_t)la_gla_forward_work(FK, FV, FC, dt) * sizeof(float));
            unsigned short *half[] = {q16, k16, v16};
            float *back[] = {qr, kr, vr};
            const long len[] = {FN * FT * FK, FN * FT * FK, FN * FT * FV};
            for (int a = 0; a < 3; ++a)
                for (long i = 0; i < len[a]; ++i) {
                    store_dt(half[a], i, uni(-1, 1) * (a < 2 ? 0.3 : 1), dt);
                    back[a][i] = load_dt(half[a], i, dt);
                }
            for (long i = 0; i < FN * FT; ++i) g[i] = uni(-0.5, 0);
            for (long i = 0; i < FN * FT * FK; ++i) gk[i] = uni(-1, 0); /* (gates: float32) */
            for (long i = 0; i < FN * FK * FV; ++i) S0[i] = uni(-0.3, 0.3);
            long cuts[] = {0, split ? 16 : FV, FV};
            int rc = 0;
            memcpy(S1, S0, sizeof S0);
            memcpy(S2, S0, sizeof S0);
            for (int c = 0; c < 2; ++c) {
                if (cuts[c] == cuts[c + 1]) continue;
                la_gla_forward_args a = {qr, FT * FK, FK, kr, FT * FK, FK, vr, FT * FV, FV, g, FT,
                                         gk, FT * FK, FK, LA_F32, FN, FT, FK, FV, cuts[c],
                                         cuts[c + 1], FC, 0.3f, S1, S1, o1, FT * FV, FV, NULL, 0,
                                         wk};
                rc |= la_gla_forward_call(&a);
                la_gla_forward_args b = a;
                b.q = q16, b.k = k16, b.v = v16, b.dt = dt, b.S_in = S2;
                b.S_out = S2, b.o = o16;
                rc |= la_gla_forward_call(&b);
            }
            int same = rc == 0 && !memcmp(S1, S2, sizeof S1)
                       && rounded_once(o16, o1, FN * FT * FV, dt);
            ++checks;
            if (!same) {
                ++failures;
                printf("FAIL: la_gla_forward in dtype %d (split %d, rc %d) is not the float32 "
                       "forward on its values\n", dt, split, rc);
            }
            free(wk);
        }
    /* la_gla_step: la_gla_forward with T = 1 on contiguous rows, bit for bit */
    {
        enum { SN = 3, SK = 20, SV = 32 };
        static float q[SN * SK], k[SN * SK], v[SN * SV], g[SN], gk[SN * SK], S0[SN * SK * SV];
        static float S1[SN * SK * SV], S2[SN * SK * SV], o1[SN * SV], o2[SN * SV];
        /* enough for any of the steps below: 1 to 3 threads' shares, each with a part's
         * widened rows in a 16-bit step */
        long most = 0;
        for (int th = 1; th <= 3; ++th)
            if (la_gla_step_work(SN, SK, SV, th, LA_BF16) > most)
                most = la_gla_step_work(SN, SK, SV, th, LA_BF16);
        float *wk = malloc((size_t)most * sizeof(float));
        for (int i = 0; i < SN * SK; ++i) q[i] = uni(-1, 1), k[i] = uni(-1, 1), gk[i] = uni(-1, 0);
        for (int i = 0; i < SN * SV; ++i) v[i] = uni(-1, 1);
        for (int i = 0; i < SN; ++i) g[i] = uni(-1, 0);
        for (int i = 0; i < SN * SK * SV; ++i) S0[i] = uni(-0.3, 0.3);
        int rc = la_gla_step(q, k, v, g, gk, LA_F32, SN, SK, SV, 0.3f, S0, S1, o1, wk, 1);
        rc |= gla_forward(q, SK, SK, k, SK, SK, v, SV, SV, g, 1, gk, SK, SK, SN, 1, SK, SV, 0, SV, 1,
                          0.3f, S0, S2, o2, SV, SV, NULL, 0, NULL, wk);
        ++checks;
        if (rc || memcmp(S1, S2, sizeof S1) || memcmp(o1, o2, sizeof o1)) {
            ++failures;
            printf("FAIL: la_gla_step differs from la_gla_forward (rc %d)\n", rc);
        }
        /* its heads in parts on 2 and 3 threads (la_parallel): each head runs the same code
         * whichever thread takes it, so the results are the one-thread step's */
        for (int th = 2; th <= 3; ++th) {
            rc = la_gla_step(q, k, v, g, gk, LA_F32, SN, SK, SV, 0.3f, S0, S2, o2, wk, th);
            ++checks; /* (1: the other threads came late and took no part) */
            if ((rc != 0 && rc != 1) || memcmp(S1, S2, sizeof S1) || memcmp(o1, o2, sizeof o1)) {
                ++failures;
                printf("FAIL: la_gla_step on %d threads differs from one (rc %d)\n", th, rc);
            }
        }
        /* bfloat16 and float16 rows: read as float32 (exact), o rounded once, so the float32
         * step on the rounded inputs with its o rounded the same way */
        for (int dt = LA_BF16; dt <= LA_F16; ++dt) {
            static unsigned short q16[SN * SK], k16[SN * SK], v16[SN * SV], g16[SN];
            static unsigned short gk16[SN * SK], o16[SN * SV];
            static float qr[SN * SK], kr[SN * SK], vr[SN * SV], gr[SN], gkr[SN * SK];
            const float *src[] = {q, k, v, g, gk};
            unsigned short *half[] = {q16, k16, v16, g16, gk16};
            float *back[] = {qr, kr, vr, gr, gkr};
            const long len[] = {SN * SK, SN * SK, SN * SV, SN, SN * SK};
            for (int a = 0; a < 5; ++a)
                for (long i = 0; i < len[a]; ++i) {
                    store_dt(half[a], i, src[a][i], dt);
                    back[a][i] = load_dt(half[a], i, dt);
                }
            rc = la_gla_step(qr, kr, vr, gr, gkr, LA_F32, SN, SK, SV, 0.3f, S0, S1, o1, wk, 1);
            /* on 1, 2 and 3 threads: each part widens its own heads' rows */
            for (int th = 1; th <= 3; ++th) {
                int rc16 = la_gla_step(q16, k16, v16, g16, gk16, dt, SN, SK, SV, 0.3f, S0, S2,
                                       o16, wk, th);
                int same = rc == 0 && (rc16 == 0 || rc16 == 1)
                           && rounded_once(o16, o1, SN * SV, dt);
                ++checks;
                if (!same || memcmp(S1, S2, sizeof S1)) {
                    ++failures;
                    printf("FAIL: la_gla_step in dtype %d on %d threads is not the float32 step "
                           "on its values (rc %d)\n", dt, th, rc16);
                }
            }
            /* its gate checks read the 16-bit rows as given (a positive scalar gate; a NaN
             * per-key one, the last: in the scalar tail), and the outputs are not touched */
            float keep_s = S2[0];
            S2[0] = 12345.0f;
            unsigned short keep_g = g16[1], keep_gk = gk16[SN * SK - 1];
            store_dt(g16, 1, 0.25f, dt);
            int pos16 = la_gla_step(q16, k16, v16, g16, NULL, dt, SN, SK, SV, 0.3f, S0, S2, o16,
                                    wk, 1);
            g16[1] = keep_g;
            store_dt(gk16, SN * SK - 1, NAN, dt);
            int nan16 = la_gla_step(q16, k16, v16, g16, gk16, dt, SN, SK, SV, 0.3f, S0, S2, o16,
                                    wk, 1);
            gk16[SN * SK - 1] = keep_gk;
            ++checks;
            if (pos16 != -3 || nan16 != -3 || S2[0] != 12345.0f) {
                ++failures;
                printf("FAIL: la_gla_step's gate checks in dtype %d (%d %d)\n", dt, pos16, nan16);
            }
            S2[0] = keep_s;
        }
        /* the step's own gate checks: a NaN or positive gate is -3, and the outputs are not
         * touched */
        float keep = S1[0];
        S1[0] = 12345.0f;
        g[2] = 0.25f;
        int pos_g = la_gla_step(q, k, v, g, NULL, LA_F32, SN, SK, SV, 0.3f, S0, S1, o1, wk, 1);
        g[2] = NAN;
        int nan_g = la_gla_step(q, k, v, g, gk, LA_F32, SN, SK, SV, 0.3f, S0, S1, o1, wk, 1);
        g[2] = -0.5f;
        gk[SK + 3] = 1e-3f;
        int pos_gk = la_gla_step(q, k, v, NULL, gk, LA_F32, SN, SK, SV, 0.3f, S0, S1, o1, wk, 1);
        gk[SK + 3] = NAN;
        int nan_gk = la_gla_step(q, k, v, g, gk, LA_F32, SN, SK, SV, 0.3f, S0, S1, o1, wk, 1);
        int none = la_gla_step(q, k, v, NULL, NULL, LA_F32, SN, SK, SV, 0.3f, S0, S2, o2, wk, 1);
        ++checks;
        if (pos_g != -3 || nan_g != -3 || pos_gk != -3 || nan_gk != -3 || none != 0
            || S1[0] != 12345.0f) {
            ++failures;
            printf("FAIL: la_gla_step gate checks (%d %d %d %d %d)\n", pos_g, nan_g, pos_gk,
                   nan_gk, none);
        }
        S1[0] = keep;
        free(wk);
    }
    /* sizes they must refuse: V not a multiple of W (W > 1), columns out of range, C outside
     * 1..GLA_CMAX, a backward without checkpoints or without a gate's gradient */
    static float dummy[4096];
    int refused = gla_forward(dummy, 0, 0, dummy, 0, 0, dummy, 0, 0, NULL, 0, NULL, 0, 0, 1, 1,
                              4, 16, 0, 32, 8, 1.0f, dummy, dummy, dummy, 0, 0, NULL, 0, NULL,
                              dummy) == -1;
    refused &= gla_forward(dummy, 0, 0, dummy, 0, 0, dummy, 0, 0, NULL, 0, NULL, 0, 0, 1, 1, 4,
                           16, 0, 16, 0, 1.0f, dummy, dummy, dummy, 0, 0, NULL, 0, NULL, dummy) == -1;
    refused &= gla_forward(dummy, 0, 0, dummy, 0, 0, dummy, 0, 0, NULL, 0, NULL, 0, 0, 1, 1, 4,
                           16, 0, 16, GLA_CMAX + 1, 1.0f, dummy, dummy, dummy, 0, 0, NULL, 0, NULL,
                           dummy) == -1;
    refused &= gla_backward(dummy, 0, 0, dummy, 0, 0, dummy, 0, 0, NULL, 0, NULL, 0, 0, dummy, 0,
                            0, 1, 1, 4, 16, 8, 1.0f, NULL, 0, NULL, dummy, dummy, 0, 0, dummy, 0,
                            0, dummy, 0, 0, NULL, 0, NULL, 0, 0, LA_F32, dummy) == -1;
    refused &= gla_backward(dummy, 0, 0, dummy, 0, 0, dummy, 0, 0, dummy, 0, NULL, 0, 0, dummy, 0,
                            0, 1, 1, 4, 16, 8, 1.0f, dummy, 0, NULL, dummy, dummy, 0, 0, dummy, 0,
                            0, dummy, 0, 0, NULL, 0, NULL, 0, 0, LA_F32, dummy) == -1;
    if (W > 1)
        refused &= gla_forward(dummy, 0, 0, dummy, 0, 0, dummy, 0, 0, NULL, 0, NULL, 0, 0, 1, 1,
                               4, W + 1, 0, W + 1, 8, 1.0f, dummy, dummy, dummy, 0, 0, NULL, 0, NULL,
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
    printf("PASS: %d checks, la_gla_forward/backward/step, W=%d, GLA_NB=%d\n", checks, W, GLA_NB);
    return 0;
}
