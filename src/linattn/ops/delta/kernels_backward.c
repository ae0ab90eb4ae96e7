/* The backward of the (gated) delta rule, a part of ops/delta/kernels.c: included there, after
 * the forward whose constants (GDR_TC, GDR_EPS) it shares, and not compiled on its own. */
/* ----------------------------------------------- the (gated) delta rule, backward, float32
 * (docs/theory.md, section 10, "The backward".) Per head, from the gradients of the outputs
 * (dout, rows of V) and of the final state (dS, K x V; NULL: zero), the gradients of q, k, v,
 * beta, g and of the initial state. With D the gradient of the state after token t
 * (D = dS after the last token), q~, k~, a, beta as in the forward, w = v_t - a S_{t-1}^T k~
 * (saved by the forward) and u = beta w, one token backwards is
 *     D += q~ dout_t^T                       (o_t = S_t^T q~)
 *     du = D^T k~,   dv_t = beta du,   dbeta_t = w . du,   c = -beta du
 *     dq~ = a S_{t-1} dout_t + k~ (u . dout_t)          (= S_t dout_t)
 *     dk~ = D u + a S_{t-1} c
 *     E = D + k~ c^T,   dg_t = a <E, S_{t-1}>,   D <- a E
 * and the gradients of q, k through the scale and the L2 norm at the end. S_{t-1} comes from
 * the checkpoint the forward stored before each chunk of GDR_TC tokens, recomputed forward
 * through the chunk (S <- a S + k~ u^T: w is saved, so no S^T k~ to sum again) into a buffer of
 * one state per token of the chunk, then walked backwards.
 * Layout: every value column j of S and D evolves alone given the per-token scalars and
 * vectors (the forward's column independence), so the kernel keeps S and D transposed (V rows
 * of Kp = K rounded up to 16 floats, zero padded) and walks blocks of GDB_R value rows: the
 * block's states for a chunk (GDR_TC x GDB_R x Kp floats, 256 KiB at K = 64) stay in L2 and
 * its D rows in L1. The sums over value rows (dq~, dk~, dg, dbeta) are then sums of vectors
 * of K floats, added into per-token buffers block by block; only du (a sum over K) needs a
 * horizontal sum, one per row and token. Per state element and token: 8 vector operations
 * backwards (two passes over the row of D: D += q~ dout_j with du; then dk, dq, dg, E and
 * a E) and 2 to recompute the state, against 4 in the forward. */
#if LA_W == 8 || (LA_W == 4 && !(defined(__ARM_NEON) || defined(__ARM_NEON__)))
#define GDB_KB 2 /* 16 registers: dk, dq, dg and k~ per vector, broadcasts, temporaries */
#else
#define GDB_KB 4
#endif
#define GDB_R 16 /* value rows per block */
#define GDB_KP(K) (((K) + 15) / 16 * 16)
/* Floats from one token's block of states to the next, and the gap after D: two cache lines
 * more than the rows need, so that a load never sits a multiple of 4 KiB from a recent store
 * to another array (4K aliasing: the load would wait for the store, ~2x slower here). */
#define GDB_TS(Kp) (GDB_R * (Kp) + 32)

/* Floats of work la_gdr_backward needs for head dimensions K, V: its float32 form's, then a
 * chunk's q, k and dout widened and its dv before it is rounded (16-bit rows; placed last, so
 * that the float32 form's layout is the same either way), each GDB_PAD floats after the one
 * before (64 rows of 64 floats are 16 KiB: no load a multiple of 4 KiB from a recent store). */
#define GDB_PAD 80
long la_gdr_backward_work(long K, long V) {
    long Kp = GDB_KP(K);
    return V * Kp + 32 + (long)GDR_TC * GDB_TS(Kp) + 4L * GDR_TC * Kp + 8L * GDR_TC + 6L * GDB_R +
           (long)GDB_R * W + 2L * GDR_TC * (K + V) + 4 * GDB_PAD;
}

/* The token chunk: the forward's checkpoint interval. */
long la_gdr_chunk(void) { return GDR_TC; }

