"""``examples/``: the configs load, and every ``cpmem`` command of the walkthrough runs.

The walkthrough's fenced ``bash`` blocks are parsed; each ``cpmem ...`` line runs as
a subprocess of this interpreter's cpmem (``python -m cpmem.cli``) from a scratch
directory holding a copy of ``examples/``. A line's expected exit status is 0,
unless its comment names others (``# exit 3: refused``, ``# exit 0, or 1 when ...``).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cpmem.model.load import load_model
from cpmem.model.presets import PRESETS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
WALKTHROUGH = EXAMPLES / "README.md"


def walkthrough_commands(text: str) -> list[tuple[str, set[int]]]:
    """Every ``cpmem`` line of the ```bash blocks, with the exit statuses it documents."""
    out: list[tuple[str, set[int]]] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            command, _, comment = line.partition("#")
            command = command.strip()
            if not command.startswith("cpmem "):
                continue
            codes = {0}
            if re.search(r"\bexits?\b", comment):
                codes = {int(n) for n in re.findall(r"\b(\d)\b", comment)}
            out.append((command, codes))
    return out


COMMANDS = walkthrough_commands(WALKTHROUGH.read_text(encoding="utf-8"))


def test_the_walkthrough_is_parsed() -> None:
    assert len(COMMANDS) >= 8
    assert ("cpmem diff --base HEAD", {0, 1}) in COMMANDS
    assert any(codes == {3} for _, codes in COMMANDS)
    subcommands = {c.split()[1] for c, _ in COMMANDS}
    assert {"estimate", "admit", "gate", "golden", "diff"} <= subcommands
    assert "(examples/README.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "directory, preset",
    [("qwen3-1.7b", "qwen3-1.7b"), ("qwen3.5-4b", "qwen3.5-4b"), ("llama-3.1-8b-style", None)],
)
def test_the_configs_load(directory: str, preset: str | None) -> None:
    geometry = load_model(config=str(EXAMPLES / directory / "config.json"))
    if preset is not None:
        assert geometry == PRESETS[preset]
    else:  # Llama-3.1-8B's published shapes
        assert (geometry.hidden, geometry.layers, geometry.ffn) == (4096, 32, 14336)
        assert (geometry.q_heads, geometry.kv_groups, geometry.head_dim) == (32, 8, 128)
        assert (geometry.vocab, geometry.gdn_layers, geometry.is_moe) == (128256, 0, False)
        assert not geometry.tied_embeddings and not geometry.fused_swiglu


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("walkthrough")
    shutil.copytree(EXAMPLES, work / "examples")
    return work


@pytest.mark.parametrize("command, codes", COMMANDS, ids=[c for c, _ in COMMANDS])
def test_every_walkthrough_command_runs(command: str, codes: set[int], workdir: Path) -> None:
    argv = shlex.split(command)[1:]
    if argv[0] == "diff" and not (ROOT / ".git").exists():
        pytest.skip("cpmem diff needs the repository's git history (not a git checkout)")
    env = {**os.environ, "CPMEM_GOLDEN_DIR": str(ROOT / "golden"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "cpmem.cli", *argv],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in codes, f"{command}: exit {done.returncode}\n{done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr
