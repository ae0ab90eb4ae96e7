/* Stand-alone check of the one-pass kernels of src/linattn/ops/linear/kernels.c against a naive
 * double-precision reference (explicit T x T similarities), without Python or torch: for
 * building the kernels in every vector form (-DLA_W=1/4/8/16, or whatever the -m flags pick)
 * and on other ISAs (an aarch64 build run under qemu), see .ci/cross_isa.sh.
 *
 *   cc -O3 -march=native -o /tmp/native_harness tests/c/native_harness.c -lm && /tmp/native_harness
 *
 * Checked: la_noncausal_forward, la_noncausal_backward (parts = 3, and parts = 1 on two blocks
 * of queries then parts = 2), la_causal_forward and la_causal_backward, for 1 + elu and 1 + relu,
 * the forwards in float32 and in bfloat16 (bf = 1: inputs and output bfloat16, the reference
 * computed from the same bfloat16 inputs; the output is held to TOL_BF16, its rounding), the
 * backwards in bfloat16 against the float32 ones on the same values (rounded once, bit for bit),
 * several (L, Dv) (multiples of 16, L != Dv too, and L = 32, 64 with Dv = 16, 48 for the bfloat16
 * dot-product forms), chunks C = 16, 32, 64, T = 100 (a partial
 * last chunk), 16 and 5; non-zero initial states and state gradients; head strides larger than
 * a head's rows. Work buffers and outputs carry guard values past their ends (and in the gaps
 * between heads), which must come back untouched.
 *
 * Reference, per head, with M the mask (j <= i when causal, all ones otherwise):
 *   w_ij = phi(q_i) . phi(k_j) M_ij,  num_i = phi(q_i) S0 + sum_j w_ij v_j,
 *   den_i = phi(q_i) . z0 + sum_j w_ij,  s_i = den_i + eps (1 where that is 0),  o_i = num_i / s_i,
 *   S1 = S0 + sum_j phi(k_j)^T v_j,  z1 = z0 + sum_j phi(k_j),
 * and the gradients of  loss = sum_i g_i . o_i + <G_in, S1> + Gz_in . z1:
 *   dn_i = g_i / s_i,  ds_i = -(g_i . o_i) / s_i,  dw_ij = (dn_i . v_j + ds_i) M_ij,
 *   dphi(q_i) = sum_j dw_ij phi(k_j) + S0 dn_i + ds_i z0,
 *   dphi(k_j) = sum_i dw_ij phi(q_i) + G_in v_j + Gz_in,  dv_j = sum_i w_ij dn_i + G_in^T phi(k_j),
 *   dS0 = G_in + sum_i phi(q_i)^T dn_i,  dz0 = Gz_in + sum_i ds_i phi(q_i),
 *   dq = dphi(q) phi'(q), dk = dphi(k) phi'(k)  (phi' = 1 for x > 0, else exp(x) / 0).
 * Errors are max |kernel - reference| / max |reference| per array; above TOL the run fails.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/linattn/ops/linear/kernels.c"

/* The kernels are called through volatile pointers: the compiler then cannot inline them into
 * this file or clone them for the constant arguments below, so what runs is the code a shared
 * library built from kernels.c exports (and the build is much faster). */
static __typeof__(la_noncausal_forward) *volatile noncausal_forward = la_noncausal_forward;
static __typeof__(la_noncausal_backward) *volatile noncausal_backward = la_noncausal_backward;
static __typeof__(la_causal_forward) *volatile causal_forward = la_causal_forward;
static __typeof__(la_causal_backward) *volatile causal_backward = la_causal_backward;

#define TOL 1e-4
#define TOL_BF16 8e-3 /* a bfloat16 output: 2^-9 relative rounding, measured against max |o| */
/* bfloat16 gradients: three roundings of u = 2^-8 (of g, of phi(k) in the forward's state, of
 * the gradient itself), measured against the largest entry */
#define TOL_BF16_GRAD (3.0 / 256)
#define GUARD 64 /* guard floats after each buffer */
/* What guards hold: a quiet NaN with a payload, so that a kernel that reads memory it should
 * not (past a buffer, between heads, scratch it never wrote) spreads NaN into its results, and a
 * kernel that writes there is caught by the bits changing. Its bfloat16 form: the high half. */
#define GUARD_BITS 0x7FC0DEADu
#define GUARD_BF16 ((unsigned short)(GUARD_BITS >> 16))

