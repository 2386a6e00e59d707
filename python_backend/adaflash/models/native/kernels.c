/* The fp32 kernels of a decode or verify step on CPU: products of a few rows by a weight, RMS norms, attention.

product: y[r, j] = sum_k x[r, k] * w[j, k] for x [rows, in] and w [out, in] laid out in panels of 16 outputs.
Why: a decode step multiplies one to a few rows by every weight, a verify step a few dozen; MKL's few-row products
read the weight at about half the speed two cores stream memory, and oneDNN's blocked product, fast from about
eight rows, is not batch-invariant.
rmsnorm: one call instead of torch's six operations per norm (about 19 norms a step in a small model).
attend: a step's few queries over their cached keys, without the padding, masks and views torch's attention
needs around them.

Each kernel computes a row (a dot, a token's norm, a token's head) in one fixed order whatever else is in the
call, so a token's results are bitwise the same alone or batched with others: verifying k tokens gives the
logits decoding them one at a time would. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float lanes(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* A dot (attention's scores) in one order: the 8-lane chunks of k alternate between two accumulators (even and
   odd chunks), then the accumulators are added, then their lanes, then the scalar tail. */
static float dot(const float *x, const float *w, int64_t in) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    int64_t k = 0;
    for (; k + 16 <= in; k += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), _mm256_loadu_ps(w + k), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), _mm256_loadu_ps(w + k + 8), a1);
    }
    if (k + 8 <= in) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), _mm256_loadu_ps(w + k), a0);
        k += 8;
    }
    float s = lanes(_mm256_add_ps(a0, a1));
    for (; k < in; k++) s += x[k] * w[k];
    return s;
}
/* The weights of `product` lie in panels of PANEL outputs: w [out, in] as [ceil(out / PANEL), in, PANEL], zero
   past `out`, so that one load reads an input's weights for PANEL outputs side by side. */
#define PANEL 16

/* Rows r.. by panels p..: R x P accumulators of 16 outputs, each output summed over k = 0, 1, .. in order, one
   fused multiply-add each, from zero. That order does not depend on R, P or the vector width, so an output is
   bitwise the same whichever tile, batch or host (AVX-512 or AVX2) computed it. */
#define TILE512(R, P)                                                                                              \
    __attribute__((target("avx512f"))) static void tile512_##R##_##P(const float *x, int64_t in, const float *w, \
                                                                      float *y, int64_t y_stride) {             \
        __m512 acc[R][P], v[P];                                                                                   \
        for (int r = 0; r < R; r++)                                                                               \
            for (int p = 0; p < P; p++) acc[r][p] = _mm512_setzero_ps();                                          \
        for (int64_t k = 0; k < in; k++) {                                                                        \
            for (int p = 0; p < P; p++) v[p] = _mm512_loadu_ps(w + (p * in + k) * PANEL);                         \
            for (int r = 0; r < R; r++) {                                                                         \
                __m512 b = _mm512_set1_ps(x[r * in + k]);                                                         \
                for (int p = 0; p < P; p++) acc[r][p] = _mm512_fmadd_ps(b, v[p], acc[r][p]);                      \
            }                                                                                                     \
        }                                                                                                         \
        for (int r = 0; r < R; r++)                                                                               \
            for (int p = 0; p < P; p++) _mm512_storeu_ps(y + r * y_stride + p * PANEL, acc[r][p]);                \
    }
#define TILE256(R)                                                                                                 \
    static void tile256_##R(const float *x, int64_t in, const float *w, float *y, int64_t y_stride) {             \
        __m256 lo[R], hi[R];                                                                                      \
        for (int r = 0; r < R; r++) lo[r] = hi[r] = _mm256_setzero_ps();                                          \
        for (int64_t k = 0; k < in; k++) {                                                                        \
            __m256 a = _mm256_loadu_ps(w + k * PANEL), c = _mm256_loadu_ps(w + k * PANEL + 8);                   \
            for (int r = 0; r < R; r++) {                                                                         \
                __m256 b = _mm256_set1_ps(x[r * in + k]);                                                         \
                lo[r] = _mm256_fmadd_ps(b, a, lo[r]);                                                             \
                hi[r] = _mm256_fmadd_ps(b, c, hi[r]);                                                             \
            }                                                                                                     \
        }                                                                                                         \
        for (int r = 0; r < R; r++) {                                                                             \
            _mm256_storeu_ps(y + r * y_stride, lo[r]);                                                            \
            _mm256_storeu_ps(y + r * y_stride + 8, hi[r]);                                                        \
        }                                                                                                         \
    }
