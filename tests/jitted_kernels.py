"""A plugin with a CPU tunable family whose configurations compile on their first calls, as our
Triton kernels do (lzsolve tune --plugin tests.jitted_kernels --spaces <folder with jitted.rms_norm.yaml>).

A configuration's first call in a Triton cache folder that lacks its entry sleeps COMPILE_S and
writes triton/jitted/rows-<rows>.bin (adding a line to triton/jitted/compiles.log); later calls in
any process find it. `rows` is the real knob of tests.tunable_kernels: rows normalised per torch call.
"""
import os
import time
from pathlib import Path

import torch

from runtime_loader.registry import register_tunable
from runtime_loader.specs import KernelSpec, Tunable

COMPILE_S = 0.03  # past the first call's JIT floor (lzsolve.measure.tasks.JIT_FLOOR_MS)

SPACE = """kernel: jitted.rms_norm
trials: 2
params:
  rows: [1, 64]
"""


def _compiled(rows: int) -> None:
    folder = Path(os.environ["TRITON_CACHE_DIR"]) / "jitted"
    entry = folder / f"rows-{rows}.bin"
    if not entry.exists():
        folder.mkdir(parents=True, exist_ok=True)
        time.sleep(COMPILE_S)
        entry.write_bytes(b"\0" * 32)
        with open(folder / "compiles.log", "a") as log:
            log.write(f"{rows}\n")


def build(config):
    rows = config["rows"]

    def rms_norm(x, weight, eps):
        _compiled(rows)
        flat = x.reshape(-1, x.shape[-1])
        out = torch.empty_like(flat)
        for start in range(0, flat.shape[0], rows):
            chunk = flat[start:start + rows].float()
            out[start:start + rows] = (chunk * torch.rsqrt(chunk.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
        return out.reshape(x.shape) * weight

    return rms_norm


register_tunable(Tunable(
    KernelSpec("jitted.rms_norm", frozenset({"norm.rms"}), "torch", build({"rows": 1}), platforms=frozenset({"cpu"}),
               dtypes=frozenset({"fp32", "bf16"}), graph_safe=True, jit=True, jit_caches=("triton",)),
    params={"rows": (1, 64)}, default={"rows": 1}, build=build))
