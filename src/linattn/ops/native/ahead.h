#ifndef LA_AHEAD_H
#define LA_AHEAD_H
/* Rows asked for from memory ahead of the loop that reads them (__builtin_prefetch), for the
 * compiled kernels (linattn.ops.native): the next chunk's rows of a recurrence's forward, token
 * by token (la_ahead), and runs of bytes spread a line at a time over a loop (la_stream). Joined
 * after common.h into the one translation unit the library builds (ops/native/build.py). */
#ifndef LA_COMMON_H
#include "common.h"
#endif

/* The recurrences' chunks (GLA, the delta rule): the rows of the next chunk, asked for from
 * memory a token at a time while this chunk runs.
 * - Where a head's rows are not consecutive: fla's layout (B, T, H, K) puts a head's tokens H
 *   rows apart, every row in a page of its own, and the hardware's prefetchers, which follow a
 *   stream within a page, fetch none of them ahead (over 16 heads of 4,096 tokens, GLA took
 *   1.21x and the delta rule 1.14x the time of the same call on (B, H, T, K) rows, and 1.13x
 *   and 1.01x with this: AMD EPYC family 25, benchmarks/roofline.py).
 * - Consecutive rows too: a page holds 16 tokens' rows of 64 floats, and a stream the
 *   prefetchers follow ends at each page's end. Asked for ahead on (B, H, T, K) rows as well,
 *   the float32 forwards over 16 heads of 4,096 tokens took 0.93x (GLA) and 0.89x (the delta
 *   rule) the time, and 0.77x and 0.69x built for AVX2 (Intel Xeon, family 6, model 167;
 *   benchmarks/against_revision.py, four runs of nine rounds).
 * - 16-bit rows, consecutive or not: their forwards widen a whole chunk into float32 before it
 *   runs, and that burst of loads found nothing fetched ahead (60 % of the widening's samples
 *   on its loads, AMD EPYC family 25).
 * q, k: rows of qk bytes (q NULL: neither asked for); v, o: rows of vo bytes (0: the caller's
 * column block of floats); token strides in bytes; T: the next chunk's tokens. */
typedef struct {
    const char *q, *k, *v;
    char *o;
    long qt, kt, vt, ot, qk, vo, T;
} la_ahead;

/* The next chunk's float32 rows for a forward over one head: q, k, v, o at that head's first
 * token (v and o at its column block: the width la_fetch_ahead is given), q and k rows of K;
 * token strides qt, kt, vt, ot in floats; the next chunk starts at token t1 and has Tn
 * tokens; with_qk 0: q and k not asked for (a column block after the first reads the same
 * ones). T = 0 (nothing asked for) where there is no next chunk; then no address past the
 * rows' ends is formed. */
static inline la_ahead la_next_rows(const float *q, long qt, const float *k, long kt,
                                    const float *v, long vt, float *o, long ot, long K, long t1,
                                    long Tn, int with_qk) {
    la_ahead a = {0};
    if (Tn > 0)
        a = (la_ahead){with_qk ? (const char *)(q + t1 * qt) : NULL,
                       (const char *)(k + t1 * kt), (const char *)(v + t1 * vt),
                       (char *)(o + t1 * ot), 4 * qt, 4 * kt, 4 * vt, 4 * ot, 4 * K, 0, Tn};
    return a;
}

/* The next chunk's 16-bit rows for a forward over one head: q, k at the head's first row
 * (rows of K), v, o at its first row's column v0 (V columns); token strides in elements; the
 * next chunk starts at token t1 and has Tn tokens. T = 0 where Tn is 0, and then no address
 * past the rows' ends is formed. */
static inline la_ahead la_next_rows16(const void *q, long qt, const void *k, long kt,
                                      const void *v, long vt, void *o, long ot, long K, long V,
                                      long t1, long Tn) {
    la_ahead a = {0};
    if (Tn > 0)
        a = (la_ahead){(const char *)q + 2 * t1 * qt, (const char *)k + 2 * t1 * kt,
                       (const char *)v + 2 * t1 * vt, (char *)o + 2 * t1 * ot, 2 * qt, 2 * kt,
                       2 * vt, 2 * ot, 2 * K, 2 * V, Tn};
    return a;
}

/* A forward's plan for one chunk's column block: its own next chunk's rows, or where this is the
 * last chunk of the last head, the caller's (`next`, when given: a 16-bit forward's next
 * chunk); q and k only for the first column block (with_qk). */
static inline la_ahead la_chunk_ahead(la_ahead own, const la_ahead *next, int last,
                                      int with_qk) {
    if (!next || !last) return own;
    la_ahead a = *next;
    if (!with_qk) a.q = NULL;
    return a;
}

/* Token t's rows of the next chunk asked for (nothing where pf is NULL or the chunk is
 * shorter): width, the column block's floats of v and o where the plan does not say. */
static inline __attribute__((always_inline)) void la_fetch_ahead(const la_ahead *pf, long t,
                                                                  long width) {
    if (!pf || t >= pf->T) return;
    for (long x = 0; pf->q && x < pf->qk; x += 64) {
        __builtin_prefetch(pf->q + t * pf->qt + x, 0, 2);
        __builtin_prefetch(pf->k + t * pf->kt + x, 0, 2);
    }
    for (long x = 0, vo = pf->vo ? pf->vo : 4 * width; x < vo; x += 64) {
        __builtin_prefetch(pf->v + t * pf->vt + x, 0, 2);
        __builtin_prefetch(pf->o + t * pf->ot + x, 1, 2);
    }
}

/* A run of consecutive bytes to be asked for from memory a line at a time, spread over a loop
 * (la_fetch_line once per step): where a kernel walks a chunk in a burst (its features, its pairs)
 * and then multiplies, the next chunk's rows are fetched while this one is worked on. */
typedef struct {
    const char *p;
    long left; /* bytes still to ask for */
} la_stream;

/* The rows [t1, min(t1 + C, T)) of a head whose first row starts at element i0 of x (rows of n
 * elements of size es): the chunk after one that ends at t1, or an empty run where there is
 * none (then no address past x's end is formed). */
static inline la_stream la_next_chunk(const void *x, long i0, long t1, long T, long C, long n,
                                      long es) {
    long rows = T - t1 < C ? T - t1 : C;
    if (rows <= 0) return (la_stream){NULL, 0};
    return (la_stream){(const char *)x + (i0 + t1 * n) * es, rows * n * es};
}

static inline __attribute__((always_inline)) void la_fetch_line(la_stream *s) {
    if (s->left > 0) {
        __builtin_prefetch(s->p, 0, 3);
        s->left -= 64;
        if (s->left > 0) s->p += 64;
    }
}

/* A whole run asked for at once, a line at a time (for a loop too short to spread it over):
 * the recurrent causal form's rows a few tokens ahead. */
static inline __attribute__((always_inline)) void la_fetch_run(la_stream s) {
    while (s.left > 0) la_fetch_line(&s);
}

#endif /* LA_AHEAD_H */