TILE512(1, 1) TILE512(2, 1) TILE512(3, 1) TILE512(4, 1) TILE512(5, 1) TILE512(6, 1)
TILE512(1, 4) TILE512(2, 4) TILE512(3, 4) TILE512(4, 4) TILE512(5, 4) TILE512(6, 4)
TILE256(1) TILE256(2) TILE256(3) TILE256(4)

typedef void (*tile_fn)(const float *, int64_t, const float *, float *, int64_t);
#define GROUP 4 /* panels a thread takes at a time: their weights (4 x in x 16 floats) stay in L2 for every row */
#define MAX_ROWS 6     /* rows of a tile, AVX-512: 24 of its 32 registers accumulate */
#define MAX_ROWS_256 4 /* AVX2: 8 of its 16 */

/* y [rows, out] = x [rows, in] times the panelled w: each thread takes GROUP panels at a time and runs every row
   over them, MAX_ROWS (AVX2: MAX_ROWS_256) at a time, so a weight is read from memory once per call. `wide`: the
   host has AVX-512 (the same sums, twice the width). */
void product(const float *x, const float *w, float *y, int64_t rows, int64_t out, int64_t in, int threads, int wide) {
    static const tile_fn by_512[2][MAX_ROWS + 1] = {
        {0, tile512_1_1, tile512_2_1, tile512_3_1, tile512_4_1, tile512_5_1, tile512_6_1},
        {0, tile512_1_4, tile512_2_4, tile512_3_4, tile512_4_4, tile512_5_4, tile512_6_4}};
    static const tile_fn by_256[MAX_ROWS_256 + 1] = {0, tile256_1, tile256_2, tile256_3, tile256_4};
    const int64_t panels = (out + PANEL - 1) / PANEL, groups = (panels + GROUP - 1) / GROUP;
    const int most_rows = wide ? MAX_ROWS : MAX_ROWS_256;
    #pragma omp parallel num_threads(threads)
    {
        float part[MAX_ROWS * GROUP * PANEL];
        #pragma omp for schedule(static)
        for (int64_t g = 0; g < groups; g++) {
            const int64_t first = g * GROUP, last = first + GROUP < panels ? first + GROUP : panels;
            for (int64_t r = 0; r < rows; r += most_rows) {
                const int n = rows - r < most_rows ? (int)(rows - r) : most_rows;
                for (int64_t p = first; p < last;) {
                    const int64_t step = wide && last - p == GROUP ? GROUP : 1, j = p * PANEL;
                    const int whole = j + step * PANEL <= out;  /* else the padding's outputs go to `part` */
                    float *to = whole ? y + r * out + j : part;
                    const int64_t stride = whole ? out : GROUP * PANEL;
                    if (wide) by_512[step == GROUP][n](x + r * in, in, w + p * in * PANEL, to, stride);
                    else by_256[n](x + r * in, in, w + p * in * PANEL, to, stride);
                    if (!whole)
                        for (int i = 0; i < n; i++)
                            memcpy(y + (r + i) * out + j, part + i * stride, (size_t)(out - j) * sizeof(float));
                    p += step;
                }
            }
        }
    }
}

/* y = x / sqrt(mean(x^2) + eps) * w over one row of `dim`: the squares summed in 8 lanes, then the lanes, then a
   scalar tail; each value (x * inv) * w. */
static void norm_row(const float *x, const float *w, float *y, int64_t dim, float eps) {
    __m256 acc = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= dim; k += 8) {
        __m256 v = _mm256_loadu_ps(x + k);
        acc = _mm256_fmadd_ps(v, v, acc);
    }
    float ss = lanes(acc);
    for (; k < dim; k++) ss += x[k] * x[k];
    float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    __m256 iv = _mm256_set1_ps(inv);
    for (k = 0; k + 8 <= dim; k += 8)
        _mm256_storeu_ps(y + k, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + k), iv), _mm256_loadu_ps(w + k)));
    for (; k < dim; k++) y[k] = x[k] * inv * w[k];
}

