"""What runtime_loader.record() adds to a model's forward: a small Llama patched for recording
(patch(all_ops=True), no table: every call served by the ops' fallbacks or the modules' own code),
its forward timed outside a recording and inside one, in interleaved rounds (median per forward).
Small shapes, so the host sets the pace and the overhead shows; a server's forwards are longer.

    python benchmarks/record_overhead.py [--device cuda] [--rounds 20] [--calls 50] [--json out.json]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
import transformers

import runtime_loader
from runtime_loader import Dispatcher
from runtime_loader.integrations.transformers import patch, restore_functions

CONFIG = dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512)


def per_forward_ms(model, ids, calls: int, sync) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        model(ids, use_cache=False, logits_to_keep=1)
    sync()
    return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--calls", type=int, default=50, help="forwards per round")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).to(dtype).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        patch(model, Dispatcher(None), all_ops=True)
    ids = torch.randint(0, CONFIG["vocab_size"], (1, args.tokens), device=device)
    plain, recorded = [], []
    with torch.inference_mode(), tempfile.TemporaryDirectory() as tmp:
        per_forward_ms(model, ids, 5, sync)  # warm-up
        for n in range(args.rounds):
            plain.append(per_forward_ms(model, ids, args.calls, sync))
            with runtime_loader.record(Path(tmp) / f"round{n}.json") as recording:
                recorded.append(per_forward_ms(model, ids, args.calls, sync))
        calls = sum(recording.calls.values()) // args.calls
    restore_functions()
    ratio = statistics.median(r / p for r, p in zip(recorded, plain))
    print(f"device {device}, {args.tokens} tokens, {calls} dispatcher calls a forward, {args.rounds} rounds x "
          f"{args.calls} forwards: {statistics.median(plain):.3f} ms a forward, {statistics.median(recorded):.3f} ms "
          f"recording ({ratio:.3f}x, +{(statistics.median(recorded) - statistics.median(plain)) * 1e3 / calls:.2f} us "
          "a call)")
    if args.json:
        Path(args.json).write_text(json.dumps({"date": dt.date.today().isoformat(), "device": str(device),
                                               "plain_ms": plain, "recorded_ms": recorded, "ratio": ratio,
                                               "calls_per_forward": calls}, indent=1))


if __name__ == "__main__":
    main()
