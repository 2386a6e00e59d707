/* The fp32 kernels of a decode or verify step on CPU: products of a few rows by a weight, and RMS norms.

rowdot: y[r, j] = sum_k x[r, k] * w[j, k] for x [rows, in] and w [out, in], both row-major. Why: a decode step multiplies one to a few rows by every weight, and the product is bound by reading the
weight; MKL's few-row products read it at about half the speed two cores stream memory on this kind of host.
Every dot here is summed in one fixed order (four 8-lane accumulators over k in chunks of 32, then eight lanes
at a time, then the lanes, then a scalar tail), whatever the row count: a row's products are bitwise the same
alone or among others, so verifying k tokens gives the products decoding them one at a time would.

rmsnorm: one call instead of torch's six operations per norm (about 19 norms a step in a small model). */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

static inline float lanes(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

static float dot(const float *x, const float *w, int64_t in) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t k = 0;
    for (; k + 32 <= in; k += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), _mm256_loadu_ps(w + k), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), _mm256_loadu_ps(w + k + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 16), _mm256_loadu_ps(w + k + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 24), _mm256_loadu_ps(w + k + 24), a3);
    }
    for (; k + 8 <= in; k += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), _mm256_loadu_ps(w + k), a0);
    float s = lanes(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; k < in; k++) s += x[k] * w[k];
    return s;
}

/* Two outputs of one row sharing the row's loads; each sum in exactly `dot`'s order. */
static void dot2(const float *x, const float *w, int64_t in, float *y) {
    const float *v = w + in;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    int64_t k = 0;
    for (; k + 32 <= in; k += 32) {
        __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
        __m256 x2 = _mm256_loadu_ps(x + k + 16), x3 = _mm256_loadu_ps(x + k + 24);
        a0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w + k), a0);
        a1 = _mm256_fmadd_ps(x1, _mm256_loadu_ps(w + k + 8), a1);
        a2 = _mm256_fmadd_ps(x2, _mm256_loadu_ps(w + k + 16), a2);
        a3 = _mm256_fmadd_ps(x3, _mm256_loadu_ps(w + k + 24), a3);
        b0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(v + k), b0);
        b1 = _mm256_fmadd_ps(x1, _mm256_loadu_ps(v + k + 8), b1);
        b2 = _mm256_fmadd_ps(x2, _mm256_loadu_ps(v + k + 16), b2);
        b3 = _mm256_fmadd_ps(x3, _mm256_loadu_ps(v + k + 24), b3);
    }
    for (; k + 8 <= in; k += 8) {
        __m256 x0 = _mm256_loadu_ps(x + k);
        a0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w + k), a0);
        b0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(v + k), b0);
    }
    float s = lanes(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    float t = lanes(_mm256_add_ps(_mm256_add_ps(b0, b1), _mm256_add_ps(b2, b3)));
    for (; k < in; k++) {
        s += x[k] * w[k];
        t += x[k] * v[k];
    }
    y[0] = s;
    y[1] = t;
}

/* One or two rows stream the weight a row at a time (bandwidth-bound); more rows take the weight two rows at a
   time and multiply every input row by them while they sit in L1, fetching the next two rows meanwhile (the
   hardware's prefetcher alone left the product below the bandwidth at 4 to 16 rows). */
void rowdot(const float *x, const float *w, float *y, int64_t rows, int64_t out, int64_t in, int threads) {
    if (rows <= 2) {
        #pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t j = 0; j < out; j++)
            for (int64_t r = 0; r < rows; r++) y[r * out + j] = dot(x + r * in, w + j * in, in);
        return;
    }
    int64_t pairs = out / 2;
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < pairs; p++) {
        if (p + 1 < pairs) {
            const char *next = (const char *)(w + 2 * (p + 1) * in);
            for (int64_t b = 0; b < 2 * in * (int64_t)sizeof(float); b += 64) _mm_prefetch(next + b, _MM_HINT_T0);
        }
        for (int64_t r = 0; r < rows; r++) dot2(x + r * in, w + 2 * p * in, in, y + r * out + 2 * p);
    }
    if (out % 2)
        for (int64_t r = 0; r < rows; r++) y[r * out + out - 1] = dot(x + r * in, w + (out - 1) * in, in);
}

/* y[t, h, :] = x[t, h, :] / sqrt(mean(x[t, h, :]^2) + eps) * w[h, :] for x [T, H, D] whose rows lie `stride` floats
   apart (q and k are a slice of the joined q/k/v product), y contiguous, w [H, D] (w_stride D) or one row for all
   heads (w_stride 0). The squares are summed in 8 lanes, then the lanes, then a scalar tail, for every row alike. */
void rmsnorm(const float *x, int64_t stride, const float *w, int64_t w_stride, float *y, int64_t tokens,
             int64_t heads, int64_t dim, float eps, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads) if (tokens * heads * dim >= 65536)
    for (int64_t r = 0; r < tokens * heads; r++) {
        int64_t t = r / heads, h = r % heads;
        const float *xr = x + t * stride + h * dim, *wr = w + h * w_stride;
        float *yr = y + r * dim;
        __m256 acc = _mm256_setzero_ps();
        int64_t k = 0;
        for (; k + 8 <= dim; k += 8) {
            __m256 v = _mm256_loadu_ps(xr + k);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        float ss = lanes(acc);
        for (; k < dim; k++) ss += xr[k] * xr[k];
        float inv = 1.0f / sqrtf(ss / (float)dim + eps);
        __m256 iv = _mm256_set1_ps(inv);
        for (k = 0; k + 8 <= dim; k += 8)
            _mm256_storeu_ps(yr + k, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + k), iv), _mm256_loadu_ps(wr + k)));
        for (; k < dim; k++) yr[k] = xr[k] * inv * wr[k];
    }
}
