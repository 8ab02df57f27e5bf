// Few-row products x @ w.T on tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate), for
// decode and verification steps of 1-64 rows, where the product is a matter of streaming the
// weight once with as many loads in flight as the memory system takes.
//
// Why not tl.dot tiles (kernels/triton_int8.py) or cuBLAS: at 1-16 rows their programs walk the
// inner dimension in a chain of dependent steps (load a tile, multiply, load the next), so a 1 MB
// weight costs 3-6 µs, several DRAM round trips. Here every lane issues all its weight loads for
// a batch of chunks before it multiplies anything, and the warps of a block split the inner
// dimension between them, so one block covers its columns in about one round trip.
//
// Layout trick: a warp covers 8 output columns; lane (g = lane / 4, q = lane % 4) loads 16
// contiguous bytes of column g's weight (16 int8 or 8 bf16 values) at offset q * KL of a chunk of
// 4 * KL inner positions. Which inner position feeds which of the mma's 16 k slots does not matter
// to the sum, so the lane's own 16 bytes become its B fragment as they are (widened from int8 if
// need be), and the activations x are read with the same assignment for the A fragment. No
// shuffles, no shared memory until the warps' partial sums are added, in a fixed order.
//
// Weights are int8 with one fp32 scale per output column (the draft) or bf16 (scale null).
// Inner size must be a multiple of 4 * KL (64 for int8, 32 for bf16); the caller checks.

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

namespace {

__device__ __forceinline__ void mma_bf16_16816(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Weights are read once: stream them past L1.
__device__ __forceinline__ uint4 load_streaming(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Four int8 in a word -> two bf16x2 words, exactly (|q| <= 127 has 7 significant bits). The byte,
// offset by 128, becomes the low mantissa byte of 2^23 (a float whose unit is 1), so one byte
// permute and one add replace a quarter-rate integer-to-float conversion.
__device__ __forceinline__ void widen_int8x4(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t u = w ^ 0x80808080u;  // two's complement -> offset binary
  const float f0 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7540)) - 8388736.f;  // 2^23 + 128
  const float f1 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7541)) - 8388736.f;
  const float f2 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7542)) - 8388736.f;
  const float f3 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7543)) - 8388736.f;
  lo = pack_bf16x2(f0, f1);
  hi = pack_bf16x2(f2, f3);
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// MT: 16-row tiles (rows <= 16 * MT); H: 8-row halves of a tile that hold rows (1 for <= 8 rows:
// the upper half's activation loads and registers vanish); NB: groups of 8 columns per warp (the
// activations' loads are shared by them); WARPS: warps per block, splitting the inner dimension;
// U: chunks a warp loads per step.
//
// A block covers one column tile, or walks several (a persistent grid). Each warp loads its next
// step's weights *and activations* (the next chunks, or the next tile's) before it multiplies this
// step's: the activations come from L2 on an SM's first touch, and a load issued only when it is
// needed puts that round trip on the critical path once per step (bench/gpu/kernels/
// skinny_ablate.py: 1-5 µs of a product at the target's shapes).
template <bool INT8, int MT, int H, int NB, int WARPS, int U, bool OUT_F32>
__global__ void __launch_bounds__(WARPS * 32) skinny_gemm_kernel(
    const __nv_bfloat16* __restrict__ x, const uint4* __restrict__ w, const float* __restrict__ scale,
    const __nv_bfloat16* __restrict__ bias, void* __restrict__ out, int rows, int cols, int inner) {
  constexpr int KL = INT8 ? 16 : 8;  // inner positions in one lane's 16-byte weight load
  constexpr int STEPS = KL / 4;      // mma k-steps per load (4 lanes x 4 positions each)
  constexpr int CHUNK = 4 * KL;      // inner positions a warp covers per load
  constexpr int XV = KL / 8;         // 16-byte activation loads per row per chunk
  constexpr int TILE_COLS = 8 * NB;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int chunks = inner / CHUNK;
  // Each warp takes a contiguous run of chunks, so a step's U chunks of a column are adjacent in
  // memory; every warp makes the same number of steps (they meet at the tile's barrier).
  const int per_warp = (chunks + WARPS - 1) / WARPS;
  const int steps_per_tile = (per_warp + U - 1) / U;
  const int my_first = warp * per_warp;
  const int my_end = my_first + per_warp < chunks ? my_first + per_warp : chunks;
  const int tiles = (cols + TILE_COLS - 1) / TILE_COLS;
  const int w_stride = inner / KL;  // uint4 per weight row
  const uint4 zero = make_uint4(0, 0, 0, 0);

  const uint4* xrow[MT][H];
  bool row_ok[MT][H];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < H; ++h) {
      const int r = mt * 16 + h * 8 + g;
      row_ok[mt][h] = r < rows;
      xrow[mt][h] = reinterpret_cast<const uint4*>(x + static_cast<size_t>(row_ok[mt][h] ? r : 0) * inner) + q * XV;
    }
  }

  // step s of a tile covers chunks my_first + s * U + u, u < U
  auto load_step = [&](uint4 (&dw)[U][NB], uint4 (&dx)[U][MT][H][XV], int tile, int step) {
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      const int c = tile * TILE_COLS + nb * 8 + g;
      const uint4* col = w + static_cast<size_t>(c < cols ? c : 0) * w_stride + q;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int ch = my_first + step * U + u;
        dw[u][nb] = (tile < tiles && c < cols && ch < my_end) ? load_streaming(col + static_cast<size_t>(ch) * 4) : zero;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int ch = my_first + step * U + u;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < H; ++h)
