"""A plugin of misbehaving norm.rms kernels for fault-injection tests (lzsolve tune --plugin tests.faulty_kernels)."""
import ctypes
import os
import signal
import time

import torch

from runtime_loader.registry import register
from runtime_loader.specs import KernelSpec


def _raise(x, w, eps):
    raise RuntimeError("this kernel always fails")


def _nan(x, w, eps):
    return torch.full_like(x, float("nan"))


def _wrong(x, w, eps):
    return x * w  # forgot to normalise


def _hang(x, w, eps):
    time.sleep(3600)


def _segfault(x, w, eps):
    ctypes.string_at(0)  # reads address 0: SIGSEGV


def _exit(x, w, eps):
    os._exit(3)


def _oom(x, w, eps):
    return torch.empty(1 << 62, dtype=torch.uint8, device=x.device)  # the allocator refuses


def _oom_killed(x, w, eps):
    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does


def _device_assert(x, w, eps):
    """An out-of-bounds gather: IndexError on CPU; on CUDA a device-side assert that
    poisons the whole CUDA context."""
    index = torch.tensor([1 << 30], device=x.device)
    return x.flatten()[index].expand_as(x).contiguous()


FAULTS = {"raise": _raise, "nan": _nan, "wrong": _wrong, "hang": _hang, "segfault": _segfault, "exit": _exit,
          "oom": _oom, "oom_killed": _oom_killed, "device_assert": _device_assert}

for name, impl in FAULTS.items():
    register(KernelSpec(f"fault.{name}", frozenset({"norm.rms"}), "torch", impl,
                        platforms=frozenset({"cpu", "cuda"}), dtypes=frozenset({"bf16", "fp16", "fp32"})))


_calls = {"n": 0}


def _crash_later(x, w, eps):
    """Passes parity (its first call in a process), then dies while being timed."""
    _calls["n"] += 1
    if _calls["n"] >= 3:
        ctypes.string_at(0)
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)


register(KernelSpec("fault.crash_later", frozenset({"norm.rms"}), "torch", _crash_later,
                    platforms=frozenset({"cpu", "cuda"}), dtypes=frozenset({"bf16", "fp16", "fp32"})))


def _graph_unsafe(x, w, eps):
    """Correct, but synchronises with the host: a CUDA graph cannot capture it."""
    out = torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)
    out.sum().item()
    return out


register(KernelSpec("fault.graph_unsafe", frozenset({"norm.rms"}), "torch", _graph_unsafe,
                    platforms=frozenset({"cpu", "cuda"}), dtypes=frozenset({"bf16", "fp16", "fp32"})))
