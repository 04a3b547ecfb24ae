"""Two FlashInfer modules built at once from one JIT folder, as a tune's workers on two GPUs build
them: are they built again afterwards? (benchmark log §15.3)

    python benchmarks/archive/flashinfer_concurrent_builds.py    # on a GPU; FlashInfer 0.5.3

For each way of running ninja (FlashInfer's own; runtime_loader's, with each module's logs in its
folder), in a fresh JIT folder: two processes each build one module (RMSNorm, SiLU-and-mul) at
the same time; then a third process makes both first calls again. A first call that takes
seconds there built its module again.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODULES = ("norm", "silu_and_mul")


def first_call(module: str, own_logs: bool) -> float:
    """Seconds of this process's first call of `module` (a build, if its .so is missing or stale)."""
    import torch
    if own_logs:
        from runtime_loader.kernels.flashinfer import _flashinfer
        flashinfer = _flashinfer()
    else:
        import flashinfer
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    started = time.perf_counter()
    if module == "norm":
        flashinfer.rmsnorm(x, torch.ones(4096, device="cuda", dtype=torch.bfloat16), 1e-6)
    else:
        flashinfer.silu_and_mul(x)
    torch.cuda.synchronize()
    return time.perf_counter() - started


def spawn(modules: tuple[str, ...], own_logs: bool, jit: Path) -> subprocess.Popen:
    code = (f"import json, sys; sys.path[:0] = {sys.path[:1]!r}; from flashinfer_concurrent_builds import first_call; "
            f"print(json.dumps({{m: first_call(m, {own_logs}) for m in {modules!r}}}))")
    env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": str(jit)}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)


def result(process: subprocess.Popen) -> dict:
    out, _ = process.communicate()
    if process.returncode:
        raise SystemExit(f"a build process failed ({process.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    for own_logs in (False, True):
        with tempfile.TemporaryDirectory() as folder:
            jit = Path(folder)
            builds = {m: result(p)[m] for m, p in [(m, spawn((m,), own_logs, jit)) for m in MODULES]}
            again = result(spawn(MODULES, own_logs, jit))
            logs = sorted(str(p.relative_to(jit)) for p in jit.rglob(".ninja_log"))
        for m in MODULES:
            rows.append({"ninja": "own logs" if own_logs else "FlashInfer's", "module": m,
                         "build_s": round(builds[m], 1), "first_call_after_s": round(again[m], 2), "logs": logs})
            print(f"{rows[-1]['ninja']:<13} {m:<13} built at once in {builds[m]:6.1f} s; "
                  f"first call in a later process {again[m]:6.2f} s")
        print(f"  ninja logs: {', '.join(logs)}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