/* `norm_row` of x [T, H, D] whose rows lie `stride` floats apart (q and k are a slice of the joined q/k/v
   product), y contiguous, w [H, D] (w_stride D) or one row for all heads (w_stride 0). */
void rmsnorm(const float *x, int64_t stride, const float *w, int64_t w_stride, float *y, int64_t tokens,
             int64_t heads, int64_t dim, float eps, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads) if (tokens * heads * dim >= 65536)
    for (int64_t r = 0; r < tokens * heads; r++)
        norm_row(x + (r / heads) * stride + (r % heads) * dim, w + (r % heads) * w_stride, y + r * dim, dim, eps);
}

/* rmsnorm of q and k heads [T, H, D] (rows `stride` floats apart, weight [H, D]) followed by the rotary embedding
   of each token's position: y = n * cos + roll(n, D / 2) * sin with cos and sin [T, D] (sin's first half
   negated), rounded as torch's addcmul on x * cos does: the first product rounded, the second fused into the sum.
   D is a multiple of 16. */
void norm_rope(const float *x, int64_t stride, const float *w, const float *cos, const float *sin, float *y,
               int64_t tokens, int64_t heads, int64_t dim, float eps, int threads) {
    const int64_t half = dim / 2;
    #pragma omp parallel for schedule(static) num_threads(threads) if (tokens * heads * dim >= 65536)
    for (int64_t r = 0; r < tokens * heads; r++) {
        int64_t t = r / heads, h = r % heads;
        const float *c = cos + t * dim, *sn = sin + t * dim;
        float n[dim], *yr = y + r * dim;
        norm_row(x + t * stride + h * dim, w + h * dim, n, dim, eps);
        for (int64_t k = 0; k < dim; k += 8) {
            int64_t partner = k < half ? k + half : k - half;
            __m256 a = _mm256_mul_ps(_mm256_loadu_ps(n + k), _mm256_loadu_ps(c + k));
            _mm256_storeu_ps(yr + k, _mm256_fmadd_ps(_mm256_loadu_ps(n + partner), _mm256_loadu_ps(sn + k), a));
        }
    }
}

/* e^x in 8 lanes for x <= 0 (softmax's shifted scores): x = n ln2 + r, e^r by a degree-7 Taylor-like polynomial
   in Horner form, 2^n put in the exponent; below -87 the result is 0. Within 2 ulp of expf on [-87, 0]. */
static inline __m256 exp_nonpositive(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f);
    __m256 zero_mask = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(zero_mask, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* Attention's queries go through `attend` in blocks of up to BLOCK_QUERIES (a kv head's query heads, token after
   token, of one sequence): each key and value row is read once for the whole block, and with AVX-512 the block's
   value sums stay in registers (4 queries x 64 dims). */
#define BLOCK_QUERIES 4
/* New tokens of one sequence a task of `attend` takes at most: its kv head's keys and values, read from memory once
   by the task's first block, stay in the core's cache for the other blocks of the task. */
#define TASK_TOKENS 16

/* One block's cached keys and values: `pages` of `page` positions, the kv head's rows at `head_off` within a page of
   `page_floats` floats, rows of `dim`. */
typedef struct {
    const float *kc, *vc;
    const int64_t *pages;
    int64_t page, page_floats, head_off, dim;
} Keys;

/* s[q][l] = dot(query q, key l) * scale for l < lens[q] (rows of s `stride` floats apart), key after key, so that a
   key is read once for the block. */
static void scores(const Keys *kv, const float *const *qs, const int64_t *lens, int nq, float scale, float *s,
                   int64_t stride) {
    const int64_t len = lens[nq - 1];
    for (int64_t l0 = 0, pi = 0; l0 < len; l0 += kv->page, pi++) {
        const float *kp = kv->kc + kv->pages[pi] * kv->page_floats + kv->head_off;
        const int64_t n = len - l0 < kv->page ? len - l0 : kv->page;
        for (int64_t i = 0; i < n; i++)
            for (int q = 0; q < nq; q++)
                if (l0 + i < lens[q]) s[q * stride + l0 + i] = dot(qs[q], kp + i * kv->dim, kv->dim) * scale;
    }
}

