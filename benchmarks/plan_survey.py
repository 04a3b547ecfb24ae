"""Every causal language model type of the installed transformers, planned from its default config:
which plan, which are refused (and why, grouped), and which crash (a traceback where a one-line
error belongs: a bug). A held-out check of capture: none of these types was written for.

--patch also checks the client side for each type that plans: a tiny random model of it (its
config shrunk as tests/test_families.py shrinks the families'), patched with no table but every op
locked to its fallback (so each call takes the path a table's call takes: the fused residual add,
the delta rules, with the fallback's kernels), must give the unpatched model's logits; a patch
that raises or changes them is a bug in how patch() read a module.

    python benchmarks/plan_survey.py [--patch] [--json PATH] [MODEL_TYPE ...]

Exits 1 when any type crashed or a patched model disagreed.
"""
from __future__ import annotations

import argparse
import collections
import json
import logging
import re
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the families' shrink


def survey(types: list[str], check_patch: bool) -> dict:
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from lzsolve.errors import LzError
    from lzsolve.models.capture import capture

    outcomes = {}
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
            if check_patch and outcomes[model_type][0] == "plans":
                outcomes[model_type] = patched(cfg)
    return {"transformers": transformers.__version__, "outcomes": outcomes}


def patched(cfg: dict) -> tuple[str, str]:
    """("patch agrees", report) when a tiny model of cfg's type patched with no table gives its own
    logits; "tiny model not built" when transformers refuses the shrunk config (not lzsolve's doing)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from runtime_loader import Dispatcher, Policy
    from runtime_loader.integrations.transformers import patch
    from runtime_loader.ops import OPS
    from tests.tables import unpatch
    from tests.test_families import shrink

    try:
        config = AutoConfig.for_model(**shrink(cfg))
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).eval()
        ids = torch.randint(0, min(getattr(config.get_text_config(), "vocab_size", None) or 64, 200), (2, 11))
        with torch.no_grad():
            expected = model(ids).logits
    except Exception as e:  # noqa: BLE001 - the shrink made a config transformers will not build or run
        return "tiny model not built", f"{type(e).__name__}: {e}"[:200]
    try:
        logging.getLogger("runtime_loader").setLevel(logging.ERROR)  # the locks, announced once per model
        served = Dispatcher(None, policy=Policy(lock={name: op.fallback for name, op in OPS.items()}))
        report = patch(model, served)
        with torch.no_grad():
            error = (model(ids).logits - expected).abs().max().item()
    except Exception as e:  # noqa: BLE001 - what this survey is for
        return "CRASHED", f"patch: {type(e).__name__}: {e}"[:300]
    finally:
        unpatch()
    if error > 1e-4:
        return "PATCH DISAGREES", f"max abs error {error:.2e}; {report}".replace("\n", " | ")[:300]
    return "patch agrees", str(report).replace("\n", " | ")


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
    parser.add_argument("--patch", action="store_true", help="also patch a tiny model of each type that plans")
    parser.add_argument("--json", help="write every outcome here")
    parser.add_argument("types", nargs="*", help="model types (default: every causal-LM type)")
    args = parser.parse_args()
    started = time.perf_counter()
    result = survey(args.types, args.patch)
    outcomes = result["outcomes"]
    status = collections.Counter(s for s, _ in outcomes.values())
    print(f"transformers {result['transformers']}: {len(outcomes)} causal-LM types in "
          f"{time.perf_counter() - started:.0f} s: " + ", ".join(f"{n} {s}" for s, n in status.most_common()))
    reasons = collections.Counter(why(m) for s, m in outcomes.values() if s == "refused")
    for reason, n in reasons.most_common():
        print(f"  refused {n:3d}: {reason}")
    for model_type, (s, message) in outcomes.items():
        if s in BUGS:
            print(f"  {s} {model_type}: {message}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    sys.exit(1 if any(status[s] for s in BUGS) else 0)


if __name__ == "__main__":
    main()
