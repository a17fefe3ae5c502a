// Paged attention on the GPU: decode steps, and steps that mix prefill and decode, in one kernel.
//
// The work. A query row is one new token: a decode step has one row per sequence, a prefill
// chunk several. Row r attends to positions 0 .. pos(r) of its sequence (causal), read from the
// paged cache through the block table (llmlab_kernels.h says how a row finds its sequence and
// position). One thread block (4 warps) takes one (row, KV head) pair, or with split context
// one partition of that pair's positions: grid (num_rows, num_kv_heads, num_partitions).
//
// GQA. The group = num_heads / num_kv_heads query heads of a KV head read the same K/V rows, so
// one block computes all of them: each K and V row is read from memory once per group, and
// every lane keeps `group` query slices and `group` accumulator slices in registers.
//
// Who owns which key, which lane holds which elements. A K (or V) row of one KV head is
// head_dim contiguous values. kLanes lanes (a "lane group") share one row: lane c of the group
// loads the vector of kVec elements that starts at element c * kVec (16 bytes: 8 fp16 / bf16 or
// 4 fp32; 8 bytes of fp8, 8 values), and the next vector kLanes * kVec further on where a row
// is longer than one pass of the group (fp32, head_dim 256). The group thus reads its row with
// full, coalesced vector loads. A warp holds 32 / kLanes groups, so it works on that many keys
// at once, and each group first issues the loads of kUnroll keys, then does their math:
//     bf16, head_dim 128: 16 lanes per key, 2 keys per warp, 8 per block, 32 keys in flight.
// A lane keeps the same elements of the (pre-scaled) query rows and of the accumulators, so a
// score q.k is the lane's partial dot product summed over its group by shuffles, and
// acc += p * v needs no communication at all.
//
// The positions are walked in tiles of up to kMaxTile = 512:
//   1. slots: the tile's cache slots, looked up once in the block table (shared memory);
//   2. scores: s = q.k for each key of the tile and each query head of the group (shared
//      memory), and the tile's max m_tile (a block-wide max);
//   3. softmax: m_new = max(m, m_tile); the running l and acc are multiplied by exp(m - m_new)
//      (online softmax, rescaling once per tile rather than once per key); then
//      p = exp(s - m_new) overwrites s, and l += sum(p);
//   4. values: acc += p * v, each lane group over its keys, with the lane mapping of step 2.
// At the end the lane groups, then the warps, add up their acc and l (shuffles, then shared
// memory), and out = acc / l.
//
// Split context ("v2", as in vLLM's paged_attention_v2). With few (row, KV head) blocks for the
// SMs and long contexts, one block per pair would leave most of the GPU idle, so the context is
// cut into partitions of partition_size positions, one block each. Such a block writes its
// partial max m_p, sum l_p and unnormalised acc_p (fp32); the reduce kernel, one block per
// (row, query head), merges them exactly as the tiles above were merged:
//     M = max_p m_p,   out = sum_p exp(m_p - M) acc_p / sum_p exp(m_p - M) l_p.
// A partition that starts past its row's context does nothing and is never read back.
//
// Everything after the loads is fp32. An fp8 cache holds value / scale: k_scale is folded into
// the pre-scaled query, v_scale into the final division. Only positions <= pos(r) are read, so
// unused cache slots (whatever they hold, NaN included) never reach the output.
#include <math.h>
#include <stdint.h>

#include "dtype_utils.cuh"
#include "llmlab_kernels.h"

