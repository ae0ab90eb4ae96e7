/* The core's float32 FMA peak: 12 independent accumulator chains of 16-float vectors (enough
 * to cover the FMA latency), so the loop is bound by FMA throughput alone.
 *   cc -O3 -march=native -o /tmp/fma_peak benchmarks/fma_peak.c && /tmp/fma_peak
 * docs/benchmarks.md quotes it beside the matmul "roofline" of `linattn bench`. */
#include <stdio.h>
#include <time.h>

typedef float vf __attribute__((vector_size(64)));
#define CHAINS 12

int main(void) {
    vf acc[CHAINS], a = {0}, b = {0};
    for (int i = 0; i < 16; ++i) { a[i] = 0.999999f; b[i] = 1e-7f; }
    for (int c = 0; c < CHAINS; ++c) acc[c] = b * (float)c;
    long iters = 200000000;
    struct timespec t0, t1;
    double best = 0.0;
    for (int rep = 0; rep < 5; ++rep) {
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (long i = 0; i < iters / CHAINS; ++i) {
#pragma GCC unroll 12
            for (int c = 0; c < CHAINS; ++c) acc[c] = acc[c] * a + b;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
        double gflops = 2.0 * 16 * (double)(iters / CHAINS * CHAINS) / s / 1e9;
        if (gflops > best) best = gflops;
    }
    float sink = 0.0f;
    for (int c = 0; c < CHAINS; ++c) sink += acc[c][0];
    printf("float32 FMA peak, one core: %.1f GFLOP/s (best of 5; checksum %g)\n", best, sink);
    return 0;
}
