/* The other forms of the one-pass kernels, a part of ops/linear/kernels.c: included there,
 * after the row helpers they use, and not compiled on its own. First the bfloat16
 * dot-product forwards (LA_DP_BF16 builds: vdpbf16ps), then the recurrent forms of the causal
 * forward and backward (states up to REC_MAX_STATE). */
#if defined(LA_DP_BF16)
/* The state S (L x Dv) paired along its rows, for phi(q) S on pairs: Sp[p] = (S[2p], S[2p+1]). */
static inline void pair_state(const float *S, long L, long Dv, u32 *Sp) {
    for (long p = 0; p < L / 2; ++p) pair_rows(S, 0, 2 * p * Dv, (2 * p + 1) * Dv, Dv, Sp + p * Dv);
}

/* A chunk's Cn keys in pairs of tokens (2p, 2p + 1), for phi(k)^T v and A v on pairs: vp[p] from
 * v's bfloat16 rows (from element v0, rows of Dv), kp[p] from phi(k)'s float32 rows f; an odd
 * last token is paired with zeros. */
static inline void pair_keys(const void *v, long v0, long Dv, const float *f, long L, long Cn,
                             u32 *vp, u32 *kp) {
    for (long p = 0; p < (Cn + 1) / 2; ++p) {
        long a = v0 + 2 * p * Dv, odd = 2 * p + 1 < Cn;
        pair_rows(v, 1, a, odd ? a + Dv : -1, Dv, vp + p * Dv);
        if (kp) pair_rows(f, 0, 2 * p * L, odd ? (2 * p + 1) * L : -1, L, kp + p * L);
    }
}

/* A causal chunk's features from bfloat16 rows (tokens t0 .. t0 + Cn - 1 of head n): fq, fk =
 * phi(q), phi(k) in float32 (rows of L), fk zero beyond Cn (zero keys score 0); the next
 * chunk's rows of q, k and v asked for meanwhile (unasked, their loads were 26 % of the
 * dot-product form's samples, Intel Xeon with AMX). exp to 2^-17 (vexp_parts' coarse form):
 * the features go to the products rounded to bfloat16, and to the normaliser's sums, where
 * 2^-17 is far inside the bound's u|o| (u = 2^-8); 0.96-0.97x the time in cache (a C harness,
 * one head of 2,048 tokens, the same Xeon). */
static inline void causal_chunk_features(int kind, const void *q, long qs, const void *k, long ks,
                                         const void *v, long vs, long n, long t0, long Cn,
                                         long T, long L, long Dv, long C, float *fq, float *fk) {
    la_stream qn = la_next_chunk(q, n * qs, t0 + Cn, T, C, L, 2);
    la_stream kn = la_next_chunk(k, n * ks, t0 + Cn, T, C, L, 2);
    la_stream vn = la_next_chunk(v, n * vs, t0 + Cn, T, C, Dv, 2), none = {NULL, 0};
    phi_rows_fetching(kind, q, n * qs + t0 * L, 1, 1, Cn * L, fq, &qn, &kn);
    phi_rows_fetching(kind, k, n * ks + t0 * L, 1, 1, Cn * L, fk, &vn, &none);
    if (Cn < C) memset(fk + Cn * L, 0, (size_t)((C - Cn) * L) * sizeof(float));
}

/* The causal forward for bfloat16 inputs and outputs, on dot products (L a multiple of 32):
 * per chunk, phi(q) S (S paired along its rows), the scores phi(q) phi(k)^T (phi(k) rounded and
 * paired along the features, i.e. its bfloat16 rows transposed as 32-bit pairs), A v (A rounded
 * and paired along the keys; v paired by key rows) and S += phi(k)^T v as in the non-causal
 * pass; the normaliser's row sums from the float32 scores. Error as there: |o_j - exact| <= 3u
 * max_t |v_tj| + u |o_j| (+ float32 sums), each product having two rounded operands and each
 * term's state or score one rounding more. work: 2 C L + C C + C Dv + (3 C L + C C + C Dv +
 * L Dv) / 2 floats (C even). */
