/* One pass over a dense buffer for all four statistics msprobe records: Max, Min, Mean, Norm (from
   min, max, sum and sum of squares).

   Framework reductions take one pass per statistic (aminmax, sum, dot: three reads of every tensor);
   this reads each element once. Sums accumulate in double (the vector loops: float within short
   blocks, then double), in independent lanes (AVX-512 or AVX2 vectors on x86-64 CPUs that have them,
   chosen at import; a portable loop elsewhere).
   NaN never wins `x < m ? x : m`, so a NaN shows only in the sums: a non-finite sum returns None,
   "use the framework's own reductions" (exact NaN/inf semantics), which keeps this kernel simple.
   Mean and Norm of float32/bfloat16 data are rounded to float32, as the frameworks report them.
   Large buffers are split over a few threads — OpenMP's where the build has it (in a PyTorch
   process that is torch's own pool), else threads started per call; the GIL is released while it
   runs (on large buffers: a small read costs less than the hand-over). `openmp` says which.

   Integer data (token ids, labels, positions) is read as doubles too, exact while every value is
   within +-2^53 (exclusive); Max and Min then come back as ints, Mean and Norm unrounded (as the frameworks
   compute them in float64), and a value beyond that range returns None as a NaN does.

   moments(address, count, kind, threads[, rows, row_stride]) -> (max, min, mean, norm) or None
     address: integer address of `count` contiguous elements of `kind` (0 float32, 1 float64,
              2 bfloat16, 3 int64, 4 int32), or of `rows` such runs `row_stride` elements apart (a
              slice of a wider tensor: one chunk of a fused qkv projection); the caller keeps the
              memory alive and unchanged during the call.
   moments_of_sum(addresses, count, threads) -> the same of the element-wise sum of float32 buffers (a
              tuple of 1 to 8 addresses of `count` elements each), each element added in float32 in
              the order given, as the framework's `a + b + c` makes it: a gradient reached by several
              edges, read without the sum in memory.
   _kernel: a capsule of the same reduction for C callers (moments.h).
   use_vectors(level) -> the previous level: the loop every call runs from now on (0 portable, 1 AVX2,
              2 AVX-512, at most `vectorized`, the widest this CPU runs).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <float.h>
#include <math.h>

#include "moments.h"

#define LANES 8
/* element kinds: float32, float64, bfloat16, int64, int32 (integers from MOMENTS_FIRST_INT on) */
#define KINDS 5
/* integers below this magnitude are exact as doubles: from it on, Max/Min could be off by one */
#define EXACT_INT 9007199254740992.0
#define MAX_THREADS 8
/* buffers moments_of_sum adds at most */
#define MAX_SUMMANDS 8
/* below this many elements per thread, starting a thread costs more than it saves */
#define MIN_PER_THREAD (16 * 1024)
/* from this many elements on the GIL is released during a read */
#define GIL_RELEASE_MIN (64 * 1024)

typedef struct {
    const void *data;
    Py_ssize_t begin, end;
    int kind;
    double mn, mx, sum, sq;
    /* float32 only: buffers added to `data` element by element, in order, before the element is read */
    const float *const *addends;
    int n_addends;
} Part;

/* -- portable version: eight independent lanes per statistic ------------------------------------ */
#define REDUCE(AT)                                                                      \
    do {                                                                                \
        double mn[LANES], mx[LANES], s[LANES], q[LANES];                                \
        double first = AT(p->begin);                                                    \
        for (int j = 0; j < LANES; j++) { mn[j] = mx[j] = first; s[j] = q[j] = 0.0; }  \
        Py_ssize_t i = p->begin;                                                        \
        for (; i + LANES <= p->end; i += LANES) {                                       \
            for (int j = 0; j < LANES; j++) {                                           \
                double v = AT(i + j);                                                   \
                mn[j] = v < mn[j] ? v : mn[j];                                          \
                mx[j] = v > mx[j] ? v : mx[j];                                          \
                s[j] += v;                                                              \
                q[j] += v * v;                                                          \
            }                                                                           \
        }                                                                               \
        for (; i < p->end; i++) {                                                       \
            double v = AT(i);                                                           \
            mn[0] = v < mn[0] ? v : mn[0];                                              \
            mx[0] = v > mx[0] ? v : mx[0];                                              \
            s[0] += v;                                                                  \
            q[0] += v * v;                                                              \
        }                                                                               \
        finish_lanes(p, mn, mx, s, q, LANES);                                           \
    } while (0)

