"""`python -m lzsolve ...` is the `lzsolve` command (for scripts that pin the interpreter)."""
from lzsolve.cli import run

run()
