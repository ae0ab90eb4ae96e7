/* Stand-alone check of la_conv_forward and la_conv_step (the short causal convolution in
 * src/linattn/ops/conv/kernels.c) and of the float16 / bfloat16 conversions of common.h, against
 * naive double-precision references, without Python or torch, in every vector form the kernels
 * build in (-DLA_W=1/4/8/16 or what the -m flags pick) and on other ISAs (aarch64 under qemu):
 *
 *   cc -O3 -march=native -o /tmp/conv_harness tests/c/conv_harness.c -lm && /tmp/conv_harness
 *
 * Checked: widths 1-5 and 7 (the register-blocked 2-4, the generic wider loop, the history of
 * a sequence's first tokens), T = 0, 1, 2, 3, 8, 9 (one token chunk and one more), 17, 40,
 * channels 1, 5, 37 and 64 (tails of every vector width), with and without bias, SiLU,
 * initial and final states, float32 / bfloat16 / float16 inputs and outputs with float32 or
 * same-dtype weights, token, batch, weight and state strides larger than the rows, packed
 * segments (empty ones and one without a state), a call split into two channel ranges at a whole
 * vector (bit for bit the whole call), and sizes that must be refused; the step in its dense layout and strided,
 * in place and apart, with states of W - 1, W and W + 2 columns. Output buffers carry guard
 * values in the gaps between rows and past their ends, which must come back untouched. The
 * half conversions: every float16 bit pattern widened and narrowed back, the vector forms
 * against the scalar ones, and (where the compiler has _Float16) against the compiler's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/linattn/ops/conv/kernels.c"

/* Through volatile pointers: what runs is the code a shared library exports, not a clone
 * specialised for this file's constants. */
static __typeof__(la_conv_forward) *volatile conv_forward = la_conv_forward;
static __typeof__(la_conv_step) *volatile conv_step = la_conv_step;

#define HARNESS_SEED 0x9E3779B97F4A7C15ull
#include "harness_common.h"

