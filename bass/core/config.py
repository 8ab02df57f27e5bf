"""Every configuration type, typed and validated in one place.

Each config is a frozen dataclass that checks itself in __post_init__ and raises
InvalidRequestError naming the offending field, so the same checks guard the CLI, config files
and (later) gRPC requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from bass.core.errors import InvalidRequestError

DTYPES = ("float32", "bfloat16", "float16")
ATTENTION_BACKENDS = ("auto", "pad", "split", "triton")
DRAFT_LENGTH_POLICIES = ("auto", "bass", "fixed", "adaptive")


def _require(ok: bool, field_name: str, message: str) -> None:
    if not ok:
        raise InvalidRequestError(field_name, message)


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


# Temperatures below this are greedy (temperature 0). At 1e-5 a logit gap of 1e-4 is already a
# factor e^10; what lies below can only be a tie or an overflow (logits / 1e-38 is inf).
GREEDY_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """How one sequence turns logits into a token; shapes target and draft distributions alike.

    temperature 0 means greedy, and so does any temperature below GREEDY_TEMPERATURE: dividing
    logits by a temperature that small overflows float32 (inf / inf = NaN probabilities), and
    long before that the distribution is already one-hot, so the greedy limit is what such a
    request means. top_k 0 and top_p 1.0 mean "off"; a top_k beyond the vocabulary keeps it all.
    """

    __pydantic_config__ = {"extra": "forbid"}  # config files: unknown keys are errors

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        _require(_finite(self.temperature) and self.temperature >= 0, "temperature",
                 f"must be a finite number >= 0, got {self.temperature!r}")
        if self.temperature < GREEDY_TEMPERATURE:
            object.__setattr__(self, "temperature", 0.0)  # the greedy limit (see the docstring)
        _require(isinstance(self.top_k, int) and self.top_k >= 0, "top_k",
                 f"must be an integer >= 0 (0 = off), got {self.top_k!r}")
        _require(_finite(self.top_p) and 0 < self.top_p <= 1, "top_p",
                 f"must be in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def resolve_device(device: str) -> str:
    """'auto': the GPU where there is one."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def same_device(a: str, b: str) -> bool:
    """Whether two device names are one device ("cuda" is the first GPU, as torch has it)."""
    def indexed(d: str) -> str:
        return f"{d}:0" if d == "cuda" else d
    return indexed(a) == indexed(b)


def resolve_dtype(dtype: str, device: str) -> str:
    """'auto': bfloat16 on a GPU, float32 on the CPU."""
    return ("bfloat16" if device.startswith("cuda") else "float32") if dtype == "auto" else dtype


# Draft lengths whose verification is captured as CUDA graphs by default; "auto" draft length
# considers no longer drafts (longer ones run eagerly, slower than they pay).
GRAPH_MAX_DRAFT = 8
# The most lookup tokens a target appends to a draft's proposal (engine/lookup_tail.py): the
# draft's chained forward re-runs this many more tokens (engine/draft_loop.py), whose graphs it
# captures at start, for the batch buckets where that forward stays within the fused few-row
# path (draft_loop.CHAINED_MAX_ROWS: up to 6 at one and two sequences, 2 at three or four).
MAX_LOOKUP_TAIL = 6
# The default: the most the draft's chained forward takes. On an H200 through the services, 6
# against 2 is 5-14% faster at two sequences (two machines, greedy; k = 3, 4 and auto) and 6-8%
# at T = 0.8; at three or four the cap is 2 either way (bench/results/2026-11-28-h200x2-
# lookup-tails/); 2 against none
# was 4-5% faster at 1-4 sequences (bench/results/2026-11-27-h200-lookup-tail/). At one sequence
# the target also keeps the verification within 8 rows (target_service/worker.py).
DEFAULT_LOOKUP_TAIL = 6
# Lookups (prompt lookup: coordinator/lookup_drafts.py for streamed steps' stand-ins,
# engine/lookup_tail.py for the target's tail) search a sequence's last this many tokens: what
# recurs is mostly recent, and the host's indexing costs ~0.6 us a token (2-core CPU). On
# HumanEval's canonical solutions a 4-token lookup keeps 0.446 tokens on average with 256 tokens
# of prompt as with all of it (0.425 with 64): bench/cpu/lookup_stand_ins.py.
LOOKUP_WINDOW = 256


