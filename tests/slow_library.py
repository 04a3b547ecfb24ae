"""A library whose first import in a run is slow (tests.nvcc_kernels' imported.rms_norm imports
it at its first call), as Liger's is where the interpreter has no bytecode: the first process to
import it sleeps IMPORT_S and leaves what it compiled in the run's cache (Triton's folder here);
a later process of the run reads that and is quick. Every import adds its pid to imports.log.
Tests take IMPORT_S from tests.nvcc_kernels: importing this module is the slow import itself."""
import fcntl
import os
import time
from pathlib import Path

from tests.nvcc_kernels import IMPORT_S

_root = Path(os.environ["TRITON_CACHE_DIR"]) / "slow_library"
_root.mkdir(parents=True, exist_ok=True)
with open(_root / "lock", "a") as _lock:
    fcntl.flock(_lock, fcntl.LOCK_EX)  # one process compiles; one that comes meanwhile waits for it
    if not (_root / "compiled").exists():
        time.sleep(IMPORT_S)
        (_root / "compiled").write_bytes(b"\0" * 16)
    with open(_root / "imports.log", "a") as _log:
        _log.write(f"{os.getpid()}\n")