/* ------------------------------------------------------------------------ the forward */
static void run_forward(long B, long T, long D, long width, int act, int has_bias, int has_s0,
                        int xdt, int wdt, int transposed_w) {
    char cfg[200];
    snprintf(cfg, sizeof cfg, "forward B=%ld T=%ld D=%ld W=%ld act=%d bias=%d s0=%d xdt=%d wdt=%d "
             "wT=%d LA_W=%d", B, T, D, width, act, has_bias, has_s0, xdt, wdt, transposed_w, W);
    long h = width - 1;
    long xt = D + 3, xb = T * xt + 5, yt = D + 1, yb = T * yt + 2;
    long wd = transposed_w ? 1 : width + 1, wj = transposed_w ? D + 2 : 1;
    long nw = transposed_w ? width * (D + 2) : D * (width + 1);
    long s0c = h + 2, s0n = D * s0c + 1, s0k = 1, sfc = 1, sfk = D + 1, sfn = h * sfk + 3;
    void *x = guarded(B * xb, xdt), *y = guarded(B * yb, xdt), *y2 = guarded(B * yb, xdt);
    void *w = guarded(nw, wdt), *bias = guarded(D, wdt), *s0 = guarded(B * s0n, xdt);
    void *sf = guarded(B * sfn, xdt), *sf2 = guarded(B * sfn, xdt);
    double *xr = malloc(sizeof(double) * (size_t)(B * T * D + 1));
    double *wr = malloc(sizeof(double) * (size_t)(D * width + 1));
    double *br = malloc(sizeof(double) * (size_t)(D + 1));
    double *sr = malloc(sizeof(double) * (size_t)(B * D * h + 1));
    for (long b = 0; b < B; ++b)
        for (long t = 0; t < T; ++t)
            for (long c = 0; c < D; ++c)
                xr[(b * T + t) * D + c] = put(x, b * xb + t * xt + c, uni(-2, 2), xdt);
    for (long c = 0; c < D; ++c) {
        for (long j = 0; j < width; ++j)
            wr[c * width + j] = put(w, c * wd + j * wj, uni(-0.8, 0.8), wdt);
        br[c] = has_bias ? put(bias, c, uni(-1, 1), wdt) : 0.0;
    }
    for (long b = 0; b < B; ++b)
        for (long c = 0; c < D; ++c)
            for (long k = 0; k < h; ++k)
                sr[(b * D + c) * h + k] = has_s0 ? put(s0, b * s0n + c * s0c + k * s0k, uni(-2, 2), xdt) : 0.0;
    float *work = malloc(sizeof(float) * (size_t)la_conv_work(width));
    int rc = conv_forward(x, xb, xt, xdt, y, yb, yt, xdt, B, T, D, width, 0, D, w, wd, wj, wdt,
                          has_bias ? bias : NULL, 1, wdt, act, NULL, 0, has_s0 ? s0 : NULL, s0n,
                          s0c, s0k, xdt, sf, sfn, sfc, sfk, xdt, work);
    expect(rc == 0, "rc", cfg);
    /* the reference, and the worst error relative to the largest output */
    double err = 0, scale = 1e-3;
    int state_ok = 1;
    for (long b = 0; b < B; ++b) {
        for (long t = 0; t < T; ++t)
            for (long c = 0; c < D; ++c) {
                double acc = br[c];
                for (long j = 0; j < width; ++j) {
                    long p = t - h + j;
                    double v = p >= 0 ? xr[(b * T + p) * D + c] : sr[(b * D + c) * h + (p + h)];
                    acc += wr[c * width + j] * v;
                }
                if (act) acc = acc / (1.0 + exp(-acc));
                double got = load_dt(y, b * yb + t * yt + c, xdt), d = fabs(got - acc);
                if (fabs(acc) > scale) scale = fabs(acc);
                if (!(d <= err)) err = d;
            }
        for (long c = 0; c < D; ++c)
            for (long k = 0; k < h; ++k) {
                long p = T - h + k;
                double v = p >= 0 ? xr[(b * T + p) * D + c] : sr[(b * D + c) * h + (p + h)];
                if (load_dt(sf, b * sfn + c * sfc + k * sfk, xdt) != v) state_ok = 0;
            }
    }
    expect(err / scale <= tol_of(xdt), "outputs", cfg);
    if (!(err / scale <= tol_of(xdt))) printf("    error %.3g of %.3g\n", err, scale);
    expect(state_ok, "final states (exact copies of the inputs)", cfg);
    long bad = 0;
    for (long i = 0; i < B * yb + GUARD; ++i) {
        long b = i / yb, t = (i % yb) / yt, c = (i % yb) % yt;
        if (!(b < B && t < T && c < D) && !is_guard(y, i, xdt)) ++bad;
    }
    for (long i = 0; i < B * sfn + GUARD; ++i) {
        long b = i / sfn, k = (i % sfn) / sfk, c = (i % sfn) % sfk;
        if (!(b < B && k < h && c < D) && !is_guard(sf, i, xdt)) ++bad;
    }
    expect(bad == 0, "guards untouched", cfg);
    /* two channel ranges split at whole vectors (as threads split a call): the same bits */
    long mid = D / 2 / W * W;
    rc = conv_forward(x, xb, xt, xdt, y2, yb, yt, xdt, B, T, D, width, 0, mid, w, wd, wj, wdt,
                      has_bias ? bias : NULL, 1, wdt, act, NULL, 0, has_s0 ? s0 : NULL, s0n, s0c,
                      s0k, xdt, sf2, sfn, sfc, sfk, xdt, work);
    rc |= conv_forward(x, xb, xt, xdt, y2, yb, yt, xdt, B, T, D, width, mid, D, w, wd, wj, wdt,
                       has_bias ? bias : NULL, 1, wdt, act, NULL, 0, has_s0 ? s0 : NULL, s0n,
                       s0c, s0k, xdt, sf2, sfn, sfc, sfk, xdt, work);
    expect(rc == 0 && !memcmp(y, y2, (size_t)(B * yb + GUARD) * ES[xdt])
           && !memcmp(sf, sf2, (size_t)(B * sfn + GUARD) * ES[xdt]),
           "two channel ranges equal one call", cfg);
    free(x), free(y), free(y2), free(w), free(bias), free(s0), free(sf), free(sf2), free(work);
    free(xr), free(wr), free(br), free(sr);
}

/* Packed segments of one row: (0, 0, 3, 1), (0, 3, 3, 0) (empty), (0, 3, 4, -1) (no state),
 * (0, 4, 20, 2): each from its own state (zeros for n < 0); the final state of the empty one
 * is its initial state. */
