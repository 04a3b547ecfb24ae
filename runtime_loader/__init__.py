"""runtime_loader: replay an lzsolve dispatch table at server start.

    d = runtime_loader.load("artifacts/llama3-70b/<hw>")
    out = d.attention(q, k, v, causal=True)

    with runtime_loader.record("workload.json"):   # what a real run calls, for `tune --workload`
        serve_some_requests()

Imports torch only (kernel libraries lazily, through the registry); never
imports lzsolve, pandas, pyarrow, duckdb or optuna.
"""
from __future__ import annotations

import importlib

__all__ = ["Dispatcher", "Policy", "TableError", "load", "policy", "record"]

# Where each public name lives. They are imported at first use, so that code needing only a
# torch-free helper (safeio, for the CLI's one-line errors) does not pay for torch.
_HOMES = {"load": "loader", "DATA_ERRORS": "loader", "Dispatcher": "dispatcher", "record": "recording",
          "Policy": "policies", "PolicyError": "policies", "policy": "policies", "current_policy": "policies",
          "TableError": "table", "Table": "table", "Comparison": "hardware", "hardware_signature": "hardware"}


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:  # a submodule, as `runtime_loader.jit` was reachable after `import runtime_loader`
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
