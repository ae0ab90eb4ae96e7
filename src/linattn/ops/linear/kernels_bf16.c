/* The bfloat16 dot-product forms of the one-pass forwards (LA_DP_BF16 builds: vdpbf16ps), a
 * part of ops/linear/kernels.c: included there, after the row helpers they use, and not
 * compiled on its own. */
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
