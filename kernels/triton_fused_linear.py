"""A decoder layer's projections for decode-sized batches, each one Triton kernel with its
elementwise neighbours fused in.

A decode step or a draft forward runs 1 to 16 rows. Its four GEMMs per layer read the whole
weight for a handful of rows, so they are bound by weight bytes, and the elementwise kernels
between them (RMSNorm, residual adds, SiLU * up, RoPE with the KV write) each cost a launch and
a dependency gap of their own (bench/results: ~250 kernels per 1.5B forward, ~1 ms of GPU idle
inside a graph replay at batch 8). Here a layer is five kernels:

    q          = rope_into_cache(rms_norm(x) @ W_qkv.T + b)    norm folded in, RoPE + KV write after
    attn       = attention(q)                                  (kernels/triton_attention.py)
    x          = x + attn @ W_o.T                              residual add after
    act        = silu(rms_norm(x) @ W_gate.T) * (... @ W_up.T) both halves in one program
    x          = x + act @ W_down.T                            residual add after

The norm is folded into the product, rms_norm(x) * g @ W.T = ((x * g) @ W.T) / rms(x), so the
sum of squares comes from the x tiles the product reads anyway; the rest rounds where
transformers rounds (kernels/elementwise.py): each GEMM output (bias added in fp32 first), the
residual sum, SiLU and its product, RoPE's products and sum. So values match the unfused path
up to rounding (the norm's, and the GEMM's accumulation order, as any two GEMM kernels differ).

Skinny products need many programs to keep the memory system busy, so a weight with few
output columns may split its reduction over K (SPLIT_K). The split is deterministic: every
program stores its fp32 partials, and the last to arrive (an arrival counter, left zeroed for
the next call) sums them in split order and runs the epilogue; no atomics touch the values.

Tiles are chosen per (projection, row bucket) by timing candidates on the device, once
(`FusedLinears.tune`, at warm-up); on the CPU (Triton's interpreter, tests) the first
candidate runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

# Imported first: on a machine without a GPU it switches Triton to its interpreter (tests).
from bass.kernels import triton_attention  # noqa: F401

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

log = logging.getLogger(__name__)

# Epilogues: the codes the kernels compare against (Triton reads globals as constexpr only).
_STORE, _RESIDUAL, _SILU_MUL, _ROPE_CACHE = (tl.constexpr(code) for code in range(4))
# Larger forwards (prefill chunks, verifications past batch 3) use cuBLAS and the separate
# kernels: on an H100 the fused kernels lost to them at 40 and 64 rows (bench/results).
MAX_ROWS = 16
BLOCK_M = 16  # tl.dot's smallest row block
# (BLOCK_N, BLOCK_K, warps, stages) candidates; see FusedLinears.candidates.
_TILES = ((16, 128, 8, 3), (32, 128, 4, 3), (32, 128, 8, 5), (64, 128, 8, 3), (32, 256, 4, 3), (16, 64, 4, 3))
_ARRIVAL_COUNTERS = 4096


@triton.jit
def _epilogue(acc1, acc2, rm, row_ok, col1, col2, n_ok, d, head, bias_ptr, res_ptr, out_ptr, out_stride,
              cos_ptr, sin_ptr, k_cache_ptr, v_cache_ptr, slots_ptr, pos_ptr, slot_stride, pos_stride,
              HAS_BIAS: tl.constexpr, EPILOGUE: tl.constexpr, HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
              HALF: tl.constexpr):
    dt = out_ptr.dtype.element_ty
    mask = row_ok[:, None] & n_ok[None, :]
    if HAS_BIAS:
        acc1 += tl.load(bias_ptr + col1, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if EPILOGUE >= _SILU_MUL:
            acc2 += tl.load(bias_ptr + col2, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y1 = acc1.to(dt).to(tl.float32)
    if EPILOGUE == _STORE:
        tl.store(out_ptr + rm[:, None] * out_stride + col1[None, :], y1.to(dt), mask=mask)
    elif EPILOGUE == _RESIDUAL:
        res = tl.load(res_ptr + rm[:, None] * out_stride + col1[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + rm[:, None] * out_stride + col1[None, :], (res + y1).to(dt), mask=mask)
    elif EPILOGUE == _SILU_MUL:
        u = acc2.to(dt).to(tl.float32)
        s = (y1 / (1.0 + tl.exp(-y1))).to(dt).to(tl.float32)
        tl.store(out_ptr + rm[:, None] * out_stride + col1[None, :], (s * u).to(dt), mask=mask)
    else:  # _ROPE_CACHE: col1 / col2 are a head's columns d and d + HALF
        y2 = acc2.to(dt).to(tl.float32)
        if head < HEADS + KV_HEADS:
            c1 = tl.load(cos_ptr + rm[:, None] * 2 * HALF + d[None, :], mask=mask, other=0.0).to(tl.float32)
            c2 = tl.load(cos_ptr + rm[:, None] * 2 * HALF + HALF + d[None, :], mask=mask, other=0.0).to(tl.float32)
            s1 = tl.load(sin_ptr + rm[:, None] * 2 * HALF + d[None, :], mask=mask, other=0.0).to(tl.float32)
            s2 = tl.load(sin_ptr + rm[:, None] * 2 * HALF + HALF + d[None, :], mask=mask, other=0.0).to(tl.float32)
            # x * cos + rotate_half(x) * sin, each product and the sum rounded to dtype
            o1 = ((y1 * c1).to(dt).to(tl.float32) + (-y2 * s1).to(dt).to(tl.float32)).to(dt)
            o2 = ((y2 * c2).to(dt).to(tl.float32) + (y1 * s2).to(dt).to(tl.float32)).to(dt)
            if head < HEADS:
                q = out_ptr + rm[:, None] * out_stride + head * 2 * HALF + d[None, :]
                tl.store(q, o1, mask=mask)
                tl.store(q + HALF, o2, mask=mask)
            else:
                slot = tl.load(slots_ptr + rm, mask=row_ok, other=0).to(tl.int64)
                pos = tl.load(pos_ptr + rm, mask=row_ok, other=0).to(tl.int64)
                k = k_cache_ptr + (slot * slot_stride + pos * pos_stride)[:, None] + (head - HEADS) * 2 * HALF + d[None, :]
                tl.store(k, o1, mask=mask)
                tl.store(k + HALF, o2, mask=mask)
        else:
            slot = tl.load(slots_ptr + rm, mask=row_ok, other=0).to(tl.int64)
            pos = tl.load(pos_ptr + rm, mask=row_ok, other=0).to(tl.int64)
            v = (v_cache_ptr + (slot * slot_stride + pos * pos_stride)[:, None]
                 + (head - HEADS - KV_HEADS) * 2 * HALF + d[None, :])
            tl.store(v, y1.to(dt), mask=mask)
            tl.store(v + HALF, y2.to(dt), mask=mask)


@triton.jit(do_not_specialize=["rows"])
def _fused_linear_kernel(a_ptr, w_ptr, bias_ptr, norm_ptr, res_ptr, out_ptr, part_ptr, squares_ptr, arrivals_ptr,
                         cos_ptr, sin_ptr, k_cache_ptr, v_cache_ptr, slots_ptr, pos_ptr,
                         rows, a_stride, out_stride, slot_stride, pos_stride, eps,
                         K: tl.constexpr, N: tl.constexpr, W_ROWS: tl.constexpr, HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
                         HALF: tl.constexpr, NORM: tl.constexpr, HAS_BIAS: tl.constexpr, EPILOGUE: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         SPLIT_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Program (n, m, s): output columns block n, rows block m, reduction split s. N is the
    number of output columns (for _SILU_MUL: the intermediate size; the up half's weights
    follow the gate's at row N); for _ROPE_CACHE the column blocks walk heads, HALF // BLOCK_N
    per head, and each pairs columns d and d + HALF for rotate-half."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rm < rows
    rk = tl.arange(0, BLOCK_K)
    dn = tl.arange(0, BLOCK_N)
    head = 0
    if EPILOGUE == _ROPE_CACHE:
        per_head = HALF // BLOCK_N
        head = pid_n // per_head
        d = (pid_n % per_head) * BLOCK_N + dn  # the column within the head's first half
        col1 = head * 2 * HALF + d
        col2 = col1 + HALF
        n_ok = d < HALF
    else:
        d = dn
        col1 = pid_n * BLOCK_N + dn
        col2 = col1 + N
        n_ok = col1 < N
    dt = w_ptr.dtype.element_ty

    # RMSNorm folded into the product: rms_norm(x) * g @ W.T = ((x * g) @ W.T) / rms(x), each
    # row's sum of squares gathered from the same x tiles the product reads (no pass before it).
    squares = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    blocks = K // BLOCK_K  # split s reduces blocks [s * blocks // SPLIT_K, (s + 1) * blocks // SPLIT_K)
    for k in range(pid_k * blocks // SPLIT_K * BLOCK_K, (pid_k + 1) * blocks // SPLIT_K * BLOCK_K, BLOCK_K):
        kk = k + rk
        a = tl.load(a_ptr + rm[:, None] * a_stride + kk[None, :], mask=row_ok[:, None], other=0.0)
        if NORM:
            x = a.to(tl.float32)
            squares += tl.sum(x * x, axis=1)
            a = (x * tl.load(norm_ptr + kk).to(tl.float32)[None, :]).to(dt)
        w1 = tl.load(w_ptr + col1[:, None] * K + kk[None, :], mask=n_ok[:, None], other=0.0)
        acc1 = tl.dot(a, tl.trans(w1), acc1, input_precision=DOT_PRECISION)
        if EPILOGUE >= _SILU_MUL:
            w2 = tl.load(w_ptr + col2[:, None] * K + kk[None, :], mask=n_ok[:, None], other=0.0)
            acc2 = tl.dot(a, tl.trans(w2), acc2, input_precision=DOT_PRECISION)

    if SPLIT_K > 1:
        # Partials of split s at part[s, row, weight row] and its rows' squares at
        # squares_part[s, row] (rows padded to whole blocks: no row mask). The last split to
        # arrive sums them all in split order, whoever it is: the result is deterministic.
        padded_rows = tl.num_programs(1) * BLOCK_M
        tl.store(part_ptr + (pid_k * padded_rows + rm)[:, None] * W_ROWS + col1[None, :], acc1, mask=n_ok[None, :])
        if EPILOGUE >= _SILU_MUL:
            tl.store(part_ptr + (pid_k * padded_rows + rm)[:, None] * W_ROWS + col2[None, :], acc2,
                     mask=n_ok[None, :])
        if NORM:
            tl.store(squares_ptr + pid_k * padded_rows + rm, squares)
        tl.debug_barrier()  # every thread's partial is stored before the counter's release
        counter = arrivals_ptr + pid_m * tl.num_programs(0) + pid_n
        last = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1
        if last:
            acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            squares = tl.zeros((BLOCK_M,), dtype=tl.float32)
            for s in range(0, SPLIT_K):
                at = part_ptr + (s * padded_rows + rm)[:, None] * W_ROWS
                acc1 += tl.load(at + col1[None, :], mask=n_ok[None, :], other=0.0, cache_modifier=".cg")
                if EPILOGUE >= _SILU_MUL:
                    acc2 += tl.load(at + col2[None, :], mask=n_ok[None, :], other=0.0, cache_modifier=".cg")
                if NORM:
                    squares += tl.load(squares_ptr + s * padded_rows + rm, cache_modifier=".cg")
            tl.store(counter, 0)  # every split has arrived: leave the counter zeroed for the next call
    else:
        last = True
    if last:
        if NORM:
            inv = tl.rsqrt(squares / K + eps)
            acc1 = acc1 * inv[:, None]
            acc2 = acc2 * inv[:, None]
        _epilogue(acc1, acc2, rm, row_ok, col1, col2, n_ok, d, head, bias_ptr, res_ptr, out_ptr, out_stride,
                  cos_ptr, sin_ptr, k_cache_ptr, v_cache_ptr, slots_ptr, pos_ptr, slot_stride, pos_stride,
                  HAS_BIAS, EPILOGUE, HEADS, KV_HEADS, HALF)


@dataclass(frozen=True)
class Tiling:
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    warps: int = 4
    stages: int = 4


def row_bucket(rows: int) -> int:
    return 1 << max(rows - 1, 0).bit_length()


class FusedLinears:
    """The fused projections of one model on one device, with the tiles chosen for them.

    Each call names its projection (`key`, e.g. "qkv" for all layers' q|k|v, whose shapes are
    equal), and the tile is looked up per (key, row bucket). `tune` times the candidates of
    the buckets that a forward of `rows` rows reaches; untuned calls (on the CPU, or inside a
    CUDA graph capture) take the first candidate."""

    def __init__(self, device: torch.device):
        self.device = device
        self.on_gpu = not triton_attention._check_device(device)  # the interpreter's checks and fixes
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count if self.on_gpu else 8
        # Arrival counters of split-K tiles: one buffer for every call, left zeroed by the kernel.
        self.arrivals = torch.zeros(_ARRIVAL_COUNTERS, dtype=torch.int32, device=device)
        self.chosen: dict[tuple[str, int], Tiling] = {}
        self.tuning = False

    # -- the projections -------------------------------------------------------------------------
    def norm_qkv_rope_into_cache(self, x: torch.Tensor, norm: torch.Tensor, eps: float, w: torch.Tensor,
                                 bias: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                                 k_cache: torch.Tensor, v_cache: torch.Tensor, token_slots: torch.Tensor,
                                 positions: torch.Tensor, heads: int, kv_heads: int) -> torch.Tensor:
        """rope_into_cache_reference(linear(rms_norm(x) * norm, w, bias), ...): writes k and v
        into the layer's cache, returns the rotated q [T, heads, D]."""
        rows, dim = x.shape[0], cos.shape[-1]
        q = torch.empty((rows, heads, dim), dtype=x.dtype, device=x.device)
        self._launch("qkv", x, w, bias, norm, eps, None, q, _ROPE_CACHE.value, n=heads * dim,
                     rope=(cos, sin, k_cache, v_cache, token_slots, positions, heads, kv_heads, dim // 2))
        return q

    def linear_residual(self, key: str, a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                        residual: torch.Tensor) -> torch.Tensor:
        """residual + linear(a, w, bias), rounded as two steps."""
        out = torch.empty((a.shape[0], w.shape[0]), dtype=a.dtype, device=a.device)
        self._launch(key, a, w, bias, None, 0.0, residual, out, _RESIDUAL.value, n=w.shape[0])
        return out

    def norm_gate_up_silu(self, x: torch.Tensor, norm: torch.Tensor, eps: float, w: torch.Tensor) -> torch.Tensor:
        """silu_mul_reference(linear(rms_norm(x) * norm, w)) for w = gate | up [2 I, hidden]."""
        inter = w.shape[0] // 2
        out = torch.empty((x.shape[0], inter), dtype=x.dtype, device=x.device)
        self._launch("gate_up", x, w, None, norm, eps, None, out, _SILU_MUL.value, n=inter)
        return out

    # -- tiles -------------------------------------------------------------------------------------
    def candidates(self, epilogue: int, n: int, k: int, half: int = 0, all_heads: int = 0) -> list[Tiling]:
        """Tiles worth timing for a [rows <= MAX_ROWS, k] x [n, k]^T product (for _ROPE_CACHE:
        `all_heads` heads of 2 * `half` columns): the (BLOCK_N, BLOCK_K, warps, stages) that came
        first for some projection of the 1.5B or the 0.5B in an H100 sweep (bench/results,
        bench/gpu/fused_linear.py --wide), each with the smallest split of K that gives the
        device a program per SM."""
        found: list[Tiling] = []
        for block_n, block_k, warps, stages in _TILES:
            if (epilogue == _ROPE_CACHE.value and half % block_n) or k % block_k:
                continue
            programs = all_heads * half // block_n if epilogue == _ROPE_CACHE.value else triton.cdiv(n, block_n)
            split = 1
            while programs * split < self.num_sms and split < 8 and 2 * split <= k // block_k:
                split *= 2
            found.append(Tiling(BLOCK_M, block_n, block_k, split, warps, stages))
        if not found:  # K or HALF not a multiple of the blocks above
            block_k = 64 if k % 64 == 0 else 32 if k % 32 == 0 else 16
            found.append(Tiling(BLOCK_M, 16, block_k, 1, 4, 2))
        return found

    def _launch(self, key, a, w, bias, norm, eps, residual, out, epilogue, *, n, rope=None) -> None:
        rows, k = a.shape
        if rows == 0:
            return
        half, all_heads = (rope[-1], rope[-3] + 2 * rope[-2]) if rope is not None else (0, 0)
        bucket = row_bucket(rows)
        tiling = self.chosen.get((key, bucket))
        if tiling is None:
            options = self.candidates(epilogue, n, k, half, all_heads)
            tiling = options[0]
            if self.tuning:
                tiling = self._time(options, lambda t: self._run(t, a, w, bias, norm, eps, residual, out, epilogue,
                                                               n, rope))
                log.info("fused linear %s, rows <= %d: %s", key, bucket, tiling)
            if self.tuning or not self.on_gpu:
                self.chosen[(key, bucket)] = tiling
        self._run(tiling, a, w, bias, norm, eps, residual, out, epilogue, n, rope)

    def _run(self, t: Tiling, a, w, bias, norm, eps, residual, out, epilogue, n, rope) -> None:
        rows, k = a.shape
        if epilogue == _ROPE_CACHE.value:
            cos, sin, k_cache, v_cache, slots, positions, heads, kv_heads, half = rope
            col_blocks = (heads + 2 * kv_heads) * (half // t.block_n)
            extra = (cos, sin, k_cache, v_cache, slots, positions)
            strides = (k_cache.stride(0), k_cache.stride(1))
        else:
            heads = kv_heads = half = 0
            col_blocks = triton.cdiv(n, t.block_n)
            extra = (w,) * 6
            strides = (0, 0)
        row_blocks = triton.cdiv(rows, t.block_m)
        part = squares = w
        if t.split_k > 1:
            if col_blocks * row_blocks > self.arrivals.numel():
                raise ValueError(f"{col_blocks * row_blocks} split-K tiles exceed the arrival counters")
            part = torch.empty((t.split_k, row_blocks * t.block_m, w.shape[0]), dtype=torch.float32, device=a.device)
            squares = torch.empty((t.split_k, row_blocks * t.block_m), dtype=torch.float32, device=a.device)
        grid = (col_blocks, row_blocks, t.split_k)
        _fused_linear_kernel[grid](
            a, w, bias if bias is not None else w, norm if norm is not None else w,
            residual if residual is not None else out, out, part, squares, self.arrivals, *extra,
            rows, a.stride(0), out.stride(0), *strides, eps,
            K=k, N=n, W_ROWS=w.shape[0], HEADS=heads, KV_HEADS=kv_heads, HALF=max(half, 1), NORM=norm is not None,
            HAS_BIAS=bias is not None, EPILOGUE=epilogue, BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k,
            SPLIT_K=t.split_k, DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
            num_warps=t.warps, num_stages=t.stages)

    def _time(self, options: list[Tiling], run) -> Tiling:
        """The fastest option, each timed from HBM (L2 flushed before every call, as in a real
        forward, where a layer's weights were evicted by the layers before it)."""
        if len(options) == 1:
            return options[0]
        flush = torch.ones(16 << 20, dtype=torch.float32, device=self.device)  # 64 MB, read: evicts L2
        best, best_us = options[0], float("inf")
        for option in options:
            run(option)  # compile and warm
            times = []
            for _ in range(5):
                flush.sum()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                run(option)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1000)
            us = sorted(times)[len(times) // 2]
            if us < best_us:
                best, best_us = option, us
        return best

    def tune(self, forward) -> None:
        """Run `forward()` (one forward of some row count) choosing each projection's tile by
        timing: once per (projection, row bucket)."""
        if not self.on_gpu:
            forward()
            return
        self.tuning = True
        try:
            forward()
        finally:
            self.tuning = False