static void causal_forward_dp(int kind, const void *q, long qs, const void *k, long ks,
                              const void *v, long vs, long N, long T, long L, long Dv, long C,
                              float eps, float *S, float *z, void *out, long os, float *Ss,
                              long sb, float *zss, long zb, long block, float *work) {
    float *fq = work, *fk = fq + C * L, *A = fk + C * L, *num = A + C * C;
    u32 *fqp = (u32 *)(num + C * Dv), *fkb = fqp + C * L / 2, *fkTp = fkb + C * L / 2;
    u32 *Ab = fkTp + C * L / 2, *kp = fkb, *vp = Ab + C * C / 2, *Sp = vp + C / 2 * Dv;
    int held = amx_hold(); /* the tiles (where used) configured once for all the products */
    for (long n = 0; n < N; ++n) {
        float *Sn = S + n * L * Dv, *zn = z + n * L;
        for (long t0 = 0; t0 < T; t0 += C) {
            long Cn = T - t0 < C ? T - t0 : C, P = (Cn + 1) / 2;
            keep_state(Sn, zn, n, t0, block, Ss, sb, zss, zb, L, Dv);
            causal_chunk_features(kind, q, qs, k, ks, v, vs, n, t0, Cn, T, L, Dv, C, fq, fk);
            bf16_rows(fq, Cn, L, (u16 *)fqp);
            bf16_rows(fk, C, L, (u16 *)fkb);
            transpose(C, L / 2, (const float *)fkb, (float *)fkTp); /* 32-bit pairs moved */
            pair_state(Sn, L, Dv, Sp);
            gemm_dp(Cn, Dv, L / 2, fqp, L / 2, 1, Sp, Dv, num, Dv, 0, 0); /* phi(q) S */
            scores_dp(Cn, C, L, fqp, fkTp, A); /* tril(phi(q) phi(k)^T) */
            bf16_rows(A, Cn, C, (u16 *)Ab);
            pair_keys(v, n * vs + t0 * Dv, Dv, fk, L, Cn, vp, kp);
            gemm_dp(Cn, Dv, P, Ab, C / 2, 1, vp, Dv, num, Dv, 1, 1); /* + A v */
            for (long i = 0; i < Cn; ++i)
                scale_row_stream(out, n * os + (t0 + i) * Dv, 1, num + i * Dv,
                                 1.0f / guarded(causal_den(fq + i * L, zn, A + i * C, i, L), eps),
                                 Dv);
            gemm_dp(L, Dv, P, kp, 1, L, vp, Dv, Sn, Dv, 1, 0); /* S += phi(k)^T v */
            add_colsums(zn, zn, fk, NULL, Cn, L);
        }
    }
    amx_unhold(held);
}

/* causal_forward_dp laid out for AMX tiles (pairs along A's rows): per chunk one product
 * O = [phi(q) | A] [S; v] (P = (L + C) / 2 pairs: a row of phi(q) rounded, then the row's
 * masked scores rounded), the scores from the same phi(q) pairs (its rows in AO, in place),
 * and S += phi(k)^T v with phi(k) paired along the tokens and transposed as pairs; the mask,
 * the rounding and the normaliser's row sums in one pass. The same rounded operands as
 * causal_forward_dp, so its error bound. Against causal_forward_dp on tiles (two products for
 * O, a separate mask, phi(k) transposed in float32): 8.3 -> 7.9 us a chunk in a C harness
 * (one head, L = Dv = 64), 80 -> 75 ms at B 1, H 8, T 65536 (Intel Xeon with AMX). work: as
 * causal_forward_dp's + C L / 2 + C. */
static void causal_forward_tiles(int kind, const void *q, long qs, const void *k, long ks,
                                 const void *v, long vs, long N, long T, long L, long Dv, long C,
                                 float eps, float *S, float *z, void *out, long os, float *Ss,
                                 long sb, float *zss, long zb, long block, float *work) {
    const long PO = (L + C) / 2; /* pairs of a row of [phi(q) | A] */
    float *fq = work, *fk = fq + C * L, *A = fk + C * L, *num = A + C * C;
    u32 *AO = (u32 *)(num + C * Dv), *fkTp = AO + C * PO, *Sp = fkTp + C * L / 2;
    u32 *vp = Sp + L / 2 * Dv, *kdp = vp + C / 2 * Dv, *kdT = kdp + C * L / 2;
    float *inv = (float *)(kdT + C * L / 2); /* 1 / the rows' normalisers */
    const vf iota = lane_index();
    int held = amx_hold(); /* the tiles configured once for all the products */
    for (long n = 0; n < N; ++n) {
        float *Sn = S + n * L * Dv, *zn = z + n * L;
        for (long t0 = 0; t0 < T; t0 += C) {
            long Cn = T - t0 < C ? T - t0 : C, P = (Cn + 1) / 2;
            keep_state(Sn, zn, n, t0, block, Ss, sb, zss, zb, L, Dv);
            causal_chunk_features(kind, q, qs, k, ks, v, vs, n, t0, Cn, T, L, Dv, C, fq, fk);
            if (Cn < C) /* a last, partial chunk: zero values beyond it (the one product) */
                memset(vp + P * Dv, 0, (size_t)((C / 2 - P) * Dv) * sizeof(u32));
            for (long i = 0; i < Cn; ++i) bf16_scaled(fq + i * L, 0, 1.0f, L, (u16 *)(AO + i * PO));
            for (long r = 0; r < C; r += 16) /* phi(k) rounded, its pairs transposed */
                for (long c = 0; c < L / 2; c += 16) {
                    float blk[16 * 16];
                    for (long i = 0; i < 16; ++i)
                        bf16_scaled(fk + (r + i) * L + 2 * c, 0, 1.0f, 32, (u16 *)(blk + i * 16));
                    transpose_block(blk, 16, (float *)(fkTp + c * C + r), C);
                }
            pair_state(Sn, L, Dv, Sp);
            pair_keys(v, n * vs + t0 * Dv, Dv, fk, L, Cn, vp, NULL);
            gemm_dp(Cn, C, L / 2, AO, PO, 1, fkTp, C, A, C, 0, 0); /* phi(q) phi(k)^T */
            for (long i = 0; i < Cn; ++i) { /* the scores masked and rounded after phi(q) in
                                             * AO's rows; the normaliser from their sums */
                vf sum = vsplat(0.0f);
                for (long c = 0; c < C; c += 16) {
                    vf a = vselect(iota + (float)(c - i) <= 0.0f, vload(A + i * C + c),
                                   vsplat(0.0f));
                    sum += a;
                    vstore_any(AO + i * PO + L / 2, c, a, 1);
                }
                inv[i] = 1.0f / guarded(dot(fq + i * L, zn, L) + hsum(sum), eps);
            }
            gemm_dp(Cn, Dv, PO, AO, PO, 1, Sp, Dv, num, Dv, 0, 0); /* [phi(q) | A] [S; v] */
            for (long i = 0; i < Cn; ++i)
                scale_row_stream(out, n * os + (t0 + i) * Dv, 1, num + i * Dv, inv[i], Dv);
            for (long p = 0; p < C / 2; ++p) /* phi(k) paired along the tokens, transposed */
                pairs_scaled(fk + 2 * p * L, 1.0f, fk + (2 * p + 1) * L, 1.0f, 0, L, kdp + p * L);
            transpose(C / 2, L, (const float *)kdp, (float *)kdT);
            gemm_dp(L, Dv, C / 2, kdT, C / 2, 1, vp, Dv, Sn, Dv, 1, 0); /* S += phi(k)^T v */
            add_colsums(zn, zn, fk, NULL, Cn, L);
        }
    }
    amx_unhold(held);
}
#endif

