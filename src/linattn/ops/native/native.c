/* The library-wide entry points of linattn's compiled kernels (the op kernels live beside their
 * ops: ops/<op>/kernels.c). */
#ifndef LA_COMMON_H
#include "common.h"
#endif

/* What this build is, for the Python side: the vector width in floats and the register tile. */
int la_width(void) { return W; }
int la_tile(void) { return MR * 100 + NV; }

/* The core's multiply-add peak at this build's width: what `linattn bench` and
 * benchmarks/roofline.py divide a kernel's useful work by (linattn.profiling.core_peak).
 * PEAK_CHAINS independent accumulator chains cover FMA latency x ports (4 cycles x 2 ports on
 * recent x86 cores: 8 in flight; 12 leaves slack), so the loop is bound by throughput alone;
 * 12 accumulators + 2 operands fit the 16 vector registers of AVX2. io[0..2] seed the operands
 * (read at run time, so nothing folds) and io[3] receives a sum of the results (so nothing is
 * dropped). Returns the floating-point operations done: 2 per lane per multiply-add. Where the
 * build has no FMA (generic, scalar) the compiler emits a multiply and an add: that pair's rate,
 * which is what such a build's kernels can reach. */
#define PEAK_CHAINS 12
#define PEAK_STEP(op) op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7) op(8) op(9) op(10) op(11)

double la_peak_f32(long iters, float *io) {
    vf a = (vf){LA_LANES(io[0])}, b = (vf){LA_LANES(io[1])};
    vf acc[PEAK_CHAINS];
    for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = (vf){LA_LANES(io[2] + (float)c)};
#define PEAK_FMA(c) acc[c] = acc[c] * a + b;
    for (long i = 0; i < iters; i++) { PEAK_STEP(PEAK_FMA) }
#undef PEAK_FMA
    float s = 0.0f;
    for (int c = 0; c < PEAK_CHAINS; c++)
        for (int l = 0; l < W; l++) s += acc[c][l];
    io[3] = s;
    return 2.0 * W * PEAK_CHAINS * (double)iters;
}

/* The bfloat16 dot-product peak (AVX512-BF16's vdpbf16ps: per float32 lane, two bfloat16
 * products added to the accumulator, 4 operations), or -1 where this build lacks it. */
#if defined(HAVE_CVTNEPS2BF16)
double la_peak_bf16(long iters, float *io) {
    __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(io[0]), _mm512_set1_ps(io[0]));
    __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(io[1]), _mm512_set1_ps(io[1]));
    __m512 acc[PEAK_CHAINS];
    for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = _mm512_set1_ps(io[2] + (float)c);
#define PEAK_DOT(c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
    for (long i = 0; i < iters; i++) { PEAK_STEP(PEAK_DOT) }
#undef PEAK_DOT
    float s = 0.0f;
    for (int c = 0; c < PEAK_CHAINS; c++) s += _mm512_reduce_add_ps(acc[c]);
    io[3] = s;
    return 4.0 * 16 * PEAK_CHAINS * (double)iters;
}
#else
double la_peak_bf16(long iters, float *io) {
    (void)iters;
    (void)io;
    return -1.0;
}
#endif

/* 1 where this build multiplies bfloat16 on AMX tiles in this process (tiles.h), else 0. */
int la_amx(void) {
#if defined(LA_AMX)
    return amx_ready();
#else
    return 0;
#endif
}

/* Tiles on (where the kernel grants them) or off for this process, whatever LINATTN_AMX said;
 * returns the previous setting: the tests run both forms on one CPU. */
int la_amx_use(int on) {
#if defined(LA_AMX)
    int was = amx_ready();
    __atomic_store_n(&amx_state, on ? amx_request() : 0, __ATOMIC_RELAXED);
    return was;
#else
    (void)on;
    return 0;
#endif
}

/* The AMX tile peak (tdpbf16ps: 16 x 16 sums of 32 bfloat16 products, 16,384 operations), or
 * -1 where the build or the kernel has no tiles. Four output tiles in turn cover the product's
 * latency (about four times its issue interval). */
double la_peak_amx(long iters, float *io) {
#if defined(LA_AMX)
    if (!amx_ready()) return -1.0;
    static u16 ops[2][16 * 32] __attribute__((aligned(64)));
    static float out[16 * 16] __attribute__((aligned(64)));
    for (int i = 0; i < 16 * 32; ++i) ops[0][i] = f2bf(io[0]), ops[1][i] = f2bf(io[1]);
    amx_configure();
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, ops[0], 64);
    _tile_loadd(5, ops[0], 64);
    _tile_loadd(6, ops[1], 64);
    _tile_loadd(7, ops[1], 64);
    for (long i = 0; i < iters; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    float s = 0.0f;
    _tile_stored(0, out, 64);
    for (int i = 0; i < 16 * 16; ++i) s += out[i];
    _tile_stored(3, out, 64);
    for (int i = 0; i < 16 * 16; ++i) s += out[i];
    _tile_release();
    io[3] = s;
    return 4.0 * 2 * 16 * 16 * 32 * (double)iters;
#else
    (void)iters;
    (void)io;
    return -1.0;
#endif
}

/* fn(slot) once on each thread of an OpenMP team of up to `threads` (slot 0 the calling
 * thread): the team torch's own operations run on (la_parallel in common.h says why), here for
 * the Python side, whose parts of a pass take jobs from a shared queue in fn
 * (linattn.ops.native.run_parts). Running them on these threads rather than a pool of Python's
 * own matters on a machine with as many cores as threads: after each of torch's parallel
 * operations its OpenMP workers spin for some milliseconds before they sleep, and a Python
 * thread started meanwhile shared a core with a spinning worker (a GLA prefill of 16 heads
 * took 1.14x less time on 2 threads than on 1, 1.93x with the workers told to sleep at once:
 * AMD EPYC family 25). Returns the threads that ran fn, 0 where this build has no OpenMP (fn
 * not called: the caller runs its own threads). */
typedef void (*la_slot_fn)(int slot);
int la_run_threads(la_slot_fn fn, int threads) {
#ifdef _OPENMP
    int ran = 0;
#pragma omp parallel num_threads(threads > 0 ? threads : 1) shared(ran)
    {
        fn(omp_get_thread_num());
#pragma omp atomic
        ran++;
    }
    return ran;
#else
    (void)fn;
    (void)threads;
    return 0;
#endif
}