/* Prepare Tc tokens as gdr_prep does (the same qn, kn, a, to the bit), rows of Kp zero padded,
 * and rq, rk the factors of the L2 norm (1 without l2norm). */
static void gdb_prep(long Tc, long K, long Kp, const float *q, long qt, const float *k, long kt,
                     const float *beta, const float *g, float scale, int l2norm, float *qn,
                     float *kn, float *a, float *b, float *rq, float *rk) {
    for (long t = 0; t < Tc; ++t) {
        const float *qr = q + t * qt, *kr = k + t * kt;
        float sq = scale, sk = 1.0f;
        rq[t] = rk[t] = 1.0f;
        if (l2norm) {
            rq[t] = 1.0f / sqrtf(dot(qr, qr, K) + GDR_EPS);
            rk[t] = 1.0f / sqrtf(dot(kr, kr, K) + GDR_EPS);
            sq *= rq[t];
            sk = rk[t];
        }
        scale_row(qn + t * Kp, 0, 0, qr, sq, K);
        scale_row(kn + t * Kp, 0, 0, kr, sk, K);
        for (long i = K; i < Kp; ++i) qn[t * Kp + i] = kn[t * Kp + i] = 0.0f;
        a[t] = g ? sexp_nonpos(g[t]) : 1.0f;
        b[t] = beta[t];
    }
}

/* The states before each of the Tc tokens for value rows [j0, j0 + Rb), transposed: SB[m] is
 * Rb rows of Kp (row stride Kp, token stride R Kp), SB[0] from the checkpoint ck (K x V). */
static void gdb_recompute(int gated, long Tc, long K, long Kp, long V, long Rb, long j0,
                          const float *ck, const float *w, long wt, const float *a,
                          const float *b, const float *kn, float *SB) {
    long ts = GDB_TS(Kp), K0 = K / W * W, R0 = Rb / W * W;
    /* the checkpoint's columns j0 .. j0 + Rb - 1 as rows: W x W blocks transposed in
     * registers, then the edges (element by element, the strided reads were 6 % of the
     * backward, Intel Xeon, family 6) */
    for (long r = 0; r < R0; r += W)
        for (long i = 0; i < K0; i += W)
            transpose_block(ck + i * V + j0 + r, V, SB + r * Kp + i, Kp);
    for (long r = 0; r < Rb; ++r) {
        float *s0 = SB + r * Kp;
        for (long i = r < R0 ? K0 : 0; i < K; ++i) s0[i] = ck[i * V + j0 + r];
        for (long i = K; i < Kp; ++i) s0[i] = 0.0f;
    }
    for (long m = 0; m + 1 < Tc; ++m) {
        const float *src = SB + m * ts, *km = kn + m * Kp;
        float *dst = SB + (m + 1) * ts;
        vf av = vsplat(a[m]);
        for (long r = 0; r < Rb; ++r) {
            vf u = vsplat(b[m] * w[m * wt + j0 + r]);
            if (gated) /* two loops: the flag's test stayed inside the one */
                for (long x = 0; x < Kp; x += W)
                    vstore(dst + r * Kp + x, av * vload(src + r * Kp + x) + vload(km + x) * u);
            else
                for (long x = 0; x < Kp; x += W)
                    vstore(dst + r * Kp + x, vload(src + r * Kp + x) + vload(km + x) * u);
        }
    }
}

/* One token's pass over a block's rows, for the nb vectors of columns at x (D, S: rows of Kp
 * at the piece, kx: k~ at the piece): accumulates dk~, dq~ (before their per-token factors)
 * into dk, dq and <E, S> into *gsum, and D <- a E; ru, rc, rcp, rdo: each row's u_j, c_j,
 * a c_j and dout_j. With next, also the next token's first step (kx1, qx1: its k~, q~ at the
 * piece; rdo1: its dout_j per row): D += q~ dout_j, and the row's partial sums of D^T k~ in P
 * (one vector per row, added to unless first). */
