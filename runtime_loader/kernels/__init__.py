"""Kernel adapters: each module declares SPECS, a list of KernelSpec."""
from . import builtin, compiled, eager, sdpa

ALL_SPECS = [*sdpa.SPECS, *eager.SPECS, *builtin.SPECS, *compiled.SPECS]
