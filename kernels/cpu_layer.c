/* The elementwise steps of a decoder layer for the CPU, one call each instead of 5-15 PyTorch ops.
 *
 * At batch 1 a layer's matmuls stream ~14 MB of weights in ~0.4 ms; the norms, the rotary
 * embedding and the SwiGLU product are tiny, but as PyTorch code they are ~60 separate operator
 * calls per layer, each with a few microseconds of dispatch: together a quarter of the step.
 * vLLM has custom ops for exactly these (rms_norm, fused_add_rms_norm, rotary_embedding,
 * silu_and_mul); these are ours. Same math as llmlab/model.py; float32; rows may be strided
 * (they are often views of a stacked matmul output), each row's elements contiguous.
 * Built with the other CPU kernels into one library (llmlab/ops/cpu_library.py).
 *
 * At the end, `llmlab_decode_layers`: a step's decoder layers for one token in one call, what a
 * batch-1 decode step runs (see there); and `llmlab_decode_steps`: several greedy tokens of one
 * sequence in one call, those layers with the embedding, final norm, LM head and argmax around
 * them (multi-step scheduling).
 */
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

#include "cpu_kernels.h"
#include "cpu_vec.h"

/* One row of RMSNorm: out = src / sqrt(mean(src^2) + eps) * weight, src = x (+ residual, then
 * also written to sum_out). */
static inline void norm_row(const float *x, const float *residual, const float *weight,
                            float *sum_out, float *out, int64_t D, float eps) {
    const float *src = x;
    if (residual) {
        for (int64_t d = 0; d < D; d += VW) vstore(sum_out + d, vload(x + d) + vload(residual + d));
        src = sum_out;
    }
    vf sq = {0};
    for (int64_t d = 0; d < D; d += VW) {
        const vf v = vload(src + d);
        sq += v * v;
    }
    float total = 0.0f;
    for (int i = 0; i < VW; i++) total += sq[i];
    const float r = 1.0f / sqrtf(total / (float)D + eps);
    for (int64_t d = 0; d < D; d += VW) vstore(out + d, vload(weight + d) * (vload(src + d) * r));
}

/* out[t] = (x[t] (+ residual[t])) / sqrt(mean((x[t] (+ residual[t]))^2) + eps) * weight.
 * With `residual`, the sum x + residual is also written to `sum_out` (the residual stream the
 * next layer reads). Rows: x every x_stride floats, residual every res_stride, out and sum_out
 * contiguous [T, D]. D % 16 == 0 (checked by the caller). */
void llmlab_rms_norm(const float *x, int64_t x_stride, const float *residual, int64_t res_stride,
                     const float *weight, float *sum_out, float *out, int64_t T, int64_t D,
                     float eps) {
#pragma omp parallel for schedule(static) if (T > 16)
    for (int64_t t = 0; t < T; t++)
        norm_row(x + t * x_stride, residual ? residual + t * res_stride : NULL, weight,
                 residual ? sum_out + t * D : NULL, out + t * D, D, eps);
}

/* out[i] = silu(gate[i]) * up[i] for i < n (n % 16 == 0), silu(g) = g / (1 + e^-g). */
static inline void silu_mul_row(const float *g, const float *u, float *o, int64_t n) {
    for (int64_t i = 0; i < n; i += VW) {
        const vf gv = vload(g + i);
        vstore(o + i, gv / (1.0f + vexp(-gv)) * vload(u + i));
    }
}

/* out[t] = silu(gate[t]) * up[t]; gate rows every gate_stride floats, up rows every up_stride,
 * out contiguous [T, I]; I % 16 == 0. */
void llmlab_silu_mul(const float *gate, int64_t gate_stride, const float *up, int64_t up_stride,
                     float *out, int64_t T, int64_t I) {
#pragma omp parallel for schedule(static) if (T * I > 65536)
    for (int64_t t = 0; t < T; t++)
        silu_mul_row(gate + t * gate_stride, up + t * up_stride, out + t * I, I);
}