@dataclass(frozen=True)
class RunnerConfig:
    """One model with its KV cache on one device: what each model service runs."""

    __pydantic_config__ = {"extra": "forbid"}  # config files: unknown keys are errors

    model_dir: Path
    device: str = "cpu"
    dtype: str = "float32"
    num_slots: int = 64
    max_seq_len: int = 2048
    attention: str = "auto"  # auto: triton on CUDA (when Triton is installed), pad on the CPU
    # Replay uniform decode steps as CUDA graphs (CUDA with the triton kernel only).
    cuda_graphs: bool = True
    # Verification graphs are captured at start for draft lengths up to this; longer drafts
    # (e.g. the "bass" rule's up to 32) run eagerly unless this is raised.
    graph_max_draft: int = GRAPH_MAX_DRAFT
    # Compute every row the same way whatever the batch (engine/model.py): seeded and greedy
    # tokens then do not move with load in bf16 either. For the target, whose tokens are the
    # output; slower (one GEMM tiling for all shapes instead of cuBLAS's choice).
    batch_invariant: bool = False
    # A draft's option: its projections and LM head also kept as weight-only int8 (one scale per
    # output column), which steps of up to 16 rows read: half the bytes (kernels/triton_int8.py).
    # Changes the draft's numbers, so which tokens it proposes, never the output. With the
    # Triton kernels only (ignored with the PyTorch attention backends). None ("auto"): on for a
    # draft (`as_draft`), off for a target. On an H200 it made a draft forward ~14% cheaper at
    # one sequence with the same acceptance (bench/results, 2026-11-26).
    int8_weights: bool | None = None
    # Steps of 1-16 rows through the CUDA few-row kernel (kernels/cuda/skinny_gemm.cu; compiled
    # once per machine with nvcc, ~30 s, and skipped where there is none): each decoder layer in
    # five launches, the norms, RoPE and the cache writes, the residual adds and SiLU * up in the
    # products' epilogues (engine/fused_layers.py), and plain products through it where it times
    # faster at load. bf16 models with the Triton kernels on CUDA; never in the batch-invariant
    # mode. H100, a target forward's GPU time: -15% at 1-8 sequences and for a one-sequence
    # verification (bench/results, 2026-11-27 target fused). The norms' weights are folded into
    # the projections (rounded once), and steps of more than 16 rows (a verification of 8
    # sequences) run cuBLAS: a regular step and a verification round differently, so a near-tied
    # greedy token can differ between regular and speculative decoding at some batch sizes
    # (`batch_invariant` removes that, as it does the other shape-dependent roundings).
    few_row_cuda: bool = True
    # A target's option: after the draft's tokens of a proposal verified on the device (a draft
    # in the target's process), verify this many more, continued from the sequence's own text
    # (engine/lookup_tail.py; 0 = off; unused otherwise). Never changes the output. Not applied
    # past four sequences, cut to what the draft's chained forward takes at the batch
    # (engine/draft_loop.max_lookup_tail) and at one sequence to a verification of 8 rows.
    lookup_tail: int = DEFAULT_LOOKUP_TAIL
    # Launch the attention kernel and the few-row products as programmatic dependent launches on
    # Hopper and newer GPUs (ignored elsewhere): each may start while the kernel before it still
    # runs, loading its weights, and waits for it only before reading its outputs. Never changes a
    # value; off only to measure what it gives (bench/results, 2026-11-27 programmatic launch).
    programmatic_launch: bool = True

    def as_draft(self) -> "RunnerConfig":
        """This runner as a draft's: int8_weights "auto" (None) turned on (unless the runner is
        batch-invariant, whose fixed GEMM tiling int8 would replace)."""
        if self.int8_weights is None:
            return replace(self, int8_weights=not self.batch_invariant)
        return self

    @property
    def attention_backend(self) -> str:
        if self.attention != "auto":
            return self.attention
        if self.device.startswith("cuda"):
            from importlib.util import find_spec

            if find_spec("triton") is not None:
                return "triton"
        return "pad"

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_dir", Path(self.model_dir))
        _require(self.dtype in DTYPES, "dtype", f"must be one of {DTYPES}, got {self.dtype!r}")
        _require(self.device == "cpu" or self.device.startswith("cuda"), "device",
                 f"must be 'cpu' or 'cuda[:N]', got {self.device!r}")
        _require(self.num_slots >= 1, "num_slots", f"must be >= 1, got {self.num_slots}")
        _require(self.max_seq_len >= 2, "max_seq_len", f"must be >= 2, got {self.max_seq_len}")
        _require(self.attention in ATTENTION_BACKENDS, "attention",
                 f"must be one of {ATTENTION_BACKENDS}, got {self.attention!r}")
        _require(0 <= self.graph_max_draft <= 32, "graph_max_draft",
                 f"must be in [0, 32], got {self.graph_max_draft}")
        _require(not (self.int8_weights and self.batch_invariant), "int8_weights",
                 "is a draft's option and batch_invariant a target's: not both")
        _require(isinstance(self.lookup_tail, int) and 0 <= self.lookup_tail <= MAX_LOOKUP_TAIL, "lookup_tail",
                 f"must be an integer in [0, {MAX_LOOKUP_TAIL}], got {self.lookup_tail!r}")


