"""The parity gate turns every kind of misbehaviour into a Reason, never a crash."""
import dataclasses

import pytest
import torch

from lzsolve.measure.gates import parity_gate
from lzsolve.measure.harness import CpuHarness
from lzsolve.ops import CONTRACTS, to_fp32
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


def right_while_compiling(skipped):
    """Right on its first call (the one that compiles), then `skipped` on every later call: Helion
    1.4.0's RMSNorm on an H100 passed its first calls and was timed 40x past the roofline."""
    calls = []

    def impl(x, w, eps):
        calls.append(1)
        return good.impl(x, w, eps) if len(calls) == 1 else skipped(x, w, eps)
    return impl


@pytest.mark.parametrize("skipped", [
    lambda x, w, eps: torch.zeros_like(x),  # an output never written
    lambda x, w, eps: good.impl(x[:1], w, eps).expand_as(x).contiguous(),  # one row of many
])
def test_a_kernel_right_only_on_its_first_call_is_rejected(skipped):
    p = run(right_while_compiling(skipped))
    assert p.reason is not None and p.reason.code == "PARITY_FAILED", p
    assert p.reason.message.startswith("right on its first call, then rel_l2"), p.reason
    assert p.first_call_ms is not None and p.errors["rel_l2"] > 0.1, "the second call's errors are recorded"


@pytest.mark.gpu
def test_an_output_left_unwritten_is_not_the_last_candidates_answer():
    """On CUDA the caching allocator hands a kernel the block the candidate before it wrote its
    answer to these same inputs into: a kernel that leaves its rows unwritten (Helion 1.4.0's RMSNorm
    compiled for one row, on an H100) passed parity with that answer. The gate poisons them first."""
    from lzsolve.measure.harness import CudaHarness

    contract, device = CONTRACTS[SIG.op], torch.device("cuda")
    args = contract.make_inputs(SIG, {"tokens": 64}, device, torch.Generator(device=device).manual_seed(0))
    reference = contract.reference(*to_fp32(args))
    assert parity_gate(contract, good, SIG, args, CudaHarness(), reference).reason is None
    unwritten = dataclasses.replace(good, kernel_id="test.unwritten", impl=lambda x, w, eps: torch.empty_like(x))
    p = parity_gate(contract, unwritten, SIG, args, CudaHarness(), reference)
    assert p.reason is not None and p.reason.code == "PARITY_FAILED", p


@pytest.mark.parametrize("dims", [{"batch": 2, "seq": 37}, {"batch": 3, "seq": 1}])
def test_a_consumed_parameter_left_out_is_no_input_to_keep(dims):
    """The conv's state is consumed where there is one, None on a prompt: nothing to copy for the
    second call."""
    sig = Signature.make("conv.causal_depthwise", {"channels": 96, "width": 4}, ("silu",), "bf16")
    args = CONTRACTS[sig.op].make_inputs(sig, dims, torch.device("cpu"), torch.Generator().manual_seed(0))
    p = parity_gate(CONTRACTS[sig.op], registry.get("eager.causal_conv1d"), sig, args, CpuHarness())
    assert p.reason is None, p


FP8 = Signature.make("linear.fp8", {"k": 64, "n": 48}, ("per_channel",), "bf16")
FP8_LINEAR = registry.get("eager.linear_fp8").impl


