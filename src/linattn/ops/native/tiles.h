#ifndef LA_TILES_H
#define LA_TILES_H
/* The register-blocked products of the compiled kernels (linattn.ops.native): float32 tiles of
 * MR rows x NV vectors of accumulators (common.h), the gemm that walks them (full, lower or
 * upper triangular A), a causal chunk's scores, W x W transposes; where the build has
 * AVX512-BF16, the same products on bfloat16 pairs (vdpbf16ps, AMX tiles) and the recurrences'
 * bfloat16 chunks (chunk_dp). Joined after common.h into the library's one translation unit. */
#ifndef LA_COMMON_H
#include "common.h"
#endif
#ifndef LA_AHEAD_H
#include "ahead.h"
#endif
/* (Functions that not every kernels.c calls are marked unused: each also compiles on its own.) */

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

/* A switch over the tile shape (mr, nv), mr <= 6, nv <= 4, that calls TILE(mr, nv, ...) with
 * both sizes constant, so that the accumulators stay in registers; the shapes beyond this
 * ISA's MR x NV are constant-false (and never asked for). Both tile kinds dispatch through it. */
#define LA_TILE_CASE(TILE, r, c, ...)                                                        \
    case r * 8 + c:                                                                           \
        if (r <= MR && c <= NV) TILE(r <= MR ? r : MR, c <= NV ? c : NV, __VA_ARGS__);       \
        break;
#define LA_TILE_ROW(TILE, r, ...)                                                            \
    LA_TILE_CASE(TILE, r, 1, __VA_ARGS__) LA_TILE_CASE(TILE, r, 2, __VA_ARGS__)              \
    LA_TILE_CASE(TILE, r, 3, __VA_ARGS__) LA_TILE_CASE(TILE, r, 4, __VA_ARGS__)
#define LA_TILE_SWITCH(TILE, mr, nv, ...)                                                    \
    switch ((mr) * 8 + (nv)) {                                                                \
        LA_TILE_ROW(TILE, 1, __VA_ARGS__) LA_TILE_ROW(TILE, 2, __VA_ARGS__)                   \
        LA_TILE_ROW(TILE, 3, __VA_ARGS__) LA_TILE_ROW(TILE, 4, __VA_ARGS__)                   \
        LA_TILE_ROW(TILE, 5, __VA_ARGS__) LA_TILE_ROW(TILE, 6, __VA_ARGS__)                   \
        default: break;                                                                       \
    }

/* The same for a block of nb <= 4 column vectors and a flag f (0 or 1): FN(nb, f, ...) with
 * both constant; blocks beyond this ISA's NV are constant-false (and never asked for). The
 * recurrent forms (ops/linear/kernels_forms.c) dispatch through it. */
#define LA_BLOCK_CASE(FN, c, f, ...)                                                         \
    case c * 2 + f:                                                                           \
        if (c <= NV) FN(c <= NV ? c : NV, f, __VA_ARGS__);                                    \
        break;
#define LA_BLOCK_SWITCH(FN, nb, f, ...)                                                      \
    switch ((nb) * 2 + (f)) {                                                                 \
        LA_BLOCK_CASE(FN, 1, 0, __VA_ARGS__) LA_BLOCK_CASE(FN, 1, 1, __VA_ARGS__)             \
        LA_BLOCK_CASE(FN, 2, 0, __VA_ARGS__) LA_BLOCK_CASE(FN, 2, 1, __VA_ARGS__)             \
        LA_BLOCK_CASE(FN, 3, 0, __VA_ARGS__) LA_BLOCK_CASE(FN, 3, 1, __VA_ARGS__)             \
        LA_BLOCK_CASE(FN, 4, 0, __VA_ARGS__) LA_BLOCK_CASE(FN, 4, 1, __VA_ARGS__)             \
        default: break;                                                                       \
    }

static void tile_any(int mr, int nv, long K, const float *A, long lda, long ak, const float *B,
                     long ldb, float *C, long ldc, int add) {
    LA_TILE_SWITCH(tile, mr, nv, K, A, lda, ak, B, ldb, C, ldc, add)
}

/* The rows of the next register tile when `left` rows remain: MR, except that a remainder
 * between MR and 2 MR is split in two near-equal tiles (32 rows: 6, 6, 6, 6, 4, 4 rather than
 * ..., 6, 2, whose last tile would cost a full tile's loads for a third of its work). */
static inline long row_tile(long left) {
    return left <= MR ? left : left < 2 * MR ? (left + 1) / 2 : MR;
}

enum { FULL = 0, LOWER = 1, UPPER = 2 };

/* C (M x Nc) (+)= A B with A[i, k] = A[i * lda + k * ak], k < K, and B rows of Nc (a multiple
 * of 16). tri = LOWER: A is lower triangular, a row tile needs k <= its last row only;
 * UPPER: upper triangular, k >= its first row only. */