static void finish_lanes(Part *p, const double *mn, const double *mx, const double *s, const double *q,
                         int lanes) {
    double a = mn[0], b = mx[0], ss = 0.0, qq = 0.0;
    for (int j = 0; j < lanes; j++) {
        a = mn[j] < a ? mn[j] : a;
        b = mx[j] > b ? mx[j] : b;
        ss += s[j];
        qq += q[j];
    }
    p->mn = a; p->mx = b; p->sum = ss; p->sq = qq;
}

static inline float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* element i of the sum of x and the addends, in float32 and in order: what the framework's own additions
   of the buffers would hold there */
static inline float sum_at(const float *x, const float *const *more, int k, Py_ssize_t i) {
    float v = x[i];
    for (int j = 0; j < k; j++)
        v += more[j][i];
    return v;
}

#define AT(i) ((double)x[i])
#define BF16_AT(i) ((double)bf16_to_float(x[i]))
#define SUM_AT(i) ((double)sum_at(x, p->addends, p->n_addends, i))

static void reduce_f32(Part *p) { const float *x = p->data; REDUCE(AT); }
static void reduce_f64(Part *p) { const double *x = p->data; REDUCE(AT); }
static void reduce_bf16(Part *p) { const uint16_t *x = p->data; REDUCE(BF16_AT); }
static void reduce_i64(Part *p) { const int64_t *x = p->data; REDUCE(AT); }
static void reduce_i32(Part *p) { const int32_t *x = p->data; REDUCE(AT); }
static void reduce_f32_sum(Part *p) { const float *x = p->data; REDUCE(SUM_AT); }

/* -- x86-64 with AVX2+FMA: 16 floats per step, sums in four double vectors each ------------------- */
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1

/* min/max_ps(v, m) return m when v is NaN: NaN never wins, as in the portable version.
   Sums run in float over blocks of BLOCK elements (8 per lane per block: rounding stays near float
   precision) and each block's sums are widened into double accumulators: converting every element to
   double made the loop compute-bound at about half the speed. */
#define BLOCK 128

#define AVX2_REDUCE(LOAD_SCALAR, LOAD8)                                                 \
    do {                                                                                \
        Py_ssize_t i = p->begin;                                                        \
        __m256 first = _mm256_set1_ps(LOAD_SCALAR(i));                                  \
        __m256 mn0 = first, mn1 = first, mx0 = first, mx1 = first;                      \
        __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;                    \
        __m256d q0 = s0, q1 = s0, q2 = s0, q3 = s0;                                     \
        while (i + 16 <= p->end) {                                                      \
            Py_ssize_t stop = i + BLOCK < p->end ? i + BLOCK : p->end;                  \
            __m256 fs0 = _mm256_setzero_ps(), fs1 = fs0, fq0 = fs0, fq1 = fs0;          \
            for (; i + 16 <= stop; i += 16) {                                           \
                __m256 A = LOAD8(i), B = LOAD8(i + 8);                                  \
                mn0 = _mm256_min_ps(A, mn0); mx0 = _mm256_max_ps(A, mx0);                \
                mn1 = _mm256_min_ps(B, mn1); mx1 = _mm256_max_ps(B, mx1);                \
                fs0 = _mm256_add_ps(fs0, A); fq0 = _mm256_fmadd_ps(A, A, fq0);          \
                fs1 = _mm256_add_ps(fs1, B); fq1 = _mm256_fmadd_ps(B, B, fq1);          \
            }                                                                           \
            s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(fs0)));       \
            s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(fs0, 1)));     \
            s2 = _mm256_add_pd(s2, _mm256_cvtps_pd(_mm256_castps256_ps128(fs1)));       \
            s3 = _mm256_add_pd(s3, _mm256_cvtps_pd(_mm256_extractf128_ps(fs1, 1)));     \
            q0 = _mm256_add_pd(q0, _mm256_cvtps_pd(_mm256_castps256_ps128(fq0)));       \
            q1 = _mm256_add_pd(q1, _mm256_cvtps_pd(_mm256_extractf128_ps(fq0, 1)));     \
            q2 = _mm256_add_pd(q2, _mm256_cvtps_pd(_mm256_castps256_ps128(fq1)));       \
            q3 = _mm256_add_pd(q3, _mm256_cvtps_pd(_mm256_extractf128_ps(fq1, 1)));     \
        }                                                                               \
        float fmn[16], fmx[16];                                                         \
        double ds[16], dq[16], mn[16], mx[16];                                          \
        _mm256_storeu_ps(fmn, mn0); _mm256_storeu_ps(fmn + 8, mn1);                     \
        _mm256_storeu_ps(fmx, mx0); _mm256_storeu_ps(fmx + 8, mx1);                     \
        _mm256_storeu_pd(ds, s0); _mm256_storeu_pd(ds + 4, s1);                         \
        _mm256_storeu_pd(ds + 8, s2); _mm256_storeu_pd(ds + 12, s3);                    \
        _mm256_storeu_pd(dq, q0); _mm256_storeu_pd(dq + 4, q1);                         \
        _mm256_storeu_pd(dq + 8, q2); _mm256_storeu_pd(dq + 12, q3);                    \
        for (int j = 0; j < 16; j++) { mn[j] = fmn[j]; mx[j] = fmx[j]; }                \
        for (; i < p->end; i++) {                                                       \
            double v = LOAD_SCALAR(i);                                                  \
            mn[0] = v < mn[0] ? v : mn[0];                                              \
            mx[0] = v > mx[0] ? v : mx[0];                                              \
            ds[0] += v;                                                                 \
            dq[0] += v * v;                                                             \
        }                                                                               \
        finish_lanes(p, mn, mx, ds, dq, 16);                                            \
    } while (0)

__attribute__((target("avx2,fma"))) static void reduce_f32_avx2(Part *p) {
    const float *x = (const float *)p->data;
#define F32_SCALAR(i) (x[i])
#define F32_LOAD8(i) _mm256_loadu_ps(x + (i))
    AVX2_REDUCE(F32_SCALAR, F32_LOAD8);
}

__attribute__((target("avx2,fma"))) static inline __m256 sum_load8(const float *x, const float *const *more, int k,
                                                                  Py_ssize_t i) {
    __m256 v = _mm256_loadu_ps(x + i);
    for (int j = 0; j < k; j++)
        v = _mm256_add_ps(v, _mm256_loadu_ps(more[j] + i));
    return v;
}

__attribute__((target("avx2,fma"))) static void reduce_f32_sum_avx2(Part *p) {
    const float *x = (const float *)p->data;
    const float *const *more = p->addends;
    int k = p->n_addends;
#define SUM_SCALAR(i) sum_at(x, more, k, i)
#define SUM_LOAD8(i) sum_load8(x, more, k, i)
    AVX2_REDUCE(SUM_SCALAR, SUM_LOAD8);
}

__attribute__((target("avx2,fma"))) static void reduce_bf16_avx2(Part *p) {
    const uint16_t *x = (const uint16_t *)p->data;
#define BF16_SCALAR(i) bf16_to_float(x[i])
#define BF16_LOAD8(i) _mm256_castsi256_ps(_mm256_slli_epi32(                                    \
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + (i)))), 16))
    AVX2_REDUCE(BF16_SCALAR, BF16_LOAD8);
}

/* float64: no float blocks (the sums are double already); two vectors of W doubles a step, P the intrinsics'
   prefix (_mm256 or _mm512) and V their vector type */