#if defined(LA_DP_BF16)
/* 16-bit lanes taking x[i] and y[i] in turn (vpermt2w on x, y): the pairs of elements 0-15 and
 * of elements 16-31 of two rows of 32 bfloat16. */
static inline __m512i pair_lanes(int high) {
    short idx[32];
    for (int i = 0; i < 16; ++i)
        idx[2 * i] = (short)(16 * high + i), idx[2 * i + 1] = (short)(32 + 16 * high + i);
    return _mm512_loadu_si512(idx);
}

/* The non-causal key pass's operands, made in one pass over a chunk's rows (k and v bfloat16,
 * rows of L and Dv, both multiples of 16), for Pp pairs (a multiple of 16; pairs of tokens
 * beyond Cn are zeros): kp feature by feature (rows of Pp pairs: kp[i Pp + p] = (phi(k_2p)_i,
 * phi(k_2p+1)_i) rounded), vp[p] = (v_2p, v_2p+1) moved as they are (no widening and rounding
 * back), z[0:L] += the unrounded phi(k_t). Features by feature rows, so that the pairs run
 * along a row as an AMX tile takes them (the vdpbf16ps tiles read them by broadcast either
 * way): 16 pairs of a block of 16 features are made, then transposed as 32-bit words. Made in
 * separate passes (features, then pairs, then column sums) they cost as much as the products:
 * every pass went to memory or to L1 again. A line of each of a and b is asked for per vector
 * of features. */
static inline void pair_phi_keys(int kind, const u16 *k, const u16 *v, long L, long Dv, long Cn,
                                 long Pp, u32 *kp, u32 *vp, float *z, la_stream *a,
                                 la_stream *b) {
    const __m512i lo = pair_lanes(0), hi = pair_lanes(1);
    u32 block[16 * 16] __attribute__((aligned(64)));
    for (long p0 = 0; p0 < Pp; p0 += 16) {
        for (long j = 0; j < L; j += 16) {
            vf sum = vsplat(0.0f);
            for (long p = p0; p < p0 + 16; ++p) {
                la_fetch_line(a), la_fetch_line(b);
                const u16 *k0 = k + 2 * p * L;
                vf x = 2 * p < Cn ? vphi_as(kind, vload_any(k0, j, 1), 1) : vsplat(0.0f);
                vf y = 2 * p + 1 < Cn ? vphi_as(kind, vload_any(k0 + L, j, 1), 1) : vsplat(0.0f);
                sum += x + y;
                _mm512_store_si512(block + (p - p0) * 16, bf16_pairs(x, y));
            }
            vstore(z + j, vload(z + j) + sum);
            transpose_block((const float *)block, 16, (float *)(kp + j * Pp + p0), Pp);
        }
        for (long p = p0; p < p0 + 16; ++p) {
            const u16 *v0 = v + 2 * p * Dv;
            for (long j = 0; j < Dv; j += 32) {
                __mmask32 m = Dv - j >= 32 ? 0xFFFFFFFFu : 0xFFFFu;
                __m512i x = 2 * p < Cn ? _mm512_maskz_loadu_epi16(m, v0 + j)
                                       : _mm512_setzero_si512();
                __m512i y = 2 * p + 1 < Cn ? _mm512_maskz_loadu_epi16(m, v0 + Dv + j)
                                           : _mm512_setzero_si512();
                _mm512_storeu_si512(vp + p * Dv + j, _mm512_permutex2var_epi16(x, lo, y));
                if (Dv - j >= 32)
                    _mm512_storeu_si512(vp + p * Dv + j + 16,
                                        _mm512_permutex2var_epi16(x, hi, y));
            }
        }
    }
}

