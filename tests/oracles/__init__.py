"""Independent float64 oracles of the ops, one module per family (named as runtime_loader.ops's):
each lists SIGS (signatures with dynamic dims) and INDEPENDENT (op -> formula). A new op adds its
formula and a signature to its family's module; tests/test_ops.py fails until it does."""
import torch


def quantised64(rows):
    """Each row divided by its amax / 448 and cast to e4m3 (in fp32, as the format is defined): the
    values of q, and the scales."""
    step = rows.abs().amax(-1, keepdim=True).float().clamp(min=1e-12) / 448.0
    return (rows.float() / step).clamp(-448, 448).to(torch.float8_e4m3fn).double(), step.double()
