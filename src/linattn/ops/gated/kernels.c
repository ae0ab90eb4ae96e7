/* The gated linear attention (GLA) kernels of linattn.ops.gated.native (see ops/native/common.h).
 *
 * Per head, state S (K x V, rows of V floats), token t with the row decays
 * a_t,i = exp(g_t + gk_t,i) (a missing gate counts as 0) and the scale s:
 *     S_t = diag(a_t) S_{t-1} + k_t v_t^T,        o_t = s S_t^T q_t.
 * Column j of S and o depends on column j of S and v_t only, so the kernels walk one block of
 * columns (GLA_NB vectors) at a time through a chunk of tokens: the block stays in L1, and
 * each pair of tokens costs one pass over it (gla_fwd_pair: a multiply and four multiply-adds
 * per element for both tokens, the first token's output from the state before the pair).
 *
 * The backward (docs/theory.md, section 10, "GLA: the compiled backward") runs the reverse
 * recurrence of dS = dL/dS_t, with s do_t folded into d~_t:
 *     dS_t = diag(a_{t+1}) dS_{t+1} + q_t d~_t^T    (dS_T: the final state's gradient),
 *     dq_t = S_t d~_t,  dk_t = dS_t v_t,  dv_t = dS_t^T k_t,  dS_0 = d(initial state),
 * and the gates' gradients dgk_t,i = a_t,i sum_j dS_t,ij S_{t-1},ij (dg_t = sum_i dgk_t,i)
 * through the identity a_t,i <dS_t, S_{t-1}>_i = X_t,i - k_t,i dk_t,i with
 * X_t,i = <dS_t, S_t>_i = q_t,i dq_t,i + X_{t+1},i - k_{t+1},i dk_{t+1},i, so that
 *     dgk_t = sum_{r >= t} (q_r dq_r - k_r dk_r) + <dS_T, S_T>   (rows summed over j),
 * a sum over tokens of what the other gradients give (the products in float32, the sum in
 * double, restarted at each chunk's end from <dS, S> there, which the sweeps give): no state
 * before each token is needed. Its error is of the order of float32 rounding times
 * |<dS_t, S_t>|, not times |dgk_t|: where strong decays make dgk_t far smaller than that, its
 * relative error is large (the subtraction cancels; fla's kernels compute it the same way).
 * dq_t reads only S_t, in the forward order, and dk, dv only dS_t, in the reverse
 * order: for each chunk of C tokens (from the forward's checkpoint of the state before it) and
 * each block of columns (GLA_NB vectors), a forward sweep carries S and writes dq, then a
 * reverse sweep carries dS and writes dk and dv; both states of a block stay in L1. (Before
 * 8339433 the backward recomputed a chunk's C states into an L2-sized buffer and walked them
 * backwards reading S_{t-1}: half its time went to writing that buffer.) Row sums over the
 * columns (dq, dk) are per-row vectors of W partial sums, W rows of which are reduced together
 * by a transpose-and-add (row_sums). Every exponent is <= 0 and no state is ever divided by a
 * decay; where a decay is 0 (a gate of -inf: a reset) its gradient is exactly 0 and the sum
 * starts again from 0 there, as the identity gives it in exact arithmetic.
 * All arithmetic in float32; the sums follow the recurrence, so there is no chunking error.
 * (bfloat16 rows with a scalar gate on AMX tiles take the chunked form instead: chunk_dp,
 * tiles.h.) */
#ifndef LA_TILES_H
#include "../native/tiles.h" /* and common.h, ahead.h */
#endif

#if LA_W == 8 || (LA_W == 4 && !(defined(__ARM_NEON) || defined(__ARM_NEON__)))
#define GLA_NB 2 /* 16 registers */
#else
#define GLA_NB 4 /* 32 registers (AVX-512, NEON), or scalars */
#endif
#define GLA_CMAX 64 /* the longest chunk (checkpoint interval) */

static long gla_round_up(long K) { return (K + W - 1) / W * W; }

/* Floats of work the kernels need for head dimension K and chunk C (<= GLA_CMAX): decays (C
 * K), then the backward's row-sum partials (W for each of K rounded up to W), its state of one
 * column block (K GLA_NB W) and its gates' sums (K doubles, aligned), or the forward's rows of
 * its token pairs (gla_pairs); rounded up to 64 bytes, so that
 * what a caller places after it (gla_forward_widened's rows and chunk_dp's tiles) starts on a
 * cache line (placed 8 bytes off one, the bfloat16 forward took 1.27x the time). */
/* Floats of gla_pairs' rows for a chunk of C tokens (its (C - 1) / 2 pairs: three rows of K
 * and a dot product each): where a rescaled chunk's rows start in the forward's work. */
static long gla_pairs_floats(long K, long C) { return 3 * ((C - 1) / 2) * K + (C - 1) / 2; }

long la_gla_work(long K, long C) {
    long back = gla_round_up(K) * W + K * GLA_NB * W + 2 * K + 2;
    /* the forward's: gla_pairs' rows, then a rescaled chunk's q and k rows and L_last */
    long pairs = gla_pairs_floats(K, C) + 2 * C * K + K;
    return la_lines(C * K + (back > pairs ? back : pairs));
}

/* a[t][i] = exp(g[t] + gk[t][i]) for Tc tokens (rows of K); g or gk may be NULL (not both).
 * Flushed to 0 below exp(-87) (sexp_nonpos / vexp_nonpos): no subnormal states. */
static void gla_decays(long Tc, long K, const float *g, const float *gk, long gkt, float *a) {
    for (long t = 0; t < Tc; ++t) {
        float gt = g ? g[t] : 0.0f, *at = a + t * K;
        if (!gk) {
            float e = sexp_nonpos(gt);
            for (long i = 0; i < K; ++i) at[i] = e;
            continue;
        }
        const float *row = gk + t * gkt;
        long i = 0;
        for (; i + W <= K; i += W) vstore(at + i, vexp_nonpos(vload(row + i) + gt));
        for (; i < K; ++i) at[i] = sexp_nonpos(row[i] + gt);
    }
}

/* ------------------------------------------------------------------------------ the forward
 * Tokens [0, Tc) over one block of nb vectors of columns: the state read from Sr for the first
 * token and from S after it, written to S (rows of V, offset to the block; Sr may be S): so a
 * step from one state into another reads and writes each row once, with no copy first (a
 * decoding step out of place took twice the time of one in place); q, k: token strides qt, kt;
 * a: rows of K (gated only); v, o: token strides vt, ot, offset to the block. */
/* Token t over the block in one pass: the state read from F (rows of V), written to S (the
 * chunk's first token, and the last of an odd count; the others in pairs, gla_fwd_pair). */