/* One token's rotary embedding over `heads` heads of size D: x [heads, D] contiguous,
 * cos, sin [D/2], out [heads, D]. */
static inline void rope_row(const float *x, const float *c, const float *s, float *out,
                            int64_t heads, int64_t D) {
    const int64_t half = D / 2;
    for (int64_t h = 0; h < heads; h++) {
        const float *xr = x + h * D;
        float *o = out + h * D;
        int64_t i = 0;
        for (; i + VW <= half; i += VW) {
            const vf x1 = vload(xr + i), x2 = vload(xr + half + i);
            const vf cv = vload(c + i), sv = vload(s + i);
            vstore(o + i, x1 * cv - x2 * sv);
            vstore(o + half + i, x2 * cv + x1 * sv);
        }
        for (; i < half; i++) {
            const float x1 = xr[i], x2 = xr[half + i];
            o[i] = x1 * c[i] - x2 * s[i];
            o[half + i] = x2 * c[i] + x1 * s[i];
        }
    }
}

/* Rotary embedding, Hugging Face's "rotate half" layout: for each head, the pairs
 * (x_i, x_{i+D/2}) turn by the angle whose cos/sin are cos[t, i], sin[t, i]:
 *   out_i = x_i cos - x_{i+D/2} sin,   out_{i+D/2} = x_{i+D/2} cos + x_i sin.
 * x: [T, heads, D] with token stride x_stride (heads contiguous); cos, sin: [T, D/2]
 * contiguous; out: contiguous [T, heads, D]. D/2 % 16 == 0 or D/2 < 16 (then scalar). */
void llmlab_rope(const float *x, int64_t x_stride, const float *cos, const float *sin,
                 float *out, int64_t T, int64_t heads, int64_t D) {
#pragma omp parallel for schedule(static) if (T * heads > 512)
    for (int64_t t = 0; t < T; t++)
        rope_row(x + t * x_stride, cos + t * (D / 2), sin + t * (D / 2), out + t * heads * D,
                 heads, D);
}

/* Seconds per phase of llmlab_decode_layers (LAYER_PHASES of llmlab/ops/cpu_decode.py), added
 * into `seconds` while it is set, NULL to stop: how `bench decode_profile` splits a layer. The
 * calling thread (OpenMP's master) reads the clock after each barrier; off, a test per phase. */
static double *phase_seconds = NULL;

void llmlab_time_layer_phases(double *seconds) { phase_seconds = seconds; }

static inline double wall_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A barrier whose threads spin while they wait. Inside the fused layer every thread is back
 * within microseconds (a phase is a few to a hundred microseconds long), so spinning is the right
 * wait here whatever OMP_WAIT_POLICY says: OpenMP's own barrier under PASSIVE puts a waiting
 * thread to sleep, and waking it costs tens of microseconds, six times a layer. A waiter that
 * has spun SPIN_SECONDS yields its CPU every 128 pauses from then on, so on a machine with more
 * threads than free cores the thread it waits for gets to run. `round` counts the barriers. */
#define SPIN_SECONDS 50e-6
typedef struct {
    int arrived, round;
} spin_barrier;

static inline void spin_wait(spin_barrier *b, int threads) {
    if (threads == 1) return;
    const int round = __atomic_load_n(&b->round, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&b->arrived, 1, __ATOMIC_ACQ_REL) == threads) {
        __atomic_store_n(&b->arrived, 0, __ATOMIC_RELAXED);   /* the last one opens it */
        __atomic_store_n(&b->round, round + 1, __ATOMIC_RELEASE);
        return;
    }
    double deadline = 0.0;                                     /* set at the first look */
    for (unsigned spins = 1; __atomic_load_n(&b->round, __ATOMIC_ACQUIRE) == round; spins++) {
        if (spins % 128) {
            CPU_RELAX();
            continue;
        }
        const double now = wall_seconds();
        if (deadline == 0.0) deadline = now + SPIN_SECONDS;
        else if (now > deadline) sched_yield();
    }
}

