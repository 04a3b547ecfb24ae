"""Hand-built artifacts for runtime tests (the solver's own output is tested end to end)."""
import json

from runtime_loader import registry
from runtime_loader.hardware import hardware_signature
from runtime_loader.manifest import MANIFEST, build_manifest
from runtime_loader.ops import Signature


def entry(sig: Signature, tree: dict) -> dict:
    return {"signature": str(sig), **sig.to_json(), "tree": tree}


RMS = Signature.make("norm.rms", {"hidden": 64}, (), "fp32")
ATTN = Signature.make("attention.prefill", {"hq": 4, "hkv": 2, "d": 16}, ("causal",), "fp32")


def leaf_ids(node):
    if "kernel_id" in node:
        return {node["kernel_id"]}
    return leaf_ids(node["le"]) | leaf_ids(node["gt"])


def provenance(kernel_ids) -> dict:
    out = {}
    for kernel_id in kernel_ids:
        spec = registry.get(kernel_id) if registry.known(kernel_id) else None
        out[kernel_id] = {"library": "torch", "version": spec.version() if spec else "0",
                          "capabilities": spec.capabilities_hash() if spec else "0" * 64, "jit_caches": []}
    return out


def table(ops=None, **overrides) -> dict:
    ops = ops if ops is not None else [
        entry(RMS, {"dim": "tokens", "threshold": 8.0, "le": {"kernel_id": "torch.rms_norm"},
                    "gt": {"kernel_id": "eager.rms_norm"}}),
        entry(ATTN, {"kernel_id": "sdpa.math"}),
    ]
    if "kernels" not in overrides:
        named = set().union(*(leaf_ids(e["tree"]) for e in ops if isinstance(e.get("tree"), dict))) if ops else set()
        overrides["kernels"] = provenance(named)
    return {
        "schema_version": 1,
        "model": {"id": "test", "tp": 1, "dtype": "fp32"},
        "hardware": hardware_signature("cpu"),
        "capabilities_hash": registry.capabilities_hash(),
        "timing_mode": "eager",
        "buckets": {"norm.rms": {"tokens": [1, 16]}, "attention.prefill": {"batch": [1], "seq": [8]}},
        "fallback_policy": {"outside_table": "fallback", "fallbacks": {}},
        "jit": None,
        "ops": ops,
        **overrides,
    }


def write(folder, raw, manifest: bool = True) -> str:
    """An artifact folder with dispatch.json (and, unless told otherwise, a matching manifest)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dispatch.json").write_text(raw if isinstance(raw, str) else json.dumps(raw))
    if manifest:
        (folder / MANIFEST).write_text(json.dumps(build_manifest(folder)))
    return str(folder)