__attribute__((unused)) static void gemm(long M, long Nc, long K, const float *A, long lda,
                                         long ak, const float *B, long ldb, float *C, long ldc,
                                         int add, int tri) {
    for (long i0 = 0, mr; i0 < M; i0 += mr) {
        mr = row_tile(M - i0);
        long k0 = tri == UPPER ? (i0 < K ? i0 : K) : 0;
        long k1 = tri == LOWER ? (i0 + mr < K ? i0 + mr : K) : K;
        for (long j0 = 0; j0 < Nc; j0 += NV * W) {
            int nv = (Nc - j0) / W < NV ? (int)((Nc - j0) / W) : NV;
            tile_any((int)mr, nv, k1 - k0, A + i0 * lda + k0 * ak, lda, ak, B + k0 * ldb + j0,
                     ldb, C + i0 * ldc + j0, ldc, add);
        }
    }
}

/* dst[c * ds + r] = src[r * ss + c] for r, c < W: one W x W block transposed in registers
 * (unpacks within 128-bit lanes, then whole lanes moved), where the ISA has the shuffles; a
 * scalar block transpose costs ~2 instructions per element and was 40 % of the causal
 * forward's time outside the products. */
static inline void transpose_block(const float *src, long ss, float *dst, long ds) {
#if defined(__AVX512F__) && LA_W == 16
    __m512 r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * ss);
    for (int i = 0; i < 16; i += 2) { /* pairs of rows interleaved, per 128-bit lane */
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int g = 0; g < 16; g += 4) { /* r[g + c], lane l: column 4 l + c of rows g .. g + 3 */
        __m512d a = _mm512_castps_pd(t[g]), b = _mm512_castps_pd(t[g + 1]);
        __m512d c = _mm512_castps_pd(t[g + 2]), d = _mm512_castps_pd(t[g + 3]);
        r[g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int c = 0; c < 4; ++c) { /* output row 4 l + c: lane l of r[c], r[4 + c], ... */
        __m512 u0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x44);
        __m512 u1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xEE);
        __m512 u2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x44);
        __m512 u3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xEE);
        _mm512_storeu_ps(dst + c * ds, _mm512_shuffle_f32x4(u0, u2, 0x88));
        _mm512_storeu_ps(dst + (4 + c) * ds, _mm512_shuffle_f32x4(u0, u2, 0xDD));
        _mm512_storeu_ps(dst + (8 + c) * ds, _mm512_shuffle_f32x4(u1, u3, 0x88));
        _mm512_storeu_ps(dst + (12 + c) * ds, _mm512_shuffle_f32x4(u1, u3, 0xDD));
    }
#elif defined(__AVX__) && LA_W == 8
    __m256 r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * ss);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int g = 0; g < 8; g += 4) {
        __m256d a = _mm256_castps_pd(t[g]), b = _mm256_castps_pd(t[g + 1]);
        __m256d c = _mm256_castps_pd(t[g + 2]), d = _mm256_castps_pd(t[g + 3]);
        r[g] = _mm256_castpd_ps(_mm256_unpacklo_pd(a, c));
        r[g + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(a, c));
        r[g + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(b, d));
        r[g + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(b, d));
    }
    for (int c = 0; c < 4; ++c) {
        _mm256_storeu_ps(dst + c * ds, _mm256_permute2f128_ps(r[c], r[4 + c], 0x20));
        _mm256_storeu_ps(dst + (4 + c) * ds, _mm256_permute2f128_ps(r[c], r[4 + c], 0x31));
    }
#else
    for (long r = 0; r < W; ++r)
        for (long c = 0; c < W; ++c) dst[c * ds + r] = src[r * ss + c];
#endif
}

