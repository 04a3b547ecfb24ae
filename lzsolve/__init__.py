"""lzsolve: offline autotuner and dispatch-table solver for LLM inference kernels."""
__version__ = "0.1.0"
