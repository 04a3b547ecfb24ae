"""A plugin with a CPU tunable family, for testing the configuration search without a GPU
(lzsolve tune --plugin tests.tunable_kernels --spaces <folder with demo.rms_norm.yaml>).

`rows` is a real knob: the kernel normalises that many rows per torch call, so small values
pay Python overhead per chunk. `exact=0` is a deliberately wrong configuration (skips the
normalisation) that the parity gate must prune.
"""
import torch

from runtime_loader.registry import register_tunable
from runtime_loader.specs import KernelSpec, Tunable


def build(config):
    rows, exact = config["rows"], config["exact"]

    def rms_norm(x, weight, eps):
        if not exact:
            return x * weight
        flat = x.reshape(-1, x.shape[-1])
        out = torch.empty_like(flat)
        for start in range(0, flat.shape[0], rows):
            chunk = flat[start:start + rows].float()
            out[start:start + rows] = (chunk * torch.rsqrt(chunk.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
        return out.reshape(x.shape) * weight

    return rms_norm


DEMO = register_tunable(Tunable(
    KernelSpec("demo.rms_norm", frozenset({"norm.rms"}), "torch", build({"rows": 1, "exact": 1}),
               platforms=frozenset({"cpu"}), dtypes=frozenset({"fp32", "bf16"}), graph_safe=True),
    params={"rows": (1, 2, 4, 64, 1024), "exact": (0, 1)}, default={"rows": 1, "exact": 1}, build=build))

SPACE = """kernel: demo.rms_norm
trials: 6
params:
  rows: [1, 2, 4, 64, 1024]
  exact: [0, 1]
"""