static inline int region_threads(void) {
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

#define PHASE(i)                                                      \
    if (clock_out) {                                                  \
        _Pragma("omp master")                                         \
        {                                                             \
            const double now = wall_seconds();                        \
            clock_out[i] += now - last;                               \
            last = now;                                               \
        }                                                             \
    }

/* The decoder layers for ONE new token of one sequence (a batch-1 decode step), in one call.
 *
 * At batch 1 each layer streams ~14 MB of weights through four GEMVs, ~0.3 ms; driving the
 * same layer from Python as ~15 kernel calls (CpuDecoderLayer in llmlab/model/cpu.py) adds
 * ~0.1 ms of interpreter and dispatch time between them, a third of the step. vLLM removes
 * that launch overhead on a GPU by replaying a captured CUDA graph of the decode step; on a
 * CPU the equivalent is to run the step's sequence of kernels from C. Same math, same
 * kernels, same order of float operations as that kernel-by-kernel path (so the results
 * are identical). Each layer:
 *
 *   h = rms_norm(x) · ln1;  [q k v] = W_qkv h (+ b_qkv);  q, k = rope(q), rope(k)
 *   cache[slot] = k, v;     a = attention(q, cached K/V of positions < seq_len)
 *   x' = x + W_o a;         h = rms_norm(x') · ln2;  [g u] = W_gate_up h
 *   x_out = x' + W_down (silu(g) * u)
 *
 * One OpenMP parallel region for all the layers: the GEMVs split their rows among the threads,
 * attention its KV heads; barriers replace the kernel calls. A barrier is where threads wait for
 * each other (spin_wait: they spin, as waking a sleeping one costs tens of microseconds, and so
 * does starting a region), and there are only the six the data needs per layer (after each of
 * the four GEMVs, after attention, after SiLU x up): every thread takes the RMSNorm of the row
 * itself into its own copy, and each KV head's attention unit first rotates its own query heads
 * and key and writes its k and v into the cache.
 *
 * x [hidden] (read), x_out [hidden] (written: the residual stream, updated in place layer after
 * layer), scratch: at least 3 * heads * head_dim + 2 * kv_heads * head_dim + 3 * inter floats.
 * `layers`: LAYER_SLOTS pointers per layer, in the order of the enum below (cpu_backend.py's
 * DecodeLayerPlan.pointers writes them). W_qkv is q, k, v stacked [heads*hd + 2*kv_heads*hd,
 * hidden], W_gate_up [2*inter, hidden]; cos, sin [hd/2]; *slot (-1: do not cache), block_table
 * and *seq_len (incl. this token) as for llmlab_paged_attention. The four matrices are of type
 * `wtype` (LLMLAB_W_F32, _BF16, or _INT8 with the s_* scales per output row; cpu_quant.c), or
 * LLMLAB_W_F32_PACKED / _BF16_PACKED / _INT8_PACKED: in cpu_gemm.c's blocks
 * (llmlab_pack_weight), int8 with its scales; the caches are float32. hidden, inter % 16 == 0
 * (% 32 packed bf16 and int8); head_dim one of the attention kernel's sizes (the caller checks).
 * Returns -1 if the attention kernel refused head_dim or packed weights came without the
 * instructions their GEMV needs (AVX-512F for float32, AVX-512 BF16 for the others), else 0. */
enum {
    LN1, LN2, W_QKV, B_QKV, W_O, W_GATE_UP, W_DOWN, S_QKV, S_O, S_GATE_UP, S_DOWN, KEY_CACHE,
    VALUE_CACHE, LAYER_SLOTS
};

/* What every layer of the call shares: sizes, the step's position and slot, the scratch. */
typedef struct {
    int64_t hidden, heads, kv_heads, head_dim, inter, block_size, wtype;
    float eps, scale;
    const float *cos, *sin;
    const int64_t *slot;
    const int32_t *block_table, *seq_len;
    float *qkv, *q, *att, *gu, *act;
} step_args;

/* One KV head g of one token that decodes: RoPE of its query heads (qkv's q part into q) and of
 * its key, its k and v into their cache slot (slot < 0: not cached), then its attention over
 * the sequence's first seq_len positions (the token's own last) into att. qkv: the token's
 * stacked [q | k | v] row; q, att: the token's [heads * hd] rows. A unit reads only its own
 * head's cache, so no barrier separates the rotation from the attention. The same operations
 * as llmlab_rope, llmlab_reshape_and_cache and llmlab_paged_attention one after the other.
 * Returns the attention kernel's code. */
static int rope_cache_attend(const float *qkv, const float *cos, const float *sin, int64_t slot,
                             const int32_t *block_table, int64_t seq_len, float *key_cache,
                             float *value_cache, int64_t block_size, int64_t heads,
                             int64_t kv_heads, int64_t hd, float scale, int64_t g, float *q,
                             float *att) {
    const int64_t qw = heads * hd, kw = kv_heads * hd;
    const int64_t group = heads / kv_heads, hq = g * group * hd, hk = g * hd;
    rope_row(qkv + hq, cos, sin, q + hq, group, hd);
    if (slot >= 0) {                       /* k (rotated) and v straight into their cache slot */
        rope_row(qkv + qw + hk, cos, sin, key_cache + slot * kw + hk, 1, hd);
        memcpy(value_cache + slot * kw + hk, qkv + qw + kw + hk, sizeof(float) * hd);
    }
    return llmlab_attention_unit(hd, q, qw, hd, key_cache, value_cache, block_table, block_size,
                                 kv_heads, group, g, 0, 1, seq_len - 1, scale, 0, 1.0f, 1.0f,
                                 att, qw);
}

/* A decode step's attention for a batch: num_seqs sequences, one new token each, every
 * (sequence, KV head) a rope_cache_attend unit, in one call instead of RoPE twice, the cache
 * write and the attention (what a decode step of the fast path runs from 2 tokens on; one token
 * runs inside llmlab_decode_layers). qkv: [num_seqs, heads*hd + 2*kv_heads*hd] rows every
 * qkv_stride floats; cos, sin: [num_seqs, hd/2]; slot_mapping, block_tables (row stride
 * block_table_stride), seq_lens as for llmlab_paged_attention; float32 caches [num_blocks,
 * block_size, kv_heads, hd]; q (scratch) and out: [num_seqs, heads * hd]. Returns -1 if the
 * attention kernel refused head_dim or the group (the caller checks first), else 0. */
int llmlab_decode_attention(const float *qkv, int64_t qkv_stride, const float *cos,
                            const float *sin, const int64_t *slot_mapping,
                            const int32_t *block_tables, int64_t block_table_stride,
                            const int32_t *seq_lens, int64_t num_seqs, float *key_cache,
                            float *value_cache, int64_t block_size, int64_t heads,
                            int64_t kv_heads, int64_t head_dim, float scale, float *q,
                            float *out) {
    const int64_t qw = heads * head_dim, half = head_dim / 2, units = num_seqs * kv_heads;
    int rc = 0;
#pragma omp parallel for schedule(dynamic, 1) if (units > 1)
    for (int64_t u = 0; u < units; u++) {
        const int64_t s = u / kv_heads;
        if (rope_cache_attend(qkv + s * qkv_stride, cos + s * half, sin + s * half,
                              slot_mapping[s], block_tables + s * block_table_stride,
                              seq_lens[s], key_cache, value_cache, block_size, heads, kv_heads,
                              head_dim, scale, u % kv_heads, q + s * qw, out + s * qw) != 0) {
#pragma omp atomic write
            rc = -1;
        }
    }
    return rc;
}

/* The type (LLMLAB_W_F32, _BF16, _INT8) of weights packed into cpu_gemm.c's blocks, from
 * their LLMLAB_W_*_PACKED; -1 for a dense matrix's type */
static inline int64_t packed_type(int64_t wtype) {
    switch (wtype) {
        case LLMLAB_W_F32_PACKED: return LLMLAB_W_F32;
        case LLMLAB_W_BF16_PACKED: return LLMLAB_W_BF16;
        case LLMLAB_W_INT8_PACKED: return LLMLAB_W_INT8;
        default: return -1;
    }
}

/* One of the layer's GEMVs: weights packed (LLMLAB_W_F32_PACKED, _BF16_PACKED, _INT8_PACKED:
 * cpu_gemm.c's blocks, read front to back; scales used by int8 only) or a dense [N, K] matrix
 * of wtype (cpu_quant.c) */
static void layer_gemv(const float *x, const void *W, int64_t wtype, const float *scales,
                       const float *bias, const float *add, float *y, int64_t N, int64_t K) {
    const int64_t packed = packed_type(wtype);
    if (packed >= 0) llmlab_packed_gemv_rows(x, W, packed, scales, bias, add, y, N, K);
    else llmlab_qgemv_rows(x, W, wtype, scales, bias, add, y, N, K);
}

/* One layer on x (in place), run by every thread of the region; `hl` is the thread's own row
 * for the norms. Phases 1-6 of LAYER_PHASES end at its barriers. */
static void layer_body(const step_args *a, void *const *w, float *x, float *hl,
                       spin_barrier *bar, int nth, int *rc, double *clock_out, double *last_) {
    const int64_t hidden = a->hidden, inter = a->inter, wt = a->wtype;
    const int64_t qw = a->heads * a->head_dim, kw = a->kv_heads * a->head_dim;
    double last = *last_;
    /* each thread norms the row itself (hidden floats, a microsecond) into its own copy, so no
     * barrier waits for one thread to do it */
    norm_row(x, NULL, w[LN1], NULL, hl, hidden, a->eps);
    layer_gemv(hl, w[W_QKV], wt, w[S_QKV], w[B_QKV], NULL, a->qkv, qw + 2 * kw, hidden);
    spin_wait(bar, nth);
    PHASE(1)                                                             /* norm + qkv */
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t g = 0; g < a->kv_heads; g++) {
        if (rope_cache_attend(a->qkv, a->cos, a->sin, *a->slot, a->block_table, *a->seq_len,
                              w[KEY_CACHE], w[VALUE_CACHE], a->block_size, a->heads,
                              a->kv_heads, a->head_dim, a->scale, g, a->q, a->att) != 0) {
#pragma omp atomic write
            *rc = -1;
        }
    }
    spin_wait(bar, nth);
    PHASE(2)                                                             /* rope + attention */
    layer_gemv(a->att, w[W_O], wt, w[S_O], NULL, x, x, hidden, qw);   /* x += W_o a */
    spin_wait(bar, nth);
    PHASE(3)
    norm_row(x, NULL, w[LN2], NULL, hl, hidden, a->eps);   /* per thread, as above */
    layer_gemv(hl, w[W_GATE_UP], wt, w[S_GATE_UP], NULL, NULL, a->gu, 2 * inter, hidden);
    spin_wait(bar, nth);
    PHASE(4)                                                             /* norm + gate/up */
#pragma omp for schedule(static) nowait
    for (int64_t i = 0; i < inter; i += VW)
        silu_mul_row(a->gu + i, a->gu + inter + i, a->act + i, VW);
    spin_wait(bar, nth);
    PHASE(5)
    layer_gemv(a->act, w[W_DOWN], wt, w[S_DOWN], NULL, x, x, hidden, inter); /* x += … */
    spin_wait(bar, nth);
    PHASE(6)
    *last_ = last;
}