#ifndef DP_KEY_CHUNKS
#define DP_KEY_CHUNKS 8
#endif
/* The pairs the non-causal key pass makes of n tokens: rounded up to 16, the tiles' depth. */
static inline long dp_key_pairs(long n) { return (n + 31) / 32 * 16; }

/* la_noncausal_forward for bfloat16 inputs and outputs, on dot products (L a multiple of 32),
 * keys DP_KEY_CHUNKS chunks at a time. work: C L + C Dv + dp_key_pairs(DP_KEY_CHUNKS C)
 * (L + Dv) + L Dv / 2 floats (la_linear_work). */
static void noncausal_forward_dp(int kind, const void *q, long qs, const void *k, long ks,
                                 const void *v, long vs, long N, long Tq, long Tk, long L,
                                 long Dv, long C, float eps, float *S, float *z, void *out,
                                 long os, float *work) {
    long Ck = DP_KEY_CHUNKS * C;
    float *inv = work, *dv = inv + C, *num = inv + C * L; /* C + 16 C <= C L floats (C % 16
                                                           * == 0: la_noncausal_forward) */
    long Pk = dp_key_pairs(Ck); /* the most pairs a key pass makes */
    u32 *kp = (u32 *)(num + C * Dv), *vp = kp + Pk * L, *fqp = kp;
    u32 *Sp = vp + Pk * Dv;
    const u16 *kh = k, *vh = v;
    int held = amx_hold(); /* the tiles (where used) configured once for all the products */
    for (long n = 0; n < N; ++n) {
        float *Sn = S + n * L * Dv, *zn = z + n * L;
        for (long t0 = 0; t0 < Tk; t0 += Ck) {
            long Cn = Tk - t0 < Ck ? Tk - t0 : Ck, Pp = dp_key_pairs(Cn);
            la_stream kn = la_next_chunk(k, n * ks, t0 + Cn, Tk, Ck, L, 2);
            la_stream vn = la_next_chunk(v, n * vs, t0 + Cn, Tk, Ck, Dv, 2);
            pair_phi_keys(kind, kh + n * ks + t0 * L, vh + n * vs + t0 * Dv, L, Dv, Cn, Pp, kp,
                          vp, zn, &kn, &vn);
            gemm_dp(L, Dv, Pp, kp, Pp, 1, vp, Dv, Sn, Dv, 1, 0);
        }
        if (!Tq) continue;
        pair_state(Sn, L, Dv, Sp);
        for (long t0 = 0; t0 < Tq; t0 += C) {
            long Cn = Tq - t0 < C ? Tq - t0 : C;
            la_stream qn = la_next_chunk(q, n * qs, t0 + Cn, Tq, C, L, 2);
            query_features(kind, q, n * qs + t0 * L, 1, L, Cn, zn, eps, fqp, 1, inv, dv, &qn);
            gemm_dp(Cn, Dv, L / 2, fqp, L / 2, 1, Sp, Dv, num, Dv, 0, 0);
            for (long i = 0; i < Cn; ++i)
                scale_row_stream(out, n * os + (t0 + i) * Dv, 1, num + i * Dv, inv[i], Dv);
        }
    }
    amx_unhold(held);
}
#endif

#ifndef REC_FORWARD
#define REC_FORWARD 1
#endif
/* Tokens that share a pass over the state (one load and one store of each of its rows), whose
 * features are made at once just before it: three where the ISA has 32 vector registers (three
 * tokens' values and numerators, 2 x 3 x NV vectors, and six broadcasts stay in registers), two
 * with 16 (AVX2, SSE2, scalar: three would spill). A pass over a 64 x 64 state in L1 ran at
 * 153 GFLOP/s with two tokens and 174 with three (four spilled: 153; Intel Xeon, family 6,
 * AVX-512). In bursts of 64 tokens the loads of q and k stalled (127 against 115 ms, AMD Zen
 * 4); a few tokens' loads overlap the previous pass's multiply-adds. */
#ifndef REC_U
#if LA_W == 16 || (LA_W == 4 && (defined(__ARM_NEON) || defined(__ARM_NEON__)))
#define REC_U 3
#else
#define REC_U 2
#endif
#endif
/* The largest state (L Dv floats per head) the recurrent form takes; above, the chunked form
 * (AMD Zen 4, float32, same work: recurrent/chunked 19.7/36.9 ms at L = Dv = 16, 121/184 at 64,
 * 116/130 at 128, 129/145 at L = 256, Dv = 64; but 110/104 at L = Dv = 256). bfloat16 rows take it
 * before the dot-product form too (117 against 127-144 ms at d = 64). */
