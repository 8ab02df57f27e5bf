"""Two verification rules compared on the same trajectories, by their exact acceptance odds.

Along sequences sampled from the target, every position has a target distribution p (after
temperature / top-k / top-p) and the draft's compact q (its shaped distribution's top N). How
likely the draft's token is accepted there depends only on (p, q) and the rule:
- the standard rule (sample from q, accept with min(1, p/q), resample from the residual):
  sum_v min(p_v, q_v) = 1 - TV(p, q), the best any coupling can do;
- the Gumbel coupling (both models take the argmax of their log-probabilities plus the same
  keyed Gumbel noise; accept iff the tokens are equal): with E_v = Exp(1) shared noise, v wins
  both races iff E_w > E_v * max(p_w / p_v, q_w / q_v) for every w != v, so
  P(accept) = sum_v 1 / sum_w max(p_w / p_v, q_w / q_v).
Both are computed exactly per position (no Monte Carlo noise), so one pass over a set of
trajectories compares the rules on equal terms.
"""

from __future__ import annotations

import logging
import time

import torch

from bass.coordinator.requests import GenerationRequest
from bass.coordinator.scheduler import Scheduler
from bass.coordinator.tokenizer import load_codec
from bass.core.config import RunnerConfig, SamplingParams, SchedulerConfig, DraftLengthConfig
from bass.core.worker_api import AddSequence
from bass.engine.runner import ModelRunner
from bass.engine.sampling import RowParams, compact_shaped, shape_probs
from bass.target_service.worker import TargetWorker

log = logging.getLogger(__name__)


def rule_acceptance(p: torch.Tensor, q_ids: torch.Tensor, q_probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row acceptance probability of the standard rule and of the Gumbel coupling.

    p: [R, V] target probabilities; q_ids, q_probs: [R, N] the draft's compact q (its support
    is where q_probs > 0). Returns (standard [R], gumbel [R]), float64.
    """
    p = p.double()
    q = q_probs.double()
    p_at = p.gather(-1, q_ids)  # [R, N]: p on q's tokens
    standard = torch.minimum(p_at, q).sum(-1)
    # Terms of sum_w max(p_w / p_v, q_w / q_v), multiplied through by p_v:
    # inside q's support max(p_w, q_w * p_v / q_v); outside it q_w = 0, leaving p_w.
    in_q = q > 0
    ratio = torch.where(in_q, p_at / q.clamp_min(1e-300), torch.zeros_like(q))  # p_v / q_v, [R, N]
    inside = torch.maximum(p_at[:, None, :], q[:, None, :] * ratio[:, :, None]) * in_q[:, None, :]  # [R, v, w]
    outside = 1.0 - (p_at * in_q).sum(-1)  # p's mass off q's support
    denominator = inside.sum(-1) + outside[:, None]  # [R, v]
    terms = torch.where(in_q & (p_at > 0), p_at / denominator.clamp_min(1e-300), torch.zeros_like(p_at))
    return standard, terms.sum(-1)


def tokens_per_step(alpha: float, k: int) -> float:
    """Expected tokens committed per sequence-step at per-token acceptance alpha and draft length k."""
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


@torch.inference_mode()
def teacher_forced_logits(runner: ModelRunner, sequences: list[tuple[list[int], list[int]]]) -> list[torch.Tensor]:
    """For each (prompt, output): the model's logits [len(output), V] at every output position
    (row j predicts output[j]), all sequences in one ragged forward."""
    ids = list(range(1, len(sequences) + 1))
    runner.add([AddSequence(i, tuple(prompt)) for i, (prompt, _) in zip(ids, sequences)])
    try:
        work = [(runner.get(i), list(output)) for i, (_, output) in zip(ids, sequences)]
        logits = runner.forward(work, [len(output) + 1 for _, output in sequences])
        return [rows[:-1] for rows in logits.split([len(output) + 1 for _, output in sequences])]
    finally:
        runner.release(ids)


def _score(target_runner, draft_runner, params, sequences, draft_top_n,
           draft_vocabs: tuple[int, ...]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Per draft vocabulary size N (0 = all): (standard, gumbel) acceptance at every position,
    the draft's logits restricted to token ids < N (an LM head over the N first ids)."""
    out = {n: ([], []) for n in draft_vocabs}
    for p_logits, q_logits in zip(teacher_forced_logits(target_runner, sequences),
                                  teacher_forced_logits(draft_runner, sequences)):
        row_params = RowParams.build([params] * p_logits.shape[0], p_logits.device)
        p = shape_probs(p_logits, row_params)
        for n in draft_vocabs:
            q_ids, q_probs = compact_shaped(q_logits[:, :n] if n else q_logits, row_params, draft_top_n)
            s, g = rule_acceptance(p, q_ids, q_probs)
            out[n][0].append(s.cpu())
            out[n][1].append(g.cpu())
    return {n: (torch.cat(s), torch.cat(g)) for n, (s, g) in out.items()}


