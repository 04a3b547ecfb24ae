"""What the test plugins' kernels do at a first call that compiles (tests.nvcc_kernels, tests.jitted_kernels)."""
import os
import time
from pathlib import Path


def compile_once(cache_variable: str, folder: str, entry: str, seconds: float) -> None:
    """A compile into the cache the environment variable points at: where folder/entry is missing,
    sleep `seconds`, write it and add its name to folder/compiles.log; else nothing."""
    root = Path(os.environ[cache_variable]) / folder
    if not (root / entry).exists():
        root.mkdir(parents=True, exist_ok=True)
        time.sleep(seconds)
        (root / entry).write_bytes(b"\0" * 16)
        with open(root / "compiles.log", "a") as log:
            log.write(f"{entry}\n")
