/* The core's float32 FMA peak at the vector width the compiler targets: CHAINS independent
 * accumulator chains (acc = acc * a + b), enough to cover FMA latency x FMA ports (4 cycles x 2
 * ports = 8 in flight on recent x86 cores; 12 here), so the loop is bound by FMA throughput alone.
 * 12 accumulators + a + b = 14 registers fit the 16 vector registers of AVX2/SSE2 with no spills
 * (AVX-512 and NEON have 32).
 *
 * Width, from the target (override with -DFMA_BYTES=16/32/64; -DCHAINS=n changes the chains):
 *   __AVX512F__ -> 64 bytes (16 floats), __AVX__ -> 32 (8), __SSE2__ / __ARM_NEON -> 16 (4).
 *
 *   cc -O3 -march=native -o /tmp/fma_peak benchmarks/fma_peak.c && /tmp/fma_peak
 *   cc -O3 -mavx2 -mfma  -o /tmp/fma_peak benchmarks/fma_peak.c && /tmp/fma_peak
 *
 * Without FMA in the target (plain -O3 on x86-64: SSE2 only) the loop is a multiply and an add
 * per step, and the figure is that pair's rate, not an FMA peak: the program says so.
 * docs/bench-ops.md quotes it beside the matmul "roofline" of `linattn bench`. */
#include <stdio.h>
#include <time.h>

#ifndef FMA_BYTES
#if defined(__AVX512F__)
#define FMA_BYTES 64
#elif defined(__AVX__)
#define FMA_BYTES 32
#elif defined(__SSE2__) || defined(__ARM_NEON) || defined(__ARM_NEON__)
#define FMA_BYTES 16
#else
#define FMA_BYTES 4 /* plain scalars */
#endif
#endif
#ifndef CHAINS
#define CHAINS 12
#endif
#define LANES (FMA_BYTES / 4)

#if defined(__FMA__) || defined(__ARM_FEATURE_FMA) || defined(__aarch64__)
#define HAVE_FMA 1
#else
#define HAVE_FMA 0
#endif

#if LANES > 1
typedef float vf __attribute__((vector_size(FMA_BYTES)));
#else
typedef float vf;
#endif

static const char *isa(void) {
#if defined(__AVX512F__)
    return "AVX-512";
#elif defined(__AVX2__)
    return "AVX2";
#elif defined(__AVX__)
    return "AVX";
#elif defined(__SSE2__)
    return "SSE2";
#elif defined(__ARM_NEON) || defined(__ARM_NEON__)
    return "NEON";
#else
    return "scalar";
#endif
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(void) {
    vf acc[CHAINS], a, b;
    for (int i = 0; i < LANES; ++i) {
#if LANES > 1
        a[i] = 0.999999f, b[i] = 1e-7f;
#else
        a = 0.999999f, b = 1e-7f;
#endif
    }
    for (int c = 0; c < CHAINS; ++c) acc[c] = b * (float)c;
    const long steps = 400000000 / CHAINS; /* each step: one vector FMA per chain */
    double best = 0.0;
    for (int rep = 0; rep < 5; ++rep) {
        double t0 = now();
        for (long i = 0; i < steps; ++i) {
#pragma GCC unroll 32
            for (int c = 0; c < CHAINS; ++c) acc[c] = acc[c] * a + b;
        }
        double s = now() - t0;
        double gflops = 2.0 * LANES * (double)steps * CHAINS / s / 1e9;
        if (gflops > best) best = gflops;
    }
    float sink = 0.0f;
    for (int c = 0; c < CHAINS; ++c) {
#if LANES > 1
        sink += acc[c][0];
#else
        sink += acc[c];
#endif
    }
    printf("float32 %s peak, one core: %.1f GFLOP/s = %.2f %s %s/ns "
           "(target %s, %d-byte operands = %d float%s, %d chains; best of 5; checksum %g)\n",
           HAVE_FMA ? "FMA" : "mul+add", best, best / (2.0 * LANES), LANES > 1 ? "vector" : "scalar",
           HAVE_FMA ? "FMAs" : "mul+adds", isa(), FMA_BYTES, LANES, LANES > 1 ? "s" : "", CHAINS,
           sink);
    return 0;
}