static inline __attribute__((always_inline)) void gla_fwd_token(int nb, int gated, long t, long K,
                                                                long V, const float *q, long qt,
                                                                const float *k, long kt,
                                                                const float *a, const float *v,
                                                                long vt, const float *F, float *S,
                                                                vf sv, float *o, long ot) {
    vf vv[GLA_NB], acc[GLA_NB];
    for (int j = 0; j < nb; ++j) vv[j] = vload(v + t * vt + j * W), acc[j] = vsplat(0.0f);
    for (long i = 0; i < K; ++i) {
        vf ki = vsplat(k[t * kt + i]), qi = vsplat(q[t * qt + i]);
        vf ai = vsplat(gated ? a[t * K + i] : 1.0f);
        const float *Fi = F + i * V;
        float *Si = S + i * V;
        for (int j = 0; j < nb; ++j) {
            vf s = vload(Fi + j * W);
            s = gated ? ai * s + ki * vv[j] : s + ki * vv[j];
            acc[j] += qi * s;
            vstore(Si + j * W, s);
        }
    }
    for (int j = 0; j < nb; ++j) vstore(o + t * ot + j * W, acc[j] * sv);
}

/* The rows of a chunk's token pairs (t, t + 1), t = 1, 3, 5, ... (gla_fwd_cols' pairs; pair p
 * at p K): with gates, A = a_t o a_{t+1}, c = a_{t+1} o k_t, d = a_t o q_t (gla_fwd_pair);
 * qk[p] = q_t . k_t. q, k: token strides qt, kt; a: the decays (gla_decays). */
static void gla_pairs(long Tc, long K, const float *q, long qt, const float *k, long kt,
                      const float *a, int gated, float *A, float *c, float *d, float *qk) {
    for (long t = 1, p = 0; t + 1 < Tc; t += 2, ++p) {
        const float *qr = q + t * qt, *kr = k + t * kt, *a0 = a + t * K, *a1 = a0 + K;
        qk[p] = dot(qr, kr, K);
        if (!gated) continue;
        float *Ap = A + p * K, *cp = c + p * K, *dp = d + p * K;
        long i = 0;
        for (; i + W <= K; i += W) {
            vf x0 = vload(a0 + i), x1 = vload(a1 + i);
            vstore(Ap + i, x0 * x1);
            vstore(cp + i, x1 * vload(kr + i));
            vstore(dp + i, x0 * vload(qr + i));
        }
        for (; i < K; ++i) Ap[i] = a0[i] * a1[i], cp[i] = a1[i] * kr[i], dp[i] = a0[i] * qr[i];
    }
}

/* Tokens t and t + 1 (pair p of gla_pairs) over the block in one pass, S in place. The second
 * token's state from the one before the pair, and the first token's output from it too:
 *     S_{t+1} = (a_t o a_{t+1}) o S + (a_{t+1} o k_t) v_t^T + k_{t+1} v_{t+1}^T,
 *     o_t = s (S^T (a_t o q_t) + (q_t . k_t) v_t),   o_{t+1} = s S_{t+1}^T q_{t+1}
 * (row scales o): with gates a multiply and four multiply-adds per element for both tokens
 * where two tokens in turn take two multiplies and four (one load and one store either way;
 * a token's pass alone is bound by its stores, one per vector against three multiply-adds, and
 * a whole-vector store takes two cycles on an Intel Xeon with AVX-512). 16 heads x 4,096
 * tokens, K = V = 64, a scalar gate, one thread, a C harness (Intel Xeon family 6): 0.966x the
 * time of the pair in turn (medians of five alternated runs), the AVX2 build 0.91x; the pair in
 * turn had taken 11.7-11.9 ms where a token a pass took 13.3-13.8 (AVX2: 23.8 against 31.2
 * ms). Products of two decays
 * may be subnormal: the pass runs with subnormals flushed (la_subnormals_off). */
static inline __attribute__((always_inline)) void gla_fwd_pair(int nb, int gated, long t,
                                                               long p, long K, long V,
                                                               const float *q, long qt,
                                                               const float *k, long kt,
                                                               const float *A, const float *c,
                                                               const float *d,
                                                               const float *qk,
                                                               const float *v, long vt,
                                                               float *S, vf sv, float *o,
                                                               long ot) {
    vf v0[GLA_NB], v1[GLA_NB], acc0[GLA_NB], acc1[GLA_NB];
    for (int j = 0; j < nb; ++j) {
        v0[j] = vload(v + t * vt + j * W), v1[j] = vload(v + (t + 1) * vt + j * W);
        acc0[j] = acc1[j] = vsplat(0.0f);
    }
    const float *k0 = gated ? c + p * K : k + t * kt, *q0 = gated ? d + p * K : q + t * qt;
    const float *k1 = k + (t + 1) * kt, *q1 = q + (t + 1) * qt, *Ap = A + p * K;
    for (long i = 0; i < K; ++i) {
        vf ai = vsplat(gated ? Ap[i] : 1.0f), c0 = vsplat(k0[i]), c1 = vsplat(k1[i]);
        vf d0 = vsplat(q0[i]), d1 = vsplat(q1[i]);
        float *Si = S + i * V;
        for (int j = 0; j < nb; ++j) {
            vf s = vload(Si + j * W);
            acc0[j] += d0 * s;
            s = gated ? ai * s + c0 * v0[j] : s + c0 * v0[j];
            s += c1 * v1[j];
            acc1[j] += d1 * s;
            vstore(Si + j * W, s);
        }
    }
    vf qkv = vsplat(qk[p]);
    for (int j = 0; j < nb; ++j) {
        vstore(o + t * ot + j * W, (acc0[j] + qkv * v0[j]) * sv);
        vstore(o + (t + 1) * ot + j * W, acc1[j] * sv);
    }
}

/* The first token from Sr, the others in place, two at a time (a loop of its own, where the
 * compiler sees that the state read is the state written: the AVX2 build ran 5-7 % slower with
 * one loop choosing its source per token). */
static inline __attribute__((always_inline)) void gla_fwd_cols(int nb, int gated, long Tc,
                                                               long K, long V, const float *q,
                                                               long qt, const float *k, long kt,
                                                               const float *a, const float *pr,
                                                               const float *v, long vt,
                                                               const float *Sr, float *S,
                                                               float scale, float *o, long ot,
                                                               const la_ahead *pf) {
    vf sv = vsplat(scale);
    if (Tc > 0) {
        la_fetch_ahead(pf, 0, nb * W);
        gla_fwd_token(nb, gated, 0, K, V, q, qt, k, kt, a, v, vt, Sr, S, sv, o, ot);
    }
    long t = 1, P = (Tc - 1) / 2; /* pairs (gla_pairs' rows at pr) */
    const float *A = pr, *c = A + P * K, *d = c + P * K, *qk = d + P * K;
    for (long p = 0; t + 1 < Tc; t += 2, ++p) {
        la_fetch_ahead(pf, t, nb * W);
        la_fetch_ahead(pf, t + 1, nb * W);
        gla_fwd_pair(nb, gated, t, p, K, V, q, qt, k, kt, A, c, d, qk, v, vt, S, sv, o, ot);
    }
    if (t < Tc) {
        la_fetch_ahead(pf, t, nb * W);
        gla_fwd_token(nb, gated, t, K, V, q, qt, k, kt, a, v, vt, S, S, sv, o, ot);
    }
}

