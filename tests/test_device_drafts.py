"""In-process, the target verifies the draft's proposal where it lies, on the device: the
verification is queued behind the draft's forwards, and the host reads the drafts back while the
target runs (Scheduler.step, TargetWorker.start_verify(drafts=...)). The text must be the text of
the host path (drafts sent in the request), token for token, greedy and sampled, with proposals
rejected and accepted whole; the target's cache must keep exactly the committed prefix."""

import pytest
import torch

from bass.coordinator.requests import GenerationRequest
from bass.core.config import RunnerConfig, SamplingParams
from bass.core.worker_api import AddSequence
from bass.engine.runner import PLACEHOLDER, ModelRunner
from conftest import build_gpu_scheduler, build_scheduler


class HostDraftsTarget:
    """The in-process target as a remote one is used: drafts always come in the request."""

    verifies_device_drafts = False

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)


class CountingTarget:
    """The in-process target, counting Verify calls fed from the device and checking, after
    each, that the cache holds no unsettled draft."""

    def __init__(self, inner):
        self.inner, self.fed = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def start_verify(self, request, drafts=None):
        pending = self.inner.start_verify(request, drafts)
        if drafts is None:
            return pending
        self.fed += 1
        outer = self

        class Checked:
            def result(self):
                response = pending.result()
                runner = outer.inner.runner
                for item in request.items:
                    state = runner.get(item.seq_id)
                    cached = runner.cache.tokens(state.slot)
                    # Every accepted draft settled and kept: only the last token is pending.
                    assert PLACEHOLDER not in cached and cached == state.committed[:-1]
                return response

            def ready(self):
                return pending.ready()

            def discard(self):
                pending.discard()

        return Checked()


REQUESTS = [
    GenerationRequest(prompt_ids=(5, 17, 33), n=2, max_new_tokens=20, ignore_eos=True),
    GenerationRequest(prompt_ids=(9, 8, 7, 6), max_new_tokens=14, ignore_eos=True, seed=3,
                      sampling=SamplingParams(temperature=0.9, top_p=0.9)),
    GenerationRequest(prompt_ids=(40, 41), n=2, max_new_tokens=17, ignore_eos=True, seed=11,
                      sampling=SamplingParams(temperature=1.2, top_k=6)),
]


@pytest.mark.parametrize("policy", ["3", "bass", "auto"])
def test_verifying_on_the_device_gives_the_host_paths_text(llama_target, llama_draft, policy):
    host = build_scheduler(llama_target, llama_draft, policy)
    host.target = HostDraftsTarget(host.target)
    host.speculative.fed_verify = False
    want = [[s.token_ids for s in r.sequences] for r in host.generate(REQUESTS)]

    fed = build_scheduler(llama_target, llama_draft, policy)
    fed.target = CountingTarget(fed.target)
    results = fed.generate(REQUESTS)
    assert [[s.token_ids for s in r.sequences] for r in results] == want
    stats = [r.stats for r in results]
    assert fed.target.fed > 3, "the device path ran"
    assert sum(s.rejections for s in stats) > 0 and sum(s.accepted_tokens for s in stats) > 0


def test_the_draft_is_the_target_so_every_device_draft_is_accepted(llama_target):
    """With the draft = the target, greedy: every proposal is accepted whole, so each step
    settles all k drafts and commits one token more; the text is regular decoding's."""
    request = GenerationRequest(prompt_ids=(5, 17, 33), n=3, max_new_tokens=21, ignore_eos=True)
    (regular,) = build_scheduler(llama_target, None).generate([request])
    s = build_scheduler(llama_target, llama_target, "4")
    s.target = CountingTarget(s.target)
    (result,) = s.generate([request])
    assert [x.token_ids for x in result.sequences] == [x.token_ids for x in regular.sequences]
    assert result.stats.accepted_tokens == result.stats.draft_tokens > 0 and s.target.fed >= 4


def test_the_runner_takes_the_last_tokens_of_ragged_chunks_from_the_device(llama_target):
    """Chunks of 3 and 4 tokens whose last 2 come from a device tensor give the logits of the
    same chunks with those tokens in their lists."""
    runner = ModelRunner(RunnerConfig(model_dir=llama_target, num_slots=4, max_seq_len=32))
    runner.add([AddSequence(1, (5, 6, 7)), AddSequence(2, (8, 9, 10, 11)),
                AddSequence(3, (5, 6, 7)), AddSequence(4, (8, 9, 10, 11))])
    drafts = [[21, 22], [23, 24]]
    runner.commit(runner.get(2), [12])  # sequence 2 has two pending tokens: a 3-token chunk
    runner.commit(runner.get(4), [12])
    with torch.inference_mode():
        want = runner.run(runner.stage([(runner.get(1), drafts[0]), (runner.get(2), drafts[1])], [3, 3]))
        chunks = runner.stage([(runner.get(3), [PLACEHOLDER] * 2), (runner.get(4), [PLACEHOLDER] * 2)], [3, 3])
        assert [len(c.tokens) for c in chunks] == [3, 4]
        got = runner.run(chunks, torch.tensor(drafts))
    torch.testing.assert_close(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("policy", ["3", "bass"])
def test_device_drafts_through_cuda_graphs_give_the_host_paths_text(llama_target, llama_draft, policy):
    """fp32 on the GPU with CUDA graphs: the draft's self-feeding graphs hand their tokens to
    the target's captured forward and sampled tail; the text is the host path's."""
    host = build_gpu_scheduler(llama_target, llama_draft, policy)
    host.target = HostDraftsTarget(host.target)
    host.speculative.fed_verify = False
    want = [[s.token_ids for s in r.sequences] for r in host.generate(REQUESTS)]
    fed = build_gpu_scheduler(llama_target, llama_draft, policy)
    fed.target = CountingTarget(fed.target)
    assert [[s.token_ids for s in r.sequences] for r in fed.generate(REQUESTS)] == want
    assert fed.target.fed > 3