/* dst (cols x rows) = src (rows x cols)^T, both dense: W x W blocks, then the edges. */
__attribute__((unused)) static void transpose(long rows, long cols, const float *src,
                                              float *dst) {
    long r0 = rows - rows % W, c0 = cols - cols % W;
    for (long r = 0; r < r0; r += W)
        for (long c = 0; c < c0; c += W) transpose_block(src + r * cols + c, cols, dst + c * rows + r, rows);
    for (long r = 0; r < rows; ++r)
        for (long c = r < r0 ? c0 : 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
}

/* The causal mask inside a row tile of scores (rows i0 .. i0 + mr - 1, rows of C): zero above
 * the diagonal. */
static inline void mask_above(float *Acc, long C, long i0, long mr) {
    for (long i = i0; i < i0 + mr; ++i) { /* to a vector's edge, then whole vectors (C % W == 0) */
        long j = i + 1;
        for (; j < C && j % W; ++j) Acc[i * C + j] = 0.0f;
        for (; j < C; j += W) vstore(Acc + i * C + j, vsplat(0.0f));
    }
}

/* Scores of a chunk of Cn <= C rows: Acc[i, j] = fq_i . fk_j for j <= i, 0 above (fkT: L x C,
 * the keys' features transposed, zero beyond Cn; Acc rows of C); only the column vectors a row
 * tile can reach are computed. */
__attribute__((unused)) static void scores(long Cn, long C, long L, const float *fq,
                                           const float *fkT, float *Acc) {
    for (long i0 = 0, mr; i0 < Cn; i0 += mr) {
        mr = row_tile(Cn - i0);
        long reach = i0 + mr; /* columns 0 .. reach-1 */
        for (long j0 = 0; j0 < reach; j0 += NV * W) {
            long left = (reach - j0 + W - 1) / W;
            int nv = left < NV ? (int)left : NV;
            tile_any((int)mr, nv, L, fq + i0 * L, L, 1, fkT + j0, C, Acc + i0 * C + j0, C, 0);
        }
        mask_above(Acc, C, i0, mr);
    }
}

#if defined(HAVE_CVTNEPS2BF16) && defined(__AVX512BW__)
#define LA_DP_BF16 1
/* ------------------------------------------------ bfloat16 dot products (AVX512-BF16)
 * (ops/linear/kernels.c's one-pass forwards for bfloat16 inputs.) Products on vdpbf16ps: each float32 lane of an accumulator adds
 * two bfloat16 products, a pair along the reduced dimension, so an operand is stored as pairs
 * (one u32: the even element in the low half, the odd one in the high half) and the products
 * run at twice the FMA rate. Keys: S += phi(k)^T v reduces over tokens, so the pairs are
 * (token 2p, token 2p + 1): phi(k) rounded to bfloat16 and paired row by row (kp: C/2 rows of
 * L, read by broadcast), v paired the same way (vp: C/2 rows of Dv). Queries: num = phi(q) S
 * reduces over features: phi(q) rounded to bfloat16 is already paired in its rows, and S is
 * rounded and paired once per head (Sp: L/2 rows of Dv). Sums, z and the normaliser stay
 * float32 (phi unrounded in z and the normaliser).
 * Error, u = 2^-8 the bfloat16 unit roundoff: rounding phi(k), phi(q) and S moves each
 * numerator term by at most 3u of sum_t phi(q).phi(k_t) |v_tj|, so |o_j - exact| <= 3u
 * max_t |v_tj| + u |o_j| (the output's own rounding) + float32 sums. The non-causal form
 * makes phi to 2^-17 (vphi_as coarse, a degree-4 exp: 5 % of its time; the float32 forms' is
 * ~1 ulp): each weight phi(q).phi(k) then moves by 2^-16 of itself at most, the output by
 * 4 2^-17 max_t |v_tj| at most (1/400 of the 3u). */
typedef unsigned u32;

/* (lo[i], hi[i]) rounded to bfloat16 pairs, i < 16: cvtne2ps_pbh(hi, lo) puts lo's 16 values
 * in the low 256 bits and hi's in the high ones; interleaving those halves 16-bit-wise makes
 * the pairs. */
static inline __m512i bf16_pairs(vf lo, vf hi) {
    __m512i both = (__m512i)_mm512_cvtne2ps_pbh((__m512)hi, (__m512)lo);
    __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                   23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(idx, both);
}

/* dst[j] = (x[a + j], x[b + j]) as a bfloat16 pair for j < n (n a multiple of 16); b < 0: 0. */
static inline void pair_rows(const void *x, int bf, long a, long b, long n, u32 *dst) {
    for (long j = 0; j < n; j += 16) {
        vf hi = b < 0 ? vsplat(0.0f) : vload_any(x, b + j, bf);
        _mm512_storeu_si512((void *)(dst + j), bf16_pairs(vload_any(x, a + j, bf), hi));
    }
}

/* C[i, 0:16 nv] (+)= sum_{p < P} pair(A[i * lda + p * ap]) . pair(B[p * ldb + 0:16 nv]). */
static inline __attribute__((always_inline)) void tile_dp(int mr, int nv, long P, const u32 *A,
                                                          long lda, long ap, const u32 *B,
                                                          long ldb, float *C, long ldc,
                                                          int add) {
    __m512 acc[MR][NV];
    for (int i = 0; i < mr; ++i)
        for (int j = 0; j < nv; ++j)
            acc[i][j] = add ? _mm512_loadu_ps(C + i * ldc + j * 16) : _mm512_setzero_ps();
    for (long p = 0; p < P; ++p) {
        __m512bh b[NV];
        for (int j = 0; j < nv; ++j) b[j] = (__m512bh)_mm512_loadu_si512(B + p * ldb + j * 16);
        for (int i = 0; i < mr; ++i) {
            __m512bh a = (__m512bh)_mm512_set1_epi32((int)A[i * lda + p * ap]);
            for (int j = 0; j < nv; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], a, b[j]);
        }
    }
    for (int i = 0; i < mr; ++i)
        for (int j = 0; j < nv; ++j) _mm512_storeu_ps(C + i * ldc + j * 16, acc[i][j]);
}

static void tile_dp_any(int mr, int nv, long P, const u32 *A, long lda, long ap, const u32 *B,
                        long ldb, float *C, long ldc, int add) {
    LA_TILE_SWITCH(tile_dp, mr, nv, P, A, lda, ap, B, ldb, C, ldc, add)
}

