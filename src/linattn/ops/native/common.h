#ifndef LA_COMMON_H
#define LA_COMMON_H
/* What every op's C kernels share (linattn.ops.native): vector types and widths per ISA,
 * bfloat16 conversions, exp and phi, dot products, and the argument-struct tables.
 *
 * The rest of this comment describes the linear-attention kernels (ops/linear/kernels.c), the
 * first kernels written on these helpers.
 *
 * Element-wise passes of the CPU fast path (linattn.ops.linear.native), float32.
 *
 * The matrix products of linear attention run through torch (MKL reaches the matmul roofline
 * on 64-wide blocks); what torch does slowly is everything between them: 1 + elu (torch's exp
 * costs ~0.6 ns per element here), the normaliser and the normalisation, and the gradient of
 * phi. Each function below makes one pass over a block that is still in cache.
 *
 * Layout: a block holds N heads x T tokens. Rows (one token of one head) are contiguous; a
 * "head stride" (xs, os, ...) in elements says where head n starts, so a view x[:, t0:t1] of a
 * (N, T_total, D) tensor is passed without a copy. Outputs without a stride are contiguous.
 *
 * Vectors use GCC/clang vector extensions whose width follows the instruction set the compiler
 * targets (-march=native at build time): 16 floats on AVX-512, 8 on AVX/AVX2, 4 on SSE2 and
 * aarch64 NEON, 1 (plain scalars) elsewhere or with -DLA_W=1. A width the hardware does not
 * have would be split by the compiler into narrower registers and spill (16 floats on a
 * 16-register AVX2 core ran 6-7x below its FMA peak), so the register tiles of the products
 * (MR rows x NV vectors) are sized per width as well, to the register file of that ISA.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#ifndef LA_W
#if defined(__AVX512F__)
#define LA_W 16
#elif defined(__AVX__)
#define LA_W 8
#elif defined(__SSE2__) || defined(__ARM_NEON) || defined(__ARM_NEON__)
#define LA_W 4
#else
#define LA_W 1
#endif
#endif
#define W LA_W

/* Register tiles: MR rows x NV vectors of accumulators, plus NV vectors of B and one
 * broadcast of A, must fit the register file (32 vector registers on AVX-512 and NEON, 16 on
 * AVX2 and SSE2; ~16 scalar FP registers for the scalar form). */
#if LA_W == 16
#define MR 6
#define NV 4 /* 24 + 4 + 1 of 32 registers, 64 columns */
#elif LA_W == 8
#define MR 6
#define NV 2 /* 12 + 2 + 1 of 16, 16 columns (the 6x16 shape of BLIS' Haswell kernel) */
#elif LA_W == 4 && (defined(__ARM_NEON) || defined(__ARM_NEON__))
#define MR 6
#define NV 4 /* 24 + 4 + 1 of 32, 16 columns */
#elif LA_W == 4
#define MR 6
#define NV 2 /* 12 + 2 + 1 of 16 */
#else
#define MR 4
#define NV 3 /* 12 + 3 + 1 scalars */
#endif

#if defined(__AVX__)
#include <immintrin.h>
#endif
#if LA_W == 16 && defined(__AVX512BF16__) && defined(__AVX512F__)
#define HAVE_CVTNEPS2BF16 1 /* one instruction rounds 16 floats to bfloat16 */
#endif

typedef float vf __attribute__((vector_size(4 * LA_W)));
typedef int vi __attribute__((vector_size(4 * LA_W)));

enum { PHI_ELU = 0, PHI_RELU = 1 };

static inline vf vload(const float *p) { vf r; memcpy(&r, p, sizeof r); return r; }
static inline void vstore(float *p, vf v) { memcpy(p, &v, sizeof v); }
/* All lanes = a. (Not (vf){0} + a: adding 0 is not a no-op for -0.0, so that costs an add.) */
#if LA_W == 16
#define LA_LANES(a) a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a
#elif LA_W == 8
#define LA_LANES(a) a, a, a, a, a, a, a, a
#elif LA_W == 4
#define LA_LANES(a) a, a, a, a
#else
#define LA_LANES(a) a
#endif
static inline vf vsplat(float a) { return (vf){LA_LANES(a)}; }
static inline vf vselect(vi m, vf a, vf b) { return (vf)(((vi)a & m) | ((vi)b & ~m)); }