/* ------------------------------------------------------------------------------ utilities */
static unsigned long long rng = 0x9E3779B97F4A7C15ull;
static double urand(void) { /* uniform [0, 1), a 64-bit LCG's high bits */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}
static float uni(double lo, double hi) { return (float)(lo + (hi - lo) * urand()); }

static void fill_guard(float *p, long n) {
    unsigned u = GUARD_BITS;
    for (long i = 0; i < n; ++i) memcpy(p + i, &u, 4);
}
static int is_guard(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u == GUARD_BITS;
}

/* n floats followed by GUARD guard values; all of it guard values first. */
static float *alloc_f(long n) {
    float *p = malloc((size_t)(n + GUARD) * sizeof(float));
    if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
    fill_guard(p, n + GUARD);
    return p;
}
static double *alloc_d(long n) {
    double *p = calloc((size_t)n, sizeof(double));
    if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
    return p;
}
/* (N, T, F) rows with head stride hs (>= T F): random in [lo, hi); the gaps keep guard values. */
static float *rand_rows(long N, long T, long F, long hs, double lo, double hi) {
    float *p = alloc_f(N * hs);
    for (long n = 0; n < N; ++n)
        for (long i = 0; i < T * F; ++i) p[n * hs + i] = uni(lo, hi);
    return p;
}
static float *rand_dense(long n, double lo, double hi) {
    float *p = alloc_f(n);
    for (long i = 0; i < n; ++i) p[i] = uni(lo, hi);
    return p;
}
static float *copy_f(const float *src, long n) {
    float *p = alloc_f(n);
    memcpy(p, src, (size_t)n * sizeof(float));
    return p;
}

/* The guard values of a buffer of N heads (stride hs, T F used each) and past its end. */
static int guards_ok(const float *p, long N, long T, long F, long hs) {
    for (long n = 0; n < N; ++n)
        for (long i = T * F; i < hs; ++i)
            if (!is_guard(p[n * hs + i])) return 0;
    for (long i = N * hs; i < N * hs + GUARD; ++i)
        if (!is_guard(p[i])) return 0;
    return 1;
}

/* max |a - b| / max |b| over (N, T, F): a float with head stride as, b dense double. */
/* max |a - b| / max |b| over n floats (both from kernels). */
static double relerr_ff(const float *a, const float *b, long n) {
    double num = 0.0, den = 0.0;
    for (long i = 0; i < n; ++i) {
        double d = fabs((double)a[i] - (double)b[i]), m = fabs((double)b[i]);
        if (!(d <= num)) num = d;
        if (m > den) den = m;
    }
    return den > 0.0 ? num / den : num;
}

static double relerr(const float *a, long as, const double *b, long N, long T, long F) {
    double num = 0.0, den = 0.0;
    for (long n = 0; n < N; ++n)
        for (long i = 0; i < T * F; ++i) {
            double x = a[n * as + i], y = b[n * T * F + i];
            double d = fabs(x - y);
            if (!(d <= num)) num = d; /* NaN counts as an infinite error */
            if (fabs(y) > den) den = fabs(y);
        }
    if (num != num) return INFINITY;
    return den > 0.0 ? num / den : num;
}

/* ------------------------------------------------------------------------------ reference */
static double rphi(int kind, double x) { return x > 0.0 ? x + 1.0 : (kind == 0 ? exp(x) : 1.0); }
static double rdphi(int kind, double x) { return x > 0.0 ? 1.0 : (kind == 0 ? exp(x) : 0.0); }