static inline __attribute__((always_inline)) void gdb_piece(int nb, int gated, int next,
                                                            long Rb, long Kp, float am,
                                                            const float *kx, const float *kx1,
                                                            const float *qx1, int first,
                                                            float *P, float *D, const float *S,
                                                            const float *ru, const float *rc,
                                                            const float *rcp, const float *rdo,
                                                            const float *rdo1, float *dk,
                                                            float *dq, float *gsum) {
    vf ak[GDB_KB], aq[GDB_KB], ag[GDB_KB], kv[GDB_KB], kv1[GDB_KB], av = vsplat(am);
    for (int x = 0; x < nb; ++x) {
        ak[x] = aq[x] = ag[x] = vsplat(0.0f);
        kv[x] = vload(kx + x * W);
        kv1[x] = next ? vload(kx1 + x * W) : vsplat(0.0f);
    }
    for (long r = 0; r < Rb; ++r) {
        vf u = vsplat(ru[r]), c = vsplat(rc[r]), cp = vsplat(rcp[r]), o = vsplat(rdo[r]);
        vf o1 = vsplat(next ? rdo1[r] : 0.0f);
        vf p = next && !first ? vload(P + r * W) : vsplat(0.0f);
        float *Dr = D + r * Kp;
        const float *Sr = S + r * Kp;
        for (int x = 0; x < nb; ++x) {
            vf d = vload(Dr + x * W), s = vload(Sr + x * W);
            ak[x] += d * u; /* two multiply-adds (not a product, a multiply-add and an add) */
            ak[x] += s * cp;
            aq[x] += s * o;
            vf e = d + c * kv[x];
            ag[x] += e * s;
            vf dn = gated ? av * e : e;
            if (next) {
                dn += o1 * vload(qx1 + x * W);
                p += dn * kv1[x];
            }
            vstore(Dr + x * W, dn);
        }
        if (next) vstore(P + r * W, p);
    }
    vf gs = vsplat(0.0f);
    for (int x = 0; x < nb; ++x) {
        vstore(dk + x * W, vload(dk + x * W) + ak[x]);
        vstore(dq + x * W, vload(dq + x * W) + aq[x]);
        gs += ag[x];
    }
    *gsum += hsum(gs);
}

/* gdb_piece specialised for constant (nb, gated, next). */
static void gdb_piece_any(int nb, int gated, int next, long Rb, long Kp, float am,
                          const float *kx, const float *kx1, const float *qx1, int first,
                          float *P, float *D, const float *S, const float *ru, const float *rc,
                          const float *rcp, const float *rdo, const float *rdo1, float *dk,
                          float *dq, float *gsum) {
/* Cases beyond this ISA's GDB_KB are constant-false (and never asked for). */
#define G_(c, gt, nx)                                                                         \
    case (c * 2 + gt) * 2 + nx:                                                               \
        if (c <= GDB_KB)                                                                      \
            gdb_piece(c <= GDB_KB ? c : GDB_KB, gt, nx, Rb, Kp, am, kx, kx1, qx1, first, P, D, \
                      S, ru, rc, rcp, rdo, rdo1, dk, dq, gsum);                               \
        break;
    switch ((nb * 2 + gated) * 2 + next) {
        G_(1, 0, 0) G_(1, 0, 1) G_(1, 1, 0) G_(1, 1, 1) G_(2, 0, 0) G_(2, 0, 1) G_(2, 1, 0)
        G_(2, 1, 1) G_(3, 0, 0) G_(3, 0, 1) G_(3, 1, 0) G_(3, 1, 1) G_(4, 0, 0) G_(4, 0, 1)
        G_(4, 1, 0) G_(4, 1, 1)
        default: break;
    }
#undef G_
}

/* du[r] = the sum of the W lanes of P[r] (vectors of W floats), r < GDB_R. One horizontal sum
 * per row would cost more than the row's share of the pass (its latency too): W rows at a time
 * are summed by halving, two vectors into one whose halves hold a row's partial sums each,
 * so that W rows cost W - 1 such steps (two shuffles and an add) and one store. */
#if (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)) && \
    (LA_W == 4 || LA_W == 8 || LA_W == 16)
#define GDB_HALVE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#if LA_W == 16
#define GDB_L0(a, b) (GDB_HALVE(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) + \
                      GDB_HALVE(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31))
