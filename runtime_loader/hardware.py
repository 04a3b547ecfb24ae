"""Hardware signature: what a table was measured on, and whether this machine matches it."""
from __future__ import annotations

import platform
import re
from typing import NamedTuple

import torch

from .specs import DeviceInfo, library_version

# What a table's measurements depend on, in three kinds (see differences):
ARCH_FIELDS = ("device", "sm", "isa")  # another architecture: no measurement holds, the table is refused
MODEL_FIELDS = ("name", "arch")  # another GPU (or CPU) of that architecture: borrowed only when the user asks
# A CPU table's kernels are the host's machine code: on another host architecture (x86_64 against aarch64)
# none of them holds, even where torch names both ISAs DEFAULT. A GPU table's host architecture is its
# model's kind of difference: the GPU times hold, the host time an eager table weighs does not.
CPU_ARCH_FIELDS = ARCH_FIELDS + ("arch",)
STACK_FIELDS = ("torch", "cuda", "cudnn", "triton")  # software: the entries of the kernels it changes are dropped
MATCH_FIELDS = ARCH_FIELDS + MODEL_FIELDS + STACK_FIELDS  # all of them: where a tune's records may be mixed


def device_info(device: torch.device | str) -> DeviceInfo:
    device = torch.device(device)
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return DeviceInfo("cuda", major * 10 + minor)
    return DeviceInfo(device.type)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvidia_driver() -> str | None:
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            return pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML library, no driver, or no permission: the field stays empty
        return None


def hardware_signature(device: torch.device | str) -> dict:
    device = torch.device(device)
    info = device_info(device)
    sig = {
        "device": info.type,
        "name": None,
        "sm": info.sm,
        "arch": platform.machine(),
        "isa": None,
        "torch": torch.__version__.split("+")[0],
        "cuda": None,
        "cudnn": None,
        "driver": None,
        "triton": library_version("triton"),
    }
    if info.type == "cuda":
        sig["name"] = torch.cuda.get_device_name(device)
        sig["cuda"] = torch.version.cuda
        sig["cudnn"] = torch.backends.cudnn.version()
        sig["driver"] = _nvidia_driver()
    else:
        sig["name"] = _cpu_name()
        sig["isa"] = torch.backends.cpu.get_cpu_capability()
    return sig


def slug(sig: dict) -> str:
    """A folder name for a signature, e.g. 'nvidia-h100-80gb-hbm3-sm90-cuda13.0-torch2.11.0'."""
    if sig["device"] == "cuda":
        parts = [sig["name"], f"sm{sig['sm']}", f"cuda{sig['cuda']}"]
    else:
        parts = [sig["device"], sig["arch"], sig["isa"] or ""]
    parts.append(f"torch{sig['torch']}")
    text = "-".join(p for p in parts if p).lower()
    return re.sub(r"[^a-z0-9.]+", "-", text).strip("-")


def differing(a: dict, b: dict) -> list[str]:
    """The fields a table must match where it is loaded (MATCH_FIELDS) that differ between a and b."""
    return [k for k in MATCH_FIELDS if a.get(k) != b.get(k)]



class Comparison(NamedTuple):
    """A table's hardware signature against this machine's: `refused` names another architecture
    (the table cannot be used), `borrowed` another device model of the same architecture (usable
    when the user allows it), `stack` the software fields that changed, field -> (table's, here)."""

    refused: list[str]
    borrowed: list[str]
    stack: dict[str, tuple]


def differences(table_sig: dict, here: dict) -> Comparison:
    def described(fields) -> list[str]:
        return [f"{k}: table {table_sig.get(k)!r} vs here {here.get(k)!r}" for k in fields]

    arch = CPU_ARCH_FIELDS if table_sig.get("device") == "cpu" else ARCH_FIELDS
    return Comparison(described(k for k in arch if table_sig.get(k) != here.get(k)),
                      described(k for k in MODEL_FIELDS if k not in arch and table_sig.get(k) != here.get(k)),
                      {k: (table_sig.get(k), here.get(k)) for k in STACK_FIELDS if table_sig.get(k) != here.get(k)})


def stale_under(spec, stack: dict[str, tuple]) -> str | None:
    """Why a kernel's measurements do not hold under the changed software `stack` (Comparison.stack),
    beyond its own library's recorded version (KernelSpec.version): a torch change touches torch's
    own kernels, a CUDA or cuDNN change every CUDA kernel (cuBLAS, cuDNN, compiled extensions), a
    Triton change every kernel that runs Triton code (its JIT caches say so: ours, Liger's, FLA's,
    Inductor's). Other libraries' kernels keep their entries."""
    fields = ["torch"] if "torch" in stack and spec.library == "torch" else []
    if spec.platforms & {"cuda"}:
        fields += [k for k in ("cuda", "cudnn") if k in stack]
    if "triton" in stack and "triton" in spec.jit_caches:
        fields.append("triton")
    if not fields:
        return None
    return "; ".join(f"{k} is {stack[k][1]} here, the table measured {stack[k][0]}" for k in fields)
