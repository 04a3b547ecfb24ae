"""The parity gate turns every kind of misbehaviour into a Reason, never a crash."""
import dataclasses

import pytest
import torch

from lzsolve.bench import CpuHarness
from lzsolve.gates import parity_gate
from lzsolve.ops import CONTRACTS
from runtime_loader import registry
from runtime_loader.ops import Signature

SIG = Signature.make("norm.rms", {"hidden": 128}, (), "bf16")
good = registry.get("torch.rms_norm")


def run(impl):
    spec = dataclasses.replace(good, kernel_id="test.bad", impl=impl)
    args = CONTRACTS[SIG.op].make_inputs(SIG, {"tokens": 4}, torch.device("cpu"), torch.Generator().manual_seed(0))
    return parity_gate(CONTRACTS[SIG.op], spec, SIG, args, CpuHarness())


def test_good_kernel_is_admitted_with_first_call_time():
    p = run(good.impl)
    assert p.reason is None and p.first_call_ms > 0 and p.errors["rel_l2"] < 1e-2


def oom(*args):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")


@pytest.mark.parametrize("impl,code", [
    (lambda x, w, eps: (_ for _ in ()).throw(RuntimeError("No available kernel")), "RAISED"),
    (lambda x, w, eps: torch.full_like(x, float("nan")), "PARITY_FAILED"),
    (lambda x, w, eps: x * w, "PARITY_FAILED"),  # forgot to normalise
    (lambda x, w, eps: good.impl(x, w, eps)[:-1], "PARITY_FAILED"),  # wrong shape
    (lambda x, w, eps: good.impl(x, torch.ones_like(w), eps), "PARITY_FAILED"),  # ignores the weight
    (oom, "OOM"),
])
def test_misbehaving_kernels_get_reasons(impl, code):
    p = run(impl)
    assert p.reason is not None and p.reason.code == code, p
