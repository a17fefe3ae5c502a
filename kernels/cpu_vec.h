/* Float vectors for the CPU kernels (cpu_attention.c, cpu_layer.c, cpu_gemv.c).
 *
 * GCC/Clang vector extensions: `vf` is VW floats. 16, one AVX-512 register; on narrower ISAs
 * (NEON) the compiler splits each operation, so the same C runs everywhere. Built for an x86
 * with AVX2 but no AVX-512 (most laptops'), VW is 8, one AVX2 register: split in two, the
 * 16-float code ran the decode attention 2.6 times as long as the AVX-512 build on the same
 * core (311 against 122 us a layer at batch 8), with 8 a float32 decode step at batch 8 / 64
 * took 34.8 / 139.5 ms against 42.8 / 195.1 (kernels built for -march=haswell on a 2-core Zen 4,
 * both builds swapped in one engine). Loads and stores go through memcpy, which compiles to
 * unaligned vector moves. Callers need only lengths that are multiples of 16 (of VW either way).
 */
#ifndef LLMLAB_CPU_VEC_H
#define LLMLAB_CPU_VEC_H

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__AVX2__) && !defined(__AVX512F__)
#define VW 8
#else
#define VW 16
#endif
typedef float vf __attribute__((vector_size(VW * 4)));
typedef int32_t vi __attribute__((vector_size(VW * 4)));

static inline vf vload(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void vstore(float *p, vf v) { memcpy(p, &v, sizeof v); }
static inline vf vsplat(float x) { vf z = {0}; return z + x; }

/* A GEMV reads four rows at a time: four short streams (0.6-6 KB rows in SmolLM2) that the
 * hardware prefetchers pick up late and drop at each 4 KB page's end. So each thread asks for
 * the bytes PREFETCH_AHEAD past the part of its contiguous rows it is reading now: `bytes` from
 * `p` + PREFETCH_AHEAD, called each step with what the step reads. Measured on a 2-core Zen 4,
 * bf16 [3072, 576] GEMVs from memory: 20 GB/s without, 28-40 GB/s with. 64 KB against 8 KB
 * ahead, batch-1 ms/token over 3 rounds: float32 18.7-20.2 vs 20.2-22.9, bf16 11.5-13.5 vs
 * 10.2-16.2, int8 6.3-9.2 vs 5.7-8.1: a wash but for float32, which the farther distance
 * helps. Prefetching past the weights' end is harmless: a hint never faults. */
#define PREFETCH_AHEAD 65536
static inline void prefetch_ahead(const void *p, int64_t bytes) {
    const char *c = (const char *)p + PREFETCH_AHEAD;
    for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(c + i, 0, 3);
}

/* the sum of the VW lanes, as a tree (16 -> 8 -> 4 -> 1) */
static inline float hsum(vf v) {
#if VW == 8 && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12))
    typedef float v4 __attribute__((vector_size(16)));
    v4 b = __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
#elif VW == 16 && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12))
    typedef float v8 __attribute__((vector_size(32)));
    typedef float v4 __attribute__((vector_size(16)));
    v8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7)
         + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    v4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
#else
    float s = 0.0f;
    for (int i = 0; i < VW; i++) s += v[i];
    return s;
#endif
}

/* e^x lane by lane, relative error ~2e-7. x is clamped to [-87, 88] (e^-87 ~ 1.6e-38, so -inf
 * gives a tiny number, not 0: callers mask lanes that must be exactly 0). x = n ln2 + r with
 * |r| <= ln2/2 (adding 1.5 * 2^23 rounds to an integer); e^r by a degree-6 Taylor polynomial;
 * 2^n through the float's exponent bits. */
static inline vf vexp(vf x) {
    const vf lo = vsplat(-87.0f), hi = vsplat(88.0f);
    const vi below = x < lo, above = x > hi;
    x = (vf)((below & (vi)lo) | (~below & (vi)x));
    x = (vf)((above & (vi)hi) | (~above & (vi)x));
    const vf magic = vsplat(12582912.0f);
    const vf n = (x * 1.44269504088896341f + magic) - magic;
    const vf r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
    const vf p = 1.0f + r * (1.0f + r * (0.5f + r * (1.6666667e-1f + r * (4.1666668e-2f
                 + r * (8.3333338e-3f + r * 1.3888889e-3f)))));
    const vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
    return p * (vf)bits;
}

#endif