#pragma unroll
          for (int v = 0; v < XV; ++v)
            dx[u][mt][h][v] = (tile < tiles && ch < my_end && row_ok[mt][h])
                                  ? xrow[mt][h][static_cast<size_t>(ch) * CHUNK / 8 + v] : zero;
    }
  };

  float acc[NB][MT][4];
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[nb][mt][i] = 0.f;

  constexpr int PER_WARP = NB * MT * 4 * 32;
  __shared__ float partial[WARPS > 1 ? WARPS * PER_WARP : PER_WARP];

  uint4 cur_w[U][NB], nxt_w[U][NB];
  uint4 cur_x[U][MT][H][XV], nxt_x[U][MT][H][XV];
  int tile = blockIdx.x, step = 0;
  load_step(cur_w, cur_x, tile, step);
  while (tile < tiles) {
    int next_tile = tile, next_step = step + 1;
    if (next_step == steps_per_tile) {
      next_tile += gridDim.x;
      next_step = 0;
    }
    load_step(nxt_w, nxt_x, next_tile, next_step);  // in flight while this step multiplies

#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (my_first + step * U + u < my_end) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
          for (int j = 0; j < STEPS; ++j) {
            // word 2j of the lane's segment holds positions 4j, 4j+1; word 2j+1 holds 4j+2, 4j+3
            const uint32_t a0 = word(cur_x[u][mt][0][(2 * j) / 4], (2 * j) % 4);
            const uint32_t a2 = word(cur_x[u][mt][0][(2 * j + 1) / 4], (2 * j + 1) % 4);
            const uint32_t a1 = H > 1 ? word(cur_x[u][mt][H - 1][(2 * j) / 4], (2 * j) % 4) : 0u;
            const uint32_t a3 = H > 1 ? word(cur_x[u][mt][H - 1][(2 * j + 1) / 4], (2 * j + 1) % 4) : 0u;
#pragma unroll
            for (int nb = 0; nb < NB; ++nb) {
              uint32_t b0, b1;
              if constexpr (INT8) {
#ifdef SKINNY_NO_WIDEN
                b0 = word(cur_w[u][nb], j);
                b1 = b0 ^ 0x1u;
#else
                widen_int8x4(word(cur_w[u][nb], j), b0, b1);
#endif
              } else {
                b0 = word(cur_w[u][nb], 2 * j);
                b1 = word(cur_w[u][nb], 2 * j + 1);
              }
#ifdef SKINNY_NO_MMA
              acc[nb][mt][0] += __uint_as_float((a0 ^ a1 ^ a2 ^ a3 ^ b0 ^ b1) & 0x3fffffffu);
#else
              mma_bf16_16816(acc[nb][mt], a0, a1, a2, a3, b0, b1);
#endif
            }
          }
        }
      }
    }

    if (next_step == 0) {
      // The tile is done: the warps' partial sums, added in warp order (the same bits whatever
      // the launch), scaled, biased and stored.
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            partial[warp * PER_WARP + ((nb * MT + mt) * 4 + i) * 32 + lane] = acc[nb][mt][i];
            acc[nb][mt][i] = 0.f;
          }
      __syncthreads();
      const int col0 = tile * TILE_COLS;
      for (int e = threadIdx.x; e < PER_WARP; e += WARPS * 32) {
        const int l = e % 32, idx = e / 32, i = idx % 4, mt = (idx / 4) % MT, nb = idx / (4 * MT);
        const int row = mt * 16 + (l >> 2) + (i >= 2 ? 8 : 0);
        const int col = col0 + nb * 8 + 2 * (l & 3) + (i & 1);
        if (row < rows && col < cols) {
          float v = 0.f;
#pragma unroll
          for (int s = 0; s < WARPS; ++s) v += partial[s * PER_WARP + e];
          if (scale != nullptr) v *= scale[col];
          if (bias != nullptr) v += __bfloat162float(bias[col]);
          if constexpr (OUT_F32)
            static_cast<float*>(out)[static_cast<size_t>(row) * cols + col] = v;
          else
            static_cast<__nv_bfloat16*>(out)[static_cast<size_t>(row) * cols + col] = __float2bfloat16(v);
        }
      }
      __syncthreads();  // partial is rewritten by the next tile
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) cur_w[u][nb] = nxt_w[u][nb];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < H; ++h)
#pragma unroll
          for (int v = 0; v < XV; ++v) cur_x[u][mt][h][v] = nxt_x[u][mt][h][v];
    }
    tile = next_tile;
    step = next_step;
  }
}

