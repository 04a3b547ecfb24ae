"""Kernel adapters: each module declares SPECS (a KernelSpec list); tunable families
(kernels with a search space) are declared as TUNABLES. Optional libraries are imported
lazily, inside the adapters, so a missing one is a Reason rather than an ImportError."""
from .. import ops
from . import compile_ops, fla, flash_attn, flashinfer, flex, helion, liger, quack, sdpa, torch_ops, triton_ops

# ops.SPECS: the eager kernels each op family defines beside its records
ALL_SPECS = [*sdpa.SPECS, *ops.SPECS, *torch_ops.SPECS, *compile_ops.SPECS,
             *flex.SPECS, *flash_attn.SPECS, *flashinfer.SPECS, *liger.SPECS, *quack.SPECS, *fla.SPECS]
ALL_TUNABLES = [*triton_ops.TUNABLES, *fla.TUNABLES, *helion.TUNABLES]
