from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Torch's OpenMP threads spin while they wait for work. On a 2-core machine that the tests share
# with gRPC threads, subprocesses, a Ray cluster and other processes, a spinning thread holds the
# core that the thread it waits for needs: three tiny-model modules took 133 s on two spinning
# threads, 21 s on two passive ones, 15 s on one. Passive waiting is read once, when torch loads
# libgomp: set before the import; subprocesses inherit it. A setting in the environment is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

# Without a GPU, Triton kernels run in its interpreter, which Triton picks when it is first
# imported. Several test modules set this before their own import, but a module collected
# earlier that imports Triton first (test_kernel_builds.py) left them with the compiler: set it
# before any test module is imported. test_kernel_builds.py compiles in a subprocess of its own
# with TRITON_INTERPRET=0.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).parent))

from tiny_models import make_model  # noqa: E402

# One thread: the tiny models' ops are far below what a second thread pays for. Tests on real
# models ask for torch's default again (the torch_default_threads fixture).
DEFAULT_THREADS = torch.get_num_threads()  # the cores, or OMP_NUM_THREADS
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def torch_default_threads():
    """Torch's own thread count for a module's tests (products of 0.5-1.5 B parameters pay for
    every core), one thread again after them."""
    torch.set_num_threads(DEFAULT_THREADS)
    yield DEFAULT_THREADS
    torch.set_num_threads(1)


# -- pytest-xdist (make test runs two workers) -------------------------------------------------------
# Each module runs whole on one worker, in its own order, as it would alone: module-scoped fixtures
# (services, models) are built once, and no test runs after other tests than it does in one process.
# Modules that must not run at the same time share a unit: Ray tests (one cluster on this machine at a
# time: test_ray_cli.py's `bass up` would join test_ray_deploy.py's cluster, through
# ray.init(address="auto"), and its `bass down --stop-ray` would stop it). The longest units start
# first, so that the run does not end on one of them with the other worker idle; the modules that
# bound reconnects and health checks in fractions of a second go last, when the other worker has
# only short modules left, not beside the real models or the Triton interpreter. (pytest-xdist's
# xdist_group marks do the grouping part, but not under pytest 9.2: pytest-xdist#1386.)
XDIST_UNITS = {"test_ray_deploy.py": "ray", "test_ray_cli.py": "ray"}
XDIST_FIRST = ("test_real_models.py", "test_triton_int8.py", "ray", "test_bench_serve.py", "test_cli.py",
               "test_serve_cli.py")  # about a minute or more each on 2 cores, then 15-30 s
XDIST_LAST = ("test_service_failures.py", "test_hardening.py", "test_router.py")


