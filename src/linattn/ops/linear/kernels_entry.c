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