#define REC_MAX_STATE (128 * 128)
/* ------------------------------------------------- causal forward, float32: the recurrent form
 * Token by token, with the state of one block of columns in L1:
 *     S += phi(k_t)^T v_t,   z += phi(k_t),   o_t = phi(q_t) S / guarded(phi(q_t) . z + eps).
 * That is the 4 L Dv flops a token that linear attention needs and no more: the chunked form
 * adds the scores inside each chunk (half as many flops again at 64 tokens) and runs its
 * products in short register tiles; token by token the state's rows stream through the FMA
 * units instead. REC_U tokens share each pass over the rows (one load and one store of S for
 * them all), so the loop is bound by the multiply-adds. AMD Zen 4, B1 H8 T65536 d64, one
 * thread, two tokens a pass: 183 ms chunked, 108-113 ms here (0.40 and 0.65-0.68 of the FMA
 * peak); Intel Xeon (family 6), three tokens a pass against two: 0.85-0.89x the time. */

/* One pass of tokens u < n (1 <= n <= 3) over the rows r < rows of a matrix M (rows of ld
 * floats; nb vectors of one block of columns, offset to it), in order:
 *     M_r += b_u[r] x_u,   d_u += c_u[r] M_r   (M_r as token u left it),
 * M updated in place, each d_u (nb vectors) written. The forward's pass over S (b = phi(k),
 * x = v, c = phi(q): d = the numerator) and the backward's over S^T (b = v, x = phi(k), c = dn:
 * d = S dn). One load and one store of M serve the n tokens. */
static inline __attribute__((always_inline)) void rank_pass(int nb, int n, long rows, long ld,
                                                            const float *const b[3],
                                                            const float *const c[3],
                                                            const float *const x[3], float *M,
                                                            float *const d[3]) {
    vf y[3][NV], a[3][NV];
    for (int u = 0; u < n; ++u)
        for (int j = 0; j < nb; ++j) y[u][j] = vload(x[u] + j * W), a[u][j] = vsplat(0.0f);
    for (long r = 0; r < rows; ++r) {
        vf bb[3], cc[3];
        for (int u = 0; u < n; ++u) bb[u] = vsplat(b[u][r]), cc[u] = vsplat(c[u][r]);
        float *Mr = M + r * ld;
        for (int j = 0; j < nb; ++j) {
            vf m = vload(Mr + j * W);
            for (int u = 0; u < n; ++u) {
                m += bb[u] * y[u][j];
                a[u][j] += cc[u] * m;
            }
            vstore(Mr + j * W, m);
        }
    }
    for (int u = 0; u < n; ++u)
        for (int j = 0; j < nb; ++j) vstore(d[u] + j * W, a[u][j]);
}

/* r[u] = the row of token t + u of x (rows of ld floats) for u < 3, or token t's where u >= n:
 * the arguments of a pass over fewer than three tokens (rows past n are never read, and no
 * address past x's end is formed). */
static inline void rank_rows(const float *x, long t, long n, long ld, const float *r[3]) {
    for (long u = 0; u < 3; ++u) r[u] = x + (t + (u < n ? u : 0)) * ld;
}

/* rank_pass for LA_BLOCK_SWITCH, whose flag is 0 or 1: one token, or two (three: 0, 1). */
static inline __attribute__((always_inline)) void rank_pass_1(int nb, int unused, long rows,
                                                              long ld, const float *const b[3],
                                                              const float *const c[3],
                                                              const float *const x[3], float *M,
                                                              float *const d[3]) {
    (void)unused;
    rank_pass(nb, 1, rows, ld, b, c, x, M, d);
}
static inline __attribute__((always_inline)) void rank_pass_23(int nb, int three, long rows,
                                                               long ld, const float *const b[3],
                                                               const float *const c[3],
                                                               const float *const x[3],
                                                               float *M, float *const d[3]) {
    rank_pass(nb, 2 + three, rows, ld, b, c, x, M, d);
}

/* rank_pass of n = 1, 2 or 3 tokens (the backward's, which is not inlined into a loop). */
static void rank_any(int nb, int n, long rows, long ld, const float *const b[3],
                     const float *const c[3], const float *const x[3], float *M,
                     float *const d[3]) {
    if (n == 1) {
        LA_BLOCK_SWITCH(rank_pass_1, nb, 0, rows, ld, b, c, x, M, d)
    } else {
        LA_BLOCK_SWITCH(rank_pass_23, nb, n == 3, rows, ld, b, c, x, M, d)
    }
}

/* Tokens t .. t + n - 1 (n <= 3) over the rows of a block of nb column vectors: S (rows of
 * Dv, offset to the block) updated in place, each token's numerator scaled by inv[t] into out
 * (rows of Dv from element o0, offset to the block; float32 or bfloat16 with bf). fq, fk: the
 * chunk's features (rows of L); vc: its values (rows of Dv, offset to the block). Inlined with
 * constant sizes, so that the numerators stay in registers. */