@dataclass(frozen=True)
class DraftLengthConfig:
    """How many tokens the draft proposes per step.

    policy "auto" (default): one length for the batch, the one that maximizes throughput given
    the measured step costs and acceptance, 0 (regular decoding) where speculation does not
    pay. "bass": the paper's batch-level rule (start at `initial`, grow by 2 up to
    `max_length` when any sequence accepts all, shrink otherwise). "fixed": always `fixed`
    (0 = regular decoding). "adaptive": each sequence picks its own length from its acceptance
    history and a configured `cost_ratio` (draft step cost / target step cost).
    """

    __pydantic_config__ = {"extra": "forbid"}  # config files: unknown keys are errors

    policy: str = "auto"
    fixed: int = 4
    initial: int = 7  # "bass": the first length; "auto" starts at min(initial, 4) (draft_length.AUTO_INITIAL_LENGTH)
    max_length: int = 32
    cost_ratio: float = 0.2
    # "auto": from regular decoding, speculate only where its measured throughput beats regular
    # decoding by this fraction (see coordinator/draft_length.MeasuredCost).
    speculation_margin: float = 0.05

    def __post_init__(self) -> None:
        _require(self.policy in DRAFT_LENGTH_POLICIES, "draft_length.policy",
                 f"must be one of {DRAFT_LENGTH_POLICIES}, got {self.policy!r}")
        _require(0 <= self.fixed <= 64, "draft_length.fixed", f"must be in [0, 64], got {self.fixed}")
        _require(1 <= self.max_length <= 64, "draft_length.max_length",
                 f"must be in [1, 64], got {self.max_length}")
        _require(1 <= self.initial <= self.max_length, "draft_length.initial",
                 f"must be in [1, max_length={self.max_length}], got {self.initial}")
        _require(_finite(self.cost_ratio) and 0 <= self.cost_ratio <= 1, "draft_length.cost_ratio",
                 f"must be in [0, 1], got {self.cost_ratio}")
        _require(_finite(self.speculation_margin) and 0 <= self.speculation_margin <= 1,
                 "draft_length.speculation_margin", f"must be in [0, 1], got {self.speculation_margin}")

    @classmethod
    def parse(cls, text: str) -> "DraftLengthConfig":
        """'auto', 'bass', 'adaptive', 'fixed' or an integer k (a fixed length; 0 = regular decoding)."""
        text = text.strip().lower()
        if text.isdigit():
            return cls(policy="fixed", fixed=int(text))
        return cls(policy=text)

    @property
    def speculates(self) -> bool:
        return not (self.policy == "fixed" and self.fixed == 0)


@dataclass(frozen=True)
class DraftStreamConfig:
    """Streamed speculation (coordinator/streamed_step.py, draft_service/stream.py): the draft runs
    ahead on its own GPU and never waits for the target, nor the target for it."""

    __pydantic_config__ = {"extra": "forbid"}

    # 0 = off; K >= 1: each step verifies up to K of the drafts that arrived, per sequence.
    block: int = 0
    # The most tokens the draft runs ahead of what the target committed. 12 against 8: 3-5%
    # faster at 1 and 8 sequences on two H200s (one process pair; 16 no better than 12;
    # bench/results/2026-11-28-h200x2-lookup-tails/), as bench/cpu/stream_model.py predicts (4%).
    lookahead: int = 12
    # Draft tokens per sequence in one call of the draft's loop (published after each). 1 is
    # best measured (two H200s, 2026-11-27): the loop queues each call behind the last, so
    # small calls cost no GPU time, and a draft that must start over is told one call sooner.
    chunk: int = 1
    # Where a drafting sequence holds no draft yet (just joined, or its drafts were contradicted),
    # how long a step waits for the draft's next tokens before verifying stand-ins for it.
    wait_ms: float = 0.0
    # Above this many running sequences, regular decoding instead (steps kept in flight): on two
    # H200s at 64 sequences, streamed steps cost 3.3 ms a token against 2.35 regular (2026-11-27).
    max_batch: int = 16
    # Positions of a block the draft leaves empty verify what followed the last recurrence of the
    # sequence's latest tokens, matching up to this many of them (coordinator/lookup_drafts.py);
    # 0: its last token repeated. Free on the GPU (the positions are verified anyway), lossless.
    lookup: int = 3

    def __post_init__(self) -> None:
        _require(isinstance(self.block, int) and 0 <= self.block <= GRAPH_MAX_DRAFT, "draft_stream.block",
                 f"must be 0 (off) or in [1, {GRAPH_MAX_DRAFT}], got {self.block!r}")
        _require(isinstance(self.lookahead, int) and 1 <= self.lookahead <= 32, "draft_stream.lookahead",
                 f"must be in [1, 32], got {self.lookahead!r}")
        _require(isinstance(self.chunk, int) and 1 <= self.chunk <= self.lookahead, "draft_stream.chunk",
                 f"must be in [1, lookahead = {self.lookahead}], got {self.chunk!r}")
        _require(_finite(self.wait_ms) and 0 <= self.wait_ms <= 1000, "draft_stream.wait_ms",
                 f"must be in [0, 1000], got {self.wait_ms!r}")
        _require(isinstance(self.max_batch, int) and self.max_batch >= 1, "draft_stream.max_batch",
                 f"must be an integer >= 1, got {self.max_batch!r}")
        _require(isinstance(self.lookup, int) and 0 <= self.lookup <= 8, "draft_stream.lookup",
                 f"must be 0 (off) or in [1, 8], got {self.lookup!r}")

    @property
    def on(self) -> bool:
        return self.block > 0


