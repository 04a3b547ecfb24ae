"""The rope family's oracles: a signature or more per op (with dynamic dims) and an
independent float64 formula per op (RoPE as a complex rotation), which tests/test_ops.py checks each
contract's reference against."""
import torch

from runtime_loader.ops import Signature

SIGS = [
    (Signature.make("posenc.rope", {"hq": 4, "hkv": 2, "d": 8, "layout": "split_half"}, (), "fp32"), {"tokens": 6}),
    (Signature.make("posenc.rope", {"hq": 4, "hkv": 2, "d": 8, "layout": "interleaved"}, (), "fp32"), {"tokens": 6}),
]


def rope64(q, k, cos, sin, interleaved):
    """RoPE as a complex rotation of each pair, in float64."""
    def rotate(x):
        x = x.double()
        d = x.shape[-1]
        if interleaved:
            pairs = torch.complex(x[..., 0::2], x[..., 1::2])
            angle = torch.atan2(sin[..., 0::2].double(), cos[..., 0::2].double()).unsqueeze(1)
        else:
            pairs = torch.complex(x[..., : d // 2], x[..., d // 2:])
            angle = torch.atan2(sin[..., : d // 2].double(), cos[..., : d // 2].double()).unsqueeze(1)
        rotated = pairs * torch.polar(torch.ones_like(angle), angle)
        if interleaved:
            return torch.stack((rotated.real, rotated.imag), -1).flatten(-2)
        return torch.cat((rotated.real, rotated.imag), -1)
    return rotate(q), rotate(k)


INDEPENDENT = {
    "posenc.rope": rope64,
}
