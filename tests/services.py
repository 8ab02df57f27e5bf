"""Start the real draft, target and coordinator gRPC servers on free localhost ports."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from bass.coordinator import server as coordinator_server
from bass.core.config import CoordinatorConfig, DraftLengthConfig, DraftStreamConfig, SchedulerConfig, WorkerServiceConfig
from bass.draft_service import server as draft_server
from bass.target_service import colocated
from bass.target_service import server as target_server


@dataclass
class Services:
    target_config: WorkerServiceConfig
    draft_config: WorkerServiceConfig
    target: object
    draft: object
    coordinator: coordinator_server.Coordinator

    @property
    def address(self) -> str:
        return self.coordinator.address

    def restart_target(self):
        """Co-located (`draft` is `target`), the draft comes back with it."""
        config = replace(self.target_config, port=self.target.port)
        if self.draft is self.target:
            self.target = self.draft = colocated.serve(config, self.draft_config)
        else:
            self.target = target_server.serve(config)

    def restart_draft(self):
        self.draft = draft_server.serve(replace(self.draft_config, port=self.draft.port))

    def stop(self):
        self.coordinator.stop(grace_s=1)
        for s in {id(self.draft): self.draft, id(self.target): self.target}.values():
            s.stop(grace_s=0)


def start_services(target_dir: Path, draft_dir: Path, *, policy: str = "bass", num_slots: int = 16,
                   max_batch_size: int = 16, max_waiting: int = 64, max_seq_len: int = 1024,
                   metrics_port: int | None = None, colocate: bool = False, target_options: dict | None = None,
                   draft_options: dict | None = None, stream: dict | None = None,
                   **coordinator) -> Services:
    """`coordinator`: more CoordinatorConfig fields (e.g. reconnect_interval_s, max_request_bytes);
    target_options / draft_options: more WorkerServiceConfig fields of each model's service.
    colocate: one server for both models (`bass serve`'s default), else one each. stream: the
    scheduler's draft_stream (DraftStreamConfig's fields: streamed speculation)."""
    common = dict(num_slots=num_slots, max_seq_len=max_seq_len)
    target_cfg = WorkerServiceConfig(model_dir=target_dir, **common, **(target_options or {}))
    draft_cfg = WorkerServiceConfig(model_dir=draft_dir, **common, **(draft_options or {}))
    if colocate:
        target = draft = colocated.serve(target_cfg, draft_cfg)
    else:
        target = target_server.serve(target_cfg)
        draft = draft_server.serve(draft_cfg)
    coordinator = coordinator_server.serve(CoordinatorConfig(
        target_address=target.address, draft_address=draft.address, tokenizer_dir=target_dir, port=0,
        max_waiting=max_waiting, metrics_port=metrics_port,
        scheduler=SchedulerConfig(max_batch_size=max_batch_size, max_n=8, max_new_tokens=512,
                                  draft_length=DraftLengthConfig.parse(policy),
                                  draft_stream=DraftStreamConfig(**(stream or {}))),
        **{"reconnect_interval_s": 0.2, **coordinator}))
    return Services(target_cfg, draft_cfg, target, draft, coordinator)


def run_at_once(call: Callable[[int], None], times: int, timeout_s: float = 180.0) -> None:
    """call(0) .. call(times - 1), each on a thread of its own, all started before any is
    joined (concurrent clients); each join waits at most timeout_s."""
    threads = [threading.Thread(target=call, args=(i,)) for i in range(times)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
