"""A config.json as lzsolve reads it before transformers does: the file itself, the parts of a
model no op here computes (refused by name, in one line), and the FP8 scheme of its weights.

Everything else about the model (its dims, layer pattern, norms, activations) is what capture
observes in the module tree transformers builds from this dict; no family is described here.
"""
from __future__ import annotations

from pathlib import Path

from lzsolve.errors import LzError
from lzsolve.limits import MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH, read_json_input

# Config keys that mean the model computes something no op here does: refused by name
UNSUPPORTED_KEYS = {
    "kv_lora_rank": "multi-head latent attention (MLA) other than DeepSeek-V2/V3's",
    "q_lora_rank": "multi-head latent attention (MLA) other than DeepSeek-V2/V3's",
    "add_cross_attention": "cross-attention",
    "use_bidirectional_attention": "bidirectional (non-causal) attention",
}


# Model types whose multi-head latent attention is captured and served (their low-rank projections
# as linears, latent norms as norm.rms, attention with q/k 192 and v 128 as attention's dv); other
# types with the same keys (GLM-4-MoE-Lite, MiniCPM3, Kimi-Linear...) are refused until checked
MLA_TYPES = ("deepseek_v2", "deepseek_v3")
MLA_KEYS = ("kv_lora_rank", "q_lora_rank")


def read_config(path: str | Path) -> tuple[dict, str]:
    """A config.json (or a folder holding one) and the model name it implies."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    cfg = read_json_input(path, MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH, what=f"config {path}")
    if not isinstance(cfg, dict):
        raise LzError(f"{path}: expected a JSON object with Hugging Face config keys")
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return cfg, name


def fp8_scheme(cfg: dict) -> tuple[str, tuple[str, ...]] | None:
    """(the weight scales' granularity, "per_channel" or "per_tensor"; the modules left unquantised)
    when the quantization_config is FP8 W8A8 with per-token dynamic activation scales, which
    linear.fp8 computes (fbgemm_fp8; compressed-tensors' float8 with channel or tensor weight
    scales); None for any other (block-wise FP8, static activation scales, integer formats)."""
    quant = cfg.get("quantization_config")
    if not isinstance(quant, dict):
        return None
    method = quant.get("quant_method")
    if method == "fbgemm_fp8":
        return "per_channel", tuple(quant.get("modules_to_not_convert") or ())
    groups = list((quant.get("config_groups") or {}).values()) if method == "compressed-tensors" else []
    if len(groups) != 1 or not isinstance(groups[0], dict):
        return None
    weights, acts = groups[0].get("weights") or {}, groups[0].get("input_activations") or {}
    if ((weights.get("type"), weights.get("num_bits"), acts.get("type"), acts.get("num_bits")) != ("float", 8, "float", 8)
            or not acts.get("dynamic") or acts.get("strategy") != "token"):
        return None
    granularity = {"channel": "per_channel", "tensor": "per_tensor"}.get(weights.get("strategy"))
    return (granularity, tuple(quant.get("ignore") or ())) if granularity else None


def refuse_unsupported(cfg: dict, where: str) -> None:
    """Parts no op computes, named from the config's keys (the text model's, for a multimodal one).
    A key set to 0, false or null is inert (dense checkpoints often carry them so)."""
    text = _text_keys(cfg, where)
    mla = text.get("model_type") in MLA_TYPES
    found = [f"{desc} ('{key}')" for key, desc in UNSUPPORTED_KEYS.items()
             if text.get(key) and not (mla and key in MLA_KEYS)]
    quant = text.get("quantization_config")
    if quant and fp8_scheme(text) is None:
        method = quant.get("quant_method") if isinstance(quant, dict) else None
        found.append(f"quantized weights ({method or 'unknown method'}): only FP8 W8A8 with per-channel or "
                     f"per-tensor weight scales and per-token dynamic activation scales (fbgemm_fp8, "
                     f"compressed-tensors float8) has ops")
    if found:
        raise LzError(f"{where}: not supported yet: {'; '.join(found)}")


def _text_keys(cfg: dict, where: str) -> dict:
    """The language model's keys: a vision-language config.json nests them under text_config,
    with top-level keys (tie_word_embeddings...) that the text_config may override."""
    inner = cfg.get("text_config") or {}
    if not isinstance(inner, dict):
        raise LzError(f"{where}: 'text_config' must be an object")
    outer = {k: v for k, v in cfg.items() if k not in ("text_config", "vision_config")}
    return {**outer, **inner}