namespace {

constexpr int kWarpSize = 32;
constexpr int kNumWarps = 4;
constexpr int kThreads = kNumWarps * kWarpSize;
constexpr int kMaxTile = 512;  // positions per tile: their scores live in shared memory
constexpr int kUnroll = 4;     // keys a lane group loads before it uses any of them

using Params = LlmlabPagedAttention;

// How the lanes split the K/V rows of a cache of element type C whose head_dim is at most
// D_PAD (64, 128 or 256; a shorter head_dim leaves the vectors past its end unused).
template <typename C, int D_PAD>
struct Tiling {
  static constexpr int kVec = llmlab::CacheVec<C>::kElems;  // elements per vector load
  static constexpr int kLanes = D_PAD / kVec < kWarpSize ? D_PAD / kVec : kWarpSize;
  static constexpr int kLoads = D_PAD / (kLanes * kVec);  // vector loads per lane per row
  static constexpr int kElems = kLoads * kVec;            // row elements a lane owns
  static constexpr int kKeysPerWarp = kWarpSize / kLanes;
  static constexpr int kKeysPerStep = kNumWarps * kKeysPerWarp;  // keys the block loads at once
  static constexpr int kKeysPerRound = kUnroll * kKeysPerStep;
  // First row element of the lane's load j (its kVec elements follow it).
  __device__ static int first_element(int lane_in_group, int j) {
    return j * kLanes * kVec + lane_in_group * kVec;
  }
  // Tile index of the key a lane group handles in load round u.
  __device__ static int key_index(int round_start, int u, int warp, int key_in_warp) {
    return round_start + u * kKeysPerStep + warp * kKeysPerWarp + key_in_warp;
  }
};

// Which sequence a row belongs to, and how many positions it attends to (pos(r) + 1).
struct RowInfo {
  int seq;
  int context;
};

__device__ RowInfo row_info(const Params& p, int row) {
  RowInfo info{row, 0};
  if (p.cu_seqlens_q == nullptr) {
    info.context = p.seq_lens[row];  // decode: the sequence's last position
  } else {
    // The largest s with cu_seqlens_q[s] <= row (an empty sequence shares its offset with the
    // next one, and the largest such s is the one that owns the row).
    int lo = 0;
    int hi = p.num_seqs - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (p.cu_seqlens_q[mid] <= row) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const int q_start = p.cu_seqlens_q[lo];
    const int q_len = p.cu_seqlens_q[lo + 1] - q_start;
    info.seq = lo;
    info.context = p.seq_lens[lo] - q_len + (row - q_start) + 1;
  }
  // Never walk past the block table, whatever the lengths say.
  info.context = max(0, min(info.context, p.max_blocks_per_seq * p.block_size));
  return info;
}

// Sum over the kLanes lanes of a lane group (aligned groups of a power of two: xor stays inside).
template <int LANES>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int offset = LANES / 2; offset > 0; offset /= 2) {
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  }
  return x;
}

// q[g] = this lane's elements of query head kv_head * group + g, times scale * k_scale; zeros
// for heads past the group and for vectors past head_dim.
template <typename C, int D_PAD, int GROUP_MAX>
__device__ void load_query(const Params& p, int row, int kv_head, int group, int lane_in_group,
                           float (&q)[GROUP_MAX][Tiling<C, D_PAD>::kElems]) {
  using Tl = Tiling<C, D_PAD>;
  const float scale = p.scale * p.k_scale;
#pragma unroll
  for (int g = 0; g < GROUP_MAX; ++g) {
    const int64_t q_row = ((int64_t)row * p.num_heads + kv_head * group + g) * p.head_dim;
#pragma unroll
    for (int j = 0; j < Tl::kLoads; ++j) {
      const int first = Tl::first_element(lane_in_group, j);
      const bool used = g < group && first < p.head_dim;
#pragma unroll
      for (int t = 0; t < Tl::kVec; ++t) {
        q[g][j * Tl::kVec + t] =
            used ? llmlab::load_as_float(p.query, q_row + first + t, p.dtype) * scale : 0.0f;
      }
    }
  }
}

