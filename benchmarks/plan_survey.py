"""Every causal language model type of the installed transformers, planned from its default config:
which plan, which are refused (and why, grouped), and which crash (a traceback where a one-line
error belongs: a bug). A held-out check of capture: none of these types was written for.

--patch also checks the client side for every type, planned or not: a tiny random model of it (fp32,
its default config shrunk: TINY, OVERRIDES) is patched in each table state a user can be in, and must
compute what the unpatched model computed: logits (with and without left padding, the padded rows
compared where the mask keeps them) within 1e-5 and the same greedy tokens from generate(). The states:

  none       no table: patch must change nothing (module classes, forwards, functions, attention
             implementation) and replace nothing;
  fallbacks  every op locked to its fallback: each call takes the path a table's call takes (the
             fused residual add, the hand-backs), with the fallback's kernels;
  others     every op locked to another CPU kernel where the registry has one (torch's and eager's
             forms): the serving forwards with kernels that are not the module's own code;
  foreign    --foreign ARTIFACT: a CPU table tuned for another type's tiny model, whose signatures the
             tiny models of the same widths share: `--save-tiny DIR qwen3` writes DIR/qwen3/config.json,
             then `lzsolve tune --config DIR/qwen3 --device cpu --dtype fp32 --quick --out ARTIFACT`.

    python benchmarks/plan_survey.py [--patch [--foreign ARTIFACT]] [--json PATH] [MODEL_TYPE ...]
    python benchmarks/plan_survey.py --save-tiny DIR MODEL_TYPE ...

Exits 1 when any type crashed or a patched model disagreed. About 5 min on 2 cores with --patch.
"""
from __future__ import annotations

import argparse
import collections
import copy
import json
import logging
import re
import signal
import sys
import time
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: unpatch()

STATES = ("none", "fallbacks", "others", "foreign")
TIME_BOX_S = 120  # a type's checks; the slowest hybrid took 88 s on 2 cores


def survey(types: list[str], check_patch: bool, foreign: str | None) -> dict:
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from lzsolve.errors import LzError
    from lzsolve.models.capture import capture

    outcomes, patched = {}, {}
    for model_type in types or sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                cfg = AutoConfig.for_model(model_type).to_dict()
            except Exception as e:  # noqa: BLE001 - transformers has no default config for it
                outcomes[model_type] = ("no default config", f"{type(e).__name__}: {e}"[:200])
                continue
            try:
                captured = capture(cfg, model_type)
                outcomes[model_type] = ("plans", f"{len(captured.instances)} op signatures")
            except LzError as e:
                outcomes[model_type] = ("refused", str(e))
            except Exception as e:  # noqa: BLE001 - what this survey is for
                outcomes[model_type] = ("CRASHED", f"{type(e).__name__}: {e}"[:300])
        if check_patch:
            patched[model_type] = time_boxed(check_patched, model_type, foreign)
            print(f"  {model_type:<28} {patched[model_type][0]}", flush=True)
    return {"transformers": transformers.__version__, "outcomes": outcomes, "patched": patched}


def time_boxed(check, *args) -> tuple[str, str]:
    def expired(*_):
        raise TimeoutError(f"over {TIME_BOX_S} s")
    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(TIME_BOX_S)
    try:
        return check(*args)
    except TimeoutError as e:
        return "CRASHED", str(e)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# the default config's sizes, shrunk: a key's value by its meaning (transformers' names for it)
TINY = {
    64: ("hidden_size", "d_model", "n_embd", "n_embed", "hidden_dim", "embed_dim", "dim", "word_embed_proj_dim"),
    128: ("intermediate_size", "ffn_dim", "n_inner", "d_ff", "decoder_ffn_dim", "ffn_hidden_size", "inner_hidden_size",
          "dim_feedforward", "max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "vocab_size",
          "original_max_position_embeddings", "encoder_hash_byte_group_vocab", "local_attention_window_len"),
    2: ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "decoder_layers", "num_decoder_layers",
        "num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num", "num_experts_per_tok",
        "moe_topk", "num_experts_per_token", "top_k", "moe_k", "kv_n_heads", "moe_top_k", "linear_num_key_heads",
        "linear_num_value_heads"),
    4: ("num_attention_heads", "n_head", "n_heads", "decoder_attention_heads", "num_heads", "num_experts",
        "num_local_experts", "n_routed_experts", "moe_num_experts"),
    16: ("head_dim", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim", "linear_key_head_dim", "linear_value_head_dim",
         "qk_rope_head_dim", "attention_head_dim", "kv_channels"),
    32: ("q_lora_rank", "moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size",
         "moe_shared_expert_intermediate_size"),
    1: ("n_group", "topk_group", "n_shared_experts", "num_shared_experts", "first_k_dense_replace"),
    8: ("sliding_window", "rotary_dim"),
}
TINY_SIZE = {name: size for size, names in TINY.items() for name in names}
UNSET_BUT_SIZED = {"num_experts_per_tok", "n_group", "topk_group", "n_routed_experts", "n_shared_experts", "head_dim"}
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
OVERRIDES = {  # types whose sizes depend on each other in ways the generic shrink cannot know
    "jamba": dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1),
    "recurrent_gemma": dict(block_types=["recurrent", "attention"], lru_width=64),
    "mamba2": dict(head_dim=32, n_groups=1),
    "gemma3n_text": dict(intermediate_size=[128, 128], num_kv_shared_layers=0, vocab_size_per_layer_input=128,
                         hidden_size_per_layer_input=16, activation_sparsity_pattern=[0.0, 0.0]),
    "granitemoehybrid": dict(layer_types=["mamba", "attention"]),
    "zaya": dict(num_experts_per_tok=1),
    "qwen4_exp_text": dict(indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=4,
                           indexer_compress_ratio=4),
}