def measure(target: RunnerConfig, draft: RunnerConfig, prompts: list[str], *, n: int, max_new_tokens: int,
            modes: dict[str, SamplingParams], draft_top_n: int = 64, batch_prompts: int = 8, seed: int = 0,
            draft_lengths: tuple[int, ...] = (1, 2, 4, 8), score_batch: int = 8, draft_vocabs: tuple[int, ...] = (0,),
            progress=None) -> list[dict]:
    """Sample n target trajectories per prompt in each mode (regular decoding), then score every
    position under both rules, for each draft vocabulary size in draft_vocabs (0 = the whole
    vocabulary; N: a draft whose LM head covers token ids < N, as in FR-Spec, which stays
    lossless since the target decides every token)."""
    codec = load_codec(target.model_dir)
    target_runner, draft_runner = ModelRunner(target), ModelRunner(draft)
    rows = []
    for name, params in modes.items():
        started = time.perf_counter()
        scheduler = Scheduler(TargetWorker(target_runner), None, codec,
                              SchedulerConfig(max_batch_size=batch_prompts * n, max_n=n, max_new_tokens=max_new_tokens,
                                              draft_length=DraftLengthConfig.parse("0")))
        requests = [GenerationRequest(prompt=p, n=n, max_new_tokens=max_new_tokens, sampling=params, seed=seed + i)
                    for i, p in enumerate(prompts)]
        scores = {vocab: ([], []) for vocab in draft_vocabs}
        for start in range(0, len(requests), batch_prompts):
            chunk = requests[start:start + batch_prompts]
            sequences = [(codec.encode(request.prompt), seq.token_ids)
                         for request, result in zip(chunk, scheduler.generate(chunk))
                         for seq in result.sequences if seq.token_ids]
            for first in range(0, len(sequences), score_batch):
                part = _score(target_runner, draft_runner, params, sequences[first:first + score_batch], draft_top_n,
                              draft_vocabs)
                for vocab, (s, g) in part.items():
                    scores[vocab][0].append(s)
                    scores[vocab][1].append(g)
            if progress:
                progress(f"{name}: {min(start + batch_prompts, len(requests))}/{len(requests)} prompts")
        row = {"mode": name, "temperature": params.temperature, "top_p": params.top_p, "prompts": len(prompts),
               "n": n, "max_new_tokens": max_new_tokens, "draft_top_n": draft_top_n}
        for vocab in draft_vocabs:
            s_all, g_all = torch.cat(scores[vocab][0]), torch.cat(scores[vocab][1])
            a_s, a_g = s_all.mean().item(), g_all.mean().item()
            result = {"positions": len(s_all), "alpha_standard": round(a_s, 4), "alpha_gumbel": round(a_g, 4),
                      "gumbel_over_standard": round(a_g / a_s, 4),
                      "tokens_per_step": {str(k): {"standard": round(tokens_per_step(a_s, k), 3),
                                                   "gumbel": round(tokens_per_step(a_g, k), 3)} for k in draft_lengths}}
            if vocab:
                row.setdefault("draft_vocab", {})[str(vocab)] = result
            else:
                row.update(result)
        row["wall_time_s"] = round(time.perf_counter() - started, 1)
        log.info("%s", row)
        rows.append(row)
    return rows
