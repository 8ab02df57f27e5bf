"""BASS: batched speculative decoding as a service.

The installed package maps the repository's top-level folders into one namespace:
`bass.engine` (engine/: model runtime shared by both services), `bass.draft_service`,
`bass.target_service`, `bass.coordinator`, `bass.kernels`, `bass.deploy` (deploy/ray/). The
layers, bottom to top (README.md, "Architecture"; tests/test_layers.py keeps imports one way):
bass.v1 (generated from protos/), bass.core, bass.kernels, bass.engine, bass.transport,
bass.draft_service, bass.target_service, bass.coordinator, bass.deploy, bass.app (bass.cli is
the `bass` command's entry point).
"""

__version__ = "0.1.0"

# pyproject.toml's package-dir: the sub-packages of `bass` that live in other folders of the
# repository (tests/test_source_tree.py checks that the two agree).
SOURCE_FOLDERS = {"bass.engine": "engine", "bass.draft_service": "draft_service",
                  "bass.target_service": "target_service", "bass.coordinator": "coordinator",
                  "bass.kernels": "kernels", "bass.deploy": "deploy/ray"}


def _resolve_from_source_tree() -> None:
    """Let a checkout's bass/ find its sibling folders.

    `python -m bass.cli` run from the repository root imports this folder (the working
    directory comes first on sys.path), not an installed copy, and this folder alone has no
    bass.engine & co. Here the checkout's folders answer for them, as pyproject.toml maps them;
    and bass.v1 (generated into bass/v1, not committed) comes from an installed copy when the
    checkout has not generated its own. An installed copy holds its sub-packages and skips all this.
    """
    import sys
    from importlib.util import spec_from_file_location
    from pathlib import Path

    here = Path(__file__).resolve().parent
    root = here.parent
    if (here / "engine").is_dir() or not (root / "pyproject.toml").is_file():
        return
    folders = {name: root / folder for name, folder in SOURCE_FOLDERS.items()}
    if not (here / "v1" / "__init__.py").is_file():
        installed = (Path(entry or ".").resolve() / "bass" / "v1" for entry in sys.path)
        v1 = next((d for d in installed if (d / "__init__.py").is_file()), None)
        if v1 is not None:
            folders["bass.v1"] = v1

    class SourceTreeFinder:
        @staticmethod
        def find_spec(fullname, path=None, target=None):
            folder = folders.get(fullname)
            if folder is None:
                return None
            return spec_from_file_location(fullname, folder / "__init__.py", submodule_search_locations=[str(folder)])

    sys.meta_path.insert(0, SourceTreeFinder)


_resolve_from_source_tree()