@dataclass(frozen=True)
class SchedulerConfig:
    """The coordinator's limits and policies."""

    __pydantic_config__ = {"extra": "forbid"}  # config files: unknown keys are errors

    max_batch_size: int = 64
    max_n: int = 16
    max_new_tokens: int = 2048
    # Prompt tokens prefilled per step, target and draft together. A worker prefills new
    # sequences before the step's forward, so every running sequence waits for that prefill:
    # this bounds the wait, spreading a burst of arrivals over several steps. A prompt longer
    # than the budget is still admitted, alone in its step, so nothing starves.
    max_prefill_tokens_per_step: int = 512
    draft_length: DraftLengthConfig = field(default_factory=DraftLengthConfig)
    # Streamed speculation, for a draft on a GPU of its own (on one GPU the two models' kernels
    # slow each other: bench/results, 2026-11-27, one GPU hides 14-24% of the draft). Replaces
    # draft_length while on.
    draft_stream: DraftStreamConfig = field(default_factory=DraftStreamConfig)

    def __post_init__(self) -> None:
        _require(self.max_batch_size >= 1, "max_batch_size", f"must be >= 1, got {self.max_batch_size}")
        _require(self.max_n >= 1, "max_n", f"must be >= 1, got {self.max_n}")
        _require(self.max_new_tokens >= 1, "max_new_tokens", f"must be >= 1, got {self.max_new_tokens}")
        budget = self.max_prefill_tokens_per_step
        _require(isinstance(budget, int) and not isinstance(budget, bool) and budget >= 1,
                 "max_prefill_tokens_per_step", f"must be an integer >= 1, got {budget!r}")


@dataclass(frozen=True)
class WorkerServiceConfig:
    """A draft or target service: its model runner and where it listens."""

    __pydantic_config__ = {"extra": "forbid"}  # config files: unknown keys are errors

    model_dir: Path | None = None
    device: str = "auto"  # auto: the GPU where there is one
    dtype: str = "auto"  # auto: bfloat16 on a GPU, float32 on the CPU
    num_slots: int = 64
    max_seq_len: int = 2048
    attention: str = "auto"
    host: str = "127.0.0.1"
    port: int = 0  # 0 = any free port
    draft_top_n: int = 64  # draft only: on a CPU it finds its top-k/top-p cut among its N most likely tokens
    graph_max_draft: int = GRAPH_MAX_DRAFT  # target service: draft lengths whose verification is graph-captured
    batch_invariant: bool = False  # target service: rows computed the same way whatever the batch (slower)
    int8_weights: bool | None = None  # draft only (None: on for a draft): int8 projections for few-row steps
    few_row_cuda: bool = True  # 1-16-row steps through the CUDA kernel, layers fused (CUDA with nvcc; not batch-invariant)
    lookup_tail: int = DEFAULT_LOOKUP_TAIL  # target service: lookup tokens verified after a co-located draft's (0 = off)
    programmatic_launch: bool = True  # kernels start while the one before runs (Hopper+; same values)

    def __post_init__(self) -> None:
        if self.model_dir is not None:
            object.__setattr__(self, "model_dir", Path(self.model_dir).expanduser())
            # validates the runner fields ("auto" stands in for any valid device and dtype)
            self._runner_config(self.device if self.device != "auto" else "cpu",
                                self.dtype if self.dtype != "auto" else "float32")
        _require(0 <= self.port < 65536, "port", f"must be in [0, 65535], got {self.port}")
        _require(self.draft_top_n >= 1, "draft_top_n", f"must be >= 1, got {self.draft_top_n}")

    def runner_config(self) -> RunnerConfig:
        """The runner this service runs, with "auto" device and dtype resolved here."""
        device = resolve_device(self.device)
        return self._runner_config(device, resolve_dtype(self.dtype, device))

    def _runner_config(self, device: str, dtype: str) -> RunnerConfig:
        _require(self.model_dir is not None, "model_dir", "is required")
        return RunnerConfig(model_dir=self.model_dir, device=device, dtype=dtype, num_slots=self.num_slots,
                            max_seq_len=self.max_seq_len, attention=self.attention,
                            graph_max_draft=self.graph_max_draft, batch_invariant=self.batch_invariant,
                            int8_weights=self.int8_weights, few_row_cuda=self.few_row_cuda,
                            lookup_tail=self.lookup_tail, programmatic_launch=self.programmatic_launch)


@dataclass(frozen=True)
class CoordinatorConfig:
    """The public Generation service."""

    __pydantic_config__ = {"extra": "forbid"}  # config files: unknown keys are errors

    target_address: str = ""
    draft_address: str = ""  # empty: regular decoding only
    tokenizer_dir: Path | None = None  # defaults to the target's model directory where known
    host: str = "127.0.0.1"
    port: int = 50051
    metrics_port: int | None = None  # Prometheus /metrics over HTTP on `host`; None = off, 0 = any free port
    max_waiting: int = 256  # requests queued for a place in the batch before RESOURCE_EXHAUSTED (hard limit)
    max_concurrent_rpcs: int = 512
    reconnect_interval_s: float = 2.0
    # SIGTERM: health turns NOT_SERVING and new calls get UNAVAILABLE at once; running requests
    # get this long to finish, the rest are answered UNAVAILABLE, and the process exits.
    shutdown_grace_s: float = 20.0
    # Largest public request the server accepts (gRPC's default, 4 MiB): a prompt that fits
    # max_seq_len is far smaller, so a larger message is refused before it is even parsed. The
    # internal worker links have their own, larger limit (bass/transport/grpc_server.py).
    max_request_bytes: int = 4 * 1024 * 1024
    max_stop_strings: int = 16  # stop strings per request
    max_stop_string_bytes: int = 256  # UTF-8 bytes per stop string
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    def __post_init__(self) -> None:
        if self.tokenizer_dir is not None:
            object.__setattr__(self, "tokenizer_dir", Path(self.tokenizer_dir).expanduser())
        _require(0 <= self.port < 65536, "coordinator.port", f"must be in [0, 65535], got {self.port}")
        _require(self.metrics_port is None or 0 <= self.metrics_port < 65536, "coordinator.metrics_port",
                 f"must be in [0, 65535], got {self.metrics_port}")
        # >= 1: every request waits in the queue, however briefly, before the loop admits it
        _require(self.max_waiting >= 1, "max_waiting", f"must be >= 1, got {self.max_waiting}")
        _require(_finite(self.shutdown_grace_s) and self.shutdown_grace_s >= 0, "shutdown_grace_s",
                 f"must be a number >= 0, got {self.shutdown_grace_s!r}")
        _require(1024 <= self.max_request_bytes <= 1 << 30, "max_request_bytes",
                 f"must be in [1024, 2**30], got {self.max_request_bytes}")
        _require(self.max_stop_strings >= 0, "max_stop_strings", f"must be >= 0, got {self.max_stop_strings}")
        _require(self.max_stop_string_bytes >= 1, "max_stop_string_bytes",
                 f"must be >= 1, got {self.max_stop_string_bytes}")
        _require(self.max_concurrent_rpcs >= 1, "max_concurrent_rpcs", f"must be >= 1, got {self.max_concurrent_rpcs}")
        _require(_finite(self.reconnect_interval_s) and self.reconnect_interval_s > 0, "reconnect_interval_s",
                 f"must be > 0, got {self.reconnect_interval_s}")


