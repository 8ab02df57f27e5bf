"""The target service with the draft model in its own process, on its device (`bass serve`'s
default where both models share a device).

Why (issue #13): through separate services a speculative step is two calls in sequence, a
Propose and then a Verify, each a round trip between processes, and the draft's tokens travel
to the coordinator and back before the target may start. In-process the coordinator instead
queues the verification behind the draft's forwards on the device, and the next step's proposal
behind the verification (coordinator/scheduler.py). Here one process serves both the
DraftWorker and the TargetWorker services, so the same chain runs in it: a `Speculate` call
carries a step's proposal, its verification and the next step's chained proposal, and is
answered once the verification is read; the chained proposal then runs on the GPU while the
answer travels and the coordinator commits. Both services still answer every other call as
before (a draft call of its own drops any chained proposal, since it changes the state the
chain was queued on), and both report one `instance_id`, by which the coordinator finds that
they share a process.
"""

from __future__ import annotations

import functools
import threading
import uuid

from bass.core.config import WorkerServiceConfig, same_device
from bass.core.errors import InvalidRequestError, PreconditionError
from bass.core.worker_api import SpeculateRequest, SpeculateResponse
from bass.draft_service.servicer import SERVICE_NAME as DRAFT_SERVICE, DraftServicer
from bass.draft_service.worker import DraftWorker
from bass.engine.runner import ModelRunner, use_device
from bass.target_service.servicer import SERVICE_NAME as TARGET_SERVICE, TargetServicer
from bass.target_service.worker import TargetWorker
from bass.transport.grpc_server import RunningServer, start_server


class Speculation:
    """Speculate calls over a draft and a target worker on one device. Not thread-safe: the
    caller holds the process's model lock."""

    def __init__(self, draft: DraftWorker, target: TargetWorker):
        self.draft, self.target = draft, target
        self._chain = None  # the proposal the last call chained, for the next call's use_chained

    def drop_chain(self) -> None:
        self._chain = None

    def run(self, request: SpeculateRequest) -> SpeculateResponse:
        chain, self._chain = self._chain, None
        seq_ids = [item.seq_id for item in request.verify.items]
        # Everything is checked before any work is queued: a refused call leaves no trace.
        for name, part in (("propose", request.propose), ("chain", request.chain)):
            if part is not None and [item.seq_id for item in part.items] != seq_ids:
                raise InvalidRequestError(f"{name}.seq_ids", "must be the verified sequences, in the same order")
        if request.propose is not None:
            lengths = {item.num_tokens for item in request.propose.items}
            if len(lengths) != 1 or min(lengths) < 1:
                raise InvalidRequestError("propose.num_tokens", "every sequence drafts the same number (>= 1) of tokens")
        if request.propose is None:
            if chain is None or not set(seq_ids) <= set(chain.seq_ids):
                raise PreconditionError("use_chained: no proposal was chained for these sequences by the last call")
            proposal = chain.select(seq_ids)
        else:
            proposal = self.draft.start_propose(request.propose)
        pending = self.target.start_verify(request.verify, drafts=proposal.on_device)
        next_chain = None
        if request.chain is not None and pending.verdicts_on_device is not None:
            next_chain = self._start_chain(request, pending, proposal.on_device.shape[1] + pending.tail)
        proposed = proposal.result()
        verified = pending.result()
        if next_chain is not None:
            next_chain.reconcile([v.tokens for v in verified.verdicts], pending.revised)
            self._chain = next_chain
        return SpeculateResponse(propose=proposed, verify=verified, chained=next_chain is not None,
                                 chained_gpu_s=chain.gpu_s if request.propose is None else 0.0)

    def _start_chain(self, request: SpeculateRequest, pending, verified_k: int):
        """The next step's proposal behind this verification, or None where its shape is not
        one the draft's self-feeding graphs run (the caller then proposes afresh)."""
        items = request.chain.items
        k = items[0].num_tokens if items else 0
        sampled = not all(item.sampling.params.greedy for item in items)
        if not self.draft.chains(len(items), k, verified_k, sampled, pending.tail):
            return None
        try:
            return self.draft.start_chained(request.chain, pending.verdicts_on_device, verified_k, pending.tail)
        except ValueError:  # e.g. no room in the cache for whatever the verification accepts
            return None


class ColocatedDraft:
    """The draft worker as its own service sees it here: each call of its own (a proposal of
    ragged lengths, a release, a reset) first drops the chained proposal."""

    def __init__(self, worker: DraftWorker, speculation: Speculation):
        self._worker, self._speculation = worker, speculation

    def __getattr__(self, name):
        return getattr(self._worker, name)

    def propose(self, request):
        self._speculation.drop_chain()
        return self._worker.propose(request)

    def release(self, seq_ids):
        self._speculation.drop_chain()
        self._worker.release(seq_ids)

    def reset(self):
        self._speculation.drop_chain()
        self._worker.reset()


def serve(target_config: WorkerServiceConfig, draft_config: WorkerServiceConfig) -> RunningServer:
    """Both models in this process, both services on the target's address."""
    target_runner = target_config.runner_config()
    draft_runner = draft_config.runner_config()
    if not same_device(draft_runner.device, target_runner.device):
        raise InvalidRequestError("draft.device", f"a co-located draft runs on the target's device "
                                                  f"({target_runner.device}), got {draft_runner.device}")
    use_device(target_runner.device)
    target = TargetWorker(ModelRunner(target_runner))
    draft = DraftWorker(ModelRunner(draft_runner.as_draft()), top_n=draft_config.draft_top_n)
    target.warm_up()
    draft.warm_up()
    return serve_workers(target, draft, host=target_config.host, port=target_config.port)


def serve_workers(target: TargetWorker, draft: DraftWorker, *, host: str = "127.0.0.1", port: int = 0) -> RunningServer:
    """Both services over these (warmed-up) workers, on one address."""
    speculation = Speculation(draft, target)
    lock, instance_id = threading.Lock(), uuid.uuid4().hex  # one device, one process: one lock for both
    target_servicer = TargetServicer(target, lock=lock, instance_id=instance_id, speculation=speculation)
    draft_servicer = DraftServicer(ColocatedDraft(draft, speculation), lock=lock, instance_id=instance_id)
    return start_server([target_servicer.register, draft_servicer.register], [TARGET_SERVICE, DRAFT_SERVICE],
                        host=host, port=port, engine=target,
                        thread_setup=functools.partial(use_device, target.runner.config.device))