#define GDB_L1(a, b) (GDB_HALVE(a, b, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) + \
                      GDB_HALVE(a, b, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31))
#define GDB_L2(a, b) (GDB_HALVE(a, b, 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) + \
                      GDB_HALVE(a, b, 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31))
#define GDB_L3(a, b) (GDB_HALVE(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) + \
                      GDB_HALVE(a, b, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31))
static inline vf gdb_rowsum(const float *P) {
    vf x[16], y[8], z[4], u[2];
    for (int r = 0; r < 16; ++r) x[r] = vload(P + r * 16);
    for (int r = 0; r < 8; ++r) y[r] = GDB_L0(x[2 * r], x[2 * r + 1]);
    for (int r = 0; r < 4; ++r) z[r] = GDB_L1(y[2 * r], y[2 * r + 1]);
    for (int r = 0; r < 2; ++r) u[r] = GDB_L2(z[2 * r], z[2 * r + 1]);
    return GDB_L3(u[0], u[1]);
}
#elif LA_W == 8
#define GDB_L0(a, b) (GDB_HALVE(a, b, 0, 1, 2, 3, 8, 9, 10, 11) + \
                      GDB_HALVE(a, b, 4, 5, 6, 7, 12, 13, 14, 15))
#define GDB_L1(a, b) (GDB_HALVE(a, b, 0, 1, 4, 5, 8, 9, 12, 13) + \
                      GDB_HALVE(a, b, 2, 3, 6, 7, 10, 11, 14, 15))
#define GDB_L2(a, b) (GDB_HALVE(a, b, 0, 2, 4, 6, 8, 10, 12, 14) + \
                      GDB_HALVE(a, b, 1, 3, 5, 7, 9, 11, 13, 15))
static inline vf gdb_rowsum(const float *P) {
    vf x[8], y[4], z[2];
    for (int r = 0; r < 8; ++r) x[r] = vload(P + r * 8);
    for (int r = 0; r < 4; ++r) y[r] = GDB_L0(x[2 * r], x[2 * r + 1]);
    for (int r = 0; r < 2; ++r) z[r] = GDB_L1(y[2 * r], y[2 * r + 1]);
    return GDB_L2(z[0], z[1]);
}
#else
#define GDB_L0(a, b) (GDB_HALVE(a, b, 0, 1, 4, 5) + GDB_HALVE(a, b, 2, 3, 6, 7))
#define GDB_L1(a, b) (GDB_HALVE(a, b, 0, 2, 4, 6) + GDB_HALVE(a, b, 1, 3, 5, 7))
static inline vf gdb_rowsum(const float *P) {
    vf x[4], y[2];
    for (int r = 0; r < 4; ++r) x[r] = vload(P + r * 4);
    for (int r = 0; r < 2; ++r) y[r] = GDB_L0(x[2 * r], x[2 * r + 1]);
    return GDB_L1(y[0], y[1]);
}
#endif
static inline void gdb_sums(const float *P, float *du) {
    for (int r = 0; r < GDB_R; r += W) vstore(du + r, gdb_rowsum(P + r * W));
}
#else /* scalars, or no __builtin_shufflevector: one horizontal sum per row */
static inline void gdb_sums(const float *P, float *du) {
    for (int r = 0; r < GDB_R; ++r) du[r] = hsum(vload(P + r * W));
}
#endif

/* A token's per-row values once du = D^T k~ is summed for each row (du; wm, om: the token's w
 * and dout at the block, Rb rows): dv = beta du, the rows' shares of dbeta and u . dout, and
 * ru, rc, rcp, rdo for gdb_piece. Whole blocks in vectors over the rows. */
