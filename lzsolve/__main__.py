"""`python -m lzsolve ...` is the `lzsolve` command (for scripts that pin the interpreter)."""
from .cli import run

run()
