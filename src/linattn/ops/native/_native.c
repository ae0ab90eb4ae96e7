/* Element-wise passes of the CPU fast path (linattn.ops.native), float32.
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

#if LA_W == 16 && defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define HAVE_CVTNEPS2BF16 1 /* one instruction rounds 16 floats to bfloat16 */
#endif

typedef float vf __attribute__((vector_size(4 * LA_W)));
typedef int vi __attribute__((vector_size(4 * LA_W)));

/* What this build is, for the Python side: the vector width in floats and the register tile. */
int la_width(void) { return W; }
int la_tile(void) { return MR * 100 + NV; }

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

/* exp(x), valid for x <= 0 (the only branch of 1 + elu that needs it): 2^n * p(r) with
 * n = round(x / ln 2), r = x - n ln 2 in two parts, p the degree-7 minimax polynomial of
 * exp on |r| <= ln2 / 2 (error ~1 ulp). Below -87 the result is flushed to 0 (exp(-87) is
 * already within 2^-126 of 0). */
static inline vf vexp_nonpos(vf x) {
    const vf magic = vsplat(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
    vf t = x * 1.44269504088896341f + magic;
    vf n = t - magic;
    vf r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    vf p = vsplat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
    vf e = p * (vf)bits;
    return vselect(x < -87.0f, vsplat(0.0f), e);
}

static inline float sexp_nonpos(float x) { return x < -87.0f ? 0.0f : expf(x); }

/* phi(x); NaN propagates (x <= 0 is false for NaN, which takes the x + 1 branch). */
static inline vf vphi(int kind, vf x) {
    vi nonpos = x <= 0.0f;
    vf low = kind == PHI_ELU ? vexp_nonpos(x) : vsplat(1.0f);
    return vselect(nonpos, low, x + 1.0f);
}

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

/* out[n, t] = phi(x[n, t]) for t < T (rows of D), zero where keep[n, t] == 0; z[n] += sum_t
 * out[n, t] (as stored, i.e. after rounding to bfloat16) when z is not NULL. x and out are
 * float32 or bfloat16 (xbf, obf); keep: NULL or bytes with head stride ks. */
void la_phi(int kind, const void *x, int xbf, long N, long T, long D, long xs, void *out, int obf,
            long R, float *z, const unsigned char *keep, long ks) {
    for (long n = 0; n < N; ++n) {
        long xn = n * xs, on = n * R * D;
        for (long t = 0; t < T; ++t) {
            long row = xn + t * D, dst = on + t * D;
            if (keep && !keep[n * ks + t]) {
                memset((char *)out + dst * (obf ? 2 : 4), 0, (size_t)D * (obf ? 2 : 4));
                continue;
            }
            long j = 0;
            for (; j + W <= D; j += W)
                vstore_any(out, dst + j, vphi(kind, vload_any(x, row + j, xbf)), obf);
            for (; j < D; ++j) store_any(out, dst + j, sphi(kind, load_any(x, row + j, xbf)), obf);
        }
        if (z) {
            /* Column sums of this head's block, one vector of columns at a time. */
            float *zn = z + n * D;
            long j = 0;
            for (; j + W <= D; j += W) {
                vf acc = vsplat(0.0f);
                for (long t = 0; t < T; ++t) acc += vload_any(out, on + t * D + j, obf);
                vstore(zn + j, vload(zn + j) + acc);
            }
            for (; j < D; ++j) {
                float acc = 0.0f;
                for (long t = 0; t < T; ++t) acc += load_any(out, on + t * D + j, obf);
                zn[j] += acc;
            }
        }
    }
}

/* den + eps with exact zeros (no key to attend to) replaced by 1: a zero output, not 0/0. */
static inline float guarded(float den, float eps) {
    den += eps;
    return den == 0.0f ? 1.0f : den;
}

/* Per-row vectors shared by groups of rows: z (N, nz, L) with nz = ceil(R / zrows), row t of
 * head n reads z[n, t / zrows] (zrows = R: one per head; zrows = C: one per causal chunk). */
static inline const float *group_row(const float *z, long zrows, long n, long t, long R, long L) {
    long nz = (R + zrows - 1) / zrows;
    return z + (n * nz + t / zrows) * L;
}

/* The normaliser of row t of head n before eps: fq . z (+ sx[n, t] where sx is not NULL);
 * fq float32 or bfloat16 (fbf). */
static inline float den_any(const void *fq, int fbf, const float *z, long zrows, const float *sx,
                            long n, long t, long R, long L) {
    float d = dot_any(fq, (n * R + t) * L, fbf, group_row(z, zrows, n, t, R, L), L);
    return sx ? d + sx[n * R + t] : d;
}

/* Row helpers shared by the block passes and the one-pass kernels. */


/* z[l] = z0[l] + sum_{t < rows} w_t f[t, l] (w_t = 1 where w is NULL); f rows of L, a multiple of
 * W; z may be z0. */
static void add_colsums(float *z, const float *z0, const float *f, const float *w, long rows,
                        long L) {
    for (long l = 0; l < L; l += W) {
        vf acc = vload(z0 + l);
        if (w)
            for (long t = 0; t < rows; ++t) acc += w[t] * vload(f + t * L + l);
        else
            for (long t = 0; t < rows; ++t) acc += vload(f + t * L + l);
        vstore(z + l, acc);
    }
}


/* The one-pass forwards read and write float32 or bfloat16 (bf): a bfloat16 row is widened
 * once into an L1 buffer and every sum stays float32, so bfloat16 costs the float32 arithmetic
 * on half the memory traffic, on any CPU (no bf16 dot-product units needed). */

/* f[0:n] = phi(x[i0:i0+n]), x float32 or bfloat16; n a multiple of W. */
static inline void phi_rows(int kind, const void *x, long i0, int bf, long n, float *f) {
    for (long i = 0; i < n; i += W) vstore(f + i, vphi(kind, vload_any(x, i0 + i, bf)));
}

/* x[i0:i0+n] as float32: x itself, or widened into buf. */
static inline const float *f32_rows(const void *x, long i0, int bf, long n, float *buf) {
    if (!bf) return (const float *)x + i0;
    for (long i = 0; i < n; i += W) vstore(buf + i, vload_any(x, i0 + i, 1));
    return buf;
}

/* dst[j0:j0+n] = src[0:n] * s, dst float32 or bfloat16 (any n: whole vectors, then a scalar
 * tail). */
static inline void scale_row(void *dst, long j0, int bf, const float *src, float s, long n) {
    long j = 0;
    for (; j + W <= n; j += W) vstore_any(dst, j0 + j, vload(src + j) * s, bf);
    for (; j < n; ++j) store_any(dst, j0 + j, src[j] * s, bf);
}

/* The gradient of one output row o = num / s, s = guarded(den) (den here includes eps), from
 * g = dL/do: writes dn = g / s and returns ds = -(g . o) / s, or 0 where den == 0 (the guard's
 * constant branch). */
static inline float grad_out_row(const float *g, const float *o, float den, long Dv, float *dn) {
    float inv = den == 0.0f ? 1.0f : 1.0f / den;
    long j = 0;
    for (; j + W <= Dv; j += W) vstore(dn + j, vload(g + j) * inv);
    for (; j < Dv; ++j) dn[j] = g[j] * inv;
    return den == 0.0f ? 0.0f : -dot(g, o, Dv) * inv;
}

/* dst = (dphi + c vec) phi'(x) for one row of L (no vec term where vec is NULL); f = phi(x). */
static inline void grad_phi_row(int kind, float *dst, const float *dphi, float c,
                                const float *vec, const float *x, const float *f, long L) {
    long j = 0;
    for (; j + W <= L; j += W) {
        vf d = vload(dphi + j);
        if (vec) d += c * vload(vec + j);
        vstore(dst + j, d * vdphi(kind, vload(x + j), vload(f + j)));
    }
    for (; j < L; ++j) dst[j] = (dphi[j] + (vec ? c * vec[j] : 0.0f)) * sdphi(kind, x[j], f[j]);
}

/* The normaliser of row i of a causal chunk before eps: fq_i . z + sum_{j <= i} A[i, j]. */
static inline float causal_den(const float *fq_i, const float *z, const float *A_i, long i,
                               long L) {
    float den = dot(fq_i, z, L);
    for (long j = 0; j <= i; ++j) den += A_i[j];
    return den;
}

/* Buffers below are contiguous (N, R, F) (R >= T rows per head, the first T used); per-row
 * scalars (sx, ds, coef) are (N, R); out, g and dx are views with head strides os, gs, dxs. */

/* out[n, t] = num[n, t] / guarded(den); num, fq and out float32 or bfloat16 (nbf, fbf, obf). */
void la_normalise(const void *num, int nbf, const void *fq, int fbf, const float *z, long zrows,
                  const float *sx, long N, long T, long R, long L, long Dv, float eps, void *out,
                  int obf, long os) {
    for (long n = 0; n < N; ++n)
        for (long t = 0; t < T; ++t) {
            float inv = 1.0f / guarded(den_any(fq, fbf, z, zrows, sx, n, t, R, L), eps);
            long src = (n * R + t) * Dv, dst = n * os + t * Dv;
            long j = 0;
            for (; j + W <= Dv; j += W)
                vstore_any(out, dst + j, vload_any(num, src + j, nbf) * inv, obf);
            for (; j < Dv; ++j) store_any(out, dst + j, load_any(num, src + j, nbf) * inv, obf);
        }
}

/* Gradient of o = num / s, s = guarded(den), given g = dL/do and the output o itself:
 * dnum = g / s and ds = -(g . o) / s (= -(g . num) / s^2), or 0 where den + eps == 0 (the
 * guard's constant branch). o and g are views with head strides os and gs. */
void la_norm_grad(const float *o, long os, const float *fq, const float *z, long zrows,
                  const float *sx, const float *g, long gs, long N, long T, long R, long L,
                  long Dv, float eps, float *dnum, float *ds) {
    for (long n = 0; n < N; ++n)
        for (long t = 0; t < T; ++t)
            ds[n * R + t] = grad_out_row(g + n * gs + t * Dv, o + n * os + t * Dv,
                                         den_any(fq, 0, z, zrows, sx, n, t, R, L) + eps, Dv,
                                         dnum + (n * R + t) * Dv);
}

/* dx[n, t] = (dphi[n, t] + c * vec[n, t / vrows]) * phi'(x[n, t]) with c = coef[n, t] (1 where
 * coef is NULL; no term where vec is NULL); zero where keep[n, t] == 0. x: the inputs, rows of
 * L with head stride xs; f = phi(x) in a buffer. */
void la_grad_phi(int kind, const float *dphi, const float *x, long xs, const float *f,
                 const float *coef, const float *vec, long vrows, long N, long T, long R, long L,
                 const unsigned char *keep, long ks, float *dx, long dxs) {
    for (long n = 0; n < N; ++n)
        for (long t = 0; t < T; ++t) {
            float *dst = dx + n * dxs + t * L;
            if (keep && !keep[n * ks + t]) {
                memset(dst, 0, (size_t)L * sizeof(float));
                continue;
            }
            grad_phi_row(kind, dst, dphi + (n * R + t) * L, coef ? coef[n * R + t] : 1.0f,
                         vec ? group_row(vec, vrows, n, t, R, L) : NULL, x + n * xs + t * L,
                         f + (n * R + t) * L, L);
        }
}

/* Causal chunks: A (B, C, C), float32 or bfloat16 (abf), loses its strictly upper triangle
 * (j > i) in place, and rs[b, i] = sum_{j <= i} A[b, i, j] (float32). */
void la_mask_rowsum(void *A, int abf, long B, long C, float *rs) {
    size_t es = abf ? 2 : 4;
    for (long b = 0; b < B; ++b)
        for (long i = 0; i < C; ++i) {
            long row = (b * C + i) * C;
            memset((char *)A + (row + i + 1) * es, 0, (size_t)(C - i - 1) * es);
            float s = 0.0f;
            for (long j = 0; j <= i; ++j) s += load_any(A, row + j, abf);
            rs[b * C + i] = s;
        }
}

/* The gradient of the masked scores: A[b, i, j] = A[b, i, j] + ds[b, i] for j <= i, else 0
 * (ds: the normaliser's gradient, as every kept score adds to the row's normaliser). */
void la_mask_add(float *A, long B, long C, const float *ds) {
    for (long b = 0; b < B; ++b)
        for (long i = 0; i < C; ++i) {
            float *row = A + (b * C + i) * C;
            float d = ds[b * C + i];
            for (long j = 0; j <= i; ++j) row[j] += d;
            memset(row + i + 1, 0, (size_t)(C - i - 1) * sizeof(float));
        }
}

/* Exclusive prefix sums over chunks, in place: P (N, n, F) of per-chunk sums becomes, chunk by
 * chunk, S0[h] + the sum of the chunks before it (after it, with reverse), and S1[h] (N, F)
 * receives the total S0[h] + all chunks. S1 may be S0. */
void la_prefix(float *P, long N, long n, long F, const float *S0, float *S1, int reverse) {
    for (long h = 0; h < N; ++h) {
        float *Ph = P + h * n * F;
        long j = 0;
        for (; j + W <= F; j += W) {
            vf run = vload(S0 + h * F + j);
            for (long i = 0; i < n; ++i) {
                float *p = Ph + (reverse ? n - 1 - i : i) * F + j;
                vf own = vload(p);
                vstore(p, run);
                run += own;
            }
            vstore(S1 + h * F + j, run);
        }
        for (; j < F; ++j) {
            float run = S0[h * F + j];
            for (long i = 0; i < n; ++i) {
                float *p = Ph + (reverse ? n - 1 - i : i) * F + j;
                float own = *p;
                *p = run;
                run += own;
            }
            S1[h * F + j] = run;
        }
    }
}

/* ------------------------------------------------------------------ causal forward, float32
 * One pass over chunks of C tokens that keeps every operand of a chunk in L1/L2 and skips the
 * zero half of the causal score block: per chunk
 *     num = phi(q) S + tril(phi(q) phi(k)^T) v,   den = phi(q) . z + rowsum(tril(...)),
 *     o = num / guarded(den + eps),   S += phi(k)^T v,   z += sum phi(k).
 * The products run through one register-blocked kernel, MR rows x NV vectors of W columns
 * (sized per ISA at the top of this file). */

/* C[i, 0:W nv] (+)= sum_{k < K} A[i * lda + k * ak] B[k * ldb + 0:W nv] for i < mr. */
static inline __attribute__((always_inline)) void tile(int mr, int nv, long K, const float *A,
                                                       long lda, long ak, const float *B,
                                                       long ldb, float *C, long ldc, int add) {
    vf acc[MR][NV];
    for (int i = 0; i < mr; ++i)
        for (int j = 0; j < nv; ++j)
            acc[i][j] = add ? vload(C + i * ldc + j * W) : vsplat(0.0f);
    for (long k = 0; k < K; ++k) {
        vf b[NV];
        for (int j = 0; j < nv; ++j) b[j] = vload(B + k * ldb + j * W);
        for (int i = 0; i < mr; ++i) {
            vf a = vsplat(A[i * lda + k * ak]);
            for (int j = 0; j < nv; ++j) acc[i][j] += a * b[j];
        }
    }
    for (int i = 0; i < mr; ++i)
        for (int j = 0; j < nv; ++j) vstore(C + i * ldc + j * W, acc[i][j]);
}

/* Dispatch to a tile specialised for (mr, nv): constant sizes keep the accumulators in
 * registers. */
static void tile_any(int mr, int nv, long K, const float *A, long lda, long ak, const float *B,
                     long ldb, float *C, long ldc, int add) {
/* Cases beyond this ISA's MR x NV are constant-false (and never asked for). */
#define T_(r, c)                                                                              \
    case r * 8 + c:                                                                           \
        if (r <= MR && c <= NV)                                                               \
            tile(r <= MR ? r : MR, c <= NV ? c : NV, K, A, lda, ak, B, ldb, C, ldc, add);     \
        break;
#define ROW_(r) T_(r, 1) T_(r, 2) T_(r, 3) T_(r, 4)
    switch (mr * 8 + nv) {
        ROW_(1) ROW_(2) ROW_(3) ROW_(4) ROW_(5) ROW_(6)
        default: break;
    }
#undef ROW_
#undef T_
}

/* C (M x Nc) (+)= A B with A[i, k] = A[i * lda + k * ak] (k < K, or k <= last row of the tile
 * when tri: A lower triangular) and B rows of Nc (a multiple of W). */
enum { FULL = 0, LOWER = 1, UPPER = 2 };

/* C (M x Nc) (+)= A B with A[i, k] = A[i * lda + k * ak], k < K, and B rows of Nc (a multiple
 * of 16). tri = LOWER: A is lower triangular, a row tile needs k <= its last row only;
 * UPPER: upper triangular, k >= its first row only. */
static void gemm(long M, long Nc, long K, const float *A, long lda, long ak, const float *B,
                 long ldb, float *C, long ldc, int add, int tri) {
    for (long i0 = 0; i0 < M; i0 += MR) {
        int mr = M - i0 < MR ? (int)(M - i0) : MR;
        long k0 = tri == UPPER ? (i0 < K ? i0 : K) : 0;
        long k1 = tri == LOWER ? (i0 + mr < K ? i0 + mr : K) : K;
        for (long j0 = 0; j0 < Nc; j0 += NV * W) {
            int nv = (Nc - j0) / W < NV ? (int)((Nc - j0) / W) : NV;
            tile_any(mr, nv, k1 - k0, A + i0 * lda + k0 * ak, lda, ak, B + k0 * ldb + j0, ldb,
                     C + i0 * ldc + j0, ldc, add);
        }
    }
}

/* dst (cols x rows) = src (rows x cols)^T, both dense. */
static void transpose(long rows, long cols, const float *src, float *dst) {
    for (long r = 0; r < rows; ++r)
        for (long c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
}

/* Scores of a chunk of Cn <= C rows: Acc[i, j] = fq_i . fk_j for j <= i, 0 above (fkT: L x C,
 * the keys' features transposed, zero beyond Cn; Acc rows of C); only the column vectors a row
 * tile can reach are computed. */
static void scores(long Cn, long C, long L, const float *fq, const float *fkT, float *Acc) {
    for (long i0 = 0; i0 < Cn; i0 += MR) {
        int mr = Cn - i0 < MR ? (int)(Cn - i0) : MR;
        long reach = i0 + mr; /* columns 0 .. reach-1 */
        for (long j0 = 0; j0 < reach; j0 += NV * W) {
            long left = (reach - j0 + W - 1) / W;
            int nv = left < NV ? (int)left : NV;
            tile_any(mr, nv, L, fq + i0 * L, L, 1, fkT + j0, C, Acc + i0 * C + j0, C, 0);
        }
        for (int i = 0; i < mr; ++i) /* the causal mask inside the diagonal tile */
            for (long j = i0 + i + 1; j < C; ++j) Acc[(i0 + i) * C + j] = 0.0f;
    }
}

/* The causal forward over T tokens of N heads, chunks of C (a multiple of W; L and Dv
 * multiples of W too). q, k: rows of L with head strides qs, ks; v: rows of Dv, stride vs;
 * out: rows of Dv, stride os; all float32, or all bfloat16 with bf. S (N, L, Dv) and z (N, L),
 * float32: the state before, updated in place to the state after. work: 2 C L + L C + C C +
 * 2 C Dv floats. Returns 0, or -1 on bad sizes. */
int la_causal_forward(int kind, int bf, const void *q, long qs, const void *k, long ks,
                      const void *v, long vs, long N, long T, long L, long Dv, long C, float eps,
                      float *S, float *z, void *out, long os, float *work) {
    if (C % W || L % W || Dv % W) return -1;
    float *fq = work, *fk = fq + C * L, *fkT = fk + C * L, *A = fkT + L * C, *num = A + C * C;
    float *vbuf = num + C * Dv;
    for (long n = 0; n < N; ++n) {
        float *Sn = S + n * L * Dv, *zn = z + n * L;
        for (long t0 = 0; t0 < T; t0 += C) {
            long Cn = T - t0 < C ? T - t0 : C;
            const float *vc = f32_rows(v, n * vs + t0 * Dv, bf, Cn * Dv, vbuf);
            phi_rows(kind, q, n * qs + t0 * L, bf, Cn * L, fq);
            phi_rows(kind, k, n * ks + t0 * L, bf, Cn * L, fk);
            if (Cn < C) /* a last, partial chunk: zero keys beyond it score 0 */
                memset(fk + Cn * L, 0, (size_t)((C - Cn) * L) * sizeof(float));
            transpose(C, L, fk, fkT);
            gemm(Cn, Dv, L, fq, L, 1, Sn, Dv, num, Dv, 0, FULL);   /* phi(q) S */
            scores(Cn, C, L, fq, fkT, A);                          /* tril(phi(q) phi(k)^T) */
            gemm(Cn, Dv, Cn, A, C, 1, vc, Dv, num, Dv, 1, LOWER);  /* + A v */
            for (long i = 0; i < Cn; ++i) {
                float den = causal_den(fq + i * L, zn, A + i * C, i, L);
                scale_row(out, n * os + (t0 + i) * Dv, bf, num + i * Dv,
                              1.0f / guarded(den, eps), Dv);
            }
            gemm(L, Dv, Cn, fk, 1, L, vc, Dv, Sn, Dv, 1, FULL);   /* S += phi(k)^T v */
            add_colsums(zn, zn, fk, NULL, Cn, L);
        }
    }
    return 0;
}

/* The causal backward over one block of T tokens (chunks of C; the same size rules as the
 * forward), all in one pass per head: the block's chunk states are recomputed from the state
 * before the block (S_in, z_in), then the chunks are walked in reverse with G, Gz = dL/d(state
 * after the chunk):
 *     dA = tril(dn v^T + ds),   dphi(q) = dA phi(k) + dn S_c^T + ds z_c,
 *     dphi(k) = dA^T phi(q) + v G^T + Gz,   dv = A^T dn + phi(k) G,
 *     G += phi(q)^T dn,   Gz += phi(q)^T ds,
 * with dn = g / s, ds = -(g . o) / s from the output o and its gradient g. G and Gz leave as
 * the gradient of the state before the block. dq, dk, dv: rows with head strides. work:
 * nc (2 C L + L Dv + L) + 2 C C + Dv C + 2 Dv L + 2 C L + C Dv + C floats, nc = ceil(T / C). */
int la_causal_backward(int kind, const float *q, long qs, const float *k, long ks,
                       const float *v, long vs, const float *o, long os, const float *g, long gs,
                       long N, long T, long L, long Dv, long C, float eps, const float *S_in,
                       const float *z_in, float *G, float *Gz, float *dq, long dqs, float *dk,
                       long dks, float *dv, long dvs, float *work) {
    if (C % W || L % W || Dv % W) return -1;
    long nc = (T + C - 1) / C;
    float *FQ = work, *FK = FQ + nc * C * L, *SB = FK + nc * C * L, *ZB = SB + nc * L * Dv;
    float *A = ZB + nc * L, *dA = A + C * C, *vT = dA + C * C, *ST = vT + Dv * C;
    float *GT = ST + Dv * L, *fkT = GT + Dv * L, *dphi = fkT + L * C, *dn = dphi + C * L;
    float *ds = dn + C * Dv;
    for (long n = 0; n < N; ++n) {
        float *Gn = G + n * L * Dv, *Gzn = Gz + n * L;
        /* Recompute the features and the state before each chunk. */
        memcpy(SB, S_in + n * L * Dv, (size_t)(L * Dv) * sizeof(float));
        memcpy(ZB, z_in + n * L, (size_t)L * sizeof(float));
        for (long c = 0; c < nc; ++c) {
            long t0 = c * C, Cn = T - t0 < C ? T - t0 : C;
            float *fq = FQ + c * C * L, *fk = FK + c * C * L;
            const float *qc = q + n * qs + t0 * L, *kc = k + n * ks + t0 * L;
            phi_rows(kind, qc, 0, 0, Cn * L, fq);
            phi_rows(kind, kc, 0, 0, Cn * L, fk);
            if (Cn < C) {
                memset(fq + Cn * L, 0, (size_t)((C - Cn) * L) * sizeof(float));
                memset(fk + Cn * L, 0, (size_t)((C - Cn) * L) * sizeof(float));
            }
            if (c + 1 < nc) {
                float *Sn = SB + (c + 1) * L * Dv, *zn = ZB + (c + 1) * L;
                memcpy(Sn, SB + c * L * Dv, (size_t)(L * Dv) * sizeof(float));
                gemm(L, Dv, Cn, fk, 1, L, v + n * vs + t0 * Dv, Dv, Sn, Dv, 1, FULL);
                add_colsums(zn, ZB + c * L, fk, NULL, Cn, L);
            }
        }
        for (long c = nc - 1; c >= 0; --c) {
            long t0 = c * C, Cn = T - t0 < C ? T - t0 : C;
            const float *fq = FQ + c * C * L, *fk = FK + c * C * L;
            const float *Sb = SB + c * L * Dv, *zb = ZB + c * L;
            const float *vc = v + n * vs + t0 * Dv;
            transpose(C, L, fk, fkT);
            scores(Cn, C, L, fq, fkT, A);
            for (long i = 0; i < Cn; ++i) /* the normaliser's and the output's gradients */
                ds[i] = grad_out_row(g + n * gs + (t0 + i) * Dv, o + n * os + (t0 + i) * Dv,
                                     causal_den(fq + i * L, zb, A + i * C, i, L) + eps, Dv,
                                     dn + i * Dv);
            for (long d = 0; d < Dv; ++d) /* vT[d, t] = v[t, d], zero beyond the chunk */
                for (long t = 0; t < C; ++t) vT[d * C + t] = t < Cn ? vc[t * Dv + d] : 0.0f;
            scores(Cn, C, Dv, dn, vT, dA);
            for (long i = 0; i < Cn; ++i)
                for (long j = 0; j <= i; ++j) dA[i * C + j] += ds[i];
            /* dq */
            transpose(L, Dv, Sb, ST);
            gemm(Cn, L, Cn, dA, C, 1, fk, L, dphi, L, 0, LOWER);
            gemm(Cn, L, Dv, dn, Dv, 1, ST, L, dphi, L, 1, FULL);
            for (long i = 0; i < Cn; ++i)
                grad_phi_row(kind, dq + n * dqs + (t0 + i) * L, dphi + i * L, ds[i], zb,
                             q + n * qs + (t0 + i) * L, fq + i * L, L);
            /* dk */
            transpose(L, Dv, Gn, GT);
            gemm(Cn, L, Cn, dA, 1, C, fq, L, dphi, L, 0, UPPER);
            gemm(Cn, L, Dv, vc, Dv, 1, GT, L, dphi, L, 1, FULL);
            for (long i = 0; i < Cn; ++i)
                grad_phi_row(kind, dk + n * dks + (t0 + i) * L, dphi + i * L, 1.0f, Gzn,
                             k + n * ks + (t0 + i) * L, fk + i * L, L);
            /* dv, written in place */
            float *dvc = dv + n * dvs + t0 * Dv;
            gemm(Cn, Dv, Cn, A, 1, C, dn, Dv, dvc, Dv, 0, UPPER);
            gemm(Cn, Dv, L, fk, L, 1, Gn, Dv, dvc, Dv, 1, FULL);
            /* the state's gradient, before this chunk */
            gemm(L, Dv, Cn, fq, 1, L, dn, Dv, Gn, Dv, 1, FULL);
            add_colsums(Gzn, Gzn, fq, ds, Cn, L);
        }
    }
    return 0;
}

/* ------------------------------------------------------------- non-causal, float32, one pass
 * Per head, chunk by chunk with the chunk's features in L1:
 *     keys:     S += phi(k)^T v,  z += sum phi(k)
 *     queries:  o = phi(q) S / guarded(phi(q) . z + eps)
 * Tq queries, Tk keys; q, k, v, out float32, or bfloat16 with bf; S (N, L, Dv), z (N, L)
 * float32 in/out (the sums include what they held). work: C L + 2 C Dv floats. */
int la_noncausal_forward(int kind, int bf, const void *q, long qs, const void *k, long ks,
                         const void *v, long vs, long N, long Tq, long Tk, long L, long Dv,
                         long C, float eps, float *S, float *z, void *out, long os,
                         float *work) {
    if (L % W || Dv % W) return -1;
    float *f = work, *num = f + C * L, *vbuf = num + C * Dv;
    for (long n = 0; n < N; ++n) {
        float *Sn = S + n * L * Dv, *zn = z + n * L;
        for (long t0 = 0; t0 < Tk; t0 += C) {
            long Cn = Tk - t0 < C ? Tk - t0 : C;
            phi_rows(kind, k, n * ks + t0 * L, bf, Cn * L, f);
            gemm(L, Dv, Cn, f, 1, L, f32_rows(v, n * vs + t0 * Dv, bf, Cn * Dv, vbuf), Dv, Sn,
                 Dv, 1, FULL);
            add_colsums(zn, zn, f, NULL, Cn, L);
        }
        for (long t0 = 0; t0 < Tq; t0 += C) {
            long Cn = Tq - t0 < C ? Tq - t0 : C;
            phi_rows(kind, q, n * qs + t0 * L, bf, Cn * L, f);
            gemm(Cn, Dv, L, f, L, 1, Sn, Dv, num, Dv, 0, FULL);
            for (long i = 0; i < Cn; ++i)
                scale_row(out, n * os + (t0 + i) * Dv, bf, num + i * Dv,
                              1.0f / guarded(dot(f + i * L, zn, L), eps), Dv);
        }
    }
    return 0;
}

/* Its backward: with dn = g / s, ds = -(g . o) / s per query row,
 *     G = G_in + sum phi(q)^T dn,  Gz = Gz_in + sum ds phi(q),
 *     dq = (dn S^T + ds z) phi'(q),  dk = (v G^T + Gz) phi'(k),  dv = phi(k) G.
 * S, z: the final sums of the forward; G, Gz in/out. The query pass (dq, G, Gz) runs over
 * the Tq queries, the key pass (dk, dv, from G and Gz) over the Tk keys; parts & 1 and parts & 2
 * select them, so that the query pass can be fed in blocks. work: 2 C L + 2 L Dv + C Dv. */
int la_noncausal_backward(int kind, int parts, const float *q, long qs, const float *k, long ks,
                          const float *v, long vs, const float *o, long os, const float *g,
                          long gs, long N, long Tq, long Tk, long L, long Dv, long C, float eps,
                          const float *S, const float *z, float *G, float *Gz, float *dq,
                          long dqs, float *dk, long dks, float *dv, long dvs, float *work) {
    if (L % W || Dv % W) return -1;
    if (!(parts & 1)) Tq = 0;
    if (!(parts & 2)) Tk = 0;
    float *f = work, *ST = f + C * L, *GT = ST + L * Dv, *dphi = GT + L * Dv;
    float ds[C];
    for (long n = 0; n < N; ++n) {
        const float *Sn = S + n * L * Dv, *zn = z + n * L;
        float *Gn = G + n * L * Dv, *Gzn = Gz + n * L;
        if (Tq) transpose(L, Dv, Sn, ST);
        for (long t0 = 0; t0 < Tq; t0 += C) {
            long Cn = Tq - t0 < C ? Tq - t0 : C;
            const float *qc = q + n * qs + t0 * L;
            phi_rows(kind, qc, 0, 0, Cn * L, f);
            float *dn = dphi; /* dn (Cn x Dv) first, then dphi reuses the space after G */
            for (long i = 0; i < Cn; ++i)
                ds[i] = grad_out_row(g + n * gs + (t0 + i) * Dv, o + n * os + (t0 + i) * Dv,
                                     dot(f + i * L, zn, L) + eps, Dv, dn + i * Dv);
            gemm(L, Dv, Cn, f, 1, L, dn, Dv, Gn, Dv, 1, FULL);
            add_colsums(Gzn, Gzn, f, ds, Cn, L);
            float *dfq = dphi + C * Dv;
            gemm(Cn, L, Dv, dn, Dv, 1, ST, L, dfq, L, 0, FULL);
            for (long i = 0; i < Cn; ++i)
                grad_phi_row(kind, dq + n * dqs + (t0 + i) * L, dfq + i * L, ds[i], zn,
                             qc + i * L, f + i * L, L);
        }
        if (Tk) transpose(L, Dv, Gn, GT);
        for (long t0 = 0; t0 < Tk; t0 += C) {
            long Cn = Tk - t0 < C ? Tk - t0 : C;
            const float *kc = k + n * ks + t0 * L, *vc = v + n * vs + t0 * Dv;
            phi_rows(kind, kc, 0, 0, Cn * L, f);
            gemm(Cn, L, Dv, vc, Dv, 1, GT, L, dphi, L, 0, FULL);
            for (long i = 0; i < Cn; ++i)
                grad_phi_row(kind, dk + n * dks + (t0 + i) * L, dphi + i * L, 1.0f, Gzn,
                             kc + i * L, f + i * L, L);
            gemm(Cn, Dv, L, f, L, 1, Gn, Dv, dv + n * dvs + t0 * Dv, Dv, 0, FULL);
        }
    }
    return 0;
}

/* ------------------------------------------------ the (gated) delta rule, forward, float32
 * Per head, state S (K x V, rows of V floats), token t with log-gate g_t (none: 0), strength
 * beta_t and q~ = s q_t, k~ = k_t (each divided by sqrt(sum x^2 + 1e-6) first with l2norm):
 *     a = exp(g_t),  u = beta_t (v_t - a S^T k~),  S <- a S + k~ u^T,
 *     o_t = S^T q~ = a (S_old^T q~) + (q~ . k~) u.
 * Column j of S, u and o depends on column j of S and v_t only, so the kernels walk one block
 * of columns (GDR_NB vectors) at a time, through all the tokens of a chunk of GDR_TC: the block
 * stays in L1, and the pass that writes token t's state also sums k~_{t+1}^T S and
 * q~_{t+1}^T S for the next token, so each token costs one pass over S (one load, one store
 * and four multiply-adds per element with a gate, three without). This is the sequential
 * recurrence, exact in float32 arithmetic: at K = V = 64 it needs fewer operations per token
 * (3 K V multiply-adds + K V multiplies) than the chunked WY form (3 K V + C (3 K / 2 + V)
 * multiply-adds) and no triangular solve.
 * The step is T = 1. */
#if LA_W == 8 || (LA_W == 4 && !(defined(__ARM_NEON) || defined(__ARM_NEON__)))
#define GDR_NB 2 /* 16 registers: u, two sums and a row of S per vector, plus broadcasts */
#else
#define GDR_NB 4 /* 32 registers (AVX-512, NEON), or scalars */
#endif
#define GDR_TC 64 /* tokens prepared at a time (normalised q, k; gates) */
#define GDR_EPS 1e-6f

/* Floats of work la_gdr_forward needs for a head dimension K. */
long la_gdr_work(long K) { return GDR_TC * (2 * K + 3); }

/* kacc = S^T kn, qacc = S^T qn over the block of nb vectors at S (rows of V). */
static inline __attribute__((always_inline)) void gdr_dots(int nb, long K, const float *S,
                                                           long V, const float *kn,
                                                           const float *qn, vf *kacc,
                                                           vf *qacc) {
    vf ka[GDR_NB], qa[GDR_NB];
    for (int j = 0; j < nb; ++j) ka[j] = qa[j] = vsplat(0.0f);
    for (long i = 0; i < K; ++i) {
        vf ki = vsplat(kn[i]), qi = vsplat(qn[i]);
        for (int j = 0; j < nb; ++j) {
            vf s = vload(S + i * V + j * W);
            ka[j] += ki * s;
            qa[j] += qi * s;
        }
    }
    for (int j = 0; j < nb; ++j) kacc[j] = ka[j], qacc[j] = qa[j];
}

/* Sout[i] = a Sin[i] + kn[i] u (i < K) over the block (a = 1 unless gated); with next, also
 * kacc = Sout^T kn1 and qacc = Sout^T qn1 (the next token's sums). Sout may be Sin. */
static inline __attribute__((always_inline)) void gdr_update(int nb, int gated, int next,
                                                             long K, const float *Sin,
                                                             float *Sout, long V, float a,
                                                             const float *kn, const vf *u,
                                                             const float *kn1,
                                                             const float *qn1, vf *kacc,
                                                             vf *qacc) {
    vf ka[GDR_NB], qa[GDR_NB], av = vsplat(a);
    for (int j = 0; j < nb; ++j) ka[j] = qa[j] = vsplat(0.0f);
    for (long i = 0; i < K; ++i) {
        vf ki = vsplat(kn[i]);
        vf k1 = vsplat(next ? kn1[i] : 0.0f), q1 = vsplat(next ? qn1[i] : 0.0f);
        for (int j = 0; j < nb; ++j) {
            vf s = vload(Sin + i * V + j * W);
            s = gated ? av * s + ki * u[j] : s + ki * u[j];
            vstore(Sout + i * V + j * W, s);
            if (next) {
                ka[j] += k1 * s;
                qa[j] += q1 * s;
            }
        }
    }
    if (next)
        for (int j = 0; j < nb; ++j) kacc[j] = ka[j], qacc[j] = qa[j];
}

/* Tokens [0, Tc) of one head's prepared chunk (qn, kn rows of K; a, b, qk one per token) over
 * the block of nb vectors of columns at Sin / Sout / v / o (offset to the block already): the
 * first token reads Sin, every token writes Sout (which may be Sin). v, o: token strides vt,
 * ot. */
static inline __attribute__((always_inline)) void gdr_cols(int nb, int gated, long Tc, long K,
                                                           long V, const float *qn,
                                                           const float *kn, const float *a,
                                                           const float *b, const float *qk,
                                                           const float *v, long vt,
                                                           const float *Sin, float *Sout,
                                                           float *o, long ot) {
    vf ka[GDR_NB], qa[GDR_NB], u[GDR_NB];
    gdr_dots(nb, K, Sin, V, kn, qn, ka, qa);
    for (long t = 0; t < Tc; ++t) {
        float at = gated ? a[t] : 1.0f;
        vf bt = vsplat(b[t]), qkt = vsplat(qk[t]);
        for (int j = 0; j < nb; ++j) {
            vf vj = vload(v + t * vt + j * W);
            u[j] = gated ? bt * (vj - at * ka[j]) : bt * (vj - ka[j]);
            vstore(o + t * ot + j * W, (gated ? at * qa[j] : qa[j]) + qkt * u[j]);
        }
        const float *src = t == 0 ? Sin : Sout;
        if (t + 1 < Tc)
            gdr_update(nb, gated, 1, K, src, Sout, V, at, kn + t * K, u, kn + (t + 1) * K,
                       qn + (t + 1) * K, ka, qa);
        else
            gdr_update(nb, gated, 0, K, src, Sout, V, at, kn + t * K, u, NULL, NULL, ka, qa);
    }
}

/* gdr_cols specialised for constant (nb, gated): the sums stay in registers. */
static void gdr_cols_any(int nb, int gated, long Tc, long K, long V, const float *qn,
                         const float *kn, const float *a, const float *b, const float *qk,
                         const float *v, long vt, const float *Sin, float *Sout, float *o,
                         long ot) {
/* Cases beyond this ISA's GDR_NB are constant-false (and never asked for). */
#define G_(c, gt)                                                                             \
    case c * 2 + gt:                                                                          \
        if (c <= GDR_NB)                                                                      \
            gdr_cols(c <= GDR_NB ? c : GDR_NB, gt, Tc, K, V, qn, kn, a, b, qk, v, vt, Sin,    \
                     Sout, o, ot);                                                            \
        break;
    switch (nb * 2 + gated) {
        G_(1, 0) G_(1, 1) G_(2, 0) G_(2, 1) G_(3, 0) G_(3, 1) G_(4, 0) G_(4, 1)
        default: break;
    }
#undef G_
}

/* Prepare Tc tokens: qn = s q (/ |q|), kn = k (/ |k|), a = exp(g) (1 without g), b = beta,
 * qk = qn . kn. q, k: token strides qt, kt; beta, g: one float per token. */
static void gdr_prep(long Tc, long K, const float *q, long qt, const float *k, long kt,
                     const float *beta, const float *g, float scale, int l2norm, float *qn,
                     float *kn, float *a, float *b, float *qk) {
    for (long t = 0; t < Tc; ++t) {
        const float *qr = q + t * qt, *kr = k + t * kt;
        float sq = scale, sk = 1.0f;
        if (l2norm) {
            sq *= 1.0f / sqrtf(dot(qr, qr, K) + GDR_EPS);
            sk = 1.0f / sqrtf(dot(kr, kr, K) + GDR_EPS);
        }
        scale_row(qn + t * K, 0, 0, qr, sq, K);
        scale_row(kn + t * K, 0, 0, kr, sk, K);
        /* a subnormal decay (g in (-104, -87]) would make subnormal states, which cost
         * microcode assists in every later pass: 0 instead (sexp_nonpos flushes below -87) */
        a[t] = g ? sexp_nonpos(g[t]) : 1.0f;
        b[t] = beta[t];
        qk[t] = dot(qn + t * K, kn + t * K, K);
    }
}

/* The (gated) delta rule over T tokens of N heads (T = 1: one decoding step), columns
 * [v0, v1) of the state and the output (all V columns: v0 = 0, v1 = V; a subset lets threads
 * share one head). q, k: rows of K with head strides qs, ks and token strides qt, kt; v, o:
 * rows of V (head strides vs, os; token strides vt, ot); beta, g: T floats per head (head
 * strides bs, gs), g NULL for the ungated rule; S_in, S_out: (N, K, V) contiguous, S_out may
 * be S_in (in place). work: la_gdr_work(K) floats. Returns 0, or -1 on sizes it does not take
 * (V, v0, v1 multiples of the vector width W, 0 <= v0 <= v1 <= V, K >= 1). */
int la_gdr_forward(const float *q, long qs, long qt, const float *k, long ks, long kt,
                   const float *v, long vs, long vt, const float *beta, long bs, const float *g,
                   long gs, long N, long T, long K, long V, long v0, long v1, float scale,
                   int l2norm, const float *S_in, float *S_out, float *o, long os, long ot,
                   float *work) {
    if (K < 1 || V % W || v0 % W || v1 % W || v0 < 0 || v1 > V || v0 > v1 || N < 0 || T < 0)
        return -1;
    float *qn = work, *kn = qn + GDR_TC * K, *a = kn + GDR_TC * K, *b = a + GDR_TC;
    float *qk = b + GDR_TC;
    for (long n = 0; n < N; ++n) {
        const float *Sin = S_in + n * K * V;
        float *Sout = S_out + n * K * V;
        if (T == 0 && Sin != Sout)
            for (long i = 0; i < K; ++i)
                memcpy(Sout + i * V + v0, Sin + i * V + v0, (size_t)(v1 - v0) * sizeof(float));
        for (long t0 = 0; t0 < T; t0 += GDR_TC) {
            long Tc = T - t0 < GDR_TC ? T - t0 : GDR_TC;
            gdr_prep(Tc, K, q + n * qs + t0 * qt, qt, k + n * ks + t0 * kt, kt,
                     beta + n * bs + t0, g ? g + n * gs + t0 : NULL, scale, l2norm, qn, kn, a,
                     b, qk);
            for (long j0 = v0; j0 < v1; j0 += GDR_NB * W) {
                int nb = (v1 - j0) / W < GDR_NB ? (int)((v1 - j0) / W) : GDR_NB;
                gdr_cols_any(nb, g != NULL, Tc, K, V, qn, kn, a, b, qk,
                             v + n * vs + t0 * vt + j0, vt, (t0 == 0 ? Sin : Sout) + j0,
                             Sout + j0, o + n * os + t0 * ot + j0, ot);
            }
        }
    }
    return 0;
}

/* One decoding step of N heads with contiguous rows (q, k (N, K); v, o (N, V); beta, g (N)):
 * la_gdr_forward with T = 1, in fewer arguments (each costs the ctypes call time). */
int la_gdr_step(const float *q, const float *k, const float *v, const float *beta,
                const float *g, long N, long K, long V, float scale, int l2norm,
                const float *S_in, float *S_out, float *o, float *work) {
    return la_gdr_forward(q, K, K, k, K, K, v, V, V, beta, 1, g, 1, N, 1, K, V, 0, V, scale,
                          l2norm, S_in, S_out, o, V, V, work);
}
