/* Where the compiled kernels' time goes, without Python: the register-blocked products on
 * operands in L1, and the one-pass forwards at B = 1, H = 8, T = 65536, d = Dv = 64 split into
 * their key and query passes, beside a plain stream over the same 512 MiB.
 *
 *   cc -O3 -march=native -fno-math-errno -o /tmp/nk benchmarks/native_kernels.c -lm && /tmp/nk
 *   cc -O3 -mavx2 -mfma -fno-math-errno -o /tmp/nk2 benchmarks/native_kernels.c -lm && /tmp/nk2
 *
 * Best of 5 (products) or of 3 (full size) runs. docs/bench-ops.md quotes it. */
#include "../src/linattn/ops/linear/kernels.c"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static float *filled(long n, float scale) {
    float *x = aligned_alloc(64, (size_t)n * sizeof(float));
    for (long i = 0; i < n; ++i) x[i] = scale * ((float)rand() / (float)RAND_MAX - 0.5f);
    return x;
}

/* GFLOP/s of the two product shapes of a 64-token chunk (L = Dv = 64), operands in L1:
 * S += phi(k)^T v (A read transposed) and num = phi(q) S. */
static void products(void) {
    const long C = 64, L = 64, Dv = 64, reps = 20000;
    float *f = filled(C * L, 1.0f), *v = filled(C * Dv, 1.0f), *S = filled(L * Dv, 1e-3f);
    float *num = filled(C * Dv, 0.0f);
    double best_t = 0.0, best_q = 0.0;
    for (int r = 0; r < 5; ++r) {
        double t0 = now();
        for (long i = 0; i < reps; ++i) gemm(L, Dv, C, f, 1, L, v, Dv, S, Dv, 1, FULL);
        double a = now() - t0;
        t0 = now();
        for (long i = 0; i < reps; ++i) gemm(C, Dv, L, f, L, 1, S, Dv, num, Dv, 0, FULL);
        double b = now() - t0;
        double flops = 2.0 * C * L * Dv * reps;
        if (flops / a > best_t) best_t = flops / a;
        if (flops / b > best_q) best_q = flops / b;
    }
    printf("W=%d tile %dx%d, products in L1: phi(k)^T v %.1f GFLOP/s, phi(q) S %.1f GFLOP/s "
           "(checksum %g)\n", W, MR, NV, best_t / 1e9, best_q / 1e9, S[5] + num[3]);
}

/* The one-pass forwards at full size: whole, key pass only, query pass only, causal; and a
 * read of q, k, v plus a write of o (one float per cache line), the streaming floor. */
static void full_size(void) {
    const long N = 8, T = 65536, L = 64, Dv = 64, C = 64;
    float *q = filled(N * T * L, 1.0f), *k = filled(N * T * L, 1.0f);
    float *v = filled(N * T * Dv, 1.0f), *o = filled(N * T * Dv, 0.0f);
    float *S = calloc(N * L * Dv, sizeof(float)), *z = calloc(N * L, sizeof(float));
    long wn = la_linear_work(0, C, L, Dv, 0), wc = la_linear_work(1, C, L, Dv, 0);
    float *work = aligned_alloc(64, (size_t)(wn > wc ? wn : wc) * sizeof(float));
    double best[5] = {1e9, 1e9, 1e9, 1e9, 1e9};
    for (int r = 0; r < 3; ++r) {
        double t[5], t0 = now();
        la_noncausal_forward(0, 0, q, T * L, k, T * L, v, T * Dv, N, T, T, L, Dv, C, 1e-6f, S, z,
                             o, T * Dv, work);
        t[0] = now() - t0;
        t0 = now();
        la_noncausal_forward(0, 0, q, T * L, k, T * L, v, T * Dv, N, 0, T, L, Dv, C, 1e-6f, S, z,
                             o, T * Dv, work);
        t[1] = now() - t0;
        t0 = now();
        la_noncausal_forward(0, 0, q, T * L, k, T * L, v, T * Dv, N, T, 0, L, Dv, C, 1e-6f, S, z,
                             o, T * Dv, work);
        t[2] = now() - t0;
        t0 = now();
        float acc = 0.0f;
        for (long i = 0; i < N * T * L; i += 16) acc += q[i] + k[i] + v[i];
        for (long i = 0; i < N * T * Dv; i += 16) o[i] = acc;
        t[3] = now() - t0;
        t0 = now();
        la_causal_forward(0, 0, q, T * L, k, T * L, v, T * Dv, N, T, L, Dv, C, 1e-6f, S, z, o,
                          T * Dv, NULL, 0, NULL, 0, 0, work);
        t[4] = now() - t0;
        for (int i = 0; i < 5; ++i)
            if (t[i] < best[i]) best[i] = t[i];
    }
    printf("W=%d, H=8 T=65536 d=64: non-causal forward %.0f ms (keys %.0f, queries %.0f), "
           "stream of q, k, v, o %.0f ms, causal forward %.0f ms\n", W, best[0] * 1e3,
           best[1] * 1e3, best[2] * 1e3, best[3] * 1e3, best[4] * 1e3);
}

int main(void) {
    products();
    full_size();
    return 0;
}