// Issue the loads of kUnroll keys (rows of `head`, the cache at this KV head) for one round.
// Keys past the tile and vectors past head_dim are zeros, never loaded.
template <typename C, int D_PAD>
__device__ __forceinline__ void load_round(
    const C* head, int64_t slot_stride, const int* s_slots, int tile_len, int head_dim,
    int round_start, int warp, int key_in_warp, int lane_in_group,
    typename llmlab::CacheVec<C>::Raw (&raw)[kUnroll][Tiling<C, D_PAD>::kLoads]) {
  using Tl = Tiling<C, D_PAD>;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int i = Tl::key_index(round_start, u, warp, key_in_warp);
#pragma unroll
    for (int j = 0; j < Tl::kLoads; ++j) {
      const int first = Tl::first_element(lane_in_group, j);
      raw[u][j] = i < tile_len && first < head_dim
                      ? llmlab::load_vec(head + s_slots[i] * slot_stride + first)
                      : llmlab::zero_vec<C>();
    }
  }
}

// Step 2: scores of the tile's keys into s_scores[g * kMaxTile + i]; m_tile[g] = the largest
// score this thread saw for head g.
template <typename C, int D_PAD, int GROUP_MAX>
__device__ void score_tile(const Params& p, const C* k_head, const int* s_slots, int tile_len,
                           int group, int warp, int key_in_warp, int lane_in_group,
                           const float (&q)[GROUP_MAX][Tiling<C, D_PAD>::kElems],
                           float* s_scores, float (&m_tile)[GROUP_MAX]) {
  using Tl = Tiling<C, D_PAD>;
  using Vec = llmlab::CacheVec<C>;
  const int64_t slot_stride = (int64_t)p.num_kv_heads * p.head_dim;
  // Every lane runs the same rounds (the bound is the block's), so the shuffles inside
  // group_sum always find all 32 lanes; a key past the tile just scores 0 and is dropped.
  for (int round_start = 0; round_start < tile_len; round_start += Tl::kKeysPerRound) {
    typename Vec::Raw raw[kUnroll][Tl::kLoads];
    load_round<C, D_PAD>(k_head, slot_stride, s_slots, tile_len, p.head_dim, round_start, warp,
                         key_in_warp, lane_in_group, raw);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = Tl::key_index(round_start, u, warp, key_in_warp);
      float k[Tl::kElems];
#pragma unroll
      for (int j = 0; j < Tl::kLoads; ++j) Vec::widen(raw[u][j], k + j * Tl::kVec);
#pragma unroll
      for (int g = 0; g < GROUP_MAX; ++g) {
        if (g >= group) continue;  // the same for every lane of the block
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < Tl::kElems; ++e) s = fmaf(q[g][e], k[e], s);
        s = group_sum<Tl::kLanes>(s);
        if (i < tile_len) {
          m_tile[g] = fmaxf(m_tile[g], s);
          if (lane_in_group == 0) s_scores[g * kMaxTile + i] = s;
        }
      }
    }
  }
}

// m[g] <- the largest m[g] of the block (every thread gets the result).
template <int GROUP_MAX>
__device__ void block_max(float (&m)[GROUP_MAX], int group, float (*s_red)[GROUP_MAX], int warp,
                          int lane) {
#pragma unroll
  for (int g = 0; g < GROUP_MAX; ++g) {
    if (g >= group) continue;
    float x = m[g];
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    }
    if (lane == 0) s_red[warp][g] = x;
  }
  __syncthreads();
#pragma unroll
  for (int g = 0; g < GROUP_MAX; ++g) {
    if (g >= group) continue;
    float x = s_red[0][g];
    for (int w = 1; w < kNumWarps; ++w) x = fmaxf(x, s_red[w][g]);
    m[g] = x;
  }
}

// Step 3: rescale the running l and acc to the new max, turn the tile's scores into
// p = exp(s - m) in place and add them to l.
template <int ELEMS, int GROUP_MAX>
__device__ void softmax_tile(const float (&m_tile)[GROUP_MAX], int group, int tile_len,
                             float* s_scores, float (&m_run)[GROUP_MAX],
                             float (&l_part)[GROUP_MAX], float (&acc)[GROUP_MAX][ELEMS]) {
#pragma unroll
  for (int g = 0; g < GROUP_MAX; ++g) {
    if (g >= group) continue;
    const float m_new = fmaxf(m_run[g], m_tile[g]);
    const float alpha = m_run[g] == -INFINITY ? 0.0f : expf(m_run[g] - m_new);
    m_run[g] = m_new;
    l_part[g] *= alpha;
#pragma unroll
    for (int e = 0; e < ELEMS; ++e) acc[g][e] *= alpha;
    for (int i = threadIdx.x; i < tile_len; i += kThreads) {
      const float prob = expf(s_scores[g * kMaxTile + i] - m_new);
      s_scores[g * kMaxTile + i] = prob;
      l_part[g] += prob;  // each thread sums its own share; the shares are added at the end
    }
  }
}

