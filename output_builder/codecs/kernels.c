/* Fused CPU kernels for the 12 Hz codec's upsampling tail, where tensors have few channels and many samples.
 *
 * Tensors are [batch, channels, time] float32 with contiguous time; strides are given in elements.
 * target_clones builds an AVX-512, an AVX2 and a baseline version of each kernel and picks one at load time.
 * -ffast-math lets the vectoriser call glibc's libmvec sinf (4 ulp at most; the codec's inputs are finite).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#define LANES 16  /* time steps per vector */
#define BLOCK 4   /* output channels per register block */

typedef float vec __attribute__((vector_size(LANES * sizeof(float))));
#define LOAD(p) ({ vec v_; memcpy(&v_, (p), sizeof v_); v_; })
#define STORE(p, v) do { vec s_ = (v); memcpy((p), &s_, sizeof s_); } while (0)

/* SnakeBeta: out = x + inv_beta[c] * sin(alpha[c] * x)^2, in one pass instead of torch's four. */
CLONES void snake(const float *x, float *out, const float *alpha, const float *inv_beta,
                  int64_t batch, int64_t channels, int64_t length,
                  int64_t x_sb, int64_t x_sc, int64_t out_sb, int64_t out_sc) {
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t c = 0; c < channels; c++) {
            const float *row = x + b * x_sb + c * x_sc;
            float *dst = out + b * out_sb + c * out_sc;
            const float a = alpha[c], k = inv_beta[c];
#pragma omp simd
            for (int64_t t = 0; t < length; t++) {
                const float s = sinf(a * row[t]);
                dst[t] = row[t] + k * (s * s);
            }
        }
    }
}

/* The first value of output row o at time t: bias, plus the residual when there is one. */
static inline float start(const float *bias, const float *res, int64_t res_sc, int64_t o, int64_t t) {
    return bias[o] + (res ? res[o * res_sc + t] : 0.0f);
}

/* Valid convolution: out[o, t] = bias[o] (+ residual[o, t]) + sum_{c, k} w[o, c, k] * x[c, t + k * dilation].
 * x: [B, Ci, T + (K - 1) * dilation]; w: [Co, Ci, K] contiguous; out, residual: [B, Co, T]; residual may be NULL.
 * A block of BLOCK output channels by LANES time steps stays in registers while every (c, k) tap streams by. */
CLONES void conv(const float *restrict x, const float *restrict w, const float *restrict bias,
                 const float *residual, float *out,
                 int64_t batch, int64_t c_in, int64_t c_out, int64_t taps, int64_t dilation, int64_t length,
                 int64_t x_sb, int64_t x_sc, int64_t res_sb, int64_t res_sc, int64_t out_sb, int64_t out_sc) {
    const int64_t whole = length - length % LANES, row = c_in * taps;
    for (int64_t b = 0; b < batch; b++) {
        const float *xb = x + b * x_sb, *rb = residual ? residual + b * res_sb : NULL;
        float *ob = out + b * out_sb;
        int64_t o0 = 0;
        for (; o0 + BLOCK <= c_out; o0 += BLOCK) {
            for (int64_t t0 = 0; t0 < whole; t0 += LANES) {
                vec acc[BLOCK];
                for (int j = 0; j < BLOCK; j++)
                    acc[j] = rb ? LOAD(rb + (o0 + j) * res_sc + t0) + bias[o0 + j] : (vec){} + bias[o0 + j];
                for (int64_t c = 0; c < c_in; c++) {
                    const float *xs = xb + c * x_sc + t0, *wc = w + o0 * row + c * taps;
                    for (int64_t k = 0; k < taps; k++) {
                        const vec xv = LOAD(xs + k * dilation);
                        for (int j = 0; j < BLOCK; j++) acc[j] += wc[j * row + k] * xv;
                    }
                }
                for (int j = 0; j < BLOCK; j++) STORE(ob + (o0 + j) * out_sc + t0, acc[j]);
            }
        }
        for (; o0 < c_out; o0++) {
            for (int64_t t0 = 0; t0 < whole; t0 += LANES) {
                vec acc = rb ? LOAD(rb + o0 * res_sc + t0) + bias[o0] : (vec){} + bias[o0];
                for (int64_t c = 0; c < c_in; c++) {
                    const float *xs = xb + c * x_sc + t0, *wc = w + o0 * row + c * taps;
                    for (int64_t k = 0; k < taps; k++) acc += wc[k] * LOAD(xs + k * dilation);
                }
                STORE(ob + o0 * out_sc + t0, acc);
            }
        }
        for (int64_t o = 0; o < c_out; o++) {
            for (int64_t t = whole; t < length; t++) {
                float acc = start(bias, rb, res_sc, o, t);
                for (int64_t c = 0; c < c_in; c++)
                    for (int64_t k = 0; k < taps; k++) acc += w[o * row + c * taps + k] * xb[c * x_sc + t + k * dilation];
                ob[o * out_sc + t] = acc;
            }
        }
    }
}