def xdist_unit(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    return XDIST_UNITS.get(module, module)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Whole modules (XDIST_UNITS), the longest first (XDIST_FIRST), a few last (XDIST_LAST), for
    every --dist that balances load (-n alone means --dist load); each and worksteal are left be."""
    if config.getoption("dist") not in ("load", "loadscope", "loadfile", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        _ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return xdist_unit(nodeid)

        def _assign_work_unit(self, node) -> None:
            if not self._ordered:  # the queue is complete once the first unit is handed out
                rank = {unit: i - len(XDIST_FIRST) for i, unit in enumerate(XDIST_FIRST)}
                rank.update({unit: 1 + i for i, unit in enumerate(XDIST_LAST)})
                order = sorted(self.workqueue.items(), key=lambda kv: rank.get(kv[0], 0))
                self.workqueue.clear()
                self.workqueue.update(order)
                self._ordered = True
            super()._assign_work_unit(node)

    return ModuleScheduling(config, log)


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def llama_target(models_dir) -> Path:
    return make_model(models_dir / "llama-target", "llama", seed=1)


@pytest.fixture(scope="session")
def llama_draft(models_dir, llama_target) -> Path:
    """Agrees with llama_target often but not always."""
    return make_model(models_dir / "llama-draft", "llama", seed=2, perturb_from=llama_target, perturb_scale=0.1)


@pytest.fixture(scope="session")
def llama_bad_draft(models_dir) -> Path:
    """An unrelated model: proposals are mostly rejected."""
    return make_model(models_dir / "llama-bad-draft", "llama", seed=3)


@pytest.fixture(scope="session")
def qwen_target(models_dir) -> Path:
    return make_model(models_dir / "qwen-target", "qwen2", seed=4)


@pytest.fixture(scope="session")
def qwen_wide_heads(models_dir) -> Path:
    """Heads of 64 dims (the real pair's draft's): a fused draft's rotary pairing moves columns."""
    return make_model(models_dir / "qwen-wide-heads", "qwen2", seed=6, hidden=128, heads=2, kv_heads=1)


@pytest.fixture(scope="session")
def qwen_draft(models_dir, qwen_target) -> Path:
    return make_model(models_dir / "qwen-draft", "qwen2", seed=5, perturb_from=qwen_target, perturb_scale=0.1)


def build_scheduler(target: Path, draft: Path | None = None, draft_length: str = "bass", *, num_slots: int = 32,
                    max_seq_len: int = 256, attention: str = "pad", max_batch_size: int = 64, max_n: int = 16,
                    draft_top_n: int = 64, target_slots: int | None = None, prefill_budget: int = 512,
                    batch_invariant: bool = False, stream: dict | None = None, lookup_tail: int = 0):
    """An in-process coordinator over real target/draft workers on the CPU (fp32); stream: the
    scheduler's draft_stream (DraftStreamConfig's fields); lookup_tail: the target's."""
    from bass.app.local import build_local_scheduler
    from bass.core.config import DraftLengthConfig, DraftStreamConfig, RunnerConfig, SchedulerConfig

    def runner(d: Path, slots: int, **extra) -> RunnerConfig:
        return RunnerConfig(model_dir=d, num_slots=slots, max_seq_len=max_seq_len, attention=attention, **extra)

    return build_local_scheduler(
        runner(target, target_slots or num_slots, batch_invariant=batch_invariant, lookup_tail=lookup_tail),
        runner(draft, num_slots) if draft else None,
        scheduler=SchedulerConfig(max_batch_size=max_batch_size, max_n=max_n,
                                  max_prefill_tokens_per_step=prefill_budget,
                                  draft_length=DraftLengthConfig.parse(draft_length),
                                  draft_stream=DraftStreamConfig(**(stream or {}))),
        draft_top_n=draft_top_n)


def build_gpu_scheduler(target: Path, draft: Path, draft_length: str, cuda_graphs: bool = True):
    """An in-process coordinator on the GPU in fp32 (the services' other defaults: Triton
    attention, CUDA graphs unless cuda_graphs=False), for the GPU tests that compare two paths'
    text: fp32, so that the paths agree token for token."""
    from bass.app.local import build_local_scheduler
    from bass.core.config import DraftLengthConfig, RunnerConfig, SchedulerConfig

    cfg = dict(device="cuda", dtype="float32", num_slots=16, max_seq_len=256, attention="triton",
               cuda_graphs=cuda_graphs)
    return build_local_scheduler(RunnerConfig(model_dir=target, **cfg), RunnerConfig(model_dir=draft, **cfg),
                                 scheduler=SchedulerConfig(draft_length=DraftLengthConfig.parse(draft_length)))


@pytest.fixture
def row_exact_interpreter_dot(monkeypatch):
    """Bitwise batch-invariance tests run Triton's CPU interpreter, whose `tl.dot` is NumPy's
    matmul. OpenBLAS's AVX2 kernels (Haswell, Zen; CI's CPUs) round a row differently depending
    on where it sits in the tile, so those tests would check OpenBLAS, not our kernels. This dot
    sums every element in the same order (k = 0, 1, ...) wherever its row or column sits, which
    is what a GPU's MMA does; what the tests then check is ours: masks, where K is split.
    On a GPU nothing is replaced."""
    if torch.cuda.is_available():
        return
    import numpy as np
    from triton.runtime import interpreter

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        # As the tensor cores chain it: the accumulator plus each 16-wide step of K in turn, so
        # tl.dot(a, b, acc) over BLOCK_K = 128 sums as two calls over 64 do.
        acc_dtype = d.data.dtype
        lhs, rhs = a.data.astype(acc_dtype), b.data.astype(acc_dtype)
        total = d.data.copy()
        for k0 in range(0, lhs.shape[-1], 16):
            step = np.zeros_like(total)
            for k in range(k0, min(k0 + 16, lhs.shape[-1])):
                step += lhs[..., :, k:k + 1] * rhs[..., k:k + 1, :]
            total += step
        return interpreter.TensorHandle(total, d.dtype.scalar)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)