template <bool INT8, int MT, int H, int NB, int WARPS, bool OUT_F32>
cudaError_t launch_kernel(const void* x, const void* w, const float* scale, const void* bias, void* out, int rows,
                          int cols, int inner, int max_blocks_per_sm, cudaStream_t stream) {
  // About four 16-byte weight loads a lane a step, fewer where the activations' registers are many.
  constexpr int X_LOADS = MT * H * (INT8 ? 2 : 1);  // 16-byte activation loads per chunk
  constexpr int U0 = (NB == 1 ? 4 : NB == 2 ? 2 : 1) / (X_LOADS >= 4 ? 4 : X_LOADS >= 2 ? 2 : 1);
  constexpr int U = U0 > 0 ? U0 : 1;
  auto kernel = skinny_gemm_kernel<INT8, MT, H, NB, WARPS, U, OUT_F32>;
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
  const int tiles = (cols + 8 * NB - 1) / (8 * NB);
  const int blocks = max_blocks_per_sm <= 0 || tiles < sms * per_sm ? tiles : sms * per_sm;
  kernel<<<blocks, WARPS * 32, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), static_cast<const uint4*>(w),
                                            scale, static_cast<const __nv_bfloat16*>(bias), out, rows, cols, inner);
  return cudaGetLastError();
}

template <bool INT8, int MT, int H, int NB, int WARPS>
cudaError_t launch_with(const void* x, const void* w, const float* scale, const void* bias, void* out, int rows,
                        int cols, int inner, bool out_f32, int max_blocks_per_sm, cudaStream_t stream) {
  // The partial sums' shared memory must fit the static 48 KB.
  if constexpr (WARPS * NB * MT * 4 * 32 * 4 > 48 * 1024) {
    return cudaErrorInvalidConfiguration;
  } else {
    return out_f32 ? launch_kernel<INT8, MT, H, NB, WARPS, true>(x, w, scale, bias, out, rows, cols, inner,
                                                              max_blocks_per_sm, stream)
                   : launch_kernel<INT8, MT, H, NB, WARPS, false>(x, w, scale, bias, out, rows, cols, inner,
                                                               max_blocks_per_sm, stream);
  }
}

template <bool INT8, int MT, int H, int NB>
cudaError_t by_warps(int warps, const void* x, const void* w, const float* scale, const void* bias, void* out,
                     int rows, int cols, int inner, bool out_f32, int per_sm, cudaStream_t stream) {
  switch (warps) {
    case 2: return launch_with<INT8, MT, H, NB, 2>(x, w, scale, bias, out, rows, cols, inner, out_f32, per_sm, stream);
    case 4: return launch_with<INT8, MT, H, NB, 4>(x, w, scale, bias, out, rows, cols, inner, out_f32, per_sm, stream);
    case 8: return launch_with<INT8, MT, H, NB, 8>(x, w, scale, bias, out, rows, cols, inner, out_f32, per_sm, stream);
    case 16: return launch_with<INT8, MT, H, NB, 16>(x, w, scale, bias, out, rows, cols, inner, out_f32, per_sm, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <bool INT8, int MT, int H>
cudaError_t by_groups(int groups, int warps, const void* x, const void* w, const float* scale, const void* bias,
                      void* out, int rows, int cols, int inner, bool out_f32, int per_sm, cudaStream_t stream) {
  switch (groups) {
    case 1: return by_warps<INT8, MT, H, 1>(warps, x, w, scale, bias, out, rows, cols, inner, out_f32, per_sm, stream);
    case 2: return by_warps<INT8, MT, H, 2>(warps, x, w, scale, bias, out, rows, cols, inner, out_f32, per_sm, stream);
    case 4: return by_warps<INT8, MT, H, 4>(warps, x, w, scale, bias, out, rows, cols, inner, out_f32, per_sm, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <bool INT8>
cudaError_t by_tiles(int row_tiles, int groups, int warps, const void* x, const void* w, const float* scale,
                     const void* bias, void* out, int rows, int cols, int inner, bool out_f32, int per_sm,
                     cudaStream_t stream) {
  switch (row_tiles) {
    case 0: return by_groups<INT8, 1, 1>(groups, warps, x, w, scale, bias, out, rows, cols, inner, out_f32, per_sm, stream);
    case 1: return by_groups<INT8, 1, 2>(groups, warps, x, w, scale, bias, out, rows, cols, inner, out_f32, per_sm, stream);
    case 2: return by_groups<INT8, 2, 2>(groups, warps, x, w, scale, bias, out, rows, cols, inner, out_f32, per_sm, stream);
    case 4: return by_groups<INT8, 4, 2>(groups, warps, x, w, scale, bias, out, rows, cols, inner, out_f32, per_sm, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

// The entry point kernels/cuda_skinny.py calls (ctypes). Returns a cudaError_t (0: launched).
extern "C" int bass_skinny_gemm(const void* x, const void* w, const float* scale, const void* bias, void* out,
                                int rows, int cols, int inner, int w_int8, int out_f32, int row_tiles,
                                int groups, int warps, int blocks_per_sm, void* stream) {
  const int chunk = w_int8 ? 64 : 32;
  if (rows < 1 || rows > (row_tiles == 0 ? 8 : 16 * row_tiles) || inner % chunk != 0) return static_cast<int>(cudaErrorInvalidValue);
  auto s = static_cast<cudaStream_t>(stream);
  return static_cast<int>(
      w_int8 ? by_tiles<true>(row_tiles, groups, warps, x, w, scale, bias, out, rows, cols, inner, out_f32 != 0, blocks_per_sm, s)
             : by_tiles<false>(row_tiles, groups, warps, x, w, scale, bias, out, rows, cols, inner, out_f32 != 0, blocks_per_sm, s));
}
