"""The sampled verification tail as one function of hidden states and a staged vector
(engine/verify_tail.py), which the target captures as a CUDA graph: it must give what the eager
path gives (the same tokens, accepted counts and redo flags), and through the worker on a GPU the
same text as a target without graphs."""

import numpy as np
import pytest
import torch

from bass.core.config import SamplingParams
from bass.engine import verify_tail
from bass.engine.sampling import RowParams, noise_keys, race_unsynced
from bass.engine.verification import verdict_columns

PARAMS = [SamplingParams(temperature=0.8, top_p=0.95), SamplingParams(),
          SamplingParams(temperature=1.0, top_k=5), SamplingParams(temperature=0.6)]


@pytest.mark.parametrize("k", [0, 3])
def test_the_tail_gives_the_eager_verdicts(k, monkeypatch):
    import bass.engine.sampling as sampling_module

    monkeypatch.setattr(sampling_module, "CUT_WINDOW", 8)  # some rows' cuts fall outside: redo flags
    torch.manual_seed(0)
    vocab, hidden_size, seqs, bucket = 300, 16, 3, 4
    rows = k + 1
    lm_head = torch.nn.Linear(hidden_size, vocab, bias=False)
    head = lambda h: lm_head(h).float() * 3  # noqa: E731 - peaked enough for varied nucleus sizes
    hidden = torch.randn(bucket * rows, hidden_size)
    row_params = [p for p in PARAMS[:seqs] for _ in range(rows)]
    keys = noise_keys([11 * i for i in range(seqs) for _ in range(rows)], [40 + j for _ in range(seqs)
                                                                            for j in range(rows)])
    logits = head(hidden[:seqs * rows])
    raced, _ = race_unsynced(logits, RowParams.build(row_params, "cpu"), keys)
    # Drafts: the target's own tokens with one changed, so accepted counts differ per sequence.
    drafts = raced.view(seqs, rows)[:, :k].clone()
    if k:
        drafts[1, 1] = (drafts[1, 1] + 1) % vocab
    staged = verify_tail.stage(row_params, keys.numpy(), bucket, rows)
    # The forward's input tokens: each sequence's pending token, then its drafts (padding: 0).
    input_ids = torch.zeros(bucket, rows, dtype=torch.int64)
    input_ids[:seqs, 0] = 7
    input_ids[:seqs, 1:] = drafts
    with torch.inference_mode():
        packed, tail_raced = verify_tail.sampled_verdicts(head, hidden, input_ids.view(-1), torch.from_numpy(staged),
                                                          bucket, rows)

    raced, redo = race_unsynced(logits, RowParams.build(row_params, "cpu"), keys)
    want = verdict_columns(raced, redo, drafts, torch.full((seqs,), k), [rows] * seqs)
    assert torch.equal(packed[:seqs], want)
    assert torch.equal(tail_raced[:seqs * rows], raced)
    assert redo.any(), "the test covers flagged rows"
    if k:
        assert packed[:seqs, 0].tolist() == [k, 1, k]
    assert not packed[seqs:, 1 + rows:].any(), "padding rows are greedy: never flagged"


def test_staged_values_are_carried_exactly():
    keys = np.array([2**32 - 1, 7], dtype=np.int64)
    params = [SamplingParams(temperature=0.7, top_p=0.9, top_k=151935), SamplingParams()]
    staged = verify_tail.stage(params, keys, 2, 2)
    assert staged.shape == (verify_tail.staged_width(2, 2),) == (7 * 4,)
    columns = torch.from_numpy(staged)[:7 * 4].view(7, 4)
    rows = RowParams.from_columns(columns[0:3].float(), columns[3:6].long(), any_greedy=True, any_truncation=True,
                                  max_top_k=0)
    want = RowParams.build(params, "cpu")
    assert torch.equal(rows.divisor[:2], want.divisor) and torch.equal(rows.top_p[:2], want.top_p)
    assert rows.top_k[:2].tolist() == want.top_k.tolist() == [151935, 0]
    assert columns[6, :2].long().tolist() == keys.tolist()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("policy", ["0", "3"], ids=["regular", "k3"])
def test_graph_tails_give_the_eager_text_on_the_gpu(llama_target, llama_draft, policy):
    """fp32 on the GPU: a target whose sampled tails replay as CUDA graphs emits, token for token,
    what a target without graphs emits, speculative and regular (run ahead), seeded sampling mixed
    with greedy rows and a top_k row."""
    from conftest import build_gpu_scheduler
    from test_target_run_ahead import SAMPLED, requests, run_staggered

    def scheduler(graphs: bool):
        return build_gpu_scheduler(llama_target, llama_draft, policy, cuda_graphs=graphs)

    reqs = requests(SAMPLED)
    reqs[1] = requests(SamplingParams())[1]  # a greedy request among sampled ones
    reqs[3] = requests(SamplingParams(temperature=0.9, top_k=7))[3]
    want = run_staggered(scheduler(False), reqs)
    graphs = scheduler(True)
    tails = []
    run_tail = graphs.target.runner.run_tail
    graphs.target.runner.run_tail = lambda *a, **kw: tails.append(1) or run_tail(*a, **kw)
    assert run_staggered(graphs, reqs) == want
    assert len(tails) > 5