@dataclass(frozen=True)
class HttpConfig:
    """The OpenAI-compatible HTTP front ([http]; bass/app/http/): a client of the coordinator's
    public gRPC API that holds no engine state. `bass serve` and `bass up` start it when `port`
    is set (`bass up` as an actor beside the coordinator's); `bass http-front` runs one alone."""

    __pydantic_config__ = {"extra": "forbid"}  # config files: unknown keys are errors

    port: int | None = None  # None = off (the default); 0 = any free port
    host: str = "127.0.0.1"
    coordinator_address: str = ""  # host:port of the coordinator (`bass serve` and `bass up` set it)
    tokenizer_dir: Path | None = None  # the models' tokenizer (`bass serve`: the target's directory)
    model_name: str = ""  # the id /v1/models lists and answers carry; "" = the tokenizer directory's name
    chat_template: Path | None = None  # a Jinja file for /v1/chat/completions; None = the tokenizer's own
    max_request_bytes: int = 4 * 1024 * 1024  # largest request body (the coordinator's gRPC limit)
    shutdown_grace_s: float = 5.0  # SIGTERM: open streams get this long, then they are cut

    def __post_init__(self) -> None:
        for name in ("tokenizer_dir", "chat_template"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)).expanduser())
        _require(self.port is None or 0 <= self.port < 65536, "http.port",
                 f"must be in [0, 65535], got {self.port}")
        _require(1024 <= self.max_request_bytes <= 1 << 30, "http.max_request_bytes",
                 f"must be in [1024, 2**30], got {self.max_request_bytes}")
        _require(_finite(self.shutdown_grace_s) and self.shutdown_grace_s >= 0, "http.shutdown_grace_s",
                 f"must be a number >= 0, got {self.shutdown_grace_s!r}")

    @property
    def served_model_name(self) -> str:
        return self.model_name or (self.tokenizer_dir.name if self.tokenizer_dir is not None else "bass")


@dataclass(frozen=True)
class RouterConfig:
    """`bass router` ([router]; coordinator/router.py): one public address in front of several
    replicas, each a coordinator with its own model workers. Each request goes to the least-loaded
    replica that serves, or, with several sequences, split over the replicas with room
    (split_min_sequences); the router polls every replica's
    `Replica/Load` and forwards the request's bytes without decoding the answers.

    `bass serve` / `bass up` with `replicas` > 1 start it themselves: it then listens on the
    coordinator's `host`, `port` and `metrics_port` (the public address stays what it was) and
    is given the replicas' addresses; `replicas` and `replica_dns` are for `bass router` alone.
    """

    __pydantic_config__ = {"extra": "forbid"}  # config files: unknown keys are errors

    replicas: tuple[str, ...] = ()  # host:port of each replica's coordinator
    # host:port whose host resolves to every replica (a Kubernetes headless Service): looked up
    # again every discovery_interval_s, so replicas that scale up or down join or leave.
    replica_dns: str = ""
    discovery_interval_s: float = 5.0
    host: str = "127.0.0.1"
    port: int = 50051
    metrics_port: int | None = None  # Prometheus /metrics (per-replica load); None = off, 0 = any free port
    # Every replica's load is read this often; a replica that fails a poll (or a forwarded call
    # with UNAVAILABLE) gets no new request until a poll finds it serving again. Together with
    # probe_timeout_s it bounds how long new requests can still go to a dead replica.
    poll_interval_s: float = 0.1
    probe_timeout_s: float = 0.5
    # A replica that answers no poll for this long is lost (a node gone: no connection reset
    # ends its calls), and its calls in flight are cancelled: answered UNAVAILABLE, or retried.
    lost_after_s: float = 5.0
    # A request whose replica failed with UNAVAILABLE (down) or RESOURCE_EXHAUSTED (queue full)
    # before anything reached the client (a stream's first message, a unary call's answer) is
    # sent to another replica, never one already tried, at most this many times; other statuses
    # are the request's own and pass on at once, as do mid-stream failures (router.py says why).
    max_retries: int = 2
    # A request of at least this many sequences is split over the replicas with room for a part
    # (two or more; each part a contiguous range of its sequences, coordinator/request_split.py),
    # so that a second GPU shortens one request's decoding; 0 = every request goes whole.
    split_min_sequences: int = 2
    max_concurrent_rpcs: int = 512
    max_request_bytes: int = 4 * 1024 * 1024  # as CoordinatorConfig's: refused before it is forwarded
    shutdown_grace_s: float = 20.0  # SIGTERM: forwarded calls get this long, then they are cut

    def __post_init__(self) -> None:
        object.__setattr__(self, "replicas", tuple(self.replicas))
        for address in self.replicas + ((self.replica_dns,) if self.replica_dns else ()):
            host, _, port = address.rpartition(":")
            _require(bool(host) and port.isdigit() and 0 < int(port) < 65536, "router.replicas",
                     f"each address must be host:port, got {address!r}")
        _require(0 <= self.port < 65536, "router.port", f"must be in [0, 65535], got {self.port}")
        _require(self.metrics_port is None or 0 <= self.metrics_port < 65536, "router.metrics_port",
                 f"must be in [0, 65535], got {self.metrics_port}")
        for name in ("poll_interval_s", "probe_timeout_s", "lost_after_s", "discovery_interval_s"):
            value = getattr(self, name)
            _require(_finite(value) and value > 0, f"router.{name}", f"must be > 0, got {value!r}")
        _require(_finite(self.shutdown_grace_s) and self.shutdown_grace_s >= 0, "router.shutdown_grace_s",
                 f"must be a number >= 0, got {self.shutdown_grace_s!r}")
        _require(isinstance(self.max_retries, int) and self.max_retries >= 0, "router.max_retries",
                 f"must be an integer >= 0, got {self.max_retries!r}")
        _require(isinstance(self.split_min_sequences, int) and (self.split_min_sequences == 0
                                                                 or self.split_min_sequences >= 2),
                 "router.split_min_sequences", f"must be 0 (never split) or an integer >= 2, "
                 f"got {self.split_min_sequences!r}")
        _require(self.max_concurrent_rpcs >= 1, "router.max_concurrent_rpcs",
                 f"must be >= 1, got {self.max_concurrent_rpcs}")
        _require(1024 <= self.max_request_bytes <= 1 << 30, "router.max_request_bytes",
                 f"must be in [1024, 2**30], got {self.max_request_bytes}")


PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


@dataclass(frozen=True)
class RayConfig:
    """`bass up`: where Ray places the three services ([ray] section).

    With ServeConfig.colocate (the default) one actor holds both models on target_gpus (with
    target_cpus + draft_cpus), beside the coordinator's. Otherwise each service is one actor in
    a bundle of one placement group: target_gpus = draft_gpus = 0.5 with PACK puts both models
    on one GPU; 1 and 1 on two GPUs of a node (PACK) or of different nodes (SPREAD /
    STRICT_SPREAD). Actors restart on failure (max_restarts, -1 = always) on a fixed port each,
    so the coordinator reconnects to the same address. With [http] port set, the OpenAI-compatible
    front is one more actor (http_cpus) in the coordinator's bundle: beside the coordinator it
    serves, on the node that the public endpoints point at.
    """

    __pydantic_config__ = {"extra": "forbid"}  # config files: unknown keys are errors

    namespace: str = "bass"
    strategy: str = "PACK"
    target_gpus: float = 1.0
    draft_gpus: float = 1.0
    target_cpus: float = 1.0
    draft_cpus: float = 1.0
    coordinator_cpus: float = 1.0
    http_cpus: float = 1.0  # the HTTP front's actor, only with [http] port set
    target_port: int = 50061
    draft_port: int = 50062
    max_restarts: int = -1
    ready_timeout_s: float = 900.0
    # With replicas > 1: each replica is a placement group of its own (its model actor and its
    # coordinator, placed by `strategy`), and replica i's actors listen on target_port,
    # draft_port and replica_coordinator_port plus i * replica_port_stride (fixed ports: an actor
    # Ray restarts comes back on its address and rejoins). The router takes the coordinator's port.
    replica_coordinator_port: int = 50063
    replica_port_stride: int = 10
    router_cpus: float = 1.0
    # A custom resource the router actor asks for (a sliver of it), to pin it to the nodes that
    # have it: the KubeRay head declares "bass-router", so the router runs where the Service
    # points. "" = anywhere with router_cpus free.
    router_resource: str = ""

    def __post_init__(self) -> None:
        _require(self.strategy in PLACEMENT_STRATEGIES, "ray.strategy",
                 f"must be one of {PLACEMENT_STRATEGIES}, got {self.strategy!r}")
        for name in ("target_gpus", "draft_gpus", "target_cpus", "draft_cpus", "coordinator_cpus", "http_cpus",
                     "router_cpus"):
            value = getattr(self, name)
            _require(_finite(value) and value >= 0, f"ray.{name}", f"must be a number >= 0, got {value!r}")
        _require(self.max_restarts >= -1, "ray.max_restarts", f"must be >= -1, got {self.max_restarts}")
        _require(self.replica_port_stride >= 1, "ray.replica_port_stride",
                 f"must be >= 1, got {self.replica_port_stride}")

    def check_replica_ports(self) -> None:
        """With replicas: every replica's three ports apart from every other replica's."""
        ports = (self.target_port, self.draft_port, self.replica_coordinator_port)
        _require(len(set(ports)) == 3 and max(ports) - min(ports) < self.replica_port_stride, "ray.replica_port_stride",
                 f"must exceed the spread of target_port, draft_port and replica_coordinator_port {ports} "
                 f"(each replica's ports must not meet the next one's), got {self.replica_port_stride}")

    def replica_ports(self, index: int) -> tuple[int, int, int]:
        """Replica `index`'s (target, draft, coordinator) ports."""
        offset = index * self.replica_port_stride
        return self.target_port + offset, self.draft_port + offset, self.replica_coordinator_port + offset