/* Subnormals flushed to zero and read as zero from la_subnormals_off() until
 * la_subnormals_restore(its value): MXCSR's FTZ and DAZ on x86, FPCR's FZ on AArch64 (elsewhere
 * nothing: slower there, never wrong). For a recurrence's passes, where products of two decays
 * (the two-token passes) or of a decay near its flush (e^-87) and a row leave subnormal values
 * that every element's operation would carry through microcode assists: with log-gates in
 * (-87, -44] the delta rule's passes took 20-50x the time, GLA's 10-50x (and the delta rule's
 * one-token passes with per-key gates 50x near -80), Intel Xeon family 6. Flushing each such
 * product where it is made does not reach the sums that stay tiny along a row. The register
 * is the calling thread's, so each kernel call sets and restores it around its own work. */
static inline unsigned long la_subnormals_off(void) {
#if defined(__SSE__) && (defined(__GNUC__) || defined(__clang__))
    unsigned csr = __builtin_ia32_stmxcsr();
    __builtin_ia32_ldmxcsr(csr | 0x8040u); /* FTZ (bit 15), DAZ (bit 6) */
    return csr;
#elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
    unsigned long fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    __asm__ volatile("msr fpcr, %0" : : "r"(fpcr | (1ul << 24))); /* FZ */
    return fpcr;
#else
    return 0;
#endif
}
static inline void la_subnormals_restore(unsigned long csr) {
#if defined(__SSE__) && (defined(__GNUC__) || defined(__clang__))
    /* the caller's controls, and the exception flags (bits 0-5) as they stand now */
    __builtin_ia32_ldmxcsr(((unsigned)csr & ~0x3Fu) | (__builtin_ia32_stmxcsr() & 0x3Fu));
#elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
    __asm__ volatile("msr fpcr, %0" : : "r"(csr));
#else
    (void)csr;
#endif
}

/* bfloat16 <-> float32. A bfloat16 is the high half of a float32; rounding to it is to nearest,
 * ties to even, NaN kept a (quiet) NaN. Buffers flagged "bf" hold bfloat16, others float32;
 * indices below are in elements. */
typedef unsigned short u16;
typedef u16 vh __attribute__((vector_size(2 * LA_W)));
typedef unsigned vu __attribute__((vector_size(4 * LA_W)));

