"""lzsolve: offline autotuner and dispatch-table solver for LLM inference kernels."""
import os as _os
import sys as _sys

__version__ = "0.1.0"


def adopt_shared_bytecode() -> None:
    """A tune's workers share one bytecode cache in the run's folder (lzsolve.worker.share_bytecode).
    multiprocessing starts them with the parent's -B, which PYTHONDONTWRITEBYTECODE implies; a
    worker lifts it where the cache is the one its run chose: here, before its heavy imports, or
    once a worker started before the run chose it is told (lzsolve.worker.Environment)."""
    shared = _os.environ.get("LZSOLVE_BYTECODE")
    if shared and _os.environ.get("PYTHONPYCACHEPREFIX") == shared:
        _sys.pycache_prefix = shared
        _sys.dont_write_bytecode = False


adopt_shared_bytecode()