// Step 4: acc[g] += p * v over the tile's keys (the lane mapping of score_tile).
template <typename C, int D_PAD, int GROUP_MAX>
__device__ void accumulate_values(const Params& p, const C* v_head, const int* s_slots,
                                  int tile_len, int group, int warp, int key_in_warp,
                                  int lane_in_group, const float* s_probs,
                                  float (&acc)[GROUP_MAX][Tiling<C, D_PAD>::kElems]) {
  using Tl = Tiling<C, D_PAD>;
  using Vec = llmlab::CacheVec<C>;
  const int64_t slot_stride = (int64_t)p.num_kv_heads * p.head_dim;
  for (int round_start = 0; round_start < tile_len; round_start += Tl::kKeysPerRound) {
    typename Vec::Raw raw[kUnroll][Tl::kLoads];
    load_round<C, D_PAD>(v_head, slot_stride, s_slots, tile_len, p.head_dim, round_start, warp,
                         key_in_warp, lane_in_group, raw);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = Tl::key_index(round_start, u, warp, key_in_warp);
      if (i >= tile_len) continue;  // no shuffles here: lane groups may part ways
      float v[Tl::kElems];
#pragma unroll
      for (int j = 0; j < Tl::kLoads; ++j) Vec::widen(raw[u][j], v + j * Tl::kVec);
#pragma unroll
      for (int g = 0; g < GROUP_MAX; ++g) {
        if (g >= group) continue;
        const float prob = s_probs[g * kMaxTile + i];
#pragma unroll
        for (int e = 0; e < Tl::kElems; ++e) acc[g][e] = fmaf(prob, v[e], acc[g][e]);
      }
    }
  }
}

// The end of a block: add up acc and l over lane groups and warps, then write out = acc / l
// (one pass) or the partition's m, l and unnormalised acc (split context).
template <typename C, int D_PAD, int GROUP_MAX>
__device__ void write_result(const Params& p, int row, int kv_head, int part, int group, int warp,
                             int lane, const float (&m_run)[GROUP_MAX],
                             const float (&l_part)[GROUP_MAX],
                             float (&acc)[GROUP_MAX][Tiling<C, D_PAD>::kElems], float* s_buf,
                             float (*s_red)[GROUP_MAX]) {
  using Tl = Tiling<C, D_PAD>;
  const int key_in_warp = lane / Tl::kLanes;
  const int lane_in_group = lane % Tl::kLanes;
  __syncthreads();  // the last tile's probabilities in s_buf are read no more
#pragma unroll
  for (int g = 0; g < GROUP_MAX; ++g) {
    if (g >= group) continue;
    // Lanes kLanes apart hold the same elements for different keys: add them.
#pragma unroll
    for (int e = 0; e < Tl::kElems; ++e) {
#pragma unroll
      for (int offset = Tl::kLanes; offset < kWarpSize; offset *= 2) {
        acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], offset);
      }
    }
    float l = l_part[g];
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      l += __shfl_xor_sync(0xffffffffu, l, offset);
    }
    if (lane == 0) s_red[warp][g] = l;
    if (key_in_warp == 0) {
#pragma unroll
      for (int j = 0; j < Tl::kLoads; ++j) {
        const int first = Tl::first_element(lane_in_group, j);
        if (first >= p.head_dim) continue;
#pragma unroll
        for (int t = 0; t < Tl::kVec; ++t) {
          s_buf[(warp * GROUP_MAX + g) * D_PAD + first + t] = acc[g][j * Tl::kVec + t];
        }
      }
    }
  }
  __syncthreads();
  const bool split = p.num_partitions > 1;
