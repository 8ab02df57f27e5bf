"""Convert a llama/qwen2 GGUF into a local Hugging Face model directory.

The output (config.json, generation_config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, gguf_blocks/blocks.safetensors) loads with
`AutoModelForCausalLM.from_pretrained(out_dir)` and `AutoTokenizer.from_pretrained(out_dir)`.
Weights are dequantized, so the directory holds the GGUF's quantized values at `dtype`
precision; quality matches the GGUF, not the original model.
The projections stored as Q4_K / Q6_K are also kept as they are, in gguf_blocks/ (a third of the
bf16 bytes), for the engine's kernels that read them (`kquant_weights`); transformers ignores
the folder.

Everything derived from metadata (config, tokenizer) is built before any weight is touched, so
an unsupported file fails in about a second. Weights then stream tensor by tensor (in row
blocks) into model.safetensors, and the directory is published atomically at the end.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from gguf import GGUFReader
from tqdm import tqdm

from bass.engine.weights import GGUF_BLOCKS_FILE

from .errors import GGUFConversionError
from .fsutil import atomic_directory, ensure_free_space
from .gguf_config import build_config, build_generation_config, layer_biases, model_shape
from .gguf_metadata import GGUFMetadata
from .gguf_tensors import check_complete, dequantized_blocks, keeps_blocks, plan_tensors, raw_block_rows
from .gguf_tokenizer import build_tokenizer_files
from .safetensors_stream import SafetensorsStreamWriter, TensorEntry

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}

# Tokenizer and JSON files are a few MB; the 150k-token Qwen tokenizer.json is about 7 MB.
_SMALL_FILES_BYTES = 32 * 1024 * 1024


def convert_gguf(
    gguf_path: str | Path,
    out_dir: str | Path,
    dtype: str = "bfloat16",
    progress: bool = True,
    *,
    overwrite: bool = False,
) -> Path:
    """Convert `gguf_path` into an HF directory at `out_dir`; return `out_dir`.

    `overwrite` allows replacing an existing model directory (one containing config.json);
    an empty or missing `out_dir` is always fine. Raises GGUFConversionError for unsupported or
    malformed files and NotEnoughDiskSpaceError when the output would not fit.
    """
    if dtype not in DTYPES:
        raise GGUFConversionError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    try:
        reader = GGUFReader(gguf_path)
    except (OSError, ValueError) as exc:  # gguf raises ValueError on a bad magic/version
        raise GGUFConversionError(f"cannot read GGUF {gguf_path}: {exc}") from exc

    meta = GGUFMetadata.from_reader(reader)
    jobs = plan_tensors(list(reader.tensors), meta.arch)
    shape = model_shape(meta, jobs)
    check_complete(jobs, shape.n_layers, tuple(layer_biases(shape)))
    config = build_config(meta, shape, dtype)
    generation_config = build_generation_config(meta)
    tokenizer_json, tokenizer_config = build_tokenizer_files(meta)

    torch_dtype = DTYPES[dtype]
    itemsize = torch.empty((), dtype=torch_dtype).element_size()
    n_params = sum(j.numel for j in jobs)
    block_jobs = [j for j in jobs if keeps_blocks(j)]
    block_bytes = sum(int(j.source.n_bytes) for j in block_jobs)
    ensure_free_space(out_dir.parent, n_params * itemsize + block_bytes + _SMALL_FILES_BYTES,
                      f"converting {gguf_path.name}")

    with atomic_directory(out_dir, overwrite) as tmp:
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "generation_config.json", generation_config)
        _write_json(tmp / "tokenizer_config.json", tokenizer_config)
        (tmp / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
        writer = SafetensorsStreamWriter(
            tmp / "model.safetensors",
            [TensorEntry(j.hf_name, j.shape) for j in jobs],
            torch_dtype,
            # "format": "pt" is what transformers checks to accept a safetensors file.
            {"format": "pt", "source": f"gguf:{gguf_path.name}"},
        )
        bar = tqdm(
            total=n_params,
            unit="param",
            unit_scale=True,
            desc=f"dequantizing {gguf_path.name}",
            file=sys.stderr,
            disable=not progress,
            mininterval=1.0,
        )
        try:
            for job in jobs:
                bar.set_postfix_str(job.source.name, refresh=False)
                for block in dequantized_blocks(job, shape.head_dim):
                    writer.write(job.hf_name, block)
                    bar.update(block.size)
            writer.close()
        except BaseException:
            writer.abort()
            raise
        finally:
            bar.close()
        if block_jobs:
            _write_raw_blocks(tmp / GGUF_BLOCKS_FILE, block_jobs, shape.head_dim, gguf_path.name)
    return out_dir


def _write_raw_blocks(path: Path, jobs: list, head_dim: int, source: str) -> None:
    """The k-quant projections' GGUF blocks, uint8 [rows, bytes a row] under their HF names; the
    metadata names each one's format."""
    path.parent.mkdir()
    rows = {j.hf_name: raw_block_rows(j, head_dim) for j in jobs}
    writer = SafetensorsStreamWriter(
        path, [TensorEntry(name, r.shape) for name, r in rows.items()], torch.uint8,
        {"format": "pt", "source": f"gguf:{source}", **{j.hf_name: j.source.tensor_type.name for j in jobs}})
    try:
        for name, r in rows.items():
            writer.write(name, r)
        writer.close()
    except BaseException:
        writer.abort()
        raise


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