static inline float bf2f(u16 h) { unsigned u = (unsigned)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline u16 f2bf(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    if (f != f) return (u16)((u >> 16) | 0x40);
    return (u16)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static inline vf vload_any(const void *p, long i, int bf) {
    if (!bf) return vload((const float *)p + i);
    vh h;
    memcpy(&h, (const u16 *)p + i, sizeof h);
    return (vf)(__builtin_convertvector(h, vu) << 16);
}
static inline void vstore_any(void *p, long i, vf x, int bf) {
    if (!bf) { vstore((float *)p + i, x); return; }
#ifdef HAVE_CVTNEPS2BF16
    __m256bh b = _mm512_cvtneps_pbh((__m512)x);
    memcpy((u16 *)p + i, &b, sizeof b);
#else
    vu u = (vu)x;
    vu r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    r = (vu)vselect(x != x, (vf)((u >> 16) | 0x40u), (vf)r);
    vh h = __builtin_convertvector(r, vh);
    memcpy((u16 *)p + i, &h, sizeof h);
#endif
}
static inline float load_any(const void *p, long i, int bf) {
    return bf ? bf2f(((const u16 *)p)[i]) : ((const float *)p)[i];
}
static inline void store_any(void *p, long i, float x, int bf) {
    if (bf) ((u16 *)p)[i] = f2bf(x);
    else ((float *)p)[i] = x;
}

/* float16 (IEEE binary16) <-> float32 with bit operations only, so that every build and every
 * vector width has them (no F16C or NEON half instructions needed): widening is exact
 * (subnormals, infinities and NaN included: the exponent is rebased by a multiplication by
 * 2^112, exact for every half value); narrowing rounds to nearest, ties to even, overflow to
 * infinity, NaN kept a (quiet) NaN. */
static inline float h2f(u16 h) {
    unsigned em = (unsigned)(h & 0x7FFFu) << 13, u;
    float f;
    memcpy(&f, &em, 4);
    f *= 0x1p112f;
    memcpy(&u, &f, 4);
    if ((h & 0x7C00u) == 0x7C00u) u = em | 0x7F800000u; /* infinity or NaN */
    u |= (unsigned)(h & 0x8000u) << 16;
    memcpy(&f, &u, 4);
    return f;
}
static inline u16 f2h(float f) {
    unsigned u, sign;
    memcpy(&u, &f, 4);
    sign = (u >> 16) & 0x8000u;
    u &= 0x7FFFFFFFu;
    if (u >= 0x47800000u) /* >= 2^16: infinity (NaN stays NaN) */
        return (u16)(sign | (u > 0x7F800000u ? 0x7E00u : 0x7C00u));
    if (u < 0x38800000u) { /* below 2^-14: a subnormal half; adding 0.5 rounds at its ulp */
        float a;
        memcpy(&a, &u, 4);
        a += 0.5f;
        memcpy(&u, &a, 4);
        return (u16)(sign | (u - 0x3F000000u));
    }
    u += 0xC8000FFFu + ((u >> 13) & 1u); /* rebias the exponent, round to nearest even */
    return (u16)(sign | (u >> 13));
}
static inline vu vsplat_u(unsigned a) { return (vu){LA_LANES(a)}; }
static inline vf vh2f(vu h) { /* h: one half per lane, in the low 16 bits */
    vu em = (h & 0x7FFFu) << 13;
    vf f = (vf)em * 0x1p112f;
    f = vselect((vi)((h & 0x7C00u) == 0x7C00u), (vf)(em | 0x7F800000u), f);
    return (vf)((vu)f | ((h & 0x8000u) << 16));
}
static inline vu vf2h(vf x) {
    vu u = (vu)x;
    vu sign = (u >> 16) & 0x8000u;
    u &= 0x7FFFFFFFu;
    vu sub = (vu)((vf)u + 0.5f) - 0x3F000000u;
    vu norm = (u + 0xC8000FFFu + ((u >> 13) & 1u)) >> 13;
    vu h = (vu)vselect((vi)(u < 0x38800000u), (vf)sub, (vf)norm);
    vu big = (vu)vselect((vi)(u > 0x7F800000u), (vf)vsplat_u(0x7E00u), (vf)vsplat_u(0x7C00u));
    h = (vu)vselect((vi)(u >= 0x47800000u), (vf)big, (vf)h);
    return h | sign;
}

/* Buffers of any of the three dtypes the compiled paths take, by code (Python passes the code
 * of each tensor; linattn.ops.native.DTYPE_CODES): elements, not bytes, in the indices. */
enum { LA_F32 = 0, LA_BF16 = 1, LA_F16 = 2 };
static inline vf vload_dt(const void *p, long i, int dt) {
    if (dt == LA_F32) return vload((const float *)p + i);
    vh h;
    memcpy(&h, (const u16 *)p + i, sizeof h);
    vu u = __builtin_convertvector(h, vu);
    return dt == LA_BF16 ? (vf)(u << 16) : vh2f(u);
}
static inline void vstore_dt(void *p, long i, vf x, int dt) {
    if (dt == LA_F32) {
        vstore((float *)p + i, x);
    } else if (dt == LA_BF16) {
        vstore_any(p, i, x, 1);
    } else {
        vh h = __builtin_convertvector(vf2h(x), vh);
        memcpy((u16 *)p + i, &h, sizeof h);
    }
}
static inline float load_dt(const void *p, long i, int dt) {
    if (dt == LA_F32) return ((const float *)p)[i];
    u16 h = ((const u16 *)p)[i];
    return dt == LA_BF16 ? bf2f(h) : h2f(h);
}
static inline void store_dt(void *p, long i, float x, int dt) {
    if (dt == LA_F32) ((float *)p)[i] = x;
    else ((u16 *)p)[i] = dt == LA_BF16 ? f2bf(x) : f2h(x);
}

/* n elements of dtype dt at src as float32 at dst (exact for the 16-bit types); returns dst.
 * What a decoding step does with 16-bit rows before its float32 kernel. */
static inline const float *la_widened(float *dst, const void *src, long n, int dt) {
    long i = 0;
    for (; i + W <= n; i += W) vstore(dst + i, vload_dt(src, i, dt));
    for (; i < n; ++i) dst[i] = load_dt(src, i, dt);
    return dst;
}

/* n floats rounded up to whole 64-byte lines: per-thread scratch that no two threads share a
 * line of, or a region after which the next starts on a line. */
static inline long la_lines(long n) { return (n + 15) / 16 * 16; }

/* Whether every one of n elements of dtype dt at x is <= 0 (no NaN): the log-gates' check of
 * the decoding steps, made on the rows as given, before anything is written. */
static inline int la_all_nonpositive(const void *x, long n, int dt) {
    long i = 0;
    vi bad = (vi)vsplat(0.0f);
    for (; i + W <= n; i += W) bad |= ~(vi)(vload_dt(x, i, dt) <= 0.0f);
    int lanes[W];
    memcpy(lanes, &bad, sizeof bad);
    for (long l = 0; l < W; ++l)
        if (lanes[l]) return 0;
    for (; i < n; ++i)
        if (!(load_dt(x, i, dt) <= 0.0f)) return 0;
    return 1;
}

/* x[i0, i1) stored at dst[i0, i1) in dtype dt (i0 a multiple of W; any i1: whole vectors,
 * then a scalar tail): a 16-bit output rounded once from its float32 scratch. */
static inline void la_narrowed(void *dst, const float *x, long i0, long i1, int dt) {
    long i = i0;
    for (; i + W <= i1; i += W) vstore_dt(dst, i, vload(x + i), dt);
    for (; i < i1; ++i) store_dt(dst, i, x[i], dt);
}

/* The chunk helpers of the recurrences' 16-bit forwards (GLA's and the delta rule's), which
 * run their float32 kernel on one chunk of tokens at a time. la_widened_rows: `rows` rows of n
 * elements of dtype dt (16-bit), row t at element at + t * stride of src, as float32 rows of n
 * at dst; la_narrowed_rows: the float32 rows of n at x, columns [i0, i1), stored the same way
 * at dst. */
static inline void la_widened_rows(float *dst, const void *src, long at, long stride, long rows,
                                   long n, int dt) {
    for (long t = 0; t < rows; ++t)
        la_widened(dst + t * n, (const u16 *)src + at + t * stride, n, dt);
}
static inline void la_narrowed_rows(void *dst, long at, long stride, const float *x, long rows,
                                    long n, long i0, long i1, int dt) {
    for (long t = 0; t < rows; ++t)
        la_narrowed((u16 *)dst + at + t * stride, x + t * n, i0, i1, dt);
}

/* Columns [v0, v1) of a K x V float32 state (rows of V) copied from src to dst: a state passed
 * on unchanged (T = 0) or saved for the backward, where a thread owns only those columns. */
static inline void la_copy_cols(float *dst, const float *src, long K, long V, long v0, long v1) {
    for (long i = 0; i < K; ++i)
        memcpy(dst + i * V + v0, src + i * V + v0, (size_t)(v1 - v0) * sizeof(float));
}

/* exp(x) = 2^n * p(r) with n = round(x / ln 2), r = x - n ln 2 in two parts, p the degree-7
 * minimax polynomial of exp on |r| <= ln2 / 2 (~1 ulp), or with coarse a degree-4 one (a fit of
 * the relative error: 5.4e-6): p returned, n in *n. */
#define LA_ROUND_MAGIC 12582912.0f /* 1.5 * 2^23: adding it rounds a float to an integer */
static inline vf vexp_parts(vf x, vf *n_out, int coarse) {
    vf n = (x * 1.44269504088896341f + LA_ROUND_MAGIC) - LA_ROUND_MAGIC;
    vf r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    vf p;
    if (coarse) { /* degree 4, relative error 5.4e-6 (below 2^-17): for products in bfloat16 */
        p = vsplat(4.127783328e-2f);
        p = p * r + 1.675347388e-1f;
        p = p * r + 5.000510812e-1f;
    } else {
        p = vsplat(1.9875691500e-4f);
        p = p * r + 1.3981999507e-3f;
        p = p * r + 8.3334519073e-3f;
        p = p * r + 4.1665795894e-2f;
        p = p * r + 1.6666665459e-1f;
        p = p * r + 5.0000001201e-1f;
    }
    *n_out = n;
    return p * r * r + r + 1.0f;
}

/* p 2^n for an integer n in [-126, 127], 2^n made from n's bits. */
static inline vf vscale2(vf p, vf n) {
    return p * (vf)(((vi)(n + LA_ROUND_MAGIC) - (vi)vsplat(LA_ROUND_MAGIC) + 127) << 23);
}

/* exp(x) for x in [-87, 88] (callers clamp). */
static inline vf vexp_clamped(vf x) {
    vf n, p = vexp_parts(x, &n, 0);
    return vscale2(p, n);
}

/* exp(x), valid for x <= 0 (the only branch of 1 + elu that needs it), flushed to 0 below -87
 * (exp(-87) is already within 2^-126 of 0); coarse as vexp_parts. AVX-512 scales by 2^n and
 * flushes in one instruction (vscalefps under a mask): 4 fewer than the bits' way, of ~20 in
 * 1 + elu. */
static inline vf vexp_nonpos_as(vf x, int coarse) {
    vf n, p = vexp_parts(x, &n, coarse);
#if defined(__AVX512F__) && LA_W == 16
    /* kept unless x < -87: NaN stays NaN (a NaN gate is no state reset), as elsewhere */
    __mmask16 keep = _mm512_cmp_ps_mask((__m512)x, _mm512_set1_ps(-87.0f), _CMP_NLT_UQ);
    return (vf)_mm512_maskz_scalef_ps(keep, (__m512)p, (__m512)n);
#else
    return vselect(x < -87.0f, vsplat(0.0f), vscale2(p, n));
#endif
}
static inline vf vexp_nonpos(vf x) { return vexp_nonpos_as(x, 0); }

static inline float sexp_nonpos(float x) { return x < -87.0f ? 0.0f : expf(x); }

/* sigmoid(a) = 1 / (1 + e) and silu(a) = a / (1 + e), e = exp(-a) with -a clamped to
 * [-87, 88] (below, sigmoid is 1 to float32's precision; above, it is < 2^-126 and silu is
 * within 1e-36 of 0). ~2 ulp; NaN stays NaN. The activations of the convolution and the gated
 * norm, where they are most of the arithmetic. */
static inline vf vexp_neg(vf a) {
    vf x = -a;
    x = vselect(x < -87.0f, vsplat(-87.0f), x);
    x = vselect(x > 88.0f, vsplat(88.0f), x);
    return vexp_clamped(x);
}
static inline vf vsigmoid(vf a) { return 1.0f / (1.0f + vexp_neg(a)); }
static inline vf vsilu(vf a) { return a / (1.0f + vexp_neg(a)); }
static inline float ssigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }
static inline float ssilu(float a) { return a / (1.0f + expf(-a)); }

/* phi(x); NaN propagates (x <= 0 is false for NaN, which takes the x + 1 branch). coarse: exp
 * to 2^-17 (vexp_parts), for features rounded to bfloat16 for their products. */
static inline vf vphi_as(int kind, vf x, int coarse) {
    vi nonpos = x <= 0.0f;
    vf low = kind == PHI_ELU ? vexp_nonpos_as(x, coarse) : vsplat(1.0f);
    return vselect(nonpos, low, x + 1.0f);
}
static inline vf vphi(int kind, vf x) { return vphi_as(kind, x, 0); }

static inline float sphi(int kind, float x) {
    if (x <= 0.0f) return kind == PHI_ELU ? sexp_nonpos(x) : 1.0f;
    return x + 1.0f;
}

/* phi'(x), given x and f = phi(x): 1 for x > 0; else f = exp(x) for 1 + elu and 0 for 1 + relu
 * (torch's relu has gradient 0 at 0). From x, not from f alone: for 0 < x < 2^-24, 1 + x
 * rounds to exactly 1. */
static inline vf vdphi(int kind, vf x, vf f) {
    return vselect(x > 0.0f, vsplat(1.0f), kind == PHI_ELU ? f : vsplat(0.0f));
}

static inline float sdphi(int kind, float x, float f) {
    return x > 0.0f ? 1.0f : (kind == PHI_ELU ? f : 0.0f);
}

/* The sum of a vector's lanes, by halving (a scalar loop over 16 lanes costs more than the
 * dot product it finishes). */
#if LA_W >= 8 && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12))
typedef float vf8 __attribute__((vector_size(32)));
typedef float vf4 __attribute__((vector_size(16)));
static inline float hsum8(vf8 h) {
    vf4 c = __builtin_shufflevector(h, h, 0, 1, 2, 3);
    vf4 d = __builtin_shufflevector(h, h, 4, 5, 6, 7);
    vf4 q = c + d;
    return (q[0] + q[2]) + (q[1] + q[3]);
}
#if LA_W == 16
static inline float hsum(vf x) {
    vf8 a = __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7);
    vf8 b = __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15);
    return hsum8(a + b);
}
#else
static inline float hsum(vf x) { return hsum8(x); }
#endif

