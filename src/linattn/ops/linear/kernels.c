/* The linear-attention kernels of linattn.ops.linear.native (see ops/native/common.h for the
 * vector helpers and the layout conventions). */
#ifndef LA_COMMON_H
#include "../native/common.h"
#endif
#ifndef LA_TILES_H
#include "../native/tiles.h"
#endif

/* out[n, t] = phi(x[n, t]) for t < T (rows of D), zero where keep[n, t] == 0; z[n] += sum_t
 * out[n, t] (as stored, i.e. after rounding to bfloat16) when z is not NULL. x and out are
 * float32 or bfloat16 (xbf, obf); keep: NULL or bytes with head stride ks. */
static void la_phi(int kind, const void *x, int xbf, long N, long T, long D, long xs, void *out, int obf,
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

/* dst = (dphi + c vec) phi'(x) for one row of L (no vec term where vec is NULL); f = phi(x).
 * A gradient row is not read back: whole vectors go out with non-temporal stores where the row
 * is aligned to them (stream_fence() before the kernel returns). */
static inline void grad_phi_row(int kind, float *dst, const float *dphi, float c,
                                const float *vec, const float *x, const float *f, long L) {
    long j = 0;
    for (; j + W <= L; j += W) {
        vf d = vload(dphi + j);
        if (vec) d += c * vload(vec + j);
        vstore_stream(dst + j, d * vdphi(kind, vload(x + j), vload(f + j)));
    }
    for (; j < L; ++j) dst[j] = (dphi[j] + (vec ? c * vec[j] : 0.0f)) * sdphi(kind, x[j], f[j]);
}

/* The normaliser of row i of a causal chunk before eps: fq_i . z + sum_{j <= i} A[i, j]. The
 * scores above the diagonal are zero (scores() writes them so), so the row is summed in whole
 * vectors up to the one holding the diagonal. */
static inline float causal_den(const float *fq_i, const float *z, const float *A_i, long i,
                               long L) {
    vf acc = vsplat(0.0f);
    for (long j = 0; j <= i; j += W) acc += vload(A_i + j);
    return dot(fq_i, z, L) + hsum(acc);
}

/* Buffers below are contiguous (N, R, F) (R >= T rows per head, the first T used); per-row
 * scalars (sx, ds, coef) are (N, R); out, g and dx are views with head strides os, gs, dxs. */

/* out[n, t] = num[n, t] / guarded(den); num, fq and out float32 or bfloat16 (nbf, fbf, obf). */
static void la_normalise(const void *num, int nbf, const void *fq, int fbf, const float *z, long zrows,
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
static void la_norm_grad(const float *o, long os, const float *fq, const float *z, long zrows,
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
static void la_grad_phi(int kind, const float *dphi, const float *x, long xs, const float *f,
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
    stream_fence();
}

/* Causal chunks: A (B, C, C), float32 or bfloat16 (abf), loses its strictly upper triangle
 * (j > i) in place, and rs[b, i] = sum_{j <= i} A[b, i, j] (float32). */
static void la_mask_rowsum(void *A, int abf, long B, long C, float *rs) {
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
static void la_mask_add(float *A, long B, long C, const float *ds) {
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
static void la_prefix(float *P, long N, long n, long F, const float *S0, float *S1, int reverse) {
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

/* The causal forwards keep the state before every block of `block` tokens (a multiple of the
 * chunk) for the backward: at t0 = i block, head n's S and z go to Ss[i sb + n L Dv] and
 * zss[i zb + n L] (Ss NULL: none kept). One call walks all T tokens of its heads. */
static inline void keep_state(const float *S, const float *z, long n, long t0, long block,
                              float *Ss, long sb, float *zss, long zb, long L, long Dv) {
    if (!Ss || t0 % block) return;
    memcpy(Ss + t0 / block * sb + n * L * Dv, S, (size_t)(L * Dv) * sizeof(float));
    memcpy(zss + t0 / block * zb + n * L, z, (size_t)L * sizeof(float));
}

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
        pair_rows(f, 0, 2 * p * L, odd ? (2 * p + 1) * L : -1, L, kp + p * L);
    }
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
    for (long n = 0; n < N; ++n) {
        float *Sn = S + n * L * Dv, *zn = z + n * L;
        for (long t0 = 0; t0 < T; t0 += C) {
            long Cn = T - t0 < C ? T - t0 : C, P = (Cn + 1) / 2;
            keep_state(Sn, zn, n, t0, block, Ss, sb, zss, zb, L, Dv);
            phi_rows(kind, q, n * qs + t0 * L, 1, Cn * L, fq);
            phi_rows(kind, k, n * ks + t0 * L, 1, Cn * L, fk);
            if (Cn < C) /* a last, partial chunk: zero keys beyond it score 0 */
                memset(fk + Cn * L, 0, (size_t)((C - Cn) * L) * sizeof(float));
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
}
#endif

#ifndef REC_FORWARD
#define REC_FORWARD 1
#endif
/* Tokens whose features are made at once, just before their pass over the state: a pair. In
 * bursts of 64 tokens the loads of q and k stalled (127 against 115 ms, AMD Zen 4); a pair's
 * loads overlap the previous pair's multiply-adds. */
#ifndef REC_C
#define REC_C 2
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
 * units instead. Two tokens share each pass over the rows (one load and one store of S for
 * both), so the loop is bound by the multiply-adds. AMD Zen 4, B1 H8 T65536 d64, one thread:
 * 183 ms chunked, 108-113 ms here (0.40 and 0.65-0.68 of the FMA peak). */

/* Tokens t, t + 1 (two) or t alone over the rows of a block of nb column vectors: S (rows of
 * Dv, offset to the block) updated in place, each token's numerator scaled by inv[t] into out
 * (rows of Dv from element o0, offset to the block; float32 or bfloat16 with bf). fq, fk: the
 * chunk's features (rows of L); vc: its values (rows of Dv, offset to the block). */
static inline __attribute__((always_inline)) void rec_tokens(int nb, int two, long t, long L,
                                                             long Dv, const float *fq,
                                                             const float *fk, const float *vc,
                                                             const float *inv, float *S,
                                                             void *out, long o0, int bf) {
    vf v1[NV], v2[NV], a1[NV], a2[NV];
    for (int j = 0; j < nb; ++j) {
        v1[j] = vload(vc + t * Dv + j * W), a1[j] = a2[j] = vsplat(0.0f);
        v2[j] = two ? vload(vc + (t + 1) * Dv + j * W) : vsplat(0.0f);
    }
    const float *q1 = fq + t * L, *k1 = fk + t * L, *q2 = q1 + L, *k2 = k1 + L;
    for (long i = 0; i < L; ++i) {
        vf kk1 = vsplat(k1[i]), qq1 = vsplat(q1[i]);
        vf kk2 = vsplat(two ? k2[i] : 0.0f), qq2 = vsplat(two ? q2[i] : 0.0f);
        float *Si = S + i * Dv;
        for (int j = 0; j < nb; ++j) {
            vf x = vload(Si + j * W) + kk1 * v1[j];
            a1[j] += qq1 * x;
            if (two) {
                x += kk2 * v2[j];
                a2[j] += qq2 * x;
            }
            vstore(Si + j * W, x);
        }
    }
    for (int j = 0; j < nb; ++j) {
        long at = o0 + t * Dv + j * W;
        if (bf) {
            vstore_any(out, at, a1[j] * inv[t], 1);
            if (two) vstore_any(out, at + Dv, a2[j] * inv[t + 1], 1);
        } else {
            vstore_stream((float *)out + at, a1[j] * inv[t]);
            if (two) vstore_stream((float *)out + at + Dv, a2[j] * inv[t + 1]);
        }
    }
}

/* The Cn tokens of a chunk over one block of nb column vectors (rec_tokens' arguments). */
static inline __attribute__((always_inline)) void rec_cols(int nb, long Cn, long L, long Dv,
                                                           const float *fq, const float *fk,
                                                           const float *vc, const float *inv,
                                                           float *S, void *out, long o0,
                                                           int bf) {
    long t = 0;
    for (; t + 2 <= Cn; t += 2) rec_tokens(nb, 1, t, L, Dv, fq, fk, vc, inv, S, out, o0, bf);
    if (t < Cn) rec_tokens(nb, 0, t, L, Dv, fq, fk, vc, inv, S, out, o0, bf);
}

static void rec_cols_any(int nb, long Cn, long L, long Dv, const float *fq, const float *fk,
                         const float *vc, const float *inv, float *S, void *out, long o0,
                         int bf) {
    switch (nb * 2 + bf) { /* blocks beyond this ISA's NV are constant-false, never asked for */
#define R_(c, b)                                                                              \
    case c * 2 + b:                                                                           \
        if (c <= NV) rec_cols(c <= NV ? c : NV, Cn, L, Dv, fq, fk, vc, inv, S, out, o0, b);   \
        break;
        R_(1, 0) R_(1, 1) R_(2, 0) R_(2, 1) R_(3, 0) R_(3, 1) R_(4, 0) R_(4, 1)
#undef R_
    default: break;
    }
}

/* The recurrent causal forward (la_causal_forward's arguments and state rules, float32
 * arithmetic on float32 or bfloat16 rows): per REC_C tokens, their features, z and each
 * token's 1 / guarded(den + eps) first, then the tokens over each block of columns. work:
 * 2 C L + C Dv + C floats. */
static void causal_forward_rec(int kind, int bf, const void *q, long qs, const void *k, long ks,
                               const void *v, long vs, long N, long T, long L, long Dv, long C,
                               float eps, float *S, float *z, void *out, long os, float *Ss,
                               long sb, float *zss, long zb, long block, float *work) {
    float *fq = work, *fk = fq + C * L, *vbuf = fk + C * L, *inv = vbuf + C * Dv;
    long R = C < REC_C ? C : REC_C;
    for (long n = 0; n < N; ++n) {
        float *Sn = S + n * L * Dv, *zn = z + n * L;
        for (long t0 = 0; t0 < T; t0 += R) {
            long Cn = T - t0 < R ? T - t0 : R;
            if (t0 % C == 0) keep_state(Sn, zn, n, t0, block, Ss, sb, zss, zb, L, Dv);
            const float *vc = f32_rows(v, n * vs + t0 * Dv, bf, Cn * Dv, vbuf);
            phi_rows(kind, q, n * qs + t0 * L, bf, Cn * L, fq);
            phi_rows(kind, k, n * ks + t0 * L, bf, Cn * L, fk);
            for (long t = 0; t < Cn; ++t) { /* z after token t, and its normaliser */
                add_colsums(zn, zn, fk + t * L, NULL, 1, L);
                inv[t] = 1.0f / guarded(dot(fq + t * L, zn, L), eps);
            }
            for (long j0 = 0; j0 < Dv; j0 += NV * W) {
                int nb = (Dv - j0) / W < NV ? (int)((Dv - j0) / W) : NV;
                rec_cols_any(nb, Cn, L, Dv, fq, fk, vc + j0, inv, Sn + j0, out,
                             n * os + t0 * Dv + j0, bf);
            }
        }
    }
}

/* The causal forward over T tokens of N heads, chunks of C (a multiple of W; L and Dv
 * multiples of W too). q, k: rows of L with head strides qs, ks; v: rows of Dv, stride vs;
 * out: rows of Dv, stride os; all float32, or all bfloat16 with bf. S (N, L, Dv) and z (N, L),
 * float32: the state before, updated in place to the state after; Ss, zss: the states kept
 * before every block (keep_state; NULL: none). States up to REC_MAX_STATE take the recurrent
 * form (causal_forward_rec), larger ones the bfloat16 dot-product form (bfloat16 rows where
 * the build has it: causal_forward_dp) or the chunked float32 form below. work: 2 C L + L C +
 * C C + 2 C Dv floats (and more for the dot-product form). Returns 0, or -1 on bad sizes. */
static int la_causal_forward(int kind, int bf, const void *q, long qs, const void *k, long ks,
                      const void *v, long vs, long N, long T, long L, long Dv, long C, float eps,
                      float *S, float *z, void *out, long os, float *Ss, long sb, float *zss,
                      long zb, long block, float *work) {
    if (C % W || L % W || Dv % W || (Ss && (block < C || block % C))) return -1;
    if (REC_FORWARD && L * Dv <= REC_MAX_STATE) {
        causal_forward_rec(kind, bf, q, qs, k, ks, v, vs, N, T, L, Dv, C, eps, S, z, out, os, Ss,
                           sb, zss, zb, block, work);
        stream_fence();
        return 0;
    }
#if defined(LA_DP_BF16)
    if (bf && L % 32 == 0) {
        causal_forward_dp(kind, q, qs, k, ks, v, vs, N, T, L, Dv, C, eps, S, z, out, os, Ss, sb,
                          zss, zb, block, work);
        stream_fence();
        return 0;
    }
#endif
    float *fq = work, *fk = fq + C * L, *fkT = fk + C * L, *A = fkT + L * C, *num = A + C * C;
    float *vbuf = num + C * Dv;
    for (long n = 0; n < N; ++n) {
        float *Sn = S + n * L * Dv, *zn = z + n * L;
        for (long t0 = 0; t0 < T; t0 += C) {
            long Cn = T - t0 < C ? T - t0 : C;
            keep_state(Sn, zn, n, t0, block, Ss, sb, zss, zb, L, Dv);
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
                scale_row_stream(out, n * os + (t0 + i) * Dv, bf, num + i * Dv,
                                 1.0f / guarded(den, eps), Dv);
            }
            gemm(L, Dv, Cn, fk, 1, L, vc, Dv, Sn, Dv, 1, FULL);   /* S += phi(k)^T v */
            add_colsums(zn, zn, fk, NULL, Cn, L);
        }
    }
    stream_fence();
    return 0;
}

/* ------------------------------------------------ causal backward, float32: the recurrent form
 * With dn_t = g_t / s_t, ds_t = -(g_t . o_t) / s_t (s_t = guarded(phi(q_t) . z_t + eps)):
 *     forward, t = 0 ..:   S_t = S_{t-1} + phi(k_t) v_t^T,  dphi(q_t) = S_t dn_t + ds_t z_t,
 *     backward, t = .. 0:  G += phi(q_t) dn_t^T,  Gz += ds_t phi(q_t),
 *                          dphi(k_t) = G v_t + Gz,  dv_t = G^T phi(k_t),
 * 5 multiply-adds per state element and token (and the sums over a row that G v_t needs, done
 * W rows at a time through a block transpose) against the chunked form's 7.5 in shorter
 * products. The forward walk keeps S transposed (rows of L: S^T_j += v_tj phi(k_t) and
 * dphi(q_t) += dn_tj S^T_j, two tokens a pass as in the forward); the backward walk keeps G as
 * given (rows of Dv). */

/* Tokens t, t + 1 (two) or t alone over the Dv rows of S^T (ST, rows of L, nb vectors of one
 * block of L columns): ST updated in place; acc1/acc2 (nb vectors each) += dn_t[j] ST_j. */
static inline __attribute__((always_inline)) void rec_dq_tokens(int nb, int two, long L,
                                                                long Dv, const float *fk1,
                                                                const float *fk2,
                                                                const float *v1,
                                                                const float *v2,
                                                                const float *dn1,
                                                                const float *dn2, float *ST,
                                                                float *d1, float *d2) {
    vf k1[NV], k2[NV], a1[NV], a2[NV];
    for (int c = 0; c < nb; ++c) {
        k1[c] = vload(fk1 + c * W), a1[c] = a2[c] = vsplat(0.0f);
        k2[c] = two ? vload(fk2 + c * W) : vsplat(0.0f);
    }
    for (long j = 0; j < Dv; ++j) {
        vf vv1 = vsplat(v1[j]), nn1 = vsplat(dn1[j]);
        vf vv2 = vsplat(two ? v2[j] : 0.0f), nn2 = vsplat(two ? dn2[j] : 0.0f);
        float *Sj = ST + j * L;
        for (int c = 0; c < nb; ++c) {
            vf x = vload(Sj + c * W) + vv1 * k1[c];
            a1[c] += nn1 * x;
            if (two) {
                x += vv2 * k2[c];
                a2[c] += nn2 * x;
            }
            vstore(Sj + c * W, x);
        }
    }
    for (int c = 0; c < nb; ++c) {
        vstore(d1 + c * W, a1[c]);
        if (two) vstore(d2 + c * W, a2[c]);
    }
}

static void rec_dq_any(int nb, int two, long L, long Dv, const float *fk1, const float *fk2,
                       const float *v1, const float *v2, const float *dn1, const float *dn2,
                       float *ST, float *d1, float *d2) {
    switch (nb * 2 + two) { /* blocks beyond this ISA's NV are constant-false, never asked for */
#define R_(c, b)                                                                              \
    case c * 2 + b:                                                                           \
        if (c <= NV)                                                                          \
            rec_dq_tokens(c <= NV ? c : NV, b, L, Dv, fk1, fk2, v1, v2, dn1, dn2, ST, d1, d2); \
        break;
        R_(1, 0) R_(1, 1) R_(2, 0) R_(2, 1) R_(3, 0) R_(3, 1) R_(4, 0) R_(4, 1)
#undef R_
    default: break;
    }
}

/* Token t of the backward walk over the rows of G (rows of Dv, nb vectors of one block of Dv
 * columns, offset to it): G_i += fq_i dn; dv (nb vectors, offset) = sum_i fk_i G_i; and into
 * dk (L floats) the row sums of G_i * v over this block's columns, added (add) or set. P: W x
 * W floats of scratch. */
static inline __attribute__((always_inline)) void rec_dk_token(int nb, long L, long Dv,
                                                               const float *fq,
                                                               const float *fk,
                                                               const float *dn,
                                                               const float *v, float *G,
                                                               float *dv, float *dk, int add,
                                                               float *P) {
    vf nn[NV], vv[NV], acc[NV];
    for (int c = 0; c < nb; ++c)
        nn[c] = vload(dn + c * W), vv[c] = vload(v + c * W), acc[c] = vsplat(0.0f);
    for (long i0 = 0; i0 < L; i0 += W) {
        for (long i = i0; i < i0 + W; ++i) {
            vf qi = vsplat(fq[i]), ki = vsplat(fk[i]), p = vsplat(0.0f);
            float *Gi = G + i * Dv;
            for (int c = 0; c < nb; ++c) {
                vf x = vload(Gi + c * W) + qi * nn[c];
                vstore(Gi + c * W, x);
                acc[c] += ki * x;
                p += x * vv[c];
            }
            vstore(P + (i - i0) * W, p);
        }
        vf sum = row_sums(P);
        vstore(dk + i0, add ? vload(dk + i0) + sum : sum);
    }
    for (int c = 0; c < nb; ++c) vstore(dv + c * W, acc[c]);
}

static void rec_dk_any(int nb, long L, long Dv, const float *fq, const float *fk,
                       const float *dn, const float *v, float *G, float *dv, float *dk, int add,
                       float *P) {
    switch (nb) {
#define R_(c)                                                                                 \
    case c:                                                                                   \
        if (c <= NV) rec_dk_token(c <= NV ? c : NV, L, Dv, fq, fk, dn, v, G, dv, dk, add, P);     \
        break;
        R_(1) R_(2) R_(3) R_(4)
#undef R_
    default: break;
    }
}

/* la_causal_backward's recurrent form (its arguments and state rules). work: T (2 L + Dv + 1)
 * + Dv L + 4 L + W W floats. */
static void causal_backward_rec(int kind, const float *q, long qs, const float *k, long ks,
                                const float *v, long vs, const float *o, long os,
                                const float *g, long gs, long N, long T, long L, long Dv,
                                float eps, const float *S_in, const float *z_in, float *G,
                                float *Gz, float *dq, long dqs, float *dk, long dks, float *dv,
                                long dvs, float *work) {
    float *FQ = work, *FK = FQ + T * L, *DN = FK + T * L, *DS = DN + T * Dv;
    float *ST = DS + T, *zc = ST + Dv * L, *z2 = zc + L, *d1 = z2 + L, *d2 = d1 + L;
    float *P = d2 + L;
    for (long n = 0; n < N; ++n) {
        const float *qn = q + n * qs, *kn = k + n * ks, *vn = v + n * vs;
        float *Gn = G + n * L * Dv, *Gzn = Gz + n * L;
        transpose(L, Dv, S_in + n * L * Dv, ST);
        memcpy(zc, z_in + n * L, (size_t)L * sizeof(float));
        /* forward walk: features, dn, ds, then dq, two tokens a pass */
        for (long t = 0; t < T; t += 2) {
            int two = t + 1 < T;
            for (long u = t; u < t + 1 + two; ++u) {
                float *fq = FQ + u * L, *fk = FK + u * L, *zu = u == t ? zc : z2;
                phi_rows(kind, qn, u * L, 0, L, fq);
                phi_rows(kind, kn, u * L, 0, L, fk);
                if (u > t) memcpy(z2, zc, (size_t)L * sizeof(float));
                add_colsums(zu, zu, fk, NULL, 1, L);
                DS[u] = grad_out_row(g + n * gs + u * Dv, o + n * os + u * Dv,
                                     dot(fq, zu, L) + eps, Dv, DN + u * Dv);
            }
            for (long c0 = 0; c0 < L; c0 += NV * W) {
                int nb = (L - c0) / W < NV ? (int)((L - c0) / W) : NV;
                rec_dq_any(nb, two, L, Dv, FK + t * L + c0, FK + (t + 1) * L + c0,
                           vn + t * Dv, vn + (t + 1) * Dv, DN + t * Dv, DN + (t + 1) * Dv,
                           ST + c0, d1 + c0, d2 + c0);
            }
            grad_phi_row(kind, dq + n * dqs + t * L, d1, DS[t], zc, qn + t * L, FQ + t * L, L);
            if (two) {
                grad_phi_row(kind, dq + n * dqs + (t + 1) * L, d2, DS[t + 1], z2,
                             qn + (t + 1) * L, FQ + (t + 1) * L, L);
                memcpy(zc, z2, (size_t)L * sizeof(float));
            }
        }
        /* backward walk: G, Gz, dk, dv */
        for (long t = T - 1; t >= 0; --t) {
            const float *fq = FQ + t * L, *fk = FK + t * L;
            add_colsums(Gzn, Gzn, fq, DS + t, 1, L);
            for (long j0 = 0; j0 < Dv; j0 += NV * W) {
                int nb = (Dv - j0) / W < NV ? (int)((Dv - j0) / W) : NV;
                rec_dk_any(nb, L, Dv, fq, fk, DN + t * Dv + j0, vn + t * Dv + j0, Gn + j0,
                           dv + n * dvs + t * Dv + j0, d1, j0 > 0, P);
            }
            grad_phi_row(kind, dk + n * dks + t * L, d1, 1.0f, Gzn, kn + t * L, fk, L);
        }
    }
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
static int la_causal_backward(int kind, const float *q, long qs, const float *k, long ks,
                       const float *v, long vs, const float *o, long os, const float *g, long gs,
                       long N, long T, long L, long Dv, long C, float eps, const float *S_in,
                       const float *z_in, float *G, float *Gz, float *dq, long dqs, float *dk,
                       long dks, float *dv, long dvs, float *work) {
    if (C % W || L % W || Dv % W) return -1;
    if (REC_FORWARD && L * Dv <= REC_MAX_STATE) {
        causal_backward_rec(kind, q, qs, k, ks, v, vs, o, os, g, gs, N, T, L, Dv, eps, S_in,
                            z_in, G, Gz, dq, dqs, dk, dks, dv, dvs, work);
        stream_fence();
        return 0;
    }
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
            if (Cn == C) { /* vT[d, t] = v[t, d], zero beyond the chunk */
                transpose(C, Dv, vc, vT);
            } else {
                for (long d = 0; d < Dv; ++d)
                    for (long t = 0; t < C; ++t) vT[d * C + t] = t < Cn ? vc[t * Dv + d] : 0.0f;
            }
            scores(Cn, C, Dv, dn, vT, dA);
            for (long i = 0; i < Cn; ++i) { /* + ds[i] on and below the diagonal */
                float *row = dA + i * C;
                long j = 0;
                for (; j + W <= i + 1; j += W) vstore(row + j, vload(row + j) + ds[i]);
                for (; j <= i; ++j) row[j] += ds[i];
            }
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
    stream_fence();
    return 0;
}

#if defined(LA_DP_BF16)
/* la_noncausal_forward for bfloat16 inputs and outputs, on dot products (L a multiple of 32).
 * work: C L + C Dv + ceil(C / 2) (L + Dv) + L Dv / 2 floats. */
static void noncausal_forward_dp(int kind, const void *q, long qs, const void *k, long ks,
                                 const void *v, long vs, long N, long Tq, long Tk, long L,
                                 long Dv, long C, float eps, float *S, float *z, void *out,
                                 long os, float *work) {
    float *f = work, *num = f + C * L;
    u32 *kp = (u32 *)(num + C * Dv), *vp = kp + (C + 1) / 2 * L, *fqp = kp;
    u32 *Sp = vp + (C + 1) / 2 * Dv;
    for (long n = 0; n < N; ++n) {
        float *Sn = S + n * L * Dv, *zn = z + n * L;
        for (long t0 = 0; t0 < Tk; t0 += C) {
            long Cn = Tk - t0 < C ? Tk - t0 : C, P = (Cn + 1) / 2;
            phi_rows(kind, k, n * ks + t0 * L, 1, Cn * L, f);
            pair_keys(v, n * vs + t0 * Dv, Dv, f, L, Cn, vp, kp);
            gemm_dp(L, Dv, P, kp, 1, L, vp, Dv, Sn, Dv, 1, 0);
            add_colsums(zn, zn, f, NULL, Cn, L);
        }
        if (!Tq) continue;
        pair_state(Sn, L, Dv, Sp);
        for (long t0 = 0; t0 < Tq; t0 += C) {
            long Cn = Tq - t0 < C ? Tq - t0 : C;
            phi_rows(kind, q, n * qs + t0 * L, 1, Cn * L, f);
            bf16_rows(f, Cn, L, (u16 *)fqp); /* phi(q) rows: pairs along the features */
            gemm_dp(Cn, Dv, L / 2, fqp, L / 2, 1, Sp, Dv, num, Dv, 0, 0);
            for (long i = 0; i < Cn; ++i)
                scale_row_stream(out, n * os + (t0 + i) * Dv, 1, num + i * Dv,
                                 1.0f / guarded(dot(f + i * L, zn, L), eps), Dv);
        }
    }
}
#endif


/* ------------------------------------------------------------- non-causal, float32, one pass
 * Per head, chunk by chunk with the chunk's features in L1:
 *     keys:     S += phi(k)^T v,  z += sum phi(k)
 *     queries:  o = phi(q) S / guarded(phi(q) . z + eps)
 * Tq queries, Tk keys; q, k, v, out float32, or bfloat16 with bf; S (N, L, Dv), z (N, L)
 * float32 in/out (the sums include what they held). The keys go KEY_CHUNKS chunks at a time:
 * each register tile of S is loaded and stored once per key chunk, and at 64 tokens that was
 * 9 % of the key pass (AMD Zen 4, T = 65536; 256 tokens and more all ran alike).
 * work: KEY_CHUNKS C (L + Dv) + C Dv floats. */
enum { KEY_CHUNKS = 4 };
static int la_noncausal_forward(int kind, int bf, const void *q, long qs, const void *k, long ks,
                         const void *v, long vs, long N, long Tq, long Tk, long L, long Dv,
                         long C, float eps, float *S, float *z, void *out, long os,
                         float *work) {
    if (L % W || Dv % W) return -1;
#if defined(LA_DP_BF16)
    if (bf && L % 32 == 0) { /* pairs of feature vectors: L a multiple of 2 W */
        noncausal_forward_dp(kind, q, qs, k, ks, v, vs, N, Tq, Tk, L, Dv, C, eps, S, z, out, os,
                             work);
        stream_fence();
        return 0;
    }
#endif
    long Ck = KEY_CHUNKS * C;
    float *f = work, *num = f + Ck * L, *vbuf = num + C * Dv;
    for (long n = 0; n < N; ++n) {
        float *Sn = S + n * L * Dv, *zn = z + n * L;
        for (long t0 = 0; t0 < Tk; t0 += Ck) {
            long Cn = Tk - t0 < Ck ? Tk - t0 : Ck;
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
                scale_row_stream(out, n * os + (t0 + i) * Dv, bf, num + i * Dv,
                                 1.0f / guarded(dot(f + i * L, zn, L), eps), Dv);
        }
    }
    stream_fence();
    return 0;
}

/* Its backward: with dn = g / s, ds = -(g . o) / s per query row,
 *     G = G_in + sum phi(q)^T dn,  Gz = Gz_in + sum ds phi(q),
 *     dq = (dn S^T + ds z) phi'(q),  dk = (v G^T + Gz) phi'(k),  dv = phi(k) G.
 * S, z: the final sums of the forward; G, Gz in/out. The query pass (dq, G, Gz) runs over
 * the Tq queries, the key pass (dk, dv, from G and Gz) over the Tk keys; parts & 1 and parts & 2
 * select them, so that the query pass can be fed in blocks. work: 2 C L + 2 L Dv + C Dv. */
static int la_noncausal_backward(int kind, int parts, const float *q, long qs, const float *k, long ks,
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
    stream_fence();
    return 0;
}

/* The scratch, in floats, of each one-pass kernel's `work` (one place for the Python side and the
 * C harness): pass 0 la_noncausal_forward, 1 la_causal_forward, 2 la_noncausal_backward, 3
 * la_causal_backward over blocks of nc chunks; a forward's the larger of its float32 form's and,
 * where this build has it, its bfloat16 dot-product form's (C even). -1 for an unknown pass. */
long la_linear_work(int pass, long C, long L, long Dv, long nc) {
    long f32, dp = 0;
    switch (pass) {
    case 0:
        f32 = KEY_CHUNKS * C * (L + Dv) + C * Dv;
#if defined(LA_DP_BF16)
        dp = C * L + C * Dv + (C + 1) / 2 * (L + Dv) + L * Dv / 2;
#endif
        break;
    case 1:
        f32 = 2 * C * L + L * C + C * C + 2 * C * Dv;
#if defined(LA_DP_BF16)
        dp = 2 * C * L + C * C + C * Dv + (3 * C * L + C * C + C * Dv + L * Dv) / 2;
#endif
        break;
    case 2:
        f32 = 2 * C * L + 2 * L * Dv + C * Dv;
        break;
    case 3:
        f32 = nc * (2 * C * L + L * Dv + L) + 2 * C * C + Dv * C + 2 * Dv * L + 2 * C * L + C * Dv
              + C;
        dp = nc * C * (2 * L + Dv + 1) + Dv * L + 4 * L + W * W; /* the recurrent form's */
        break;
    default:
        return -1;
    }
    return f32 > dp ? f32 : dp;
}

/* ------------------------------------------------------------------ the Python entry points
 * One argument struct per kernel (ops/native/common.h); linattn/ops/linear/native.py mirrors
 * each in ctypes and the layouts are checked against la_linear_abi when the library loads. */
#define LA_PHI_ARGS(X, la_s) \
    X(la_s, int, kind, 'i') X(la_s, const void *, x, 'p') X(la_s, int, xbf, 'i') X(la_s, long, N, 'l') \
    X(la_s, long, T, 'l') X(la_s, long, D, 'l') X(la_s, long, xs, 'l') X(la_s, void *, out, 'p') \
    X(la_s, int, obf, 'i') X(la_s, long, R, 'l') X(la_s, float *, z, 'p') \
    X(la_s, const unsigned char *, keep, 'p') X(la_s, long, ks, 'l')
LA_ARGS(la_phi_args, LA_PHI_ARGS)
int la_phi_call(const la_phi_args *a) {
    la_phi(a->kind, a->x, a->xbf, a->N, a->T, a->D, a->xs, a->out, a->obf, a->R, a->z, a->keep,
           a->ks);
    return 0;
}

#define LA_NORMALISE_ARGS(X, la_s) \
    X(la_s, const void *, num, 'p') X(la_s, int, nbf, 'i') X(la_s, const void *, fq, 'p') \
    X(la_s, int, fbf, 'i') X(la_s, const float *, z, 'p') X(la_s, long, zrows, 'l') \
    X(la_s, const float *, sx, 'p') X(la_s, long, N, 'l') X(la_s, long, T, 'l') X(la_s, long, R, 'l') \
    X(la_s, long, L, 'l') X(la_s, long, Dv, 'l') X(la_s, float, eps, 'f') X(la_s, void *, out, 'p') \
    X(la_s, int, obf, 'i') X(la_s, long, os, 'l')
LA_ARGS(la_normalise_args, LA_NORMALISE_ARGS)
int la_normalise_call(const la_normalise_args *a) {
    la_normalise(a->num, a->nbf, a->fq, a->fbf, a->z, a->zrows, a->sx, a->N, a->T, a->R, a->L,
                 a->Dv, a->eps, a->out, a->obf, a->os);
    return 0;
}

#define LA_NORM_GRAD_ARGS(X, la_s) \
    X(la_s, const float *, o, 'p') X(la_s, long, os, 'l') X(la_s, const float *, fq, 'p') \
    X(la_s, const float *, z, 'p') X(la_s, long, zrows, 'l') X(la_s, const float *, sx, 'p') \
    X(la_s, const float *, g, 'p') X(la_s, long, gs, 'l') X(la_s, long, N, 'l') X(la_s, long, T, 'l') \
    X(la_s, long, R, 'l') X(la_s, long, L, 'l') X(la_s, long, Dv, 'l') X(la_s, float, eps, 'f') \
    X(la_s, float *, dnum, 'p') X(la_s, float *, ds, 'p')
LA_ARGS(la_norm_grad_args, LA_NORM_GRAD_ARGS)
int la_norm_grad_call(const la_norm_grad_args *a) {
    la_norm_grad(a->o, a->os, a->fq, a->z, a->zrows, a->sx, a->g, a->gs, a->N, a->T, a->R, a->L,
                 a->Dv, a->eps, a->dnum, a->ds);
    return 0;
}

#define LA_GRAD_PHI_ARGS(X, la_s) \
    X(la_s, int, kind, 'i') X(la_s, const float *, dphi, 'p') X(la_s, const float *, x, 'p') \
    X(la_s, long, xs, 'l') X(la_s, const float *, f, 'p') X(la_s, const float *, coef, 'p') \
    X(la_s, const float *, vec, 'p') X(la_s, long, vrows, 'l') X(la_s, long, N, 'l') \
    X(la_s, long, T, 'l') X(la_s, long, R, 'l') X(la_s, long, L, 'l') \
    X(la_s, const unsigned char *, keep, 'p') X(la_s, long, ks, 'l') X(la_s, float *, dx, 'p') \
    X(la_s, long, dxs, 'l')
LA_ARGS(la_grad_phi_args, LA_GRAD_PHI_ARGS)
int la_grad_phi_call(const la_grad_phi_args *a) {
    la_grad_phi(a->kind, a->dphi, a->x, a->xs, a->f, a->coef, a->vec, a->vrows, a->N, a->T, a->R,
                a->L, a->keep, a->ks, a->dx, a->dxs);
    return 0;
}

#define LA_MASK_ROWSUM_ARGS(X, la_s) \
    X(la_s, void *, A, 'p') X(la_s, int, abf, 'i') X(la_s, long, B, 'l') X(la_s, long, C, 'l') \
    X(la_s, float *, rs, 'p')
LA_ARGS(la_mask_rowsum_args, LA_MASK_ROWSUM_ARGS)
int la_mask_rowsum_call(const la_mask_rowsum_args *a) {
    la_mask_rowsum(a->A, a->abf, a->B, a->C, a->rs);
    return 0;
}

#define LA_MASK_ADD_ARGS(X, la_s) \
    X(la_s, float *, A, 'p') X(la_s, long, B, 'l') X(la_s, long, C, 'l') X(la_s, const float *, ds, 'p')
LA_ARGS(la_mask_add_args, LA_MASK_ADD_ARGS)
int la_mask_add_call(const la_mask_add_args *a) {
    la_mask_add(a->A, a->B, a->C, a->ds);
    return 0;
}

#define LA_PREFIX_ARGS(X, la_s) \
    X(la_s, float *, P, 'p') X(la_s, long, N, 'l') X(la_s, long, n, 'l') X(la_s, long, F, 'l') \
    X(la_s, const float *, S0, 'p') X(la_s, float *, S1, 'p') X(la_s, int, reverse, 'i')
LA_ARGS(la_prefix_args, LA_PREFIX_ARGS)
int la_prefix_call(const la_prefix_args *a) {
    la_prefix(a->P, a->N, a->n, a->F, a->S0, a->S1, a->reverse);
    return 0;
}

#define LA_CAUSAL_FORWARD_ARGS(X, la_s) \
    X(la_s, int, kind, 'i') X(la_s, int, bf, 'i') X(la_s, const void *, q, 'p') X(la_s, long, qs, 'l') \
    X(la_s, const void *, k, 'p') X(la_s, long, ks, 'l') X(la_s, const void *, v, 'p') \
    X(la_s, long, vs, 'l') X(la_s, long, N, 'l') X(la_s, long, T, 'l') X(la_s, long, L, 'l') \
    X(la_s, long, Dv, 'l') X(la_s, long, C, 'l') X(la_s, float, eps, 'f') X(la_s, float *, S, 'p') \
    X(la_s, float *, z, 'p') X(la_s, void *, out, 'p') X(la_s, long, os, 'l') \
    X(la_s, float *, Ss, 'p') X(la_s, long, sb, 'l') X(la_s, float *, zss, 'p') X(la_s, long, zb, 'l') \
    X(la_s, long, block, 'l') X(la_s, float *, work, 'p')
LA_ARGS(la_causal_forward_args, LA_CAUSAL_FORWARD_ARGS)
int la_causal_forward_call(const la_causal_forward_args *a) {
    return (int)la_causal_forward(a->kind, a->bf, a->q, a->qs, a->k, a->ks, a->v, a->vs, a->N, a->T,
            a->L, a->Dv, a->C, a->eps, a->S, a->z, a->out, a->os, a->Ss, a->sb, a->zss, a->zb,
            a->block, a->work);
}

#define LA_CAUSAL_BACKWARD_ARGS(X, la_s) \
    X(la_s, int, kind, 'i') X(la_s, const float *, q, 'p') X(la_s, long, qs, 'l') \
    X(la_s, const float *, k, 'p') X(la_s, long, ks, 'l') X(la_s, const float *, v, 'p') \
    X(la_s, long, vs, 'l') X(la_s, const float *, o, 'p') X(la_s, long, os, 'l') \
    X(la_s, const float *, g, 'p') X(la_s, long, gs, 'l') X(la_s, long, N, 'l') X(la_s, long, T, 'l') \
    X(la_s, long, L, 'l') X(la_s, long, Dv, 'l') X(la_s, long, C, 'l') X(la_s, float, eps, 'f') \
    X(la_s, const float *, S_in, 'p') X(la_s, const float *, z_in, 'p') X(la_s, float *, G, 'p') \
    X(la_s, float *, Gz, 'p') X(la_s, float *, dq, 'p') X(la_s, long, dqs, 'l') X(la_s, float *, dk, 'p') \
    X(la_s, long, dks, 'l') X(la_s, float *, dv, 'p') X(la_s, long, dvs, 'l') X(la_s, float *, work, 'p')
LA_ARGS(la_causal_backward_args, LA_CAUSAL_BACKWARD_ARGS)
int la_causal_backward_call(const la_causal_backward_args *a) {
    return (int)la_causal_backward(a->kind, a->q, a->qs, a->k, a->ks, a->v, a->vs, a->o, a->os,
            a->g, a->gs, a->N, a->T, a->L, a->Dv, a->C, a->eps, a->S_in, a->z_in, a->G, a->Gz,
            a->dq, a->dqs, a->dk, a->dks, a->dv, a->dvs, a->work);
}

#define LA_NONCAUSAL_FORWARD_ARGS(X, la_s) \
    X(la_s, int, kind, 'i') X(la_s, int, bf, 'i') X(la_s, const void *, q, 'p') X(la_s, long, qs, 'l') \
    X(la_s, const void *, k, 'p') X(la_s, long, ks, 'l') X(la_s, const void *, v, 'p') \
    X(la_s, long, vs, 'l') X(la_s, long, N, 'l') X(la_s, long, Tq, 'l') X(la_s, long, Tk, 'l') \
    X(la_s, long, L, 'l') X(la_s, long, Dv, 'l') X(la_s, long, C, 'l') X(la_s, float, eps, 'f') \
    X(la_s, float *, S, 'p') X(la_s, float *, z, 'p') X(la_s, void *, out, 'p') X(la_s, long, os, 'l') \
    X(la_s, float *, work, 'p')
LA_ARGS(la_noncausal_forward_args, LA_NONCAUSAL_FORWARD_ARGS)
int la_noncausal_forward_call(const la_noncausal_forward_args *a) {
    return (int)la_noncausal_forward(a->kind, a->bf, a->q, a->qs, a->k, a->ks, a->v, a->vs, a->N,
            a->Tq, a->Tk, a->L, a->Dv, a->C, a->eps, a->S, a->z, a->out, a->os, a->work);
}

#define LA_NONCAUSAL_BACKWARD_ARGS(X, la_s) \
    X(la_s, int, kind, 'i') X(la_s, int, parts, 'i') X(la_s, const float *, q, 'p') \
    X(la_s, long, qs, 'l') X(la_s, const float *, k, 'p') X(la_s, long, ks, 'l') \
    X(la_s, const float *, v, 'p') X(la_s, long, vs, 'l') X(la_s, const float *, o, 'p') \
    X(la_s, long, os, 'l') X(la_s, const float *, g, 'p') X(la_s, long, gs, 'l') X(la_s, long, N, 'l') \
    X(la_s, long, Tq, 'l') X(la_s, long, Tk, 'l') X(la_s, long, L, 'l') X(la_s, long, Dv, 'l') \
    X(la_s, long, C, 'l') X(la_s, float, eps, 'f') X(la_s, const float *, S, 'p') \
    X(la_s, const float *, z, 'p') X(la_s, float *, G, 'p') X(la_s, float *, Gz, 'p') \
    X(la_s, float *, dq, 'p') X(la_s, long, dqs, 'l') X(la_s, float *, dk, 'p') X(la_s, long, dks, 'l') \
    X(la_s, float *, dv, 'p') X(la_s, long, dvs, 'l') X(la_s, float *, work, 'p')
LA_ARGS(la_noncausal_backward_args, LA_NONCAUSAL_BACKWARD_ARGS)
int la_noncausal_backward_call(const la_noncausal_backward_args *a) {
    return (int)la_noncausal_backward(a->kind, a->parts, a->q, a->qs, a->k, a->ks, a->v, a->vs,
            a->o, a->os, a->g, a->gs, a->N, a->Tq, a->Tk, a->L, a->Dv, a->C, a->eps, a->S, a->z,
            a->G, a->Gz, a->dq, a->dqs, a->dk, a->dks, a->dv, a->dvs, a->work);
}

static const la_struct la_linear_structs[] = {
    LA_STRUCT_ENTRY(la_phi_args),
    LA_STRUCT_ENTRY(la_normalise_args),
    LA_STRUCT_ENTRY(la_norm_grad_args),
    LA_STRUCT_ENTRY(la_grad_phi_args),
    LA_STRUCT_ENTRY(la_mask_rowsum_args),
    LA_STRUCT_ENTRY(la_mask_add_args),
    LA_STRUCT_ENTRY(la_prefix_args),
    LA_STRUCT_ENTRY(la_causal_forward_args),
    LA_STRUCT_ENTRY(la_causal_backward_args),
    LA_STRUCT_ENTRY(la_noncausal_forward_args),
    LA_STRUCT_ENTRY(la_noncausal_backward_args),
};
LA_ABI_TABLE(la_linear_abi, la_linear_structs)