/* The dot of a query with a key whose products lie in acc, 16 lanes holding `dot`'s two accumulators side by side
   (lanes 0-7 its even 8-float chunks, 8-15 its odd ones): their sum, as `dot` adds them. */
__attribute__((target("avx512f"))) static inline __m256 halves(__m512 acc) {
    return _mm256_add_ps(_mm512_castps512_ps256(acc), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
}

/* A query's dot with a key, `dot`'s two accumulators summed (`halves`) but not their lanes; dim a multiple of 16. */
__attribute__((target("avx512f"))) static inline __m256 key_sums(const float *q, const float *key, int64_t dim) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t c = 0; c < dim; c += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + c), _mm512_loadu_ps(key + c), acc);
    return halves(acc);
}

/* `lanes` of eight vectors at once, each summed in `lanes`'s order (lane i + lane i + 4, then those two pairs' sums
   0 + 2 and 1 + 3, then those two), so each of the eight is `lanes`'s bit for bit. */
static inline __m256 lanes8(const __m256 *v) {
    __m256 pairs[4], twos[2];
    for (int i = 0; i < 4; i++)  /* [v(2i) lo + hi, v(2i+1) lo + hi] */
        pairs[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20),
                                 _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
    for (int i = 0; i < 2; i++)  /* [v(4i) 0+2, 1+3, v(4i+2) 0+2, 1+3 | v(4i+1) .., v(4i+3) ..] */
        twos[i] = _mm256_add_ps(_mm256_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                _mm256_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 sums = _mm256_hadd_ps(twos[0], twos[1]);  /* v0, v2, v4, v6 | v1, v3, v5, v7 */
    return _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* `scores` with AVX-512, for dim a multiple of 16, eight keys at a time: each key's products in 16 lanes
   (`key_sums`), eight keys' sums at once (`lanes8`); a query's last keys short of eight one at a time. Every score
   is `dot`'s bit for bit. */
__attribute__((target("avx512f"))) static void scores512(const Keys *kv, const float *const *qs, const int64_t *lens,
                                                         int nq, float scale, float *s, int64_t stride) {
    const int64_t len = lens[nq - 1], dim = kv->dim;
    const __m256 scaled = _mm256_set1_ps(scale);
    const float *keys[8];
    int64_t pi = 0, at = 0;  /* the next key's page, and its row in the page */
    for (int64_t l0 = 0; l0 < len; l0 += 8) {
        const int64_t n = len - l0 < 8 ? len - l0 : 8;
        for (int64_t i = 0; i < n; i++, at++) {
            if (at == kv->page) pi++, at = 0;
            keys[i] = kv->kc + kv->pages[pi] * kv->page_floats + kv->head_off + at * dim;
        }
        for (int q = 0; q < nq; q++) {
            float *out = s + q * stride + l0;
            if (lens[q] >= l0 + 8) {
                __m256 sums[8];
                for (int i = 0; i < 8; i++) sums[i] = key_sums(qs[q], keys[i], dim);
                _mm256_storeu_ps(out, _mm256_mul_ps(lanes8(sums), scaled));
                continue;
            }
            for (int64_t i = 0; i < lens[q] - l0; i++) out[i] = lanes(key_sums(qs[q], keys[i], dim)) * scale;
        }
    }
}

/* A query's scores s[0, len) turned into softmax weights without their normalisation, s[len, padded) set to 0
   (padded: a multiple of 8 from len's); returns 1 / their sum. */
static float softmax_row(float *s, int64_t len, int64_t padded) {
    const int64_t whole = (len + 7) & ~(int64_t)7;
    for (int64_t l = len; l < whole; l++) s[l] = -INFINITY;
    __m256 mx = _mm256_set1_ps(-INFINITY);
    for (int64_t l = 0; l < len; l += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + l));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const __m256 m = _mm256_set1_ps(_mm_cvtss_f32(m4));
    __m256 total = _mm256_setzero_ps();
    for (int64_t l = 0; l < len; l += 8) {
        __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + l), m));
        _mm256_storeu_ps(s + l, e);
        total = _mm256_add_ps(total, e);
    }
    for (int64_t l = whole; l < padded; l++) s[l] = 0.0f;
    return 1.0f / lanes(total);
}

