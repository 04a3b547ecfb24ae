"""runtime_loader: replay an lzsolve dispatch table at server start.

    d = runtime_loader.load("artifacts/llama3-70b/<hw>")
    out = d.attention(q, k, v, causal=True)

Imports torch only (kernel libraries lazily, through the registry); never
imports lzsolve, pandas, pyarrow, duckdb or optuna.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch

from .dispatcher import Dispatcher
from .hardware import hardware_signature, mismatches
from .table import TableError, read_table

__all__ = ["Dispatcher", "TableError", "load"]


def load(path: str | Path, *, strict: bool = False) -> Dispatcher:
    """Validate the artifact at `path` (a folder with dispatch.json, or the file) and
    return a Dispatcher replaying it. A table that cannot be trusted gives one warning
    and a dispatcher whose every call uses the fallback; with strict=True it raises
    TableError instead."""
    try:
        table = read_table(path)
        device = table.hardware["device"]
        if device == "cuda" and not torch.cuda.is_available():
            raise TableError("table was tuned on CUDA but no CUDA device is available here")
        here = hardware_signature("cuda" if device == "cuda" else "cpu")
        wrong = mismatches(table.hardware, here)
        if wrong:
            raise TableError(f"hardware or software stack differs ({'; '.join(wrong)})")
        return Dispatcher(table)
    except TableError as e:
        if strict:
            raise
        warnings.warn(f"lzsolve: not using dispatch table {path}: {e}; every call uses the fallback",
                      RuntimeWarning, stacklevel=2)
        return Dispatcher(None)