#define F64_REDUCE(V, P, W)                                                             \
    do {                                                                                \
        const double *x = (const double *)p->data;                                      \
        Py_ssize_t i = p->begin;                                                        \
        V first = P##_set1_pd(x[i]);                                                    \
        V mn0 = first, mn1 = first, mx0 = first, mx1 = first;                           \
        V s0 = P##_setzero_pd(), s1 = s0, q0 = s0, q1 = s0;                             \
        for (; i + 2 * (W) <= p->end; i += 2 * (W)) {                                   \
            V a = P##_loadu_pd(x + i), b = P##_loadu_pd(x + i + (W));                   \
            mn0 = P##_min_pd(a, mn0); mx0 = P##_max_pd(a, mx0);                         \
            mn1 = P##_min_pd(b, mn1); mx1 = P##_max_pd(b, mx1);                         \
            s0 = P##_add_pd(s0, a); q0 = P##_fmadd_pd(a, a, q0);                        \
            s1 = P##_add_pd(s1, b); q1 = P##_fmadd_pd(b, b, q1);                        \
        }                                                                               \
        double mn[2 * (W)], mx[2 * (W)], ds[2 * (W)], dq[2 * (W)];                      \
        P##_storeu_pd(mn, mn0); P##_storeu_pd(mn + (W), mn1);                           \
        P##_storeu_pd(mx, mx0); P##_storeu_pd(mx + (W), mx1);                           \
        P##_storeu_pd(ds, s0); P##_storeu_pd(ds + (W), s1);                             \
        P##_storeu_pd(dq, q0); P##_storeu_pd(dq + (W), q1);                             \
        for (; i < p->end; i++) {                                                       \
            double v = x[i];                                                            \
            mn[0] = v < mn[0] ? v : mn[0];                                              \
            mx[0] = v > mx[0] ? v : mx[0];                                              \
            ds[0] += v;                                                                 \
            dq[0] += v * v;                                                             \
        }                                                                               \
        finish_lanes(p, mn, mx, ds, dq, 2 * (W));                                       \
    } while (0)

__attribute__((target("avx2,fma"))) static void reduce_f64_avx2(Part *p) {
    F64_REDUCE(__m256d, _mm256, 4);
}

/* -- x86-64 with AVX-512F: the same reduction on 64 floats per step, four accumulators per statistic ----
   The AVX2 loop is bound by its four vector ops per 8 elements (two ports), not by memory, on tensors
   that are still in cache (the activation just written): 512-bit vectors do twice the elements per op.
   BLOCK512 keeps 8 elements per lane per float block, as BLOCK does. */
#define BLOCK512 512
/* below this many elements the AVX2 loop is the faster: the wide loop's setup and 64-lane finish cost more
   than its steps save (about 100 ns) */
#define WIDE_MIN 8192
#define HI256(v) _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))