@dataclass(frozen=True)
class ServeConfig:
    """`bass serve` / `bass up`: sections [target], [draft], [coordinator], [http] (and [ray] for `bass up`)."""

    __pydantic_config__ = {"extra": "forbid"}  # config files: unknown keys are errors

    target: WorkerServiceConfig = field(default_factory=WorkerServiceConfig)
    draft: WorkerServiceConfig | None = field(default_factory=WorkerServiceConfig)
    coordinator: CoordinatorConfig = field(default_factory=CoordinatorConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    http: HttpConfig = field(default_factory=HttpConfig)  # the OpenAI-compatible front (off by default)
    # Copies of the whole model pair (each a target with its draft and a coordinator, on a GPU of
    # its own), behind one router on the coordinator's port (`[router]`). 1: no router.
    replicas: int = 1
    router: RouterConfig = field(default_factory=RouterConfig)
    # `bass serve`: the draft in the target's process, on its device, both services on the
    # target's address (draft.host and draft.port unused). A speculative step is then one call
    # and the draft's tokens never leave the GPU before they are verified (issue #13). False:
    # the draft in a process of its own, which can fail or restart alone (two calls a step).
    colocate: bool = True

    def __post_init__(self) -> None:
        _require(isinstance(self.replicas, int) and not isinstance(self.replicas, bool) and 1 <= self.replicas <= 256,
                 "replicas", f"must be an integer in [1, 256], got {self.replicas!r}")
        if self.replicas > 1:
            self.ray.check_replica_ports()
        _require(self.target.int8_weights is not True, "target.int8_weights",
                 "the target's numbers are the output: int8 weights are for the draft only")
        if self.colocate and self.draft is not None:
            t, d = self.target.device, self.draft.device
            _require("auto" in (t, d) or same_device(t, d), "colocate", f"puts the draft on the target's device; they are set to "
                                                    f"{self.target.device} and {self.draft.device} "
                                                    f"(set colocate = false for separate devices)")
        _require(not (self.colocate and self.with_draft and self.coordinator.scheduler.draft_stream.on),
                 "coordinator.scheduler.draft_stream.block",
                 "streamed speculation runs the draft in a process of its own, on a GPU of its own: give it one "
                 "(--draft-device cuda:1, or [draft] device with colocate = false); a co-located draft already "
                 "shares each step with the target (one call)")

    @property
    def with_draft(self) -> bool:
        """Whether the services include a draft (a section with a model; none: regular decoding)."""
        return self.draft is not None and self.draft.model_dir is not None

    def turn_taking_warning(self, draft_has_own_gpu: bool) -> str | None:
        """What to say where the draft has a GPU of its own (its device here, a Ray bundle of its
        own under `bass up`) but the two models take turns (streamed speculation off): every step
        waits for the draft through the host, slower than both models on one GPU (issue #36:
        2.88 against 2.15 ms a token at 8 sequences on two H100s). None otherwise."""
        if (not draft_has_own_gpu or not self.with_draft or self.colocate
                or self.coordinator.scheduler.draft_stream.on):
            return None
        return ("the draft has a GPU of its own but takes turns with the target: each step waits for the draft "
                "through the host, which is slower than both models on one GPU. For two GPUs, --replicas 2 "
                "(replicas = 2: each GPU the one-GPU default) serves more, or --draft-stream 6 "
                "([coordinator.scheduler.draft_stream] block) drafts while the target verifies (README, \"Two GPUs\")")


def load_config_file(path: Path, cls: type = ServeConfig):
    """Read a TOML file into `cls`, rejecting unknown keys and bad values with the key's path."""
    import tomllib

    from pydantic import TypeAdapter, ValidationError

    with open(path, "rb") as f:
        data = tomllib.load(f)
    try:
        return TypeAdapter(cls).validate_python(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "config"
        raise InvalidRequestError(where, f"{first['msg']} (in {path})") from None
