"""The layers import one way (README.md, "Architecture").

Every module of the installed package, read with `ast` (lazy imports inside functions count):
a module imports only from its own layer and the layers below it, and no two packages import
each other, however indirectly. A new package must be given a place in LAYERS.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Bottom to top: each layer may import the layers before it, never one after it.
LAYERS = [
    ("namespace root and generated gRPC code (protos/)", ["bass", "bass.v1"]),
    ("foundation: config, errors, the workers' step contract", ["bass.core"]),
    ("kernels: ragged attention and fused Triton kernels over the ragged batch", ["bass.kernels"]),
    ("engine: the model runtime both services share", ["bass.engine"]),
    ("transport: both ends of the worker contract over gRPC", ["bass.transport"]),
    ("draft service", ["bass.draft_service"]),
    ("target service (co-located, it hosts the draft too)", ["bass.target_service"]),
    ("coordinator", ["bass.coordinator"]),
    ("deploy: the Ray launcher", ["bass.deploy"]),
    ("application shell: CLI, launcher, benchmarks, evaluation, model tools", ["bass.app", "bass.cli"]),
]
# Beyond the order: the wire and the coordinator hold no tensors, so nothing of the model side.
NEVER = {
    "bass.transport": ["bass.kernels", "bass.engine", "bass.draft_service", "bass.target_service"],
    "bass.coordinator": ["bass.kernels", "bass.engine", "bass.draft_service", "bass.target_service"],
}


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> int:
    best = max(((len(p), i) for i, (_, prefixes) in enumerate(LAYERS) for p in prefixes
                if _under(module, p) and (p != "bass" or module == "bass")), default=None)
    assert best is not None, f"{module} is in no layer: give its package a place in LAYERS"
    return best[1]


def package_folders() -> dict[str, Path]:
    """Each package name -> its folder, as pyproject.toml installs them."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = tool["package-dir"]
    folders = {}
    for package in tool["packages"]:
        base = max((name for name in dirs if _under(package, name)), key=len)
        folders[package] = ROOT / dirs[base] / Path(*package[len(base):].split(".")[1:])
    return folders


def modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package)."""
    found = {}
    for package, folder in package_folders().items():
        for path in sorted(folder.glob("*.py")):
            if path.name == "__init__.py":
                found[package] = (path, True)
            else:
                found[f"{package}.{path.stem}"] = (path, False)
    return found


def imports(name: str, path: Path, is_package: bool, known: set[str]) -> set[str]:
    """The bass modules (or packages) `name` imports."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if _under(a.name, "bass"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not _under(source, "bass"):
                continue
            # `from bass.transport import wire` imports the module bass.transport.wire
            submodules = {f"{source}.{a.name}" for a in node.names} & known
            out.update(submodules or {source})
    out.discard(name)
    return out


def import_graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, is_package, set(found)) for name, (path, is_package) in found.items()}


def test_the_package_has_the_layers_modules():
    names = set(modules())
    for _, prefixes in LAYERS:
        for prefix in prefixes:
            assert prefix in names or prefix == "bass.v1", f"no package {prefix}: update LAYERS"
    assert {"bass.app.cli", "bass.core.config", "bass.transport.remote", "bass.kernels.batch"} <= names


def test_every_import_goes_down_the_layers():
    wrong = []
    for module, targets in sorted(import_graph().items()):
        here = layer_of(module)
        for target in sorted(targets):
            there = layer_of(target)
            if there > here:
                wrong.append(f"{module} ({LAYERS[here][0].split(':')[0]}) imports {target} "
                             f"({LAYERS[there][0].split(':')[0]}, above it)")
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def test_transport_and_coordinator_import_nothing_of_the_model_side():
    wrong = [f"{module} imports {target}" for module, targets in sorted(import_graph().items())
             for prefix, banned in NEVER.items() if _under(module, prefix)
             for target in sorted(targets) if any(_under(target, b) for b in banned)]
    assert not wrong, "\n".join(wrong)


def test_kernels_never_import_the_engine():
    wrong = [f"{m} imports {t}" for m, ts in import_graph().items() if _under(m, "bass.kernels")
             for t in ts if not _under(t, "bass.kernels") and not _under(t, "bass.core")]
    assert not wrong, "\n".join(wrong)


def package_graph() -> dict[str, set[str]]:
    """Package -> the other packages its modules import (sub-packages count on their own)."""
    found = modules()
    packages = {m for m, (_, is_package) in found.items() if is_package} | {"bass.v1"}

    def package(module: str) -> str:
        if module in packages:
            return module
        return max((p for p in packages if _under(module, p)), key=len)

    graph: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        src = package(module)
        graph.setdefault(src, set()).update(package(t) for t in targets if package(t) != src)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_between_packages():
    cycle = find_cycle(package_graph())
    assert cycle is None, "packages importing each other: " + " -> ".join(cycle)


def test_the_checks_see_a_cycle_and_a_wrong_direction():
    """The checks themselves: a made-up cycle is found, and so is an import upward."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert layer_of("bass.kernels.attention") < layer_of("bass.engine.runner")
    assert layer_of("bass.cli") == layer_of("bass.app.cli.bench") == len(LAYERS) - 1


def test_the_foundation_imports_without_torch_or_grpc():
    import subprocess
    import sys

    code = ("import sys, bass.core.config, bass.core.errors, bass.core.worker_api; "
            "print(sorted(m for m in ('torch', 'grpc', 'pydantic') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr
