"""How long the `lzsolve` command takes from its last output line to its exit (benchmark log §15.11-15.12):
a tiny CPU tune through `python -m lzsolve`, stdout read line by line.

    python benchmarks/archive/command_exit.py [--repeat N]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lzsolve.models import CATALOGUE

TINY = {**CATALOGUE["llama3-8b"], "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}  # tests.test_cli.TINY_LLAMA


def exit_seconds(folder: Path) -> float:
    config = folder / "tiny.json"
    config.write_text(json.dumps(TINY))
    command = [sys.executable, "-m", "lzsolve", "tune", "--config", str(config), "--grid", "tiny", "--dtype", "fp32",
               "--device", "cpu", "--sample-time", "0.05", "--no-probe", "--validate", "0",
               "--out", str(folder / "out"), "--json"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    last = time.perf_counter()
    for _ in process.stdout:
        last = time.perf_counter()
    if process.wait():
        sys.exit(f"error: the tune exited {process.returncode}")
    return time.perf_counter() - last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as folder:
            print(f"from the last output line to the exit: {exit_seconds(Path(folder)):.2f} s")


if __name__ == "__main__":
    main()
