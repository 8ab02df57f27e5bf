"""Ragged attention over the slot KV cache in Triton: one launch, no padding.

`attend_triton(q, k_cache, v_cache, batch, scale)` has the signature of every kernel in
`kernels/attention.py`: q / out are packed [tokens, heads, head_dim], the caches are
[slots, max_seq_len, kv_heads, head_dim] (one layer) and already hold this step's keys and values.
Query i of sequence b sits at position ctx_lens[b] - q_lens[b] + i and attends to keys
0..that position of slot slots[b]; query head h reads kv head h // (heads / kv_heads).

Layout. One program per (block of query rows, sequence, kv head). A block's rows are
(query token, head in the GQA group) pairs flattened token-major, so every K/V tile is loaded
once for the whole group and feeds one tensor-core product: a decode step of Qwen2.5-1.5B (group 6)
fills 6 of a 16-row block, a verify step with q_len 5 fills 30 of 32. Keys are walked in BLOCK_N
tiles with an online softmax (fp32 statistics and accumulator, exp2 domain) and only up to the
block's causal limit: tiles that every row of the block sees in full run without masks, the
last one or few (the causal diagonal, the context's end) with them. Blocks past a sequence's own
query length exit at once, so one grid covers a ragged batch (decode, verify, prefill chunks).

Split-KV (flash-decoding). When (blocks x sequences x kv heads) cannot fill the GPU (small
batches with long contexts) the key range is cut into equal splits of whole tiles, folded into the
third grid axis; each program writes its normalised partial output and log2-sum-exp to fp32
scratch, bumps an arrival counter, and the last of a block's splits to arrive merges them into the
output, reading up to 8 splits' partials in one round trip: still one Triton launch (the counters
it leaves zeroed serve the next launch: `arrivals`). The wrapper picks the split count
from the Python-side lengths in RaggedBatch, so it never syncs with the device. Each sequence's
split length comes from its own context, read on the device, with a floor the host sets: with
exact host-side lengths the floor is the longest context's split (every sequence splits alike);
in a CUDA graph, where the host only knows the cache's capacity, the floor is one tile, so a
decode step at a 500-token context still walks its keys in parallel, not in two long runs.

The module imports without Triton installed; `attend_triton` then raises a clear error. On the
CPU (tests) the kernels run in Triton's interpreter (TRITON_INTERPRET=1, which this module sets
when no CUDA device is present and Triton has not been imported yet).
"""

from __future__ import annotations

import os
import sys
from functools import lru_cache
from typing import NamedTuple

import torch

from bass.kernels.batch import RaggedBatch

# Without a GPU, Triton can only run kernels in its interpreter, which is chosen when Triton is
# first imported; turn it on here (unless the process already imported Triton or chose otherwise).
if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:  # Triton is optional: the registry imports this module lazily, and CPU-only installs lack it.
    import triton
    import triton.language as tl
except ImportError as _exc:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None
    _TRITON_IMPORT_ERROR: Exception | None = _exc
else:
    _TRITON_IMPORT_ERROR = None

try:  # grid dependency control (programmatic dependent launch), Triton >= 3.4
    import triton.language.extra.cuda as _gdc
    _GDC = hasattr(_gdc, "gdc_wait") and hasattr(_gdc, "gdc_launch_dependents")
except ImportError:  # pragma: no cover - older Triton, or none
    _gdc, _GDC = None, False

__all__ = ["attend_triton", "triton_available", "plan_launch", "plan_representatives", "LaunchPlan"]

_LOG2E = 1.4426950408889634
_INTERPRETED = False  # set below: whether triton.jit made interpreter functions
_SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def triton_available() -> bool:
    return triton is not None