/* Whether this CPU runs weights of type `wtype` (dense, or packed: their tiles must be here;
 * bf16 and int8 blocks hold (k, k + 1) pairs, so K % 32 == 0 for every matrix of the layer) */
static int weights_run_here(int64_t wtype, int64_t hidden, int64_t qw, int64_t inter) {
    const int64_t packed = packed_type(wtype);
    const int pairs = packed == LLMLAB_W_BF16 || packed == LLMLAB_W_INT8;
    if (packed >= 0 && !llmlab_packed_tiles(packed)) return 0;
    return !(pairs && (hidden % 32 || qw % 32 || inter % 32));
}

/* What every layer of a call shares but the token's position (cos, sin, slot, seq_len, which
 * the caller sets), `scratch` laid out as llmlab_decode_layers says */
static step_args layer_args(int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim,
                            int64_t inter, int64_t block_size, int64_t wtype, float eps,
                            float scale, const int32_t *block_table, float *scratch) {
    const int64_t qw = heads * head_dim, kw = kv_heads * head_dim;
    float *qkv = scratch, *q = qkv + qw + 2 * kw, *att = q + qw, *gu = att + qw;
    const step_args a = {.hidden = hidden, .heads = heads, .kv_heads = kv_heads,
                         .head_dim = head_dim, .inter = inter, .block_size = block_size,
                         .wtype = wtype, .eps = eps, .scale = scale, .block_table = block_table,
                         .qkv = qkv, .q = q, .att = att, .gu = gu, .act = gu + 2 * inter};
    return a;
}