static inline __attribute__((always_inline)) void rec_tokens(int nb, int n, long t, long L,
                                                             long Dv, const float *fq,
                                                             const float *fk, const float *vc,
                                                             const float *inv, float *S,
                                                             void *out, long o0, int bf) {
    float num[3][NV * W];
    const float *b[3], *c[3], *x[3];
    float *const d[3] = {num[0], num[1], num[2]};
    rank_rows(fk, t, n, L, b), rank_rows(fq, t, n, L, c), rank_rows(vc, t, n, Dv, x);
    rank_pass(nb, n, L, Dv, b, c, x, S, d);
    for (int u = 0; u < n; ++u)
        for (int j = 0; j < nb; ++j) {
            vf o = vload(num[u] + j * W) * inv[t + u];
            long at = o0 + (t + u) * Dv + j * W;
            if (bf) vstore_any(out, at, o, 1);
            else vstore_stream((float *)out + at, o);
        }
}

/* The Cn tokens of a chunk over one block of nb column vectors (rec_tokens' arguments). */
static inline __attribute__((always_inline)) void rec_cols(int nb, int bf, long Cn, long L,
                                                           long Dv, const float *fq,
                                                           const float *fk, const float *vc,
                                                           const float *inv, float *S, void *out,
                                                           long o0) {
    long t = 0;
    for (; t + REC_U <= Cn; t += REC_U)
        rec_tokens(nb, REC_U, t, L, Dv, fq, fk, vc, inv, S, out, o0, bf);
    if (Cn - t == 2) rec_tokens(nb, 2, t, L, Dv, fq, fk, vc, inv, S, out, o0, bf);
    else if (Cn - t == 1) rec_tokens(nb, 1, t, L, Dv, fq, fk, vc, inv, S, out, o0, bf);
}

static void rec_cols_any(int nb, int bf, long Cn, long L, long Dv, const float *fq,
                         const float *fk, const float *vc, const float *inv, float *S, void *out,
                         long o0) {
    LA_BLOCK_SWITCH(rec_cols, nb, bf, Cn, L, Dv, fq, fk, vc, inv, S, out, o0)
}

/* Tokens ahead whose rows of q, k and v the recurrent forward asks for while it makes a
 * group's features (la_fetch_run over la_next_chunk's rows, ops/native/ahead.h): the
 * hardware's streams alone left a tenth of the forward waiting for its rows (B 1, H 8,
 * T 65,536, d 64, float32: 0.91x the time asked for 9 tokens ahead, 0.94x at 12 and 15, less
 * at 3 and 6; a C harness, Intel Xeon, family 6). */
#define REC_AHEAD 9
/* The recurrent causal forward (la_causal_forward's arguments and state rules, float32
 * arithmetic on float32 or bfloat16 rows): per REC_U tokens, their features, z and each
 * token's 1 / guarded(den + eps) first, then the tokens over each block of columns. work:
 * 2 C L + C Dv + C floats. */
static void causal_forward_rec(int kind, int bf, const void *q, long qs, const void *k, long ks,
                               const void *v, long vs, long N, long T, long L, long Dv, long C,
                               float eps, float *S, float *z, void *out, long os, float *Ss,
                               long sb, float *zss, long zb, long block, float *work) {
    float *fq = work, *fk = fq + C * L, *vbuf = fk + C * L, *inv = vbuf + C * Dv;
    for (long n = 0; n < N; ++n) {
        float *Sn = S + n * L * Dv, *zn = z + n * L;
        for (long t0 = 0, Cn; t0 < T; t0 += Cn) {
            Cn = REC_U < C ? REC_U : C; /* (the scratch holds C tokens) */
            if (Ss && block - t0 % block < Cn) /* ending where a state is kept */
                Cn = block - t0 % block;
            if (T - t0 < Cn) Cn = T - t0;
            keep_state(Sn, zn, n, t0, block, Ss, sb, zss, zb, L, Dv);
            long es = bf ? 2 : 4, ta = t0 + REC_AHEAD; /* the rows REC_AHEAD tokens on */
            la_fetch_run(la_next_chunk(q, n * qs, ta, T, Cn, L, es));
            la_fetch_run(la_next_chunk(k, n * ks, ta, T, Cn, L, es));
            la_fetch_run(la_next_chunk(v, n * vs, ta, T, Cn, Dv, es));
            const float *vc = f32_rows(v, n * vs + t0 * Dv, bf, Cn * Dv, vbuf);
            phi_rows(kind, q, n * qs + t0 * L, bf, Cn * L, fq);
            phi_rows(kind, k, n * ks + t0 * L, bf, Cn * L, fk);
            for (long t = 0; t < Cn; ++t) { /* z after token t, and its normaliser */
                add_colsums(zn, zn, fk + t * L, NULL, 1, L);
                inv[t] = 1.0f / guarded(dot(fq + t * L, zn, L), eps);
            }
            for (long j0 = 0; j0 < Dv; j0 += NV * W) {
                int nb = (Dv - j0) / W < NV ? (int)((Dv - j0) / W) : NV;
                rec_cols_any(nb, bf, Cn, L, Dv, fq, fk, vc + j0, inv, Sn + j0, out,
                             n * os + t0 * Dv + j0);
            }
        }
    }
}

