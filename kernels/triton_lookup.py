"""Lookup tokens after a draft's in one Triton launch (reference: engine/lookup_tail.lookup_tail).

Per row, over s = the row's staged text followed by its drafts: the latest earlier occurrence
of s's last 3 tokens (else 2, else 1) that has a token after it, and the m tokens after that
occurrence (the row's last token where s ends or nothing recurs). The reference takes about
twenty launches of whole-batch tensor ops; on the target's critical path (the next Speculate
arrives after the GPU finished the chained proposal) each costs the host a launch. Here one
program a row holds the row in registers and compares shifted loads.

The draft length k and the lookup count m are runtime arguments, not constants of the kernel:
as constants each new (k, m) compiled a variant on its first use, a 0.1-0.3 s stall of a
verification on a fresh machine (H100, 2026-11-27: `auto`'s first steps at a new length). One
variant now serves every k up to MAX_DRAFTS and m up to MAX_M; the target worker compiles it at
warm-up.
"""

from __future__ import annotations

import torch

# Imported first: on a machine without a GPU it switches Triton to its interpreter (tests).
from bass.kernels import triton_attention  # noqa: F401

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

PAD = tl.constexpr(-1)  # the staged text's left padding (engine/lookup_tail.PAD); a constexpr for the kernels
# The block sizes of the one variant: up to this many drafts (graph_max_draft's bound) and lookup
# tokens (a power of two >= core.config.MAX_LOOKUP_TAIL); larger calls compile one of their own.
MAX_DRAFTS = 32
MAX_M = 8


@triton.jit
def _token(text_row, drafts_row, i, W: tl.constexpr, K):
    """s[i] for i in [0, W + K) (PAD outside): the staged text, then the drafts."""
    in_text = (i >= 0) & (i < W)
    in_drafts = (i >= W) & (i < W + K)
    a = tl.load(text_row + i, mask=in_text, other=PAD)
    b = tl.load(drafts_row + (i - W), mask=in_drafts, other=PAD)
    return tl.where(in_text, a, b)


# Triton compiles a variant per value class of an int argument (1, a multiple of 16, other)
# unless told not to: the drafts' and the output's row strides and k, m change with the step.
@triton.jit(do_not_specialize=["stride_d", "stride_o", "K", "M"])
def _lookup_tail_kernel(Text, Drafts, Out, stride_t, stride_d, stride_o,
                        K, M, W: tl.constexpr, BLOCK: tl.constexpr, BLOCK_M: tl.constexpr):
    row = tl.program_id(0)
    text_row = Text + row * stride_t
    drafts_row = Drafts + row * stride_d
    L = W + K
    # The suffix: s[L-1], s[L-2], s[L-3].
    last = tl.arange(0, 1)
    s1 = tl.sum(_token(text_row, drafts_row, L - 1 + last, W, K), 0)
    s2 = tl.sum(_token(text_row, drafts_row, L - 2 + last, W, K), 0)
    s3 = tl.sum(_token(text_row, drafts_row, L - 3 + last, W, K), 0)
    # Candidate ends e in [1, L - 1]: the occurrence is s[e - n .. e - 1], a token follows it.
    e = tl.arange(0, BLOCK)
    ok = (e >= 1) & (e <= L - 1)
    eq1 = ok & (_token(text_row, drafts_row, e - 1, W, K) == s1) & (s1 != PAD)
    eq2 = eq1 & (e >= 2) & (_token(text_row, drafts_row, e - 2, W, K) == s2) & (s2 != PAD)
    eq3 = eq2 & (e >= 3) & (_token(text_row, drafts_row, e - 3, W, K) == s3) & (s3 != PAD)
    m1 = tl.max(tl.where(eq1, e, -1), 0)
    m2 = tl.max(tl.where(eq2, e, -1), 0)
    m3 = tl.max(tl.where(eq3, e, -1), 0)
    best = tl.where(m3 >= 0, m3, tl.where(m2 >= 0, m2, m1))
    j = tl.arange(0, BLOCK_M)
    idx = best + j
    found = (best >= 0) & (idx < L)
    token = _token(text_row, drafts_row, tl.where(found, idx, L - 1), W, K)
    tl.store(Out + row * stride_o + j, token, mask=j < M)


def lookup_tail(text: torch.Tensor, drafts: torch.Tensor, m: int) -> torch.Tensor:
    """engine/lookup_tail.lookup_tail (longest n-gram 3) in one launch: text [B, W] and drafts
    [B, k] int64 on one device; returns int64 [B, m]."""
    num, width = text.shape
    k = drafts.shape[1]
    out = torch.empty((num, m), dtype=torch.int64, device=text.device)
    if num == 0 or m == 0:
        return out
    if k == 0:  # a pointer the kernel never reads (every draft load is masked)
        drafts = text[:, :1]
    _lookup_tail_kernel[(num,)](text, drafts, out, text.stride(0), drafts.stride(0), out.stride(0), k, m,
                                W=width, BLOCK=triton.next_power_of_2(width + max(k, MAX_DRAFTS) + 1),
                                BLOCK_M=max(MAX_M, triton.next_power_of_2(m)),
                                num_warps=4)
    return out
