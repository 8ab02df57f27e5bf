// Decode attention: one query token a sequence (a draft's proposal steps), over the slot KV cache
// ([slots, positions, kv_heads, head_dim], one layer), grouped-query heads.
//
// Why not the Triton kernel (kernels/triton_attention.py): at one query a sequence its program is
// a chain of tile loads, a tensor-core product for 7 of 16 rows, an online softmax and a merge,
// ~8 µs a layer on an H200 for a 512-token context (bench/results/journal/
// 2026-11-27-h200-fused-draft.md), the largest kernel of a fused draft layer. Here a block of 128
// threads takes up to 128 keys at a time, one a thread: each thread loads its whole key row at
// once and takes its dot products with the group's queries (in shared memory, pre-scaled), the
// block finds each head's max and sum, and each warp adds its 32 keys' values into the lanes' dims.
//
// The keys of a sequence are split over blocks (grid x) when the context is longer than 128: each
// split writes its unnormalised output, max and sum (fp32) to scratch, and the last of the
// sequence's splits to arrive (a counter per sequence and KV head, left zeroed) merges them in
// split order, so the result does not depend on which block finishes first. The number of splits
// is sized on the device from each sequence's own context (at most gridDim.x), so one launch
// captured in a CUDA graph serves every context up to the bound it was captured for.

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

