"""Hand-built dispatch tables for runtime tests (the solver's own output is tested end to end)."""
import json

from runtime_loader.hardware import hardware_signature
from runtime_loader.ops import Signature


def entry(sig: Signature, tree: dict) -> dict:
    return {"signature": str(sig), **sig.to_json(), "tree": tree}


RMS = Signature.make("norm.rms", {"hidden": 64}, (), "fp32")
ATTN = Signature.make("attention.prefill", {"hq": 4, "hkv": 2, "d": 16}, ("causal",), "fp32")


def table(ops=None, **overrides) -> dict:
    ops = ops if ops is not None else [
        entry(RMS, {"dim": "tokens", "threshold": 8.0, "le": {"kernel_id": "torch.rms_norm"},
                    "gt": {"kernel_id": "eager.rms_norm"}}),
        entry(ATTN, {"kernel_id": "sdpa.math"}),
    ]
    return {"schema_version": 1, "hardware": hardware_signature("cpu"), "ops": ops, **overrides}


def write(folder, raw) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dispatch.json").write_text(raw if isinstance(raw, str) else json.dumps(raw))
    return str(folder)