/* gemm_dp on vdpbf16ps (register tiles). */
static void gemm_dp_vec(long M, long Nc, long P, const u32 *A, long lda, long ap, const u32 *B,
                        long ldb, float *C, long ldc, int add, int lower) {
    for (long i0 = 0, mr; i0 < M; i0 += mr) {
        mr = row_tile(M - i0);
        long Pt = lower && (i0 + mr + 1) / 2 < P ? (i0 + mr + 1) / 2 : P;
        for (long j0 = 0; j0 < Nc; j0 += NV * 16) {
            int nv = (Nc - j0) / 16 < NV ? (int)((Nc - j0) / 16) : NV;
            tile_dp_any((int)mr, nv, Pt, A + i0 * lda, lda, ap, B + j0, ldb, C + i0 * ldc + j0,
                        ldc, add);
        }
    }
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#define LA_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
/* ------------------------------------------------ bfloat16 products on AMX tiles
 * (Intel Xeon from Sapphire Rapids.) One tdpbf16ps multiplies a 16 x 32 bfloat16 tile by a
 * 32 x 16 one into 16 x 16 float32 sums: 8,192 multiply-adds, where vdpbf16ps does 32 (and on
 * these cores at half the float32 FMA rate: 108 against 215 GFLOP/s, so that the dot-product
 * forms lost to float32 there). The operands are the pair layout above as it stands: an A tile
 * is 16 rows of 16 pairs (pairs contiguous along a row), a B tile 16 rows of pairs of 16
 * columns. Linux hands the tile registers out on request, once per process (arch_prctl);
 * la_amx_use(0) keeps them off (LINATTN_AMX=0: the vdpbf16ps forms run instead). */
static int amx_state = -1; /* -1: not asked yet */

static int amx_request(void) {
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
}

static int amx_ready(void) {
    int s = __atomic_load_n(&amx_state, __ATOMIC_RELAXED);
    if (s < 0) {
        s = amx_request();
        __atomic_store_n(&amx_state, s, __ATOMIC_RELAXED);
    }
    return s;
}

/* Palette 1, eight tiles of 16 rows of 64 bytes (the tile configuration is per thread). */
static inline void amx_configure(void) {
    struct {
        unsigned char palette, start_row, reserved[14];
        unsigned short colsb[16];
        unsigned char rows[16];
    } cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    _tile_loadconfig(&cfg);
}

/* The configuration held across a kernel's products: amx_hold() at a form's start configures
 * the tiles once for all its products on this thread, amx_unhold(what it returned) releases
 * them before the kernel returns (never across calls: torch's oneDNN configures the tiles its
 * own way between them). Configured and released around each product instead, ldtilecfg took
 * a fifth of the products' time (the delta rule's chunks, Intel Xeon with AMX). Nested holds
 * return 0 and leave the release to the outermost. */
static __thread int amx_held;
static inline int amx_hold(void) {
    if (amx_held || !amx_ready()) return 0;
    amx_configure();
    return amx_held = 1;
}
static inline void amx_unhold(int held) {
    if (!held) return;
    _tile_release();
    amx_held = 0;
}

/* C (M x Nc) (+)= A B over P pairs on tiles, M, Nc, P multiples of 16, A's pairs contiguous in
 * its rows (ap = 1). Output tiles in 2 x 2 groups (tiles 0-3) over their A rows (4, 5) and B
 * columns (6, 7), so that each operand loaded serves two products. */
static void gemm_amx(long M, long Nc, long P, const u32 *A, long lda, const u32 *B, long ldb,
                     float *C, long ldc, int add) {
    long as = lda * 4, bs = ldb * 4, cs = ldc * 4;
    int held = amx_hold(); /* 0 where the caller holds the tiles */
    for (long i0 = 0; i0 < M; i0 += 32) {
        int two_i = M - i0 >= 32;
        for (long j0 = 0; j0 < Nc; j0 += 32) {
            int two_j = Nc - j0 >= 32;
            float *c = C + i0 * ldc + j0, *c2 = c + 16 * ldc;
            if (add) {
                _tile_loadd(0, c, cs);
                if (two_j) _tile_loadd(1, c + 16, cs);
                if (two_i) _tile_loadd(2, c2, cs);
                if (two_i && two_j) _tile_loadd(3, c2 + 16, cs);
            } else {
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
            }
            for (long p0 = 0; p0 < P; p0 += 16) {
                const u32 *a = A + i0 * lda + p0, *b = B + p0 * ldb + j0;
                _tile_loadd(4, a, as);
                _tile_loadd(6, b, bs);
                _tile_dpbf16ps(0, 4, 6);
                if (two_j) {
                    _tile_loadd(7, b + 16, bs);
                    _tile_dpbf16ps(1, 4, 7);
                }
                if (two_i) {
                    _tile_loadd(5, a + 16 * lda, as);
                    _tile_dpbf16ps(2, 5, 6);
                    if (two_j) _tile_dpbf16ps(3, 5, 7);
                }
            }
            _tile_stored(0, c, cs);
            if (two_j) _tile_stored(1, c + 16, cs);
            if (two_i) _tile_stored(2, c2, cs);
            if (two_i && two_j) _tile_stored(3, c2 + 16, cs);
        }
    }
    amx_unhold(held);
}
#else
static inline int amx_hold(void) { return 0; }
static inline void amx_unhold(int held) { (void)held; }
#endif /* AMX */

/* C (M x Nc) (+)= A B over P pairs, Nc a multiple of 16 (gemm's tiling); lower: A is lower
 * triangular in its elements, so a row tile reads the pairs up to its last row's only. On AMX
 * tiles where the CPU and the operands allow (pairs contiguous in A's rows): the multiples of
 * 16 there, the rest of the rows and pairs on vdpbf16ps (a triangular A is zero above its
 * diagonal, so the tiles take it whole). */
static void gemm_dp(long M, long Nc, long P, const u32 *A, long lda, long ap, const u32 *B,
                    long ldb, float *C, long ldc, int add, int lower) {
#if defined(LA_AMX)
    long M16 = M & ~15L, P16 = P & ~15L;
    if (ap == 1 && M16 && P16 && amx_ready()) {
        gemm_amx(M16, Nc, P16, A, lda, B, ldb, C, ldc, add);
        if (P16 < P)
            gemm_dp_vec(M16, Nc, P - P16, A + P16, lda, 1, B + P16 * ldb, ldb, C, ldc, 1, 0);
        if (M16 < M)
            gemm_dp_vec(M - M16, Nc, P, A + M16 * lda, lda, 1, B, ldb, C + M16 * ldc, ldc, add,
                        0);
        return;
    }
#endif
    gemm_dp_vec(M, Nc, P, A, lda, ap, B, ldb, C, ldc, add, lower);
}

/* Whether gemm_dp multiplies on AMX tiles in this process: where it does, a form lays its
 * operands out for them (pairs along A's rows) and takes the chunked products over the
 * recurrences. */
static inline int dp_on_tiles(void) {
#if defined(LA_AMX)
    return amx_ready();
#else
    return 0;
#endif
}

/* scores() on pairs: Acc[i, j] = phi(q_i) . phi(k_j) for j <= i, 0 above, from phi(q) rounded
 * and paired along the features (fqp: rows of L / 2 pairs) and phi(k) likewise, transposed as
 * pairs (fkTp: L / 2 rows of C, zero beyond Cn). On tiles the whole square is multiplied, then
 * masked: a tile product costs less than the bookkeeping of skipping it. */
__attribute__((unused)) static void scores_dp(long Cn, long C, long L, const u32 *fqp,
                                              const u32 *fkTp, float *Acc) {
    if (Cn >= 16 && dp_on_tiles()) {
        gemm_dp(Cn, C, L / 2, fqp, L / 2, 1, fkTp, C, Acc, C, 0, 0);
        mask_above(Acc, C, 0, Cn);
        return;
    }
    for (long i0 = 0, mr; i0 < Cn; i0 += mr) {
        mr = row_tile(Cn - i0);
        long reach = i0 + mr;
        for (long j0 = 0; j0 < reach; j0 += NV * 16) {
            long left = (reach - j0 + 15) / 16;
            tile_dp_any((int)mr, left < NV ? (int)left : NV, L / 2, fqp + i0 * (L / 2), L / 2,
                        1, fkTp + j0, C, Acc + i0 * C + j0, C, 0);
        }
        mask_above(Acc, C, i0, mr);
    }
}

/* x rows of n floats (a multiple of W) to bfloat16 in dst (rows of n), for rows < rows. */
static inline void bf16_rows(const float *x, long rows, long n, u16 *dst) {
    for (long i = 0; i < rows * n; i += W) vstore_any(dst, i, vload(x + i), 1);
}
/* ------------------------------------- recurrences' chunks on bfloat16 products (AMX tiles)
 * A whole chunk of C tokens (a multiple of 32, at most 64) of one head of a gated recurrence in
 * its chunked form, the products on gemm_dp: GLA's (delta 0) and the delta rule's (delta 1),
 * one scalar log-gate per token or none. With S the state before the chunk, b_t the gates' sum
 * up to token t in it, g_t = exp(b_t), Gam_ij = exp(b_i - b_j) (j <= i), q~ = s q (and, with
 * l2norm, q~ and k~ divided by sqrt(sum x^2 + eps)):
 *     GLA:   U' = V;
 *     delta: L = strictly lower(beta_i Gam_ij k~_i . k~_j),  U' = (I + L)^-1 beta o (V - g o K~S);
 *     O = [g o Q~ | lower(Gam o Q~ K~^T)] [S; U'],   S <- g_C S + (exp(b_C - b) o K~)^T U'.
 * These are the recurrences in exact arithmetic (for the delta rule: u_t + beta_t
 * sum_{j<t} Gam_tj k~_t.k~_j u_j = beta_t (v_t - g_t S^T k~_t)). Three products per chunk
 * (GLA) or six (delta), summed in float32: q and k enter Q K^T, K K^T and K S as given (their
 * scales on the float32 sums), the other operands rounded to bfloat16 (S, V or Tinv and the
 * right-hand side and U', g o q~ and the masked scores, the decayed keys); L, Tinv =
 * (I + L)^-1 (forward substitution) and U' are float32, and so is the state. The
 * passes between the products are fused so that each chunk's operands cross the cache once:
 * they do not fit in L1, and a pass over one 64 x 64 float32 block from L2 cost ~0.35 us on
 * an Intel Xeon with AMX, as much as a product on tiles. The kernels take it for bfloat16 rows
 * where gemm_dp runs on tiles (dp_on_tiles), K and V multiples of 32 (whole tiles of pairs). */
#define LA_CHUNK_MAX 64
#define LA_CHUNK_CV (LA_CHUNK_MAX / 16) /* vectors in a row of the longest chunk */

/* Floats of scratch chunk_dp needs (u32 pairs count as floats). */
static inline long chunk_dp_work(long C, long K, long V) {
    return 5 * C + 3 * C * C + 2 * C * V                                /* float32 */
           + 3 * C * K / 2 + K * V / 2 + C * V + C * (K + C) / 2 + C * C / 2; /* pairs */
}

/* Whether bfloat16 rows x (head stride hs, token stride ts, in elements) are pairs of 32 bits
 * at every head and token: chunk_dp reads q's and k's that way, in place. */
static inline int pairs_in_place(const void *x, long hs, long ts) {
    return (size_t)x % 4 == 0 && hs % 2 == 0 && ts % 2 == 0;
}

/* Whether a recurrence's 16-bit forward takes chunk_dp for its whole chunks of C tokens (the
 * one rule of GLA's and the delta rule's): bfloat16 rows, q and k pairs in place, no per-key
 * gates, K, V and C multiples of 32 (C at most LA_CHUNK_MAX), all V columns (whole heads),
 * gemm_dp on tiles. */
static inline int chunk_dp_takes(int dt, int per_key, long C, long K, long V, long v0, long v1,
                                 const void *q, long qs, long qt, const void *k, long ks,
                                 long kt) {
    return dt == LA_BF16 && !per_key && K % 32 == 0 && V % 32 == 0 && C % 32 == 0
           && C <= LA_CHUNK_MAX && v0 == 0 && v1 == V && pairs_in_place(q, qs, qt)
           && pairs_in_place(k, ks, kt) && dp_on_tiles();
}

/* 0, 1, .. 15: each lane's index, for masks against a row or column number. */
static inline vf lane_index(void) {
    return (vf){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
}

/* x[0:n] * s rounded to bfloat16 at dst (x float32, or bfloat16 where bf; n a multiple of 16). */
static inline void bf16_scaled(const void *x, int bf, float s, long n, u16 *dst) {
    for (long j = 0; j < n; j += 16) vstore_any(dst, j, vload_any(x, j, bf) * s, 1);
}

/* (x0[j] s0, x1[j] s1) as bfloat16 pairs at dst, j < n (a multiple of 16); x0, x1 float32, or
 * bfloat16 where bf. */
static inline void pairs_scaled(const void *x0, float s0, const void *x1, float s1, int bf,
                                long n, u32 *dst) {
    for (long j = 0; j < n; j += 16)
        _mm512_storeu_si512((void *)(dst + j),
                            bf16_pairs(vload_any(x0, j, bf) * s0, vload_any(x1, j, bf) * s1));
}

/* sum x[j]^2, j < n, over bfloat16 x (n a multiple of 16). */
static inline float sum_sq16(const u16 *x, long n) {
    vf acc = vsplat(0.0f);
    for (long j = 0; j < n; j += 16) {
        vf y = vload_any(x, j, 1);
        acc += y * y;
    }
    return hsum(acc);
}

/* Row i of (I + L)^-1 into Ti (rows of C, float32, 0 beyond column i) and rounded into Tp (rows
 * of C / 2 pairs): Tinv_i = e_i - sum_{j<i} L_ij Tinv_j over the rows before it, in registers
 * (four chains of adds; reach: the vectors holding columns 0 .. i). */
static inline void chunk_tinv_row(long i, long C, long reach, const float *Li, float *Ti,
                                  u32 *Tp) {
    vf acc[4][LA_CHUNK_CV];
    for (int r = 0; r < 4; ++r)
        for (int c = 0; c < LA_CHUNK_CV; ++c) acc[r][c] = vsplat(0.0f);
    long j = 0;
    for (; j + 3 < i; j += 4)
        for (int r = 0; r < 4; ++r) {
            vf l = vsplat(Li[j + r]);
            for (int c = 0; c < LA_CHUNK_CV; ++c)
                if (c < reach) /* row j of Tinv is 0 beyond column j < i */
                    acc[r][c] -= l * vload(Ti + (j + r) * C + c * 16);
        }
    for (; j < i; ++j)
        for (int c = 0; c < LA_CHUNK_CV; ++c)
            if (c < reach) acc[0][c] -= vsplat(Li[j]) * vload(Ti + j * C + c * 16);
    /* the diagonal's 1 set in the register, and the row rounded from it: a scalar store of
     * it and a reload of the row stalled the load on the stores (no forwarding from two
     * stores to one load: 10 % of chunk_dp, Intel Xeon with AMX) */
    const vf iota = lane_index();
    for (int c = 0; c < C / 16; ++c) {
        vf row = (acc[0][c] + acc[1][c]) + (acc[2][c] + acc[3][c]);
        row = vselect(iota + (float)(c * 16) == (float)i, vsplat(1.0f), row);
        vstore(Ti + i * C + c * 16, row);
        vstore_any(Tp, i * C + c * 16, row, 1); /* Tp's u16 elements: i * C / 2 pairs */
    }
}

/* One whole chunk of C tokens of one head: q, k bfloat16 rows of K (token strides qt, kt;
 * pairs_in_place), v bfloat16 rows of V (vt), g (NULL: no gate) and, for the delta rule, beta:
 * C floats (beta NULL: GLA); the scale s, l2norm with eps; Sin / Sout (K x V, float32, may be
 * the same); o float32 rows of V (written); pf: rows to ask for from memory meanwhile, tokens
 * pf0 .. pf0 + C - 1 of it. work: chunk_dp_work(C, K, V) floats. */
__attribute__((unused)) static void chunk_dp(long C, long K, long V, const u16 *q, long qt,
                                             const u16 *k, long kt, const u16 *v, long vt,
                                             const float *g, const float *beta, float scale,
                                             int l2norm, float eps, const float *Sin,
                                             float *Sout, float *o, const la_ahead *pf,
                                             long pf0, float *work) {
    const long PO = (K + C) / 2; /* pairs of a row of [g o Q~ | scores] */
    float *b = work, *gam = b + C, *ig = gam + C, *sq = ig + C, *sk = sq + C, *Mm = sk + C;
    float *Gm = Mm + C * C, *Ti = Gm + C * C, *KS = Ti + C * C, *U = KS + C * V;
    u32 *kpT = (u32 *)(U + C * V), *S0p = kpT + C * K / 2, *Up = S0p + K * V / 2;
    u32 *AO = Up + C * V / 2;
    /* q's and k's bfloat16 rows are already their pairs along the features: the products
     * read them in place (qt, kt even), and the scales sq, sk apply to the float32 sums */
    const u32 *qp = (const u32 *)q, *kp = (const u32 *)k;
    u32 *Tp = AO + C * PO, *Rp = Tp + C * C / 2;
    /* the decayed keys and their transpose over Mm and Gm where they fit (spent by then, and
     * still in cache: 3 % of a chunk, Intel Xeon with AMX), else after Rp */
    u32 *kdp = C * K <= 2 * C * C ? (u32 *)Mm : Rp + C * V / 2, *kdT = kdp + C * K / 2;
    float cum = 0.0f;
    for (long t = 0; t < C; ++t) { /* q~ = sq q, k~ = sk k, b, g: the sums of squares first */
        sq[t] = l2norm ? sum_sq16(q + t * qt, K) : 0.0f;
        sk[t] = l2norm && !beta ? sum_sq16(k + t * kt, K) : 0.0f;
        b[t] = cum += g ? g[t] : 0.0f;
    }
    /* then the roots, quotients and decays 16 tokens at a time (one at a time: ~10 % of a chunk) */
    for (long t = 0; t < C; t += 16) {
        __m512 rq = _mm512_sqrt_ps((__m512)(vload(sq + t) + eps));
        __m512 rk = _mm512_sqrt_ps((__m512)(vload(sk + t) + eps));
        vstore(sq + t, l2norm ? scale * (1.0f / (vf)rq) : vsplat(scale)); /* as gdr_prep */
        vstore(sk + t, l2norm && !beta ? 1.0f / (vf)rk : vsplat(1.0f));
        vstore(gam + t, vexp_nonpos(vload(b + t)));
        vstore(ig + t, 1.0f / vload(gam + t)); /* read only where ratio (below) */
    }
    /* Gam_ij = g_i / g_j where no g underflows (the whole chunk's decay above 2^-100: 1 / g_j
     * stays finite), else exp(b_i - b_j) (a vector exp per 16 of them) */
    int ratio = g && gam[C - 1] >= 0x1p-100f;
    for (long r = 0; r < C; r += 16) /* k's pairs transposed: kpT (K / 2 x C) */
        for (long c = 0; c < K / 2; c += 16)
            transpose_block((const float *)(kp + r * kt / 2 + c), kt / 2,
                            (float *)(kpT + c * C + r), C);
    for (long p = 0; p < K / 2; ++p) /* S paired along its rows, before Sout (maybe Sin) changes */
        pairs_scaled(Sin + 2 * p * V, 1.0f, Sin + (2 * p + 1) * V, 1.0f, 0, V, S0p + p * V);
    /* q.k (Mm), and for the delta rule k.k (Gm) and K S, unscaled */
    gemm_dp(C, C, K / 2, qp, qt / 2, 1, kpT, C, Mm, C, 0, 0);
    if (beta) {
        gemm_dp(C, C, K / 2, kp, kt / 2, 1, kpT, C, Gm, C, 0, 0);
        gemm_dp(C, V, K / 2, kp, kt / 2, 1, S0p, V, KS, V, 0, 0);
        for (long t = 0; l2norm && t < C; ++t) /* k.k on the diagonal: the keys' norms */
            sk[t] = 1.0f / sqrtf(Gm[t * C + t] + eps);
    }
    /* Row i: the O product's operand row [g_i q~_i | the masked, decayed scores], and for the
     * delta rule L_i (float32, over Gm) and Tinv_i; the rows ahead asked for, a token a row */
    const vf iota = lane_index();
    for (long i = 0; i < C; ++i) {
        la_fetch_ahead(pf, pf0 + i, V);
        float *Li = Gm + i * C;
        const float *Mi = Mm + i * C;
        u16 *ao = (u16 *)(AO + i * PO);
        bf16_scaled(q + i * qt, 1, gam[i] * sq[i], K, ao);
        vf bi = vsplat(b[i]), gi = vsplat(gam[i]), fi = vsplat((float)i), sqi = vsplat(sq[i]);
        vf bti = vsplat(beta ? beta[i] * sk[i] : 0.0f);
        long reach = i / 16 + 1;
        for (long c = 0; c < C / 16; ++c) {
            if (c >= reach) {
                vstore_any(ao, K + c * 16, vsplat(0.0f), 1);
                continue;
            }
            vf x = bi - vload(b + c * 16), col = iota + (float)(c * 16), d = vsplat(1.0f);
            if (ratio)
                d = gi * vload(ig + c * 16);
            else if (g)
                d = vexp_nonpos(vselect(x < vsplat(0.0f), x, vsplat(0.0f)));
            d *= vload(sk + c * 16); /* the key's scale (the query's below, beta's in bti) */
            if (beta)
                vstore(Li + c * 16,
                       vselect(col < fi, bti * vload(Li + c * 16) * d, vsplat(0.0f)));
            vstore_any(ao, K + c * 16,
                       vselect(col <= fi, sqi * vload(Mi + c * 16) * d, vsplat(0.0f)), 1);
        }
        if (beta) chunk_tinv_row(i, C, reach, Li, Ti, Tp);
    }
    if (beta) { /* U' = Tinv beta (v - g K~ S), the right-hand side paired along the tokens */
        for (long p = 0; p < C / 2; ++p) {
            long t = 2 * p;
            vf b0 = vsplat(beta[t]), b1 = vsplat(beta[t + 1]);
            vf g0 = vsplat(gam[t] * sk[t]), g1 = vsplat(gam[t + 1] * sk[t + 1]);
            for (long c = 0; c < V; c += 16) {
                vf lo = b0 * (vload_any(v, t * vt + c, 1) - g0 * vload(KS + t * V + c));
                vf hi = b1 * (vload_any(v, (t + 1) * vt + c, 1)
                              - g1 * vload(KS + (t + 1) * V + c));
                _mm512_storeu_si512((void *)(Rp + p * V + c), bf16_pairs(lo, hi));
            }
        }
        gemm_dp(C, V, C / 2, Tp, C / 2, 1, Rp, V, U, V, 0, 1);
    }
    for (long p = 0; p < C / 2; ++p) /* U' (GLA: V) paired along the tokens, after S */
        if (beta)
            pairs_scaled(U + 2 * p * V, 1.0f, U + (2 * p + 1) * V, 1.0f, 0, V, Up + p * V);
        else
            pairs_scaled(v + 2 * p * vt, 1.0f, v + (2 * p + 1) * vt, 1.0f, 1, V, Up + p * V);
    gemm_dp(C, V, PO, AO, PO, 1, S0p, V, o, V, 0, 0); /* O = [g o Q~ | scores] [S; U'] */
    float *ek = ig; /* spent: the keys' decays to the chunk's end, exp(b_C - b_t) */
    for (long t = 0; t < C; t += 16)
        vstore(ek + t, vload(sk + t) * (g ? vexp_nonpos(vsplat(b[C - 1]) - vload(b + t))
                                          : vsplat(1.0f)));
    for (long p = 0; p < C / 2; ++p) /* the keys decayed to the chunk's end, paired */
        pairs_scaled(k + 2 * p * kt, ek[2 * p], k + (2 * p + 1) * kt, ek[2 * p + 1], 1, K,
                     kdp + p * K);
    transpose(C / 2, K, (const float *)kdp, (float *)kdT);
    if (Sout != Sin || gam[C - 1] != 1.0f)
        for (long i = 0; i < K; ++i) scale_row(Sout + i * V, 0, 0, Sin + i * V, gam[C - 1], V);
    gemm_dp(K, V, C / 2, kdT, C / 2, 1, Up, V, Sout, V, 1, 0); /* S */
}
#endif /* LA_DP_BF16 */

/* The scratch a recurrence's forward on rows of dtype dt adds for chunk_dp's chunks of C
 * tokens: chunk_dp_work for bfloat16 where the build has the dot products, else none. */
static inline long chunk_dp_scratch(int dt, long C, long K, long V) {
#if defined(LA_DP_BF16)
    if (dt == LA_BF16) return chunk_dp_work(C, K, V);
#endif
    (void)dt, (void)C, (void)K, (void)V;
    return 0;
}

#endif /* LA_TILES_H */