/* o = sum over keys l < len, in order, of w[l] * value l, from dims d0 on (the value sums of one query). */
static void values(const Keys *kv, const float *w, int64_t len, int64_t d0, float *o) {
    const int64_t dim = kv->dim;
    /* 64 dims at a time in registers over every key, then any rest through memory: each output's sum runs over
       the keys in order either way. */
    for (; d0 + 64 <= dim; d0 += 64) {
        __m256 acc[8];
        for (int r = 0; r < 8; r++) acc[r] = _mm256_setzero_ps();
        for (int64_t l0 = 0, pi = 0; l0 < len; l0 += kv->page, pi++) {
            const float *vp = kv->vc + kv->pages[pi] * kv->page_floats + kv->head_off + d0;
            const int64_t n = len - l0 < kv->page ? len - l0 : kv->page;
            for (int64_t i = 0; i < n; i++) {
                const __m256 x = _mm256_set1_ps(w[l0 + i]);
                for (int r = 0; r < 8; r++) acc[r] = _mm256_fmadd_ps(x, _mm256_loadu_ps(vp + i * dim + 8 * r), acc[r]);
            }
        }
        for (int r = 0; r < 8; r++) _mm256_storeu_ps(o + d0 + 8 * r, acc[r]);
    }
    for (int64_t d = d0; d < dim; d += 8) _mm256_storeu_ps(o + d, _mm256_setzero_ps());
    for (int64_t l0 = 0, pi = 0; l0 < len && d0 < dim; l0 += kv->page, pi++) {
        const float *vp = kv->vc + kv->pages[pi] * kv->page_floats + kv->head_off;
        const int64_t n = len - l0 < kv->page ? len - l0 : kv->page;
        for (int64_t i = 0; i < n; i++) {
            const __m256 x = _mm256_set1_ps(w[l0 + i]);
            for (int64_t d = d0; d < dim; d += 8)
                _mm256_storeu_ps(o + d, _mm256_fmadd_ps(x, _mm256_loadu_ps(vp + i * dim + d), _mm256_loadu_ps(o + d)));
        }
    }
}

/* `values` of NQ queries at once with AVX-512, 64 dims at a time, over the block's `len` keys (a query's weights past
   its own keys are 0, which leave its sums as they are): each value row is read once for the block. Each output's
   sum runs over the keys in order, as in `values`. Returns the first dim not done (a rest under 64). */
#define VALUES512(NQ)                                                                                              \
    __attribute__((target("avx512f"))) static int64_t values512_##NQ(const Keys *kv, const float *w, int64_t stride, \
                                                                      int64_t len, float *const *os) {           \
        const int64_t dim = kv->dim;                                                                              \
        int64_t d0 = 0;                                                                                           \
        for (; d0 + 64 <= dim; d0 += 64) {                                                                        \
            __m512 acc[NQ][4];                                                                                    \
            for (int q = 0; q < NQ; q++)                                                                          \
                for (int r = 0; r < 4; r++) acc[q][r] = _mm512_setzero_ps();                                      \
            for (int64_t l0 = 0, pi = 0; l0 < len; l0 += kv->page, pi++) {                                       \
                const float *vp = kv->vc + kv->pages[pi] * kv->page_floats + kv->head_off + d0;                   \
                const int64_t n = len - l0 < kv->page ? len - l0 : kv->page;                                      \
                for (int64_t i = 0; i < n; i++) {                                                                 \
                    __m512 v[4];                                                                                  \
                    for (int r = 0; r < 4; r++) v[r] = _mm512_loadu_ps(vp + i * dim + 16 * r);                    \
                    for (int q = 0; q < NQ; q++) {                                                                \
                        const __m512 x = _mm512_set1_ps(w[q * stride + l0 + i]);                                  \
                        for (int r = 0; r < 4; r++) acc[q][r] = _mm512_fmadd_ps(x, v[r], acc[q][r]);              \
                    }                                                                                             \
                }                                                                                                 \
            }                                                                                                     \
            for (int q = 0; q < NQ; q++)                                                                          \
                for (int r = 0; r < 4; r++) _mm512_storeu_ps(os[q] + d0 + 16 * r, acc[q][r]);                    \
        }                                                                                                         \
        return d0;                                                                                                \
    }