int llmlab_decode_layers(int64_t n_layers, void *const *layers, const float *x, float *x_out,
                         float *scratch, float eps, int64_t wtype, const float *cos,
                         const float *sin, const int64_t *slot, const int32_t *block_table,
                         const int32_t *seq_len, int64_t block_size, int64_t hidden,
                         int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t inter,
                         float scale) {
    if (!weights_run_here(wtype, hidden, heads * head_dim, inter)) return -1;
    step_args a = layer_args(hidden, heads, kv_heads, head_dim, inter, block_size, wtype, eps,
                             scale, block_table, scratch);
    a.cos = cos;
    a.sin = sin;
    a.slot = slot;
    a.seq_len = seq_len;
    memcpy(x_out, x, sizeof(float) * hidden);
    int rc = 0;
    double *clock_out = phase_seconds, start = clock_out ? wall_seconds() : 0.0;
    spin_barrier bar = {0, 0};
#pragma omp parallel
    {
        const int nth = region_threads();
        double last = start;
        PHASE(0)                                                         /* region start */
        float hl[hidden];
        for (int64_t l = 0; l < n_layers; l++)
            layer_body(&a, layers + l * LAYER_SLOTS, x_out, hl, &bar, nth, &rc, clock_out, &last);
#pragma omp master
        start = last;
    }
    if (clock_out) clock_out[7] += wall_seconds() - start;               /* region end */
    return rc;
}

