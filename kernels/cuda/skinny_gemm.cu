// Few-row products x @ w.T on tensor cores, for decode and verification steps of 1-64 rows, where
// a product is a matter of streaming the weight once with as many loads in flight as the memory
// system takes, and of doing as little per byte as possible once it arrives.
//
// Why not tl.dot tiles (kernels/triton_int8.py) or cuBLAS: at 1-16 rows their programs walk the
// inner dimension in a chain of dependent steps (load a tile, multiply, load the next). Here each
// lane issues its next step's weight *and activation* loads before it multiplies this step's,
// and the warps of a block split the inner dimension between them.
//
// The product is computed transposed, out.T = w @ x.T (mma.sync m16n8k16): weight columns fill
// the mma's 16-row side and the activation rows its 8-column side, so at <= 8 rows no tensor-core
// work is wasted on padding rows, and each mma covers 16 output columns.
//
// Layout trick: lane (g = lane / 4, q = lane % 4) loads 16 contiguous bytes of weight columns g and
// g + 8 (16 int8 or 8 bf16 values each) at offset q * KL of a chunk of 4 * KL inner positions.
// Which inner position feeds which of the mma's 16 k slots does not matter to the sum, so those
// bytes become the lane's A fragment as they are (widened from int8 if need be), and the lane
// reads activation row g at the same positions for its B fragment. No shuffles, no shared memory
// until the warps' partial sums are added, in a fixed order.
//
// Weights are int8 with one fp32 scale per output column (the draft) or bf16 (scale null). int8
// runs as fp16 on the tensor cores: an int8 becomes an fp16 in two integer instructions per pair
// (offset binary under the exponent of 1024), where bf16 (7 mantissa bits) would need a float
// conversion per value; the activations are converted to fp16 once per chunk and shared by all
// of a warp's columns, saturating at +-65504 (a draft's numbers only: lossless whatever it
// proposes). The inner size must be a multiple of 4 * KL (64 for int8, 32 for bf16); the caller
// checks.
//
// Fused epilogues (a draft's decoder layer in four products, engine/fused_layers.py): NORM scales
// each output row by 1 / rms(x row), its sum of squares gathered from the activation words the lanes
// load anyway (the norm's weight is folded into the projection's at load), so no RMSNorm kernel
// runs before the product; `residual` adds a bf16 matrix of the output's shape (the residual
// stream, updated in place when out is the same memory); `silu_pairs` takes columns in groups of
// 16 as 8 gates then their 8 ups and writes silu(gate) * up, half as many columns; `rope` (a
// q|k|v product) rotates the query and key heads, whose columns come in groups of 16 as 8 dims of
// a head's first half and their 8 partners of its second half, and writes q, and k and v into the
// KV cache at each row's (slot, position), instead of `out`.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

// The rotary epilogue's operands (rope.q_out null: none). Outside the anonymous namespace: the
// exported entry point takes it. cos and sin are the model's tables
// [positions, head_dim]; the caches one layer's [slots, positions, kv_heads, head_dim].
struct RopeArgs {
  const __nv_bfloat16* cos;
  const __nv_bfloat16* sin;
  const int64_t* positions;  // a row's position
  const int64_t* slots;      // a row's cache slot
  __nv_bfloat16* q_out;      // [rows, heads, head_dim]
  __nv_bfloat16* k_cache;
  __nv_bfloat16* v_cache;
  int heads, kv_heads, head_dim;
  int64_t slot_stride, position_stride;  // elements
};