VALUES512(1) VALUES512(2) VALUES512(3) VALUES512(4)

typedef int64_t (*values512_fn)(const Keys *, const float *, int64_t, int64_t, float *const *);

/* One block of nq queries (lens nondecreasing, the last the block's): their outputs os[q] [dim]. s: scratch of
   nq rows `stride` floats apart, stride at least the last len rounded up to 8. */
static void attend_block(const Keys *kv, const float *const *qs, const int64_t *lens, int nq, float scale, float *s,
                         int64_t stride, float *const *os, int wide) {
    static const values512_fn by_count[BLOCK_QUERIES + 1] = {0, values512_1, values512_2, values512_3, values512_4};
    const int64_t len = lens[nq - 1], dim = kv->dim, padded = (len + 7) & ~(int64_t)7;
    if (wide && dim % 16 == 0) scores512(kv, qs, lens, nq, scale, s, stride);
    else scores(kv, qs, lens, nq, scale, s, stride);
    float inv[BLOCK_QUERIES];
    for (int q = 0; q < nq; q++) inv[q] = softmax_row(s + q * stride, lens[q], padded);
    const int64_t d0 = wide ? by_count[nq](kv, s, stride, len, os) : 0;
    for (int q = 0; q < nq; q++) {
        if (d0 < dim) values(kv, s + q * stride, lens[q], d0, os[q]);
        for (int64_t d = 0; d < dim; d += 8)
            _mm256_storeu_ps(os[q] + d, _mm256_mul_ps(_mm256_loadu_ps(os[q] + d), _mm256_set1_ps(inv[q])));
    }
}

/* Attention of the new tokens of `seqs` sequences over their cached keys and values, after writing the new tokens'
   keys k and values v [T, kv_heads, dim] (rows `k_stride` and `v_stride` floats apart) into the caches.
   Sequence b's `counts[b]` tokens lie from row `first[b]` of q [T, heads, dim] (rows `q_stride` floats apart, the
   heads side by side) at positions starts[b].., and its cache pages are table[b * width ..]; the caches are
   [pages, kv_heads, page, dim]. Query j of sequence b sees positions 0..starts[b] + j (`causal`), else every new
   position too, 0..starts[b] + counts[b] - 1 (a drafter's block); query head h reads kv head h / (heads /
   kv_heads). out: [T, heads, dim]. A (token, head) is computed the same whatever else is in the batch, and with
   AVX-512 (`wide`) or without. dim is a multiple of 8.
   A task is one kv head of one sequence over up to TASK_TOKENS of its tokens, every query head that reads it, in
   blocks: a task per query read the same keys and values once per query head and token, and at a step's few
   queries over long contexts that reading was most of the attention's time (docs/history.md, round 28). */
/* The tasks of `attend` for a sequence of `count` new tokens. */
static inline int64_t tasks_of(int64_t count, int64_t kv_heads) {
    return (count + TASK_TOKENS - 1) / TASK_TOKENS * kv_heads;
}

