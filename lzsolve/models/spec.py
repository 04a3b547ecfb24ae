"""ModelSpec: the dims that decide which ops a model runs and at what shapes.

Every model, built-in or not, enters through `from_hf_config`, so the catalogue
and `--config PATH` share one parser and one set of error messages.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import LzError
from .catalogue import CATALOGUE

# model_types whose blocks are the Llama block (RMSNorm, RoPE split-half, SwiGLU, GQA).
LLAMA_LIKE = ("llama", "mistral")


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
    rope_theta: float
    rms_eps: float
    tie_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    config_hash: str
    tp: int = 1

    def summary(self) -> str:
        return (f"{self.name}: {self.family}, {self.layers} layers, hidden {self.hidden}, "
                f"heads {self.heads}/{self.kv_heads} kv, head_dim {self.head_dim}, "
                f"mlp {self.intermediate}, vocab {self.vocab}")


def _int(cfg: dict, key: str, where: str, default=None) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise LzError(f"{where}: '{key}' must be a positive integer, got {value!r}; fix the config")
    return value


def _float(cfg: dict, key: str, where: str, default=None) -> float:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise LzError(f"{where}: '{key}' must be a positive number, got {value!r}; fix the config")
    return float(value)


def from_hf_config(cfg: dict, name: str, where: str | None = None) -> ModelSpec:
    """Parse a Hugging Face config.json dict; `where` names the source in errors."""
    where = where or name
    if not isinstance(cfg, dict):
        raise LzError(f"{where}: expected a JSON object with Hugging Face config keys")
    model_type = cfg.get("model_type")
    if model_type not in LLAMA_LIKE:
        raise LzError(f"{where}: model_type {model_type!r} is not supported yet; supported: {', '.join(LLAMA_LIKE)}")
    hidden = _int(cfg, "hidden_size", where)
    heads = _int(cfg, "num_attention_heads", where)
    kv_heads = _int(cfg, "num_key_value_heads", where, default=heads)
    if heads % kv_heads:
        raise LzError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    head_dim = cfg.get("head_dim") or (hidden // heads if hidden % heads == 0 else None)
    if head_dim is None:
        raise LzError(f"{where}: hidden_size {hidden} is not divisible by num_attention_heads {heads}; set 'head_dim'")
    blob = json.dumps(cfg, sort_keys=True, default=str).encode()
    return ModelSpec(
        name=name,
        family=model_type,
        hidden=hidden,
        layers=_int(cfg, "num_hidden_layers", where),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=_int({"head_dim": head_dim}, "head_dim", where),
        intermediate=_int(cfg, "intermediate_size", where),
        vocab=_int(cfg, "vocab_size", where),
        rope_theta=_float(cfg, "rope_theta", where, default=10000.0),
        rms_eps=_float(cfg, "rms_norm_eps", where, default=1e-6),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", False)),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        config_hash=hashlib.sha256(blob).hexdigest()[:16],
    )


def from_catalogue(name: str) -> ModelSpec:
    if name not in CATALOGUE:
        raise LzError(f"unknown model {name!r}; known: {', '.join(CATALOGUE)} (or pass --config PATH)")
    return from_hf_config(CATALOGUE[name], name)


def from_config_file(path: str | Path) -> ModelSpec:
    path = Path(path)
    try:
        cfg = json.loads(path.read_text())
    except OSError as e:
        raise LzError(f"cannot read config {path}: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LzError(f"{path} is not valid JSON ({e}); pass a Hugging Face config.json") from None
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return from_hf_config(cfg, name, where=str(path))


def shard(spec: ModelSpec, tp: int) -> ModelSpec:
    """The per-rank model under tensor parallelism of degree `tp`: heads and the MLP
    are split across ranks; kv heads are split too, or replicated once tp exceeds
    them (never below 1 per rank); the vocab is split with padding (lm_head)."""
    if tp < 1:
        raise LzError(f"--tp must be >= 1, got {tp}")
    problems = []
    if spec.heads % tp:
        problems.append(f"{spec.heads} attention heads")
    if spec.kv_heads % tp and tp % spec.kv_heads:
        problems.append(f"{spec.kv_heads} kv heads (neither divides the other)")
    if spec.intermediate % tp:
        problems.append(f"intermediate size {spec.intermediate}")
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
    )
