"""The engine on a CUDA device (skipped without one)."""

import pytest
import torch

from bass.coordinator.requests import GenerationRequest
from bass.core.config import SamplingParams
from bass.engine.sampling import gumbel_noise, noise_keys

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_gumbel_noise_hash_is_bitwise_equal_on_cpu_and_gpu():
    """The integer hash agrees bit for bit (the float transform may differ in the last ulp,
    which only moves a near-tie: the target decides every token on one device)."""
    keys = noise_keys([1, 2**63 + 5, 12345678901234], [0, 7, 4095])
    tokens = torch.arange(151_936)[None, :]
    cpu = gumbel_noise(keys, tokens)
    gpu = gumbel_noise(keys.cuda(), tokens.cuda()).cpu()
    torch.testing.assert_close(cpu, gpu, rtol=1e-6, atol=1e-6)


def test_windowed_compact_q_is_the_full_path_distribution_on_gpu():
    """compact_shaped against compact(shape_probs) on a real vocabulary size, from bf16 logits
    (many exact ties, which the two may break differently: any q is lossless, so the check is
    that the probabilities agree and each kept token is among the row's most likely)."""
    from bass.engine.sampling import RowParams, compact, compact_shaped, shape_probs

    torch.manual_seed(0)
    vocab = 151_936
    logits = (torch.randn(8, vocab, device="cuda") * 4).to(torch.bfloat16).float()
    rows = RowParams.build([SamplingParams(temperature=0.8, top_p=0.95), SamplingParams(temperature=1.0, top_k=20),
                            SamplingParams(temperature=0.0), SamplingParams(temperature=0.6, top_p=0.5)] * 2, "cuda")

    def dense(ids, probs):
        return torch.zeros(ids.shape[0], vocab, device="cuda").scatter_add_(-1, ids, probs)

    want = dense(*compact(shape_probs(logits, rows), 64))
    ids, probs = compact_shaped(logits, rows, 64)
    got = dense(ids, probs)
    torch.testing.assert_close(got.sort(-1, descending=True).values[:, :64],
                               want.sort(-1, descending=True).values[:, :64], atol=1e-5, rtol=1e-3)
    kth = logits.topk(64, dim=-1).values[:, -1:]
    assert bool(((probs == 0) | (logits.gather(-1, ids) >= kth)).all())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("attention", ["pad", "split", "triton"])
def test_speculative_greedy_equals_regular_on_gpu(llama_target, llama_draft, dtype, attention):
    from bass.app.local import build_local_scheduler
    from bass.core.config import DraftLengthConfig, RunnerConfig, SchedulerConfig

    def run(policy, draft, **draft_options):
        cfg = dict(device="cuda", dtype=dtype, num_slots=16, max_seq_len=256, attention=attention)
        s = build_local_scheduler(RunnerConfig(model_dir=llama_target, **cfg),
                                  RunnerConfig(model_dir=draft, **cfg, **draft_options) if draft else None,
                                  scheduler=SchedulerConfig(draft_length=DraftLengthConfig.parse(policy)))
        return s.generate([GenerationRequest(prompt_ids=p, n=2, max_new_tokens=24, ignore_eos=True)
                           for p in [(5, 17, 33), (42,), tuple(range(3, 30))]])

    regular = [[s.token_ids for s in r.sequences] for r in run("0", None)]
    if dtype == "float32":
        for policy in ("bass", "3"):
            assert [[s.token_ids for s in r.sequences] for r in run(policy, llama_draft)] == regular
    # A draft identical to the target (its weights not made int8, as a draft's are by default with
    # the Triton kernels) is accepted everywhere (up to bf16 ties).
    same = run("4", llama_target, int8_weights=False)
    rate = sum(r.stats.accepted_tokens for r in same) / sum(r.stats.draft_tokens for r in same)
    assert rate > (0.999 if dtype == "float32" else 0.9)


def test_seeded_sampling_is_reproducible_on_gpu(llama_target, llama_draft):
    from bass.app.local import build_local_scheduler
    from bass.core.config import DraftLengthConfig, RunnerConfig, SchedulerConfig

    cfg = dict(device="cuda", dtype="float32", num_slots=16, max_seq_len=256)
    req = GenerationRequest(prompt_ids=(5, 17, 33), n=4, max_new_tokens=20, seed=3, ignore_eos=True,
                            sampling=SamplingParams(temperature=0.8, top_p=0.95))
    outs = []
    for policy in ("0", "2", "bass", "auto"):  # regular decoding included: every position is the target's race
        s = build_local_scheduler(RunnerConfig(model_dir=llama_target, **cfg), RunnerConfig(model_dir=llama_draft, **cfg),
                                  scheduler=SchedulerConfig(draft_length=DraftLengthConfig.parse(policy)))
        outs.append([x.token_ids for x in s.generate([req])[0].sequences])
    assert all(out == outs[0] for out in outs), outs