void attend(const float *q, int64_t q_stride, const float *k, int64_t k_stride, const float *v, int64_t v_stride,
            float *kc, float *vc, const int64_t *table, int64_t width, const int64_t *first, const int64_t *starts,
            const int64_t *counts, int64_t seqs, int64_t heads, int64_t kv_heads, int64_t page, int64_t dim,
            float scale, float *out, int threads, int wide, int causal) {
    int64_t tasks = 0;
    for (int64_t b = 0; b < seqs; b++) tasks += tasks_of(counts[b], kv_heads);
    const int64_t group = heads / kv_heads, page_floats = kv_heads * page * dim;
    for (int64_t b = 0; b < seqs; b++)
        for (int64_t j = 0; j < counts[b]; j++) {
            const int64_t t = first[b] + j, p = starts[b] + j;
            const int64_t at = table[b * width + p / page] * page_floats + (p % page) * dim;
            for (int64_t g = 0; g < kv_heads; g++) {
                memcpy(kc + at + g * page * dim, k + t * k_stride + g * dim, dim * sizeof(float));
                memcpy(vc + at + g * page * dim, v + t * v_stride + g * dim, dim * sizeof(float));
            }
        }
    /* Tasks are handed out one at a time: a prefill's later tokens read more keys than its first ones, so equal
       halves of the tasks are unequal halves of the work. */
    #pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t task = 0; task < tasks; task++) {
        int64_t b = 0, rest = task;
        while (rest >= tasks_of(counts[b], kv_heads)) rest -= tasks_of(counts[b++], kv_heads);
        const int64_t g = rest % kv_heads, j0 = rest / kv_heads * TASK_TOKENS;
        const int64_t j1 = j0 + TASK_TOKENS < counts[b] ? j0 + TASK_TOKENS : counts[b];
        const Keys kv = {kc, vc, table + b * width, page, page_floats, g * page * dim, dim};
        const int64_t last = starts[b] + (causal ? j1 : counts[b]);
        const int64_t stride = (last + 7) & ~(int64_t)7, queries = (j1 - j0) * group;
        float *s = malloc((size_t)(BLOCK_QUERIES * stride) * sizeof(float));
        for (int64_t x0 = 0; x0 < queries; x0 += BLOCK_QUERIES) {
            const int nq = queries - x0 < BLOCK_QUERIES ? (int)(queries - x0) : BLOCK_QUERIES;
            const float *qs[BLOCK_QUERIES];
            float *os[BLOCK_QUERIES];
            int64_t lens[BLOCK_QUERIES];
            for (int i = 0; i < nq; i++) {
                const int64_t j = j0 + (x0 + i) / group, h = g * group + (x0 + i) % group, t = first[b] + j;
                qs[i] = q + t * q_stride + h * dim;
                os[i] = out + t * heads * dim + h * dim;
                lens[i] = causal ? starts[b] + j + 1 : last;
            }
            attend_block(&kv, qs, lens, nq, scale, s, stride, os, wide);
        }
        free(s);
    }
}


/* act[t, i] = silu(gu[t, i]) * gu[t, inter + i]: the gate and up halves of the joined product. silu(g) =
   g * sigmoid(g), the sigmoid from e = e^-|g| (never overflows): 1 / (1 + e) for g >= 0, e / (1 + e) below. */