#pragma unroll
  for (int g = 0; g < GROUP_MAX; ++g) {
    if (g >= group) continue;
    float l = 0.0f;
    for (int w = 0; w < kNumWarps; ++w) l += s_red[w][g];
    const int64_t head_row = (int64_t)row * p.num_heads + kv_head * group + g;
    const int64_t part_row = head_row * p.num_partitions + part;
    for (int d = threadIdx.x; d < p.head_dim; d += kThreads) {
      float sum = 0.0f;
      for (int w = 0; w < kNumWarps; ++w) sum += s_buf[(w * GROUP_MAX + g) * D_PAD + d];
      if (split) {
        p.partial_acc[part_row * p.head_dim + d] = sum;
      } else {
        // l == 0 only for a row with no context (invalid input): write zeros, not NaN
        const float out = l > 0.0f ? sum * p.v_scale / l : 0.0f;
        llmlab::store_from_float(p.out, head_row * p.head_dim + d, p.dtype, out);
      }
    }
    if (split && threadIdx.x == 0) {
      p.partial_max[part_row] = m_run[g];
      p.partial_sum[part_row] = l;
    }
  }
}

template <typename C, int D_PAD, int GROUP_MAX>
__global__ void __launch_bounds__(kThreads) paged_attention_kernel(const Params p) {
  using Tl = Tiling<C, D_PAD>;
  constexpr int kScoreFloats = GROUP_MAX * kMaxTile;
  constexpr int kAccFloats = kNumWarps * GROUP_MAX * D_PAD;
  __shared__ int s_slots[kMaxTile];
  __shared__ float s_buf[kScoreFloats > kAccFloats ? kScoreFloats : kAccFloats];
  __shared__ float s_red[kNumWarps][GROUP_MAX];

  const int row = blockIdx.x;
  const int kv_head = blockIdx.y;
  const int part = blockIdx.z;
  const RowInfo info = row_info(p, row);
  const int part_start = part * p.partition_size;
  if (p.num_partitions > 1 && part_start >= info.context) return;  // never merged
  const int part_end = min(part_start + p.partition_size, info.context);
  const int tile = min(p.partition_size, kMaxTile);
  const int group = p.num_heads / p.num_kv_heads;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int key_in_warp = lane / Tl::kLanes;
  const int lane_in_group = lane % Tl::kLanes;

  float q[GROUP_MAX][Tl::kElems];
  load_query<C, D_PAD, GROUP_MAX>(p, row, kv_head, group, lane_in_group, q);
  float m_run[GROUP_MAX];              // running max score, the same in every thread
  float l_part[GROUP_MAX];             // this thread's share of sum exp(s - m_run)
  float acc[GROUP_MAX][Tl::kElems];    // this lane's elements of sum exp(s - m_run) * v
#pragma unroll
  for (int g = 0; g < GROUP_MAX; ++g) {
    m_run[g] = -INFINITY;
    l_part[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < Tl::kElems; ++e) acc[g][e] = 0.0f;
  }

  const int32_t* table = p.block_tables + (int64_t)info.seq * p.max_blocks_per_seq;
  const C* k_head = static_cast<const C*>(p.key_cache) + (int64_t)kv_head * p.head_dim;
  const C* v_head = static_cast<const C*>(p.value_cache) + (int64_t)kv_head * p.head_dim;
  for (int tile_start = part_start; tile_start < part_end; tile_start += tile) {
    const int tile_len = min(tile, part_end - tile_start);
    __syncthreads();  // the previous tile's slots and probabilities are read no more
    for (int i = threadIdx.x; i < tile_len; i += kThreads) {  // step 1
      const int pos = tile_start + i;
      s_slots[i] = table[pos / p.block_size] * p.block_size + pos % p.block_size;
    }
    __syncthreads();
    float m_tile[GROUP_MAX];
#pragma unroll
    for (int g = 0; g < GROUP_MAX; ++g) m_tile[g] = -INFINITY;
    score_tile<C, D_PAD, GROUP_MAX>(p, k_head, s_slots, tile_len, group, warp, key_in_warp,
                                    lane_in_group, q, s_buf, m_tile);
    block_max<GROUP_MAX>(m_tile, group, s_red, warp, lane);
    softmax_tile<Tl::kElems, GROUP_MAX>(m_tile, group, tile_len, s_buf, m_run, l_part, acc);
    __syncthreads();
    accumulate_values<C, D_PAD, GROUP_MAX>(p, v_head, s_slots, tile_len, group, warp,
                                           key_in_warp, lane_in_group, s_buf, acc);
  }
  write_result<C, D_PAD, GROUP_MAX>(p, row, kv_head, part, group, warp, lane, m_run, l_part,
                                       acc, s_buf, s_red);
}

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// op over one value per thread of the block; every thread gets the result.
template <typename Op>
__device__ float block_reduce(float x, float* s_red, Op op) {
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    x = op(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  if (lane == 0) s_red[warp] = x;
  __syncthreads();
  float result = s_red[0];
  for (int w = 1; w < kNumWarps; ++w) result = op(result, s_red[w]);
  __syncthreads();  // s_red may be written again right after
  return result;
}

// Merge the partitions of split context: one block per (row, query head). The threads share
// the partitions for the weights w_p = exp(m_p - M) (kept in shared memory, num_partitions
// floats) and for l = sum_p w_p l_p, then each takes elements of head_dim and walks the
// partitions' acc_p, eight loads in flight.
__global__ void __launch_bounds__(kThreads) paged_attention_reduce_kernel(const Params p) {
  extern __shared__ float s_weight[];  // [num_partitions]
  __shared__ float s_red[kNumWarps];
  const int row = blockIdx.x;
  const int head = blockIdx.y;
  const RowInfo info = row_info(p, row);
  const int parts =
      min((info.context + p.partition_size - 1) / p.partition_size, p.num_partitions);
  const int64_t head_row = (int64_t)row * p.num_heads + head;
  const float* m = p.partial_max + head_row * p.num_partitions;
  const float* l = p.partial_sum + head_row * p.num_partitions;
  const float* acc = p.partial_acc + head_row * p.num_partitions * p.head_dim;

  float m_local = -INFINITY;
  for (int i = threadIdx.x; i < parts; i += kThreads) m_local = fmaxf(m_local, m[i]);
  const float m_all = block_reduce(m_local, s_red, MaxOp());
  float l_local = 0.0f;
  for (int i = threadIdx.x; i < parts; i += kThreads) {
    const float w = expf(m[i] - m_all);
    s_weight[i] = w;
    l_local += w * l[i];
  }
  const float denom = block_reduce(l_local, s_red, SumOp());  // its barrier publishes s_weight
  const float factor = denom > 0.0f ? p.v_scale / denom : 0.0f;  // no context: zeros
  for (int d = threadIdx.x; d < p.head_dim; d += kThreads) {
    float num = 0.0f;
#pragma unroll 8
    for (int i = 0; i < parts; ++i) num = fmaf(s_weight[i], acc[(int64_t)i * p.head_dim + d], num);
    llmlab::store_from_float(p.out, head_row * p.head_dim + d, p.dtype, num * factor);
  }
}

template <typename C, int D_PAD, int GROUP_MAX>
cudaError_t launch(const Params& p, cudaStream_t stream) {
  const dim3 grid(p.num_rows, p.num_kv_heads, p.num_partitions);
  paged_attention_kernel<C, D_PAD, GROUP_MAX><<<grid, kThreads, 0, stream>>>(p);
  if (p.num_partitions > 1) {
    const size_t weights = sizeof(float) * p.num_partitions;
    paged_attention_reduce_kernel<<<dim3(p.num_rows, p.num_heads), kThreads, weights, stream>>>(
        p);
  }
  return cudaGetLastError();
}

// One kernel per (cache dtype, head_dim bound, group bound): 4 x 3 x 4. The cache dtype is a
// template parameter because the hot loops read it; the query and output, touched once per
// element, switch on their dtype at run time. A group of 3 runs the GROUP_MAX = 4 kernel with
// the fourth head switched off, and so on.
template <typename C, int D_PAD>
cudaError_t dispatch_group(const Params& p, cudaStream_t stream) {
  const int group = p.num_heads / p.num_kv_heads;
  if (group <= 1) return launch<C, D_PAD, 1>(p, stream);
  if (group <= 2) return launch<C, D_PAD, 2>(p, stream);
  if (group <= 4) return launch<C, D_PAD, 4>(p, stream);
  return launch<C, D_PAD, 8>(p, stream);
}

template <typename C>
cudaError_t dispatch_head_dim(const Params& p, cudaStream_t stream) {
  if (p.head_dim % llmlab::CacheVec<C>::kElems != 0) return cudaErrorInvalidValue;
  if (p.head_dim <= 64) return dispatch_group<C, 64>(p, stream);
  if (p.head_dim <= 128) return dispatch_group<C, 128>(p, stream);
  return dispatch_group<C, 256>(p, stream);
}

// The arguments the kernels rely on; false for anything they cannot handle.
bool valid_params(const Params& p) {
  const bool shapes = p.num_rows > 0 && p.num_seqs > 0 && p.num_kv_heads > 0 &&
                      p.num_kv_heads <= 65535 && p.num_heads <= 65535 &&
                      p.num_heads % p.num_kv_heads == 0 &&
                      p.num_heads / p.num_kv_heads >= 1 &&
                      p.num_heads / p.num_kv_heads <= LLMLAB_MAX_GQA_GROUP && p.head_dim > 0 &&
                      p.head_dim <= LLMLAB_MAX_HEAD_DIM && p.block_size > 0 &&
                      p.max_blocks_per_seq >= 0;
  const int64_t max_context = (int64_t)p.max_blocks_per_seq * p.block_size;
  const bool partitions =
      p.num_partitions >= 1 && p.num_partitions <= LLMLAB_MAX_PARTITIONS &&
      p.partition_size >= 0 &&
      (p.partition_size == 0 ? p.num_partitions == 1
                             : (int64_t)p.partition_size * p.num_partitions >= max_context) &&
      (p.num_partitions == 1 ||
       (p.partial_acc != nullptr && p.partial_max != nullptr && p.partial_sum != nullptr));
  const bool scales = p.scale > 0.0f && (!p.cache_fp8 || (p.k_scale > 0.0f && p.v_scale > 0.0f));
  const bool dtype =
      p.dtype == LLMLAB_FLOAT32 || p.dtype == LLMLAB_FLOAT16 || p.dtype == LLMLAB_BFLOAT16;
  return shapes && partitions && scales && dtype && max_context < (int64_t)1 << 30;
}

}  // namespace

extern "C" cudaError_t llmlab_paged_attention(const LlmlabPagedAttention* args,
                                              cudaStream_t stream) {
  if (args == nullptr) return cudaErrorInvalidValue;
  if (args->num_rows == 0) return cudaSuccess;
  if (!valid_params(*args)) return cudaErrorInvalidValue;
  Params p = *args;
  if (p.partition_size == 0) {  // one partition: the whole context, walked tile by tile
    p.partition_size = p.max_blocks_per_seq * p.block_size > 0
                           ? p.max_blocks_per_seq * p.block_size
                           : 1;
  }
  if (!p.cache_fp8) {  // a float cache holds the values themselves
    p.k_scale = 1.0f;
    p.v_scale = 1.0f;
  }
  if (p.cache_fp8) return dispatch_head_dim<__nv_fp8_e4m3>(p, stream);
  switch (p.dtype) {  // a float cache holds the query's dtype
    case LLMLAB_FLOAT32:
      return dispatch_head_dim<float>(p, stream);
    case LLMLAB_FLOAT16:
      return dispatch_head_dim<__half>(p, stream);
    default:
      return dispatch_head_dim<__nv_bfloat16>(p, stream);
  }
}
