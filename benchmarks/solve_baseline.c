/* Baseline for `linattn solve`: the same exercise in plain C, the bar benchmarks/solve.py
 * compares against. Reads all of stdin at once (fread), parses every value with strtod,
 * computes the row sums of O in O(N*d) without any N x N matrix, prints "%.6f" lines.
 *
 *   O_i . 1 = phi(q_i) . a / phi(q_i) . z,   a = sum_j phi(k_j) (v_j . 1),   z = sum_j phi(k_j)
 *
 * with phi(x) = max(x, 0) + 1. Only Q is kept (N*d doubles); K and V are consumed as they are read.
 * Build: cc -O2 -o solve_baseline solve_baseline.c
 */
#include <stdio.h>
#include <stdlib.h>

static char *read_all(FILE *f, size_t *len) {
    size_t cap = 1 << 20, n = 0, got;
    char *buf = malloc(cap + 1);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            cap *= 2;
            buf = realloc(buf, cap + 1);
        }
    }
    if (!buf) return NULL;
    buf[n] = '\0'; /* strtod stops at the terminator */
    *len = n;
    return buf;
}

static double next(char **p) {
    char *end;
    double x = strtod(*p, &end);
    if (end == *p) {
        fputs("bad input\n", stderr);
        exit(2);
    }
    *p = end;
    return x;
}

static double phi(double x) { return (x > 0 ? x : 0) + 1.0; }

int main(void) {
    size_t len;
    char *p = read_all(stdin, &len);
    if (!p) return 1;
    char *end;
    long n = strtol(p, &end, 10), d = strtol(end, &p, 10);
    if (n < 1 || d < 1) {
        fputs("bad header\n", stderr);
        return 2;
    }
    double *q = malloc(sizeof(double) * n * d);
    double *a = calloc(d, sizeof(double)), *z = calloc(d, sizeof(double));
    for (long i = 0; i < n * d; i++) q[i] = phi(next(&p));
    /* K is read before V, so keep phi(K) until V's row sums arrive: a second pass over K's
       text would cost a second strtod per value; storing it costs N*d doubles. */
    double *fk = malloc(sizeof(double) * n * d);
    for (long i = 0; i < n * d; i++) fk[i] = phi(next(&p));
    for (long j = 0; j < n; j++) {
        double s = 0;
        for (long c = 0; c < d; c++) s += next(&p);
        for (long l = 0; l < d; l++) {
            a[l] += fk[j * d + l] * s;
            z[l] += fk[j * d + l];
        }
    }
    for (long i = 0; i < n; i++) {
        double num = 0, den = 0;
        for (long l = 0; l < d; l++) {
            num += q[i * d + l] * a[l];
            den += q[i * d + l] * z[l];
        }
        printf("%.6f\n", num / den);
    }
    return 0;
}