#define AVX512_REDUCE(LOAD_SCALAR, LOAD16)                                              \
    do {                                                                                \
        Py_ssize_t i = p->begin;                                                        \
        __m512 first = _mm512_set1_ps(LOAD_SCALAR(i));                                  \
        __m512 mn[4] = {first, first, first, first}, mx[4] = {first, first, first, first}; \
        __m512d s[8], q[8];                                                             \
        for (int j = 0; j < 8; j++) { s[j] = _mm512_setzero_pd(); q[j] = s[j]; }        \
        while (i + 64 <= p->end) {                                                      \
            Py_ssize_t stop = i + BLOCK512 < p->end ? i + BLOCK512 : p->end;            \
            __m512 fs[4], fq[4];                                                        \
            for (int j = 0; j < 4; j++) { fs[j] = _mm512_setzero_ps(); fq[j] = fs[j]; } \
            for (; i + 64 <= stop; i += 64) {                                           \
                for (int j = 0; j < 4; j++) {                                           \
                    __m512 A = LOAD16(i + 16 * j);                                      \
                    mn[j] = _mm512_min_ps(A, mn[j]); mx[j] = _mm512_max_ps(A, mx[j]);   \
                    fs[j] = _mm512_add_ps(fs[j], A); fq[j] = _mm512_fmadd_ps(A, A, fq[j]); \
                }                                                                       \
            }                                                                           \
            for (int j = 0; j < 4; j++) {                                               \
                s[2 * j] = _mm512_add_pd(s[2 * j], _mm512_cvtps_pd(_mm512_castps512_ps256(fs[j]))); \
                s[2 * j + 1] = _mm512_add_pd(s[2 * j + 1], _mm512_cvtps_pd(HI256(fs[j])));           \
                q[2 * j] = _mm512_add_pd(q[2 * j], _mm512_cvtps_pd(_mm512_castps512_ps256(fq[j]))); \
                q[2 * j + 1] = _mm512_add_pd(q[2 * j + 1], _mm512_cvtps_pd(HI256(fq[j])));           \
            }                                                                           \
        }                                                                               \
        float fmn[64], fmx[64];                                                         \
        double ds[64], dq[64], dmn[64], dmx[64];                                        \
        for (int j = 0; j < 4; j++) {                                                   \
            _mm512_storeu_ps(fmn + 16 * j, mn[j]); _mm512_storeu_ps(fmx + 16 * j, mx[j]); \
        }                                                                               \
        for (int j = 0; j < 8; j++) {                                                   \
            _mm512_storeu_pd(ds + 8 * j, s[j]); _mm512_storeu_pd(dq + 8 * j, q[j]);     \
        }                                                                               \
        for (int j = 0; j < 64; j++) { dmn[j] = fmn[j]; dmx[j] = fmx[j]; }              \
        for (; i < p->end; i++) {                                                       \
            double v = LOAD_SCALAR(i);                                                  \
            dmn[0] = v < dmn[0] ? v : dmn[0];                                           \
            dmx[0] = v > dmx[0] ? v : dmx[0];                                           \
            ds[0] += v;                                                                 \
            dq[0] += v * v;                                                             \
        }                                                                               \
        finish_lanes(p, dmn, dmx, ds, dq, 64);                                          \
    } while (0)

__attribute__((target("avx512f"))) static void reduce_f32_avx512(Part *p) {
    const float *x = (const float *)p->data;
#define F32_LOAD16(i) _mm512_loadu_ps(x + (i))
    AVX512_REDUCE(F32_SCALAR, F32_LOAD16);
}

__attribute__((target("avx512f"))) static inline __m512 sum_load16(const float *x, const float *const *more, int k,
                                                                 Py_ssize_t i) {
    __m512 v = _mm512_loadu_ps(x + i);
    for (int j = 0; j < k; j++)
        v = _mm512_add_ps(v, _mm512_loadu_ps(more[j] + i));
    return v;
}

__attribute__((target("avx512f"))) static void reduce_f32_sum_avx512(Part *p) {
    const float *x = (const float *)p->data;
    const float *const *more = p->addends;
    int k = p->n_addends;
#define SUM_LOAD16(i) sum_load16(x, more, k, i)
    AVX512_REDUCE(SUM_SCALAR, SUM_LOAD16);
}

__attribute__((target("avx512f"))) static void reduce_bf16_avx512(Part *p) {
    const uint16_t *x = (const uint16_t *)p->data;
#define BF16_LOAD16(i) _mm512_castsi512_ps(_mm512_slli_epi32(                                   \
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(x + (i)))), 16))
    AVX512_REDUCE(BF16_SCALAR, BF16_LOAD16);
}

__attribute__((target("avx512f"))) static void reduce_f64_avx512(Part *p) {
    F64_REDUCE(__m512d, _mm512, 8);
}
#endif

/* the widest loop this CPU runs: 0 portable, 1 AVX2+FMA, 2 AVX-512F, on buffers of WIDE_MIN elements or more
   (chosen at import; `use_vectors` sets it) */
