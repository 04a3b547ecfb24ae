"""Parity of the liger.* adapters on CPU, through the Triton interpreter.

Run by tests/test_library_adapters.py as `python -m tests.liger_interpreter_check`, in a process
of its own: TRITON_INTERPRET must be set before triton is first imported. Prints one JSON line
per (kernel, case, dtype): parity with the op's fp32 reference (computed before the call), and
whether the caller's inputs were left untouched.

fp32 and fp16 only: the interpreter (Triton 3.9) does bf16 arithmetic on the raw 16-bit patterns,
so any kernel that adds or multiplies in bf16 returns garbage there; bf16 is checked on the GPU.
Two other gaps of the interpreter are bridged so that Liger's kernels, unchanged, run as compiled
Triton runs them:
- a Python float argument stays a Python float, so `eps.to(tl.float32)` fails; compiled Triton
  passes it as an fp32 scalar, and so does `_float_as_fp32`;
- libdevice functions have no interpreter implementation: rsqrt goes to tl.math.rsqrt (Liger's
  own fallback import) and tanh to 2 * sigmoid(2x) - 1.
"""
import os

os.environ["TRITON_INTERPRET"] = "1"

import json  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from lzsolve.ops import CONTRACTS, compare, to_fp32  # noqa: E402
from runtime_loader import registry  # noqa: E402
from runtime_loader.ops import Signature  # noqa: E402


def separate(args):
    """gate and up as two contiguous tensors instead of the halves of one gate_up buffer."""
    return tuple(a.clone() for a in args)


def hf_layout(args):
    """q and k as Hugging Face hands them over, (batch, heads, seq, d) views of (batch, seq, heads, d)
    buffers: the layout Liger rotates in place (as it does any one-token q), which the adapter must not."""
    q, k, *rest = args
    return (q.transpose(1, 2).contiguous().transpose(1, 2), k.transpose(1, 2).contiguous().transpose(1, 2), *rest)


# (op, static dims, dynamic dims, how the contract's inputs are rearranged)
CASES = [
    ("norm.rms", {"hidden": 256}, {"tokens": 9}, None),
    ("norm.rms_add", {"hidden": 256}, {"tokens": 9}, None),
    ("norm.layer", {"hidden": 192}, {"tokens": 9}, None),
    ("act.swiglu", {"width": 96}, {"tokens": 7}, None),
    ("act.swiglu", {"width": 96}, {"tokens": 7}, separate),
    ("act.geglu", {"width": 96}, {"tokens": 7}, None),
    ("posenc.rope", {"hq": 4, "hkv": 2, "d": 64, "layout": "split_half"}, {"tokens": 11}, None),
    ("posenc.rope", {"hq": 4, "hkv": 2, "d": 64, "layout": "split_half"}, {"tokens": 11}, hf_layout),
    ("posenc.rope", {"hq": 4, "hkv": 2, "d": 64, "layout": "split_half"}, {"tokens": 1}, None),
]

_implicit_cvt = interpreter._implicit_cvt


def _float_as_fp32(arg):
    if isinstance(arg, float):
        return tl.tensor(interpreter.TensorHandle(np.array([arg], dtype=np.float32), tl.float32), tl.float32)
    return _implicit_cvt(arg)


def _rsqrt(x):
    return tl.math.rsqrt(x)  # looked up at call time, once the interpreter has patched tl.math


def _tanh(x):
    return 2 * tl.sigmoid(2 * x) - 1


def bridge_interpreter():
    from liger_kernel.ops import fused_add_rms_norm, geglu, layer_norm, rms_norm

    interpreter._implicit_cvt = _float_as_fp32
    for module in (rms_norm, fused_add_rms_norm, layer_norm):
        module.rsqrt = _rsqrt
    geglu.tanh = _tanh


def main():
    bridge_interpreter()
    kernels = {op: spec for spec in registry.REGISTRY.values() if spec.kernel_id.startswith("liger.")
               for op in spec.ops}
    for op, static, dims, arrange in CASES:
        spec, contract = kernels[op], CONTRACTS[op]
        for dtype in ("fp32", "fp16"):
            sig = Signature.make(op, static, (), dtype)
            args = contract.make_inputs(sig, dims, torch.device("cpu"), torch.Generator().manual_seed(0))
            args = arrange(args) if arrange else args
            before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
            reference = contract.reference(*to_fp32(args))
            try:
                ok, _, message = compare(spec.impl(*args), reference, contract.tolerances[dtype])
            except Exception as e:  # a raising adapter is a failed case, reported with its error
                ok, message = False, f"{type(e).__name__}: {e}"
            untouched = all(not isinstance(a, torch.Tensor) or torch.equal(a, b) for a, b in zip(args, before))
            case = f"{sig}{dims}{'/' + arrange.__name__ if arrange else ''}"
            print(json.dumps({"kernel": spec.kernel_id, "case": case, "ok": ok, "message": message,
                              "inputs_untouched": untouched}), flush=True)


if __name__ == "__main__":
    main()