/* gla_fwd_cols specialised for constant (nb, gated). */
static void gla_fwd_any(int nb, int gated, long Tc, long K, long V, const float *q, long qt,
                        const float *k, long kt, const float *a, const float *pr, const float *v,
                        long vt, const float *Sr, float *S, float scale, float *o, long ot,
                        const la_ahead *pf) {
/* Cases beyond this ISA's GLA_NB are constant-false (and never asked for). */
#define F_(c, gt)                                                                             \
    case c * 2 + gt:                                                                          \
        if (c <= GLA_NB)                                                                      \
            gla_fwd_cols(c <= GLA_NB ? c : GLA_NB, gt, Tc, K, V, q, qt, k, kt, a, pr, v, vt,  \
                         Sr, S, scale, o, ot, pf);                                            \
        break;
    switch (nb * 2 + gated) {
        F_(1, 0) F_(1, 1) F_(2, 0) F_(2, 1) F_(3, 0) F_(3, 1) F_(4, 0) F_(4, 1)
        default: break;
    }
#undef F_
}

/* A chunk rescaled: with L_t = a_0 o ... o a_t (the chunk's decay up to token t, a scalar or
 * one a key) and the state kept as S~ = diag(1 / L) S, the update S_t = diag(a_t) S_{t-1} +
 * k_t v_t^T is S~_t = S~_{t-1} + (k_t / L_t) v_t^T and the output o_t = S_t^T q_t is
 * S~_t^T (L_t o q_t): the ungated passes on rows k / L and L o q, then S = diag(L_last) S~ once.
 * A multiply a token and state element less (four multiply-adds a pair of tokens where the
 * gated pass takes a multiply and four: the pair pass is bound by its vector operations).
 * Taken for chunks of at least GLA_RESCALE_MIN tokens whose decay stays above
 * e^-GLA_RESCALE_LOG in every key (1 / L at most ~5e8: each term's rounding stays relative to
 * its own size, as in the gated pass, and nothing overflows that the gated pass would not); a
 * decoding step (one token) never (it stays the gated pass bit for bit). */
#define GLA_RESCALE_MIN 8
#define GLA_RESCALE_LOG 20.0f

/* Whether the chunk's Tc tokens of log-gates (g: a scalar a token, or NULL; gk: K a token, row
 * stride gkt, or NULL; all <= 0) allow the rescaled form; then its rows L_t o q_t and k_t / L_t
 * at qr, kr (rows of K) and L_last at last (K floats). */
static int gla_rescaled(long Tc, long K, const float *g, const float *gk, long gkt,
                        const float *q, long qt, const float *k, long kt, float *qr, float *kr,
                        float *last) {
    if (Tc < GLA_RESCALE_MIN || (!g && !gk)) return 0;
    if (!gk) { /* a scalar a token: L_t for the chunk's tokens in whole vectors of them */
        float L[GLA_CMAX + W], inv[GLA_CMAX + W], cum = 0.0f;
        for (long t = 0; t < Tc; ++t) L[t] = cum += g[t];
        if (!(cum >= -GLA_RESCALE_LOG)) return 0; /* (NaN too) */
        long Tv = (Tc + W - 1) / W * W;
        for (long t = Tc; t < Tv; ++t) L[t] = 0.0f;
        for (long t = 0; t < Tv; t += W) {
            vf e = vexp_nonpos(vload(L + t));
            vstore(L + t, e);
            vstore(inv + t, 1.0f / e);
        }
        for (long t = 0; t < Tc; ++t) {
            vf up = vsplat(L[t]), down = vsplat(inv[t]);
            const float *qt_ = q + t * qt, *kt_ = k + t * kt;
            float *qo = qr + t * K, *ko = kr + t * K;
            long i = 0;
            for (; i + W <= K; i += W) {
                vstore(qo + i, vload(qt_ + i) * up);
                vstore(ko + i, vload(kt_ + i) * down);
            }
            for (; i < K; ++i) qo[i] = qt_[i] * L[t], ko[i] = kt_[i] * inv[t];
        }
        for (long i = 0; i < K; ++i) last[i] = L[Tc - 1];
        return 1;
    }
    /* one a key: the cumulative log-decays, row t at kr + t K (replaced by k / L below) */
    for (long t = 0; t < Tc; ++t) {
        float gt = g ? g[t] : 0.0f, *c = kr + t * K;
        const float *prev = t ? c - K : NULL, *row = gk ? gk + t * gkt : NULL;
        for (long i = 0; i < K; ++i) c[i] = (prev ? prev[i] : 0.0f) + gt + (row ? row[i] : 0.0f);
    }
    const float *end = kr + (Tc - 1) * K; /* the decays only fall: the last row is the least */
    for (long i = 0; i < K; ++i)
        if (!(end[i] >= -GLA_RESCALE_LOG)) return 0; /* (NaN too) */
    for (long t = 0; t < Tc; ++t) {
        const float *qt_ = q + t * qt, *kt_ = k + t * kt;
        float *qo = qr + t * K, *ko = kr + t * K;
        long i = 0;
        for (; i + W <= K; i += W) {
            vf L = vexp_nonpos(vload(ko + i));
            if (t == Tc - 1) vstore(last + i, L);
            vstore(qo + i, vload(qt_ + i) * L);
            vstore(ko + i, vload(kt_ + i) / L);
        }
        for (; i < K; ++i) {
            float L = sexp_nonpos(ko[i]);
            if (t == Tc - 1) last[i] = L;
            qo[i] = qt_[i] * L, ko[i] = kt_[i] / L;
        }
    }
    return 1;
}

/* Row i of S (rows of V), its columns [0, nb W), times s[i], for the K rows: the rescaled
 * chunk's state made the state again. */
static void gla_scale_cols(float *S, long K, long V, int nb, const float *s) {
    for (long i = 0; i < K; ++i) {
        vf si = vsplat(s[i]);
        for (int j = 0; j < nb; ++j) vstore(S + i * V + j * W, vload(S + i * V + j * W) * si);
    }
}

/* GLA over T tokens of N heads, columns [v0, v1) of the state and the output (all V columns:
 * v0 = 0, v1 = V; a subset lets threads share a head). q, k: rows of K (head strides qs, ks,
 * token strides qt, kt); v, o: rows of V (vs, vt; os, ot); g: T floats per head (head stride
 * gs) or NULL; gk: rows of K (gks, gkt) or NULL; S_in, S_out: (N, K, V) contiguous, S_out may
 * be S_in (in place). C: tokens per chunk (1..GLA_CMAX). ckpt: NULL, or where the state before
 * each chunk goes: ceil(T / C) states of K x V per head (head stride cks; only the columns
 * [v0, v1) are written). next: NULL, or rows to ask for from memory while the last chunk runs
 * (a caller's next chunk). work: la_gla_work(K, C) floats. Returns 0, or -1 on sizes it does not
 * take (V, v0, v1 multiples of the vector width W, 0 <= v0 <= v1 <= V, K >= 1). */
static int la_gla_forward(const float *q, long qs, long qt, const float *k, long ks, long kt,
                          const float *v, long vs, long vt, const float *g, long gs,
                          const float *gk, long gks, long gkt, long N, long T, long K, long V,
                          long v0, long v1, long C, float scale, const float *S_in,
                          float *S_out, float *o, long os, long ot, float *ckpt, long cks,
                          const la_ahead *next, float *work) {
    if (K < 1 || V % W || v0 % W || v1 % W || v0 < 0 || v1 > V || v0 > v1 || N < 0 || T < 0
        || C < 1 || C > GLA_CMAX)
        return -1;
    int gated = g != NULL || gk != NULL;
    float *a = work, *pr = a + C * K; /* the decays; the pairs' rows (gla_pairs) */
    float *qr = pr + gla_pairs_floats(K, C), *kr = qr + C * K; /* gla_rescaled's */
    float *last = kr + C * K;
    unsigned long csr = la_subnormals_off();
    for (long n = 0; n < N; ++n) {
        const float *Sin = S_in + n * K * V;
        float *S = S_out + n * K * V;
        if (Sin != S && T == 0) la_copy_cols(S, Sin, K, V, v0, v1);
        for (long t0 = 0, c = 0; t0 < T; t0 += C, ++c) {
            const float *from = t0 == 0 ? Sin : S; /* the state this chunk starts from */
            long Tc = T - t0 < C ? T - t0 : C;
            int rescaled = gla_rescaled(Tc, K, g ? g + n * gs + t0 : NULL,
                                        gk ? gk + n * gks + t0 * gkt : NULL, gkt,
                                        q + n * qs + t0 * qt, qt, k + n * ks + t0 * kt, kt, qr,
                                        kr, last);
            if (ckpt) la_copy_cols(ckpt + n * cks + c * K * V, from, K, V, v0, v1);
            long t1 = t0 + Tc, Tn = T - t1 < C ? T - t1 : C; /* the next chunk */
            /* the rows the passes read: q and k with the gates' decays, or rescaled, L q and
             * k / L with none (then S = L_last S~ after each block of columns) */
            const float *qc = q + n * qs + t0 * qt, *kc = k + n * ks + t0 * kt;
            long qct = qt, kct = kt;
            int mode = gated && !rescaled;
            if (rescaled)
                qc = qr, kc = kr, qct = kct = K;
            else if (gated)
                gla_decays(Tc, K, g ? g + n * gs + t0 : NULL, gk ? gk + n * gks + t0 * gkt : NULL,
                           gkt, a);
            long Pc = (Tc - 1) / 2; /* this chunk's pairs, their rows packed at pr */
            gla_pairs(Tc, K, qc, qct, kc, kct, a, mode, pr, pr + Pc * K, pr + 2 * Pc * K,
                      pr + 3 * Pc * K);
            for (long j0 = v0; j0 < v1; j0 += GLA_NB * W) {
                int nb = (v1 - j0) / W < GLA_NB ? (int)((v1 - j0) / W) : GLA_NB;
                la_ahead ahead = la_chunk_ahead(
                    la_next_rows(q + n * qs, qt, k + n * ks, kt, v + n * vs + j0, vt,
                                 o + n * os + j0, ot, K, t1, Tn, j0 == v0),
                    next, Tn == 0 && n == N - 1, j0 == v0);
                gla_fwd_any(nb, mode, Tc, K, V, qc, qct, kc, kct, a, pr,
                            v + n * vs + t0 * vt + j0, vt, from + j0, S + j0, scale,
                            o + n * os + t0 * ot + j0, ot, &ahead);
                if (rescaled) gla_scale_cols(S + j0, K, V, nb, last);
            }
        }
    }
    la_subnormals_restore(csr);
    return 0;
}

/* la_gla_forward on rows of dtype dt (LA_BF16, LA_F16: q, k, v and o; the gates and the
 * states float32, as the op's checks hand them), without checkpoints: each chunk of each head
 * read into float32 rows first (exact; q, k rows of K, v rows of V, in the scratch after
 * la_gla_work(K, C)), o rounded once as it is written. Widening a chunk in cache instead of the
 * whole input beforehand saves a pass over memory per input and one for o; the next chunk's
 * 16-bit rows are asked for while this one runs (la_next_rows16). work:
 * la_gla_forward_work(K, V, C, dt) floats. */
long la_gla_forward_work(long K, long V, long C, int dt) {
    return la_gla_work(K, C) + (dt == LA_F32 ? 0 : C * (2 * K + 2 * V))
           + chunk_dp_scratch(dt, C, K, V);
}

static int gla_forward_widened(const void *q, long qs, long qt, const void *k, long ks, long kt,
                               const void *v, long vs, long vt, const float *g, long gs,
                               const float *gk, long gks, long gkt, int dt, long N, long T,
                               long K, long V, long v0, long v1, long C, float scale,
                               const float *S_in, float *S_out, void *o, long os, long ot,
                               float *ckpt, long cks, float *work) {
    if (C < 1 || C > GLA_CMAX || V % W || v0 % W || v1 % W || v0 < 0 || v1 > V || v0 > v1)
        return -1;
    float *qw = work + la_gla_work(K, C), *kw = qw + C * K, *vw = kw + C * K, *ow = vw + C * V;
#if defined(LA_DP_BF16)
    /* whole chunks of bfloat16 rows with a scalar gate or none on tiles: the chunked form
     * (chunk_dp in ops/native/tiles.h) */
    int chunked = !ckpt && chunk_dp_takes(dt, gk != NULL, C, K, V, v0, v1, q, qs, qt, k, ks, kt);
    int held = chunked ? amx_hold() : 0; /* the tiles configured once for all the chunks */
#endif
    for (long n = 0; n < N; ++n) {
        const float *Sin = S_in + n * K * V;
        float *S = S_out + n * K * V;
        if (T == 0 && Sin != S) la_copy_cols(S, Sin, K, V, v0, v1);
        for (long t0 = 0; t0 < T; t0 += C) {
            long Tc = T - t0 < C ? T - t0 : C;
            long t1 = t0 + Tc, Tn = T - t1 < C ? T - t1 : C;
            const u16 *q16 = q, *k16 = k, *v16 = v;
            la_ahead next = la_next_rows16(q16 + n * qs, qt, k16 + n * ks, kt, v16 + n * vs + v0,
                                           vt, (u16 *)o + n * os + v0, ot, K, v1 - v0, t1, Tn);
#if defined(LA_DP_BF16)
            if (chunked && Tc == C) {
                chunk_dp(C, K, V, q16 + n * qs + t0 * qt, qt, k16 + n * ks + t0 * kt, kt,
                         v16 + n * vs + t0 * vt, vt, g ? g + n * gs + t0 : NULL, NULL, scale, 0,
                         0.0f, t0 == 0 ? Sin : S, S, ow, &next, 0, ow + C * V);
                la_narrowed_rows(o, n * os + t0 * ot, ot, ow, Tc, V, v0, v1, dt);
                continue;
            }
#endif
            la_widened_rows(qw, q, n * qs + t0 * qt, qt, Tc, K, dt);
            la_widened_rows(kw, k, n * ks + t0 * kt, kt, Tc, K, dt);
            la_widened_rows(vw, v, n * vs + t0 * vt, vt, Tc, V, dt);
            int rc = la_gla_forward(qw, 0, K, kw, 0, K, vw, 0, V, g ? g + n * gs + t0 : NULL, 0,
                                    gk ? gk + n * gks + t0 * gkt : NULL, 0, gkt, 1, Tc, K, V,
                                    v0, v1, C, scale,
                                    t0 == 0 ? Sin : S, S, ow, 0, V,
                                    ckpt ? ckpt + n * cks + t0 / C * K * V : NULL, 0, &next,
                                    work);
            if (rc) {
#if defined(LA_DP_BF16)
                amx_unhold(held);
#endif
                return rc;
            }
            la_narrowed_rows(o, n * os + t0 * ot, ot, ow, Tc, V, v0, v1, dt);
        }
    }
#if defined(LA_DP_BF16)
    amx_unhold(held);
#endif
    return 0;
}