/* ------------------------------------------------ causal backward, float32: the recurrent form
 * With dn_t = g_t / s_t, ds_t = -(g_t . o_t) / s_t (s_t = guarded(phi(q_t) . z_t + eps)):
 *     forward, t = 0 ..:   S_t = S_{t-1} + phi(k_t) v_t^T,  dphi(q_t) = S_t dn_t + ds_t z_t,
 *     backward, t = .. 0:  G += phi(q_t) dn_t^T,  Gz += ds_t phi(q_t),
 *                          dphi(k_t) = G v_t + Gz,  dv_t = G^T phi(k_t),
 * 5 multiply-adds per state element and token (and the sums over a row that G v_t needs, done
 * W rows at a time through a block transpose) against the chunked form's 7.5 in shorter
 * products. The forward walk keeps S transposed (rows of L: S^T_j += v_tj phi(k_t) and
 * dphi(q_t) += dn_tj S^T_j, REC_U tokens a pass as in the forward); the backward walk keeps G as
 * given (rows of Dv). */

/* Token t, and with two token t - 1 after it, of the backward walk over the rows of G (rows of
 * Dv, nb vectors of one block of Dv columns, offset to it); token u's arguments are the u-th of
 * each pair: G_i += fq_i dn; dv (nb vectors, offset) = sum_i fk_i G_i; and into dk (L floats)
 * the row sums of G_i * v over this block's columns, added (add) or set. One load and one store
 * of G serve both tokens. P: 2 W x W floats of scratch. */
static inline __attribute__((always_inline)) void rec_dk_tokens(
    int nb, int two, int add, long L, long Dv, const float *const fq[2],
    const float *const fk[2], const float *const dn[2], const float *const v[2], float *G,
    float *const dv[2], float *const dk[2], float *P) {
    int n = 1 + two;
    vf nn[2][NV], vv[2][NV], acc[2][NV];
    for (int u = 0; u < n; ++u)
        for (int c = 0; c < nb; ++c)
            nn[u][c] = vload(dn[u] + c * W), vv[u][c] = vload(v[u] + c * W),
            acc[u][c] = vsplat(0.0f);
    for (long i0 = 0; i0 < L; i0 += W) {
        for (long i = i0; i < i0 + W; ++i) {
            vf qi[2], ki[2], p[2];
            for (int u = 0; u < n; ++u)
                qi[u] = vsplat(fq[u][i]), ki[u] = vsplat(fk[u][i]), p[u] = vsplat(0.0f);
            float *Gi = G + i * Dv;
            for (int c = 0; c < nb; ++c) {
                vf x = vload(Gi + c * W);
                for (int u = 0; u < n; ++u) {
                    x += qi[u] * nn[u][c];
                    acc[u][c] += ki[u] * x;
                    p[u] += x * vv[u][c];
                }
                vstore(Gi + c * W, x);
            }
            for (int u = 0; u < n; ++u) vstore(P + u * W * W + (i - i0) * W, p[u]);
        }
        for (int u = 0; u < n; ++u) {
            vf sum = row_sums(P + u * W * W);
            vstore(dk[u] + i0, add ? vload(dk[u] + i0) + sum : sum);
        }
    }
    for (int u = 0; u < n; ++u)
        for (int c = 0; c < nb; ++c) vstore(dv[u] + c * W, acc[u][c]);
}

static void rec_dk_any(int nb, int two, int add, long L, long Dv, const float *const fq[2],
                       const float *const fk[2], const float *const dn[2],
                       const float *const v[2], float *G, float *const dv[2],
                       float *const dk[2], float *P) {
    LA_BLOCK_SWITCH(rec_dk_tokens, nb, two, add, L, Dv, fq, fk, dn, v, G, dv, dk, P)
}

/* la_causal_backward's recurrent form (its arguments and state rules, but for the output,
 * which it does not read: out_dn, out_ds): float32 rows, or bfloat16 with bf (read as the
 * float32 they equal: v's rows widened into the scratch as the
 * forward walk reaches them, for both walks; dq, dk, dv rounded once, dv's through two rows of
 * scratch). work: T (2 L + 2 Dv + 1) + Dv L + 6 L + 2 W W + 2 Dv floats. */
