/* Batched top-k / top-p sampling on the CPU, one row at a time, with the HF repetition penalty folded in.
 *
 * The distribution is talker/sampler.py's: a row keeps its k largest logits (ties: the lower id), scaled by
 * 1 / temperature; top-p keeps a candidate while the mass of the better ones is below p; the token is drawn by
 * inverse CDF with the row's uniform u. Without top-p the candidates are walked in id order (top-p needs them
 * best first, and then the walk, and so the token, is the torch path's). Greedy rows take the argmax. A row's
 * result depends only on that row, so batch composition never changes it.
 *
 * Selection is branch-light, since the branches of a heap or a quickselect over fresh logits mispredict:
 *   1. split the row into blocks (16 logits each when that makes at least k blocks, else 2k blocks) and take t,
 *      the k-th largest block maximum: at least k logits are >= t, all in the blocks whose maximum reaches t;
 *   2. compact the logits >= t of those blocks (about k of them) without branches;
 *   3. select the k-th largest among them, and keep what beats it, plus ties by id.
 * Both selections are quickselects with a branch-free partition.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float v;
    int64_t id;
} cand;

/* The k-th largest (k >= 1) of v[0..n): a quickselect whose three-way partition is branch-free (each value is
 * written to both ends of the other buffer and only the matching end advances). v and spare (n each) are used. */
static float kth_largest(float *v, int64_t n, int64_t k, float *spare) {
    float *out = spare;
    for (;;) {
        const float a = v[0], b = v[n / 2], c = v[n - 1];
        const float pivot = a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
        int64_t greater = 0, less = 0;
        for (int64_t i = 0; i < n; i++) {
            const float x = v[i];
            out[greater] = x;
            out[n - 1 - less] = x;
            greater += x > pivot;
            less += x < pivot;
        }
        if (k <= greater) {
            n = greater;
        } else if (k <= n - less) {
            return pivot;
        } else {
            k -= n - less;
            out += n - less;
            n = less;
        }
        float *next = v;
        v = out;
        out = next;
    }
}

/* x with the penalty applied to seen ids, into out */
static void penalise(const float *x, const uint8_t *seen, float penalty, int64_t vocab, float *out) {
    for (int64_t i = 0; i < vocab; i++) {
        const float v = x[i];
        const float p = v > 0.0f ? v / penalty : v * penalty;
        out[i] = seen[i] ? p : v;
    }
}