# ----------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------
if triton is not None:

    @triton.jit
    def _ragged_attn_fwd(
        Q, K, V, Out, Lse, Final, Arrivals,
        Slots, QStarts, QLens, CtxLens,
        qk_scale,  # softmax scale * log2(e)
        split_size,  # the fewest keys per split (a multiple of BLOCK_N); unused when SPLIT is False
        stride_qt, stride_qh, stride_qd,
        stride_ks, stride_kn, stride_kh, stride_kd,
        stride_vs, stride_vn, stride_vh, stride_vd,
        stride_os, stride_ot, stride_oh, stride_od,  # Out (and Final); stride_os: the split axis
        stride_ls, stride_lt, stride_lh,
        NUM_KV_HEADS: tl.constexpr,
        GROUP: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        SPLIT: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
        UPCAST: tl.constexpr,  # fp32 operands for tl.dot (interpreter: its bf16 dot is wrong)
        MASK_EVERY_TILE: tl.constexpr,  # batch-invariant mode: one code path for every tile
        PDL: tl.constexpr,  # launched as a programmatic dependent launch (see attend_triton)
        MERGE_SPLITS: tl.constexpr = 8,  # splits whose partials the merge loads at once
    ):
        if PDL:
            # Nothing here may be read before the kernel that wrote q and the cache has finished.
            _gdc.gdc_wait()
        pid_m = tl.program_id(0)
        seq = tl.program_id(1)
        pid_hs = tl.program_id(2)
        kv_head = pid_hs % NUM_KV_HEADS
        split = pid_hs // NUM_KV_HEADS

        q_len = tl.load(QLens + seq).to(tl.int32)
        row0 = pid_m * BLOCK_M
        if row0 >= q_len * GROUP:  # this sequence has fewer query rows than the grid's widest
            return
        ctx = tl.load(CtxLens + seq).to(tl.int32)
        q_start = tl.load(QStarts + seq)  # int64
        slot = tl.load(Slots + seq)  # int64

        prefix = ctx - q_len  # position of the sequence's first query token
        tok_lo = row0 // GROUP
        tok_hi = tl.minimum((row0 + BLOCK_M - 1) // GROUP, q_len - 1)
        causal_hi = prefix + tok_hi + 1  # keys [0, causal_hi) are visible to some row of the block
        full = prefix + tok_lo + 1  # keys [0, full) are visible to every (valid) row
        hi = causal_hi
        lo = 0
        if SPLIT:
            # The sequence's own context cut into as many equal runs of whole tiles as the grid
            # has splits, never shorter than split_size (the host's floor; see plan_launch).
            num_splits = tl.num_programs(2) // NUM_KV_HEADS
            split_size = tl.maximum(split_size, tl.cdiv(tl.cdiv(ctx, num_splits), BLOCK_N) * BLOCK_N)
            lo = split * split_size
            hi = tl.minimum(hi, lo + split_size)
            if lo >= hi:  # this split lies entirely past the block's causal limit
                return
        full_end = tl.maximum(lo, (tl.minimum(full, hi) // BLOCK_N) * BLOCK_N)
        if MASK_EVERY_TILE:
            # Which tiles skip the mask depends on the block's first query token, so the same
            # key tile of the same query would go through either loop in a decode step (1 query)
            # and a verification (k + 1), and the compiler may round the two differently (e.g.
            # fusing the scale into the exponent's subtraction in one only). One loop for all.
            full_end = lo

        offs_m = row0 + tl.arange(0, BLOCK_M)
        tok = offs_m // GROUP
        head = kv_head * GROUP + offs_m % GROUP
        row_ok = tok < q_len
        pos = prefix + tok
        offs_d = tl.arange(0, BLOCK_D)
        offs_n = tl.arange(0, BLOCK_N)
        d_ok = offs_d < HEAD_DIM

        q_ptrs = (Q + (q_start + tok)[:, None] * stride_qt + head[:, None] * stride_qh
                  + offs_d[None, :] * stride_qd)
        q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)

        k_base = K + slot * stride_ks + kv_head * stride_kh
        v_base = V + slot * stride_vs + kv_head * stride_vh
        k_ptrs = k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
        v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd

        # A finite floor instead of -inf keeps fully masked rows (a split before a row's
        # position, padding rows) free of inf - inf; their weights are exp2(-inf) = 0.
        m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

        # Tiles every row sees in full: no masks (the key range ends before the context's end).
        for start in range(lo, full_end, BLOCK_N):
            if HEAD_DIM == BLOCK_D:
                k = tl.load(k_ptrs + start * stride_kn)
                v = tl.load(v_ptrs + start * stride_vn)
            else:
                k = tl.load(k_ptrs + start * stride_kn, mask=d_ok[None, :], other=0.0)
                v = tl.load(v_ptrs + start * stride_vn, mask=d_ok[None, :], other=0.0)
            if UPCAST:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new

        # The causal diagonal (and the context's end): mask keys past each row's position.
        for start in range(full_end, hi, BLOCK_N):
            n = start + offs_n
            n_ok = n < hi
            k = tl.load(k_ptrs + start * stride_kn, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
            v = tl.load(v_ptrs + start * stride_vn, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
            if UPCAST:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
            s = tl.where(n[None, :] <= pos[:, None], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new

        if PDL:
            # The keys are read: the next kernel (a product) may start and load its weights
            # during the stores and the split merge. Not at the start: its loads would compete
            # with the key loads (measured on an H100: no gain, 11% lost at 8 sequences).
            _gdc.gdc_launch_dependents()
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        out = acc / l_safe[:, None]
        o_ptrs = (Out + split.to(tl.int64) * stride_os + (q_start + tok)[:, None] * stride_ot
                  + head[:, None] * stride_oh + offs_d[None, :] * stride_od)
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
        if SPLIT:
            lse = m_i + tl.log2(l_safe)  # rows with no key in this split are never read back
            l_ptrs = Lse + split.to(tl.int64) * stride_ls + (q_start + tok) * stride_lt + head * stride_lh
            tl.store(l_ptrs, lse, mask=row_ok)
            # The last of this block's active splits to finish merges them all (no second
            # launch). The barrier orders every thread's partial stores before the counter's
            # release; the acquiring program reads the partials from L2 (.cg).
            num_active = (causal_hi + split_size - 1) // split_size
            tl.debug_barrier()
            counter = Arrivals + (seq * NUM_KV_HEADS + kv_head) * tl.num_programs(0) + pid_m
            if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == num_active - 1:
                # The merge reads every split's partials at once, not split by split: a loop whose
                # step t + 1 loads only after step t's sums would put one L2 round trip per split
                # on the step's critical path (8 splits in a decode step's graph). First the
                # rows' largest log2-sum-exp over all splits, then each split's weight from it,
                # added in split order (the same bits whatever the grid's other programs did).
                row_off = (q_start + tok) * stride_lt + head * stride_lh
                part_off = ((q_start + tok)[:, None] * stride_ot + head[:, None] * stride_oh
                            + offs_d[None, :] * stride_od)
                offs_c = tl.arange(0, MERGE_SPLITS)
                m_f = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
                for base in range(0, num_active, MERGE_SPLITS):
                    s_c = base + offs_c
                    # split s holds keys of a row only if it starts at or before the row's position
                    has_c = ((s_c[:, None] < num_active) & row_ok[None, :]
                             & ((s_c * split_size)[:, None] <= pos[None, :]))
                    lse_c = tl.load(Lse + s_c.to(tl.int64)[:, None] * stride_ls + row_off[None, :], mask=has_c,
                                    other=-1.0e30, cache_modifier=".cg")
                    m_f = tl.maximum(m_f, tl.max(lse_c, 0))
                l_f = tl.zeros([BLOCK_M], dtype=tl.float32)
                acc_f = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
                for base in range(0, num_active, MERGE_SPLITS):
                    for c in tl.static_range(MERGE_SPLITS):  # unrolled: the loads are independent
                        s_idx = base + c
                        has_keys = row_ok & (s_idx < num_active) & (s_idx * split_size <= pos)
                        lse_s = tl.load(Lse + s_idx.to(tl.int64) * stride_ls + row_off, mask=has_keys,
                                        other=float("-inf"), cache_modifier=".cg")
                        o_s = tl.load(Out + s_idx.to(tl.int64) * stride_os + part_off,
                                      mask=has_keys[:, None] & d_ok[None, :], other=0.0, cache_modifier=".cg")
                        w = tl.exp2(lse_s - m_f)
                        l_f += w
                        acc_f += o_s * w[:, None]
                tl.store(counter, 0)  # every split of the block has arrived: leave the counter zeroed
                final = acc_f / tl.where(l_f > 0.0, l_f, 1.0)[:, None]
                f_ptrs = (Final + (q_start + tok)[:, None] * stride_ot + head[:, None] * stride_oh
                          + offs_d[None, :] * stride_od)
                tl.store(f_ptrs, final.to(Final.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])

    _INTERPRETED = type(_ragged_attn_fwd).__name__ == "InterpretedFunction"


# ----------------------------------------------------------------------------------------------
# Launch planning (pure Python: reads only the host-side lists of RaggedBatch)
# ----------------------------------------------------------------------------------------------
class LaunchPlan(NamedTuple):
    block_m: int  # query rows ((token, head-in-group) pairs) per program
    block_n: int  # keys per tile
    num_warps: int
    num_stages: int
    num_splits: int  # split-KV: key-range splits (1: a single pass, no scratch)
    # The fewest keys per split, a multiple of block_n: the kernel cuts each sequence's context
    # into num_splits runs of whole tiles, none shorter than this.
    split_size: int


# The batch-invariant plan's split: on an H200 (bench/gpu/kernels/attention_layers.py, f0a744a,
# a forward's layers in one CUDA graph, 512-token contexts) 128 keys with 16-row blocks cost
# 6.2 / 7.8 / 18.5 µs a layer at 1 / 8 / 64 sequences of the 1.5B against the default plan's
# 7.0 / 8.6 / 12.8 (and the former invariant plan, one pass in 64-row blocks: 9.7 / 10.5 / 12.9).
INVARIANT_SPLIT_KEYS = 128
# Below this many keys per split, the partial writes and the merge cost more than the extra
# parallelism gains (H100, Qwen2.5-1.5B shapes).
_MIN_SPLIT_KEYS = 256


def _block_d(head_dim: int) -> int:
    return max(16, 1 << (head_dim - 1).bit_length())  # tl.arange needs a power of 2, tl.dot >= 16


@lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return 8  # interpreter: small, so that long contexts take the split path in CPU tests too


def plan_launch(q_lens: list[int], ctx_lens: list[int], group: int, num_kv_heads: int, head_dim: int,
                num_sms: int, *, block_m: int | None = None, block_n: int | None = None,
                num_warps: int | None = None, num_stages: int | None = None,
                num_splits: int | None = None, max_q: int | None = None,
                max_ctx: int | None = None, ctx_lens_are_bounds: bool = False) -> LaunchPlan:
    """Block sizes and the split-KV decision for one batch (keyword arguments override;
    max_q / max_ctx may be passed when already known). ctx_lens_are_bounds: the lengths are
    only upper bounds (a CUDA graph serves every context up to them), so each sequence's splits
    are sized on the device from its real context, down to one tile."""
    max_q = max(q_lens) if max_q is None else max_q
    max_ctx = max(ctx_lens) if max_ctx is None else max_ctx
    block_d = _block_d(head_dim)
    auto_block_m, auto_warps = block_m is None, num_warps is None
    if block_m is None:
        rows = max_q * group
        if rows <= 16:
            block_m = 16  # decode: group 6 or 7 fills 6-7 of the 16 rows a tensor-core tile needs
        elif rows <= 32:
            block_m = 32
        elif block_d <= 128 and min(q_lens) * group >= 128:
            block_m = 128  # every sequence is a long chunk (prefill, large verify)
        else:
            block_m = 64
    if block_n is None:
        block_n = 64 if block_d <= 128 else 32
    if num_warps is None:
        num_warps = 8 if block_m >= 128 else 4
    if num_stages is None:
        num_stages = 3 if block_d <= 128 else 2

    if num_splits is None:
        # Split the context when the grid would leave most SMs idle (under 2 programs per 2 SMs)
        # and the contexts are long: then the key range is shared out (splits of >= 256 keys,
        # about 2 programs per SM in all). Measured on an H100 (Qwen2.5-1.5B, bf16): batch 1-8
        # decode / verify over 64..2048-token contexts runs 1.5-2.5x faster split; contexts of
        # ~512 and grids of >= 128 programs gain nothing or lose to the merge.
        num_splits = 1
        # Under bounds the real contexts are unknown and each sequence sizes its own splits
        # (down to one tile), so even a short cache is worth splitting.
        long_enough = ctx_lens_are_bounds or max_ctx >= 4 * _MIN_SPLIT_KEYS
        if 2 * num_kv_heads * len(q_lens) <= num_sms and long_enough:
            programs = num_kv_heads * sum(-(-q * group // block_m) for q in q_lens)
            if 2 * programs <= num_sms:
                if auto_block_m and block_m > 16:
                    # Tiny batches: 16-row blocks give more programs and shorter merges (the
                    # last split merges its block's partials alone), e.g. batch 1 verify of 9
                    # tokens 22 -> 16 us, 33 tokens 26 -> 18 us.
                    programs_16 = num_kv_heads * sum(-(-q * group // 16) for q in q_lens)
                    if 2 * programs_16 <= num_sms:
                        block_m, num_warps, programs = 16, 4 if auto_warps else num_warps, programs_16
                most = 8 if ctx_lens_are_bounds else max_ctx // _MIN_SPLIT_KEYS
                num_splits = min(-(-2 * num_sms // programs), most, 32)
    num_splits = max(1, min(num_splits, -(-max_ctx // block_n)))
    split_size = -(-max_ctx // num_splits)
    split_size = -(-split_size // block_n) * block_n  # whole tiles
    num_splits = -(-max_ctx // split_size)
    if ctx_lens_are_bounds:
        split_size = block_n
    return LaunchPlan(block_m, block_n, num_warps, num_stages, num_splits, split_size)


def plan_key(plan: LaunchPlan) -> tuple:
    """What Triton compiles a variant of the kernel for (its constants): the block sizes, warps,
    stages, and whether the key range is split; not how many splits (a grid size)."""
    return plan.block_m, plan.block_n, plan.num_warps, plan.num_stages, plan.num_splits > 1


def plan_representatives(group: int, num_kv_heads: int, head_dim: int, num_sms: int, max_len: int,
                         max_batch: int, max_q: int = 128) -> list[tuple[int, int, int]]:
    """(sequences, query tokens each, context) of uniform steps, the smallest found for each kernel
    variant (plan_key) that an eagerly run step of up to max_q tokens a sequence and max_batch
    sequences can launch at contexts up to max_len. A step run eagerly (a draft's catch-up, a
    ragged verification, a prefill past the prefill graphs) would otherwise compile its variant
    when first met, inside a request (0.1-0.3 s on a fresh H100, 2026-11-27). A variant is a
    block height and split or not (warps and stages follow the block); uniform steps of one to
    max_batch sequences reach every such pair a ragged batch can."""
    found: dict[tuple, tuple[int, int, int]] = {}
    batches = [b for b in (1, 2, 4, 8, 16, 32, 64) if b <= max_batch]
    for ctx in (min(2 * _MIN_SPLIT_KEYS, max_len), 4 * _MIN_SPLIT_KEYS):  # under and at the split threshold
        for batch in batches:
            for q in range(1, max_q + 1):
                context = max(ctx, q)
                if context > max_len:
                    break
                plan = plan_launch([q] * batch, [context] * batch, group, num_kv_heads, head_dim, num_sms)
                found.setdefault(plan_key(plan), (batch, q, context))
    return list(found.values())


# ----------------------------------------------------------------------------------------------
# Wrapper
# ----------------------------------------------------------------------------------------------
_interpreter_patched = False


def _patch_interpreter_index() -> None:
    """Triton <= 3.6's interpreter turns a tensor into a loop bound with int(ndarray), which NumPy
    >= 2.4 rejects for its 1-element (not 0-d) scalars (triton-lang/triton#9171, fixed upstream by
    #9172). Apply the same one-line fix; it only touches interpreter runs, restored after each."""
    global _interpreter_patched
    if _interpreter_patched:
        return
    _interpreter_patched = True
    try:
        from triton.runtime import interpreter
        original = interpreter._patch_lang_tensor
    except (ImportError, AttributeError):  # a Triton whose interpreter is laid out differently
        return

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch_lang_tensor


def _check_device(device: torch.device) -> bool:
    """Whether the kernel runs interpreted; an error if that does not suit the tensors' device."""
    interpreted = _INTERPRETED
    if interpreted:
        _patch_interpreter_index()
    if device.type == "cpu" and not interpreted:
        raise RuntimeError("attend_triton got CPU tensors but Triton is not in interpreter mode: set "
                           "TRITON_INTERPRET=1 before triton is first imported")
    if device.type != "cpu" and interpreted:
        raise RuntimeError(f"attend_triton got {device} tensors but Triton runs in interpreter mode "
                           "(TRITON_INTERPRET is set)")
    return interpreted


def _programmatic_launch_available(device: torch.device, interpreted: bool) -> bool:
    return _GDC and not interpreted and device.type == "cuda" and _hopper_or_newer(device.index)


@lru_cache(maxsize=None)
def _hopper_or_newer(device_index: int | None) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def _check_inputs(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: RaggedBatch) -> None:
    if triton is None:
        raise RuntimeError(
            "the 'triton' attention kernel needs the triton package (pip install triton); "
            f"importing it failed: {_TRITON_IMPORT_ERROR}")
    if q.dim() != 3 or k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(f"expected q [T, H, D] and caches [S, L, Hkv, D]; got {tuple(q.shape)}, "
                         f"{tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    num_tokens, num_heads, head_dim = q.shape
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"head_dim mismatch: q has {head_dim}, the cache {k_cache.shape[3]}")
    if num_heads % k_cache.shape[2]:
        raise ValueError(f"{num_heads} query heads are not a multiple of {k_cache.shape[2]} kv heads")
    if head_dim > 256:
        raise ValueError(f"attend_triton supports head_dim <= 256, got {head_dim}")
    if q.dtype not in _SUPPORTED_DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"attend_triton supports fp32/fp16/bf16 with one dtype for q and the cache; "
                         f"got q {q.dtype}, k {k_cache.dtype}, v {v_cache.dtype}")
    if not q.device == k_cache.device == v_cache.device:
        raise ValueError("q and the caches must be on one device")
    if num_tokens != batch.num_tokens:
        raise ValueError(f"q has {num_tokens} tokens, the batch {batch.num_tokens}")


def attend_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: RaggedBatch,
                  scale: float, *, block_m: int | None = None, block_n: int | None = None,
                  num_warps: int | None = None, num_stages: int | None = None,
                  num_splits: int | None = None, mask_every_tile: bool = False, split_keys: int | None = None,
                  batch_invariant: bool = False, arrivals: torch.Tensor | None = None,
                  programmatic: bool = False) -> torch.Tensor:
    """Ragged causal GQA attention in one Triton launch.

    q: [T, H, D]; k_cache / v_cache: [slots, max_seq_len, Hkv, D] (any strides); returns a
    contiguous [T, H, D] in q's dtype. The keyword arguments override the launch heuristics
    (tests, benchmarks); mask_every_tile runs every key tile through the masked loop, which,
    with a fixed block_m and num_splits=1, makes a query row's result the same whatever the
    batch and however many query tokens its sequence has in the step (batch-invariant mode).
    split_keys (a multiple of the key tile): cut every context into splits of exactly this many
    keys from key 0, whatever the batch, so that with mask_every_tile and a fixed block_m a row's
    result is still the same in any batch, with split-KV's parallelism (num_splits is then the
    longest context's count). batch_invariant: the plan the batch-invariant mode runs, that:
    splits of INVARIANT_SPLIT_KEYS, every tile masked, and row blocks of 16 or 32 by the step's
    query rows (both take the same tensor-core instructions, so the same bits; 64 does not:
    bench/gpu/kernels/tile_bits.py).

    arrivals: a zeroed int32 buffer for split-KV's arrival counters, which the kernel leaves
    zeroed (each block's last split resets its counter), so one buffer serves every launch on
    a stream without a memset kernel per call (one per layer, inside every CUDA graph). Without
    it, or when it is too small for the grid, a fresh zeroed buffer is used.

    programmatic: launch with programmatic dependent launch where the GPU has it (Hopper and
    newer; ignored elsewhere and in the interpreter): the kernel may be scheduled while the one
    before it still runs, waits for it before reading anything, and lets the kernel after it
    start at once (a few-row product that loads its weights meanwhile: kernels/cuda/skinny_gemm.cu).
    Values are the same either way.
    """
    _check_inputs(q, k_cache, v_cache, batch)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    device = q.device
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=device)
    if num_tokens == 0:
        return out
    interpreted = _check_device(device)

    group = num_heads // num_kv_heads
    num_seqs = batch.num_seqs
    if batch_invariant:
        block_m = 16 if batch.max_q * group <= 16 else 32
        split_keys, mask_every_tile = INVARIANT_SPLIT_KEYS, True
    plan = plan_launch(batch.q_lens_list, batch.ctx_lens_list, group, num_kv_heads, head_dim, _num_sms(device),
                       block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages,
                       num_splits=num_splits, max_q=batch.max_q, max_ctx=batch.max_ctx,
                       ctx_lens_are_bounds=batch.ctx_lens_are_bounds)
    bm, bn, warps, stages, splits, split_size = plan
    if split_keys is not None:
        # As many splits as the longest context needs: then no sequence's splits grow past
        # split_keys in the kernel, so every split starts at a multiple of it.
        if split_keys % bn:
            raise ValueError(f"split_keys={split_keys} is not a multiple of the key tile ({bn})")
        split_size, splits = split_keys, -(-batch.max_ctx // split_keys)
    row_blocks = -(-batch.max_q * group // bm)
    grid = (row_blocks, num_seqs, num_kv_heads * splits)
    pdl = programmatic and _programmatic_launch_available(device, interpreted)
    meta = dict(NUM_KV_HEADS=num_kv_heads, GROUP=group, HEAD_DIM=head_dim, BLOCK_D=_block_d(head_dim),
                BLOCK_M=bm, BLOCK_N=bn, SPLIT=splits > 1,
                DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # only fp32 reads it
                UPCAST=interpreted and q.dtype == torch.bfloat16, MASK_EVERY_TILE=mask_every_tile, PDL=pdl,
                num_warps=warps, num_stages=stages)
    if pdl:
        meta["launch_pdl"] = True
    lens = (batch.slots, batch.q_starts, batch.q_lens, batch.ctx_lens)
    strides = (*q.stride(), *k_cache.stride(), *v_cache.stride())
    if splits == 1:
        _ragged_attn_fwd[grid](q, k_cache, v_cache, out, out, out, batch.slots, *lens,
                               scale * _LOG2E, split_size, *strides, 0, *out.stride(), 0, 0, 0, **meta)
        return out

    # Split-KV scratch: normalised partial outputs and log2-sum-exps per split, and one arrival
    # counter per (query block, sequence, kv head). The partials' strides double as the output's.
    part = torch.empty((splits, num_tokens, num_heads, head_dim), dtype=torch.float32, device=device)
    lse = torch.empty((splits, num_tokens, num_heads), dtype=torch.float32, device=device)
    counters = row_blocks * num_seqs * num_kv_heads
    if arrivals is None or arrivals.numel() < counters or arrivals.device != device:
        arrivals = torch.zeros(counters, dtype=torch.int32, device=device)
    _ragged_attn_fwd[grid](q, k_cache, v_cache, part, lse, out, arrivals, *lens,
                           scale * _LOG2E, split_size, *strides, *part.stride(), *lse.stride(), **meta)
    return out
