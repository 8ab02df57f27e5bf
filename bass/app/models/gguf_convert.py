"""Convert a llama/qwen2 GGUF into a local Hugging Face model directory.

The output (config.json, generation_config.json, model.safetensors, tokenizer.json,
tokenizer_config.json) loads with `AutoModelForCausalLM.from_pretrained(out_dir)` and
`AutoTokenizer.from_pretrained(out_dir)`. Weights are dequantized, so the directory holds the
GGUF's quantized values at `dtype` precision; quality matches the GGUF, not the original model.

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

from .errors import GGUFConversionError
from .fsutil import atomic_directory, ensure_free_space
from .gguf_config import build_config, build_generation_config, layer_biases, model_shape
from .gguf_metadata import GGUFMetadata
from .gguf_tensors import check_complete, dequantized_blocks, plan_tensors
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
    ensure_free_space(out_dir.parent, n_params * itemsize + _SMALL_FILES_BYTES, f"converting {gguf_path.name}")

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
    return out_dir


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