static void run_segments(long D, long width, int xdt) {
    char cfg[120];
    snprintf(cfg, sizeof cfg, "segments D=%ld W=%ld xdt=%d LA_W=%d", D, width, xdt, W);
    const long T = 20, h = width - 1, N = 3;
    const long seg[16] = {0, 0, 3, 1, 0, 3, 3, 0, 0, 3, 4, -1, 0, 4, 20, 2};
    void *x = guarded(T * D, xdt), *y = guarded(T * D, xdt), *w = guarded(D * width, LA_F32);
    void *s0 = guarded(N * D * h, xdt), *sf = guarded(N * D * h, xdt);
    for (long i = 0; i < T * D; ++i) put(x, i, uni(-2, 2), xdt);
    for (long i = 0; i < D * width; ++i) put(w, i, uni(-1, 1), LA_F32);
    for (long i = 0; i < N * D * h; ++i) put(s0, i, uni(-2, 2), xdt);
    float *work = malloc(sizeof(float) * (size_t)la_conv_work(width));
    int rc = conv_forward(x, T * D, D, xdt, y, T * D, D, xdt, 1, T, D, width, 0, D, w, width, 1,
                          LA_F32, NULL, 0, 0, 1, seg, 4, s0, D * h, h, 1, xdt, sf, D * h, h, 1,
                          xdt, work);
    expect(rc == 0, "rc", cfg);
    double err = 0, scale = 1e-3;
    int state_ok = 1;
    for (int s = 0; s < 4; ++s) {
        long t0 = seg[4 * s + 1], t1 = seg[4 * s + 2], n = seg[4 * s + 3];
        for (long t = t0; t < t1; ++t)
            for (long c = 0; c < D; ++c) {
                double acc = 0;
                for (long j = 0; j < width; ++j) {
                    long p = t - h + j;
                    double v = p >= t0 ? load_dt(x, p * D + c, xdt)
                                       : n >= 0 ? load_dt(s0, (n * D + c) * h + (p - t0 + h), xdt) : 0.0;
                    acc += load_dt(w, c * width + j, LA_F32) * v;
                }
                acc = acc / (1.0 + exp(-acc));
                double d = fabs(load_dt(y, t * D + c, xdt) - acc);
                if (fabs(acc) > scale) scale = fabs(acc);
                if (!(d <= err)) err = d;
            }
        if (n < 0) continue;
        for (long c = 0; c < D; ++c)
            for (long k = 0; k < h; ++k) {
                long p = t1 - h + k;
                double v = p >= t0 ? load_dt(x, p * D + c, xdt)
                                   : load_dt(s0, (n * D + c) * h + (p - t0 + h), xdt);
                if (load_dt(sf, (n * D + c) * h + k, xdt) != v) state_ok = 0;
            }
    }
    expect(err / scale <= tol_of(xdt), "outputs", cfg);
    expect(state_ok, "final states", cfg);
    /* a segment out of range is refused before anything is written */
    const long bad[4] = {0, 5, 21, 0};
    fill_guards(y, T * D + GUARD, xdt);
    rc = conv_forward(x, T * D, D, xdt, y, T * D, D, xdt, 1, T, D, width, 0, D, w, width, 1,
                      LA_F32, NULL, 0, 0, 1, bad, 1, NULL, 0, 0, 0, xdt, NULL, 0, 0, 0, xdt, work);
    expect(rc == -1 && is_guard(y, 0, xdt) && is_guard(y, 5 * D, xdt), "bad segment refused", cfg);
    free(x), free(y), free(w), free(s0), free(sf), free(work);
}