/* bfloat16 (the high half of a float32, rounded to nearest even) and back. */
static unsigned short to_bf16(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    if (f != f) return (unsigned short)((u >> 16) | 0x40); /* NaN stays NaN (guards: GUARD_BF16) */
    return (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(unsigned short h) {
    unsigned u = (unsigned)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* Round n floats to bfloat16 in place (the reference then sees what the kernel sees) and return
 * them as bfloat16. */
static unsigned short *as_bf16(float *x, long n) {
    unsigned short *h = malloc((size_t)(n + GUARD) * sizeof *h);
    if (!h) { fprintf(stderr, "out of memory\n"); exit(2); }
    for (long i = 0; i < n + GUARD; ++i) {
        h[i] = to_bf16(x[i]);
        if (i < n) x[i] = from_bf16(h[i]);
    }
    return h;
}

typedef struct {
    double *o, *S1, *z1, *dq, *dk, *dv, *dS0, *dz0; /* dense: (N,Tq,Dv) (N,L,Dv) (N,L) ... */
} Ref;

static void reference(int kind, int causal, long N, long Tq, long Tk, long L, long Dv,
                      double eps, const float *q, long qs, const float *k, long ks,
                      const float *v, long vs, const float *S0, const float *z0, const float *g,
                      long gs, const float *Gin, const float *Gzin, Ref *r) {
    double *fq = alloc_d(Tq * L), *fk = alloc_d(Tk * L), *w = alloc_d(Tq * Tk);
    double *s = alloc_d(Tq), *dn = alloc_d(Tq * Dv), *ds = alloc_d(Tq), *dw = alloc_d(Tq * Tk);
    for (long n = 0; n < N; ++n) {
        const float *qn = q + n * qs, *kn = k + n * ks, *vn = v + n * vs, *gn = g + n * gs;
        const float *S0n = S0 + n * L * Dv, *z0n = z0 + n * L;
        const float *Gn = Gin + n * L * Dv, *Gzn = Gzin + n * L;
        double *o = r->o + n * Tq * Dv;
        for (long i = 0; i < Tq * L; ++i) fq[i] = rphi(kind, qn[i]);
        for (long i = 0; i < Tk * L; ++i) fk[i] = rphi(kind, kn[i]);
        for (long i = 0; i < Tq; ++i)
            for (long j = 0; j < Tk; ++j) {
                double d = 0.0;
                if (!causal || j <= i)
                    for (long l = 0; l < L; ++l) d += fq[i * L + l] * fk[j * L + l];
                w[i * Tk + j] = d;
            }
        for (long i = 0; i < Tq; ++i) {
            double den = 0.0;
            for (long l = 0; l < L; ++l) den += fq[i * L + l] * z0n[l];
            for (long j = 0; j < Tk; ++j) den += w[i * Tk + j];
            double si = den + eps, gd = 0.0;
            int zero = si == 0.0;
            if (zero) si = 1.0;
            s[i] = si;
            for (long d = 0; d < Dv; ++d) {
                double num = 0.0;
                for (long l = 0; l < L; ++l) num += fq[i * L + l] * S0n[l * Dv + d];
                for (long j = 0; j < Tk; ++j) num += w[i * Tk + j] * vn[j * Dv + d];
                o[i * Dv + d] = num / si;
                dn[i * Dv + d] = gn[i * Dv + d] / si;
                gd += gn[i * Dv + d] * o[i * Dv + d];
            }
            ds[i] = zero ? 0.0 : -gd / si;
        }
        /* final state */
        for (long l = 0; l < L; ++l) {
            double zz = z0n[l];
            for (long j = 0; j < Tk; ++j) zz += fk[j * L + l];
            r->z1[n * L + l] = zz;
            for (long d = 0; d < Dv; ++d) {
                double ss = S0n[l * Dv + d];
                for (long j = 0; j < Tk; ++j) ss += fk[j * L + l] * vn[j * Dv + d];
                r->S1[(n * L + l) * Dv + d] = ss;
            }
        }
        /* gradients */
        for (long i = 0; i < Tq; ++i)
            for (long j = 0; j < Tk; ++j) {
                double d = 0.0;
                if (!causal || j <= i) {
                    for (long e = 0; e < Dv; ++e) d += dn[i * Dv + e] * vn[j * Dv + e];
                    d += ds[i];
                }
                dw[i * Tk + j] = d;
            }
        for (long i = 0; i < Tq; ++i)
            for (long l = 0; l < L; ++l) {
                double a = ds[i] * z0n[l];
                for (long j = 0; j < Tk; ++j) a += dw[i * Tk + j] * fk[j * L + l];
                for (long e = 0; e < Dv; ++e) a += S0n[l * Dv + e] * dn[i * Dv + e];
                r->dq[(n * Tq + i) * L + l] = a * rdphi(kind, qn[i * L + l]);
            }
        for (long j = 0; j < Tk; ++j) {
            for (long l = 0; l < L; ++l) {
                double a = Gzn[l];
                for (long i = 0; i < Tq; ++i) a += dw[i * Tk + j] * fq[i * L + l];
                for (long e = 0; e < Dv; ++e) a += Gn[l * Dv + e] * vn[j * Dv + e];
                r->dk[(n * Tk + j) * L + l] = a * rdphi(kind, kn[j * L + l]);
            }
            for (long e = 0; e < Dv; ++e) {
                double a = 0.0;
                for (long i = 0; i < Tq; ++i) a += w[i * Tk + j] * dn[i * Dv + e];
                for (long l = 0; l < L; ++l) a += Gn[l * Dv + e] * fk[j * L + l];
                r->dv[(n * Tk + j) * Dv + e] = a;
            }
        }
        for (long l = 0; l < L; ++l) {
            double a = Gzn[l];
            for (long i = 0; i < Tq; ++i) a += ds[i] * fq[i * L + l];
            r->dz0[n * L + l] = a;
            for (long e = 0; e < Dv; ++e) {
                double b = Gn[l * Dv + e];
                for (long i = 0; i < Tq; ++i) b += fq[i * L + l] * dn[i * Dv + e];
                r->dS0[(n * L + l) * Dv + e] = b;
            }
        }
    }
    free(fq), free(fk), free(w), free(s), free(dn), free(ds), free(dw);
}

/* ------------------------------------------------------------------------------ the checks */
enum { E_O, E_OBF, E_S, E_SBF, E_Z, E_DQ, E_DK, E_DV, E_G, E_GZ, E_DBF, E_N };
static const char *ENAME[E_N] = {"o", "o(bf16)", "S", "S(bf16)", "z", "dq", "dk", "dv", "dS0",
                                 "dz0", "d*(bf16)"};
static double worst[2][E_N]; /* [causal][quantity] */
static char worst_at[2][E_N][128];
static long checks, failures;

static void record_tol(int causal, int e, double err, double tol, const char *cfg) {
    ++checks;
    if (!(err <= worst[causal][e])) {
        worst[causal][e] = err;
        snprintf(worst_at[causal][e], sizeof worst_at[causal][e], "%s", cfg);
    }
    if (!(err <= tol)) {
        ++failures;
        if (failures <= 20)
            printf("  FAIL %s %s: rel err %.3g  [%s]\n", causal ? "causal" : "noncausal",
                   ENAME[e], err, cfg);
    }
}

static void record(int causal, int e, double err, const char *cfg) {
    record_tol(causal, e, err, TOL, cfg);
}

static void guard_check(int ok, const char *what, const char *cfg) {
    ++checks;
    if (!ok) {
        ++failures;
        if (failures <= 20) printf("  FAIL guard values overwritten: %s  [%s]\n", what, cfg);
    }
}

static void rc_check(int rc, const char *what, const char *cfg) {
    ++checks;
    if (rc != 0) {
        ++failures;
        if (failures <= 20) printf("  FAIL %s returned %d  [%s]\n", what, rc, cfg);
    }
}

static void run_case(int kind, int causal, int bf, long N, long Tq, long Tk, long L, long Dv,
                     long C) {
    const float eps = 1e-6f;
    char cfg[112];
    snprintf(cfg, sizeof cfg, "%s%s N=%ld Tq=%ld Tk=%ld L=%ld Dv=%ld C=%ld",
             kind == 0 ? "elu" : "relu", bf ? " bf16" : "", N, Tq, Tk, L, Dv, C);
    /* head strides a few rows larger than a head */
    long qs = (Tq + 3) * L, ks = (Tk + 2) * L, vs = (Tk + 1) * Dv, os = (Tq + 2) * Dv;
    long gs = (Tq + 1) * Dv, dqs = (Tq + 1) * L, dks = (Tk + 3) * L, dvs = (Tk + 2) * Dv;
    float *q = rand_rows(N, Tq, L, qs, -1.5, 1.5), *k = rand_rows(N, Tk, L, ks, -1.5, 1.5);
    float *v = rand_rows(N, Tk, Dv, vs, -1.0, 1.0), *g = rand_rows(N, Tq, Dv, gs, -1.0, 1.0);
    float *S0 = rand_dense(N * L * Dv, -1.0, 1.0), *z0 = rand_dense(N * L, 0.0, 2.0);
    float *Gin = rand_dense(N * L * Dv, -0.5, 0.5), *Gzin = rand_dense(N * L, -0.5, 0.5);
    unsigned short *qh = NULL, *kh = NULL, *vh = NULL, *oh = NULL;
    if (bf) { /* rounds q, k, v to bfloat16 values, so the reference sees the kernel's inputs */
        qh = as_bf16(q, N * qs), kh = as_bf16(k, N * ks), vh = as_bf16(v, N * vs);
        float *tmp = alloc_f(N * os);
        oh = as_bf16(tmp, N * os); /* all GUARD_BF16 */
        free(tmp);
    }
    Ref r = {alloc_d(N * Tq * Dv), alloc_d(N * L * Dv), alloc_d(N * L), alloc_d(N * Tq * L),
             alloc_d(N * Tk * L), alloc_d(N * Tk * Dv), alloc_d(N * L * Dv), alloc_d(N * L)};
    reference(kind, causal, N, Tq, Tk, L, Dv, eps, q, qs, k, ks, v, vs, S0, z0, g, gs, Gin, Gzin,
              &r);

    float *S = copy_f(S0, N * L * Dv), *z = copy_f(z0, N * L), *o = alloc_f(N * os);
    float *G = copy_f(Gin, N * L * Dv), *Gz = copy_f(Gzin, N * L);
    float *dq = alloc_f(N * dqs), *dk = alloc_f(N * dks), *dv = alloc_f(N * dvs);
    long nc = (Tq + C - 1) / C;
    /* the work sizes the kernels state (la_linear_work, what the Python side allocates) */
    long wf = la_linear_work(causal, C, L, Dv, 0), wb = la_linear_work(2 + causal, C, L, Dv, nc);
    float *work = alloc_f(wf > wb ? wf : wb);

    const void *qa = bf ? (const void *)qh : q, *ka = bf ? (const void *)kh : k;
    const void *va = bf ? (const void *)vh : v;
    void *oa = bf ? (void *)oh : o;
    /* the causal forward keeps the state before every block of 2 C tokens */
    long block = 2 * C, nb = (Tq + block - 1) / block;
    float *Ss = causal ? alloc_f(nb * N * L * Dv) : NULL, *zss = causal ? alloc_f(nb * N * L) : NULL;
    if (causal)
        rc_check(causal_forward(kind, bf, qa, qs, ka, ks, va, vs, N, Tq, L, Dv, C, eps, S, z,
                                   oa, os, Ss, N * L * Dv, zss, N * L, block, work),
                 "la_causal_forward", cfg);
    else
        rc_check(noncausal_forward(kind, bf, qa, qs, ka, ks, va, vs, N, Tq, Tk, L, Dv, C, eps,
                                      S, z, oa, os, work), "la_noncausal_forward", cfg);
    if (bf) {
        int ok = 1;
        for (long n = 0; n < N; ++n)
            for (long i = 0; i < os; ++i) {
                if (i < Tq * Dv) o[n * os + i] = from_bf16(oh[n * os + i]);
                else ok &= oh[n * os + i] == GUARD_BF16;
            }
        for (long i = N * os; i < N * os + GUARD; ++i) ok &= oh[i] == GUARD_BF16;
        guard_check(ok, "out (bfloat16)", cfg);
    }
    guard_check(guards_ok(work, 1, wf, 1, wf), "forward work", cfg);
    guard_check(guards_ok(o, N, Tq, Dv, os), "out", cfg);
    guard_check(guards_ok(S, 1, N * L * Dv, 1, N * L * Dv) && guards_ok(z, 1, N * L, 1, N * L),
                "S, z", cfg);
    record_tol(causal, bf ? E_OBF : E_O, relerr(o, os, r.o, N, Tq, Dv), bf ? TOL_BF16 : TOL, cfg);
    /* bfloat16 inputs may be multiplied on bfloat16 dot products (phi(k) rounded: the state's
     * sums within 2^-8 relative of each term), a bfloat16 output's tolerance */
    record_tol(causal, bf ? E_SBF : E_S, relerr(S, L * Dv, r.S1, N, L, Dv), bf ? TOL_BF16 : TOL,
               cfg);
    record(causal, E_Z, relerr(z, L, r.z1, N, L, 1), cfg);
    if (causal) { /* kept state i: the state a run over the first i blocks ends with */
        float *Si = alloc_f(N * L * Dv), *zi = alloc_f(N * L), *oi = alloc_f(N * os);
        for (long i = 0; i < nb; ++i) {
            memcpy(Si, S0, (size_t)(N * L * Dv) * sizeof(float));
            memcpy(zi, z0, (size_t)(N * L) * sizeof(float));
            if (i && causal_forward(kind, 0, q, qs, k, ks, v, vs, N, i * block, L, Dv, C, eps, Si,
                                    zi, oi, os, NULL, 0, NULL, 0, 0, work))
                rc_check(1, "la_causal_forward (kept states)", cfg);
            /* bfloat16 inputs: the kept states come from the bfloat16 form's sums */
            record_tol(causal, bf ? E_SBF : E_S, relerr_ff(Ss + i * N * L * Dv, Si, N * L * Dv),
                       bf ? TOL_BF16 : TOL, cfg);
            record(causal, E_Z, relerr_ff(zss + i * N * L, zi, N * L), cfg);
        }
        guard_check(guards_ok(Ss, 1, nb * N * L * Dv, 1, nb * N * L * Dv)
                        && guards_ok(zss, 1, nb * N * L, 1, nb * N * L), "kept states", cfg);
        free(Si), free(zi), free(oi), free(Ss), free(zss);
    }

    /* The backward (float32 only) gets the forward's own output, as the Python side passes it. */
    for (int split = 0; !bf && split < 1 + !causal; ++split) {
        char cfg2[128];
        snprintf(cfg2, sizeof cfg2, "%s%s", cfg, split ? " parts=1+1+2" : "");
        memcpy(G, Gin, (size_t)(N * L * Dv) * sizeof(float));
        memcpy(Gz, Gzin, (size_t)(N * L) * sizeof(float));
        fill_guard(work, wb + GUARD);
        if (causal) {
            rc_check(causal_backward(kind, 0, q, qs, k, ks, v, vs, o, os, g, gs, N, Tq, L, Dv, C,
                                        eps, S0, z0, G, Gz, dq, dqs, dk, dks, dv, dvs, work),
                     "la_causal_backward", cfg2);
        } else if (!split) {
            rc_check(noncausal_backward(kind, 3, 0, q, qs, k, ks, v, vs, g, gs, N, Tq, Tk,
                                           L, Dv, C, eps, S, z, G, Gz, dq, dqs, dk, dks, dv, dvs,
                                           work), "la_noncausal_backward", cfg2);
        } else { /* the query pass in two blocks of queries, then the key pass */
            long h = Tq / 2;
            rc_check(noncausal_backward(kind, 1, 0, q, qs, k, ks, v, vs, g, gs, N, h, Tk,
                                           L, Dv, C, eps, S, z, G, Gz, dq, dqs, dk, dks, dv, dvs,
                                           work), "la_noncausal_backward parts=1", cfg2);
            rc_check(noncausal_backward(kind, 1, 0, q + h * L, qs, k, ks, v, vs, g + h * Dv, gs,
                                        N, Tq - h, Tk, L, Dv, C, eps, S, z, G, Gz, dq + h * L,
                                        dqs, dk, dks, dv, dvs, work),
                     "la_noncausal_backward parts=1", cfg2);
            rc_check(noncausal_backward(kind, 2, 0, q, qs, k, ks, v, vs, g, gs, N, Tq, Tk,
                                           L, Dv, C, eps, S, z, G, Gz, dq, dqs, dk, dks, dv, dvs,
                                           work), "la_noncausal_backward parts=2", cfg2);
        }
        guard_check(guards_ok(work, 1, wb, 1, wb), "backward work", cfg2);
        guard_check(guards_ok(dq, N, Tq, L, dqs) && guards_ok(dk, N, Tk, L, dks)
                        && guards_ok(dv, N, Tk, Dv, dvs), "dq, dk, dv", cfg2);
        guard_check(guards_ok(G, 1, N * L * Dv, 1, N * L * Dv) && guards_ok(Gz, 1, N * L, 1, N * L),
                    "G, Gz", cfg2);
        record(causal, E_DQ, relerr(dq, dqs, r.dq, N, Tq, L), cfg2);
        record(causal, E_DK, relerr(dk, dks, r.dk, N, Tk, L), cfg2);
        record(causal, E_DV, relerr(dv, dvs, r.dv, N, Tk, Dv), cfg2);
        record(causal, E_G, relerr(G, L * Dv, r.dS0, N, L, Dv), cfg2);
        record(causal, E_GZ, relerr(Gz, L, r.dz0, N, L, 1), cfg2);
    }

    /* bfloat16 rows (bf = 1): the backward reads q, k, v, o and g as the float32 values they
     * hold and rounds dq, dk, dv once: the float32 backward on those values (o the bfloat16
     * output widened, g rounded), its gradients rounded, G and Gz equal, bit for bit; outputs'
     * gaps and ends untouched. The causal chunked form (a state above REC_MAX_STATE) takes no
     * bfloat16 rows: -1, what la_linear_backward_bf16 tells Python. */
    if (bf) {
        int takes = la_linear_backward_bf16(causal, L, Dv);
        unsigned short *gh = as_bf16(g, N * gs); /* g rounded in place too */
        unsigned short *dqh = malloc((size_t)(N * dqs + GUARD) * 2);
        unsigned short *dkh = malloc((size_t)(N * dks + GUARD) * 2);
        unsigned short *dvh = malloc((size_t)(N * dvs + GUARD) * 2);
        float *G2 = copy_f(Gin, N * L * Dv), *Gz2 = copy_f(Gzin, N * L);
        for (long i = 0; i < N * dqs + GUARD; ++i) dqh[i] = GUARD_BF16;
        for (long i = 0; i < N * dks + GUARD; ++i) dkh[i] = GUARD_BF16;
        for (long i = 0; i < N * dvs + GUARD; ++i) dvh[i] = GUARD_BF16;
        memcpy(G, Gin, (size_t)(N * L * Dv) * sizeof(float));
        memcpy(Gz, Gzin, (size_t)(N * L) * sizeof(float));
        fill_guard(work, wb + GUARD); /* (the forward's scratch may be the larger) */
        int rc32, rc16;
        if (causal) {
            rc32 = causal_backward(kind, 0, q, qs, k, ks, v, vs, o, os, g, gs, N, Tq, L, Dv, C, eps,
                                   S0, z0, G, Gz, dq, dqs, dk, dks, dv, dvs, work);
            rc16 = causal_backward(kind, 1, qh, qs, kh, ks, vh, vs, oh, os, gh, gs, N, Tq, L, Dv,
                                   C, eps, S0, z0, G2, Gz2, dqh, dqs, dkh, dks, dvh, dvs, work);
        } else {
            rc32 = noncausal_backward(kind, 3, 0, q, qs, k, ks, v, vs, g, gs, N, Tq, Tk, L,
                                      Dv, C, eps, S, z, G, Gz, dq, dqs, dk, dks, dv, dvs, work);
            rc16 = noncausal_backward(kind, 3, 1, qh, qs, kh, ks, vh, vs, gh, gs, N, Tq,
                                      Tk, L, Dv, C, eps, S, z, G2, Gz2, dqh, dqs, dkh, dks, dvh,
                                      dvs, work);
        }
        rc_check(rc32, "backward (bfloat16 values)", cfg);
        int same = 1;
        if (!takes) {
            same = rc16 == -1;
        } else {
            same = rc16 == 0 && !memcmp(G, G2, (size_t)(N * L * Dv) * sizeof(float))
                   && !memcmp(Gz, Gz2, (size_t)(N * L) * sizeof(float));
            const float *f32[3] = {dq, dk, dv};
            const unsigned short *h16[3] = {dqh, dkh, dvh};
            const long rows[3] = {Tq, Tk, Tk}, F[3] = {L, L, Dv}, hs[3] = {dqs, dks, dvs};
            for (int a = 0; a < 3; ++a)
                for (long n = 0; n < N; ++n)
                    for (long i = 0; i < hs[a]; ++i) {
                        unsigned short want = i < rows[a] * F[a] ? to_bf16(f32[a][n * hs[a] + i])
                                                                 : GUARD_BF16;
                        same &= h16[a][n * hs[a] + i] == want;
                    }
            for (int a = 0; a < 3; ++a)
                for (long i = N * hs[a]; i < N * hs[a] + GUARD; ++i)
                    same &= h16[a][i] == GUARD_BF16;
        }
        if (takes) { /* and against the exact gradients: within the bfloat16 roundings (of
                      * the inputs, g's included here, of the forward's products, of dq, dk, dv) */
            float *wide = alloc_f(N * (dqs > dks ? (dqs > dvs ? dqs : dvs) : (dks > dvs ? dks : dvs)));
            const unsigned short *h16[3] = {dqh, dkh, dvh};
            const double *ref[3] = {r.dq, r.dk, r.dv};
            const long rows[3] = {Tq, Tk, Tk}, F[3] = {L, L, Dv}, hs[3] = {dqs, dks, dvs};
            for (int a = 0; a < 3; ++a) {
                for (long i = 0; i < N * hs[a]; ++i) wide[i] = from_bf16(h16[a][i]);
                record_tol(causal, E_DBF, relerr(wide, hs[a], ref[a], N, rows[a], F[a]),
                           TOL_BF16_GRAD, cfg);
            }
            free(wide);
        }
        ++checks;
        if (!same) {
            ++failures;
            if (failures <= 20)
                printf("  FAIL %s backward in bfloat16 is not the float32 one rounded (rc %d, "
                       "takes %d)  [%s]\n", causal ? "causal" : "noncausal", rc16, takes, cfg);
        }
        guard_check(guards_ok(work, 1, wb, 1, wb), "backward work (bfloat16)", cfg);
        free(gh), free(dqh), free(dkh), free(dvh), free(G2), free(Gz2);
    }

    free(q), free(k), free(v), free(g), free(S0), free(z0), free(Gin), free(Gzin);
    free(S), free(z), free(o), free(G), free(Gz), free(dq), free(dk), free(dv), free(work);
    free(qh), free(kh), free(vh), free(oh);
    free(r.o), free(r.S1), free(r.z1), free(r.dq), free(r.dk), free(r.dv), free(r.dS0),
        free(r.dz0);
}

/* exp's special values in this vector form (GLA's and the delta rule's decays take it too): NaN
 * stays NaN, -inf and anything below -87 give 0, the rest exp(x) to ~1 ulp. */
static void exp_check(void) {
    const float xs[] = {NAN, -INFINITY, -100.0f, -87.0f, -20.0f, -1.0f, -1e-3f, 0.0f};
    float in[W], out[W];
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; ++i) {
        for (int j = 0; j < (int)W; ++j) in[j] = xs[i];
        vstore(out, vexp_nonpos(vload(in)));
        float want = xs[i] < -87.0f ? 0.0f : expf(xs[i]);
        for (int j = 0; j < (int)W; ++j) {
            int ok = xs[i] != xs[i] ? out[j] != out[j] : fabsf(out[j] - want) <= 3e-7f * want;
            ++checks;
            if (!ok) {
                ++failures;
                printf("FAIL: vexp_nonpos(%g) = %g, want %g\n", xs[i], out[j], want);
                break;
            }
        }
    }
}

int main(void) {
    /* the last: a state beyond REC_MAX_STATE, so the causal forward takes its chunked form */
    static const long LD[][2] = {{32, 32}, {16, 16}, {48, 48}, {16, 48}, {48, 32}, {32, 48},
                                 {64, 16}, {144, 128}};
    static const long CS[] = {16, 32, 64};
    static const long TS[] = {100, 16, 5};
    const long N = 2;
#if defined(__aarch64__)
    const char *isa = "aarch64";
#elif defined(__x86_64__)
    const char *isa = "x86_64";
#else
    const char *isa = "other";
#endif
    printf("native_harness: %s, vector width W=%d floats, register tile MR=%d x NV=%d\n", isa,
           (int)W, (int)MR, (int)NV);
    exp_check();
    for (int kind = 0; kind < 2; ++kind)
        for (size_t a = 0; a < sizeof LD / sizeof LD[0]; ++a)
            for (size_t c = 0; c < sizeof CS / sizeof CS[0]; ++c)
                for (size_t t = 0; t < sizeof TS / sizeof TS[0]; ++t) {
                    long L = LD[a][0], Dv = LD[a][1], C = CS[c], T = TS[t];
                    for (int bf = 0; bf < 2; ++bf) {
                        run_case(kind, 1, bf, N, T, T, L, Dv, C);
                        run_case(kind, 0, bf, N, T, T * 7 / 10 + 3, L, Dv, C); /* Tk != Tq */
                    }
                }
    printf("  max rel err per array (the worst case's configuration after it):\n");
    double all = 0.0;
    for (int causal = 1; causal >= 0; --causal)
        for (int e = 0; e < E_N; ++e) {
            printf("    %-9s %-7s %.2e  [%s]\n", causal ? "causal" : "noncausal", ENAME[e],
                   worst[causal][e], worst_at[causal][e]);
            int bf16 = e == E_OBF || e == E_SBF || e == E_DBF;
            if (!bf16 && !(worst[causal][e] <= all)) all = worst[causal][e];
        }
    double abf = 0.0, gbf = 0.0;
    for (int causal = 0; causal < 2; ++causal) {
        for (int e = E_OBF; e <= E_SBF; e += E_SBF - E_OBF)
            if (worst[causal][e] > abf) abf = worst[causal][e];
        if (worst[causal][E_DBF] > gbf) gbf = worst[causal][E_DBF];
    }
    printf("%s: native_harness %s W=%d tile %dx%d: %ld checks, %ld failed; max rel err %.2e "
           "(tol %.0e), bfloat16 outputs and states %.2e (tol %.0e), bfloat16 gradients %.2e "
           "(tol %.1e)\n",
           failures ? "FAIL" : "PASS", isa, (int)W, (int)MR, (int)NV, checks, failures, all, TOL,
           abf, TOL_BF16, gbf, TOL_BF16_GRAD);
    return failures ? 1 : 0;
}
