"""Kernel adapters: each module declares SPECS (KernelSpec list) and may declare TUNABLES."""
from . import builtin, compiled, eager, sdpa

ALL_SPECS = [*sdpa.SPECS, *eager.SPECS, *builtin.SPECS, *compiled.SPECS]
ALL_TUNABLES = []