/* ------------------------------------------------------------------------ the step */
static void run_step(long B, long D, long width, long slen, int dt, int dense, int inplace) {
    char cfg[160];
    snprintf(cfg, sizeof cfg, "step B=%ld D=%ld W=%ld S=%ld dt=%d dense=%d inplace=%d LA_W=%d", B,
             D, width, slen, dt, dense, inplace, W);
    long sic = dense ? slen : slen + 3, sik = 1, sib = D * sic + (dense ? 0 : 2);
    long wd = dense ? width : 1, wj = dense ? 1 : D + 1;
    long nw = dense ? D * width : width * (D + 1);
    void *x = guarded(B * D, dt), *y = guarded(B * D, dt), *w = guarded(nw, dt);
    void *bias = guarded(D, dt), *si = guarded(B * sib, dt), *so = guarded(B * sib, dt);
    double *old = malloc(sizeof(double) * (size_t)(B * D * (slen + 1) + 1));
    for (long i = 0; i < B * D; ++i) put(x, i, uni(-2, 2), dt);
    for (long c = 0; c < D; ++c) {
        for (long j = 0; j < width; ++j) put(w, c * wd + j * wj, uni(-1, 1), dt);
        put(bias, c, uni(-1, 1), dt);
    }
    for (long b = 0; b < B; ++b)
        for (long c = 0; c < D; ++c)
            for (long k = 0; k < slen; ++k)
                old[(b * D + c) * (slen + 1) + k] = put(si, b * sib + c * sic + k * sik, uni(-2, 2), dt);
    void *out = inplace ? si : so;
    int rc = conv_step(x, D, dt, y, D, dt, B, D, width, slen, w, wd, wj, dt, bias, 1, dt, 1, si,
                       sib, sic, sik, out, sib, sic, sik, dt);
    expect(rc == 0, "rc", cfg);
    double err = 0, scale = 1e-3;
    int state_ok = 1;
    long h = width - 1;
    for (long b = 0; b < B; ++b)
        for (long c = 0; c < D; ++c) {
            const double *o = old + (b * D + c) * (slen + 1);
            double xc = load_dt(x, b * D + c, dt), acc = load_dt(bias, c, dt);
            for (long j = 0; j < h; ++j) acc += load_dt(w, c * wd + j * wj, dt) * o[slen - h + j];
            acc += load_dt(w, c * wd + h * wj, dt) * xc;
            acc = acc / (1.0 + exp(-acc));
            double d = fabs(load_dt(y, b * D + c, dt) - acc);
            if (fabs(acc) > scale) scale = fabs(acc);
            if (!(d <= err)) err = d;
            for (long k = 0; k < slen; ++k) {
                double want = k + 1 < slen ? o[k + 1] : xc;
                if (load_dt(out, b * sib + c * sic + k * sik, dt) != want) state_ok = 0;
            }
        }
    expect(err / scale <= tol_of(dt), "outputs", cfg);
    expect(state_ok, "state shifted, x appended", cfg);
    long bad = 0;
    for (long i = 0; sic > 0 && i < B * sib + GUARD; ++i) {
        long b = i / sib, c = (i % sib) / sic, k = (i % sib) % sic;
        if (!(b < B && c < D && k < slen) && !is_guard(out, i, dt)) ++bad;
    }
    for (long i = B * D; i < B * D + GUARD; ++i)
        if (!is_guard(y, i, dt)) ++bad;
    expect(bad == 0, "guards untouched", cfg);
    expect(conv_step(x, D, dt, y, D, dt, B, D, width, width - 2, w, wd, wj, dt, bias, 1, dt, 1,
                     si, sib, sic, sik, out, sib, sic, sik, dt) == -1,
           "a state shorter than W - 1 refused", cfg);
    free(x), free(y), free(w), free(bias), free(si), free(so), free(old);
}

/* ------------------------------------------------------------------------ conversions */
static void run_conversions(void) {
    int bad = 0;
    for (unsigned h = 0; h < 65536; ++h) { /* every half: widened, then narrowed back */
        float f = h2f((u16)h);
        int nan = (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu);
        if (nan ? (f == f) || (f2h(f) & 0x7C00u) != 0x7C00u || !(f2h(f) & 0x3FFu)
                : f2h(f) != h)
            ++bad;
    }
    expect(bad == 0, "every float16 round-trips", "conversions");
    /* the vector forms against the scalar ones, on random and boundary floats */
    const float edge[] = {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1e9f, INFINITY, -INFINITY,
                          NAN, 6.1035156e-5f, 6.1e-5f, 5.96e-8f, 2.98e-8f, 2.99e-8f, 1e-9f,
                          -3.3e-6f, 1.00048828125f, 1.000732421875f};
    float in[W], back[W];
    u16 hs[W];
    bad = 0;
    for (int r = 0; r < 20000; ++r) {
        for (int l = 0; l < W; ++l) {
            int e = (r * W + l) % 40;
            in[l] = e < (int)(sizeof edge / sizeof *edge) ? edge[e]
                                                          : uni(-1, 1) * powf(2.0f, uni(-30, 17));
        }
        vstore_dt(hs, 0, vload(in), LA_F16);
        vstore(back, vload_dt(hs, 0, LA_F16));
        for (int l = 0; l < W; ++l) {
            if (hs[l] != f2h(in[l])) ++bad;
            float s = h2f(hs[l]);
            if (memcmp(&s, &back[l], 4) != 0) ++bad;
#ifdef __FLT16_MAX__
            _Float16 c = (_Float16)in[l];
            u16 cb;
            memcpy(&cb, &c, 2);
            if (in[l] == in[l] && cb != hs[l]) ++bad; /* the compiler's rounding */
            if (in[l] == in[l] && (float)c != s) ++bad;
#endif
        }
        vstore_dt(hs, 0, vload(in), LA_BF16);
        for (int l = 0; l < W; ++l)
            if (hs[l] != f2bf(in[l])) ++bad;
    }
    expect(bad == 0, "vector float16/bfloat16 conversions equal the scalar ones", "conversions");
}

