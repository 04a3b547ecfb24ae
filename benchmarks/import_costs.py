"""What a fresh process pays to import each module a tune's workers import, with and without
bytecode: as the interpreter has it, then twice with one shared bytecode cache (the first process
writes it, the second reads it), as a tune's workers share theirs (lzsolve.measure.worker.share_bytecode).
Each cell is its own fresh process: `import torch`, then the module, timed apart. Issue 16,
benchmark log §15 (a measuring worker's first Liger call took about 10 s, once per process).

    python benchmarks/import_costs.py [--modules torch._dynamo,transformers,liger_kernel.ops.rms_norm]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

DEFAULT_MODULES = ("lzsolve.measure.worker", "torch._dynamo", "torch._inductor.compile_fx", "transformers",
                   "liger_kernel.ops.rms_norm", "flashinfer")
PROBE = """
import json, sys, time
started = time.perf_counter()
import torch
torch_s = time.perf_counter() - started
started = time.perf_counter()
try:
    __import__(sys.argv[1])
    error = None
except Exception as e:  # a missing optional library is a row, not a crash
    error = f"{type(e).__name__}: {e}"[:120]
print(json.dumps({"torch_s": torch_s, "module_s": time.perf_counter() - started, "error": error}))
"""


def timed_import(module: str, env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, module], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def conditions(cache: str) -> list[tuple[str, dict]]:
    plain = dict(os.environ)
    shared = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"PYTHONPYCACHEPREFIX": cache}
    return [("as the interpreter has it", plain), ("shared cache, first process", shared),
            ("shared cache, second process", shared)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", default=",".join(DEFAULT_MODULES))
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, dont_write_bytecode={sys.flags.dont_write_bytecode}, "
          f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE')!r}")
    print(f"{'module':<28} {'condition':<30} {'torch s':>8} {'module s':>9}")
    for module in filter(None, args.modules.split(",")):
        cache = tempfile.mkdtemp(prefix="lzsolve-bytecode-")  # a cold cache per module: its imports alone
        for name, env in conditions(cache):
            cell = timed_import(module, env)
            print(f"{module:<28} {name:<30} {cell['torch_s']:>8.2f} {cell['module_s']:>9.2f}"
                  + (f"  {cell['error']}" if cell["error"] else ""), flush=True)


if __name__ == "__main__":
    main()