namespace {

template <bool F16>
__device__ __forceinline__ void mma_16816(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                          uint32_t b1) {
  if constexpr (F16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// Programmatic dependent launch (Hopper): a product launched with the attribute starts while the
// kernel before it still runs (once every block of that kernel has let it: allow_next_grid, which a
// product calls when its last weight loads are in flight) and issues its first weight
// loads, which depend on nothing the earlier kernels write, before it waits for that kernel's
// grid to finish and its writes to be visible (wait_for_prior_grid); activations, the residual and
// the epilogue's positions, slots and caches are touched only after the wait. Without the launch
// attribute both are no-ops: the stream has already ordered the kernels.
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Weights are read once: stream them past L1.
__device__ __forceinline__ uint4 load_streaming(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Four int8 in a word -> two fp16x2 words, exactly: each byte, offset by 128, becomes the low
// mantissa byte of 1024.0 (whose unit in the last place is 1), minus 1152.
__device__ __forceinline__ void widen_int8x4_f16(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t u = w ^ 0x80808080u;  // two's complement -> offset binary
  const __half2 bias = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));  // 1152
  uint32_t pl = __byte_perm(u, 0x64646464u, 0x4140), ph = __byte_perm(u, 0x64646464u, 0x4342);
  const __half2 l = __hsub2(*reinterpret_cast<__half2*>(&pl), bias);
  const __half2 h = __hsub2(*reinterpret_cast<__half2*>(&ph), bias);
  lo = *reinterpret_cast<const uint32_t*>(&l);
  hi = *reinterpret_cast<const uint32_t*>(&h);
}

// Two bf16 in a word -> two fp16 in a word, saturating at the largest finite fp16.
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t v) {
  const float lo = __uint_as_float(v << 16), hi = __uint_as_float(v & 0xffff0000u);
  uint32_t out;
  asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;\n" : "=r"(out) : "f"(hi), "f"(lo));
  return out;
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// NT: groups of 8 activation rows (rows <= 8 * NT); CG: groups of 16 weight columns per warp (the
// activations' loads and conversions are shared by them); WARPS: warps per block, splitting the
// inner dimension; U: chunks a warp loads per step.
//
// A block covers one column tile, or walks several (a persistent grid). Each warp loads its next
// step's weights and activations (the next chunks, or the next tile's) before it multiplies this
// step's: the activations come from L2 on an SM's first touch, and a load issued only when it is
// needed puts that round trip on the critical path once a step (1-5 µs of a product at the
// target's shapes on an H200, bench/results/2026-11-27-h200-few-row-cuda).
template <bool INT8, int NT, int CG, int WARPS, int U, bool OUT_F32, bool NORM>
__global__ void __launch_bounds__(WARPS * 32) skinny_gemm_kernel(
    const __nv_bfloat16* __restrict__ x, const uint4* __restrict__ w, const float* __restrict__ scale,
    const __nv_bfloat16* __restrict__ bias, void* out, int rows, int cols, int inner,
    float* __restrict__ split_partials, int* __restrict__ split_arrivals, const __nv_bfloat16* residual,
    float eps, bool silu_pairs, RopeArgs rope) {
  constexpr int KL = INT8 ? 16 : 8;  // inner positions in one lane's 16-byte weight load
  constexpr int STEPS = KL / 4;      // mma k-steps per load (4 lanes x 4 positions each)
  constexpr int CHUNK = 4 * KL;      // inner positions a warp covers per load
  constexpr int XV = KL / 8;         // 16-byte activation loads per row per chunk
  constexpr int TILE_COLS = 16 * CG;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  // With a split inner dimension (gridDim.y > 1: narrow weights, whose column tiles alone would
  // leave multiprocessors idle), block (tile, s) takes the s-th run of chunks, and the last block
  // of a tile to finish adds the splits' sums in split order.
  const int splits = gridDim.y, split = blockIdx.y;
  const int all_chunks = inner / CHUNK;
  const int per_split = (all_chunks + splits - 1) / splits;
  const int split_first = split * per_split;
  const int chunks = split_first + per_split < all_chunks ? split_first + per_split : all_chunks;
  // Each warp takes a contiguous run of the block's chunks; every warp makes the same number of
  // steps (they meet at the tile's barrier).
  const int per_warp = (chunks - split_first + WARPS - 1) / WARPS;
  const int steps_per_tile = per_warp > 0 ? (per_warp + U - 1) / U : 1;  // more splits than chunks: idle
  const int my_first = split_first + warp * per_warp;
  const int my_end = my_first + per_warp < chunks ? my_first + per_warp : chunks;
  const int tiles = (cols + TILE_COLS - 1) / TILE_COLS;
  const int w_stride = inner / KL;  // uint4 per weight row
  const uint4 zero = make_uint4(0, 0, 0, 0);

  const uint4* xrow[NT];
  bool row_ok[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int r = nt * 8 + g;
    row_ok[nt] = r < rows;
    xrow[nt] = reinterpret_cast<const uint4*>(x + static_cast<size_t>(row_ok[nt] ? r : 0) * inner) + q * XV;
  }

  // step s of a tile covers chunks my_first + s * U + u, u < U; [cg][0] is column g, [cg][1] g + 8
  auto load_weights = [&](uint4 (&dw)[U][CG][2], int tile, int step) {
#pragma unroll
    for (int cg = 0; cg < CG; ++cg) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int c = tile * TILE_COLS + cg * 16 + half * 8 + g;
        const uint4* col = w + static_cast<size_t>(c < cols ? c : 0) * w_stride + q;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int ch = my_first + step * U + u;
          dw[u][cg][half] = (tile < tiles && c < cols && ch < my_end) ? load_streaming(col + static_cast<size_t>(ch) * 4)
                                                                        : zero;
        }
      }
    }
  };
  auto load_activations = [&](uint4 (&dx)[U][NT][XV], int tile, int step) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int ch = my_first + step * U + u;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int v = 0; v < XV; ++v)
          dx[u][nt][v] = (tile < tiles && ch < my_end && row_ok[nt]) ? xrow[nt][static_cast<size_t>(ch) * CHUNK / 8 + v]
                                                                     : zero;
    }
  };

  float acc[CG][NT][4];
