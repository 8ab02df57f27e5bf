"""The `bass` command line, one module per command group:

- `generate.py`: one request: `bass generate` (in this process) and `bass client` (to a
  running coordinator)
- `serve.py`: the whole system: `bass serve` (local processes), `bass up` / `bass down` (Ray),
  `bass demo`
- `services.py`: one service per process: `bass target-service`, `bass draft-service`,
  `bass coordinator`
- `bench.py`: `bass bench ...` measurements
- `models.py`: `bass fetch-models`, `bass convert-gguf`
- `eval.py`: `bass eval humaneval`
- `kernels.py`: `bass build-kernels` (the few-row CUDA kernel, ahead of the first model load)
- `options.py`: what several groups share

Commands import what they run when they run, so `bass --help` stays fast.
"""

from __future__ import annotations

import logging
import sys

import click

from bass.app.cli import bench, generate, kernels, models, serve, services
from bass.app.cli import eval as evaluation  # as `eval`, it would hide the builtin here


@click.group()
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """BASS: batched speculative decoding as a service."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


for group in (generate, serve, services, bench, models, evaluation, kernels):
    for command in group.COMMANDS:
        main.add_command(command)

if __name__ == "__main__":
    main()
