"""EXPERIMENTAL, not used by the engine: the draft's one-token decode forward as one persistent
Triton kernel (a "megakernel"). It computes the existing path's values but on an H100 it is
SLOWER than the existing path, so nothing calls it (journal 2026-11-27 h100-draft-megakernel).

Why it was tried (issue #35): a forward of the 0.5B draft (24 layers, int8 projections) at 1-16
sequences runs ~10 kernels a layer, each latency-bound (2-6 µs for 0.5-3 µs of bytes), with
~1.3 µs gaps between them even under CUDA graphs: ~0.9 ms of hidden rows for ~0.13 ms of bytes.
Here one launch runs every layer for a batch of up to MAX_ROWS sequences with ONE token each
(the draft loop's self-feeding steps) and returns the final-normed hidden rows; the LM head
stays kernels/triton_int8.Int8Linear.

What it measured (H100, bf16, 512-token contexts, CUDA graphs; bench/gpu/kernels/
draft_megakernel.py): hidden rows 0.920 / 0.939 / 0.971 ms at 1 / 8 / 16 rows against the
existing path's 0.857 / 0.893 / 0.912 (the whole forward with the LM head: 0.93x). A grid barrier
costs ~1 µs (121 of them: 0.12 ms), and each stage is a chain of dependent memory round trips for
one 4-warp program per SM. Stage A moves 1 MB in ~8.6 µs and D 8.7 MB in ~11.5 µs, about the
cost of the kernels they replace. More warps, more programs per SM, deeper pipelining and L2
prefetching all measured slower.

Layout. The grid is one program per SM, all co-resident; each stage's work is shared out among
them and stages are separated by grid barriers (a counter bumped with release semantics and
polled with acquire loads; a launch's last program to leave zeroes it, so a CUDA-graph replay
starts clean). Per layer, five stages:

  A  RMSNorm of x (each program for every row, M x hidden is tiny) and the q|k|v product, each
     program a run of RoPE *pairs* (column d and d + D/2 of one head, so it rotates its own
     outputs), writing q to scratch and k / v into the KV cache at the row's slot and position;
  B  attention of each (sequence, kv head) over its context, the context cut into splits that
     fill the grid, the last split to arrive merging the partials (as kernels/triton_attention);
  C  the o projection + the residual add (split over K where the plan says so: the last split of
     a column tile to arrive sums the partials in split order and adds the residual);
  D  RMSNorm + gate|up product, each program a run of (gate, up) column pairs, SiLU(gate) * up;
  E  the down projection + the residual add (split over K like C).

With MegaPlan.prefetch, every program first asks the L2 for its share of the next layer's
weights and this layer's keys / values (prefetch.global.L2), so that the weight stream runs
ahead of the barriers (measured 2-9% slower: off by default). All products read int8 weights with a
per-column fp32 scale (kernels/triton_int8.Int8Weight), widened to bf16 for the tensor cores.
The math is engine/model.Transformer.hidden's with int8_weights: every intermediate rounded to
the model dtype where the existing kernels round it; only the order of fp32 sums differs.

Data other programs wrote in the same launch is loaded with cache_modifier=".cg" (L2, not the
SM's incoherent L1); besides, every barrier's acquire invalidates the SM's L1 (CCTL.IVALL in the
SASS), so the async copies of the software pipeliner, which ignore the modifier below 16 bytes
(cp.async.ca), read nothing stale either.

Stage mode (stage >= 0): one launch per stage and layer, no barriers. Triton's interpreter
(CPU tests) runs programs one after another, where a spinning barrier would never return; the
stage mode computes the same values, so every stage's math is tested on the CPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

# Imported first: on a machine without a GPU it switches Triton to its interpreter (tests).
from bass.kernels import triton_attention

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from bass.kernels.triton_int8 import Int8Weight  # noqa: E402
from bass.kernels.triton_splitk import reduce_split_k  # noqa: E402

MAX_ROWS = 16  # sequences (one token each) a launch runs: one tensor-core row block
_LOG2E = 1.4426950408889634
_SPIN_LIMIT = 1 << 22  # polls (~0.5 µs each) before a barrier gives up and flags an error
# Counter buffer (int32): [0] barrier, [1] exit, [2] error flag, then arrivals.
_BARRIER, _EXIT, _ERROR, _ATTN_ARRIVALS = 0, 1, 2, 64
_COUNTERS = 8192
_MAX_SPLITS = 8  # K splits of the o and down products (MegaPlan)
STAGES = 7  # stage mode: 0 embed, 1-5 the layer's A-E, 6 final norm


# ----------------------------------------------------------------------------------------------
# Pieces
# ----------------------------------------------------------------------------------------------
@triton.jit
def _grid_sync(counters_ptr, target, limit):
    """Wait until `target` arrivals (this one included) at counters_ptr[0], polling at most
    `limit` times; returns the limit for the next barrier: 0 once one gave up (then the error
    flag is set and the launch runs through without waiting: a bug, reported, never a hang)."""
    tl.debug_barrier()  # every thread's stores of the stage before the release
    tl.atomic_add(counters_ptr, 1, sem="release", scope="gpu")
    # an ld.acquire by one thread, then CCTL.IVALL: this SM's L1 holds nothing stale after it
    seen = tl.atomic_add(counters_ptr, 0, sem="acquire", scope="gpu")
    spins = 0
    while (seen < target) & (spins < limit):
        seen = tl.atomic_add(counters_ptr, 0, sem="acquire", scope="gpu")
        spins += 1
    if seen < target:
        tl.atomic_xchg(counters_ptr + 2, 1)
    tl.debug_barrier()
    return tl.where(seen < target, 0, limit)


@triton.jit
def _prefetch_l2(base_ptr, nbytes, pid, programs, BLOCK: tl.constexpr):
    """Ask the L2 for this program's share of the nbytes bytes at base_ptr, 128-byte lines."""
    base = base_ptr.to(tl.pointer_type(tl.int8))
    lines = tl.cdiv(nbytes, 128)
    per = tl.cdiv(lines, programs)
    for i in range(0, per, BLOCK):
        idx = tl.minimum(pid * per + i + tl.arange(0, BLOCK), lines - 1)
        tl.inline_asm_elementwise("mov.u32 $0, 0; prefetch.global.L2 [$1];", "=r,l", [base + idx.to(tl.int64) * 128],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _rms_inv(x_ptr, rm, row_ok, H: tl.constexpr, eps, BLOCK_H: tl.constexpr):
    """1 / rms of each row of x [rows, H] (fp32), the rows loaded at once (one L2 round trip)."""
    cols = tl.arange(0, BLOCK_H)
    x = tl.load(x_ptr + rm[:, None] * H + cols[None, :], mask=row_ok[:, None] & (cols[None, :] < H), other=0.0,
                cache_modifier=".cg").to(tl.float32)
    return tl.rsqrt(tl.sum(x * x, axis=1) / H + eps)


@triton.jit
def _prefetch_kv(layer, pid, programs, rows, slot_ptr, ctx_ptr, k_cache, v_cache, cache_layer_stride, slot_stride,
                 pos_stride, KV_HEADS: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, LINES: tl.constexpr):
    """Ask the L2 for the keys and values this program's attention units of `layer` will read
    (the same units as _stage_attention; LINES 128-byte lines a key)."""
    pairs = rows * KV_HEADS
    splits = tl.maximum(1, programs // pairs)
    n_off = tl.arange(0, BLOCK_N)
    for u in range(pid, pairs * splits, programs):
        pr = u // splits
        b = pr // KV_HEADS
        ctx = tl.load(ctx_ptr + b).to(tl.int32)
        split_size = tl.maximum(BLOCK_N, tl.cdiv(tl.cdiv(ctx, splits), BLOCK_N) * BLOCK_N)
        lo = (u % splits) * split_size
        hi = tl.minimum(ctx, lo + split_size)
        base = layer.to(tl.int64) * cache_layer_stride + tl.load(slot_ptr + b) * slot_stride + (pr % KV_HEADS) * D
        for start in range(lo, hi, BLOCK_N):
            n = tl.minimum(start + n_off, hi - 1)
            for c in tl.static_range(LINES):
                for cache in tl.static_range(2):
                    ptr = (k_cache if cache == 0 else v_cache) + base + n * pos_stride
                    tl.inline_asm_elementwise("mov.u32 $0, 0; prefetch.global.L2 [$1];", "=r,l",
                                              [ptr.to(tl.pointer_type(tl.int8)) + c * 128], dtype=tl.int32,
                                              is_pure=False, pack=1)


@triton.jit
def _product(a_ptr, a_stride, rm, row_ok, w_ptr, K: tl.constexpr, cols, col_ok, k_lo, k_hi, inv, norm_ptr,
             NORM: tl.constexpr, BLOCK_M: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, UPCAST: tl.constexpr,
             EVEN_K: tl.constexpr):
    """a[rows, k_lo:k_hi] @ w[cols, k_lo:k_hi].T in fp32, w int8 [N, K] (unscaled). NORM: a is x,
    normed on the fly as add_rms_norm does (x * inv rounded, times the norm weight, rounded)."""
    acc = tl.zeros((BLOCK_M, BN), dtype=tl.float32)
    for k in range(k_lo, k_hi, BK):
        kk = k + tl.arange(0, BK)
        k_ok = kk < k_hi
        if EVEN_K:  # the range is whole blocks: no mask along K (keeps the weight loads 16 bytes wide)
            k_ok = tl.full([BK], 1, tl.int1)
        a = tl.load(a_ptr + rm[:, None] * a_stride + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0,
                    cache_modifier=".cg")
        if NORM:
            # The norm weights as a 2-D tile shaped like a's: the software pipeliner stages it with
            # a's (a 1-D load here stayed in the loop, a full memory round trip every K step).
            nw = tl.load(norm_ptr + kk[None, :] + 0 * rm[:, None], mask=k_ok[None, :] & (rm[:, None] >= 0),
                         other=0.0).to(tl.float32)
            normed = (a.to(tl.float32) * inv[:, None]).to(a.dtype).to(tl.float32)
            a = (nw * normed).to(a.dtype)
        b = tl.load(w_ptr + cols[None, :] * K + kk[:, None], mask=col_ok[None, :] & k_ok[:, None], other=0)
        if UPCAST:  # the interpreter: its bf16 dot is wrong, fp32 is exact here
            acc += tl.dot(a.to(tl.float32), b.to(tl.float32))
        else:
            acc += tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    return acc


@triton.jit
def _halves(acc, BLOCK_M: tl.constexpr, BW: tl.constexpr):
    """[BLOCK_M, 2 BW] -> its first and second BW columns."""
    return tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BW)), (0, 2, 1)))


