"""ModelSpec: the dims and block structure that decide which ops a model runs and at what shapes.

Every model, built-in or not, enters through `from_hf_config`, so the catalogue and
`--config PATH` share one parser and one set of error messages. The parser reads each
family's own config keys the way its transformers config class does (including the
defaults that class fills in), and refuses, naming them, the parts no op here computes
(mixture-of-experts routing, latent attention...) rather than tuning a model it would
describe wrongly.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from runtime_loader.safeio import shown

from ..errors import LzError
from ..limits import MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH, read_json_input
from .catalogue import CATALOGUE

FULL, SLIDING, LINEAR = "full_attention", "sliding_attention", "linear_attention"


@dataclass(frozen=True)
class Block:
    """How a family's decoder layer computes: fixed by the architecture, not by config values."""
    norm: str  # the norm op: "norm.rms", or "norm.layer" (GPT-2)
    unit_offset: bool = False  # RMSNorm scales by (1 + weight): Gemma3, Qwen3.5
    sandwich_norms: bool = False  # attention and MLP outputs are normed too before the residual add: Gemma3
    qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE: Qwen3, Qwen3.5, Gemma3
    learned_positions: bool = False  # a learned position table is added to the embeddings (GPT-2), no RoPE
    gated_mlp: bool = True  # down(act(gate) * up); False: fc -> act -> proj (GPT-2)
    output_gate: bool = False  # attention output * sigmoid(gate), the gate coming out of q_proj: Qwen3.5
    scaled_embedding: bool = False  # embeddings * sqrt(hidden): Gemma3


@dataclass(frozen=True)
class GatedDeltaNet:
    """Qwen3.5's linear-attention layers (per rank once sharded)."""
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv_kernel: int  # the short causal conv1d over q, k and v


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    block: Block
    layer_types: tuple[str, ...]  # per layer: full_attention, sliding_attention or linear_attention
    window: int  # sliding_attention layers' window (0: none)
    attn_softcap: float  # attention score softcap (0: none)
    logit_softcap: float  # final logits softcap (0: none)
    # RoPE (all 0 with learned positions): rotated dims per head (< head_dim with partial RoPE),
    # theta, and the sliding layers' theta (Gemma3 rotates them with a smaller base)
    rotary_dim: int
    rope_theta: float
    rope_local_theta: float
    norm_eps: float
    act: str  # the MLP activation op
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    tie_embeddings: bool
    linear_attn: GatedDeltaNet | None
    not_walked: tuple[str, ...]  # parts of the checkpoint outside the text forward pass (vision tower...)
    config_hash: str
    tp: int = 1

    def summary(self) -> str:
        kinds = Counter(self.layer_types)
        mix = "" if set(kinds) == {FULL} else " (" + ", ".join(f"{n} {k}" for k, n in kinds.items()) + ")"
        window = f", window {self.window}" if self.window else ""
        return (f"{self.name}: {self.family}, {self.layers} layers{mix}, hidden {self.hidden}, "
                f"heads {self.heads}/{self.kv_heads} kv, head_dim {self.head_dim}{window}, "
                f"mlp {self.intermediate}, vocab {self.vocab}")


def _all_full(cfg: dict, layers: int, where: str) -> tuple[str, ...]:
    return (FULL,) * layers


def _every_nth_full(key: str, other: str):
    """Layers of type `other`, every cfg[key]-th one full attention (Gemma 3's sliding pattern,
    Qwen3.5's full_attention_interval)."""
    def rule(cfg: dict, layers: int, where: str) -> tuple[str, ...]:
        every = _int(cfg[key], key, where)
        return tuple(FULL if (i + 1) % every == 0 else other for i in range(layers))
    return rule


def _window_from_max_window_layers(cfg: dict, layers: int, where: str) -> tuple[str, ...]:
    """Qwen2/Qwen3: with use_sliding_window, the layers from max_window_layers on slide."""
    if not (cfg.get("use_sliding_window") and cfg.get("sliding_window")):
        return _all_full(cfg, layers, where)
    first = _int(cfg["max_window_layers"], "max_window_layers", where)
    return tuple(SLIDING if i >= first else FULL for i in range(layers))