static void causal_backward_rec(int kind, int bf, const void *q, long qs, const void *k,
                                long ks, const void *v, long vs, const void *g, long gs, long N,
                                long T, long L, long Dv, float eps, const float *S_in,
                                const float *z_in, float *G, float *Gz, void *dq, long dqs,
                                void *dk, long dks, void *dv, long dvs, float *work) {
    float *FQ = work, *FK = FQ + T * L, *DN = FK + T * L, *DS = DN + T * Dv;
    float *ST = DS + T, *zc = ST + Dv * L, *d1 = zc + 3 * L, *P = d1 + 3 * L;
    float *VW = P + 2 * W * W, *DVW = VW + T * Dv; /* bf: v widened; two rows of dv */
    float *const zs[3] = {zc, zc + L, zc + 2 * L}, *const ds[3] = {d1, d1 + L, d1 + 2 * L};
    long es = bf ? 2 : 4;
    for (long n = 0; n < N; ++n) {
        const float *vn = bf ? VW : (const float *)v + n * vs; /* v's rows as float32 */
        float *Gn = G + n * L * Dv, *Gzn = Gz + n * L;
        transpose(L, Dv, S_in + n * L * Dv, ST);
        memcpy(zc, z_in + n * L, (size_t)L * sizeof(float));
        /* forward walk: features, dn, ds, then dq, REC_U tokens a pass; zs[u]: z after token
         * t + u (zs[0] is zc, updated in place) */
        for (long t = 0, m; t < T; t += m) {
            m = T - t < REC_U ? T - t : REC_U;
            if (bf) f32_rows(v, n * vs + t * Dv, 1, m * Dv, VW + t * Dv);
            const float *b[3], *c[3], *x[3];
            rank_rows(vn, t, m, Dv, b), rank_rows(DN, t, m, Dv, c), rank_rows(FK, t, m, L, x);
            long ta = t + REC_AHEAD; /* the rows REC_AHEAD tokens on, as the forward (0.95x
                                      * the time, the same C harness and Xeon) */
            la_fetch_run(la_next_chunk(q, n * qs, ta, T, m, L, es));
            la_fetch_run(la_next_chunk(k, n * ks, ta, T, m, L, es));
            la_fetch_run(la_next_chunk(v, n * vs, ta, T, m, Dv, es));
            la_fetch_run(la_next_chunk(g, n * gs, ta, T, m, Dv, es));
            float inv[3]; /* 1 / s of each token (out_dn) */
            for (long u = 0; u < m; ++u) {
                float *fq = FQ + (t + u) * L, *fk = FK + (t + u) * L;
                phi_rows(kind, q, n * qs + (t + u) * L, bf, L, fq);
                phi_rows(kind, k, n * ks + (t + u) * L, bf, L, fk);
                add_colsums(zs[u], zs[u ? u - 1 : 0], fk, NULL, 1, L);
                inv[u] = out_dn(g, n * gs + (t + u) * Dv, bf, dot(fq, zs[u], L) + eps, Dv,
                                DN + (t + u) * Dv);
            }
            for (long c0 = 0; c0 < L; c0 += NV * W) {
                int nb = (L - c0) / W < NV ? (int)((L - c0) / W) : NV;
                const float *xc[3] = {x[0] + c0, x[1] + c0, x[2] + c0};
                float *const dc[3] = {ds[0] + c0, ds[1] + c0, ds[2] + c0};
                rank_any(nb, (int)m, Dv, L, b, c, xc, ST + c0, dc);
            }
            for (long u = 0; u < m; ++u) { /* ds from S dn (out_ds), then dq */
                DS[t + u] = out_ds(FQ + (t + u) * L, ds[u], inv[u], L);
                grad_phi_row(kind, dq, n * dqs + (t + u) * L, bf, ds[u], DS[t + u], zs[u], q,
                             n * qs + (t + u) * L, FQ + (t + u) * L, L);
            }
            if (m > 1) memcpy(zc, zs[m - 1], (size_t)L * sizeof(float));
        }
        /* backward walk: G, Gz, dk, dv; two tokens a pass over G where REC_U is three (32
         * vector registers: two tokens' dn, v and dv and four broadcasts fit) */
        for (long t = T - 1, m; t >= 0; t -= m) {
            m = REC_U > 2 && t > 0 ? 2 : 1;
            long t2 = t - m + 1; /* the pair's second token (t itself when alone) */
            const float *fq[2] = {FQ + t * L, FQ + t2 * L}, *fk[2] = {FK + t * L, FK + t2 * L};
            float *const dkr[2] = {d1, d1 + L}; /* each token's row sums G v */
            /* where each token's dv row goes: its place in dv, or with bf a row of scratch */
            float *dvr[2] = {DVW, DVW + Dv};
            if (!bf)
                dvr[0] = (float *)dv + n * dvs + t * Dv, dvr[1] = (float *)dv + n * dvs + t2 * Dv;
            for (long j0 = 0; j0 < Dv; j0 += NV * W) {
                int nb = (Dv - j0) / W < NV ? (int)((Dv - j0) / W) : NV;
                const float *dn[2] = {DN + t * Dv + j0, DN + t2 * Dv + j0};
                const float *vc[2] = {vn + t * Dv + j0, vn + t2 * Dv + j0};
                float *const dvc[2] = {dvr[0] + j0, dvr[1] + j0};
                rec_dk_any(nb, m == 2, j0 > 0, L, Dv, fq, fk, dn, vc, Gn + j0, dvc, dkr, P);
            }
            for (long u = 0; u < m; ++u) { /* Gz after token t - u, then its dk (and dv) */
                add_colsums(Gzn, Gzn, fq[u], DS + t - u, 1, L);
                grad_phi_row(kind, dk, n * dks + (t - u) * L, bf, dkr[u], 1.0f, Gzn, k,
                             n * ks + (t - u) * L, fk[u], L);
                if (bf) la_narrowed((u16 *)dv + n * dvs + (t - u) * Dv, dvr[u], 0, Dv, LA_BF16);
            }
        }
    }
}
