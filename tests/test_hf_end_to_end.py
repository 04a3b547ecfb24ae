"""benchmarks/hf_end_to_end.py's timing of variants (BENCHMARKS' whole-model rows rest on it)."""

import torch

from .benchmark_scripts import load


def load_script():
    return load("hf_end_to_end")


def test_variants_interleave_and_none_always_follows_the_same_one():
    """Every rep times every variant once, and no variant always runs after the same one: after
    another's work a model can run slower than itself (a rotating order put the unpatched model
    after the compiled variants in every rep, benchmarks/runs/2026-12-06-i.txt)."""
    script = load_script()
    calls, setups = [], []
    variants = ["sdpa", "lzsolve", "lzsolve@none", "lzsolve@partial", "compile", "lzsolve_traced"]
    fns = {v: (lambda v=v: calls.append(v)) for v in variants}
    figures = script.timed_ms(fns, warmup=1, reps=8, device=torch.device("cpu"), before=setups.append)
    timed = calls[len(variants):]  # after the warm-up pass
    reps = [timed[i:i + len(variants)] for i in range(0, len(timed), len(variants))]
    assert len(reps) == 8 and all(sorted(rep) == sorted(variants) for rep in reps)
    assert setups == calls, "each call's setup runs right before it"
    for v in variants:
        assert len(figures[v]["samples"]) == 8
        before = {rep[rep.index(v) - 1] for rep in reps if rep.index(v) > 0}
        assert len(before) > 1, f"{v} ran after {before} in every rep"
