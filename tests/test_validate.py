"""Probes and validation in every tune: a kernel with an alignment cliff wins every bucket (all
powers of two) and loses elsewhere; the table must not send unaligned shapes to it."""
import dataclasses
import json

import pytest
from click.testing import CliRunner

from lzsolve.cli import cli
from lzsolve.decide import solve
from lzsolve.decide.validate import judge, summarize
from lzsolve.store.perfdb import PerfDB
from runtime_loader import registry
from runtime_loader.table import read_table

from .cliff_kernels import aligned
from .test_cli import tiny_llama_config

CLIFF = "cliff.rms_norm"
SLOWED_FALLBACK = 4


def tune(config, out, *extra):
    result = CliRunner().invoke(cli, ["tune", "--config", str(config), "--grid", "tiny", "--dtype", "fp32",
                                      "--device", "cpu", "--plugin", "tests.cliff_kernels", "--kernels", "cliff.*",
                                      "--no-isolate", "--out", str(out), "--json", *extra])
    assert result.exit_code == 0, result.output
    return {**json.loads(result.stdout), "stderr": result.stderr}


def norm_tree(out):
    table = read_table(out / "dispatch.json")
    (sig, tree), = [(s, t) for s, t in table.trees.items() if s.op == "norm.rms"]
    return sig, tree


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """Both tunes solve with the GPU's bars for leaving the fallback, and time a fallback made
    SLOWED_FALLBACK times slower: the cliff kernel's own lead where it is aligned (F.rms_norm against
    the eager fallback, 1.2-1.4x on this VM) is about the size of the bars CPU sets
    (solve.ONE_POINT_GAIN and DEVICE_SWITCH_GAIN, tested in test_solve) and of CI's noise (an
    aligned bucket once went to the fallback), and these tests are about the probes and
    validation finding the cliff, which stays PADDED_PASSES / SLOWED_FALLBACK times deep."""
    root = tmp_path_factory.mktemp("cliff")
    config = tiny_llama_config(root)
    fallback = registry.get("eager.rms_norm")

    def slowed(*args):
        for _ in range(SLOWED_FALLBACK - 1):
            fallback.impl(*args)
        return fallback.impl(*args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(solve, "ONE_POINT_GAIN", {})
        patch.setattr(solve, "DEVICE_SWITCH_GAIN", {})
        patch.setitem(registry.REGISTRY, fallback.kernel_id, dataclasses.replace(fallback, impl=slowed))
        return (config, tune(config, root / "naive", "--no-probe", "--validate", "0"), tune(config, root / "checked"),
                root)


def test_grid_alone_is_fooled_by_the_cliff(tuned):
    """The precondition: on the buckets alone the cliff kernel wins and takes unaligned shapes too."""
    from runtime_loader.table import choose
    _, naive, _, root = tuned
    sig, tree = norm_tree(root / "naive")
    assert {choose(tree, {"tokens": t}) for t in (1, 8)} == {CLIFF}
    assert choose(tree, {"tokens": 5}) == CLIFF
    # what they measured, not their phases' seconds (a phase that measured nothing took 0.1 s in CI)
    assert all(set(s["points_by_phase"]) <= {"grid"} for s in naive["signatures"]), naive["signatures"]


def test_validation_keeps_unaligned_shapes_off_the_cliff(tuned):
    """The cliff kernel leads the fallback by SLOWED_FALLBACK x at every bucket, past PROBE_CLEAR: no
    probe goes there (test_probes_go_where_the_race_is_close), and validation's random shapes find
    the cliff and refine the tree."""
    from runtime_loader.table import choose
    _, _, checked, root = tuned
    sig, tree = norm_tree(root / "checked")
    rows = PerfDB(root / "checked" / "perfdb").rows(
        "SELECT DISTINCT phase, tokens FROM records WHERE op = 'norm.rms' AND stage = 'bench'")
    phases = {r["phase"] for r in rows}
    assert phases == {"grid", "validation"}
    measured = {r["tokens"] for r in rows}
    assert any(not aligned(t) for t in measured), "validation's shapes: unaligned ones among them"
    for tokens in measured:
        assert (choose(tree, {"tokens": tokens}) == CLIFF) <= aligned(tokens), tokens
    assert choose(tree, {"tokens": 8}) == CLIFF, "the gain where it is real is kept"
    entry, = [s for s in checked["signatures"] if s["signature"] == str(sig)]
    before, after = entry["validation"]["before"], entry["validation"]["after"]
    assert before["vs_default_worst"] > 2, "after the probes, validation still caught the cliff between them"
    assert after["vs_default_worst"] < 1.1 and entry["validation"]["refined"]
    assert entry["validation"]["near_shapes"] > 0, "the losses got a second round of shapes around them"
    validating = [line for line in checked["stderr"].splitlines() if line.startswith("validating")]
    assert "(100%) in" in validating[-1], "the progress total grew by the second round's measurements"
    assert "probe" not in entry["points_by_phase"] and entry["points_by_phase"]["validation"] >= 4
    report = (root / "checked" / "report.md").read_text()
    assert "validation, 8 random shapes" in report and "the tree was refined" in report
    # signatures with nothing to choose (their fallback alone) are neither probed nor validated
    assert all(s["validation"] is None for s in checked["signatures"] if s["signature"] != str(sig))


def test_probes_go_where_the_race_is_close():
    """Probe points where a second kernel is within PROBE_CLEAR of the best at a bucket around
    them; none where one kernel leads every other, the fallback too, by more than that. The
    contenders there: the kernels within LEAD_MARGIN, and the fallback."""
    import torch

    from lzsolve.measure.tuner import PROBE_CLEAR, make_plan, plan_probes
    from lzsolve.models.capture import capture
    from lzsolve.store.perfdb import dims_key

    from .test_cli import TINY_LLAMA
    plan = make_plan(capture(TINY_LLAMA, "tiny", dtype="fp32"), "fp32", torch.device("cpu"), "tiny",
                     only=("torch.rms_norm",))
    sp, = [sp for sp in plan.signatures if sp.instance.signature.op == "norm.rms"]
    other, = [c.spec.kernel_id for c in sp.candidates if c.admitted and c.spec.kernel_id != sp.fallback]

    def probes(ratio: float) -> list:
        """The probe work when `other` takes `ratio` x the fallback's time at every bucket."""
        records = [{"signature": str(sp.instance.signature), "kernel_id": kernel, "dims": dims_key(dims),
                    "status": "ok", "eager_ms": ms, "eager_spread": 0.01, "device": "cpu"}
                   for dims in sp.workloads for kernel, ms in ((sp.fallback, 1.0), (other, ratio))]
        return [work for s, work in plan_probes(plan, records, "eager") if s is sp]

    close, = probes(1 / (1 + PROBE_CLEAR / 2))  # ahead, within the margin: a race to check off the grid
    assert close and all({c.spec.kernel_id for c in candidates} == {sp.fallback, other} for _, candidates in close)
    assert probes(1 / (1 + 2 * PROBE_CLEAR)) == [], "a clear lead: nothing an alignment cliff short of it changes"
    assert probes(1 + 2 * PROBE_CLEAR) == [], "far behind the fallback: likewise"


def test_evaluate_random_shapes_on_the_checked_table(tuned):
    """Held-out random shapes (another seed): the refined table stays off the cliff."""
    _, _, _, root = tuned
    out = root / "checked"
    result = CliRunner().invoke(cli, ["evaluate", str(out), "--random", "6", "--seed", "3", "--op", "norm.rms",
                                      "--plugin", "tests.cliff_kernels", "--no-isolate",
                                      "--json", str(root / "eval.json")])
    assert result.exit_code == 0, result.output
    summary = json.loads((root / "eval.json").read_text())
    assert summary["random"] == 6 and summary["overall"]["points"] == 6
    assert {p["signature"].split("[")[0] for p in summary["points"]} == {"norm.rms"}
    assert summary["overall"]["vs_default_worst"] < 2
    assert any(not aligned(p["dims"]["tokens"]) for p in summary["points"])


def test_evaluate_says_why_the_fallback_has_no_time():
    sig = "attention.prefill[hq=8,hkv=1,d=128,causal,bf16]"
    recs = [{"kernel_id": "fa3.attention", "status": "ok", "graph_ms": 1.0, "reason_code": None},
            {"kernel_id": "sdpa.default", "status": "rejected", "graph_ms": None, "reason_code": "OOM",
             "reason_message": "CUDA out of memory"}]
    r = judge(sig, {"batch": 13, "seq": 12289}, "fa3.attention", "sdpa.default", recs, "graph")
    assert r.regret == 1.0 and r.vs_default is None
    assert r.fallback_problem == "sdpa.default failed here: OOM: CUDA out of memory"
    summary = summarize([r])
    assert summary["fallback_problems"] == [f"{sig} at {{'batch': 13, 'seq': 12289}}: {r.fallback_problem}"]
    assert summary["points"][0]["fallback_problem"] == r.fallback_problem