static int use_vectors = 0;
static int best_vectors = 0;

static void reduce_range(Part *p) {
    if (p->n_addends > 0) {  /* (float32 only) */
#ifdef HAVE_AVX2_PATH
        if (use_vectors == 2 && p->end - p->begin >= WIDE_MIN) {
            reduce_f32_sum_avx512(p);
            return;
        }
        if (use_vectors >= 1) {
            reduce_f32_sum_avx2(p);
            return;
        }
#endif
        reduce_f32_sum(p);
        return;
    }
#ifdef HAVE_AVX2_PATH
    if (use_vectors == 2 && p->end - p->begin >= WIDE_MIN) {
        switch (p->kind) {
        case 0: reduce_f32_avx512(p); return;
        case 1: reduce_f64_avx512(p); return;
        case 2: reduce_bf16_avx512(p); return;
        default: break;
        }
    }
    if (use_vectors >= 1) {
        switch (p->kind) {
        case 0: reduce_f32_avx2(p); return;
        case 1: reduce_f64_avx2(p); return;
        case 2: reduce_bf16_avx2(p); return;
        default: break;  /* integers: the portable loop (they are few and small) */
        }
    }
#endif
    switch (p->kind) {
    case 0: reduce_f32(p); break;
    case 1: reduce_f64(p); break;
    case 2: reduce_bf16(p); break;
    case 3: reduce_i64(p); break;
    default: reduce_i32(p); break;
    }
}

/* One thread's share: columns [c0, c1) of rows [r0, r1) of a row-strided layout. */
typedef struct {
    const char *base;
    Py_ssize_t r0, r1, c0, c1, stride_bytes;
    int kind;
    const float *const *addends;
    int n_addends;
    Part total;
} Job;

static void *run_job(void *arg) {
    Job *job = (Job *)arg;
    for (Py_ssize_t r = job->r0; r < job->r1; r++) {
        Part p = {.data = job->base + r * job->stride_bytes, .begin = job->c0, .end = job->c1, .kind = job->kind,
                  .addends = job->addends, .n_addends = job->n_addends};
        reduce_range(&p);
        if (r == job->r0) {
            job->total = p;
        } else {
            Part *t = &job->total;
            t->mn = p.mn < t->mn ? p.mn : t->mn;
            t->mx = p.mx > t->mx ? p.mx : t->mx;
            t->sum += p.sum;
            t->sq += p.sq;
        }
    }
    return NULL;
}

static const int ITEM_SIZE[KINDS] = {4, 8, 2, 8, 4};

/* The reduction itself, for this module's `moments` and, through the capsule `_kernel`, other
   extensions (msprobe._record) that call it without a Python round. Arguments checked by the caller.
   out: max, min, mean, norm. Returns 0 when a sum is not finite (a NaN or inf is in there), or an
   integer is beyond +-2^53: the caller's framework reduces it. */
