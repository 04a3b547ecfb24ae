"""A toy elementwise op, added the way CONTRIBUTING.md says: one op record (the runtime's
OpSchema and the tuner's OpContract) and one kernel module (the two kernels below), nothing else.

As a plugin (lzsolve tune --plugin tests.toy_op) it registers them. Run as a script
(python -m tests.toy_op FOLDER, by tests/test_toy_op.py, in a process of its own so the op
does not join the other tests' registry) it records calls of the op, tunes the recording on
the CPU, then loads the artifact, dispatches from the table, warms up and compiles the custom
op with fullgraph.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from lzsolve.ops import OpContract, register_contract
from runtime_loader import registry
from runtime_loader.custom_ops import add_op
from runtime_loader.dtypes import ALL_DTYPES
from runtime_loader.ops import OPS, OpSchema
from runtime_loader.ops.act import one_input_front, one_row_inputs
from runtime_loader.ops.base import rows_op_call
from runtime_loader.specs import BOTH, KernelSpec

NAME = "act.squared_relu"


# --- the op record: runtime half, then the tuner's contract ---------------------------------------
def squared_relu_front(x: torch.Tensor):
    """relu(x) ** 2 (Primer's activation)."""
    return one_input_front(x)


def reference(x):
    return torch.relu(x) ** 2


def flops(sig, dims):
    return 2.0 * dims["tokens"] * sig.dim("width")


def bytes_moved(sig, dims):
    return 2.0 * dims["tokens"] * sig.dim("width") * torch.finfo(torch.float32).bits / 8


# --- the kernel module -------------------------------------------------------------------------------
def eager_squared_relu(x):
    return torch.relu(x).square()


def clamped_squared_relu(x):
    positive = x.clamp_min(0)
    return positive * positive


KERNELS = [
    KernelSpec("eager.squared_relu", frozenset({NAME}), "torch", eager_squared_relu, platforms=BOTH,
               dtypes=ALL_DTYPES, graph_safe=True, deterministic=True),
    KernelSpec("toy.squared_relu", frozenset({NAME}), "torch", clamped_squared_relu, platforms=BOTH,
               dtypes=ALL_DTYPES, graph_safe=True, deterministic=True),
]

if NAME not in OPS:  # imported once per process, as a plugin or by the script below
    add_op(OpSchema(NAME, ("width",), (), ("tokens",), "eager.squared_relu", method="squared_relu",
                    front=squared_relu_front, call=rows_op_call(NAME), inputs=one_row_inputs))
    register_contract(OpContract(NAME, reference, flops, bytes_moved,
                                 (({"width": 96}, (), {"tokens": 7}), ({"width": 1000}, (), {"tokens": 2}))))
    for _spec in KERNELS:
        registry.register(_spec)


def main(folder: Path) -> None:
    from click.testing import CliRunner

    import runtime_loader
    from lzsolve.cli import cli
    from runtime_loader import Dispatcher, custom_ops

    xs = [torch.randn(tokens, 96) for tokens in (1, 5, 12)]
    with runtime_loader.record(folder / "calls.json"):  # dispatched (to the fallback) and recorded
        for x in xs:
            torch.testing.assert_close(Dispatcher(None).squared_relu(x), reference(x))
    result = CliRunner().invoke(cli, ["tune", "--workload", str(folder / "calls.json"), "--device", "cpu",
                                      "--grid", "tiny", "--plugin", "tests.toy_op", "--out", str(folder / "out")])
    assert result.exit_code == 0, result.output
    table = json.loads((folder / "out" / "dispatch.json").read_text())
    assert [entry["op"] for entry in table["ops"]] == [NAME], "tuned"

    d = runtime_loader.load(folder / "out", strict=True)
    assert d.warmup(strict=True) > 0, "warmed up from the record's inputs"
    for x in xs:
        torch.testing.assert_close(d.squared_relu(x), reference(x))
    assert all(not kernel.endswith("(fallback)") for kernel in d.stats()[NAME]), "dispatched from the table"

    custom_ops.activate(d)
    compiled = torch.compile(lambda x: torch.ops.lzsolve.squared_relu(x) + 1, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(xs[1]), reference(xs[1]) + 1)
    print("toy op: tuned, dispatched, warmed up and compiled")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
