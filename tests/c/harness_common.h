/* What the kernel harnesses of tests/c share: a seeded generator (define HARNESS_SEED before
 * including), the checks and their counter, guarded buffers and the per-dtype store and
 * tolerance. Include
 * it after the kernels' source (it uses their store_dt / load_dt and dtype codes). */
#ifndef HARNESS_COMMON_H
#define HARNESS_COMMON_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GUARD 64
static const int ES[3] = {4, 2, 2};

static unsigned long long rng = HARNESS_SEED;
static double urand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}
static float uni(double lo, double hi) { return (float)(lo + (hi - lo) * urand()); }

static int failures = 0, checks = 0;
static void expect(int ok, const char *what, const char *cfg) {
    ++checks;
    if (!ok) {
        ++failures;
        printf("FAIL %s: %s\n", cfg, what);
    }
}

/* The calling thread's floating-point control register (x86 MXCSR, AArch64 FPCR; 0
 * elsewhere): the recurrences flush subnormals for their own passes only (la_subnormals_off in
 * ops/native/common.h) and must hand it back as they found it. */
static unsigned long fp_control(void) {
#if defined(__SSE__) && (defined(__GNUC__) || defined(__clang__))
    return __builtin_ia32_stmxcsr() & ~0x3Fu; /* less the flags, which any float op sets */
#elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
    unsigned long fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    return fpcr;
#else
    return 0;
#endif
}

/* Whether the n 16-bit elements h (dtype dt) are the float32 x, each rounded once: what a
 * 16-bit path computing in float32 must write. */
static int rounded_once(const unsigned short *h, const float *x, long n, int dt) {
    for (long i = 0; i < n; ++i) {
        unsigned short want;
        store_dt(&want, 0, x[i], dt);
        if (want != h[i]) return 0;
    }
    return 1;
}

/* The guard element of each dtype: a NaN in it (float32 0x7FC0DEAD, bfloat16 0x7FC1, float16
 * 0x7E01), which a kernel that reads it spreads into its results. */
static const unsigned GUARD_BITS[3] = {0x7FC0DEADu, 0x7FC1u, 0x7E01u};
static void fill_guards(void *p, long n, int dt) {
    for (long i = 0; i < n; ++i) {
        if (dt == LA_F32) ((unsigned *)p)[i] = GUARD_BITS[dt];
        else ((unsigned short *)p)[i] = (unsigned short)GUARD_BITS[dt];
    }
}
/* A buffer of n elements of dtype dt plus GUARD, every element a guard. */
static void *guarded(long n, int dt) {
    void *p = malloc((size_t)(n + GUARD) * ES[dt]);
    fill_guards(p, n + GUARD, dt);
    return p;
}
static inline float *guarded_f32(long n) { return guarded(n, LA_F32); }
static int is_guard(const void *p, long i, int dt) {
    if (dt == LA_F32) return ((const unsigned *)p)[i] == GUARD_BITS[dt];
    return ((const unsigned short *)p)[i] == GUARD_BITS[dt];
}
/* Everything of the total + GUARD float32 elements of p outside H blocks (stride hs) of R rows
 * (stride rs) of F elements still a guard. */
static inline void expect_guards(const char *what, const float *p, long H, long hs, long R,
                                 long rs, long F, long total, const char *cfg) {
    long bad = 0;
    for (long i = 0; i < total + GUARD; ++i) {
        int inside = 0;
        if (hs > 0 && rs > 0) { /* (zero strides: nothing is inside) */
            long n = i / hs, r = (i % hs) / rs, c = (i % hs) % rs;
            inside = n < H && r < R && c < F;
        }
        if (!inside && !is_guard(p, i, LA_F32)) ++bad;
    }
    ++checks;
    if (bad) {
        ++failures;
        printf("FAIL %s: %s: %ld guard values overwritten\n", cfg, what, bad);
    }
}
/* An error within its tolerance (NaN fails); the error is printed with a failure. */
static inline void expect_within(const char *what, double err, double tol, const char *cfg) {
    ++checks;
    if (!(err <= tol)) {
        ++failures;
        printf("FAIL %s: %s error %.3g\n", cfg, what, err);
    }
}
/* p[i] = x rounded to dt; returns the value stored, as read back. */
static inline double put(void *p, long i, float x, int dt) {
    store_dt(p, i, x, dt);
    return load_dt(p, i, dt);
}
static inline double tol_of(int dt) { return dt == LA_F32 ? 4e-6 : dt == LA_BF16 ? 8e-3 : 1.5e-3; }
#endif