def test_cuda_graphs_with_triton_attention_match_eager_pad(llama_target, llama_draft):
    """Graph replays (uniform steps) and eager steps give the same greedy text (fp32)."""
    from bass.app.local import build_local_scheduler
    from bass.core.config import DraftLengthConfig, RunnerConfig, SchedulerConfig

    def run(attention, graphs, policy):
        cfg = dict(device="cuda", dtype="float32", num_slots=16, max_seq_len=256, attention=attention,
                   cuda_graphs=graphs)
        s = build_local_scheduler(RunnerConfig(model_dir=llama_target, **cfg), RunnerConfig(model_dir=llama_draft, **cfg),
                                  scheduler=SchedulerConfig(draft_length=DraftLengthConfig.parse(policy)))
        out = s.generate([GenerationRequest(prompt_ids=p, n=3, max_new_tokens=30, ignore_eos=True)
                          for p in [(5, 17, 33), (42,), tuple(range(3, 30))]])
        return [[x.token_ids for x in r.sequences] for r in out], s

    reference, _ = run("pad", False, "0")
    for policy in ("0", "4", "bass"):
        got, s = run("triton", True, policy)
        assert got == reference, policy
        assert s.target.runner.graphs.graphs, "uniform steps should have replayed CUDA graphs"


def test_warm_up_captures_every_serving_shape(llama_target, llama_draft):
    """After warm-up, steps at fixed draft lengths up to graph_max_draft capture nothing new
    (a capture mid-serving would be a slow step), and graphs hold hidden states, not logits."""
    from bass.app.local import build_local_scheduler
    from bass.coordinator.scheduler import Scheduler
    from bass.core.config import DraftLengthConfig, RunnerConfig, SchedulerConfig
    from bass.draft_service.worker import CATCH_UP_TOKENS
    from bass.engine.graphs import BATCH_BUCKETS

    cfg = dict(device="cuda", dtype="float32", num_slots=8, max_seq_len=256, attention="triton", graph_max_draft=4)
    s = build_local_scheduler(RunnerConfig(model_dir=llama_target, **cfg), RunnerConfig(model_dir=llama_draft, **cfg))
    target, draft = s.target.runner.graphs, s.draft.runner.graphs
    buckets = [b for b in BATCH_BUCKETS if b <= 8]
    assert set(target.graphs) == {(b, k + 1, k + 1) for b in buckets for k in range(5)}
    # One token, a proposal's first forward (two or three), and the catch-up after regular steps.
    assert set(draft.graphs) == {(b, q, 1) for b in buckets for q in (1, 2, 3) + CATCH_UP_TOKENS}
    loop = s.draft.loop  # the self-feeding proposal graphs
    # A proposal's first forward runs two or three pending tokens, a chained one two plus the
    # lookup tokens the target took after the drafts: up to 6 at buckets 1 and 2, 2 at 4, none at
    # 8 (within 16 rows).
    windows = {1: range(2, 9), 2: range(2, 9), 4: (2, 3, 4), 8: (2, 3)}
    assert set(loop.first) == {(b, q0, m) for b in buckets for q0 in windows[b] for m in ("greedy", "sampled")}
    assert set(loop.next) == {(b, m) for b in buckets for m in ("greedy", "sampled")}
    hidden = s.target.runner.model_config.hidden_size
    assert all(g.hidden.shape[-1] == hidden for g in target.graphs.values())
    before = (len(target.graphs), len(draft.graphs))
    for k in ("1", "3", "4"):
        scheduler = Scheduler(s.target, s.draft, s.codec, SchedulerConfig(draft_length=DraftLengthConfig.parse(k)))
        scheduler.generate([GenerationRequest(prompt_ids=(5, 17, 33), n=8, max_new_tokens=24, ignore_eos=True)])
    assert (len(target.graphs), len(draft.graphs)) == before


def test_batch_invariant_target_gives_the_same_tokens_alone_and_crowded_in_bf16(llama_target, llama_draft):
    """The target in batch-invariant mode (bf16, Triton GEMMs and attention with one plan): a
    seeded and a greedy request give the same tokens alone with regular decoding, alone with
    k = 4, and inside a crowded batch."""
    from bass.app.local import build_local_scheduler
    from bass.core.config import DraftLengthConfig, RunnerConfig, SchedulerConfig

    cfg = dict(device="cuda", dtype="bfloat16", num_slots=32, max_seq_len=256, attention="triton")
    mine = [GenerationRequest(prompt_ids=(5, 17, 33), n=2, max_new_tokens=40, seed=3, ignore_eos=True,
                              sampling=SamplingParams(temperature=0.8, top_p=0.95)),
            GenerationRequest(prompt_ids=(7, 8, 9, 10), max_new_tokens=40, ignore_eos=True)]
    others = [GenerationRequest(prompt_ids=tuple(range(1, 4 + i)), n=2, max_new_tokens=30, ignore_eos=True,
                                sampling=SamplingParams(temperature=1.0)) for i in range(10)]

    def run(policy, requests):
        s = build_local_scheduler(RunnerConfig(model_dir=llama_target, batch_invariant=True, **cfg),
                                  RunnerConfig(model_dir=llama_draft, **cfg),
                                  scheduler=SchedulerConfig(draft_length=DraftLengthConfig.parse(policy)))
        return [[x.token_ids for x in r.sequences] for r in s.generate(requests)]

    alone = [run("0", [r])[0] for r in mine]
    assert [run("4", [r])[0] for r in mine] == alone
    crowded = run("4", others[:5] + mine + others[5:])
    assert crowded[5:7] == alone
