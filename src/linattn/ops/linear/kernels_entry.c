/* The Python entry points of the linear-attention kernels, a part of ops/linear/kernels.c:
 * included at its end, and not compiled on its own. */
/* ------------------------------------------------------------------ the Python entry points
 * One argument struct per kernel (ops/native/common.h); linattn/ops/linear/native.py mirrors
 * each in ctypes and the layouts are checked against la_linear_abi when the library loads. */
#define LA_PHI_ARGS(X, la_s) \
    X(la_s, int, kind, 'i') X(la_s, const void *, x, 'p') X(la_s, int, xbf, 'i') X(la_s, long, N, 'l') \
    X(la_s, long, T, 'l') X(la_s, long, D, 'l') X(la_s, long, xs, 'l') X(la_s, void *, out, 'p') \
    X(la_s, int, obf, 'i') X(la_s, long, R, 'l') X(la_s, float *, z, 'p') \
    X(la_s, const unsigned char *, keep, 'p') X(la_s, long, ks, 'l')
LA_ENTRY_VOID(la_phi, LA_PHI_ARGS)

#define LA_NORMALISE_ARGS(X, la_s) \
    X(la_s, const void *, num, 'p') X(la_s, int, nbf, 'i') X(la_s, const void *, fq, 'p') \
    X(la_s, int, fbf, 'i') X(la_s, const float *, z, 'p') X(la_s, long, zrows, 'l') \
    X(la_s, const float *, sx, 'p') X(la_s, long, N, 'l') X(la_s, long, T, 'l') X(la_s, long, R, 'l') \
    X(la_s, long, L, 'l') X(la_s, long, Dv, 'l') X(la_s, float, eps, 'f') X(la_s, void *, out, 'p') \
    X(la_s, int, obf, 'i') X(la_s, long, os, 'l')
LA_ENTRY_VOID(la_normalise, LA_NORMALISE_ARGS)

#define LA_NORM_GRAD_ARGS(X, la_s) \
    X(la_s, const float *, o, 'p') X(la_s, long, os, 'l') X(la_s, const float *, fq, 'p') \
    X(la_s, const float *, z, 'p') X(la_s, long, zrows, 'l') X(la_s, const float *, sx, 'p') \
    X(la_s, const float *, g, 'p') X(la_s, long, gs, 'l') X(la_s, long, N, 'l') X(la_s, long, T, 'l') \
    X(la_s, long, R, 'l') X(la_s, long, L, 'l') X(la_s, long, Dv, 'l') X(la_s, float, eps, 'f') \
    X(la_s, float *, dnum, 'p') X(la_s, float *, ds, 'p')
LA_ENTRY_VOID(la_norm_grad, LA_NORM_GRAD_ARGS)

#define LA_GRAD_PHI_ARGS(X, la_s) \
    X(la_s, int, kind, 'i') X(la_s, const float *, dphi, 'p') X(la_s, const float *, x, 'p') \
    X(la_s, long, xs, 'l') X(la_s, const float *, f, 'p') X(la_s, const float *, coef, 'p') \
    X(la_s, const float *, vec, 'p') X(la_s, long, vrows, 'l') X(la_s, long, N, 'l') \
    X(la_s, long, T, 'l') X(la_s, long, R, 'l') X(la_s, long, L, 'l') \
    X(la_s, const unsigned char *, keep, 'p') X(la_s, long, ks, 'l') X(la_s, float *, dx, 'p') \
    X(la_s, long, dxs, 'l')
LA_ENTRY_VOID(la_grad_phi, LA_GRAD_PHI_ARGS)

#define LA_MASK_ROWSUM_ARGS(X, la_s) \
    X(la_s, void *, A, 'p') X(la_s, int, abf, 'i') X(la_s, long, B, 'l') X(la_s, long, C, 'l') \
    X(la_s, float *, rs, 'p')
LA_ENTRY_VOID(la_mask_rowsum, LA_MASK_ROWSUM_ARGS)

#define LA_MASK_ADD_ARGS(X, la_s) \
    X(la_s, float *, A, 'p') X(la_s, long, B, 'l') X(la_s, long, C, 'l') X(la_s, const float *, ds, 'p')
LA_ENTRY_VOID(la_mask_add, LA_MASK_ADD_ARGS)

#define LA_PREFIX_ARGS(X, la_s) \
    X(la_s, float *, P, 'p') X(la_s, long, N, 'l') X(la_s, long, n, 'l') X(la_s, long, F, 'l') \
    X(la_s, const float *, S0, 'p') X(la_s, float *, S1, 'p') X(la_s, int, reverse, 'i')
LA_ENTRY_VOID(la_prefix, LA_PREFIX_ARGS)

#define LA_CAUSAL_FORWARD_ARGS(X, la_s) \
    X(la_s, int, kind, 'i') X(la_s, int, bf, 'i') X(la_s, const void *, q, 'p') X(la_s, long, qs, 'l') \
    X(la_s, const void *, k, 'p') X(la_s, long, ks, 'l') X(la_s, const void *, v, 'p') \
    X(la_s, long, vs, 'l') X(la_s, long, N, 'l') X(la_s, long, T, 'l') X(la_s, long, L, 'l') \
    X(la_s, long, Dv, 'l') X(la_s, long, C, 'l') X(la_s, float, eps, 'f') X(la_s, float *, S, 'p') \
    X(la_s, float *, z, 'p') X(la_s, void *, out, 'p') X(la_s, long, os, 'l') \
    X(la_s, float *, Ss, 'p') X(la_s, long, sb, 'l') X(la_s, float *, zss, 'p') X(la_s, long, zb, 'l') \
    X(la_s, long, block, 'l') X(la_s, float *, work, 'p')