namespace {

constexpr int KEYS = 128;  // keys a block takes at a time, one a thread
constexpr int THREADS = KEYS;
constexpr int WARPS = THREADS / 32;
constexpr int MAX_GROUP = 8;  // query heads a KV head serves

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int D>
__global__ void __launch_bounds__(THREADS) decode_attention_kernel(
    const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k_cache,
    const __nv_bfloat16* __restrict__ v_cache, const int64_t* __restrict__ slots, const int64_t* __restrict__ ctx_lens,
    __nv_bfloat16* __restrict__ out, float* __restrict__ partial_o, float* __restrict__ partial_ml,
    int* __restrict__ arrivals, int heads, int kv_heads, int64_t slot_stride, int64_t position_stride,
    float scale_log2e) {
  constexpr int DPL = D / 32;  // output dims a lane accumulates
  const int split = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z, max_splits = gridDim.x;
  const int group = heads / kv_heads;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int ctx = static_cast<int>(ctx_lens[b]);
  const int splits = min(max_splits, (ctx + KEYS - 1) / KEYS);
  if (split >= splits) return;
  const int per = (ctx + splits - 1) / splits;
  const int begin = split * per, end = min(ctx, begin + per);
  const int64_t slot = slots[b];
  const __nv_bfloat16* k_rows = k_cache + slot * slot_stride + kvh * D;
  const __nv_bfloat16* v_rows = v_cache + slot * slot_stride + kvh * D;

  __shared__ float qs[MAX_GROUP][D];
  __shared__ float p[MAX_GROUP][KEYS];
  __shared__ float reduce_max[WARPS][MAX_GROUP], reduce_sum[WARPS][MAX_GROUP];
  __shared__ float warp_out[WARPS][MAX_GROUP][D];

  const __nv_bfloat16* q_group = q + (static_cast<int64_t>(b) * heads + kvh * group) * D;
  for (int i = t; i < group * D; i += THREADS) qs[i / D][i % D] = __bfloat162float(q_group[i]) * scale_log2e;
  __syncthreads();

  float m[MAX_GROUP], l[MAX_GROUP], o[MAX_GROUP][DPL];
#pragma unroll
  for (int h = 0; h < MAX_GROUP; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.f;
#pragma unroll
    for (int d = 0; d < DPL; ++d) o[h][d] = 0.f;
  }

  // A lane's DPL dims of one value row: 4 bytes (head_dim 64) or 8 (128).
  using ValueWord = typename std::conditional<DPL == 2, uint32_t, uint2>::type;
  for (int base = begin; base < end; base += KEYS) {
    const int j = base + t;
    // The warp's 32 value rows (keys base + 32 warp ..), loaded with the key row below: every
    // load of the chunk in flight before any arithmetic waits on one.
    const int first = base + warp * 32;
    ValueWord vw[32];
#pragma unroll
    for (int kk = 0; kk < 32; ++kk) {
      if (first + kk < end)
        vw[kk] = *reinterpret_cast<const ValueWord*>(v_rows + static_cast<int64_t>(first + kk) * position_stride +
                                                     lane * DPL);
      else
        vw[kk] = ValueWord{};
    }
    float s[MAX_GROUP];
#pragma unroll
    for (int h = 0; h < MAX_GROUP; ++h) s[h] = -INFINITY;
    if (j < end) {
      uint4 row[D / 8];
      const uint4* src = reinterpret_cast<const uint4*>(k_rows + static_cast<int64_t>(j) * position_stride);
#pragma unroll
      for (int i = 0; i < D / 8; ++i) row[i] = src[i];
#pragma unroll
      for (int h = 0; h < MAX_GROUP; ++h) {
        if (h < group) {
          float acc = 0.f;
#pragma unroll
          for (int i = 0; i < D / 8; ++i) {
            const uint32_t words[4] = {row[i].x, row[i].y, row[i].z, row[i].w};
#pragma unroll
            for (int w = 0; w < 4; ++w) {
              const float lo = __uint_as_float(words[w] << 16), hi = __uint_as_float(words[w] & 0xffff0000u);
              acc = fmaf(qs[h][i * 8 + 2 * w], lo, acc);
              acc = fmaf(qs[h][i * 8 + 2 * w + 1], hi, acc);
            }
          }
          s[h] = acc;
        }
      }
    }
    // Each head's max over the block's keys, then the probabilities and their sum.
#pragma unroll
    for (int h = 0; h < MAX_GROUP; ++h) {
      const float v = warp_max(s[h]);
      if (lane == 0) reduce_max[warp][h] = v;
    }
    __syncthreads();
    float alpha[MAX_GROUP];
#pragma unroll
    for (int h = 0; h < MAX_GROUP; ++h) {
      float chunk_max = reduce_max[0][h];
#pragma unroll
      for (int w = 1; w < WARPS; ++w) chunk_max = fmaxf(chunk_max, reduce_max[w][h]);
      const float m_new = fmaxf(m[h], chunk_max);
      alpha[h] = h < group ? exp2f(m[h] - m_new) : 0.f;  // m = -inf before the first chunk: 0
      const float ph = (h < group && j < end) ? exp2f(s[h] - m_new) : 0.f;
      p[h][t] = ph;
      m[h] = m_new;
      const float v = warp_sum(ph);
      if (lane == 0) reduce_sum[warp][h] = v;
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < MAX_GROUP; ++h) {
      float chunk_sum = 0.f;
#pragma unroll
      for (int w = 0; w < WARPS; ++w) chunk_sum += reduce_sum[w][h];
      l[h] = l[h] * alpha[h] + chunk_sum;
#pragma unroll
      for (int d = 0; d < DPL; ++d) o[h][d] *= alpha[h];
    }
    // Values: warp w adds keys base + 32 w .. + 31 into its lanes' dims (lane * DPL ..); keys past
    // the end have p = 0 and zero rows.
#pragma unroll
    for (int kk = 0; kk < 32; ++kk) {
      float v[DPL];
      if constexpr (DPL == 2) {
        v[0] = __uint_as_float(vw[kk] << 16);
        v[1] = __uint_as_float(vw[kk] & 0xffff0000u);
      } else {
        v[0] = __uint_as_float(vw[kk].x << 16);
        v[1] = __uint_as_float(vw[kk].x & 0xffff0000u);
        v[2] = __uint_as_float(vw[kk].y << 16);
        v[3] = __uint_as_float(vw[kk].y & 0xffff0000u);
      }
#pragma unroll
      for (int h = 0; h < MAX_GROUP; ++h) {
        if (h < group) {
          const float ph = p[h][warp * 32 + kk];
#pragma unroll
          for (int d = 0; d < DPL; ++d) o[h][d] = fmaf(ph, v[d], o[h][d]);
        }
      }
    }
    __syncthreads();  // p and the reductions are rewritten by the next chunk
  }

  // The warps' sums of values, added in warp order.
#pragma unroll
  for (int h = 0; h < MAX_GROUP; ++h)
    if (h < group)
#pragma unroll
      for (int d = 0; d < DPL; ++d) warp_out[warp][h][lane * DPL + d] = o[h][d];
  __syncthreads();
  __nv_bfloat16* out_group = out + (static_cast<int64_t>(b) * heads + kvh * group) * D;
  if (splits == 1) {
    for (int i = t; i < group * D; i += THREADS) {
      const int h = i / D, d = i % D;
      float total = 0.f;
#pragma unroll
      for (int w = 0; w < WARPS; ++w) total += warp_out[w][h][d];
      out_group[i] = __float2bfloat16(total / l[h]);
    }
    return;
  }
  // Several splits: this one's output, max and sum to scratch; the last to arrive merges.
  const int64_t pair = static_cast<int64_t>(b) * kv_heads + kvh;
  float* my_o = partial_o + (pair * max_splits + split) * MAX_GROUP * D;
  for (int i = t; i < group * D; i += THREADS) {
    const int h = i / D, d = i % D;
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) total += warp_out[w][h][d];
    my_o[i] = total;
  }
  if (t < group) {
    float* my_ml = partial_ml + ((pair * max_splits + split) * MAX_GROUP + t) * 2;
#pragma unroll
    for (int h = 0; h < MAX_GROUP; ++h)
      if (h == t) {
        my_ml[0] = m[h];
        my_ml[1] = l[h];
      }
  }
  __threadfence();  // release: the partials are visible before the arrival is
  __syncthreads();
  __shared__ int last;
  if (t == 0) last = atomicAdd(arrivals + pair, 1) == splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();  // acquire: the other splits' partials, read from L2 below
  for (int i = t; i < group * D; i += THREADS) {
    const int h = i / D;
    float top = -INFINITY;
    for (int s = 0; s < splits; ++s)
      top = fmaxf(top, __ldcg(partial_ml + ((pair * max_splits + s) * MAX_GROUP + h) * 2));
    float num = 0.f, den = 0.f;
    for (int s = 0; s < splits; ++s) {
      const float* ml = partial_ml + ((pair * max_splits + s) * MAX_GROUP + h) * 2;
      const float weight = exp2f(__ldcg(ml) - top);
      num += weight * __ldcg(partial_o + (pair * max_splits + s) * MAX_GROUP * D + i);
      den += weight * __ldcg(ml + 1);
    }
    out_group[i] = __float2bfloat16(num / den);
  }
  if (t == 0) arrivals[pair] = 0;  // zeroed for the next call
}

}  // namespace