def _window_everywhere(cfg: dict, layers: int, where: str) -> tuple[str, ...]:
    """Mistral: every layer slides, unless the config sets the window to null."""
    return ((SLIDING if cfg.get("sliding_window") else FULL),) * layers


@dataclass(frozen=True)
class Family:
    block: Block
    # transformers' defaults for the keys a config.json of this family may leave out
    defaults: dict = field(default_factory=dict)
    # a key's Llama-family name -> this family's name for it (GPT-2's n_embd...)
    keys: dict = field(default_factory=dict)
    layer_kinds: tuple[str, ...] = (FULL,)  # layer types its blocks can be
    # (config, layers, where) -> each layer's type, for configs that do not list layer_types: the
    # rule the family's transformers config class applies
    layer_rule: Callable[[dict, int, str], tuple[str, ...]] = _all_full
    mlp_ratio: int = 0  # intermediate size = mlp_ratio * hidden when the config leaves it null (GPT-2's n_inner)
    qkv_bias: bool | None = None  # fixed by the architecture; None: the config's attention_bias
    o_bias: bool | None = None
    mlp_bias: bool | None = None  # None: the config's mlp_bias


RMS = Block("norm.rms")
LLAMA_DEFAULTS = {"hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0}
QWEN_DEFAULTS = {"hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "use_sliding_window": False,
                 "sliding_window": 4096, "max_window_layers": 28}
GEMMA3 = Family(
    Block("norm.rms", unit_offset=True, sandwich_norms=True, qk_norm=True, scaled_embedding=True),
    # gemma-3-4b-it's text_config gives only hidden, intermediate, layers and window: the rest is these
    {"hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
     "sliding_window": 4096, "sliding_window_pattern": 6, "num_attention_heads": 8, "num_key_value_heads": 4,
     "head_dim": 256, "vocab_size": 262208, "tie_word_embeddings": True},
    {"hidden_act": "hidden_activation"}, layer_kinds=(FULL, SLIDING),
    layer_rule=_every_nth_full("sliding_window_pattern", SLIDING))
QWEN3_5 = Family(
    Block("norm.rms", unit_offset=True, qk_norm=True, output_gate=True),
    {"hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
     "head_dim": 256, "full_attention_interval": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
     "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32},
    layer_kinds=(FULL, LINEAR), layer_rule=_every_nth_full("full_attention_interval", LINEAR))

FAMILIES: dict[str, tuple[str, Family]] = {  # model_type -> (family, how its config reads)
    "gpt2": ("gpt2", Family(
        Block("norm.layer", learned_positions=True, gated_mlp=False),
        {"activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True},
        {"hidden_size": "n_embd", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head",
         "intermediate_size": "n_inner", "hidden_act": "activation_function", "rms_norm_eps": "layer_norm_epsilon",
         "num_key_value_heads": "n_head"},  # multi-head attention: as many kv heads as heads
        mlp_ratio=4, qkv_bias=True, o_bias=True, mlp_bias=True)),
    "llama": ("llama", Family(RMS, LLAMA_DEFAULTS)),
    # the Llama block, with a sliding window on every layer unless the config sets it to null
    "mistral": ("llama", Family(RMS, {**LLAMA_DEFAULTS, "sliding_window": 4096}, layer_kinds=(FULL, SLIDING),
                                layer_rule=_window_everywhere)),
    "qwen2": ("qwen2", Family(RMS, QWEN_DEFAULTS, layer_kinds=(FULL, SLIDING), qkv_bias=True, o_bias=False,
                              layer_rule=_window_from_max_window_layers)),
    "qwen3": ("qwen3", Family(Block("norm.rms", qk_norm=True), {**QWEN_DEFAULTS, "head_dim": 128},
                              layer_kinds=(FULL, SLIDING), layer_rule=_window_from_max_window_layers)),
    "qwen3_5": ("qwen3_5", QWEN3_5),
    "qwen3_5_text": ("qwen3_5", QWEN3_5),
    "gemma3": ("gemma3", GEMMA3),
    "gemma3_text": ("gemma3", GEMMA3),
}

# MLP activations as their transformers names -> the op computing them (gelu_new is the tanh form)
GATED_ACTS = {"silu": "act.swiglu", "swish": "act.swiglu", "gelu_pytorch_tanh": "act.geglu", "gelu_new": "act.geglu"}
PLAIN_ACTS = {"gelu_new": "act.gelu", "gelu_pytorch_tanh": "act.gelu"}

# Config keys of mixture-of-experts models: captured from transformers' modules (moe.experts),
# refused by this parser, whose blocks describe dense MLPs
MOE_KEYS = {key: "mixture-of-experts routing" for key in ("num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok")}
# Config keys that mean the model computes something no op here does: refused by name
UNSUPPORTED_KEYS = {
    "kv_lora_rank": "multi-head latent attention (MLA)",
    "q_lora_rank": "multi-head latent attention (MLA)",
    "add_cross_attention": "cross-attention",
    "use_bidirectional_attention": "bidirectional (non-causal) attention",
    "quantization_config": "quantized weights (the linear ops tuned here are floating-point GEMMs)",
}


def _int(value, key: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise LzError(f"{where}: '{key}' must be a positive integer, got {shown(value)}; fix the config")
    return value


def _float(value, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise LzError(f"{where}: '{key}' must be a positive number, got {shown(value)}; fix the config")
    return float(value)


def _text_config(cfg: dict, where: str) -> dict:
    """The language model's keys: a vision-language config.json nests them under text_config,
    with top-level keys (tie_word_embeddings...) that the text_config may override."""
    inner = cfg.get("text_config") or {}
    if not isinstance(inner, dict):
        raise LzError(f"{where}: 'text_config' must be an object")
    outer = {k: v for k, v in cfg.items() if k not in ("text_config", "vision_config")}
    return {**outer, **inner}


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


def _unsupported_parts(cfg: dict, fp8: bool = False) -> list[str]:
    """fp8: FP8 W8A8 checkpoints are supported (capture tunes their linears as linear.fp8)."""
    parts = [f"{desc} ('{key}')" for key, desc in UNSUPPORTED_KEYS.items()
             if cfg.get(key) and not (key == "quantization_config" and fp8)]
    if fp8 and cfg.get("quantization_config") and fp8_scheme(cfg) is None:
        method = (cfg["quantization_config"] or {}).get("quant_method") if isinstance(
            cfg["quantization_config"], dict) else None
        parts.append(f"quantized weights ({method or 'unknown method'}): only FP8 W8A8 with per-channel or "
                     f"per-tensor weight scales and per-token dynamic activation scales (fbgemm_fp8, "
                     f"compressed-tensors float8) has ops")
    return parts


def _refuse_unsupported(cfg: dict, model_type, where: str) -> None:
    found = _unsupported_parts(cfg) + [f"{desc} ('{key}')" for key, desc in MOE_KEYS.items() if cfg.get(key)]
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        found.insert(0, f"model_type {shown(model_type)}")
    if found:
        raise LzError(f"{where}: not supported yet: {'; '.join(found)}; supported: dense decoders with "
                      f"model_type {', '.join(FAMILIES)}")


def _layer_types(cfg: dict, family: str, fam: Family, layers: int, where: str) -> tuple[str, ...]:
    """Each layer's type: listed by newer config.json files, otherwise by the family's rule."""
    listed = cfg.get("layer_types")
    if listed is not None:
        if not isinstance(listed, (list, tuple)) or len(listed) != layers:
            raise LzError(f"{where}: 'layer_types' must list the type of each of the {layers} layers")
        types = tuple(listed)
    else:
        types = fam.layer_rule(cfg, layers, where)
    unknown = sorted(set(map(str, types)) - set(fam.layer_kinds))
    if unknown:
        raise LzError(f"{where}: layer type {', '.join(map(shown, unknown[:5]))} is not supported for {family}; "
                      f"supported: {', '.join(fam.layer_kinds)}")
    return types


def _rope(cfg: dict, head_dim: int, where: str) -> tuple[int, float, float]:
    """(rotary dims, theta, sliding layers' theta), from transformers 5's rope_parameters
    (one dict, or one per layer type) or the older top-level rope_theta keys."""
    params = cfg.get("rope_parameters") or {}
    full, local = (params.get(FULL, params), params.get(SLIDING, {})) if isinstance(params, dict) else (None, None)
    if not (isinstance(full, dict) and isinstance(local, dict)):
        raise LzError(f"{where}: 'rope_parameters' must be an object (or one per layer type)")
    theta = _float(full.get("rope_theta", cfg.get("rope_theta")), "rope_theta", where)
    local_theta = _float(local.get("rope_theta", cfg.get("rope_local_base_freq", theta)), "rope_theta", where)
    factor = full.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    rotary_dim = int(head_dim * factor) if isinstance(factor, (int, float)) else 0
    if not (0 < rotary_dim <= head_dim and rotary_dim % 2 == 0):
        raise LzError(f"{where}: 'partial_rotary_factor' {shown(factor)} must rotate an even number of the "
                      f"{head_dim} dims per head")
    return rotary_dim, theta, local_theta


def _not_walked(cfg: dict, text: dict) -> tuple[str, ...]:
    notes = []
    if cfg.get("vision_config"):
        notes.append("vision_config: the vision tower (only the text model is walked)")
    if text.get("mtp_num_hidden_layers"):
        notes.append(f"mtp_num_hidden_layers={text['mtp_num_hidden_layers']}: multi-token-prediction layers "
                     f"(they run only for speculative decoding)")
    return tuple(notes)


def from_hf_config(cfg: dict, name: str, where: str | None = None) -> ModelSpec:
    """Parse a Hugging Face config.json dict; `where` names the source in errors."""
    where = where or name
    if not isinstance(cfg, dict):
        raise LzError(f"{where}: expected a JSON object with Hugging Face config keys")
    text = _text_config(cfg, where)
    model_type = text.get("model_type")
    _refuse_unsupported(text, model_type, where)
    family, fam = FAMILIES[model_type]
    raw = {**fam.defaults, **text}

    def read(key: str, parse=_int, default=None):
        """The value this family's config holds for `key` (under its own name), checked by `parse`."""
        own = fam.keys.get(key, key)
        value = raw.get(own)
        return parse(default if value is None else value, own, where)

    hidden, heads, layers = read("hidden_size"), read("num_attention_heads"), read("num_hidden_layers")
    kv_heads = read("num_key_value_heads", default=heads)
    if heads % kv_heads:
        raise LzError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    if raw.get("head_dim") is None and hidden % heads:
        raise LzError(f"{where}: hidden_size {hidden} is not divisible by num_attention_heads {heads}; set 'head_dim'")
    head_dim = read("head_dim", default=hidden // heads)
    layer_types = _layer_types(raw, family, fam, layers, where)
    acts = GATED_ACTS if fam.block.gated_mlp else PLAIN_ACTS
    act_key = fam.keys.get("hidden_act", "hidden_act")
    if not isinstance(raw.get(act_key), str) or raw[act_key] not in acts:
        raise LzError(f"{where}: '{act_key}' {shown(raw.get(act_key))} is not supported for {family}; "
                      f"supported: {', '.join(acts)}")
    rotary_dim, theta, local_theta = (0, 0.0, 0.0) if fam.block.learned_positions else _rope(raw, head_dim, where)
    linear_attn = None
    if LINEAR in layer_types:
        linear_attn = GatedDeltaNet(*(read(f"linear_{k}") for k in ("num_key_heads", "num_value_heads",
                                                                      "key_head_dim", "value_head_dim",
                                                                      "conv_kernel_dim")))
        if linear_attn.value_heads % linear_attn.key_heads:
            raise LzError(f"{where}: linear_num_value_heads {linear_attn.value_heads} is not a multiple of "
                          f"linear_num_key_heads {linear_attn.key_heads}")
    softcap = {key: read(key, _float) if raw.get(key) else 0.0
               for key in ("attn_logit_softcapping", "final_logit_softcapping")}  # null or 0: none
    attention_bias = bool(raw.get("attention_bias", False))
    blob = json.dumps(cfg, sort_keys=True, default=str).encode()
    return ModelSpec(
        name=name,
        family=family,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        # GPT-2 leaves n_inner null for 4 * n_embd
        intermediate=read("intermediate_size", default=fam.mlp_ratio * hidden or None),
        vocab=read("vocab_size"),
        block=fam.block,
        layer_types=layer_types,
        window=read("sliding_window") if SLIDING in layer_types else 0,
        attn_softcap=softcap["attn_logit_softcapping"],
        logit_softcap=softcap["final_logit_softcapping"],
        rotary_dim=rotary_dim,
        rope_theta=theta,
        rope_local_theta=local_theta,
        norm_eps=read("rms_norm_eps", _float),
        act=acts[raw[act_key]],
        qkv_bias=attention_bias if fam.qkv_bias is None else fam.qkv_bias,
        o_bias=attention_bias if fam.o_bias is None else fam.o_bias,
        mlp_bias=bool(raw.get("mlp_bias", False)) if fam.mlp_bias is None else fam.mlp_bias,
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        linear_attn=linear_attn,
        not_walked=_not_walked(cfg, text),
        config_hash=hashlib.sha256(blob).hexdigest()[:16],
    )


def from_catalogue(name: str) -> ModelSpec:
    if name not in CATALOGUE:
        raise LzError(f"unknown model {name!r}; known: {', '.join(CATALOGUE)} (or pass --config PATH)")
    return from_hf_config(CATALOGUE[name], name)


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


def from_config_file(path: str | Path) -> ModelSpec:
    cfg, name = read_config(path)
    return from_hf_config(cfg, name, where=str(path))


def refuse_unsupported(cfg: dict, where: str) -> None:
    """Parts no op computes, named from the config's keys (the text model's, for a multimodal one)."""
    found = _unsupported_parts(_text_config(cfg, where), fp8=True)
    if found:
        raise LzError(f"{where}: not supported yet: {'; '.join(found)}")


def shard(spec: ModelSpec, tp: int) -> ModelSpec:
    """The per-rank model under tensor parallelism of degree `tp`: heads (linear-attention
    heads too) and the MLP are split across ranks; kv heads are split too, or replicated once
    tp exceeds them (never below 1 per rank); the vocab is split with padding (embedding, lm_head)."""
    if tp < 1:
        raise LzError(f"--tp must be >= 1, got {tp}")
    problems = []
    if spec.heads % tp:
        problems.append(f"{spec.heads} attention heads")
    if spec.kv_heads % tp and tp % spec.kv_heads:
        problems.append(f"{spec.kv_heads} kv heads (neither divides the other)")
    if spec.intermediate % tp:
        problems.append(f"intermediate size {spec.intermediate}")
    gdn = spec.linear_attn
    if gdn and (gdn.key_heads % tp or gdn.value_heads % tp):
        problems.append(f"{gdn.key_heads}/{gdn.value_heads} linear-attention key/value heads")
    if problems:
        raise LzError(f"--tp {tp} cannot shard {spec.name}: it does not divide {', '.join(problems)}; "
                      f"use a tp that divides {spec.heads}")
    return replace(
        spec,
        tp=tp,
        heads=spec.heads // tp,
        kv_heads=max(1, spec.kv_heads // tp),
        intermediate=spec.intermediate // tp,
        vocab=-(-spec.vocab // tp),
        linear_attn=gdn and replace(gdn, key_heads=gdn.key_heads // tp, value_heads=gdn.value_heads // tp),
    )
