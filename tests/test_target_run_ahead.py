"""The target worker running a regular step ahead of the previous one (target_service/worker.py):
in-process regular decoding keeps one Verify in flight, and the worker launches step t + 1 from
step t's tokens on the device before step t is read back. The output must be exactly what
step-by-step decoding gives (one call finished before the next starts), greedy and seeded
sampling, with requests joining, stopping and leaving mid-way, and when a sampled row's token is
decided again at the finish (the repair path)."""

import pytest
import torch

from bass.coordinator.requests import FinishReason, GenerationRequest
from bass.coordinator.scheduler import Scheduler
from bass.core.config import SamplingParams
from bass.core.worker_api import AddSequence, SequenceSampling, VerifyItem, VerifyRequest
from conftest import build_scheduler
from test_pipelined_decoding import run_staggered as staggered, tokens

SAMPLED = SamplingParams(temperature=0.8, top_p=0.95)


class StepByStep:
    """The in-process target with its calls one at a time: the reference."""

    overlaps_calls = False

    def __init__(self, worker):
        self.worker = worker

    def __getattr__(self, name):  # info, verify, release, reset, runner
        return getattr(self.worker, name)


class CountingLaunches:
    """Counts the worker's launches and how many ran ahead of the call before."""

    def __init__(self, worker):
        self.worker, self.launches, self.ahead = worker, 0, 0
        self._launch = worker._launch
        worker._launch = self

    def __call__(self, request, drafts=None):
        launched = self._launch(request, drafts)
        self.launches += 1
        self.ahead += launched.fed_at is not None
        return launched


def requests(sampling, stop_on=((), (), (), ())):
    return [GenerationRequest(prompt_ids=p, max_new_tokens=m, n=n, stop_token_ids=s, ignore_eos=True,
                              sampling=sampling, seed=200 + i)
            for i, (p, m, n, s) in enumerate(zip([(5, 17, 33), (42,), tuple(range(3, 22)), (100, 101)],
                                                 [9, 23, 4, 16], [1, 2, 1, 3], stop_on))]


def run_staggered(scheduler, reqs):
    """Two requests at the start, one after 3 steps, one after 6: each sequence's tokens and finish."""
    return tokens(staggered(scheduler, reqs))


def reference_scheduler(target_dir):
    s = build_scheduler(target_dir, None, "0")
    return Scheduler(StepByStep(s.target), None, s.codec, s.config)


@pytest.mark.parametrize("sampling", [SamplingParams(), SAMPLED], ids=["greedy", "sampled"])
def test_running_ahead_gives_the_step_by_step_tokens(llama_target, sampling):
    probe = run_staggered(reference_scheduler(llama_target), requests(sampling))
    # Requests 1 and 3 stop on a token their first sequence makes mid-way.
    reqs = requests(sampling, [(), (probe[1][0][0][6],), (), (probe[3][0][0][4],)])
    want = run_staggered(reference_scheduler(llama_target), reqs)
    scheduler = build_scheduler(llama_target, None, "0")
    counter = CountingLaunches(scheduler.target)
    got = run_staggered(scheduler, reqs)
    assert got == want
    assert {reason for r in got for _, reason in r} == {FinishReason.STOP, FinishReason.LENGTH}
    assert counter.ahead >= counter.launches // 2, (counter.ahead, counter.launches)
    runner = scheduler.target.runner
    assert not runner.sequences and runner.cache.free_slots == runner.config.num_slots, "every slot is freed"


def test_a_token_decided_again_at_the_finish_repairs_the_step_ahead(llama_target, monkeypatch):
    """With a race window of 2, most sampled rows' top-p cut lies outside it, so their first-pass
    token (which the step ahead already ran from) is replaced by the exact race's at the finish,
    and the step ahead is repaired. The tokens are still step-by-step decoding's."""
    import bass.engine.sampling as sampling
    import bass.target_service.worker as target_worker

    reqs = requests(SAMPLED)
    want = run_staggered(reference_scheduler(llama_target), reqs)
    repairs = []
    original = target_worker.TargetWorker._repair
    monkeypatch.setattr(sampling, "CUT_WINDOW", 2)
    monkeypatch.setattr(target_worker.TargetWorker, "_repair",
                        lambda self, launched, stale: repairs.append(len(stale)) or original(self, launched, stale))
    assert run_staggered(build_scheduler(llama_target, None, "0"), reqs) == want
    assert sum(repairs) >= 3, repairs


def test_a_speculative_step_after_an_unfinished_regular_one_finishes_it_first(llama_target):
    """The worker's own contract, without the scheduler: calls finish in launch order whatever
    order their results are asked in, and a call that cannot run ahead (drafts, new sequences)
    waits for the unfinished ones."""
    plain = build_scheduler(llama_target, None, "0").target
    worker = build_scheduler(llama_target, None, "0").target
    greedy = SequenceSampling(SamplingParams(), 1)
    add = VerifyRequest(items=[VerifyItem(1, (), greedy)], add=[AddSequence(1, (5, 6, 7))])
    step = VerifyRequest(items=[VerifyItem(1, (), greedy)])
    want = [plain.verify(add).verdicts[0].tokens]
    want += [plain.verify(step).verdicts[0].tokens for _ in range(2)]
    first = worker.start_verify(add)
    second = worker.start_verify(step)  # runs ahead of the first
    assert second._launched.fed_at is not None
    third = worker.start_verify(step)  # two unfinished: waits for the first, runs ahead of the second
    assert first._launched.response is not None and third._launched.fed_at is not None
    got = [third.result().verdicts[0].tokens, second.result().verdicts[0].tokens, first.result().verdicts[0].tokens]
    assert got[::-1] == want
    # Drafts of the target's own next tokens: all accepted, after the unfinished call is finished.
    nxt = plain.verify(step).verdicts[0].tokens
    after = plain.verify(step).verdicts[0].tokens
    pending = worker.start_verify(step)
    speculative = worker.verify(VerifyRequest(items=[VerifyItem(1, tuple(after), greedy)]))
    assert pending.result().verdicts[0].tokens == nxt
    assert speculative.verdicts[0].accepted == 1
    assert worker.runner.sequences[1].committed == plain.runner.sequences[1].committed + [
        speculative.verdicts[0].tokens[1]]
    worker.release([1])
    assert not worker.runner.sequences


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("sampling", [SamplingParams(), SAMPLED, SamplingParams(temperature=0.8, top_k=5)],
                         ids=["greedy", "sampled", "top_k"])
