"""Dynamo's guards on a compiled model: torch.compile of a tiny Llama against the same model patched
with patch(model, d, traced=True), a CPU table tuned for it first (benchmark log §11.9).

Each variant runs in a process of its own (two compiled models of one class share the modelling
code's Dynamo cache, and each lookup would try the other's entries): the guard lines Dynamo logs
(TORCH_LOGS=guards), and the profiler's `TorchDynamo Cache Lookup` per call, the median of each
of --rounds rounds of 300 calls. Host-only work: a CPU shows it as well as a GPU host.

    python benchmarks/traced_guards.py [--layers 4] [--rounds 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHILD = r"""
import json, sys, torch, transformers
from torch.profiler import ProfilerActivity, profile
import runtime_loader
from runtime_loader.integrations import transformers as lz_hf
variant, config, table, rounds = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**config),
                                                      attn_implementation="sdpa").eval()
if variant == "traced":
    lz_hf.patch(model, runtime_loader.load(table, strict=True), traced=True)
compiled = torch.compile(model, backend="eager")
ids = torch.randint(0, config["vocab_size"], (1, 32))
lookups = []
with torch.inference_mode():
    compiled(input_ids=ids, use_cache=False)
    for _ in range(rounds):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(300):
                compiled(input_ids=ids, use_cache=False)
        event = next(e for e in prof.key_averages() if e.key == "TorchDynamo Cache Lookup")
        lookups.append(event.cpu_time_total / event.count)
print("LOOKUPS", json.dumps(lookups))
"""


def measure(variant: str, config: dict, table: Path, rounds: int) -> tuple[int, list[float]]:
    env = dict(os.environ, TORCH_LOGS="guards", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", CHILD, variant, json.dumps(config), str(table), str(rounds)],
                         capture_output=True, text=True, env=env, check=True)
    guards = sum("[__guards]" in line and "+- " in line for line in out.stderr.splitlines())
    lookups = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("LOOKUPS"))[8:])
    return guards, lookups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from tests.test_cli import TINY_LLAMA

    config = {k: v for k, v in TINY_LLAMA.items() if k != "model_type"} | {"num_hidden_layers": args.layers}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "tiny-llama"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**TINY_LLAMA, "num_hidden_layers": args.layers}))
        table = Path(tmp) / "table"
        subprocess.run([sys.executable, "-m", "lzsolve", "tune", "--config", str(folder / "config.json"),
                        "--grid", "tiny", "--dtype", "fp32", "--device", "cpu", "--exclude", "compile.*",
                        "--no-probe", "--validate", "0", "--out", str(table)], check=True, capture_output=True)
        print(f"tiny Llama, {args.layers} layers, CPU: guard lines, and the cache lookup per call "
              f"(median of each round of 300 calls, us)")
        for variant in ("compile", "traced"):
            guards, lookups = measure(variant, config, table, args.rounds)
            print(f"{variant:8} {guards:6d} guard lines   lookup {statistics.median(lookups):7.1f} us "
                  f"(rounds {', '.join(f'{x:.0f}' for x in sorted(lookups))})")


if __name__ == "__main__":
    main()