# ----------------------------------------------------------------------------------------------
# Stages
# ----------------------------------------------------------------------------------------------
@triton.jit
def _stage_embed(pid, programs, rows, ids_ptr, embed_ptr, x_ptr, H: tl.constexpr, BLOCK_H: tl.constexpr):
    cols = tl.arange(0, BLOCK_H)
    for r in range(pid, rows, programs):
        token = tl.load(ids_ptr + r)
        tl.store(x_ptr + r * H + cols, tl.load(embed_ptr + token * H + cols, mask=cols < H), mask=cols < H)


@triton.jit
def _stage_qkv(layer, pid, rows, x_ptr, norm_ptr, w_ptr, scale_ptr, bias_ptr, q_ptr, k_cache, v_cache, cos_ptr,
               sin_ptr, pos_ptr, slot_ptr, eps, width, cache_layer_stride, slot_stride, pos_stride,
               H: tl.constexpr, HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HALF: tl.constexpr,
               HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BW: tl.constexpr, BK: tl.constexpr,
               BLOCK_H: tl.constexpr, UPCAST: tl.constexpr):
    """Program pid: RoPE pairs [pid * width, ...) of q|k|v (pair p: columns head * D + j and
    + HALF, j = p % HALF), normed x in, q to scratch, k / v into the cache."""
    D: tl.constexpr = 2 * HALF
    pairs: tl.constexpr = (HEADS + 2 * KV_HEADS) * HALF
    if pid * width < pairs:
        rm = tl.arange(0, BLOCK_M)
        row_ok = rm < rows
        t = tl.arange(0, 2 * BW)
        pair_t = pid * width + t % BW
        col_ok = (t % BW < width) & (pair_t < pairs)
        cols = (pair_t // HALF) * D + pair_t % HALF + (t // BW) * HALF
        scale = tl.load(scale_ptr + cols, mask=col_ok, other=0.0)
        if HAS_BIAS:
            bias = tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        pos = tl.load(pos_ptr + rm, mask=row_ok, other=0)
        slot = tl.load(slot_ptr + rm, mask=row_ok, other=0)
        i = tl.arange(0, BW)
        pair = pid * width + i
        ok = (i < width) & (pair < pairs)
        head = pair // HALF
        j = pair % HALF
        c1 = tl.load(cos_ptr + pos[:, None] * D + j[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
        c2 = tl.load(cos_ptr + pos[:, None] * D + HALF + j[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
        s1 = tl.load(sin_ptr + pos[:, None] * D + j[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
        s2 = tl.load(sin_ptr + pos[:, None] * D + HALF + j[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)

        inv = _rms_inv(x_ptr, rm, row_ok, H, eps, BLOCK_H)
        acc = _product(x_ptr, H, rm, row_ok, w_ptr, H, cols, col_ok, 0, H, inv, norm_ptr, True, BLOCK_M, 2 * BW, BK,
                       UPCAST, H % BK == 0)
        dt = q_ptr.dtype.element_ty
        acc = acc * scale[None, :]
        if HAS_BIAS:
            acc += bias[None, :]
        x1, x2 = _halves(acc.to(dt).to(tl.float32), BLOCK_M, BW)
        # as rope_into_cache: x * cos + rotate_half(x) * sin, each product and the sum rounded
        o1 = ((x1 * c1).to(dt).to(tl.float32) + (-x2 * s1).to(dt).to(tl.float32)).to(dt)
        o2 = ((x2 * c2).to(dt).to(tl.float32) + (x1 * s2).to(dt).to(tl.float32)).to(dt)
        q_off = rm[:, None] * (HEADS * D) + (head * D + j)[None, :]
        is_q = row_ok[:, None] & (ok & (head < HEADS))[None, :]
        tl.store(q_ptr + q_off, o1, mask=is_q)
        tl.store(q_ptr + q_off + HALF, o2, mask=is_q)
        kv_head = tl.where(head >= HEADS + KV_HEADS, head - HEADS - KV_HEADS, head - HEADS)
        c_off = (layer.to(tl.int64) * cache_layer_stride + slot[:, None] * slot_stride + pos[:, None] * pos_stride
                 + (kv_head * D + j)[None, :])
        is_k = row_ok[:, None] & (ok & (head >= HEADS) & (head < HEADS + KV_HEADS))[None, :]
        tl.store(k_cache + c_off, o1, mask=is_k)
        tl.store(k_cache + c_off + HALF, o2, mask=is_k)
        is_v = row_ok[:, None] & (ok & (head >= HEADS + KV_HEADS))[None, :]
        tl.store(v_cache + c_off, x1.to(dt), mask=is_v)
        tl.store(v_cache + c_off + HALF, x2.to(dt), mask=is_v)


@triton.jit
def _stage_attention(layer, pid, programs, rows, q_ptr, k_cache, v_cache, out_ptr, part_ptr, lse_ptr, arrivals_ptr,
                     slot_ptr, ctx_ptr, qk_scale, cache_layer_stride, slot_stride, pos_stride,
                     HEADS: tl.constexpr, KV_HEADS: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr,
                     BLOCK_N: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Each (row's sequence, kv head) over keys [0, ctx) of its slot, cut into `splits` runs of
    whole tiles that fill the grid; the last split to arrive merges them (as attend_triton)."""
    GROUP: tl.constexpr = HEADS // KV_HEADS
    pairs = rows * KV_HEADS
    splits = tl.maximum(1, programs // pairs)
    gr = tl.arange(0, BLOCK_G)
    g_ok = gr < GROUP
    d = tl.arange(0, D)
    offs_n = tl.arange(0, BLOCK_N)
    for u in range(pid, pairs * splits, programs):
        pr = u // splits
        s = u % splits
        b = pr // KV_HEADS
        g = pr % KV_HEADS
        ctx = tl.load(ctx_ptr + b).to(tl.int32)
        slot = tl.load(slot_ptr + b)
        split_size = tl.maximum(BLOCK_N, tl.cdiv(tl.cdiv(ctx, splits), BLOCK_N) * BLOCK_N)
        lo = s * split_size
        hi = tl.minimum(ctx, lo + split_size)
        if lo < hi:
            head = g * GROUP + gr
            q = tl.load(q_ptr + b * (HEADS * D) + head[:, None] * D + d[None, :], mask=g_ok[:, None], other=0.0,
                        cache_modifier=".cg")
            if UPCAST:
                q = q.to(tl.float32)
            base = layer.to(tl.int64) * cache_layer_stride + slot * slot_stride + g * D
            m_i = tl.full([BLOCK_G], -1.0e30, dtype=tl.float32)
            l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
            acc = tl.zeros([BLOCK_G, D], dtype=tl.float32)
            for start in range(lo, hi, BLOCK_N):
                n = start + offs_n
                n_ok = n < hi
                kv_off = base + n[:, None] * pos_stride + d[None, :]
                k = tl.load(k_cache + kv_off, mask=n_ok[:, None], other=0.0, cache_modifier=".cg")
                v = tl.load(v_cache + kv_off, mask=n_ok[:, None], other=0.0, cache_modifier=".cg")
                if UPCAST:
                    k = k.to(tl.float32)
                    v = v.to(tl.float32)
                sc = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
                sc = tl.where(n_ok[None, :], sc, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(sc, 1))
                p = tl.exp2(sc - m_new[:, None])
                alpha = tl.exp2(m_i - m_new)
                l_i = l_i * alpha + tl.sum(p, 1)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
                m_i = m_new
            l_safe = tl.where(l_i > 0.0, l_i, 1.0)
            o_off = b * (HEADS * D) + head[:, None] * D + d[None, :]
            if splits == 1:
                tl.store(out_ptr + o_off, (acc / l_safe[:, None]).to(out_ptr.dtype.element_ty), mask=g_ok[:, None])
            else:
                part = part_ptr + u * (BLOCK_G * D) + gr[:, None] * D + d[None, :]
                tl.store(part, acc / l_safe[:, None])
                tl.store(lse_ptr + u * BLOCK_G + gr, m_i + tl.log2(l_safe))
                num_active = tl.cdiv(ctx, split_size)
                tl.debug_barrier()  # every thread's partial stored before the counter's release
                if tl.atomic_add(arrivals_ptr + pr, 1, sem="acq_rel", scope="gpu") == num_active - 1:
                    m_f = tl.full([BLOCK_G], -1.0e30, dtype=tl.float32)
                    l_f = tl.zeros([BLOCK_G], dtype=tl.float32)
                    acc_f = tl.zeros([BLOCK_G, D], dtype=tl.float32)
                    for s2 in range(0, num_active):
                        u2 = pr * splits + s2
                        lse_s = tl.load(lse_ptr + u2 * BLOCK_G + gr, cache_modifier=".cg")
                        o_s = tl.load(part_ptr + u2 * (BLOCK_G * D) + gr[:, None] * D + d[None, :],
                                      cache_modifier=".cg")
                        m_new = tl.maximum(m_f, lse_s)
                        alpha = tl.exp2(m_f - m_new)
                        w = tl.exp2(lse_s - m_new)
                        l_f = l_f * alpha + w
                        acc_f = acc_f * alpha[:, None] + o_s * w[:, None]
                        m_f = m_new
                    tl.store(arrivals_ptr + pr, 0)  # every split has arrived: leave it zeroed
                    final = acc_f / tl.where(l_f > 0.0, l_f, 1.0)[:, None]
                    tl.store(out_ptr + o_off, final.to(out_ptr.dtype.element_ty), mask=g_ok[:, None])


@triton.jit
def _finish_residual(acc, scale_ptr, bias_ptr, x_ptr, rm, row_ok, cols, col_ok, N: tl.constexpr,
                     HAS_BIAS: tl.constexpr):
    """x[:, cols] = (acc * scale + bias, rounded) + x[:, cols], rounded."""
    dt = x_ptr.dtype.element_ty
    val = acc * tl.load(scale_ptr + cols, mask=col_ok, other=0.0)[None, :]
    if HAS_BIAS:
        val += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    ptrs = x_ptr + rm[:, None] * N + cols[None, :]
    mask = row_ok[:, None] & col_ok[None, :]
    old = tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    tl.store(ptrs, (val.to(dt).to(tl.float32) + old).to(dt), mask=mask)


@triton.jit
def _stage_residual(pid, programs, rows, a_ptr, w_ptr, scale_ptr, bias_ptr, x_ptr, part_ptr, arrivals_ptr, width,
                    k_per, N: tl.constexpr, K: tl.constexpr, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr,
                    BLOCK_M: tl.constexpr, BW: tl.constexpr, BK: tl.constexpr, UPCAST: tl.constexpr):
    """x += a @ w.T (scaled, rounded): column tiles of `width` x SPLITS runs of k_per inputs; with
    SPLITS > 1 the last split of a tile to arrive sums the partials in order and adds x."""
    rm = tl.arange(0, BLOCK_M)
    row_ok = rm < rows
    i = tl.arange(0, BW)
    for u in range(pid, tl.cdiv(N, width) * SPLITS, programs):
        tile = u // SPLITS
        s = u % SPLITS
        cols = tile * width + i
        col_ok = (i < width) & (cols < N)
        k_lo = s * k_per
        acc = _product(a_ptr, K, rm, row_ok, w_ptr, K, cols, col_ok, k_lo, tl.minimum(k_lo + k_per, K), None, None,
                       False, BLOCK_M, BW, BK, UPCAST, K % BK == 0)
        if SPLITS == 1:
            _finish_residual(acc, scale_ptr, bias_ptr, x_ptr, rm, row_ok, cols, col_ok, N, HAS_BIAS)
        else:
            # part: [SPLITS, BLOCK_M, N] fp32
            last, total = reduce_split_k(acc, part_ptr, arrivals_ptr, rm[:, None] * N + cols[None, :],
                                         row_ok[:, None] & col_ok[None, :], s, SPLITS, BLOCK_M * N, tile, BLOCK_M, BW)
            if last:
                _finish_residual(total, scale_ptr, bias_ptr, x_ptr, rm, row_ok, cols, col_ok, N, HAS_BIAS)


@triton.jit
def _stage_mlp_in(pid, rows, x_ptr, norm_ptr, w_ptr, scale_ptr, act_ptr, eps, width, H: tl.constexpr,
                  I: tl.constexpr, BLOCK_M: tl.constexpr, BW: tl.constexpr, BK: tl.constexpr, BLOCK_H: tl.constexpr,
                  UPCAST: tl.constexpr):
    """Program pid: columns [pid * width, ...) of gate and the same of up, normed x in,
    SiLU(gate) * up out (as silu_mul, each step rounded)."""
    if pid * width < I:
        rm = tl.arange(0, BLOCK_M)
        row_ok = rm < rows
        t = tl.arange(0, 2 * BW)
        c_t = pid * width + t % BW
        col_ok = (t % BW < width) & (c_t < I)
        cols = c_t + (t // BW) * I
        scale = tl.load(scale_ptr + cols, mask=col_ok, other=0.0)
        inv = _rms_inv(x_ptr, rm, row_ok, H, eps, BLOCK_H)
        acc = _product(x_ptr, H, rm, row_ok, w_ptr, H, cols, col_ok, 0, H, inv, norm_ptr, True, BLOCK_M, 2 * BW, BK,
                       UPCAST, H % BK == 0)
        dt = act_ptr.dtype.element_ty
        g, up = _halves((acc * scale[None, :]).to(dt).to(tl.float32), BLOCK_M, BW)
        s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        i = tl.arange(0, BW)
        c = pid * width + i
        tl.store(act_ptr + rm[:, None] * I + c[None, :], (s * up).to(dt),
                 mask=row_ok[:, None] & ((i < width) & (c < I))[None, :])


@triton.jit
def _stage_final(pid, programs, rows, x_ptr, norm_ptr, out_ptr, eps, H: tl.constexpr, BLOCK_H: tl.constexpr):
    """out = rms_norm(x) * final_norm, one row at a time (as add_rms_norm without a residual)."""
    cols = tl.arange(0, BLOCK_H)
    mask = cols < H
    w = tl.load(norm_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    for r in range(pid, rows, programs):
        xf = tl.load(x_ptr + r * H + cols, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
        inv = tl.rsqrt(tl.sum(xf * xf, axis=0) / H + eps)
        normed = (xf * inv).to(out_ptr.dtype.element_ty).to(tl.float32)
        tl.store(out_ptr + r * H + cols, (w * normed).to(out_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------
# The kernel
# ----------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["rows", "layer_arg"])
def _draft_forward_kernel(
        ids_ptr, pos_ptr, slot_ptr, ctx_ptr, rows, layer_arg, num_layers, eps, qk_scale,
        embed_ptr, wq_ptr, ws_ptr, qkv_bias_ptr, o_bias_ptr, in_norm_ptr, post_norm_ptr, final_norm_ptr,
        cos_ptr, sin_ptr, k_cache, v_cache,
        x_ptr, q_ptr, attn_ptr, act_ptr, out_ptr, apart_ptr, alse_ptr, part_ptr, counters_ptr,
        w_layer_stride, s_layer_stride, cache_layer_stride, slot_stride, pos_stride,
        o_w_off, gu_w_off, dn_w_off, o_s_off, gu_s_off, dn_s_off,
        qkv_width, o_width, o_k_per, gu_width, dn_width, dn_k_per,
        H: tl.constexpr, I: tl.constexpr, HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
        HAS_QKV_BIAS: tl.constexpr, HAS_O_BIAS: tl.constexpr, O_SPLITS: tl.constexpr, DN_SPLITS: tl.constexpr,
        BLOCK_M: tl.constexpr, BK: tl.constexpr, BW_QKV: tl.constexpr, BW_O: tl.constexpr, BW_GU: tl.constexpr,
        BW_DN: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
        STAGE: tl.constexpr, PREFETCH: tl.constexpr, SPIN_LIMIT: tl.constexpr, UPCAST: tl.constexpr,
        DOT_PRECISION: tl.constexpr, KV_LINES: tl.constexpr, SKIP: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    QD: tl.constexpr = HEADS * HEAD_DIM
    attn_arrivals = counters_ptr + 64
    o_arrivals = attn_arrivals + 1024
    dn_arrivals = o_arrivals + 1024
    if STAGE < 0:  # persistent: everything, grid barriers between stages
        QKV: tl.constexpr = QD + 2 * KV_HEADS * HEAD_DIM
        ESIZE: tl.constexpr = x_ptr.dtype.element_ty.primitive_bitwidth // 8
        if PREFETCH:
            _prefetch_l2(wq_ptr, w_layer_stride, pid, programs, 1024)
            _prefetch_l2(ws_ptr, s_layer_stride * 4, pid, programs, 128)
        _stage_embed(pid, programs, rows, ids_ptr, embed_ptr, x_ptr, H, BLOCK_H)
        epoch = 1
        limit = tl.full([], SPIN_LIMIT, tl.int32)
        limit = _grid_sync(counters_ptr, epoch * programs, limit)
        for layer in range(num_layers):
            wl = wq_ptr + layer.to(tl.int64) * w_layer_stride
            sl = ws_ptr + layer * s_layer_stride
            if PREFETCH:
                # this layer's keys and values (read two stages on), the next layer's weights
                _prefetch_kv(layer, pid, programs, rows, slot_ptr, ctx_ptr, k_cache, v_cache, cache_layer_stride,
                             slot_stride, pos_stride, KV_HEADS, HEAD_DIM, BLOCK_N, KV_LINES)
                if layer + 1 < num_layers:
                    _prefetch_l2(wl + w_layer_stride, w_layer_stride, pid, programs, 1024)
                    _prefetch_l2(sl + s_layer_stride, s_layer_stride * 4, pid, programs, 128)
                    if pid == 0:
                        _prefetch_l2(in_norm_ptr + (layer + 1) * H, H * ESIZE, 0, 1, 32)
                        _prefetch_l2(post_norm_ptr + (layer + 1) * H, H * ESIZE, 0, 1, 32)
                        if HAS_QKV_BIAS:
                            _prefetch_l2(qkv_bias_ptr + (layer + 1) * QKV, QKV * ESIZE, 0, 1, 32)
            if (SKIP & 1) == 0:
                _stage_qkv(layer, pid, rows, x_ptr, in_norm_ptr + layer * H, wl, sl, qkv_bias_ptr + layer * QKV,
                           q_ptr, k_cache, v_cache, cos_ptr, sin_ptr, pos_ptr, slot_ptr, eps, qkv_width,
                           cache_layer_stride, slot_stride, pos_stride, H, HEADS, KV_HEADS, HEAD_DIM // 2,
                           HAS_QKV_BIAS, BLOCK_M, BW_QKV, BK, BLOCK_H, UPCAST)
            epoch += 1
            limit = _grid_sync(counters_ptr, epoch * programs, limit)
            if (SKIP & 2) == 0:
                _stage_attention(layer, pid, programs, rows, q_ptr, k_cache, v_cache, attn_ptr, apart_ptr, alse_ptr,
                                 attn_arrivals, slot_ptr, ctx_ptr, qk_scale, cache_layer_stride, slot_stride,
                                 pos_stride, HEADS, KV_HEADS, HEAD_DIM, BLOCK_G, BLOCK_N, UPCAST, DOT_PRECISION)
            epoch += 1
            limit = _grid_sync(counters_ptr, epoch * programs, limit)
            if (SKIP & 4) == 0:
                _stage_residual(pid, programs, rows, attn_ptr, wl + o_w_off, sl + o_s_off, o_bias_ptr + layer * H,
                                x_ptr, part_ptr, o_arrivals, o_width, o_k_per, H, QD, O_SPLITS, HAS_O_BIAS, BLOCK_M,
                                BW_O, BK, UPCAST)
            epoch += 1
            limit = _grid_sync(counters_ptr, epoch * programs, limit)
            if (SKIP & 8) == 0:
                _stage_mlp_in(pid, rows, x_ptr, post_norm_ptr + layer * H, wl + gu_w_off, sl + gu_s_off, act_ptr,
                              eps, gu_width, H, I, BLOCK_M, BW_GU, BK, BLOCK_H, UPCAST)
            epoch += 1
            limit = _grid_sync(counters_ptr, epoch * programs, limit)
            if (SKIP & 16) == 0:
                _stage_residual(pid, programs, rows, act_ptr, wl + dn_w_off, sl + dn_s_off, o_bias_ptr, x_ptr,
                                part_ptr, dn_arrivals, dn_width, dn_k_per, H, I, DN_SPLITS, False, BLOCK_M, BW_DN, BK,
                                UPCAST)
            epoch += 1
            limit = _grid_sync(counters_ptr, epoch * programs, limit)
        _stage_final(pid, programs, rows, x_ptr, final_norm_ptr, out_ptr, eps, H, BLOCK_H)
        # The last program out zeroes the counters for the next launch (every other one is past
        # its last poll by then).
        tl.debug_barrier()
        if tl.atomic_add(counters_ptr + 1, 1, sem="acq_rel", scope="gpu") == programs - 1:
            tl.atomic_xchg(counters_ptr, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(counters_ptr + 1, 0, sem="relaxed", scope="gpu")
    else:  # stage mode: one stage of one layer per launch
        layer = layer_arg
        wl = wq_ptr + layer.to(tl.int64) * w_layer_stride
        sl = ws_ptr + layer * s_layer_stride
        if STAGE == 0:
            _stage_embed(pid, programs, rows, ids_ptr, embed_ptr, x_ptr, H, BLOCK_H)
        elif STAGE == 1:
            _stage_qkv(layer, pid, rows, x_ptr, in_norm_ptr + layer * H, wl, sl, qkv_bias_ptr + layer * (QD + 2 * KV_HEADS * HEAD_DIM),
                       q_ptr, k_cache, v_cache, cos_ptr, sin_ptr, pos_ptr, slot_ptr, eps, qkv_width,
                       cache_layer_stride, slot_stride, pos_stride, H, HEADS, KV_HEADS, HEAD_DIM // 2, HAS_QKV_BIAS,
                       BLOCK_M, BW_QKV, BK, BLOCK_H, UPCAST)
        elif STAGE == 2:
            _stage_attention(layer, pid, programs, rows, q_ptr, k_cache, v_cache, attn_ptr, apart_ptr, alse_ptr,
                             attn_arrivals, slot_ptr, ctx_ptr, qk_scale, cache_layer_stride, slot_stride, pos_stride,
                             HEADS, KV_HEADS, HEAD_DIM, BLOCK_G, BLOCK_N, UPCAST, DOT_PRECISION)
        elif STAGE == 3:
            _stage_residual(pid, programs, rows, attn_ptr, wl + o_w_off, sl + o_s_off, o_bias_ptr + layer * H, x_ptr,
                            part_ptr, o_arrivals, o_width, o_k_per, H, QD, O_SPLITS, HAS_O_BIAS, BLOCK_M, BW_O, BK,
                            UPCAST)
        elif STAGE == 4:
            _stage_mlp_in(pid, rows, x_ptr, post_norm_ptr + layer * H, wl + gu_w_off, sl + gu_s_off, act_ptr, eps,
                          gu_width, H, I, BLOCK_M, BW_GU, BK, BLOCK_H, UPCAST)
        elif STAGE == 5:
            _stage_residual(pid, programs, rows, act_ptr, wl + dn_w_off, sl + dn_s_off, o_bias_ptr, x_ptr, part_ptr,
                            dn_arrivals, dn_width, dn_k_per, H, I, DN_SPLITS, False, BLOCK_M, BW_DN, BK, UPCAST)
        else:
            _stage_final(pid, programs, rows, x_ptr, final_norm_ptr, out_ptr, eps, H, BLOCK_H)


# ----------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------
def _pow2(n: int, least: int = 1) -> int:
    return max(least, triton.next_power_of_2(max(1, n)))


@dataclass(frozen=True)
class MegaPlan:
    """How a launch shares each stage out among `programs` (widths in columns or RoPE / gate-up
    pairs; the BW_* register tiles are their powers of two)."""

    programs: int
    block_k: int
    qkv_width: int
    bw_qkv: int
    o_splits: int
    o_width: int
    o_k_per: int
    bw_o: int
    gu_width: int
    bw_gu: int
    dn_splits: int
    dn_width: int
    dn_k_per: int
    bw_dn: int
    num_warps: int = 4  # 8: 4-10% slower on an H100
    prefetch: bool = False  # L2 prefetch of the next layer's weights: 2-9% slower on an H100
    num_stages: int = 3  # 5 or 8: 1-5% slower  # software pipelining depth of the product loops
    skip: int = 0  # benchmarks only: stages left out (bit i: stage A..E), for their marginal cost

    @staticmethod
    def _residual(programs: int, cols: int, inner: int, splits: int, block_k: int) -> tuple[int, int, int, int]:
        splits = min(splits, _MAX_SPLITS)
        k_per = -(-(-(-inner // splits)) // block_k) * block_k
        splits = -(-inner // k_per)
        tiles = max(1, programs // splits)
        width = -(-cols // tiles)
        return splits, width, k_per, _pow2(width, 16)

    @classmethod
    def build(cls, config, programs: int, *, o_splits: int = 1, dn_splits: int = 4, num_warps: int = 4,
              prefetch: bool = False, block_k: int | None = None) -> "MegaPlan":
        """o_splits / dn_splits: K splits of the o and down products (the H100's best: 1 and 4);
        programs: the grid, all co-resident (one per SM; two per SM measured 15-25% slower)."""
        c = config
        h, inter, d = c.hidden_size, c.intermediate_size, c.head_dim
        block_k = block_k or min(128, _pow2(min(h, inter), 16))
        pairs = (c.num_heads + 2 * c.num_kv_heads) * d // 2
        qkv_width = -(-pairs // programs)
        gu_width = -(-inter // programs)
        o = cls._residual(programs, h, c.num_heads * d, o_splits, block_k)
        dn = cls._residual(programs, h, inter, dn_splits, block_k)
        return cls(programs=programs, block_k=block_k, qkv_width=qkv_width, bw_qkv=_pow2(qkv_width, 8),
                   o_splits=o[0], o_width=o[1], o_k_per=o[2], bw_o=o[3], gu_width=gu_width, bw_gu=_pow2(gu_width, 8),
                   dn_splits=dn[0], dn_width=dn[1], dn_k_per=dn[2], bw_dn=dn[3], num_warps=num_warps,
                   prefetch=prefetch)


def unsupported_reason(model) -> str | None:
    """Why `model` (engine/model.Transformer) cannot run the megakernel; None if it can."""
    c = model.config
    if not model.int8_weights:
        return "needs int8 weights (a draft's int8_weights)"
    if model.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"dtype {model.dtype}"
    d = c.head_dim
    if d < 16 or d & (d - 1):
        return f"head_dim {d} is not a power of two >= 16"
    if c.num_heads % c.num_kv_heads or c.num_heads // c.num_kv_heads > 64:
        return "grouped-query heads"
    for layer in model.weights.layers:
        if not all(isinstance(getattr(layer, n), Int8Weight) for n in ("qkv", "o", "gate_up", "down")):
            return "a projection is not an Int8Weight"
    return None


class DraftMegakernel:
    """One launch per one-token step of up to MAX_ROWS sequences: model.hidden's value.

    Building it moves the model's int8 codes into one buffer [layers, bytes a layer] (q|k|v, o,
    gate|up, down back to back, so a layer's weights are one range to prefetch) and points each
    layer's Int8Weight at its views: no second copy. The scales, biases and norms are stacked
    copies (small). Holds the launch's scratch and counters: one megakernel per model, one
    launch at a time on a stream."""

    def __init__(self, model, *, programs: int | None = None, plan: MegaPlan | None = None):
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the draft megakernel cannot run this model: {reason}")
        self.model = model
        c, w = model.config, model.weights
        device, dtype = model.device, model.dtype
        self.interpreted = triton_attention._INTERPRETED
        if self.interpreted:
            triton_attention._patch_interpreter_index()
        if programs is None:
            programs = triton_attention._num_sms(device)
        self.plan = plan or MegaPlan.build(c, programs)
        h, inter, d = c.hidden_size, c.intermediate_size, c.head_dim
        qkv_cols = (c.num_heads + 2 * c.num_kv_heads) * d
        shapes = [(qkv_cols, h), (h, c.num_heads * d), (2 * inter, h), (h, inter)]
        sizes = [n * k for n, k in shapes]
        # segment offsets, 128-byte aligned (prefetch lines, vector loads)
        offs, at = [], 0
        for size in sizes:
            offs.append(at)
            at = -(-(at + size) // 128) * 128
        layer_bytes = at
        col_offs = [0, qkv_cols, qkv_cols + h, qkv_cols + h + 2 * inter]
        layer_cols = col_offs[-1] + h
        num_layers = len(w.layers)
        self.wq = torch.empty((num_layers, layer_bytes), dtype=torch.int8, device=device)
        self.ws = torch.empty((num_layers, layer_cols), dtype=torch.float32, device=device)
        names = ("qkv", "o", "gate_up", "down")
        for i, layer in enumerate(w.layers):
            for name, off, col, (n, k) in zip(names, offs, col_offs, shapes):
                weight: Int8Weight = getattr(layer, name)
                if tuple(weight.q.shape) != (n, k):
                    raise ValueError(f"layer {i} {name}: {tuple(weight.q.shape)}, expected {(n, k)}")
                view = self.wq[i, off:off + n * k].view(n, k)
                view.copy_(weight.q)
                self.ws[i, col:col + n].copy_(weight.scale)
                setattr(layer, name, dataclasses.replace(weight, q=view, scale=self.ws[i, col:col + n]))
        self.offsets, self.col_offsets, self.layer_bytes = offs, col_offs, layer_bytes
        self.has_qkv_bias = w.layers[0].qkv_bias is not None
        self.has_o_bias = w.layers[0].o_bias is not None
        dummy = torch.zeros(1, dtype=dtype, device=device)
        self.qkv_bias = torch.stack([layer.qkv_bias for layer in w.layers]) if self.has_qkv_bias else dummy
        self.o_bias = torch.stack([layer.o_bias for layer in w.layers]) if self.has_o_bias else dummy
        self.in_norm = torch.stack([layer.input_norm for layer in w.layers])
        self.post_norm = torch.stack([layer.post_norm for layer in w.layers])
        # scratch: the residual stream, q, attention output, SiLU * up, split partials
        m, p = MAX_ROWS, self.plan.programs
        self.block_g = _pow2(c.num_heads // c.num_kv_heads, 16)
        self.x = torch.empty((m, h), dtype=dtype, device=device)
        self.q = torch.empty((m, c.num_heads * d), dtype=dtype, device=device)
        self.attn = torch.empty((m, c.num_heads * d), dtype=dtype, device=device)
        self.act = torch.empty((m, inter), dtype=dtype, device=device)
        # attention partials, one a unit (units <= programs when the context is split)
        self.max_programs = max(p, 4 * triton_attention._num_sms(device))
        self.attn_part = torch.empty((self.max_programs, self.block_g, d), dtype=torch.float32, device=device)
        self.attn_lse = torch.empty((self.max_programs, self.block_g), dtype=torch.float32, device=device)
        self.part = torch.empty((_MAX_SPLITS, m, h), dtype=torch.float32, device=device)
        self.counters = torch.zeros(_COUNTERS, dtype=torch.int32, device=device)
        if m * c.num_kv_heads > 1024 or -(-h // self.plan.o_width) > 1024 or -(-h // self.plan.dn_width) > 1024:
            raise ValueError("too many arrival counters for the megakernel's buffer")

    def applies(self, batch, cache) -> bool:
        """A uniform one-token step of <= MAX_ROWS sequences, every row's hidden state asked for."""
        return (batch.max_q == 1 and 1 <= batch.num_tokens <= MAX_ROWS
                and int(batch.logit_rows.shape[0]) == batch.num_tokens and cache.k.is_contiguous()
                and cache.k.shape[0] == len(self.model.weights.layers))

    def __call__(self, batch, cache, *, stage_mode: bool | None = None) -> torch.Tensor:
        """The final-normed hidden rows [tokens, hidden] of a batch that `applies`; writes the
        tokens' keys and values into `cache`. stage_mode (default: under the interpreter): one
        launch per stage and layer instead of the persistent launch."""
        c = self.model.config
        out = torch.empty((batch.num_tokens, c.hidden_size), dtype=self.model.dtype, device=self.model.device)
        stage_mode = self.interpreted if stage_mode is None else stage_mode
        if not stage_mode:
            self.launch(batch, cache, out, -1)
            return out
        self.launch(batch, cache, out, 0)
        for layer in range(c.num_layers):
            for stage in range(1, 6):
                self.launch(batch, cache, out, stage, layer)
        self.launch(batch, cache, out, 6)
        return out

    def launch(self, batch, cache, out: torch.Tensor, stage: int, layer: int = 0) -> None:
        """One launch: the persistent forward (stage -1) or one stage of one layer: 0 the
        embedding rows into the residual stream, 1-5 the layer's A-E, 6 the final norm into out."""
        model, c, plan = self.model, self.model.config, self.plan
        if plan.programs > self.max_programs:
            raise ValueError(f"a plan of {plan.programs} programs; this megakernel's scratch holds {self.max_programs}")
        k_cache, v_cache = cache.k, cache.v
        _draft_forward_kernel[(plan.programs,)](
            batch.input_ids, batch.positions, batch.token_slots, batch.ctx_lens, batch.num_tokens, layer,
            c.num_layers, c.rms_norm_eps, model.scale * _LOG2E,
            model.weights.embed, self.wq, self.ws, self.qkv_bias, self.o_bias, self.in_norm, self.post_norm,
            model.weights.final_norm, model.cos, model.sin, k_cache, v_cache,
            self.x, self.q, self.attn, self.act, out, self.attn_part, self.attn_lse, self.part, self.counters,
            self.layer_bytes, self.ws.shape[1], k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            self.offsets[1], self.offsets[2], self.offsets[3], self.col_offsets[1], self.col_offsets[2],
            self.col_offsets[3], plan.qkv_width, plan.o_width, plan.o_k_per, plan.gu_width, plan.dn_width,
            plan.dn_k_per,
            H=c.hidden_size, I=c.intermediate_size, HEADS=c.num_heads, KV_HEADS=c.num_kv_heads, HEAD_DIM=c.head_dim,
            HAS_QKV_BIAS=self.has_qkv_bias, HAS_O_BIAS=self.has_o_bias, O_SPLITS=plan.o_splits,
            DN_SPLITS=plan.dn_splits, BLOCK_M=MAX_ROWS, BK=plan.block_k, BW_QKV=plan.bw_qkv, BW_O=plan.bw_o,
            BW_GU=plan.bw_gu, BW_DN=plan.bw_dn, BLOCK_G=self.block_g, BLOCK_N=64 if c.head_dim <= 128 else 32,
            BLOCK_H=_pow2(c.hidden_size), STAGE=stage, PREFETCH=plan.prefetch and not self.interpreted,
            SPIN_LIMIT=_SPIN_LIMIT, UPCAST=self.interpreted,
            DOT_PRECISION="ieee" if model.dtype == torch.float32 else "tf32",
            KV_LINES=-(-c.head_dim * model.dtype.itemsize // 128), SKIP=plan.skip, num_warps=plan.num_warps,
            num_stages=plan.num_stages)

    def error_flag(self) -> int:
        """Nonzero if a barrier of some launch gave up waiting (a bug: programs not co-resident)."""
        return int(self.counters[_ERROR])