def test_running_ahead_on_the_gpu_through_cuda_graphs(llama_target, sampling):
    """On a GPU the step ahead replays a CUDA graph fed from the device while the previous step's
    verdicts travel to pinned memory; fp32, so the tokens must equal step by step's exactly (the
    host's redo and repair paths are the CPU's: a GPU decides every sampled row on the device)."""
    from bass.app.local import build_local_scheduler
    from bass.core.config import DraftLengthConfig, RunnerConfig, SchedulerConfig

    cfg = RunnerConfig(model_dir=llama_target, device="cuda", dtype="float32", num_slots=16, max_seq_len=256,
                       attention="triton")

    def scheduler():
        return build_local_scheduler(cfg, None, scheduler=SchedulerConfig(draft_length=DraftLengthConfig.parse("0")))

    base = scheduler()
    reqs = requests(sampling)
    want = run_staggered(Scheduler(StepByStep(base.target), None, base.codec, base.config), reqs)
    ahead = scheduler()
    counter = CountingLaunches(ahead.target)
    assert run_staggered(ahead, reqs) == want
    assert counter.ahead >= counter.launches // 2
    assert ahead.target.runner.graphs.graphs and not ahead.target.runner.sequences


@pytest.mark.skipif(torch.cuda.is_available(), reason="the services would run on the GPU in bf16, the reference in fp32")
def test_through_the_services_the_target_runs_regular_steps_ahead(llama_target, llama_draft, monkeypatch):
    """The coordinator's pipelined Verify frames (WorkerCall.pipelined) let the target service
    launch step t + 1 before it answers step t; requests from several clients at once, greedy
    and seeded sampling, give step-by-step decoding's tokens.

    On the CPU a launched step is done at once (its forward ran inside the launch), and the
    session answers a done call unless the next frame is already there: whether any step runs
    ahead would be a race with the coordinator. Here a step's verdicts are ready only 5 ms after
    its launch, as on a GPU, so the next frame comes first."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from bass.engine import transfer
    from bass.target_service import worker as target_worker

    class GpuPacedCopy(transfer.HostCopy):
        def __init__(self, values):
            super().__init__(values)
            self.ready_at = time.perf_counter() + 0.005

        def ready(self) -> bool:
            return time.perf_counter() >= self.ready_at and super().ready()

    monkeypatch.setattr(target_worker, "HostCopy", GpuPacedCopy)

    from bass.app.client import FINISH_REASON_NAMES, BassClient
    from services import start_services

    reqs = requests(SamplingParams()) + requests(SAMPLED)
    want = [[(list(tokens), reason.value) for tokens, reason in r]
            for r in [run_staggered(reference_scheduler(llama_target), [q])[0] for q in reqs]]
    services = start_services(llama_target, llama_draft, policy="0")
    counter = CountingLaunches(services.target.engine)
    try:
        def ask(r):
            with BassClient(services.address, timeout_s=60) as client:
                answer = client.generate(list(r.prompt_ids), n=r.n, max_new_tokens=r.max_new_tokens, ignore_eos=True,
                                         seed=r.seed, temperature=r.sampling.temperature, top_p=r.sampling.top_p)
            return [(list(s.token_ids), FINISH_REASON_NAMES[s.finish_reason]) for s in answer.sequences]

        with ThreadPoolExecutor(len(reqs)) as pool:
            got = list(pool.map(ask, reqs))
        assert got == want
        assert counter.ahead > 0, (counter.ahead, counter.launches)
    finally:
        services.stop()


def test_a_step_reports_the_workers_wait_on_the_device_apart_from_its_host_work(llama_target, monkeypatch):
    """VerifyResponse.device_wait_s is the part of the worker's time blocked on the verdicts'
    copy from the device; the step breakdown's verify_host_ms is the rest. A copy made to take
    5 ms shows as at least 5 ms of wait a step, inside the worker's time and out of its host
    work."""
    import time

    from bass.engine.transfer import HostCopy

    def run(delay_s: float):
        scheduler = build_scheduler(llama_target, None, "0")
        original = HostCopy.tolist
        monkeypatch.setattr(HostCopy, "tolist", lambda self: time.sleep(delay_s) or original(self))
        scheduler.generate([GenerationRequest(prompt_ids=(5, 17, 33), max_new_tokens=12, ignore_eos=True)])
        monkeypatch.setattr(HostCopy, "tolist", original)
        return scheduler.step_stats

    slow, fast = run(0.005), run(0.0)
    assert slow.verify_device_wait_s >= 0.005 * slow.steps
    assert slow.verify_device_wait_s <= slow.verify_compute_s
    assert fast.verify_device_wait_s < 0.005 * fast.steps
    breakdown = slow.breakdown()
    assert breakdown["verify_host_ms"] == pytest.approx(
        breakdown["verify_ms"] - 1000 * slow.verify_device_wait_s / slow.steps)
    assert breakdown["verify_host_ms"] < breakdown["verify_ms"] - 4.5