static inline void gdb_rows(long Rb, float am, float bm, const float *du, const float *wm,
                            const float *om, float *dvm, float *dbacc, float *ud, float *ru,
                            float *rc, float *rcp, float *rdo) {
    float dbs = 0.0f, uds = 0.0f;
    long r = 0;
    if (Rb == GDB_R) {
        vf b = vsplat(bm), a = vsplat(am), vdb = vsplat(0.0f), vud = vsplat(0.0f);
        for (; r < GDB_R; r += W) {
            vf w = vload(wm + r), d = vload(du + r), o = vload(om + r), c = -(b * d);
            vstore(dvm + r, b * d);
            vdb += w * d;
            vud += (b * w) * o;
            vstore(ru + r, b * w);
            vstore(rc + r, c);
            vstore(rcp + r, a * c);
            vstore(rdo + r, o);
        }
        dbs = hsum(vdb), uds = hsum(vud);
    }
    for (; r < Rb; ++r) {
        float uj = bm * wm[r];
        dvm[r] = bm * du[r];
        dbs += wm[r] * du[r];
        uds += uj * om[r];
        ru[r] = uj, rc[r] = -(bm * du[r]), rcp[r] = am * rc[r], rdo[r] = om[r];
    }
    *dbacc += dbs;
    *ud += uds;
}

/* A token's dq, dk rows (K floats at dqr, dkr) from the sums over its value rows: dq~ (dqh,
 * before its factors a and the u . dout term ud: dq~ = scale (a dqh + k~ ud), written back
 * into dqh) and dk~ (dkh), through the L2 norm (x^ = x r: dx = r (dx^ - x^ (x^ . dx^)); rq,
 * rk; qr the token's q row as given, km its k~ row). Whole vectors, then a scalar tail: one
 * token's loops left scalar by the compiler (their sums are reductions) were a tenth of the
 * backward (Intel Xeon, family 6). */
static inline void gdb_token_grads(long K, float scale, int l2norm, float am, float udm,
                                   float rqm, float rkm, const float *qr, const float *km,
                                   float *dqh, const float *dkh, float *dqr, float *dkr) {
    long K0 = K / W * W, i;
    vf pqv = vsplat(0.0f), pkv = vsplat(0.0f);
    for (i = 0; i < K0; i += W) {
        vf d = vsplat(scale) * (vsplat(am) * vload(dqh + i) + vload(km + i) * udm);
        vstore(dqh + i, d);
        pqv += vload(qr + i) * d;
        pkv += vload(km + i) * vload(dkh + i);
    }
    float pq = hsum(pqv), pk = hsum(pkv);
    for (; i < K; ++i) {
        dqh[i] = scale * (am * dqh[i] + km[i] * udm);
        pq += qr[i] * dqh[i], pk += km[i] * dkh[i];
    }
    if (!l2norm) {
        memcpy(dqr, dqh, (size_t)K * sizeof(float));
        memcpy(dkr, dkh, (size_t)K * sizeof(float));
        return;
    }
    pq *= rqm;
    for (i = 0; i < K0; i += W) {
        vstore(dqr + i, rqm * (vload(dqh + i) - rqm * vload(qr + i) * pq));
        vstore(dkr + i, rkm * (vload(dkh + i) - vload(km + i) * pk));
    }
    for (; i < K; ++i) {
        dqr[i] = rqm * (dqh[i] - rqm * qr[i] * pq);
        dkr[i] = rkm * (dkh[i] - km[i] * pk);
    }
}

/* The backward of la_gdr_forward over T tokens of N heads (all V columns). q, k: as the
 * forward's; beta, g (NULL: ungated): T floats per head (strides bs, gs); ckpt (head stride
 * cs), w (strides ws, wt): what the forward saved; dout: the output's gradient (rows of V,
 * head and token strides dos, dot); dS: the final state's (N, K, V) contiguous, or NULL for
 * zero; dS0: the initial state's, (N, K, V) contiguous. Outputs dq, dk (rows of K), dv (rows
 * of V), dbeta and dg (NULL when ungated; one float per token), each with head and token
 * strides. q, k, dout, dq, dk and dv are of dtype dt (LA_F32, or 16-bit: each chunk's rows
 * read into float32 first, exact, and the gradients rounded once as they are written: the
 * same arithmetic as on float32 rows, without widened copies of the inputs and of the
 * gradients); the rest float32. work: la_gdr_backward_work(K, V) floats. Returns 0, or -1
 * on sizes or a dtype it does not take (K, V >= 1). */