static int reduce_all(const void *address, const float *const *addends, int n_addends, Py_ssize_t count,
                      int kind, long threads, Py_ssize_t rows, Py_ssize_t row_stride, double out[4]) {
    Py_ssize_t total = count * rows;
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    if (threads > total / MIN_PER_THREAD)
        threads = total / MIN_PER_THREAD;
    if (threads < 1)
        threads = 1;

    /* split rows between threads when there are enough of them, else the columns of every row */
    Job jobs[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    int by_rows = rows >= threads;
    Py_ssize_t span = by_rows ? rows : count, chunk = (span + threads - 1) / threads;
    for (long t = 0; t < threads; t++) {
        Py_ssize_t lo = t * chunk, hi = (t + 1) * chunk < span ? (t + 1) * chunk : span;
        Job *j = &jobs[t];
        j->base = (const char *)address;
        j->stride_bytes = row_stride * ITEM_SIZE[kind];
        j->kind = kind;
        j->addends = addends;
        j->n_addends = n_addends;
        j->r0 = by_rows ? lo : 0;
        j->r1 = by_rows ? hi : rows;
        j->c0 = by_rows ? 0 : lo;
        j->c1 = by_rows ? count : hi;
    }
    /* a small read takes less time than handing the GIL over (the flusher's thread would take it) */
    PyThreadState *released = total >= GIL_RELEASE_MIN ? PyEval_SaveThread() : NULL;
#ifdef _OPENMP
    /* OpenMP's team, not threads of our own: in a PyTorch process this is torch's own libgomp pool,
       whose workers are still spinning from the op that made the tensor and take their share at once */
    if (threads > 1) {
        #pragma omp parallel for num_threads(threads) schedule(static, 1)
        for (long t = 0; t < threads; t++)
            run_job(&jobs[t]);
    } else {
        run_job(&jobs[0]);
    }
#else
    for (long t = 1; t < threads; t++)
        started[t] = pthread_create(&ids[t], NULL, run_job, &jobs[t]) == 0;
    run_job(&jobs[0]);
    for (long t = 1; t < threads; t++) {
        if (started[t])
            pthread_join(ids[t], NULL);
        else
            run_job(&jobs[t]);  /* no thread to be had: do its share here */
    }
#endif
    if (released != NULL)
        PyEval_RestoreThread(released);

    double mn = jobs[0].total.mn, mx = jobs[0].total.mx, sum = 0.0, sq = 0.0;
    for (long t = 0; t < threads; t++) {
        mn = jobs[t].total.mn < mn ? jobs[t].total.mn : mn;
        mx = jobs[t].total.mx > mx ? jobs[t].total.mx : mx;
        sum += jobs[t].total.sum;
        sq += jobs[t].total.sq;
    }
    if (!isfinite(sum) || !isfinite(sq))
        return 0;  /* a NaN or inf is in there: the caller's framework says how it shows */
    if (kind >= MOMENTS_FIRST_INT && (mx >= EXACT_INT || mn <= -EXACT_INT))
        return 0;
    double mean = sum / (double)total, norm = sqrt(sq);
    if (kind == 0 || kind == 2) {
        /* float32/bfloat16 data: Mean and Norm at float32 precision, as the frameworks' own
           reductions report them (digits below are rounding noise); beyond float32's range the
           double is kept (the framework would say inf) */
        if (fabs(mean) <= FLT_MAX)
            mean = (double)(float)mean;
        if (norm <= FLT_MAX)
            norm = (double)(float)norm;
    }
    out[0] = mx; out[1] = mn; out[2] = mean; out[3] = norm;
    return 1;
}

static int compute(const void *address, Py_ssize_t count, int kind, long threads, Py_ssize_t rows,
                   Py_ssize_t row_stride, double out[4]) {
    return reduce_all(address, NULL, 0, count, kind, threads, rows, row_stride, out);
}

static PyObject *moments(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 && nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "moments(address, count, kind, threads[, rows, row_stride])");
        return NULL;
    }
    uintptr_t address = (uintptr_t)PyLong_AsUnsignedLongLong(args[0]);
    Py_ssize_t count = PyLong_AsSsize_t(args[1]);
    long kind = PyLong_AsLong(args[2]);
    long threads = PyLong_AsLong(args[3]);
    Py_ssize_t rows = nargs == 6 ? PyLong_AsSsize_t(args[4]) : 1;
    Py_ssize_t row_stride = nargs == 6 ? PyLong_AsSsize_t(args[5]) : count;
    if (PyErr_Occurred())
        return NULL;
    if (count <= 0 || rows <= 0 || row_stride < count || address == 0 || kind < 0 || kind >= KINDS) {
        PyErr_Format(PyExc_ValueError, "moments: count and rows must be > 0, row_stride >= count, address "
                     "non-zero and kind 0..%d (got count=%zd, rows=%zd, row_stride=%zd, kind=%ld)",
                     KINDS - 1, count, rows, row_stride, kind);
        return NULL;
    }
    double out[4];
    if (!compute((const void *)address, count, (int)kind, threads, rows, row_stride, out))
        Py_RETURN_NONE;
    if (kind >= MOMENTS_FIRST_INT)  /* an integer tensor's Max and Min are ints */
        return Py_BuildValue("(LLdd)", (long long)out[0], (long long)out[1], out[2], out[3]);
    return Py_BuildValue("(dddd)", out[0], out[1], out[2], out[3]);
}

