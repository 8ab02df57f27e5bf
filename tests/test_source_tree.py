"""Commands run from the repository root, with the package installed somewhere else.

The GPU machine installs the wheel into a folder (`pip install --target /tmp/site`, then
PYTHONPATH=/tmp/site) and runs `python3 -m bass.cli ...` from the checkout: the working
directory comes first on sys.path, so the checkout's bass/ is the `bass` imported, and it must
find bass.engine & co in the checkout's other folders (bass/__init__.py does).

Here the package is installed the same way into a temporary folder, and the commands run with
`python -S`: without site's .pth files this venv's editable install (whose finder would answer
for bass.engine anyway) is out of the way; its site-packages stay on PYTHONPATH for click & co.
Every `bass` command line of the scripts under bench/ is checked too, down to its sub-command's
--help, so that a script naming a command that no longer exists fails here first.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import site
import subprocess
import sys
import tomllib
from pathlib import Path

import click
import pytest

import bass
from bass.app.cli import main

ROOT = Path(__file__).resolve().parents[1]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]

# One sub-command of each command group (bass/app/cli/).
ONE_PER_GROUP = [["generate"], ["client"], ["serve"], ["up"], ["target-service"], ["coordinator"], ["bench", "speed"],
                 ["bench", "serve"], ["fetch-models"], ["convert-gguf"], ["eval", "humaneval"]]


def test_the_source_tree_maps_folders_as_pyproject_does():
    dirs = dict(SETUPTOOLS["package-dir"])
    assert dirs.pop("bass") == "bass"
    assert dirs == bass.SOURCE_FOLDERS


def test_pyproject_lists_every_package():
    found = {"bass.v1"}  # generated at build time
    for name, folder in SETUPTOOLS["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            if name == "bass" and parts[:1] == ("v1",):
                continue
            found.add(".".join((name,) + parts))
    assert sorted(SETUPTOOLS["packages"]) == sorted(found)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(site, checkout): the package installed non-editably into `site`, from `checkout`, a copy
    of this tree's sources (built there, so that no stale build/ of this tree gets in)."""
    tmp = tmp_path_factory.mktemp("installed")
    checkout, target = tmp / "checkout", tmp / "site"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in {*SETUPTOOLS["package-dir"].values(), "protos"}:
        shutil.copytree(ROOT / folder, checkout / folder, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, checkout / name)
    if not (checkout / "bass" / "v1" / "__init__.py").is_file():
        subprocess.run([sys.executable, str(checkout / "protos" / "generate.py")], check=True, capture_output=True)
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--no-compile", "--target", str(target), str(checkout)], capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr
    assert (target / "bass" / "engine" / "__init__.py").is_file()
    return target, checkout