int main(void) {
    run_conversions();
    const long Ts[] = {0, 1, 2, 3, 8, 9, 17, 40}, Ds[] = {1, 5, 37, 64}, Ws[] = {1, 2, 3, 4, 5, 7};
    for (unsigned a = 0; a < sizeof Ts / sizeof *Ts; ++a)
        for (unsigned d = 0; d < sizeof Ds / sizeof *Ds; ++d)
            for (unsigned k = 0; k < sizeof Ws / sizeof *Ws; ++k) {
                int v = (int)(a + d + k);
                run_forward(2, Ts[a], Ds[d], Ws[k], v % 2, v % 3 != 0, (v / 2) % 2, LA_F32,
                            LA_F32, v % 5 == 0);
            }
    for (int xdt = 0; xdt < 3; ++xdt)
        for (int wdt = 0; wdt < 3; wdt += 1 + (xdt == 0))
            for (unsigned k = 0; k < sizeof Ws / sizeof *Ws; ++k) {
                run_forward(3, 19, 37, Ws[k], 1, 1, 1, xdt, wdt, (int)k % 2);
                run_forward(1, 9, 64, Ws[k], 0, 0, 0, xdt, xdt, 0);
            }
    for (int xdt = 0; xdt < 3; ++xdt)
        for (unsigned k = 0; k < sizeof Ws / sizeof *Ws; ++k) run_segments(37, Ws[k], xdt);
    const long WS[][2] = {{4, 4}, {4, 3}, {4, 6}, {3, 2}, {3, 3}, {2, 1}, {5, 5}, {1, 0}, {1, 2}};
    for (int dt = 0; dt < 3; ++dt)
        for (unsigned k = 0; k < sizeof WS / sizeof *WS; ++k)
            for (int mode = 0; mode < 4; ++mode)
                run_step(mode == 3 ? 3 : 1, mode == 2 ? 5 : 45, WS[k][0], WS[k][1], dt, mode % 2,
                         mode >= 2);
    /* sizes it must refuse */
    float dummy[64] = {0};
    int refused = conv_forward(dummy, 0, 0, 0, dummy, 0, 0, 0, 1, 1, 4, 0, 0, 4, dummy, 1, 1, 0,
                               NULL, 0, 0, 0, NULL, 0, NULL, 0, 0, 0, 0, NULL, 0, 0, 0, 0, dummy) == -1;
    refused &= conv_forward(dummy, 0, 0, 0, dummy, 0, 0, 0, 1, 1, 4, 2, 0, 5, dummy, 1, 1, 0,
                            NULL, 0, 0, 0, NULL, 0, NULL, 0, 0, 0, 0, NULL, 0, 0, 0, 0, dummy) == -1;
    refused &= conv_forward(dummy, 0, 0, 3, dummy, 0, 0, 0, 1, 1, 4, 2, 0, 4, dummy, 1, 1, 0,
                            NULL, 0, 0, 0, NULL, 0, NULL, 0, 0, 0, 0, NULL, 0, 0, 0, 0, dummy) == -1;
    expect(refused, "bad sizes refused", "refusals");
    if (failures) {
        printf("FAIL: %d of %d checks (W=%d)\n", failures, checks, W);
        return 1;
    }
    printf("PASS: %d checks, la_conv_forward and la_conv_step, W=%d\n", checks, W);
    return 0;
}
