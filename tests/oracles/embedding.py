"""The embedding family's oracles: a signature or more per op (with dynamic dims) and an
independent float64 formula per op (lookups as one-hot products), which tests/test_ops.py checks each
contract's reference against."""
import torch.nn.functional as F

from runtime_loader.ops import Signature

SIGS = [
    (Signature.make("posenc.learned", {"hidden": 24}, (), "fp32"), {"tokens": 5}),
    (Signature.make("embedding", {"vocab": 50, "hidden": 24}, (), "fp32"), {"tokens": 7}),
    (Signature.make("embedding", {"vocab": 50, "hidden": 24}, ("scaled",), "fp32"), {"tokens": 7}),
]


def rows64(ids, table):
    """table[ids] as a one-hot matrix product."""
    return F.one_hot(ids, table.shape[0]).double() @ table.double()


INDEPENDENT = {
    "posenc.learned": lambda x, positions, table: x.double() + rows64(positions, table),
    "embedding": lambda ids, table, scale: rows64(ids, table) * (1 if scale is None else scale),
}