#pragma unroll
  for (int cg = 0; cg < CG; ++cg)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[cg][nt][i] = 0.f;

  constexpr int PER_WARP = CG * NT * 4 * 32;
  constexpr int SPLIT_STRIDE = PER_WARP + NT * 8;  // a split's entries, then its rows' sums of squares
  __shared__ float partial[WARPS * PER_WARP];
  // NORM: each lane's sum of squares of activation row 8 nt + g over the words it multiplied; the
  // warps' sums per row; the rows' 1 / rms.
  float sq[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) sq[nt] = 0.f;
  __shared__ float sq_partial[NORM ? WARPS * NT * 8 : 1];
  __shared__ float row_scale[NORM ? NT * 8 : 1];

  uint4 cur_w[U][CG][2], nxt_w[U][CG][2];
  uint4 cur_x[U][NT][XV], nxt_x[U][NT][XV];
  int tile = blockIdx.x, step = 0;
  load_weights(cur_w, tile, step);
  wait_for_prior_grid();
  load_activations(cur_x, tile, step);
  while (tile < tiles) {
    int next_tile = tile, next_step = step + 1;
    if (next_step == steps_per_tile) {
      next_tile += gridDim.x;
      next_step = 0;
    }
    load_weights(nxt_w, next_tile, next_step);  // in flight while this step multiplies
    load_activations(nxt_x, next_tile, next_step);
    // This block's last weight loads are issued: the next kernel may start loading its own. Not
    // earlier: kernels that each let the next one start at once pile up, loading weights beside
    // the one that runs (on an H100 that made a fused draft forward 11% slower, not faster).
    if (next_tile >= tiles) allow_next_grid();

#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (my_first + step * U + u < my_end) {
#pragma unroll
        for (int j = 0; j < STEPS; ++j) {
          // B: activation row g, positions 4j, 4j+1 (word 2j) and 4j+2, 4j+3 (word 2j+1) of the
          // lane's segment, in the weights' mma type
          uint32_t b[NT][2];
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const uint32_t v = word(cur_x[u][nt][(2 * j + e) / 4], (2 * j + e) % 4);
              if constexpr (NORM) {
                const float lo = __uint_as_float(v << 16), hi = __uint_as_float(v & 0xffff0000u);
                sq[nt] = fmaf(lo, lo, fmaf(hi, hi, sq[nt]));
              }
              if constexpr (INT8)
                b[nt][e] = bf16x2_to_f16x2(v);
              else
                b[nt][e] = v;
            }
          }