/* The ends of the model around its layers, as llmlab_decode_steps takes them: `head` holds
 * HEAD_SLOTS pointers in this order (cpu_decode.py's DecodeHead writes them). EMBED: the
 * [vocab, hidden] embedding of type `embed_type` (LLMLAB_W_F32, _BF16, or _INT8 with
 * EMBED_SCALES, one float32 per token); FINAL_NORM: the final RMSNorm's float32 weight;
 * LM_HEAD: the [vocab, hidden] LM head of type `head_type`, dense (LLMLAB_W_F32, _BF16, _INT8)
 * or packed by llmlab_pack_weight (LLMLAB_W_*_PACKED), int8 with LM_HEAD_SCALES. */
enum { EMBED, EMBED_SCALES, FINAL_NORM, LM_HEAD, LM_HEAD_SCALES, HEAD_SLOTS };

/* One token's embedding row, as float32, into x[hidden]: widened (llmlab_widen_row), an int8
 * row times its token's scale */
static void embed_row(const void *E, int64_t type, const float *scales, int64_t token, float *x,
                      int64_t hidden) {
    llmlab_widen_row(E, type, token, hidden, x);
    if (type == LLMLAB_W_INT8)
        for (int64_t i = 0; i < hidden; i++) x[i] *= scales[token];
}