static int64_t argmax(const float *x, int64_t vocab) {
    int64_t best = 0;
    for (int64_t i = 1; i < vocab; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

typedef struct {
    float *vals;   /* [V] */
    float *work;   /* [V] */
    int64_t *ids;  /* [V] */
    float *row;    /* [V] the penalised row */
    float *row_max; /* [V] block maxima, kept */
    float *spare;  /* [V] */
    cand *cands;   /* [V] */
    double *cdf;   /* [V] */
} scratch;

#define LANE 16 /* block size of the fast path: one vector of floats */

static inline float max2(float a, float b) { return a > b ? a : b; }

/* The maximum of 16 floats as a tree of elementwise maxima, which compilers vectorise (a running maximum is a
 * chain of dependent compares). Maxima are exact, so the order does not change the value. */
static inline float max16(const float *x) {
    float m[8];
    for (int j = 0; j < 8; j++) m[j] = max2(x[j], x[j + 8]);
    for (int j = 0; j < 4; j++) m[j] = max2(m[j], m[j + 4]);
    return max2(max2(m[0], m[2]), max2(m[1], m[3]));
}

static float max_of(const float *x, int64_t n) {
    float m = x[0];
    for (int64_t i = 1; i < n; i++) m = max2(x[i], m);
    return m;
}

/* Step 1: a threshold t with at least k logits >= t, the k-th largest of the block maxima. Blocks of LANE
 * logits when that gives at least k blocks (then only the k or so blocks whose maximum reaches t hold
 * candidates), else 2k blocks. The blocks' maxima are kept in s->row_max (the selection reorders s->work and
 * s->spare); their count goes to *nb and their size to *bs. */
static float threshold(const float *x, int64_t vocab, int64_t k, scratch *s, int64_t *nb, int64_t *bs) {
    const int lanes = vocab % LANE == 0 && vocab / LANE >= k;
    const int64_t blocks = lanes ? vocab / LANE : (2 * k <= vocab ? 2 * k : vocab);
    const int64_t size = lanes ? LANE : vocab / blocks;
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t end = b == blocks - 1 ? vocab : (b + 1) * size;
        s->work[b] = s->row_max[b] = lanes ? max16(x + b * size) : max_of(x + b * size, end - b * size);
    }
    *nb = blocks, *bs = size;
    return kth_largest(s->work, blocks, k, s->spare);
}

/* The k best of x (k < vocab) into out[0..k), in id order. */
static int64_t select_top(const float *x, int64_t vocab, int64_t k, scratch *s, cand *out) {
    int64_t blocks, size;
    const float t = threshold(x, vocab, k, s, &blocks, &size);
    /* 2. branchless compaction of x >= t, in the blocks that reach t */
    int64_t n = 0;
    for (int64_t b = 0; b < blocks; b++) {
        if (s->row_max[b] < t) continue;
        const int64_t end = b == blocks - 1 ? vocab : (b + 1) * size;
        for (int64_t i = b * size; i < end; i++) {
            s->ids[n] = i;
            s->vals[n] = x[i];
            n += x[i] >= t;
        }
    }
    /* 3. exact k-th value; ties at it go to the lower ids */
    memcpy(s->work, s->vals, (size_t)n * sizeof(float));
    const float kth = kth_largest(s->work, n, k, s->spare);
    int64_t ties = k;
    for (int64_t r = 0; r < n; r++) ties -= s->vals[r] > kth;
    int64_t m = 0;
    for (int64_t r = 0; r < n && m < k; r++) {
        const float v = s->vals[r];
        if (v > kth || (v == kth && ties-- > 0)) out[m++] = (cand){v, s->ids[r]};
    }
    return m;
}

static int better(const cand *a, const cand *b) { return a->v > b->v || (a->v == b->v && a->id < b->id); }

static int compare(const void *a, const void *b) {
    return better(a, b) ? -1 : (better(b, a) ? 1 : 0);
}

/* Inverse CDF over c[0..k) at temperature temp; with top_p < 1, c is sorted best first and cut first. */
static int64_t pick(cand *c, int64_t k, float temp, float top_p, float u, double *cdf) {
    if (top_p < 1.0f) qsort(c, (size_t)k, sizeof(cand), compare);
    float top = c[0].v;
    for (int64_t r = 1; r < k; r++) top = c[r].v > top ? c[r].v : top;
    const float w0 = top / temp;
    double total = 0.0;
    for (int64_t r = 0; r < k; r++) {
        total += (double)expf(c[r].v / temp - w0);
        cdf[r] = total;
    }
    int64_t kept = k;
    if (top_p < 1.0f) {
        for (int64_t r = 1; r < k; r++) {
            if (cdf[r - 1] / total >= (double)top_p) {
                kept = r;
                break;
            }
        }
    }
    const double target = (double)u * cdf[kept - 1];
    int64_t r = 0;
    while (r < kept - 1 && cdf[r] < target) r++;
    return c[r].id;
}

static int64_t sample_row(const float *x, int64_t vocab, int64_t k, float temp, float top_p, float u, int greedy,
                          scratch *s) {
    if (greedy || k == 1) return argmax(x, vocab);
    int64_t m;
    if (k < vocab) {
        m = select_top(x, vocab, k, s, s->cands);
    } else {
        for (int64_t i = 0; i < vocab; i++) s->cands[i] = (cand){x[i], i};
        m = vocab;
    }
    return pick(s->cands, m, temp, top_p, u, s->cdf);
}

/* logits: [B, V] float32 with rows `row_stride` apart; seen: [B, V] bytes or NULL, with penalty[B];
 * temperature, top_p, u (stride u_stride): [B] float32; top_k: [B] int64; greedy: [B] bytes -> out: [B] int64.
 * Returns 0, or -1 when the scratch cannot be allocated. */
int sample_rows(const float *logits, int64_t batch, int64_t vocab, int64_t row_stride,
                const uint8_t *seen, const float *penalty,
                const float *temperature, const int64_t *top_k, const float *top_p,
                const float *u, int64_t u_stride, const uint8_t *greedy, int64_t *out) {
    scratch s;
    const size_t v = (size_t)vocab;
    void *mem = malloc(v * (5 * sizeof(float) + sizeof(int64_t) + sizeof(cand) + sizeof(double)));
    if (mem == NULL) return -1;
    s.cands = mem;
    s.cdf = (double *)(s.cands + v);
    s.ids = (int64_t *)(s.cdf + v);
    s.vals = (float *)(s.ids + v);
    s.work = s.vals + v;
    s.row = s.work + v;
    s.row_max = s.row + v;
    s.spare = s.row_max + v;
    for (int64_t b = 0; b < batch; b++) {
        const float *x = logits + b * row_stride;
        if (seen != NULL) {
            penalise(x, seen + b * vocab, penalty[b], vocab, s.row);
            x = s.row;
        }
        const int64_t k = top_k[b] < 1 ? 1 : (top_k[b] > vocab ? vocab : top_k[b]);
        out[b] = sample_row(x, vocab, k, temperature[b], top_p[b], u[b * u_stride], greedy[b], &s);
    }
    free(mem);
    return 0;
}