#pragma unroll
          for (int cg = 0; cg < CG; ++cg) {
            // A: columns g (a0, a2) and g + 8 (a1, a3) at the same positions
            uint32_t a0, a1, a2, a3;
            if constexpr (INT8) {
              widen_int8x4_f16(word(cur_w[u][cg][0], j), a0, a2);
              widen_int8x4_f16(word(cur_w[u][cg][1], j), a1, a3);
            } else {
              a0 = word(cur_w[u][cg][0], 2 * j);
              a2 = word(cur_w[u][cg][0], 2 * j + 1);
              a1 = word(cur_w[u][cg][1], 2 * j);
              a3 = word(cur_w[u][cg][1], 2 * j + 1);
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) mma_16816<INT8>(acc[cg][nt], a0, a1, a2, a3, b[nt][0], b[nt][1]);
          }
        }
      }
    }

    if (next_step == 0) {
      // The tile is done: the warps' partial sums, added in warp order (the same bits whatever
      // the launch), scaled, biased and stored. Entry (cg, nt, i, lane) is column
      // 16 cg + lane / 4 (+ 8 for i >= 2), row 8 nt + 2 (lane % 4) (+ 1 for odd i).
#pragma unroll
      for (int cg = 0; cg < CG; ++cg)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            partial[warp * PER_WARP + ((cg * NT + nt) * 4 + i) * 32 + lane] = acc[cg][nt][i];
            acc[cg][nt][i] = 0.f;
          }
      if constexpr (NORM) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          float v = sq[nt];
          v += __shfl_xor_sync(0xffffffffu, v, 1);
          v += __shfl_xor_sync(0xffffffffu, v, 2);
          if (q == 0) sq_partial[warp * NT * 8 + nt * 8 + g] = v;
          sq[nt] = 0.f;
        }
      }
      __syncthreads();
      const int col0 = tile * TILE_COLS;
      bool finish = true;
      if (splits > 1) {
        // This split's sums to global memory; the last of the tile's blocks to arrive adds them.
        float* mine = split_partials + (static_cast<size_t>(split) * tiles + tile) * SPLIT_STRIDE;
        for (int e = threadIdx.x; e < PER_WARP; e += WARPS * 32) {
          float v = 0.f;
#pragma unroll
          for (int s = 0; s < WARPS; ++s) v += partial[s * PER_WARP + e];
          mine[e] = v;
        }
        if constexpr (NORM) {
          for (int r = threadIdx.x; r < NT * 8; r += WARPS * 32) {
            float v = 0.f;
#pragma unroll
            for (int s = 0; s < WARPS; ++s) v += sq_partial[s * NT * 8 + r];
            mine[PER_WARP + r] = v;
          }
        }
        __threadfence();  // release: the sums are visible before the arrival is
        __syncthreads();
        __shared__ int last;
        if (threadIdx.x == 0) last = atomicAdd(split_arrivals + tile, 1) == splits - 1;
        __syncthreads();
        finish = last;
        if (finish) __threadfence();  // acquire: the other splits' sums, read from L2 below
      }
      if constexpr (NORM) {
        // Block-uniform: `finish` is the same for every thread of the block.
        if (finish) {
          for (int r = threadIdx.x; r < NT * 8; r += WARPS * 32) {
            float v = 0.f;
            if (splits > 1) {
              for (int s = 0; s < splits; ++s)
                v += __ldcg(split_partials + (static_cast<size_t>(s) * tiles + tile) * SPLIT_STRIDE + PER_WARP + r);
            } else {
#pragma unroll
              for (int s = 0; s < WARPS; ++s) v += sq_partial[s * NT * 8 + r];
            }
            row_scale[r] = rsqrtf(v / static_cast<float>(inner) + eps);
          }
        }
        __syncthreads();
      }
      // The finished value of entry e: the warps' (or the splits') sums in order, scaled, normed, biased.
      auto entry = [&](int e, int row, int col) {
        float v = 0.f;
        if (splits > 1) {
          for (int s = 0; s < splits; ++s)
            v += __ldcg(split_partials + (static_cast<size_t>(s) * tiles + tile) * SPLIT_STRIDE + e);
        } else {
#pragma unroll
          for (int s = 0; s < WARPS; ++s) v += partial[s * PER_WARP + e];
        }
        if (scale != nullptr) v *= scale[col];
        if constexpr (NORM) v *= row_scale[row];
        if (bias != nullptr) v += __bfloat162float(bias[col]);
        return v;
      };
      for (int e = threadIdx.x; finish && e < PER_WARP; e += WARPS * 32) {
        const int l = e % 32, idx = e / 32, i = idx % 4, nt = (idx / 4) % NT, cg = idx / (4 * NT);
        const int col = col0 + cg * 16 + (l >> 2) + (i >= 2 ? 8 : 0);
        const int row = nt * 8 + 2 * (l & 3) + (i & 1);
        if (row >= rows || col >= cols) continue;
        if (rope.q_out != nullptr) {
          const int d_head = rope.head_dim, head = col / d_head;
          const int64_t position = rope.positions[row], slot = rope.slots[row];
          const int64_t kv_at = slot * rope.slot_stride + position * rope.position_stride;
          if (head >= rope.heads + rope.kv_heads) {  // a value column, in the head's own order
            const int vh = head - rope.heads - rope.kv_heads;
            rope.v_cache[kv_at + vh * d_head + col % d_head] = __float2bfloat16(entry(e, row, col));
            continue;
          }
          // Entry e (column g of the 16: dim d of the head's first half) and e + 64 (column g + 8:
          // dim d + head_dim / 2) rotate together.
          if (i >= 2) continue;
          const int p = col % d_head, d = (p / 16) * 8 + p % 16, partner = d + d_head / 2;
          const float x1 = entry(e, row, col), x2 = entry(e + 64, row, col + 8);
          const float c = __bfloat162float(rope.cos[position * d_head + d]);
          const float sn = __bfloat162float(rope.sin[position * d_head + d]);
          __nv_bfloat16* dst = head < rope.heads ? rope.q_out + (static_cast<int64_t>(row) * rope.heads + head) * d_head
                                                 : rope.k_cache + kv_at + (head - rope.heads) * d_head;
          dst[d] = __float2bfloat16(x1 * c - x2 * sn);
          dst[partner] = __float2bfloat16(x2 * c + x1 * sn);
          continue;
        }
        if (silu_pairs) {
          // Entry e (column g of the 16) is a gate, e + 64 (column g + 8) its up.
          if (i >= 2) continue;
          const float gate = entry(e, row, col), up = entry(e + 64, row, col + 8);
          const int half_cols = cols / 2, ocol = (col0 + cg * 16) / 2 + (l >> 2);
          static_cast<__nv_bfloat16*>(out)[static_cast<size_t>(row) * half_cols + ocol] =
              __float2bfloat16(gate / (1.f + __expf(-gate)) * up);
          continue;
        }
        float v = entry(e, row, col);
        if (residual != nullptr) v += __bfloat162float(residual[static_cast<size_t>(row) * cols + col]);
        if constexpr (OUT_F32)
          static_cast<float*>(out)[static_cast<size_t>(row) * cols + col] = v;
        else
          static_cast<__nv_bfloat16*>(out)[static_cast<size_t>(row) * cols + col] = __float2bfloat16(v);
      }
      if (splits > 1 && finish && threadIdx.x == 0) split_arrivals[tile] = 0;  // zeroed for the next call
      __syncthreads();  // partial is rewritten by the next tile
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int cg = 0; cg < CG; ++cg) {
        cur_w[u][cg][0] = nxt_w[u][cg][0];
        cur_w[u][cg][1] = nxt_w[u][cg][1];
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int v = 0; v < XV; ++v) cur_x[u][nt][v] = nxt_x[u][nt][v];
    }
    tile = next_tile;
    step = next_step;
  }
}

constexpr int pow2_floor(int v) { return v >= 4 ? 4 : v >= 2 ? 2 : 1; }

struct Split {
  int ways;          // 1: none
  float* partials;   // ways x tiles x (the tile's entries + its rows' sums of squares)
  int* arrivals;     // a counter a tile, zero between calls
};

// What one product computes: its operands, and what the epilogue adds to x @ w.T.
struct Product {
  const void* x;
  const void* w;
  const float* scale;  // null: bf16 weights
  const void* bias;
  void* out;
  int rows, cols, inner;
  bool out_f32;
  const void* residual;  // null: none
  bool norm;             // scale each row by 1 / rms(its x row)
  float eps;
  bool silu_pairs;
  RopeArgs rope;
};

template <bool INT8, int NT, int CG, int WARPS, bool OUT_F32, bool NORM>
cudaError_t launch_kernel(const Product& p, int max_blocks_per_sm, Split split, bool programmatic,
                          cudaStream_t stream) {
  // About eight 16-byte loads a lane a step (weights and activations), in registers twice over.
  constexpr int LOADS_PER_CHUNK = 2 * CG + NT * (INT8 ? 2 : 1);
  constexpr int U = pow2_floor(8 / LOADS_PER_CHUNK);
  auto kernel = skinny_gemm_kernel<INT8, NT, CG, WARPS, U, OUT_F32, NORM>;
  // Resident blocks per multiprocessor, asked once per instantiation (and per process: one kind
  // of GPU); atomics because service handler threads may make the first call together.
  static std::atomic<int> resident_cache{0}, sms_cache{0};
  int resident = resident_cache.load(std::memory_order_acquire), sms = sms_cache.load(std::memory_order_acquire);
  if (resident == 0 || sms == 0) {
    int device = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, WARPS * 32, 0);
    resident = resident < 1 ? 1 : resident;
    sms_cache.store(sms, std::memory_order_release);
    resident_cache.store(resident, std::memory_order_release);
  }
  // 0: a block per column tile (the hardware refills multiprocessors as blocks finish); else a
  // persistent grid of at most that many blocks a multiprocessor, each walking tiles.
  const int per_sm = max_blocks_per_sm < resident ? max_blocks_per_sm : resident;
  const int tiles = (p.cols + 16 * CG - 1) / (16 * CG);
  const int blocks = split.ways > 1 || max_blocks_per_sm <= 0 || tiles < sms * per_sm ? tiles : sms * per_sm;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks, split.ways);
  config.blockDim = dim3(WARPS * 32);
  config.stream = stream;
  cudaLaunchAttribute overlap[1];
  overlap[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = overlap;
  config.numAttrs = programmatic ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, static_cast<const __nv_bfloat16*>(p.x), static_cast<const uint4*>(p.w),
                            p.scale, static_cast<const __nv_bfloat16*>(p.bias), p.out, p.rows, p.cols, p.inner,
                            split.partials, split.arrivals, static_cast<const __nv_bfloat16*>(p.residual), p.eps,
                            p.silu_pairs, p.rope);
}

