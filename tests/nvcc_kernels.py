"""Plugin norm.rms kernels that compile on their first calls (lzsolve.measure.ahead makes such calls ahead).

built.rms_norm builds into FlashInfer's JIT cache, as an nvcc-built module does: the first call
in a cache that lacks its module sleeps BUILD_S and writes it, under a file lock, as FlashInfer's
build does; later calls, in any process, find it built. Every build adds a line to builds.log.

shaped.rms_norm compiles per token count into Inductor's cache, as FlexAttention compiles a graph
per shape: a call at a count the cache lacks sleeps COMPILE_S and writes shaped/<tokens>; every
compile adds a line to shaped/compiles.log.

imported.rms_norm is an optional library's kernel (it `requires` a module) whose first call imports
tests.slow_library, slow in the first process of a run and quick in the others, as Liger's import
is where the interpreter has no bytecode."""
import fcntl
import os
import time
from pathlib import Path

import torch

from runtime_loader.registry import register
from runtime_loader.specs import KernelSpec

from .fake_jit import compile_once

BUILD_S = 0.6
MODULE = Path("built_rms") / "built_rms.so"
COMPILE_S = 0.3
IMPORT_S = 0.8  # tests.slow_library's first import in a run


def _module() -> Path:
    root = Path(os.environ["FLASHINFER_WORKSPACE_BASE"])
    module = root / MODULE
    if not module.exists():
        module.parent.mkdir(parents=True, exist_ok=True)
        with open(root / "built_rms.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not module.exists():
                time.sleep(BUILD_S)
                module.write_bytes(b"\0" * 64)
                with open(root / "builds.log", "a") as log:
                    log.write(f"{os.getpid()}\n")
    return module


def _norm(x, w, eps):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def _rms(x, w, eps):
    _module()
    return _norm(x, w, eps)


register(KernelSpec("built.rms_norm", frozenset({"norm.rms"}), "torch", _rms, platforms=frozenset({"cpu", "cuda"}),
                    dtypes=frozenset({"bf16", "fp16", "fp32"}), jit=True, jit_caches=("flashinfer",)))


def _compiled(tokens: int) -> None:
    compile_once("TORCHINDUCTOR_CACHE_DIR", "shaped", str(tokens), COMPILE_S)


def _shaped_rms(x, w, eps):
    _compiled(x.reshape(-1, x.shape[-1]).shape[0])
    return _norm(x, w, eps)


register(KernelSpec("shaped.rms_norm", frozenset({"norm.rms"}), "torch", _shaped_rms, platforms=frozenset({"cpu", "cuda"}),
                    dtypes=frozenset({"bf16", "fp16", "fp32"}), jit=True, jit_caches=("inductor",)))


def _imported_rms(x, w, eps):
    import tests.slow_library  # noqa: F401  (its first call in a process: the library's import)
    return _norm(x, w, eps)


register(KernelSpec("imported.rms_norm", frozenset({"norm.rms"}), "torch", _imported_rms, platforms=frozenset({"cpu", "cuda"}),
                    dtypes=frozenset({"bf16", "fp16", "fp32"}), requires=("tests.nvcc_kernels",)))
