"""What several command groups share: the draft-length parser, config files under flags, and
the scheduler's flags (`bass coordinator`, `bass serve`, `bass bench serve --serve`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from bass.core.config import CoordinatorConfig, DraftLengthConfig, load_config_file
from bass.core.errors import BassError


def parse_draft_length(_ctx, _param, value: str) -> DraftLengthConfig:
    try:
        return DraftLengthConfig.parse(value)
    except BassError as e:
        raise click.BadParameter(str(e)) from None


def explicit(ctx: click.Context, names: list[str]) -> dict:
    """The options the user actually gave (so they override a config file, defaults do not)."""
    from click.core import ParameterSource

    return {n: ctx.params[n] for n in names
            if ctx.params.get(n) is not None and ctx.get_parameter_source(n) != ParameterSource.DEFAULT}


def load_config(config_file: str | None, config_json: str | None, cls, section: str | None):
    """A config from --config-json (used by `bass serve` for its children) or a [section] of a
    --config TOML file, else defaults."""
    from pydantic import TypeAdapter

    if config_json:
        return TypeAdapter(cls).validate_json(config_json)
    if config_file:
        serve = load_config_file(Path(config_file))
        value = getattr(serve, section)
        return value if value is not None else cls()
    return cls()


def fail(e: Exception):
    raise click.UsageError(str(e)) from None


def scheduler_options(f):
    for opt in reversed([
        click.option("--draft-length", callback=lambda c, p, v: None if v is None else parse_draft_length(c, p, v),
                     help="auto | bass | adaptive | fixed | K (0 = regular decoding) [auto]."),
        click.option("--max-batch-size", type=int, help="Sequences per step [64]."),
        click.option("--max-n", type=int, help="Largest n a request may ask for [16]."),
        click.option("--max-new-tokens-limit", "max_new_tokens", type=int, help="Largest max_new_tokens [2048]."),
        click.option("--max-waiting", type=int, help="Queued requests before RESOURCE_EXHAUSTED [256]."),
        click.option("--max-prefill-tokens-per-step", type=int,
                     help="Prompt tokens prefilled per step, target and draft together; a longer prompt goes "
                          "alone [512]."),
        click.option("--draft-stream", "draft_stream_block", type=int,
                     help="Streamed speculation: the draft drafts ahead on its own and each step verifies up to K "
                          "of its tokens a sequence (for a draft on a GPU of its own: --draft-device; more "
                          "settings in [coordinator.scheduler.draft_stream]); 0 = off [0]."),
    ]):
        f = opt(f)
    return f


def with_scheduler_options(ctx, cfg: CoordinatorConfig) -> CoordinatorConfig:
    sched = explicit(ctx, ["max_batch_size", "max_n", "max_new_tokens", "max_prefill_tokens_per_step"])
    if ctx.params.get("draft_length") is not None:
        sched["draft_length"] = ctx.params["draft_length"]
    block = explicit(ctx, ["draft_stream_block"]).get("draft_stream_block")
    if block is not None:
        sched["draft_stream"] = replace(cfg.scheduler.draft_stream, block=block)
    return replace(cfg, scheduler=replace(cfg.scheduler, **sched), **explicit(ctx, ["max_waiting"]))
