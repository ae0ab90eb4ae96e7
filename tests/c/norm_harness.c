/* Stand-alone check of la_norm_forward (the gated RMSNorm in src/linattn/ops/norm/kernels.c)
 * against a naive double-precision reference, without Python or torch, in every vector form
 * the kernels build in and on other ISAs (aarch64 under qemu):
 *
 *   cc -O3 -march=native -o /tmp/norm_harness tests/c/norm_harness.c -lm && /tmp/norm_harness
 *
 * Checked: rows of 1, 3, 16, 37, 128 and 300 channels, groups dividing them (1, 4, 12, 16,
 * the whole row), SiLU and sigmoid, the norm before and after the gate, with and without gate
 * and weight, float32 / bfloat16 / float16 rows with a weight and a gate of float32 or the same
 * dtype, row strides larger than the rows (guard values in the gaps and past the end must come
 * back untouched), rows split in two calls (bit for bit one call), and sizes that must be
 * refused.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/linattn/ops/norm/kernels.c"

static __typeof__(la_norm_forward) *volatile norm_forward = la_norm_forward;

#define HARNESS_SEED 0x2545F4914F6CDD1Dull
#include "harness_common.h"

static void run(long R, long D, long G, int act, int before, int has_g, int has_w, int xdt,
                int gdt) {
    char cfg[200];
    snprintf(cfg, sizeof cfg, "R=%ld D=%ld G=%ld act=%d before=%d gate=%d weight=%d xdt=%d gdt=%d "
             "LA_W=%d", R, D, G, act, before, has_g, has_w, xdt, gdt, W);
    long xr = D + 5, gr = D + 2, yr = D + 3;
    void *x = guarded(R * xr, xdt), *g = guarded(R * gr, gdt), *w = guarded(D, gdt);
    void *y = guarded(R * yr, xdt), *y2 = guarded(R * yr, xdt);
    double *xv = malloc(sizeof(double) * (size_t)(R * D)), *gv = malloc(sizeof(double) * (size_t)(R * D));
    double *wv = malloc(sizeof(double) * (size_t)D), *z = malloc(sizeof(double) * (size_t)D);
    for (long r = 0; r < R; ++r)
        for (long c = 0; c < D; ++c) {
            xv[r * D + c] = put(x, r * xr + c, uni(-3, 3), xdt);
            gv[r * D + c] = put(g, r * gr + c, uni(-4, 4), gdt);
        }
    for (long c = 0; c < D; ++c) wv[c] = put(w, c, uni(0.5, 1.5), gdt);
    float *work = malloc(sizeof(float) * (size_t)la_norm_work(D));
    const float eps = 1e-5f;
    int rc = norm_forward(x, xr, xdt, has_g ? g : NULL, gr, gdt, y, yr, xdt, has_w ? w : NULL,
                          gdt, R, D, G, eps, act, before, work);
    expect(rc == 0, "rc", cfg);
    double err = 0, scale = 1e-3;
    for (long r = 0; r < R; ++r) {
        for (long c = 0; c < D; ++c) {
            double a = gv[r * D + c], s = 1.0 / (1.0 + exp(-a));
            double act_g = has_g ? (act == NM_SIGMOID ? s : a * s) : 1.0;
            z[c] = xv[r * D + c] * (before ? 1.0 : act_g);
        }
        for (long g0 = 0; g0 < D; g0 += G) {
            double ss = 0;
            for (long c = g0; c < g0 + G; ++c) ss += z[c] * z[c];
            double rs = 1.0 / sqrt(ss / G + (double)eps);
            for (long c = g0; c < g0 + G; ++c) {
                double a = gv[r * D + c], s = 1.0 / (1.0 + exp(-a));
                double act_g = has_g ? (act == NM_SIGMOID ? s : a * s) : 1.0;
                double want = z[c] * rs * (has_w ? wv[c] : 1.0) * (before ? act_g : 1.0);
                double d = fabs(load_dt(y, r * yr + c, xdt) - want);
                if (fabs(want) > scale) scale = fabs(want);
                if (!(d <= err)) err = d;
            }
        }
    }
    expect(err / scale <= tol_of(xdt), "outputs", cfg);
    if (!(err / scale <= tol_of(xdt))) printf("    error %.3g of %.3g\n", err, scale);
    long bad = 0;
    for (long i = 0; i < R * yr + GUARD; ++i)
        if (!(i / yr < R && i % yr < D) && !is_guard(y, i, xdt)) ++bad;
    expect(bad == 0, "guards untouched", cfg);
    long mid = R / 2; /* rows in two calls, as threads split them: the same bits */
    rc = norm_forward(x, xr, xdt, has_g ? g : NULL, gr, gdt, y2, yr, xdt, has_w ? w : NULL, gdt,
                      mid, D, G, eps, act, before, work);
    rc |= norm_forward((const char *)x + mid * xr * ES[xdt], xr, xdt,
                       has_g ? (const char *)g + mid * gr * ES[gdt] : NULL, gr, gdt,
                       (char *)y2 + mid * yr * ES[xdt], yr, xdt, has_w ? w : NULL, gdt, R - mid,
                       D, G, eps, act, before, work);
    expect(rc == 0 && !memcmp(y, y2, (size_t)(R * yr + GUARD) * ES[xdt]), "split rows", cfg);
    free(x), free(g), free(w), free(y), free(y2), free(xv), free(gv), free(wv), free(z);
    free(work);
}

int main(void) {
    const long shapes[][2] = {{1, 1}, {3, 3}, {16, 16}, {16, 4}, {37, 37}, {128, 128},
                              {48, 12}, {48, 16}, {300, 300}, {300, 1}};
    for (unsigned s = 0; s < sizeof shapes / sizeof *shapes; ++s)
        for (int act = 0; act < 2; ++act)
            for (int before = 0; before < 2; ++before)
                for (int opt = 0; opt < 4; ++opt)
                    run(5, shapes[s][0], shapes[s][1], act, before, opt != 1, opt != 2, LA_F32,
                        LA_F32);
    for (int xdt = 0; xdt < 3; ++xdt)
        for (int gdt = 0; gdt < 3; ++gdt)
            for (int before = 0; before < 2; ++before) {
                run(7, 130, 130, NM_SILU, before, 1, 1, xdt, gdt);
                run(3, 64, 16, NM_SIGMOID, before, 1, 1, xdt, gdt);
            }
    float dummy[64] = {0};
    int refused = norm_forward(dummy, 8, 0, NULL, 0, 0, dummy, 8, 0, NULL, 0, 1, 8, 3, 1e-6f, 0,
                               1, dummy) == -1;
    refused &= norm_forward(dummy, 8, 0, NULL, 0, 0, dummy, 8, 0, NULL, 0, 1, 0, 1, 1e-6f, 0, 1,
                            dummy) == -1;
    refused &= norm_forward(dummy, 8, 0, NULL, 0, 0, dummy, 8, 0, NULL, 0, 1, 8, 8, 1e-6f, 2, 1,
                            dummy) == -1;
    refused &= norm_forward(dummy, 8, 5, NULL, 0, 0, dummy, 8, 0, NULL, 0, 1, 8, 8, 1e-6f, 0, 1,
                            dummy) == -1;
    expect(refused, "bad sizes refused", "refusals");
    if (failures) {
        printf("FAIL: %d of %d checks (W=%d)\n", failures, checks, W);
        return 1;
    }
    printf("PASS: %d checks, la_norm_forward, W=%d\n", checks, W);
    return 0;
}