LA_ENTRY(la_causal_forward, LA_CAUSAL_FORWARD_ARGS)

#define LA_CAUSAL_BACKWARD_BLOCKS_ARGS(X, la_s) \
    X(la_s, int, kind, 'i') X(la_s, int, bf, 'i') X(la_s, const void *, q, 'p') \
    X(la_s, long, qs, 'l') X(la_s, const void *, k, 'p') X(la_s, long, ks, 'l') \
    X(la_s, const void *, v, 'p') X(la_s, long, vs, 'l') X(la_s, const void *, o, 'p') \
    X(la_s, long, os, 'l') X(la_s, const void *, g, 'p') X(la_s, long, gs, 'l') X(la_s, long, N, 'l') \
    X(la_s, long, T, 'l') X(la_s, long, L, 'l') X(la_s, long, Dv, 'l') X(la_s, long, C, 'l') \
    X(la_s, float, eps, 'f') X(la_s, const float *, S_in, 'p') X(la_s, long, sb, 'l') \
    X(la_s, const float *, z_in, 'p') X(la_s, long, zb, 'l') X(la_s, long, block, 'l') \
    X(la_s, float *, G, 'p') X(la_s, float *, Gz, 'p') X(la_s, void *, dq, 'p') X(la_s, long, dqs, 'l') \
    X(la_s, void *, dk, 'p') X(la_s, long, dks, 'l') X(la_s, void *, dv, 'p') X(la_s, long, dvs, 'l') \
    X(la_s, float *, work, 'p')
LA_ENTRY(la_causal_backward_blocks, LA_CAUSAL_BACKWARD_BLOCKS_ARGS)

#define LA_NONCAUSAL_FORWARD_ARGS(X, la_s) \
    X(la_s, int, kind, 'i') X(la_s, int, bf, 'i') X(la_s, const void *, q, 'p') X(la_s, long, qs, 'l') \
    X(la_s, const void *, k, 'p') X(la_s, long, ks, 'l') X(la_s, const void *, v, 'p') \
    X(la_s, long, vs, 'l') X(la_s, long, N, 'l') X(la_s, long, Tq, 'l') X(la_s, long, Tk, 'l') \
    X(la_s, long, L, 'l') X(la_s, long, Dv, 'l') X(la_s, long, C, 'l') X(la_s, float, eps, 'f') \
    X(la_s, float *, S, 'p') X(la_s, float *, z, 'p') X(la_s, void *, out, 'p') X(la_s, long, os, 'l') \
    X(la_s, float *, work, 'p')
LA_ENTRY(la_noncausal_forward, LA_NONCAUSAL_FORWARD_ARGS)

#define LA_NONCAUSAL_BACKWARD_ARGS(X, la_s) \
    X(la_s, int, kind, 'i') X(la_s, int, parts, 'i') X(la_s, int, bf, 'i') \
    X(la_s, const void *, q, 'p') X(la_s, long, qs, 'l') X(la_s, const void *, k, 'p') \
    X(la_s, long, ks, 'l') X(la_s, const void *, v, 'p') X(la_s, long, vs, 'l') \
    X(la_s, const void *, g, 'p') \
    X(la_s, long, gs, 'l') X(la_s, long, N, 'l') X(la_s, long, Tq, 'l') X(la_s, long, Tk, 'l') \
    X(la_s, long, L, 'l') X(la_s, long, Dv, 'l') X(la_s, long, C, 'l') X(la_s, float, eps, 'f') \
    X(la_s, const float *, S, 'p') X(la_s, const float *, z, 'p') X(la_s, float *, G, 'p') \
    X(la_s, float *, Gz, 'p') X(la_s, void *, dq, 'p') X(la_s, long, dqs, 'l') \
    X(la_s, void *, dk, 'p') X(la_s, long, dks, 'l') X(la_s, void *, dv, 'p') X(la_s, long, dvs, 'l') \
    X(la_s, float *, work, 'p')
LA_ENTRY(la_noncausal_backward, LA_NONCAUSAL_BACKWARD_ARGS)

static const la_struct la_linear_structs[] = {
    LA_STRUCT_ENTRY(la_phi_args),
    LA_STRUCT_ENTRY(la_normalise_args),
    LA_STRUCT_ENTRY(la_norm_grad_args),
    LA_STRUCT_ENTRY(la_grad_phi_args),
    LA_STRUCT_ENTRY(la_mask_rowsum_args),
    LA_STRUCT_ENTRY(la_mask_add_args),
    LA_STRUCT_ENTRY(la_prefix_args),
    LA_STRUCT_ENTRY(la_causal_forward_args),
    LA_STRUCT_ENTRY(la_causal_backward_blocks_args),
    LA_STRUCT_ENTRY(la_noncausal_forward_args),
    LA_STRUCT_ENTRY(la_noncausal_backward_args),
};
LA_ABI_TABLE(la_linear_abi, la_linear_structs)