@pytest.mark.parametrize("impl,code", [
    (FP8_LINEAR, None),
    # a per-tensor kernel handed per-channel scales: the first channel's scale for every row
    (lambda x, w, scale, bias: FP8_LINEAR(x, w, scale[:1], bias), "PARITY_FAILED"),
    # the scales applied along the input dim instead of the output channels
    (lambda x, w, scale, bias: x @ (w.to(x.dtype) * scale[:1].to(x.dtype)).T, "PARITY_FAILED"),
    # the activations left unquantised (W8A16: another format, ~2.5% from W8A8's result)
    (lambda x, w, scale, bias: torch.nn.functional.linear(x, w.to(x.dtype) * scale.to(x.dtype)[:, None], bias),
     "PARITY_FAILED"),
])
def test_an_fp8_kernel_with_the_wrong_scale_layout_is_rejected(impl, code):
    spec = dataclasses.replace(registry.get("eager.linear_fp8"), kernel_id="test.fp8", impl=impl)
    args = CONTRACTS[FP8.op].make_inputs(FP8, {"tokens": 5}, torch.device("cpu"), torch.Generator().manual_seed(0))
    p = parity_gate(CONTRACTS[FP8.op], spec, FP8, args, CpuHarness())
    assert (p.reason.code if p.reason else None) == code, p


NORM_FP8 = Signature.make("norm.rms_add_fp8", {"hidden": 256}, (), "bf16")
NORM_FP8_KERNEL = registry.get("eager.rms_norm_add_fp8").impl


def one_scale_for_every_row(x, residual, weight, eps):
    """Per tensor instead of per token: the largest row's scale for all of them."""
    q, scale, total = NORM_FP8_KERNEL(x, residual, weight, eps)
    values = q.float() * scale
    tensor_scale = scale.max().expand_as(scale)
    return (values / tensor_scale).to(torch.float8_e4m3fn), tensor_scale, total


@pytest.mark.parametrize("impl,code", [
    (NORM_FP8_KERNEL, None),
    (one_scale_for_every_row, "PARITY_FAILED"),
    # the normed rows with a scale of one: no quantisation at all
    (lambda x, r, w, eps: (registry.get("eager.rms_norm_add").impl(x, r, w, eps)[0].to(torch.float8_e4m3fn),
                           torch.ones(*x.shape[:-1], 1), x + r), "PARITY_FAILED"),
])
def test_a_norm_with_fp8_output_is_checked_on_its_codes_and_scales(impl, code):
    """norm.rms_add_fp8's q is compared by value and its scales apart: a kernel whose q * scale is
    right but whose scale layout is not (one scale per tensor) is rejected, as linear.fp8's is."""
    spec = dataclasses.replace(registry.get("eager.rms_norm_add_fp8"), kernel_id="test.norm_fp8", impl=impl)
    args = CONTRACTS[NORM_FP8.op].make_inputs(NORM_FP8, {"tokens": 6}, torch.device("cpu"),
                                               torch.Generator().manual_seed(0))
    p = parity_gate(CONTRACTS[NORM_FP8.op], spec, NORM_FP8, args, CpuHarness())
    assert (p.reason.code if p.reason else None) == code, p


KEEP = Signature.make("norm.rms_add", {"hidden": 256}, ("keep_inputs",), "bf16")
RMS_ADD = registry.get("eager.rms_norm_add").impl


def in_place(x, residual, weight, eps, unit_offset=False, keep_inputs=False):
    """Right results, written over x and residual as serving engines' kernels do (FlashInfer's)."""
    normed, total = RMS_ADD(x, residual, weight, eps, unit_offset)
    residual.copy_(total)
    x.copy_(normed)
    return x, residual


@pytest.mark.parametrize("sig,impl,code", [
    (KEEP, RMS_ADD, None),
    (KEEP, in_place, "PARITY_FAILED"),
    (dataclasses.replace(KEEP, flags=frozenset()), in_place, None),  # the op's contract allows it otherwise
])
def test_a_kernel_that_writes_over_inputs_the_call_keeps_is_rejected(sig, impl, code):
    spec = dataclasses.replace(registry.get("eager.rms_norm_add"), kernel_id="test.rms_add", impl=impl)
    args = CONTRACTS[sig.op].make_inputs(sig, {"tokens": 6}, torch.device("cpu"), torch.Generator().manual_seed(0))
    p = parity_gate(CONTRACTS[sig.op], spec, sig, args, CpuHarness())
    assert (p.reason.code if p.reason else None) == code, p
    if code:
        assert "residual" in p.reason.message and "x" in p.reason.message