// The entry point kernels/cuda_attention.py calls (ctypes). q and out [batch, heads, head_dim]
// (one query token a sequence, bf16); the caches one layer's [slots, positions, kv_heads,
// head_dim] bf16 with these strides (elements); slots and ctx_lens int64 [batch] (ctx_lens: the
// cached length, this step's key included); max_splits: blocks a sequence's keys may be split
// over; partial_o (batch x kv_heads x max_splits x 8 x head_dim fp32), partial_ml (batch x kv_heads
// x max_splits x 8 x 2 fp32) and arrivals (batch x kv_heads int32, zero, left zero) where
// max_splits > 1. head_dim 64 or 128, heads / kv_heads at most 8. Returns a cudaError_t.
extern "C" int bass_decode_attention(const void* q, const void* k_cache, const void* v_cache, const int64_t* slots,
                                     const int64_t* ctx_lens, void* out, float* partial_o, float* partial_ml,
                                     int* arrivals, int batch, int heads, int kv_heads, int head_dim,
                                     int64_t slot_stride, int64_t position_stride, float scale, int max_splits,
                                     void* stream) {
  if (batch < 1 || kv_heads < 1 || heads % kv_heads != 0 || heads / kv_heads > MAX_GROUP || max_splits < 1 ||
      (max_splits > 1 && (partial_o == nullptr || partial_ml == nullptr || arrivals == nullptr)) ||
      (head_dim != 64 && head_dim != 128) || position_stride % 8 != 0 || slot_stride % 8 != 0)
    return static_cast<int>(cudaErrorInvalidValue);
  const dim3 grid(max_splits, kv_heads, batch);
  const float scale_log2e = scale * 1.4426950408889634f;
  auto s = static_cast<cudaStream_t>(stream);
  const auto* qb = static_cast<const __nv_bfloat16*>(q);
  const auto* kb = static_cast<const __nv_bfloat16*>(k_cache);
  const auto* vb = static_cast<const __nv_bfloat16*>(v_cache);
  auto* ob = static_cast<__nv_bfloat16*>(out);
  if (head_dim == 64)
    decode_attention_kernel<64><<<grid, THREADS, 0, s>>>(qb, kb, vb, slots, ctx_lens, ob, partial_o, partial_ml,
                                                         arrivals, heads, kv_heads, slot_stride, position_stride,
                                                         scale_log2e);
  else
    decode_attention_kernel<128><<<grid, THREADS, 0, s>>>(qb, kb, vb, slots, ctx_lens, ob, partial_o, partial_ml,
                                                          arrivals, heads, kv_heads, slot_stride, position_stride,
                                                          scale_log2e);
  return static_cast<int>(cudaGetLastError());
}
