"""README.md's code cannot drift: the blocks marked to run on CPU run as written (the try-out's tune
with quicker timings), and every runtime_loader and lzsolve name, Dispatcher method and `lzsolve`
command it cites exists (it cited runtime_loader.library.activate, which never did)."""
import ast
import importlib
import re
import shlex
import subprocess
import sys
from pathlib import Path

import runtime_loader
from lzsolve.cli import cli

from .tables import QUICK

README = Path(__file__).resolve().parents[1] / "README.md"
MARK = "<!-- runs on CPU: tests/test_readme.py -->"


def marked_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of each fenced block right after MARK, in order."""
    return re.findall(re.escape(MARK) + r"\n```(\w+)\n(.*?)\n```", text, re.S)


def resolves(dotted: str) -> bool:
    """Whether a dotted name is a module, or an attribute chain of the longest module it starts with."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:n]))
        except ImportError:
            continue
        for part in parts[n:]:
            if not hasattr(value, part):
                return False
            value = getattr(value, part)
        return True
    return False


def test_the_names_it_cites_exist():
    text = README.read_text()
    names = set(re.findall(r"(?<![\w./])((?:runtime_loader|lzsolve)(?:\.\w+)+)", text))
    assert {"runtime_loader.custom_ops.activate", "runtime_loader.load"} <= names
    assert [n for n in sorted(names) if not resolves(n)] == []
    methods = set(re.findall(r"(?<![\w.])d\.(\w+)\(", text))
    assert {"attention", "stats", "explain"} <= methods
    assert [m for m in sorted(methods) if not hasattr(runtime_loader.Dispatcher, m)] == []
    commands = set(re.findall(r"`lzsolve (\w+)", text))
    assert [c for c in sorted(commands) if c not in cli.commands] == []


def test_the_cpu_try_out_runs_as_written(tmp_path):
    """Its tune (with the tests' quicker sampling and no validation added: this checks that the commands
    run, not the table), then its Python in a process of its own: the patched model generates, and
    its report and every op's calls (by the table's kernel or the module's own code) are printed."""
    blocks = marked_blocks(README.read_text())
    assert [language for language, _ in blocks] == ["bash", "python"]
    (_, command), (_, code) = blocks
    args = shlex.split(command)
    assert args[0] == "lzsolve"
    tuned = subprocess.run([sys.executable, "-m", "lzsolve", *args[1:], *QUICK, "--validate", "0"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=900)
    assert tuned.returncode == 0, tuned.stderr
    served = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert served.returncode == 0, served.stderr
    assert served.stdout.startswith("table: artifacts/try/dispatch.json\n"), served.stdout[:300]
    stats = ast.literal_eval(served.stdout.strip().splitlines()[-1])
    # what is served depends on what this CPU's tune chose (a module whose every choice is PyTorch's
    # default is left as it was): each op's calls, by the table's kernel or the module's own code
    assert all(kernels and all(n > 0 for n in kernels.values()) for kernels in stats.values()), stats