/* One decoding step of N heads with contiguous rows (q, k, gk (N, K); v, o (N, V); g (N)), all
 * of dtype dt (LA_F32, LA_BF16, LA_F16; the state is float32): la_gla_forward with T = 1, in
 * fewer arguments, its heads in parts on up to `threads` threads (la_parallel). Other dtypes:
 * each part reads its own heads' rows into float32 (exact) in its thread's scratch and rounds
 * its o once at the end (as the delta rule's step: widened by the calling thread, the other
 * threads' rows came over from its core's cache). work: la_gla_step_work(N, K, V, threads, dt)
 * floats. It checks the gates itself (a tensor reduction in Python costs more than this whole
 * loop): returns -3 if a log-gate is NaN or positive, before anything is written; else 0, or 1
 * when it was split and the other threads were late. */

/* Floats of one thread's scratch: the kernel's, then for 16-bit rows a part's inputs widened
 * and its o, in whole cache lines. */
static long gla_step_slot(long N, long K, long V, int threads, int dt) {
    long per = la_per_part(N, threads);
    long widened = dt == LA_F32 ? 0 : 3 * per * K + 2 * per * V + per;
    return la_lines(la_gla_work(K, 1) + widened);
}

long la_gla_step_work(long N, long K, long V, int threads, int dt) {
    return (threads > 1 ? threads : 1) * gla_step_slot(N, K, V, threads, dt);
}

typedef struct {
    const void *q, *k, *v, *g, *gk;
    long N, K, V, per, slot;
    float scale;
    int dt;
    const float *S_in;
    float *S_out;
    void *o;
    float *work;
} gla_step_job;

static void gla_step_part(void *ctx, long part, int slot) {
    const gla_step_job *j = ctx;
    long K = j->K, V = j->V, n0 = part * j->per;
    long n = j->N - n0 < j->per ? j->N - n0 : j->per;
    int dt = j->dt;
    float *work = j->work + slot * j->slot;
    const float *q, *k, *v, *g, *gk;
    float *o;
    if (dt == LA_F32) {
        q = (const float *)j->q + n0 * K, k = (const float *)j->k + n0 * K;
        v = (const float *)j->v + n0 * V, g = j->g ? (const float *)j->g + n0 : NULL;
        gk = j->gk ? (const float *)j->gk + n0 * K : NULL;
        o = (float *)j->o + n0 * V;
    } else { /* this part's rows, widened in this thread's scratch */
        float *f = work + la_gla_work(K, 1);
        q = la_widened(f, (const u16 *)j->q + n0 * K, n * K, dt), f += n * K;
        k = la_widened(f, (const u16 *)j->k + n0 * K, n * K, dt), f += n * K;
        v = la_widened(f, (const u16 *)j->v + n0 * V, n * V, dt), f += n * V;
        g = j->g ? la_widened(f, (const u16 *)j->g + n0, n, dt) : NULL, f += n;
        gk = j->gk ? la_widened(f, (const u16 *)j->gk + n0 * K, n * K, dt) : NULL, f += n * K;
        o = f;
    }
    la_gla_forward(q, K, K, k, K, K, v, V, V, g, 1, gk, K, K, n, 1, K, V, 0, V, 1, j->scale,
                   j->S_in + n0 * K * V, j->S_out + n0 * K * V, o, V, V, NULL, 0, NULL, work);
    if (dt != LA_F32) la_narrowed((u16 *)j->o + n0 * V, o, 0, n * V, dt);
}

static int la_gla_step(const void *q, const void *k, const void *v, const void *g,
                       const void *gk, int dt, long N, long K, long V, float scale,
                       const float *S_in, float *S_out, void *o, float *work, int threads) {
    if (K < 1 || V % W || N < 0 || dt < LA_F32 || dt > LA_F16) return -1;
    if ((g && !la_all_nonpositive(g, N, dt)) || (gk && !la_all_nonpositive(gk, N * K, dt)))
        return -3;
    gla_step_job job = {q, k, v, g, gk, N, K, V, la_per_part(N, threads),
                        gla_step_slot(N, K, V, threads, dt), scale, dt, S_in, S_out, o, work};
    return N > 0 ? la_parallel(gla_step_part, &job, (N + job.per - 1) / job.per, threads) : 0;
}

/* ----------------------------------------------------------------------------- the backward
 * (row_sums, ops/native/common.h: the sums of W vectors' lanes as one vector.) */

/* dst[0..n) = (add ? dst + x : x) for the first n <= W lanes of x. */
static inline void gla_put(float *dst, vf x, long n, int add) {
    if (n == W) {
        vstore(dst, add ? vload(dst) + x : x);
        return;
    }
    float tmp[W];
    vstore(tmp, x);
    for (long l = 0; l < n; ++l) dst[l] = add ? dst[l] + tmp[l] : tmp[l];
}

/* dst[0..K) = the row sums of P's K rows of W partial sums (rows from K on zero), stored, or
 * added where add: a token's dq or dk from one column block. */
static inline void gla_put_rows(float *dst, const float *P, long K, int add) {
    for (long i0 = 0; i0 < K; i0 += W)
        gla_put(dst + i0, row_sums(P + i0 * W), K - i0 < W ? K - i0 : W, add);
}

/* One chunk of Tc tokens of one head over one block of nb vectors of columns. gated: decays a
 * (rows of K) apply. S0: the chunk's checkpoint (rows of V, offset to the block); dS: the
 * gradient of the state after the chunk (rows of V, offset to the block), left holding the
 * gradient of the state before it. Sb: K nb W floats (the block's state); P: KP W floats (KP =
 * K rounded up to W, rows from K on zero). first: the first column block (stores dq, dk; later
 * blocks add to them). X: where not NULL, X[i] += <dS, S after the chunk>_i over this block's
 * columns, with dS as given (the gradient that reaches the state after the chunk from later
 * tokens: the gates' sum at the chunk's end). */
static inline __attribute__((always_inline)) void gla_bwd_cols(
    int nb, int gated, long Tc, long K, long V, const float *q, long qt, const float *k, long kt,
    const float *a, const float *v, long vt, const float *dout, long dt, float scale,
    const float *S0, float *dS, float *Sb, float *P, double *X, int first, float *dq, long dqt,
    float *dk, long dkt, float *dv, long dvt) {
    const long BW = nb * W;
    vf sv = vsplat(scale);
    for (long i = 0; i < K; ++i)
        for (int j = 0; j < nb; ++j) vstore(Sb + i * BW + j * W, vload(S0 + i * V + j * W));
    /* forward: S_m = diag(a_m) S_{m-1} + k_m v_m^T, dq_m = S_m d~_m */
    for (long m = 0; m < Tc; ++m) {
        vf vv[GLA_NB], dd[GLA_NB];
        for (int j = 0; j < nb; ++j)
            vv[j] = vload(v + m * vt + j * W), dd[j] = sv * vload(dout + m * dt + j * W);
        const float *kr = k + m * kt, *ar = gated ? a + m * K : NULL;
        for (long i = 0; i < K; ++i) {
            vf ki = vsplat(kr[i]), ai = vsplat(gated ? ar[i] : 1.0f), pq = vsplat(0.0f);
            float *Si = Sb + i * BW;
            for (int j = 0; j < nb; ++j) {
                vf s = vload(Si + j * W);
                s = (gated ? ai * s : s) + ki * vv[j];
                pq += s * dd[j];
                vstore(Si + j * W, s);
            }
            vstore(P + i * W, pq);
        }
        gla_put_rows(dq + m * dqt, P, K, !first);
    }
    if (X)
        for (long i = 0; i < K; ++i) {
            vf p = vsplat(0.0f);
            for (int j = 0; j < nb; ++j)
                p += vload(Sb + i * BW + j * W) * vload(dS + i * V + j * W);
            X[i] += hsum(p);
        }
    /* reverse: dS_m = dS + q_m d~_m^T; dk_m = dS_m v_m, dv_m = dS_m^T k_m; dS = diag(a_m) dS_m */
    for (long m = Tc - 1; m >= 0; --m) {
        vf dd[GLA_NB], vv[GLA_NB], dva[GLA_NB];
        for (int j = 0; j < nb; ++j) {
            dd[j] = sv * vload(dout + m * dt + j * W);
            vv[j] = vload(v + m * vt + j * W);
            dva[j] = vsplat(0.0f);
        }
        const float *qr = q + m * qt, *kr = k + m * kt, *ar = gated ? a + m * K : NULL;
        for (long i = 0; i < K; ++i) {
            vf qi = vsplat(qr[i]), ki = vsplat(kr[i]), ai = vsplat(gated ? ar[i] : 1.0f);
            vf pk = vsplat(0.0f);
            float *dSi = dS + i * V;
            for (int j = 0; j < nb; ++j) {
                vf d = vload(dSi + j * W) + qi * dd[j]; /* dS_m, row i */
                pk += d * vv[j];
                dva[j] += ki * d;
                vstore(dSi + j * W, gated ? ai * d : d); /* the part that reaches S_{m-1} */
            }
            vstore(P + i * W, pk);
        }
        for (int j = 0; j < nb; ++j) vstore(dv + m * dvt + j * W, dva[j]);
        gla_put_rows(dk + m * dkt, P, K, !first);
    }
}

/* gla_bwd_cols specialised for constant (nb, gated). */
static void gla_bwd_any(int nb, int gated, long Tc, long K, long V, const float *q, long qt,
                        const float *k, long kt, const float *a, const float *v, long vt,
                        const float *dout, long dt, float scale, const float *S0, float *dS,
                        float *Sb, float *P, double *X, int first, float *dq, long dqt,
                        float *dk, long dkt, float *dv, long dvt) {
#define B_(c, gt)                                                                             \
    case c * 2 + gt:                                                                          \
        if (c <= GLA_NB)                                                                      \
            gla_bwd_cols(c <= GLA_NB ? c : GLA_NB, gt, Tc, K, V, q, qt, k, kt, a, v, vt, dout,  \
                         dt, scale, S0, dS, Sb, P, X, first, dq, dqt, dk, dkt, dv, dvt);      \
        break;
    switch (nb * 2 + gated) { /* (GLA_NB, not NV: the scalar build's blocks are of 4) */
        B_(1, 0) B_(1, 1) B_(2, 0) B_(2, 1) B_(3, 0) B_(3, 1) B_(4, 0) B_(4, 1)
        default: break;
    }
#undef B_
}

typedef float gla_f8 __attribute__((vector_size(32)));
typedef double gla_d8 __attribute__((vector_size(64)));
typedef long long gla_l8 __attribute__((vector_size(64)));

/* The gates' gradients of a chunk of Tc tokens from its dq and dk (rows of K, token strides dqt,
 * dkt), last token first: R (K doubles, the sum at the chunk's end) += q_m dq_m - k_m dk_m (the
 * products in float32), set to 0 where a decay is 0; dgk_m = R (rows of K, token stride dgkt;
 * NULL: none, then the row goes to tmp, K floats) and dg_m = sum_i R_i (NULL: none). */
static void gla_gate_grads(long Tc, long K, const float *q, long qt, const float *k, long kt,
                           const float *a, const float *dq, long dqt, const float *dk, long dkt,
                           double *R, float *dgk, long dgkt, float *dg, float *tmp) {
    for (long m = Tc - 1; m >= 0; --m) {
        const float *qm = q + m * qt, *km = k + m * kt, *dqm = dq + m * dqt, *dkm = dk + m * dkt;
        const float *am = a + m * K;
        float *row = dgk ? dgk + m * dgkt : tmp;
        long i = 0;
        for (; i + 8 <= K; i += 8) { /* eight at a time (the compiler left this loop scalar) */
            gla_f8 qv, dqv, kv, dkv, av;
            gla_d8 r;
            memcpy(&qv, qm + i, sizeof qv), memcpy(&dqv, dqm + i, sizeof dqv);
            memcpy(&kv, km + i, sizeof kv), memcpy(&dkv, dkm + i, sizeof dkv);
            memcpy(&av, am + i, sizeof av), memcpy(&r, R + i, sizeof r);
            r += __builtin_convertvector(qv * dqv - kv * dkv, gla_d8);
            gla_l8 reset = __builtin_convertvector(av == (gla_f8){0}, gla_l8); /* -1 where 0 */
            r = (gla_d8)((gla_l8)r & ~reset);
            memcpy(R + i, &r, sizeof r);
            gla_f8 rf = __builtin_convertvector(r, gla_f8);
            memcpy(row + i, &rf, sizeof rf);
        }
        for (; i < K; ++i) {
            double r = R[i] + (double)(qm[i] * dqm[i] - km[i] * dkm[i]);
            R[i] = am[i] == 0.0f ? 0.0 : r;
            row[i] = (float)R[i];
        }
        if (!dg) continue;
        vf acc = vsplat(0.0f);
        for (i = 0; i + W <= K; i += W) acc += vload(row + i);
        float sum = hsum(acc);
        for (; i < K; ++i) sum += row[i];
        dg[m] = sum;
    }
}

/* Floats of work la_gla_backward needs: la_gla_work(K, C), then a chunk's q, k, v and output
 * gradient widened and its dq, dk, dv before they are rounded (16-bit rows), each GLA_PAD
 * floats after the one before: rows of 64 floats put them 16 KiB apart, and a load a multiple
 * of 4 KiB from a recent store to another of them waits for it (4K aliasing). */
#define GLA_PAD 80
long la_gla_backward_work(long K, long V, long C) {
    return la_gla_work(K, C) + C * (4 * K + 3 * V) + 7 * GLA_PAD;
}

/* The gradients of la_gla_forward over T tokens of N heads (all V columns), from those of the
 * output (dout: rows of V, head stride dos, token stride dot) and of the final state (dS_in:
 * (N, K, V) contiguous, or NULL for zero). q, k, v, g, gk, C, scale: as the forward was called;
 * ckpt: what it stored (head stride cks). Writes dq, dk (rows of K: dqs, dqt; dks, dkt), dv
 * (rows of V: dvs, dvt), dg (T floats per head, head stride dgs; only with g), dgk (rows of K:
 * dgks, dgkt; only with gk) and dS_out, the initial state's gradient ((N, K, V) contiguous; may
 * be dS_in). q, k, v, dout, dq, dk and dv are of dtype dt (LA_F32, or 16-bit: each chunk's
 * rows read into float32 first, exact, its gradients rounded once as they are written: the
 * float32 arithmetic without widened copies); the rest float32. work: la_gla_backward_work(K,
 * V, C) floats. Returns 0, or -1 on sizes or a dtype it does not take. */