template <bool INT8, int NT, int CG, int WARPS>
cudaError_t launch_with(const Product& p, int per_sm, Split split, bool pdl, cudaStream_t stream) {
  // The partial sums' shared memory must fit the static 48 KB.
  if constexpr (WARPS * CG * NT * 4 * 32 * 4 > 48 * 1024) {
    return cudaErrorInvalidConfiguration;
  } else {
    if (p.out_f32) return launch_kernel<INT8, NT, CG, WARPS, true, false>(p, per_sm, split, pdl, stream);
    if constexpr (NT <= 2) {  // the norm is built for decode steps (a fused draft layer), <= 16 rows
      if (p.norm) return launch_kernel<INT8, NT, CG, WARPS, false, true>(p, per_sm, split, pdl, stream);
    }
    return launch_kernel<INT8, NT, CG, WARPS, false, false>(p, per_sm, split, pdl, stream);
  }
}

template <bool INT8, int NT, int CG>
cudaError_t by_warps(int warps, const Product& p, int per_sm, Split split, bool pdl, cudaStream_t stream) {
  switch (warps) {
    case 2: return launch_with<INT8, NT, CG, 2>(p, per_sm, split, pdl, stream);
    case 4: return launch_with<INT8, NT, CG, 4>(p, per_sm, split, pdl, stream);
    case 8: return launch_with<INT8, NT, CG, 8>(p, per_sm, split, pdl, stream);
    case 16: return launch_with<INT8, NT, CG, 16>(p, per_sm, split, pdl, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <bool INT8, int NT>
cudaError_t by_columns(int column_groups, int warps, const Product& p, int per_sm, Split split, bool pdl,
                       cudaStream_t stream) {
  switch (column_groups) {
    case 1: return by_warps<INT8, NT, 1>(warps, p, per_sm, split, pdl, stream);
    case 2: return by_warps<INT8, NT, 2>(warps, p, per_sm, split, pdl, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <bool INT8>
cudaError_t by_rows(int row_groups, int column_groups, int warps, const Product& p, int per_sm, Split split,
                    bool pdl, cudaStream_t stream) {
  switch (row_groups) {
    case 1: return by_columns<INT8, 1>(column_groups, warps, p, per_sm, split, pdl, stream);
    case 2: return by_columns<INT8, 2>(column_groups, warps, p, per_sm, split, pdl, stream);
    case 4: return by_columns<INT8, 4>(column_groups, warps, p, per_sm, split, pdl, stream);
    case 8: return by_columns<INT8, 8>(column_groups, warps, p, per_sm, split, pdl, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

// The entry point kernels/cuda_skinny.py calls (ctypes). row_groups: 8-row groups (1, 2, 4, 8);
// column_groups: 16-column groups a warp covers (1, 2); warps: 2, 4, 8, 16; blocks_per_sm: 0 for
// a block per column tile, else the persistent grid's blocks a multiprocessor (ignored with a
// split); k_splits: blocks a tile's inner dimension is split over, with split_partials (k_splits
// x tiles x (warps' entries + 8 row_groups) fp32) and split_arrivals (a zeroed counter a tile,
// left zeroed) where it is > 1. The fused epilogue (see the top): residual (null: none; bf16 out
// only), norm with eps (bf16 out, row_groups <= 2), silu_pairs (bf16 out of cols / 2 columns, cols
// a multiple of 16, no residual), rope (null: none; else q, k and v written where it says, out
// unused; head_dim a multiple of 16, cols = (heads + 2 kv_heads) head_dim). programmatic: launch
// with programmatic dependent launch (sm_90+; see wait_for_prior_grid). Returns a cudaError_t
// (0: launched).
extern "C" int bass_skinny_gemm(const void* x, const void* w, const float* scale, const void* bias, void* out,
                                int rows, int cols, int inner, int w_int8, int out_f32, int row_groups,
                                int column_groups, int warps, int blocks_per_sm, int k_splits, float* split_partials,
                                int* split_arrivals, const void* residual, int norm, float eps, int silu_pairs,
                                const RopeArgs* rope, int programmatic, void* stream) {
  const int chunk = w_int8 ? 64 : 32;
  const bool fused = residual != nullptr || norm || silu_pairs || rope != nullptr;
  if (rows < 1 || rows > 8 * row_groups || inner % chunk != 0 || k_splits < 1 ||
      (k_splits > 1 && (split_partials == nullptr || split_arrivals == nullptr)) || (fused && out_f32) ||
      (norm && row_groups > 2) || (silu_pairs && (cols % 16 != 0 || residual != nullptr)) ||
      (rope != nullptr && (rope->q_out == nullptr || rope->head_dim % 16 != 0 || silu_pairs || residual != nullptr ||
                           cols != (rope->heads + 2 * rope->kv_heads) * rope->head_dim)))
    return static_cast<int>(cudaErrorInvalidValue);
  auto s = static_cast<cudaStream_t>(stream);
  const Split split{k_splits, split_partials, split_arrivals};
  const RopeArgs no_rope{};
  const Product p{x, w, scale, bias, out, rows, cols, inner, out_f32 != 0, residual, norm != 0, eps, silu_pairs != 0,
                  rope != nullptr ? *rope : no_rope};
  const bool pdl = programmatic != 0;
  return static_cast<int>(w_int8 ? by_rows<true>(row_groups, column_groups, warps, p, blocks_per_sm, split, pdl, s)
                                 : by_rows<false>(row_groups, column_groups, warps, p, blocks_per_sm, split, pdl, s));
}
