"""Composition root for running everything in one process (CLI `bass generate`, tests)."""

from __future__ import annotations

from pathlib import Path

from bass.coordinator.scheduler import Scheduler
from bass.coordinator.tokenizer import load_codec
from bass.core.config import RunnerConfig, SchedulerConfig
from bass.draft_service.worker import DraftWorker
from bass.engine.runner import ModelRunner
from bass.target_service.worker import TargetWorker


def build_local_workers(target: RunnerConfig, draft: RunnerConfig | None = None, *,
                        draft_top_n: int = 64) -> tuple[TargetWorker, DraftWorker | None]:
    """Both workers in this process, warmed up as the services warm theirs (CUDA graphs for
    every step shape are captured here, and only those replay)."""
    target_worker = TargetWorker(ModelRunner(target))
    draft_worker = DraftWorker(ModelRunner(draft.as_draft()), top_n=draft_top_n) if draft is not None else None
    for worker in (target_worker, draft_worker):
        if worker is not None:
            worker.warm_up()
    return target_worker, draft_worker


def build_local_scheduler(target: RunnerConfig, draft: RunnerConfig | None = None, *,
                          scheduler: SchedulerConfig = SchedulerConfig(), draft_top_n: int = 64) -> Scheduler:
    target_worker, draft_worker = build_local_workers(target, draft, draft_top_n=draft_top_n)
    return Scheduler(target_worker, draft_worker, load_codec(Path(target.model_dir)), scheduler)
