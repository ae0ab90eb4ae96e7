/* The linear-attention kernels of linattn.ops.linear.native (see ops/native/common.h for the
 * vector helpers and the layout conventions). */
#ifndef LA_COMMON_H
#include "../native/common.h"
#endif
#ifndef LA_AHEAD_H
#include "../native/ahead.h"
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
static inline vf vguarded(vf den, float eps) {
    den += eps;
    return vselect(den == 0.0f, vsplat(1.0f), den);
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

/* phi_rows, asking meanwhile for a line of each of a and b per vector made. */
static inline void phi_rows_fetching(int kind, const void *x, long i0, int bf, int coarse, long n,
                                     float *f, la_stream *a, la_stream *b) {
    for (long i = 0; i < n; i += W) {
        la_fetch_line(a), la_fetch_line(b);
        vstore(f + i, vphi_as(kind, vload_any(x, i0 + i, bf), coarse));
    }
}

/* The query pass of a non-causal forward, in one pass over Cn rows of x (L features, a multiple of
 * W; float32 or bfloat16, from element i0): f's rows = phi(x_i) (float32, or rounded to
 * bfloat16 with fbf: the dot-product form's operand), inv[i] = 1 / guarded(phi(x_i) . z, eps)
 * from the unrounded features; a line of `a` asked for per vector. Each row's dot product is
 * left as a vector of W partial sums (dv, rows of W) and W rows are summed at once by a
 * transpose: summed row by row, the shuffles, the guard and the division were a fifth of the
 * bfloat16 kernel outside its products. inv and dv: room for Cn rounded up to W rows (the
 * callers' chunks are whole vectors of rows). */
static inline void query_features(int kind, const void *x, long i0, int bf, long L, long Cn,
                                  const float *z, float eps, void *f, int fbf, float *inv,
                                  float *dv, la_stream *a) {
    for (long i = 0; i < Cn; ++i) {
        vf d = vsplat(0.0f);
        for (long j = 0; j < L; j += W) {
            la_fetch_line(a);
            vf y = vphi_as(kind, vload_any(x, i0 + i * L + j, bf), fbf);
            d += y * vload(z + j);
            vstore_any(f, i * L + j, y, fbf);
        }
        vstore(dv + i * W, d);
    }
    for (long i = Cn; i % W; ++i) vstore(dv + i * W, vsplat(0.0f));
    for (long r0 = 0; r0 < Cn; r0 += W) {
        float t[W * W];
        transpose_block(dv + r0 * W, W, t, W);
        vf den = vsplat(0.0f);
        for (int r = 0; r < W; ++r) den += vload(t + r * W);
        vstore(inv + r0, 1.0f / vguarded(den, eps));
    }
}

/* x[i0:i0+n] as float32: x itself, or widened into buf. */
static inline const float *f32_rows(const void *x, long i0, int bf, long n, float *buf) {
    if (!bf) return (const float *)x + i0;
    for (long i = 0; i < n; i += W) vstore(buf + i, vload_any(x, i0 + i, 1));
    return buf;
}


/* dn = g / s for one output row o = num / s, s = guarded(den) (den here includes eps), from
 * g = dL/do (float32, or bfloat16 with bf, at element gi); returns 1 / s, or 0 where den == 0
 * (the guard's constant branch, where ds = 0). Then ds = -(g . o) / s: from the output,
 * grad_out_row; or, with d = S dn (the state after the token times dn, what dphi(q) starts
 * from), ds = -(g . S^T phi(q)) / s^2 = -(phi(q) . d) / s, out_ds: the same function of the
 * state the one-pass backwards hold, which reads no output and keeps dphi(q) = d + ds z
 * cancelling where it should (from a bfloat16 output, rounded, it left 2^-9 of |g| |o| / s in
 * dq: a tenth of its largest entry at a causal run's first tokens). */
static inline float out_dn(const void *g, long gi, int bf, float den, long Dv, float *dn) {
    float inv = den == 0.0f ? 1.0f : 1.0f / den;
    long j = 0;
    for (; j + W <= Dv; j += W) vstore(dn + j, vload_any(g, gi + j, bf) * inv);
    for (; j < Dv; ++j) dn[j] = load_any(g, gi + j, bf) * inv;
    return den == 0.0f ? 0.0f : inv;
}
static inline float out_ds(const float *fq, const float *d, float inv, long L) {
    return inv == 0.0f ? 0.0f : -dot(fq, d, L) * inv;
}
/* out_dn with ds = -(g . o) / s from the output row o (float32): the block passes' and the
 * causal chunked form's. */
static inline float grad_out_row(const float *g, const float *o, float den, long Dv, float *dn) {
    float inv = out_dn(g, 0, 0, den, Dv, dn);
    return inv == 0.0f ? 0.0f : -dot(g, o, Dv) * inv;
}

/* dst = (dphi + c vec) phi'(x) for one row of L (no vec term where vec is NULL); f = phi(x);
 * x and dst rows of float32, or bfloat16 with bf, at elements xi and di (a bfloat16 row is
 * rounded once, from the float32 result). A float32 gradient row is not read back: whole
 * vectors go out with non-temporal stores where the row is aligned to them (stream_fence()
 * before the kernel returns). */
static inline void grad_phi_row(int kind, void *dst, long di, int bf, const float *dphi,
                                float c, const float *vec, const void *x, long xi,
                                const float *f, long L) {
    long j = 0;
    for (; j + W <= L; j += W) {
        vf d = vload(dphi + j);
        if (vec) d += c * vload(vec + j);
        vf r = d * vdphi(kind, vload_any(x, xi + j, bf), vload(f + j));
        if (bf)
            vstore_any(dst, di + j, r, 1);
        else
            vstore_stream((float *)dst + di + j, r);
    }
    for (; j < L; ++j)
        store_any(dst, di + j,
                  (dphi[j] + (vec ? c * vec[j] : 0.0f)) * sdphi(kind, load_any(x, xi + j, bf), f[j]),
                  bf);
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
            grad_phi_row(kind, dst, 0, 0, dphi + (n * R + t) * L, coef ? coef[n * R + t] : 1.0f,
                         vec ? group_row(vec, vrows, n, t, R, L) : NULL, x, n * xs + t * L,
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

#include "kernels_forms.c" /* causal_forward_dp, _tiles, noncausal_forward_dp; causal_*_rec */

/* The causal forward over T tokens of N heads, chunks of C (a multiple of W; L and Dv
 * multiples of W too). q, k: rows of L with head strides qs, ks; v: rows of Dv, stride vs;
 * out: rows of Dv, stride os; all float32, or all bfloat16 with bf. S (N, L, Dv) and z (N, L),
 * float32: the state before, updated in place to the state after; Ss, zss: the states kept
 * before every block (keep_state; NULL: none). States up to REC_MAX_STATE take the recurrent
 * form (causal_forward_rec), larger ones the bfloat16 dot-product form (bfloat16 rows where
 * the build has it: causal_forward_dp) or the chunked float32 form below; bfloat16 rows of a
 * chunk or more take the dot-product form at every state size where its products run on AMX
 * tiles (B 1, H 8, T 65536, d 64, Intel Xeon: 76.8 against 89.5 ms). work: 2 C L + L C +
 * C C + 2 C Dv floats (and more for the dot-product form). Returns 0, or -1 on bad sizes. */
static int la_causal_forward(int kind, int bf, const void *q, long qs, const void *k, long ks,
                      const void *v, long vs, long N, long T, long L, long Dv, long C, float eps,
                      float *S, float *z, void *out, long os, float *Ss, long sb, float *zss,
                      long zb, long block, float *work) {
    if (C % W || L % W || Dv % W || (Ss && (block < C || block % C))) return -1;
    int tiles = 0;
#if defined(LA_DP_BF16)
    tiles = bf && L % 32 == 0 && T >= C && dp_on_tiles();
#endif
    if (REC_FORWARD && L * Dv <= REC_MAX_STATE && !tiles) {
        causal_forward_rec(kind, bf, q, qs, k, ks, v, vs, N, T, L, Dv, C, eps, S, z, out, os, Ss,
                           sb, zss, zb, block, work);
        stream_fence();
        return 0;
    }
#if defined(LA_DP_BF16)
    if (bf && L % 32 == 0) {
        (tiles ? causal_forward_tiles : causal_forward_dp)(kind, q, qs, k, ks, v, vs, N, T, L, Dv,
                                                          C, eps, S, z, out, os, Ss, sb, zss,
                                                          zb, block, work);
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
static void causal_backward_chunked(int kind, const float *q, long qs, const float *k, long ks,
                                    const float *v, long vs, const float *o, long os,
                                    const float *g, long gs, long N, long T, long L, long Dv,
                                    long C, float eps, const float *S_in, const float *z_in,
                                    float *G, float *Gz, float *dq, long dqs, float *dk, long dks,
                                    float *dv, long dvs, float *work) {
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
                grad_phi_row(kind, dq, n * dqs + (t0 + i) * L, 0, dphi + i * L, ds[i], zb, q,
                             n * qs + (t0 + i) * L, fq + i * L, L);
            /* dk */
            transpose(L, Dv, Gn, GT);
            gemm(Cn, L, Cn, dA, 1, C, fq, L, dphi, L, 0, UPPER);
            gemm(Cn, L, Dv, vc, Dv, 1, GT, L, dphi, L, 1, FULL);
            for (long i = 0; i < Cn; ++i)
                grad_phi_row(kind, dk, n * dks + (t0 + i) * L, 0, dphi + i * L, 1.0f, Gzn, k,
                             n * ks + (t0 + i) * L, fk + i * L, L);
            /* dv, written in place */
            float *dvc = dv + n * dvs + t0 * Dv;
            gemm(Cn, Dv, Cn, A, 1, C, dn, Dv, dvc, Dv, 0, UPPER);
            gemm(Cn, Dv, L, fk, L, 1, Gn, Dv, dvc, Dv, 1, FULL);
            /* the state's gradient, before this chunk */
            gemm(L, Dv, Cn, fq, 1, L, dn, Dv, Gn, Dv, 1, FULL);
            add_colsums(Gzn, Gzn, fq, ds, Cn, L);
        }
    }
}

/* Whether la_causal_backward (causal) or la_noncausal_backward takes bfloat16 rows at these
 * sizes: the non-causal one always, the causal one in its recurrent form (states up to
 * REC_MAX_STATE); the chunked form reads float32 only. What Python asks before it passes
 * bfloat16 rows (else it widens them first). */
int la_linear_backward_bf16(int causal, long L, long Dv) {
    return !causal || (REC_FORWARD && L * Dv <= REC_MAX_STATE);
}

/* The causal backward: the recurrent form (causal_backward_rec) for states up to
 * REC_MAX_STATE, float32 or bfloat16 rows (bf: q, k, v, o, g read, dq, dk, dv written, each
 * rounded once; the float32 arithmetic on the values they hold); else the chunked form above,
 * float32 only (-1 with bf). */
static int la_causal_backward(int kind, int bf, const void *q, long qs, const void *k, long ks,
                              const void *v, long vs, const void *o, long os, const void *g,
                              long gs, long N, long T, long L, long Dv, long C, float eps,
                              const float *S_in, const float *z_in, float *G, float *Gz,
                              void *dq, long dqs, void *dk, long dks, void *dv, long dvs,
                              float *work) {
    if (C % W || L % W || Dv % W || (bf && !la_linear_backward_bf16(1, L, Dv))) return -1;
    if (REC_FORWARD && L * Dv <= REC_MAX_STATE)
        causal_backward_rec(kind, bf, q, qs, k, ks, v, vs, g, gs, N, T, L, Dv, eps, S_in, z_in, G,
                            Gz, dq, dqs, dk, dks, dv, dvs, work);
    else
        causal_backward_chunked(kind, q, qs, k, ks, v, vs, o, os, g, gs, N, T, L, Dv, C, eps,
                                S_in, z_in, G, Gz, dq, dqs, dk, dks, dv, dvs, work);
    stream_fence();
    return 0;
}

/* la_causal_backward over blocks of `block` tokens walked from the last (T of them in all, each
 * block's states before it at S_in + i sb and z_in + i zb, as la_causal_forward keeps them), G
 * and Gz carried from one block to the one before: the whole backward of a group of heads in
 * one call (a call per block cost ~60 us of Python each, and the threads of a pass took turns
 * at the interpreter: linattn.ops.linear.passes). Rows of q, k, o, g, dq, dk, dv contiguous
 * (the tokens of a block at t0 rows further). work: la_causal_backward's for one block. */
static int la_causal_backward_blocks(int kind, int bf, const void *q, long qs, const void *k,
                                     long ks, const void *v, long vs, const void *o, long os,
                                     const void *g, long gs, long N, long T, long L, long Dv,
                                     long C, float eps, const float *S_in, long sb,
                                     const float *z_in, long zb, long block, float *G,
                                     float *Gz, void *dq, long dqs, void *dk, long dks,
                                     void *dv, long dvs, float *work) {
    if (block <= 0) return -1;
    size_t es = bf ? 2 : 4; /* bytes an element */
#define LA_AT(p, i) ((char *)(p) + (size_t)(i) * es)
    for (long i = (T + block - 1) / block - 1; i >= 0; --i) {
        long t0 = i * block, Tb = T - t0 < block ? T - t0 : block;
        int rc = la_causal_backward(kind, bf, LA_AT(q, t0 * L), qs, LA_AT(k, t0 * L), ks,
                                    LA_AT(v, t0 * Dv), vs, LA_AT(o, t0 * Dv), os,
                                    LA_AT(g, t0 * Dv), gs, N, Tb, L, Dv, C, eps, S_in + i * sb,
                                    z_in + i * zb, G, Gz, LA_AT(dq, t0 * L), dqs,
                                    LA_AT(dk, t0 * L), dks, LA_AT(dv, t0 * Dv), dvs, work);
        if (rc) return rc;
    }
#undef LA_AT
    return 0;
}


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
    if (L % W || Dv % W || C % W || C < 1) return -1; /* the query pass's scratch: whole vectors */
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
    float *inv = f + C * L, *dv = inv + C; /* the query pass's: C L + C + W C <= Ck L floats
                                            * (C a multiple of W) */
    for (long n = 0; n < N; ++n) {
        float *Sn = S + n * L * Dv, *zn = z + n * L;
        for (long t0 = 0; t0 < Tk; t0 += Ck) {
            long Cn = Tk - t0 < Ck ? Tk - t0 : Ck;
            la_stream kn = la_next_chunk(k, n * ks, t0 + Cn, Tk, Ck, L, bf ? 2 : 4);
            /* v's next rows too: 16-bit ones are widened in a burst; float32 rows go to the
             * product as they are, and asking for them here too took the float32 forward to
             * 0.95-0.96x on an Intel Xeon (family 6; AVX2 build 0.95x; its earlier ~2 % cost
             * was on AMD EPYC family 25) */
            la_stream vn = la_next_chunk(v, n * vs, t0 + Cn, Tk, Ck, Dv, bf ? 2 : 4);
            phi_rows_fetching(kind, k, n * ks + t0 * L, bf, 0, Cn * L, f, &kn, &vn);
            gemm(L, Dv, Cn, f, 1, L, f32_rows(v, n * vs + t0 * Dv, bf, Cn * Dv, vbuf), Dv, Sn,
                 Dv, 1, FULL);
            add_colsums(zn, zn, f, NULL, Cn, L);
        }
        for (long t0 = 0; t0 < Tq; t0 += C) {
            long Cn = Tq - t0 < C ? Tq - t0 : C;
            la_stream qn = la_next_chunk(q, n * qs, t0 + Cn, Tq, C, L, bf ? 2 : 4);
            query_features(kind, q, n * qs + t0 * L, bf, L, Cn, zn, eps, f, 0, inv, dv, &qn);
            gemm(Cn, Dv, L, f, L, 1, Sn, Dv, num, Dv, 0, FULL);
            for (long i = 0; i < Cn; ++i)
                scale_row_stream(out, n * os + (t0 + i) * Dv, bf, num + i * Dv, inv[i], Dv);
        }
    }
    stream_fence();
    return 0;
}

/* Its backward: with dn = g / s, ds = -(phi(q) . dn S^T) / s (= -(g . o) / s) per query row,
 *     G = G_in + sum phi(q)^T dn,  Gz = Gz_in + sum ds phi(q),
 *     dq = (dn S^T + ds z) phi'(q),  dk = (v G^T + Gz) phi'(k),  dv = phi(k) G.
 * S, z: the final sums of the forward; G, Gz in/out. The query pass (dq, G, Gz) runs over
 * the Tq queries, the key pass (dk, dv, from G and Gz) over the Tk keys; parts & 1 and parts & 2
 * select them, so that the query pass can be fed in blocks. The output is not read (out_dn,
 * out_ds). q, k, v, g read and dq, dk, dv written as float32, or bfloat16 with bf (each
 * gradient rounded once: the float32 arithmetic on the values the rows hold; a chunk of v
 * widened, and of dv rounded from, the scratch). work: 2 C L + 2 L Dv + 3 C Dv. */
static int la_noncausal_backward(int kind, int parts, int bf, const void *q, long qs,
                                 const void *k, long ks, const void *v, long vs, const void *g,
                                 long gs, long N, long Tq, long Tk, long L, long Dv, long C,
                                 float eps, const float *S, const float *z, float *G, float *Gz,
                                 void *dq, long dqs, void *dk, long dks, void *dv, long dvs,
                                 float *work) {
    if (L % W || Dv % W) return -1;
    if (!(parts & 1)) Tq = 0;
    if (!(parts & 2)) Tk = 0;
    float *f = work, *ST = f + C * L, *GT = ST + L * Dv, *dphi = GT + L * Dv;
    float *vbuf = dphi + C * Dv + C * L, *dvbuf = vbuf + C * Dv;
    float ds[C], inv[C];
    for (long n = 0; n < N; ++n) {
        const float *Sn = S + n * L * Dv, *zn = z + n * L;
        float *Gn = G + n * L * Dv, *Gzn = Gz + n * L;
        if (Tq) transpose(L, Dv, Sn, ST);
        for (long t0 = 0; t0 < Tq; t0 += C) {
            long Cn = Tq - t0 < C ? Tq - t0 : C, qi = n * qs + t0 * L;
            phi_rows(kind, q, qi, bf, Cn * L, f);
            float *dn = dphi; /* dn (Cn x Dv) first, then dphi reuses the space after G */
            for (long i = 0; i < Cn; ++i)
                inv[i] = out_dn(g, n * gs + (t0 + i) * Dv, bf, dot(f + i * L, zn, L) + eps, Dv,
                                dn + i * Dv);
            float *dfq = dphi + C * Dv;
            gemm(Cn, L, Dv, dn, Dv, 1, ST, L, dfq, L, 0, FULL);
            for (long i = 0; i < Cn; ++i) ds[i] = out_ds(f + i * L, dfq + i * L, inv[i], L);
            gemm(L, Dv, Cn, f, 1, L, dn, Dv, Gn, Dv, 1, FULL);
            add_colsums(Gzn, Gzn, f, ds, Cn, L);
            for (long i = 0; i < Cn; ++i)
                grad_phi_row(kind, dq, n * dqs + (t0 + i) * L, bf, dfq + i * L, ds[i], zn, q,
                             qi + i * L, f + i * L, L);
        }
        if (Tk) transpose(L, Dv, Gn, GT);
        for (long t0 = 0; t0 < Tk; t0 += C) {
            long Cn = Tk - t0 < C ? Tk - t0 : C, ki = n * ks + t0 * L;
            const float *vc = f32_rows(v, n * vs + t0 * Dv, bf, Cn * Dv, vbuf);
            phi_rows(kind, k, ki, bf, Cn * L, f);
            gemm(Cn, L, Dv, vc, Dv, 1, GT, L, dphi, L, 0, FULL);
            for (long i = 0; i < Cn; ++i)
                grad_phi_row(kind, dk, n * dks + (t0 + i) * L, bf, dphi + i * L, 1.0f, Gzn, k,
                             ki + i * L, f + i * L, L);
            float *dvc = bf ? dvbuf : (float *)dv + n * dvs + t0 * Dv;
            gemm(Cn, Dv, L, f, L, 1, Gn, Dv, dvc, Dv, 0, FULL);
            if (bf) la_narrowed((u16 *)dv + n * dvs + t0 * Dv, dvbuf, 0, Cn * Dv, LA_BF16);
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
        dp = C * L + C * Dv + dp_key_pairs(DP_KEY_CHUNKS * C) * (L + Dv) + L * Dv / 2;
#endif
        break;
    case 1:
        f32 = 2 * C * L + L * C + C * C + 2 * C * Dv;
#if defined(LA_DP_BF16)
        dp = C + 2 * C * L + C * C + C * Dv + (4 * C * L + C * C + C * Dv + L * Dv) / 2;
#endif
        break;
    case 2:
        f32 = 2 * C * L + 2 * L * Dv + 3 * C * Dv;
        break;
    case 3:
        f32 = nc * (2 * C * L + L * Dv + L) + 2 * C * C + Dv * C + 2 * Dv * L + 2 * C * L + C * Dv
              + C;
        /* the recurrent form's, with its widened v rows and two rows of dv */
        dp = nc * C * (2 * L + 2 * Dv + 1) + Dv * L + 6 * L + 2 * W * W + 2 * Dv;
        break;
    default:
        return -1;
    }
    return f32 > dp ? f32 : dp;
}

#include "kernels_entry.c" /* the argument structs, la_linear_abi */