#elif LA_W == 4
static inline float hsum(vf x) { return (x[0] + x[2]) + (x[1] + x[3]); }
#else /* __builtin_shufflevector needs GCC >= 12; scalars need nothing */
static inline float hsum(vf x) {
    float s = 0.0f;
    for (int i = 0; i < W; ++i) s += x[i];
    return s;
}
#endif

/* The sums of the lanes of W vectors x[0..W) (W floats apart), as one vector: lane r is the
 * sum of x[r]. A transpose-and-add in log2(W) halving steps (2 shuffles and an add per output
 * vector of each step: 45 operations for 16 sums at W = 16, against 16 horizontal sums, or a
 * block transpose and W - 1 adds). The gated backward's and the recurrent causal backward's
 * sums over a row. */
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define LA_SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#endif
static inline vf row_sums(const float *x) {
#if LA_W == 1
    return vload(x);
#elif defined(LA_SHUF) && LA_W == 16
    vf y[8], z[4], w[2];
    for (int p = 0; p < 8; ++p) {
        vf a = vload(x + 2 * p * W), b = vload(x + (2 * p + 1) * W);
        y[p] = LA_SHUF(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
               + LA_SHUF(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    }
    for (int p = 0; p < 4; ++p)
        z[p] = LA_SHUF(y[2 * p], y[2 * p + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25,
                        26, 27)
               + LA_SHUF(y[2 * p], y[2 * p + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28,
                          29, 30, 31);
    for (int p = 0; p < 2; ++p)
        w[p] = LA_SHUF(z[2 * p], z[2 * p + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25,
                        28, 29)
               + LA_SHUF(z[2 * p], z[2 * p + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26,
                          27, 30, 31);
    return LA_SHUF(w[0], w[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
           + LA_SHUF(w[0], w[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
#elif defined(LA_SHUF) && LA_W == 8
    vf y[4], z[2];
    for (int p = 0; p < 4; ++p) {
        vf a = vload(x + 2 * p * W), b = vload(x + (2 * p + 1) * W);
        y[p] = LA_SHUF(a, b, 0, 1, 2, 3, 8, 9, 10, 11) + LA_SHUF(a, b, 4, 5, 6, 7, 12, 13, 14, 15);
    }
    for (int p = 0; p < 2; ++p)
        z[p] = LA_SHUF(y[2 * p], y[2 * p + 1], 0, 1, 4, 5, 8, 9, 12, 13)
               + LA_SHUF(y[2 * p], y[2 * p + 1], 2, 3, 6, 7, 10, 11, 14, 15);
    return LA_SHUF(z[0], z[1], 0, 2, 4, 6, 8, 10, 12, 14)
           + LA_SHUF(z[0], z[1], 1, 3, 5, 7, 9, 11, 13, 15);
#elif defined(LA_SHUF) && LA_W == 4
    vf y[2];
    for (int p = 0; p < 2; ++p) {
        vf a = vload(x + 2 * p * W), b = vload(x + (2 * p + 1) * W);
        y[p] = LA_SHUF(a, b, 0, 1, 4, 5) + LA_SHUF(a, b, 2, 3, 6, 7);
    }
    return LA_SHUF(y[0], y[1], 0, 2, 4, 6) + LA_SHUF(y[0], y[1], 1, 3, 5, 7);
#else
    vf r;
    for (int l = 0; l < W; ++l) r[l] = hsum(vload(x + l * W));
    return r;
#endif
}

/* a . b with a float32 or bfloat16 (abf), b float32. */
static inline float dot_any(const void *a, long ai, int abf, const float *b, long n) {
    vf acc = vsplat(0.0f);
    long j = 0;
    for (; j + W <= n; j += W) acc += vload_any(a, ai + j, abf) * vload(b + j);
    float s = hsum(acc);
    for (; j < n; ++j) s += load_any(a, ai + j, abf) * b[j];
    return s;
}

static inline float dot(const float *a, const float *b, long n) {
    vf acc = vsplat(0.0f);
    long j = 0;
    for (; j + W <= n; j += W) acc += vload(a + j) * vload(b + j);
    float s = hsum(acc);
    for (; j < n; ++j) s += a[j] * b[j];
    return s;
}

/* dst[j0:j0+n] = src[0:n] * s, dst float32 or bfloat16 (any n: whole vectors, then a scalar
 * tail). */
static inline void scale_row(void *dst, long j0, int bf, const float *src, float s, long n) {
    long j = 0;
    for (; j + W <= n; j += W) vstore_any(dst, j0 + j, vload(src + j) * s, bf);
    for (; j < n; ++j) store_any(dst, j0 + j, src[j] * s, bf);
}

/* *p = x with a non-temporal store where p is aligned to the vector (AVX2, AVX-512), else a plain
 * store; a kernel that uses it calls stream_fence() before it returns. */
static inline void vstore_stream(float *p, vf x) {
#if defined(__AVX512F__) && LA_W == 16
    if (((size_t)p & 63) == 0) { _mm512_stream_ps(p, (__m512)x); return; }
#elif defined(__AVX__) && LA_W == 8
    if (((size_t)p & 31) == 0) { _mm256_stream_ps(p, (__m256)x); return; }
#endif
    vstore(p, x);
}

/* scale_row for an output row nothing reads back soon: float32 rows whose address is a
 * multiple of the vector size go to memory with non-temporal stores (no read of the line
 * before it is written: a third less memory traffic for a streamed output); callers end the
 * kernel with stream_fence(). */
static inline void scale_row_stream(void *dst, long j0, int bf, const float *src, float s,
                                    long n) {
#if defined(HAVE_CVTNEPS2BF16)
    u16 *d = (u16 *)dst + j0; /* bfloat16: whole lines of 32 values rounded in one instruction */
    if (bf && n % 32 == 0 && ((size_t)d & 63) == 0) {
        for (long j = 0; j < n; j += 32) {
            __m512bh h = _mm512_cvtne2ps_pbh((__m512)(vload(src + j + 16) * s),
                                             (__m512)(vload(src + j) * s));
            _mm512_stream_si512((void *)(d + j), (__m512i)h);
        }
        return;
    }
#endif
    if (bf || n % W) {
        scale_row(dst, j0, bf, src, s, n);
        return;
    }
    for (long j = 0; j < n; j += W) vstore_stream((float *)dst + j0 + j, vload(src + j) * s);
}

static inline void stream_fence(void) {
#if defined(__AVX__)
    _mm_sfence();
#endif
}

/* ------------------------------------------------------------------ threads
 * la_parallel(fn, ctx, parts, threads): fn(ctx, part, slot) for every part 0 .. parts-1, on at
 * most `threads` threads, the calling one included; slot names the thread running the part (0
 * the calling thread), for per-thread scratch. Returns 1 when the other threads took no part
 * although there were enough for each (they were late: asleep, or their cores taken by another
 * process), else 0; the Python side then keeps such calls on one thread for a while
 * (linattn.ops.native.native_threads).
 *
 * The threads are OpenMP's, in a build with -fopenmp (linattn.ops.native tries it first):
 * the runtime torch loaded (its wheels ship libgomp.so.1, whose name this library's need
 * matches), so these kernels share torch's worker threads, which watch for work for a while
 * after each parallel operation, instead of waking threads of their own: a hand-over costs
 * ~1-2 us, where handing a part to a Python thread pool costs 20-60 us, more than a decoding
 * step's whole kernel (~7 us at H = 16, K = V = 64). Parts are taken one at a time, the
 * calling thread from the front and the others from the back: in a loop of calls each thread
 * keeps the same parts (their data stays in its core's cache) when all run, and a thread
 * that starts late finds fewer. Without OpenMP every part runs on the calling thread. */
typedef void (*la_part_fn)(void *ctx, long part, int slot);

/* Heads per part when n heads split over `threads`: two parts a thread, taken one at a time,
 * so that a thread that starts late takes fewer (all n in one part on one thread). */
static inline long la_per_part(long n, int threads) {
    long parts = threads > 1 ? (n < 2L * threads ? n : 2L * threads) : 1;
    return parts > 0 && n > 0 ? (n + parts - 1) / parts : 1;
}

#ifdef _OPENMP
#include <omp.h>

__attribute__((unused)) static int la_parallel(la_part_fn fn, void *ctx, long parts, int threads) {
    if ((long)threads > parts) threads = (int)parts;
    if (threads <= 1) {
        for (long p = 0; p < parts; ++p) fn(ctx, p, 0);
        return 0;
    }
    long lo = 0, hi = parts, helped = 0; /* parts not yet taken: [lo, hi) */
#pragma omp parallel num_threads(threads) shared(lo, hi, helped)
    {
        int slot = omp_get_thread_num();
        for (;;) {
            long p;
#pragma omp critical(la_take)
            p = lo >= hi ? -1 : slot ? --hi : lo++;
            if (p < 0) break;
            fn(ctx, p, slot);
            if (slot) {
#pragma omp atomic
                helped++;
            }
        }
    }
    return helped == 0;
}
#else
__attribute__((unused)) static int la_parallel(la_part_fn fn, void *ctx, long parts, int threads) {
    (void)threads;
    for (long p = 0; p < parts; ++p) fn(ctx, p, 0);
    return 0;
}
#endif

/* ------------------------------------------------------------------ the Python boundary
 * Every kernel that Python calls takes ONE argument struct (`la_<kernel>_args`) through an entry
 * point `la_<kernel>_call(const la_<kernel>_args *)`. Each struct is declared once, as a field
 * list X(S, type, name, kind) from which the macros below make both the struct and a table of
 * its layout (name, offset, size, kind) that Python reads back (`la_<op>_abi(i)`): the ctypes
 * mirror of each struct (linattn/ops/native/abi.py) is checked against that table when the
 * library loads, so a field added, removed, reordered or retyped on one side only raises there
 * instead of corrupting memory. kind: 'i' int, 'l' long, 'f' float, 'p' pointer. */
#include <stddef.h>

typedef struct {
    const char *name;
    long offset, size;
    char kind;
} la_field;

typedef struct {
    const char *name;
    long size, nfields;
    const la_field *fields;
} la_struct;

#define LA_DECLARE_FIELD(S, type, name, kind) type name;
#define LA_DESCRIBE_FIELD(S, type, name, kind) {#name, (long)offsetof(S, name), (long)sizeof(type), kind},
/* typedef struct {...} S; and its layout table S_fields */
#define LA_ARGS(S, FIELDS)                                                                     \
    typedef struct { FIELDS(LA_DECLARE_FIELD, S) } S;                                          \
    static const la_field S##_fields[] = {FIELDS(LA_DESCRIBE_FIELD, S)};
/* The struct NAME_args of FIELDS and its entry point NAME_call, which calls the kernel NAME with
 * the struct's fields in their order and returns its result (LA_ENTRY), or 0 after a kernel
 * that returns nothing (LA_ENTRY_VOID): each argument is spelled once, in FIELDS. An entry that
 * does more than pass its fields on is written out. */
#define LA_PASS_FIELD(S, type, name, kind) , a->name
#define LA_SKIP_FIRST(first, ...) __VA_ARGS__
#define LA_CALL_ARGS(...) LA_SKIP_FIRST(__VA_ARGS__)
#define LA_ENTRY(NAME, FIELDS)                                                                 \
    LA_ARGS(NAME##_args, FIELDS)                                                               \
    int NAME##_call(const NAME##_args *a) {                                                    \
        return (int)NAME(LA_CALL_ARGS(FIELDS(LA_PASS_FIELD, NAME##_args)));                    \
    }
#define LA_ENTRY_VOID(NAME, FIELDS)                                                            \
    LA_ARGS(NAME##_args, FIELDS)                                                               \
    int NAME##_call(const NAME##_args *a) {                                                    \
        NAME(LA_CALL_ARGS(FIELDS(LA_PASS_FIELD, NAME##_args)));                                \
        return 0;                                                                              \
    }
#define LA_STRUCT_ENTRY(S) {#S, (long)sizeof(S), (long)(sizeof(S##_fields) / sizeof(la_field)), S##_fields}
/* const la_struct *FN(long i): the i-th struct of TABLE, NULL past the end */
#define LA_ABI_TABLE(FN, TABLE)                                                                \
    const la_struct *FN(long i) {                                                              \
        return i >= 0 && i < (long)(sizeof(TABLE) / sizeof(TABLE[0])) ? &TABLE[i] : NULL;      \
    }

#endif /* LA_COMMON_H */
