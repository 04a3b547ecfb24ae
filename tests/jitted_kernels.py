"""A plugin with a CPU tunable family whose configurations compile on their first calls, as our
Triton kernels do (lzsolve tune --plugin tests.jitted_kernels --spaces <folder with jitted.rms_norm.yaml>).

A configuration's first call in a Triton cache folder that lacks its entry sleeps COMPILE_S and
writes triton/jitted/rows-<rows>.bin (adding its name to triton/jitted/compiles.log); later calls in
any process find it. `rows` is the real knob of tests.tunable_kernels' family: rows normalised per torch call.
"""
from runtime_loader.registry import register_tunable
from runtime_loader.specs import KernelSpec, Tunable

from .fake_jit import compile_once
from .tunable_kernels import build as chunked

COMPILE_S = 0.03  # past the first call's JIT floor (lzsolve.measure.tasks.JIT_FLOOR_MS)

SPACE = """kernel: jitted.rms_norm
trials: 2
params:
  rows: [1, 64]
"""


def build(config):
    rows = config["rows"]
    norm = chunked({"rows": rows, "exact": 1})

    def rms_norm(x, weight, eps):
        compile_once("TRITON_CACHE_DIR", "jitted", f"rows-{rows}.bin", COMPILE_S)
        return norm(x, weight, eps)

    return rms_norm


register_tunable(Tunable(
    KernelSpec("jitted.rms_norm", frozenset({"norm.rms"}), "torch", build({"rows": 1}), platforms=frozenset({"cpu"}),
               dtypes=frozenset({"fp32", "bf16"}), graph_safe=True, jit=True, jit_caches=("triton",)),
    params={"rows": (1, 64)}, default={"rows": 1}, build=build))