/* Multi-step greedy decoding of ONE sequence in one call (multi-step scheduling's loop,
 * `CpuLlamaModel.greedy_decode`): `steps` forwards, forward j embedding token j (the first is
 * `token`, each next one the token the forward before picked), running the decoder layers as
 * llmlab_decode_layers does for position j (cos, sin: row j of [steps, head_dim/2]; slot j of
 * `slots`; seq_lens[j] keys), the final RMSNorm, the LM head's GEMV into logits[vocab] and the
 * argmax (llmlab_argmax_rows's answer), written to tokens[j]. It stops after a token among
 * stop_ids[n_stop]. The same kernels and order of operations as a step of the model followed
 * by the sampler's argmax (the LM head's GEMV is the layers' layer_gemv, what a one-row
 * CpuLinear runs), one OpenMP region for all of it: nothing runs between two tokens but a
 * barrier. x: [hidden] floats; scratch as for llmlab_decode_layers. Returns the number of
 * tokens written, or -1 where llmlab_decode_layers would refuse the layers or the LM head. */
int llmlab_decode_steps(int64_t n_layers, void *const *layers, void *const *head,
                        int64_t embed_type, int64_t head_type, int64_t vocab, float *x,
                        float *scratch, float *logits, float eps, int64_t wtype,
                        const float *cos, const float *sin, const int64_t *slots,
                        const int32_t *block_table, const int32_t *seq_lens, int64_t block_size,
                        int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim,
                        int64_t inter, float scale, int64_t token, const int64_t *stop_ids,
                        int64_t n_stop, int64_t steps, int64_t *tokens) {
    const int64_t qw = heads * head_dim, half = head_dim / 2;
    if (!weights_run_here(wtype, hidden, qw, inter)
        || !weights_run_here(head_type, hidden, qw, inter))
        return -1;
    const step_args base = layer_args(hidden, heads, kv_heads, head_dim, inter, block_size, wtype,
                                      eps, scale, block_table, scratch);
    int64_t count = 0;
    int rc = 0, stop = 0;
    spin_barrier bar = {0, 0};
#pragma omp parallel
    {
        const int nth = region_threads();
        double last = 0.0, *clock_out = NULL;
        float hl[hidden];
        for (int64_t j = 0; j < steps && !stop; j++) {
            step_args a = base;
            a.cos = cos + j * half;
            a.sin = sin + j * half;
            a.slot = slots + j;
            a.seq_len = seq_lens + j;
#pragma omp master
            embed_row(head[EMBED], embed_type, head[EMBED_SCALES], j ? tokens[j - 1] : token, x,
                      hidden);
            spin_wait(&bar, nth);
            for (int64_t l = 0; l < n_layers; l++)
                layer_body(&a, layers + l * LAYER_SLOTS, x, hl, &bar, nth, &rc, clock_out, &last);
            norm_row(x, NULL, head[FINAL_NORM], NULL, hl, hidden, eps);   /* per thread */
            layer_gemv(hl, head[LM_HEAD], head_type, head[LM_HEAD_SCALES], NULL, NULL, logits,
                       vocab, hidden);
            spin_wait(&bar, nth);
#pragma omp master
            {
                llmlab_argmax_rows(logits, vocab, 1, vocab, tokens + j);
                count = j + 1;
                for (int64_t i = 0; i < n_stop; i++) stop |= tokens[j] == stop_ids[i];
            }
            spin_wait(&bar, nth);   /* every thread sees the token, the count and `stop` */
        }
    }
    return rc ? rc : (int)count;
}