/* moments_of_sum(addresses, count, threads): moments of the float32 buffers' element-wise sum, added in
   the order given (the framework's `a + b + c`), without the sum in memory */
static PyObject *moments_of_sum(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyTuple_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "moments_of_sum(addresses: tuple, count, threads)");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(args[0]);
    Py_ssize_t count = PyLong_AsSsize_t(args[1]);
    long threads = PyLong_AsLong(args[2]);
    if (PyErr_Occurred())
        return NULL;
    if (n < 1 || n > MAX_SUMMANDS || count <= 0) {
        PyErr_Format(PyExc_ValueError, "moments_of_sum: 1..%d addresses and count > 0 (got %zd addresses, "
                     "count=%zd)", MAX_SUMMANDS, n, count);
        return NULL;
    }
    const float *buffers[MAX_SUMMANDS];
    for (Py_ssize_t i = 0; i < n; i++) {
        buffers[i] = (const float *)(uintptr_t)PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(args[0], i));
        if (PyErr_Occurred())
            return NULL;
        if (buffers[i] == NULL) {
            PyErr_SetString(PyExc_ValueError, "moments_of_sum: an address is zero");
            return NULL;
        }
    }
    double out[4];
    if (!reduce_all(buffers[0], buffers + 1, (int)n - 1, count, 0, threads, 1, count, out))
        Py_RETURN_NONE;
    return Py_BuildValue("(dddd)", out[0], out[1], out[2], out[3]);
}

/* use_vectors(level) -> the previous level: run the loop of `level` (0 portable, 1 AVX2, 2 AVX-512) from
   now on, in this process (tests check each loop against the others; benchmarks compare them) */
static PyObject *set_vectors(PyObject *self, PyObject *arg) {
    long level = PyLong_AsLong(arg);
    if (level == -1 && PyErr_Occurred())
        return NULL;
    if (level < 0 || level > best_vectors) {
        PyErr_Format(PyExc_ValueError, "use_vectors: level must be 0..%d on this CPU (got %ld)", best_vectors,
                     level);
        return NULL;
    }
    int previous = use_vectors;
    use_vectors = (int)level;
    return PyLong_FromLong(previous);
}

static PyMethodDef methods[] = {
    {"use_vectors", set_vectors, METH_O,
     "use_vectors(level) -> previous level: 0 portable loop, 1 AVX2, 2 AVX-512 (at most `vectorized`)."},
    {"moments", (PyCFunction)(void (*)(void))moments, METH_FASTCALL,
     "moments(address, count, kind, threads[, rows, row_stride]) -> (max, min, mean, norm), None if not finite."},
    {"moments_of_sum", (PyCFunction)(void (*)(void))moments_of_sum, METH_FASTCALL,
     "moments_of_sum(addresses, count, threads) -> moments of the float32 buffers' element-wise sum, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_moments", NULL, -1, methods};

PyMODINIT_FUNC PyInit__moments(void) {
#ifdef HAVE_AVX2_PATH
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        best_vectors = __builtin_cpu_supports("avx512f") ? 2 : 1;
#endif
    use_vectors = best_vectors;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    static moments_kernel kernel = compute;  /* the capsule holds the address of this pointer */
    PyObject *capsule = PyCapsule_New((void *)&kernel, MOMENTS_CAPSULE, NULL);
    if (capsule == NULL || PyModule_AddObject(m, "_kernel", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return NULL;
    }
#ifdef _OPENMP
    const int openmp = 1;
#else
    const int openmp = 0;
#endif
    if (PyModule_AddIntConstant(m, "vectorized", best_vectors) < 0
        || PyModule_AddIntConstant(m, "openmp", openmp) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
