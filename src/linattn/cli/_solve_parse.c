/* Fast parser of whitespace-separated decimal numbers for `linattn solve` (loaded with ctypes).
 *
 * It takes the common grammar, [+-]? (D+ [. D*] | . D+) ([eE] [+-]? D+)?, with tokens separated
 * by the ASCII bytes that Python's str.split() treats as whitespace (\t \n \v \f \r, 0x1c-0x1f,
 * space). Every value is correctly rounded, like Python's float():
 *   - Clinger's fast path: a mantissa w <= 2^53 and a decimal exponent |e| <= 22 are both exact
 *     doubles, so w * 10^e (or w / 10^-e) is one correctly rounded IEEE operation;
 *   - anything longer or larger goes to strtod (correctly rounded in glibc and musl).
 * Any other token (nan, inf, 1_000, non-ASCII, junk) and any non-finite value stop the parse at
 * that token's first byte: Python then judges the token with float() and names it in an error.
 *
 * Build: cc -O2 -shared -fPIC -o _solve_parse.so _solve_parse.c
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                 1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* The ASCII whitespace of str.split(): 0x09-0x0d, 0x1c-0x1f and space. */
static inline int is_space(unsigned char c) {
    return c == ' ' || (unsigned char)(c - 0x09) <= 4 || (unsigned char)(c - 0x1c) <= 3;
}

static inline int is_digit(unsigned char c) { return (unsigned char)(c - '0') <= 9; }

/* strtod on one token, copied so that it is NUL-terminated. Returns 0 unless the whole token
 * was consumed and the value is finite. */
static int slow_value(const unsigned char *tok, size_t n, double *out) {
    char tmp[128];
    char *end;
    if (n >= sizeof tmp) return 0;
    memcpy(tmp, tok, n);
    tmp[n] = '\0';
    *out = strtod(tmp, &end);
    return end == tmp + n && isfinite(*out);
}

/* Parse one token starting at p (not whitespace, p < end), any shape of the grammar. On success
 * store the value, return the byte after the token; otherwise return NULL. */
static const unsigned char *parse_general(const unsigned char *p, const unsigned char *end,
                                          double *out) {
    const unsigned char *tok = p;
    int neg = 0;
    if (*p == '+' || *p == '-') {
        neg = *p == '-';
        p++;
    }
    uint64_t w = 0;
    int sig = 0;     /* significant digits held in w (leading zeros do not count) */
    int exact = 1;   /* 0 once a digit did not fit: strtod decides */
    int exp10 = 0;   /* value = w * 10^exp10 */
    int digits = 0;  /* mantissa digits seen, 0 means no number */
    for (; p < end && is_digit(*p); p++, digits++) {
        if (sig < 19) {
            w = w * 10 + (uint64_t)(*p - '0');
            sig += w != 0;
        } else {
            exact = 0;
        }
    }
    if (p < end && *p == '.') {
        for (p++; p < end && is_digit(*p); p++, digits++) {
            if (sig < 19) {
                w = w * 10 + (uint64_t)(*p - '0');
                sig += w != 0;
                exp10--;
            } else {
                exact = 0;
            }
        }
    }
    if (!digits) return NULL;
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        int eneg = 0, e = 0;
        if (p < end && (*p == '+' || *p == '-')) {
            eneg = *p == '-';
            p++;
        }
        if (p == end || !is_digit(*p)) return NULL;
        for (; p < end && is_digit(*p); p++)
            if (e < 100000) e = e * 10 + (*p - '0'); /* saturate: strtod sees the real text */
        exp10 += eneg ? -e : e;
    }
    if (p < end && !is_space(*p)) return NULL;
    double x;
    if (exact && w <= (UINT64_C(1) << 53) && exp10 >= -22 && exp10 <= 22) {
        x = exp10 < 0 ? (double)w / POW10[-exp10] : (double)w * POW10[exp10];
        *out = neg ? -x : x;
        return isfinite(*out) ? p : NULL;
    }
    return slow_value(tok, (size_t)(p - tok), out) ? p : NULL;
}

/* parse_general, with a shortcut for the shape nearly every input has: [-]D+[.D*] with at most
 * 15 digits. Then w < 2^53 and 10^frac are exact, so w / 10^frac is correctly rounded, and the
 * sign, exponent and long-mantissa cases cost nothing (about 25% faster overall). */
static inline const unsigned char *parse_one(const unsigned char *p, const unsigned char *end,
                                             double *out) {
    const unsigned char *q = p + (*p == '-'), *digits = q;
    uint64_t w = 0;
    while (q < end && is_digit(*q)) w = w * 10 + (uint64_t)(*q++ - '0');
    long n_int = (long)(q - digits), n_frac = 0;
    if (n_int && q < end && *q == '.') {
        const unsigned char *frac = ++q;
        while (q < end && is_digit(*q)) w = w * 10 + (uint64_t)(*q++ - '0');
        n_frac = (long)(q - frac);
    }
    if (n_int && n_int + n_frac <= 15 && (q == end || is_space(*q))) {
        double x = (double)w / POW10[n_frac];
        *out = *p == '-' ? -x : x;
        return q;
    }
    return parse_general(p, end, out);
}

/* Parse up to `cap` values of buf[pos:len] into out[0:cap].
 *
 * Returns how many were stored. *stop is where the parse ended: `len` when only whitespace was
 * left, the first byte of a token this parser does not take, or, once `cap` values are stored,
 * the byte right after the last one. */
long long lap_parse(const unsigned char *buf, long long len, long long pos, double *out,
                    long long cap, long long *stop) {
    const unsigned char *p = buf + pos, *end = buf + len;
    long long n = 0;
    while (n < cap) {
        while (p < end && is_space(*p)) p++;
        if (p == end) break;
        const unsigned char *next = parse_one(p, end, out + n);
        if (!next) break;
        p = next;
        n++;
    }
    if (n < cap)
        while (p < end && is_space(*p)) p++;
    *stop = (long long)(p - buf);
    return n;
}