def run_python(cwd: Path, target: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join([str(target), *site.getsitepackages()])
    return subprocess.run([sys.executable, "-S", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)


WHERE = ("import json, bass, bass.app.cli, bass.coordinator, bass.deploy, bass.draft_service, bass.engine, "
         "bass.kernels, bass.target_service, bass.v1; "
         "print(json.dumps({m.__name__: m.__file__ for m in (bass, bass.app.cli, bass.coordinator, bass.deploy, "
         "bass.draft_service, bass.engine, bass.kernels, bass.target_service, bass.v1)}))")


def where(cwd: Path, target: Path) -> dict[str, Path]:
    import json

    proc = run_python(cwd, target, "-c", WHERE)
    assert proc.returncode == 0, proc.stderr
    return {name: Path(file).parent for name, file in json.loads(proc.stdout).items()}


def test_from_the_root_every_package_is_the_checkouts(installed):
    target, _ = installed
    found = where(ROOT, target)
    expected = {"bass": ROOT / "bass", "bass.app.cli": ROOT / "bass" / "app" / "cli", "bass.v1": ROOT / "bass" / "v1"}
    expected.update({name: ROOT / folder for name, folder in bass.SOURCE_FOLDERS.items()})
    assert found == expected


def test_a_checkout_without_generated_code_takes_the_installed_one(installed):
    target, checkout = installed
    shutil.rmtree(checkout / "bass" / "v1")
    found = where(checkout, target)
    assert found["bass.v1"] == target / "bass" / "v1"
    assert found["bass.engine"] == checkout / "engine" and found["bass.deploy"] == checkout / "deploy" / "ray"
    assert run_python(checkout, target, "-m", "bass.cli", "bench", "speed", "--help").returncode == 0


def test_the_cli_and_one_command_of_each_group_run_from_the_root(installed):
    target, _ = installed
    top = run_python(ROOT, target, "-m", "bass.cli", "--help")
    assert top.returncode == 0, top.stderr
    assert set(main.commands) <= set(re.findall(r"^  (\S+)", top.stdout, re.M))
    for words in ONE_PER_GROUP:
        proc = run_python(ROOT, target, "-m", "bass.cli", *words, "--help")
        assert proc.returncode == 0 and f"bass.cli {' '.join(words)} [OPTIONS]" in proc.stdout, (words, proc.stderr)


# -- the scripts' command lines ---------------------------------------------------------------------
COMMAND_START = {";", "&&", "||", "|", "(", "then", "do", "else", "exec", "time", "nohup", "!", "{"}
OPERATORS = {";", "&&", "||", "|", "&", ")", "(", ">", ">>", "<", "<<", "}"}


def script_lines() -> list[tuple[str, int, str]]:
    """(file, line number, line) of the shell scripts under bench/, continued lines joined,
    comment lines and here-documents left out."""
    out = []
    for path in sorted((ROOT / "bench").rglob("*.sh")):
        start, pending, heredoc = None, [], None
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if heredoc is not None:  # another program's text (e.g. `python3 - <<EOT`)
                heredoc = None if line.strip() == heredoc else heredoc
                continue
            if not pending and line.lstrip().startswith("#"):
                continue
            if here := re.search(r"<<-?\s*['\"]?(\w+)", line):
                heredoc = here.group(1)
            start = start or number
            pending.append(line[:-1] if line.endswith("\\") else line)
            if not line.endswith("\\"):
                out.append((str(path.relative_to(ROOT)), start, " ".join(pending)))
                start, pending = None, []
    return out


def bass_arguments(line: str) -> list[list[str]]:
    """The words after each `python -m bass.cli`, `... from bass.cli import main; main()` or
    `bass` (as a command) on a shell line."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # an unbalanced quote: this line names no command we can read
        return []
    found = []
    for i, token in enumerate(tokens):
        if token == "-m" and tokens[i + 1:i + 2] == ["bass.cli"]:
            rest = tokens[i + 2:]
        elif "from bass.cli import main" in token:
            rest = tokens[i + 1:]
        elif token == "bass" and (i == 0 or tokens[i - 1] in COMMAND_START or re.match(r"^\w+=", tokens[i - 1])
                                  or tokens[i - 2:i - 1] == ["timeout"]):
            rest = tokens[i + 1:]
        else:
            continue
        cut = next((j for j, t in enumerate(rest) if t in OPERATORS), len(rest))
        found.append(rest[:cut])
    return found


def command_path(words: list[str]) -> list[str] | None:
    """The sub-command the words name (e.g. ['bench', 'speed']); None where a shell variable
    names it; a KeyError where no such command exists."""
    command, path = main, []
    for word in words:
        if not path and word in ("-v", "-vv", "-vvv", "--verbose"):
            continue
        if not isinstance(command, click.Group) or word.startswith("-"):
            break
        if "$" in word:
            return None if not path else path
        if word not in command.commands:
            raise KeyError(f"`bass {' '.join(path + [word])}`: no such command")
        command = command.commands[word]
        path.append(word)
    return path


def test_the_scripts_name_commands_that_exist(installed):
    target, _ = installed
    paths: dict[tuple[str, ...], str] = {}
    unknown = []
    for file, number, line in script_lines():
        for words in bass_arguments(line):
            try:
                path = command_path(words)
            except KeyError as e:
                unknown.append(f"{file}:{number}: {e.args[0]}")
                continue
            if path:
                paths.setdefault(tuple(path), f"{file}:{number}")
    assert not unknown, "\n".join(unknown)
    assert len(paths) >= 5, f"too few `bass` command lines found under bench/ ({sorted(paths)})"
    for path, origin in sorted(paths.items()):
        proc = run_python(ROOT, target, "-m", "bass.cli", *path, "--help")
        assert proc.returncode == 0, f"{origin}: `bass {' '.join(path)} --help` failed:\n{proc.stderr}"


def test_the_script_reader_finds_commands_and_rejects_unknown_ones():
    assert bass_arguments('timeout 9 python3 -m bass.cli bench speed --out $OUT/x.json > /dev/null') == \
        [["bench", "speed", "--out", "$OUT/x.json"]]
    assert bass_arguments('hf=(python3 -m bass.cli bench hf --model m)') == [["bench", "hf", "--model", "m"]]
    assert bass_arguments('$PY -c "$patch; from bass.cli import main; main()" bench speed --target $T') == \
        [["bench", "speed", "--target", "$T"]]
    assert bass_arguments('X=1 bass -v up --config c && bass down') == [["-v", "up", "--config", "c"], ["down"]]
    assert bass_arguments('echo bass serve') == []
    assert command_path(["-v", "eval", "humaneval", "--n", "8"]) == ["eval", "humaneval"]
    assert command_path(["$cmd", "x"]) is None
    with pytest.raises(KeyError):
        command_path(["bench", "no-such-benchmark"])