static int la_gla_backward(const void *q_, long qs, long qt, const void *k_, long ks, long kt,
                           const void *v_, long vs, long vt, const float *g, long gs,
                           const float *gk, long gks, long gkt, const void *dout_, long dos,
                           long dot, long N, long T, long K, long V, long C, float scale,
                           const float *ckpt, long cks, const float *dS_in, float *dS_out,
                           void *dq_, long dqs, long dqt, void *dk_, long dks, long dkt,
                           void *dv_, long dvs, long dvt, float *dg, long dgs, float *dgk,
                           long dgks, long dgkt, int dt, float *work) {
    if (K < 1 || V % W || N < 0 || T < 0 || C < 1 || C > GLA_CMAX || (T > 0 && !ckpt)
        || (g && !dg) || (gk && !dgk) || dt < LA_F32 || dt > LA_F16)
        return -1;
    int gated = g != NULL || gk != NULL, wide = dt != LA_F32;
    const long KP = gla_round_up(K);
    float *a = work, *P = a + C * K, *Sb = P + KP * W;
    double *R = (double *)(((size_t)(Sb + K * GLA_NB * W) + 7) & ~(size_t)7);
    /* 16-bit rows: a chunk's q, k, v, dout widened and its dq, dk, dv before they are rounded,
     * after the float32 form's scratch (whose layout stays as it is) */
    float *qw = work + la_gla_work(K, C), *kw = qw + C * K + GLA_PAD, *vw = kw + C * K + GLA_PAD;
    float *ow = vw + C * V + GLA_PAD, *dqw = ow + C * V + GLA_PAD, *dkw = dqw + C * K + GLA_PAD;
    float *dvw = dkw + C * K + GLA_PAD;
    memset(P, 0, (size_t)(KP * W) * sizeof(float)); /* rows from K on stay zero */
    for (long n = 0; n < N; ++n) {
        float *dS = dS_out + n * K * V;
        if (!dS_in) memset(dS, 0, (size_t)(K * V) * sizeof(float));
        else if (dS_in + n * K * V != dS)
            memcpy(dS, dS_in + n * K * V, (size_t)(K * V) * sizeof(float));
        for (long c = (T + C - 1) / C - 1; c >= 0; --c) {
            long t0 = c * C, Tc = T - t0 < C ? T - t0 : C;
            /* the chunk's float32 rows: in place, or widened (then rows of K, V) */
            const float *qc, *kc, *vc, *oc;
            float *dqc, *dkc, *dvc;
            long qct = qt, kct = kt, vct = vt, oct = dot, dqct = dqt, dkct = dkt, dvct = dvt;
            if (wide) {
                la_widened_rows(qw, q_, n * qs + t0 * qt, qt, Tc, K, dt);
                la_widened_rows(kw, k_, n * ks + t0 * kt, kt, Tc, K, dt);
                la_widened_rows(vw, v_, n * vs + t0 * vt, vt, Tc, V, dt);
                la_widened_rows(ow, dout_, n * dos + t0 * dot, dot, Tc, V, dt);
                qc = qw, kc = kw, vc = vw, oc = ow, dqc = dqw, dkc = dkw, dvc = dvw;
                qct = kct = dqct = dkct = K, vct = oct = dvct = V;
            } else {
                qc = (const float *)q_ + n * qs + t0 * qt, kc = (const float *)k_ + n * ks + t0 * kt;
                vc = (const float *)v_ + n * vs + t0 * vt;
                oc = (const float *)dout_ + n * dos + t0 * dot;
                dqc = (float *)dq_ + n * dqs + t0 * dqt, dkc = (float *)dk_ + n * dks + t0 * dkt;
                dvc = (float *)dv_ + n * dvs + t0 * dvt;
            }
            if (gated) {
                gla_decays(Tc, K, g ? g + n * gs + t0 : NULL, gk ? gk + n * gks + t0 * gkt : NULL,
                           gkt, a);
                /* the sum from the sequence's end, restarted at each chunk's end from what it
                 * equals there, <dS, S> of the state after the chunk (the sweeps give it): so
                 * the rounding of the gradients of one chunk's tokens only is in it */
                for (long i = 0; i < K; ++i) R[i] = 0.0;
            }
            for (long j0 = 0; j0 < V; j0 += GLA_NB * W) {
                int nb = (V - j0) / W < GLA_NB ? (int)((V - j0) / W) : GLA_NB;
                gla_bwd_any(nb, gated, Tc, K, V, qc, qct, kc, kct, a, vc + j0, vct, oc + j0, oct,
                            scale, ckpt + n * cks + c * K * V + j0, dS + j0, Sb, P,
                            gated ? R : NULL, j0 == 0, dqc, dqct, dkc, dkct, dvc + j0, dvct);
            }
            if (gated)
                gla_gate_grads(Tc, K, qc, qct, kc, kct, a, dqc, dqct, dkc, dkct, R,
                               gk ? dgk + n * dgks + t0 * dgkt : NULL, dgkt,
                               g ? dg + n * dgs + t0 : NULL, P);
            if (wide) { /* rounded once */
                la_narrowed_rows(dq_, n * dqs + t0 * dqt, dqt, dqw, Tc, K, 0, K, dt);
                la_narrowed_rows(dk_, n * dks + t0 * dkt, dkt, dkw, Tc, K, 0, K, dt);
                la_narrowed_rows(dv_, n * dvs + t0 * dvt, dvt, dvw, Tc, V, 0, V, dt);
            }
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ the Python entry points
 * One argument struct per kernel (ops/native/common.h); linattn/ops/gated/native.py mirrors
 * each in ctypes and the layouts are checked against la_gated_abi when the library loads. */
#define LA_GLA_FORWARD_ARGS(X, la_s) \
    X(la_s, const void *, q, 'p') X(la_s, long, qs, 'l') X(la_s, long, qt, 'l') \
    X(la_s, const void *, k, 'p') X(la_s, long, ks, 'l') X(la_s, long, kt, 'l') \
    X(la_s, const void *, v, 'p') X(la_s, long, vs, 'l') X(la_s, long, vt, 'l') \
    X(la_s, const float *, g, 'p') X(la_s, long, gs, 'l') X(la_s, const float *, gk, 'p') \
    X(la_s, long, gks, 'l') X(la_s, long, gkt, 'l') X(la_s, int, dt, 'i') X(la_s, long, N, 'l') \
    X(la_s, long, T, 'l') X(la_s, long, K, 'l') X(la_s, long, V, 'l') X(la_s, long, v0, 'l') \
    X(la_s, long, v1, 'l') X(la_s, long, C, 'l') X(la_s, float, scale, 'f') \
    X(la_s, const float *, S_in, 'p') X(la_s, float *, S_out, 'p') X(la_s, void *, o, 'p') \
    X(la_s, long, os, 'l') X(la_s, long, ot, 'l') X(la_s, float *, ckpt, 'p') \
    X(la_s, long, cks, 'l') X(la_s, float *, work, 'p')
LA_ARGS(la_gla_forward_args, LA_GLA_FORWARD_ARGS)
int la_gla_forward_call(const la_gla_forward_args *a) {
    if (a->dt != LA_F32) /* 16-bit rows, a chunk at a time (with the checkpoints) */
        return a->dt < LA_F32 || a->dt > LA_F16 ? -1
               : gla_forward_widened(a->q, a->qs, a->qt, a->k, a->ks, a->kt, a->v, a->vs,
                                     a->vt, a->g, a->gs, a->gk, a->gks, a->gkt, a->dt, a->N,
                                     a->T, a->K, a->V, a->v0, a->v1, a->C, a->scale, a->S_in,
                                     a->S_out, a->o, a->os, a->ot, a->ckpt, a->cks, a->work);
    return la_gla_forward(a->q, a->qs, a->qt, a->k, a->ks, a->kt, a->v, a->vs, a->vt, a->g, a->gs,
                          a->gk, a->gks, a->gkt, a->N, a->T, a->K, a->V, a->v0, a->v1, a->C,
                          a->scale, a->S_in, a->S_out, a->o, a->os, a->ot, a->ckpt, a->cks,
                          NULL, a->work);
}

#define LA_GLA_BACKWARD_ARGS(X, la_s) \
    X(la_s, const void *, q, 'p') X(la_s, long, qs, 'l') X(la_s, long, qt, 'l') \
    X(la_s, const void *, k, 'p') X(la_s, long, ks, 'l') X(la_s, long, kt, 'l') \
    X(la_s, const void *, v, 'p') X(la_s, long, vs, 'l') X(la_s, long, vt, 'l') \
    X(la_s, const float *, g, 'p') X(la_s, long, gs, 'l') X(la_s, const float *, gk, 'p') \
    X(la_s, long, gks, 'l') X(la_s, long, gkt, 'l') X(la_s, const void *, dout, 'p') \
    X(la_s, long, dos, 'l') X(la_s, long, dot, 'l') X(la_s, long, N, 'l') X(la_s, long, T, 'l') \
    X(la_s, long, K, 'l') X(la_s, long, V, 'l') X(la_s, long, C, 'l') X(la_s, float, scale, 'f') \
    X(la_s, const float *, ckpt, 'p') X(la_s, long, cks, 'l') X(la_s, const float *, dS_in, 'p') \
    X(la_s, float *, dS_out, 'p') X(la_s, void *, dq, 'p') X(la_s, long, dqs, 'l') \
    X(la_s, long, dqt, 'l') X(la_s, void *, dk, 'p') X(la_s, long, dks, 'l') \
    X(la_s, long, dkt, 'l') X(la_s, void *, dv, 'p') X(la_s, long, dvs, 'l') \
    X(la_s, long, dvt, 'l') X(la_s, float *, dg, 'p') X(la_s, long, dgs, 'l') \
    X(la_s, float *, dgk, 'p') X(la_s, long, dgks, 'l') X(la_s, long, dgkt, 'l') \
    X(la_s, int, dt, 'i') X(la_s, float *, work, 'p')
LA_ENTRY(la_gla_backward, LA_GLA_BACKWARD_ARGS)

#define LA_GLA_STEP_ARGS(X, la_s) \
    X(la_s, const void *, q, 'p') X(la_s, const void *, k, 'p') X(la_s, const void *, v, 'p') \
    X(la_s, const void *, g, 'p') X(la_s, const void *, gk, 'p') X(la_s, int, dt, 'i') \
    X(la_s, long, N, 'l') X(la_s, long, K, 'l') X(la_s, long, V, 'l') X(la_s, float, scale, 'f') \
    X(la_s, const float *, S_in, 'p') X(la_s, float *, S_out, 'p') X(la_s, void *, o, 'p') \
    X(la_s, float *, work, 'p') X(la_s, int, threads, 'i')
LA_ENTRY(la_gla_step, LA_GLA_STEP_ARGS)

static const la_struct la_gated_structs[] = {
    LA_STRUCT_ENTRY(la_gla_forward_args),
    LA_STRUCT_ENTRY(la_gla_backward_args),
    LA_STRUCT_ENTRY(la_gla_step_args),
};
LA_ABI_TABLE(la_gated_abi, la_gated_structs)
