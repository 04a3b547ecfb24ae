"""Every causal language model type of the installed transformers, planned from its default config:
which plan, which are refused (and why, grouped), and which crash (a traceback where a one-line
error belongs: a bug). A held-out check of capture: none of these types was written for.

    python benchmarks/plan_survey.py [--json PATH]

Exits 1 when any type crashed.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import time
import warnings


def survey() -> dict:
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from lzsolve.errors import LzError
    from lzsolve.models.capture import capture

    outcomes = {}
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
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
    return {"transformers": transformers.__version__, "outcomes": outcomes}


def why(message: str) -> str:
    """A refusal's reason without the model's names and details, so that refusals group:
    'not supported yet: multi-head latent attention', 'cannot run <model> to capture its ops'."""
    reason = message.split(": ", 1)[-1]
    reason = re.sub(r"\b\w+(ForCausalLM|LMHeadModel)\b", "<model>", reason)
    reason = re.sub(r"(cannot build|model_type) \S+", r"\1 <type>", reason)
    return re.sub(r" \(.*|; lzsolve.*|; fix.*", "", reason)[:90]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write every outcome here")
    args = parser.parse_args()
    started = time.perf_counter()
    result = survey()
    outcomes = result["outcomes"]
    status = collections.Counter(s for s, _ in outcomes.values())
    print(f"transformers {result['transformers']}: {len(outcomes)} causal-LM types in "
          f"{time.perf_counter() - started:.0f} s: " + ", ".join(f"{n} {s}" for s, n in status.most_common()))
    reasons = collections.Counter(why(m) for s, m in outcomes.values() if s == "refused")
    for reason, n in reasons.most_common():
        print(f"  refused {n:3d}: {reason}")
    for model_type, (s, message) in outcomes.items():
        if s == "CRASHED":
            print(f"  CRASHED {model_type}: {message}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    sys.exit(1 if status["CRASHED"] else 0)


if __name__ == "__main__":
    main()
