"""The dtypes a signature may name, by their short names ("bf16"), one definition for both sides."""
from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
ALL_DTYPES = frozenset(DTYPES)  # what a kernel declares when it computes in every dtype
HALF = frozenset({"bf16", "fp16"})
