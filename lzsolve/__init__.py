"""lzsolve: offline autotuner and dispatch-table solver for LLM inference kernels."""
import logging as _logging
import os as _os
import sys as _sys

__version__ = "0.1.0"


def adopt_shared_bytecode() -> None:
    """A tune's workers share one bytecode cache in the run's folder (lzsolve.measure.worker.share_bytecode).
    multiprocessing starts them with the parent's -B, which PYTHONDONTWRITEBYTECODE implies; a
    worker lifts it where the cache is the one its run chose: here, before its heavy imports, or
    once a worker started before the run chose it is told (lzsolve.measure.worker.Environment)."""
    shared = _os.environ.get("LZSOLVE_BYTECODE")
    if shared and _os.environ.get("PYTHONPYCACHEPREFIX") == shared:
        _sys.pycache_prefix = shared
        _sys.dont_write_bytecode = False


def quiet_cuda_home_warning() -> None:
    """torch's CUDA build on a machine without a GPU logs "No CUDA runtime is found, using
    CUDA_HOME=..." when Inductor first imports torch.utils.cpp_extension: once in every worker of a
    tune, into its progress bar. It says nothing lzsolve does not (it measures on CPU there, and
    `lzsolve kernels` says which kernels need a GPU), so that line is dropped in every lzsolve
    process; the logger's other records pass."""
    _logging.getLogger("torch.utils.cpp_extension").addFilter(
        lambda record: not record.getMessage().startswith("No CUDA runtime is found"))


adopt_shared_bytecode()
quiet_cuda_home_warning()