def two_layers(values: list) -> list:
    """A per-layer list for two layers, keeping two different kinds where the model had them."""
    kinds = list(dict.fromkeys(values))
    return kinds[:2] if len(kinds) >= 2 else [values[0], values[0]]


def shrunk(cfg: dict) -> dict:
    """The fields of a config's dict that TINY shrinks, its per-layer lists cut to two layers."""
    layers = next((cfg[k] for k in LAYER_KEYS if isinstance(cfg.get(k), int)), None)
    small = {}
    for key, value in cfg.items():
        if key in TINY_SIZE and (isinstance(value, int) and not isinstance(value, bool)
                                 or value is None and key in UNSET_BUT_SIZED):
            small[key] = TINY_SIZE[key]
        elif layers and layers > 2 and isinstance(value, list | str) and len(value) == layers:
            small[key] = two_layers(value) if isinstance(value, list) else "".join(two_layers(list(value)))
    return small


def tiny_config(model_type: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    default = config_class()
    cfg = default.to_dict()
    small = shrunk(cfg)
    for key in getattr(default, "sub_configs", None) or {}:  # nested configs (DBRX, BLT)
        sub = getattr(default, key, None)
        if hasattr(sub, "to_dict"):
            small[key] = {**sub.to_dict(), **shrunk(sub.to_dict())}
    for key, tiny_id in (("pad_token_id", 0), ("bos_token_id", 1), ("eos_token_id", 2), ("decoder_start_token_id", 1)):
        if isinstance(cfg.get(key), int) and cfg[key] >= TINY_SIZE["vocab_size"]:
            small[key] = tiny_id
        elif isinstance(cfg.get(key), list):
            small[key] = [i if i < TINY_SIZE["vocab_size"] else 2 for i in cfg[key]]
    if "kv_lora_rank" in cfg and "num_key_value_heads" in small:  # MLA: k and v have every head
        small["num_key_value_heads"] = 4
    if "attn_layer_indices" in cfg:  # hybrids: one attention layer of the two
        small["attn_layer_indices"] = [1]
    if "is_decoder" in cfg:
        small["is_decoder"] = True
    if isinstance(cfg.get("layer_types"), list) and "layer_types" not in small and len(cfg["layer_types"]) != 2:
        small["layer_types"] = two_layers(cfg["layer_types"])
    small.update(OVERRIDES.get(model_type, {}))
    return config_class(**small)


def state_dispatcher(state: str, foreign: str | None):
    """The Dispatcher a model is patched with in `state` (STATES); None where the state is not run."""
    import runtime_loader
    from runtime_loader import Dispatcher, Policy, registry
    from runtime_loader.ops import OPS

    if state == "none":
        return Dispatcher(None)
    if state == "foreign":
        return runtime_loader.load(foreign, strict=True) if foreign else None
    lock = {name: op.fallback for name, op in OPS.items()}
    if state == "others":  # compile.* is torch.compile of a fallback: slow to build, and the same code
        for name in lock:
            others = [spec for spec in registry.candidates(name) if spec.kernel_id != lock[name]
                      and "cpu" in spec.platforms and not spec.jit and not spec.installed(load=False)]
            if others:
                lock[name] = min(others, key=lambda spec: spec.kernel_id).kernel_id
    return Dispatcher(None, policy=Policy(lock=lock))


def check_patched(model_type: str, foreign: str | None) -> tuple[str, str]:
    """("patch agrees", the states run) when the patched tiny model computes what it did in every
    state; "tiny model not built" when transformers will not build or run the shrunk config."""
    import torch
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    ids = torch.randint(1, 128, (2, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # the second row left-padded

    gen = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
    runs = {"logits": lambda m: m(ids).logits.float(), "padded logits": lambda m: m(ids, attention_mask=mask).logits.float(),
            "tokens": lambda m: m.generate(ids, **gen), "padded tokens": lambda m: m.generate(ids, attention_mask=mask, **gen)}

    def outputs(model, names) -> dict:
        with torch.no_grad():
            return {name: runs[name](model) for name in names}

    try:
        torch.manual_seed(0)
        model = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])(tiny_config(model_type))
        model = model.float().eval()
        expected = outputs(model, ["logits"])
    except Exception as e:  # noqa: BLE001 - the shrink made a config transformers will not build or run
        return "tiny model not built", f"{type(e).__name__}: {e}"[:200]
    for name in list(runs)[1:]:  # what the unpatched tiny model cannot do (generate, padding) is not compared
        try:
            expected |= outputs(model, [name])
        except Exception:  # noqa: BLE001
            pass
    problems, run = [], []
    for state in STATES:
        try:
            problems += [f"{state}: {p}" for p in state_problems(state, model, expected, outputs, mask, foreign, run)]
        except Exception as e:  # noqa: BLE001 - what this survey is for
            return "CRASHED", f"{state}: " + "".join(traceback.format_exception(e)[-3:])[-400:]
    if problems:
        return "PATCH DISAGREES", "; ".join(problems)[:600]
    return "patch agrees", ", ".join(run)


def state_problems(state, model, expected, outputs, mask, foreign, run) -> list[str]:
    import torch

    from runtime_loader.integrations.transformers import patch
    from tests.tables import unpatch

    d = state_dispatcher(state, foreign)
    if d is None:
        return []
    patched = copy.deepcopy(model)
    before = as_it_is(patched)
    try:
        logging.getLogger("runtime_loader").setLevel(logging.ERROR)  # the locks, announced once per model
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = patch(patched, d)
            got = outputs(patched, expected)
    finally:
        unpatch()
    run.append(state)
    problems = []
    if state == "none" and (as_it_is(patched) != before or report.replaced):
        problems.append(f"changed the model with no table: {dict(report.replaced)}")
    for name, value in expected.items():
        if name.endswith("tokens"):
            if not torch.equal(got[name], value):
                problems.append(f"{name} differ")
            continue
        keep = mask.bool() if name.startswith("padded") else torch.ones(value.shape[:2], dtype=torch.bool)
        if got[name].shape != value.shape or not torch.allclose(got[name][keep], value[keep], rtol=1e-5, atol=1e-5):
            problems.append(f"{name} differ")
    return problems


def as_it_is(model) -> tuple:
    """What patch with no table must leave: each module's class and instance forward, the modelling
    modules' functions it may replace, the attention implementation."""
    from runtime_loader.integrations.modules import modelling_modules

    modules = {name: (type(m), m.__dict__.get("forward")) for name, m in model.named_modules()}
    functions = {(m.__name__, name): getattr(m, name) for m in modelling_modules(model) for name in dir(m)
                 if callable(getattr(m, name, None)) and not name.startswith("__")}
    return modules, functions, model.config._attn_implementation


BUGS = ("CRASHED", "PATCH DISAGREES")


def why(message: str) -> str:
    """A refusal's reason without the model's names and details, so that refusals group:
    'not supported yet: multi-head latent attention', 'cannot run <model> to capture its ops'."""
    reason = message.split(": ", 1)[-1]
    reason = re.sub(r"\b\w+(ForCausalLM|LMHeadModel)\b", "<model>", reason)
    reason = re.sub(r"(cannot build|model_type) \S+", r"\1 <type>", reason)
    return re.sub(r" \(.*|; lzsolve.*|; fix.*", "", reason)[:90]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--patch", action="store_true", help="also patch a tiny model of every type in each table state")
    parser.add_argument("--foreign", metavar="ARTIFACT", help="with --patch: a CPU table of other models, for that state")
    parser.add_argument("--json", help="write every outcome here")
    parser.add_argument("--save-tiny", metavar="DIR", help="only write the tiny configs of the types to DIR/<type>/")
    parser.add_argument("types", nargs="*", help="model types (default: every causal-LM type)")
    args = parser.parse_args()
    if args.save_tiny:
        for model_type in args.types:
            tiny_config(model_type).save_pretrained(Path(args.save_tiny) / model_type)
        return
    started = time.perf_counter()
    result = survey(args.types, args.patch, args.foreign)
    outcomes = result["outcomes"]
    status = collections.Counter(s for s, _ in outcomes.values())
    print(f"transformers {result['transformers']}: {len(outcomes)} causal-LM types in "
          f"{time.perf_counter() - started:.0f} s: " + ", ".join(f"{n} {s}" for s, n in status.most_common()))
    reasons = collections.Counter(why(m) for s, m in outcomes.values() if s == "refused")
    for reason, n in reasons.most_common():
        print(f"  refused {n:3d}: {reason}")
    patched = collections.Counter(s for s, _ in result["patched"].values())
    if args.patch:
        print("patched as tiny models, in the states " + ", ".join(STATES[:3] + (STATES[3:] if args.foreign else ()))
              + ": " + ", ".join(f"{n} {s}" for s, n in patched.most_common()))
    for model_type, (s, message) in [*outcomes.items(), *result["patched"].items()]:
        if s in BUGS:
            print(f"  {s} {model_type}: {message}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    sys.exit(1 if any(status[s] or patched[s] for s in BUGS) else 0)


if __name__ == "__main__":
    main()