static int la_gdr_backward(const void *q_, long qs, long qt, const void *k_, long ks, long kt,
                           const float *beta, long bs, const float *g, long gs, long N, long T,
                           long K, long V, float scale, int l2norm, const float *ckpt, long cs,
                           const float *w, long ws, long wt, const void *dout_, long dos,
                           long dot_, const float *dS, float *dS0, void *dq_, long dqs,
                           long dqt, void *dk_, long dks, long dkt, void *dv_, long dvs,
                           long dvt, float *dbeta, long dbs, float *dg, long dgs, int dt,
                           float *work) {
    /* 16-bit rows: V a multiple of W, as the forward asks of every dtype */
    if (K < 1 || V < 1 || N < 0 || T < 0 || dt < LA_F32 || dt > LA_F16 || (dt != LA_F32 && V % W))
        return -1;
    long Kp = GDB_KP(K), TC = GDR_TC;
    int gated = g != NULL, wide = dt != LA_F32;
    float *DT = work, *SB = DT + V * Kp + 32, *qn = SB + TC * GDB_TS(Kp), *kn = qn + TC * Kp;
    float *dqb = kn + TC * Kp, *dkb = dqb + TC * Kp, *a = dkb + TC * Kp, *b = a + TC;
    float *rq = b + TC, *rk = rq + TC, *gsum = rk + TC, *dbacc = gsum + TC, *ud = dbacc + TC;
    float *ru = ud + TC, *rc = ru + GDB_R, *rcp = rc + GDB_R, *rdo = rcp + GDB_R;
    float *rdo1 = rdo + GDB_R, *du = rdo1 + GDB_R, *P = du + GDB_R;
    /* 16-bit rows: a chunk's q, k, dout widened, its dv before it is rounded */
    float *qw = P + GDB_R * W + GDB_PAD, *kw = qw + TC * K + GDB_PAD, *ow = kw + TC * K + GDB_PAD;
    float *dvw = ow + TC * V + GDB_PAD;
    memset(P, 0, (size_t)(GDB_R * W) * sizeof(float)); /* rows past a short block: zeros */
    for (long n = 0; n < N; ++n) {
        for (long j = 0; j < V; ++j)
            for (long i = 0; i < Kp; ++i)
                DT[j * Kp + i] = i < K && dS ? dS[n * K * V + i * V + j] : 0.0f;
        for (long t0 = (T - 1) / TC * TC; T > 0 && t0 >= 0; t0 -= TC) {
            long Tc = T - t0 < TC ? T - t0 : TC;
            const float *wc = w + n * ws + t0 * wt;
            /* the chunk's float32 rows: in place, or widened (then rows of K, V) */
            const float *qc, *kc, *oc;
            long qct = qt, kct = kt, oct = dot_, dvct = dvt;
            float *dvc;
            if (wide) {
                la_widened_rows(qw, q_, n * qs + t0 * qt, qt, Tc, K, dt);
                la_widened_rows(kw, k_, n * ks + t0 * kt, kt, Tc, K, dt);
                la_widened_rows(ow, dout_, n * dos + t0 * dot_, dot_, Tc, V, dt);
                qc = qw, kc = kw, oc = ow, dvc = dvw, qct = kct = K, oct = dvct = V;
            } else {
                qc = (const float *)q_ + n * qs + t0 * qt, kc = (const float *)k_ + n * ks + t0 * kt;
                oc = (const float *)dout_ + n * dos + t0 * dot_;
                dvc = (float *)dv_ + n * dvs + t0 * dvt;
            }
            gdb_prep(Tc, K, Kp, qc, qct, kc, kct, beta + n * bs + t0, g ? g + n * gs + t0 : NULL,
                     scale, l2norm, qn, kn, a, b, rq, rk);
            memset(dqb, 0, (size_t)(2 * TC * Kp) * sizeof(float)); /* dqb, dkb */
            for (long m = 0; m < Tc; ++m) gsum[m] = dbacc[m] = ud[m] = 0.0f;
            for (long j0 = 0; j0 < V; j0 += GDB_R) {
                long Rb = V - j0 < GDB_R ? V - j0 : GDB_R;
                gdb_recompute(gated, Tc, K, Kp, V, Rb, j0, ckpt + n * cs + t0 / TC * K * V, wc,
                              wt, a, b, kn, SB);
                /* the chunk's last token: D += q~ dout_j and du = D^T k~ on their own; each
                 * later pass does them for the token before it */
                {
                    long m = Tc - 1;
                    const float *qm = qn + m * Kp, *km = kn + m * Kp, *om = oc + m * oct + j0;
                    for (long r = 0; r < Rb; ++r) {
                        float *Dr = DT + (j0 + r) * Kp;
                        vf oj = vsplat(om[r]), acc = vsplat(0.0f);
                        for (long x = 0; x < Kp; x += W) {
                            vf d = vload(Dr + x) + oj * vload(qm + x);
                            vstore(Dr + x, d);
                            acc += d * vload(km + x);
                        }
                        vstore(P + r * W, acc);
                    }
                    gdb_sums(P, du);
                    gdb_rows(Rb, a[m], b[m], du, wc + m * wt + j0, om, dvc + m * dvct + j0,
                             dbacc + m, ud + m, ru, rc, rcp, rdo);
                }
                for (long m = Tc - 1; m >= 0; --m) {
                    int next = m > 0;
                    const float *km = kn + m * Kp, *Sm = SB + m * GDB_TS(Kp);
                    const float *km1 = kn + (m - next) * Kp, *qm1 = qn + (m - next) * Kp;
                    const float *om1 = oc + (m - next) * oct + j0;
                    for (long r = 0; r < Rb; ++r) rdo1[r] = om1[r];
                    for (long x = 0; x < Kp; x += GDB_KB * W) {
                        int nb = (Kp - x) / W < GDB_KB ? (int)((Kp - x) / W) : GDB_KB;
                        gdb_piece_any(nb, gated, next, Rb, Kp, a[m], km + x, km1 + x, qm1 + x,
                                      x == 0, P, DT + j0 * Kp + x, Sm + x, ru, rc, rcp, rdo,
                                      rdo1, dkb + m * Kp + x, dqb + m * Kp + x, gsum + m);
                    }
                    if (next) {
                        gdb_sums(P, du);
                        gdb_rows(Rb, a[m - 1], b[m - 1], du, wc + (m - 1) * wt + j0, om1,
                                 dvc + (m - 1) * dvct + j0, dbacc + m - 1, ud + m - 1, ru, rc,
                                 rcp, rdo);
                    }
                }
            }
            for (long m = 0; m < Tc; ++m) { /* the per-token gradients of the chunk */
                long t = t0 + m;
                float *dqh = dqb + m * Kp, *dkh = dkb + m * Kp;
                if (!wide) {
                    gdb_token_grads(K, scale, l2norm, a[m], ud[m], rq[m], rk[m], qc + m * qct,
                                    kn + m * Kp, dqh, dkh, (float *)dq_ + n * dqs + t * dqt,
                                    (float *)dk_ + n * dks + t * dkt);
                    continue;
                }
                /* in place in the float32 rows, then rounded once */
                gdb_token_grads(K, scale, l2norm, a[m], ud[m], rq[m], rk[m], qc + m * qct,
                                kn + m * Kp, dqh, dkh, dqh, dkh);
                la_narrowed((u16 *)dq_ + n * dqs + t * dqt, dqh, 0, K, dt);
                la_narrowed((u16 *)dk_ + n * dks + t * dkt, dkh, 0, K, dt);
            }
            if (wide) la_narrowed_rows(dv_, n * dvs + t0 * dvt, dvt, dvw, Tc, V, 0, V, dt);
            for (long m = 0; m < Tc; ++m) {
                dbeta[n * dbs + t0 + m] = dbacc[m];
                if (dg) dg[n * dgs + t0 + m] = a[m] * gsum[m];
            }
        }
        for (long i = 0; i < K; ++i)
            for (long j = 0; j < V; ++j) dS0[n * K * V + i * V + j] = DT[j * Kp + i];
    }
    return 0;
}