static void silu_mul(const float *gu, float *act, int64_t tokens, int64_t inter) {
    for (int64_t t = 0; t < tokens; t++) {
        const float *g = gu + t * 2 * inter, *u = g + inter;
        float *a = act + t * inter;
        int64_t i = 0;
        for (; i + 8 <= inter; i += 8) {
            __m256 gv = _mm256_loadu_ps(g + i);
            __m256 neg_abs = _mm256_or_ps(gv, _mm256_set1_ps(-0.0f));
            __m256 e = exp_nonpositive(neg_abs);
            __m256 num = _mm256_blendv_ps(_mm256_set1_ps(1.0f), e, gv);  /* sign bit set (g < 0): e */
            __m256 sig = _mm256_div_ps(num, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
            _mm256_storeu_ps(a + i, _mm256_mul_ps(_mm256_mul_ps(gv, sig), _mm256_loadu_ps(u + i)));
        }
        for (; i < inter; i++) {
            float e = expf(-fabsf(g[i])), sig = (g[i] < 0 ? e : 1.0f) / (1.0f + e);
            a[i] = g[i] * sig * u[i];
        }
    }
}

static void add_into(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

/* One decoder layer (Qwen3: q/k norms, no biases) for a decode or verify step, x [T, hidden] updated in place:
   x += o(attend(norm_rope(qkv(rmsnorm(x))))); x += down(silu(gate) * up)(rmsnorm(x)). The kernels above in the
   order the Python layer calls them, with scratch from the caller: h [T, max(hidden, ...)] holds each norm and each
   projection back to the hidden size, qkv [T, (heads + 2 kv_heads) dim], qk [T, heads + kv_heads, dim],
   att [T, heads dim], gu [T, 2 inter], act [T, inter]. */
static void decode_layer(float *x, int64_t tokens, int64_t hidden, int64_t inter, int64_t heads, int64_t kv_heads,
                  int64_t dim, float eps, const float *in_norm, const float *qkv_w, const float *qk_norm,
                  const float *o_w, const float *post_norm, const float *gate_up_w, const float *down_w,
                  const float *cos, const float *sin, float *kc, float *vc, const int64_t *table, int64_t width,
                  const int64_t *first, const int64_t *starts, const int64_t *counts, int64_t seqs, int64_t page,
                  float scale, float *h, float *qkv, float *qk, float *att, float *gu, float *act, int threads, int wide) {
    const int64_t q_width = heads * dim, kv_width = kv_heads * dim, width_qkv = q_width + 2 * kv_width;
    const int64_t qk_width = q_width + kv_width;
    rmsnorm(x, hidden, in_norm, 0, h, tokens, 1, hidden, eps, threads);
    product(h, qkv_w, qkv, tokens, width_qkv, hidden, threads, wide);
    norm_rope(qkv, width_qkv, qk_norm, cos, sin, qk, tokens, heads + kv_heads, dim, eps, threads);
    attend(qk, qk_width, qk + q_width, qk_width, qkv + qk_width, width_qkv, kc, vc, table, width, first, starts,
           counts, seqs, heads, kv_heads, page, dim, scale, att, threads, wide, 1);
    product(att, o_w, h, tokens, hidden, q_width, threads, wide);
    add_into(x, h, tokens * hidden);
    rmsnorm(x, hidden, post_norm, 0, h, tokens, 1, hidden, eps, threads);
    product(h, gate_up_w, gu, tokens, 2 * inter, hidden, threads, wide);
    silu_mul(gu, act, tokens, inter);
    product(act, down_w, h, tokens, hidden, inter, threads, wide);
    add_into(x, h, tokens * hidden);
}

/* Every decoder layer in turn, in one call per forward: layer i reads the seven weights at weights[7 i ..]
   (decode_layer's order, as addresses) and its caches at kc and vc plus i cache_stride; where captures[i] is not
   0, x after layer i is copied there (the hidden states a drafter reads), a token's row every capture_stride floats:
   the captured layers side by side in the rows of one tensor, which the drafter reads without a concatenation. */
void decode_layers(float *x, int64_t tokens, int64_t hidden, int64_t inter, int64_t heads, int64_t kv_heads,
                   int64_t dim, float eps, int64_t layers, const int64_t *weights, const int64_t *captures,
                   int64_t capture_stride, const float *cos, const float *sin, float *kc, float *vc,
                   int64_t cache_stride, const int64_t *table, int64_t width, const int64_t *first,
                   const int64_t *starts, const int64_t *counts, int64_t seqs, int64_t page, float scale, float *h,
                   float *qkv, float *qk, float *att, float *gu, float *act, int threads, int wide) {
    for (int64_t i = 0; i < layers; i++) {
        const int64_t *w = weights + 7 * i;
        decode_layer(x, tokens, hidden, inter, heads, kv_heads, dim, eps, (const float *)(intptr_t)w[0],
                     (const float *)(intptr_t)w[1], (const float *)(intptr_t)w[2], (const float *)(intptr_t)w[3],
                     (const float *)(intptr_t)w[4], (const float *)(intptr_t)w[5], (const float *)(intptr_t)w[6],
                     cos, sin, kc + i * cache_stride, vc + i * cache_stride, table, width, first, starts, counts,
                     seqs, page, scale, h, qkv, qk, att, gu, act, threads, wide);
        if (captures[i])
            for (int64_t t = 0; t < tokens; t++)
                memcpy((float *)(intptr_t)captures[i] + t * capture_stride, x + t * hidden,
                       (size_t)hidden * sizeof(float));
    }
}
