"""What serving an op costs the host beyond its math: a tiny model patched with ops locked to their own
fallbacks (the eager code transformers runs) against the unpatched model.

Each locked op takes the path a table's call takes (the patched module's forward, the dispatcher,
the fused residual add) with the same math as the module's own forward, so the difference is the
serving path alone. A served kernel must save more host time than this per call to pay off in a
host-bound model (issue 54: Gemma 3 with half its table, 0.96x on an H100, docs/benchmark-log.md §25).
States: unpatched; each op the model calls, locked alone; every op locked. A tiny random model of each
type (benchmarks/plan_survey.py's shrink), a prefill of --tokens, interleaved rounds, medians.

    python benchmarks/served_overhead.py [--types gemma3_text,llama] [--device cuda] [--autocast] [--json out.json]
"""
from __future__ import annotations

import argparse
import copy
import cProfile
import datetime as dt
import json
import logging
import pstats
import statistics
import sys
import warnings
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: unpatch()
sys.path.insert(0, str(Path(__file__).resolve().parent))

from checked_timing import interleaved  # noqa: E402
from fallback_cost import per_call_us  # noqa: E402
from plan_survey import tiny_config  # noqa: E402

from runtime_loader import Dispatcher, Policy  # noqa: E402
from runtime_loader.hardware import hardware_signature  # noqa: E402
from runtime_loader.integrations.transformers import observe, patch  # noqa: E402
from runtime_loader.ops import OPS  # noqa: E402
from tests.tables import unpatch  # noqa: E402


def python_calls(fn) -> int:
    profile = cProfile.Profile()
    profile.enable()
    fn()
    profile.disable()
    return pstats.Stats(profile).total_calls


def states(model) -> dict[str, dict | None]:
    """state -> the lock it patches with (None: unpatched): each op the model calls alone, then all."""
    calls, _ = observe(model)
    ops = sorted({sig.op for found in calls.values() for sig in found})
    return {"unpatched": None, **{op: {op: OPS[op].fallback} for op in ops},
            "every op": {op: OPS[op].fallback for op in ops}}


def measure(model_type: str, device: torch.device, tokens: int, calls: int, rounds: int, warm: int,
            autocast: bool = False) -> list[dict]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    torch.manual_seed(0)
    with torch.device(device):
        model = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])(tiny_config(model_type)).eval()
    model = model.to(torch.bfloat16 if device.type == "cuda" and not autocast else torch.float32)
    ids = torch.randint(1, 128, (1, tokens), device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    locks = states(model)

    copies = {name: copy.deepcopy(model) for name in locks}  # one each, alive throughout: alike in memory
    dispatchers = {name: Dispatcher(None, policy=Policy(lock=lock)) for name, lock in locks.items() if lock}

    def ready(name):
        """The forward of the state's copy. patch activates its Dispatcher and patches the modelling
        modules' functions process-wide, and unpatch() undoes both: so each state is set again
        before its calls (a second patch of a copy changes none of its modules)."""
        unpatch()
        if name in dispatchers:
            patch(copies[name], dispatchers[name])
        forward = lambda: copies[name](ids, use_cache=False, logits_to_keep=1)  # noqa: E731
        for _ in range(warm):  # patch()'s own host work slows the forwards right after it
            forward()
        return forward

    timings, counts = {name: [] for name in locks}, {}
    with torch.inference_mode(), torch.autocast(device.type, torch.bfloat16, enabled=autocast):
        for name in locks:
            counts[name] = python_calls(ready(name))
        for n in range(rounds):
            for name in interleaved(locks, n):
                timings[name].append(per_call_us(ready(name), calls, sync))
    unpatch()
    base, fastest = statistics.median(timings["unpatched"]), min(timings["unpatched"])
    # the fastest round too: on a shared host the noise only adds, and host work is what is measured
    return [{"model_type": model_type, "state": name, "us": round(statistics.median(t), 1),
             "x": round(base / statistics.median(t), 3), "x_fastest": round(fastest / min(t), 3),
             "spread": round((max(t) - min(t)) / statistics.median(t), 3), "python_calls": counts[name]}
            for name, t in timings.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default="gemma3_text,llama")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--calls", type=int, default=10, help="forwards per round")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--warm", type=int, default=10,
                        help="forwards after each state's patch before its timed ones: with 1, a state whose "
                             "patch changed no call ran 0.96-0.97 of the unpatched model (2026-12-06, CPU VM)")
    parser.add_argument("--autocast", action="store_true",
                        help="every state under torch.autocast(bf16), the model kept in fp32: where each patched "
                             "module hands its calls back to its own code, what that costs")
    parser.add_argument("--json")
    args = parser.parse_args()
    device = torch.device(args.device)
    logging.getLogger("runtime_loader").setLevel(logging.ERROR)  # the locks, announced per patch
    warnings.simplefilter("ignore")
    rows = [row for model_type in args.types.split(",")
            for row in measure(model_type, device, args.tokens, args.calls, args.rounds, args.warm, args.autocast)]
    print(f"{'type':<14} {'state':<20} {'us/forward':>11} {'x unpatched':>12} {'x fastest':>10} {'spread':>7} "
          f"{'py calls':>9}")
    for r in rows:
        print(f"{r['model_type']:<14} {r['state']:<20} {r['us']:>11.1f} {r['x']:>12.3f} {r['x_fastest']:>10.3f} "
              f"{r['spread']:>7.3f} {r['python_calls']:>9}")
    if args.json:
        Path(args.json).write_text(json.dumps({"date": dt.date.today().isoformat(), "hardware": hardware_signature(device),
                                               "tokens": args.tokens, "autocast": args.autocast, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
