/* What the kernel harnesses of tests/c share: a seeded generator (define HARNESS_SEED before
 * including), the check counter, guarded buffers and the per-dtype store and tolerance. Include
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

/* A buffer of n elements of dtype dt plus GUARD, every byte 0x7F (a NaN in every dtype). */
static void *guarded(long n, int dt) {
    size_t bytes = (size_t)(n + GUARD) * ES[dt];
    void *p = malloc(bytes);
    memset(p, 0x7F, bytes);
    return p;
}
static int is_guard(const void *p, long i, int dt) {
    const unsigned char *b = (const unsigned char *)p + (size_t)i * ES[dt];
    for (int k = 0; k < ES[dt]; ++k)
        if (b[k] != 0x7F) return 0;
    return 1;
}
/* p[i] = x rounded to dt; returns the value stored, as read back. */
static double put(void *p, long i, float x, int dt) {
    store_dt(p, i, x, dt);
    return load_dt(p, i, dt);
}
static double tol_of(int dt) { return dt == LA_F32 ? 4e-6 : dt == LA_BF16 ? 8e-3 : 1.5e-3; }
#endif
