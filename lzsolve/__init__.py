"""lzsolve: offline autotuner and dispatch-table solver for LLM inference kernels."""
import os as _os
import sys as _sys

__version__ = "0.1.0"

# A tune's workers share one bytecode cache in the run's folder (lzsolve.worker.share_bytecode).
# multiprocessing starts them with the parent's -B, which PYTHONDONTWRITEBYTECODE implies; a
# worker lifts it here, before its heavy imports, where the cache is the one its run chose.
if _sys.dont_write_bytecode and _sys.pycache_prefix and _os.environ.get("LZSOLVE_BYTECODE") == _sys.pycache_prefix:
    _sys.dont_write_bytecode = False
