"""benchmarks/tune_agreement.py's comparison of two tuning runs (benchmark log §15.7-15.8 read it):
two runs' dispatch tables, point by point, and what a differing choice costs in each run."""
import datetime as dt
import json
import shutil
from pathlib import Path

from lzsolve.decide.solve import pick
from lzsolve.store.perfdb import PerfDB

from .benchmark_scripts import load


def load_script():
    return load("tune_agreement")


def evaluated_copy(artifact: Path, folder: Path) -> Path:
    """A copy of the artifact with a later run of `lzsolve evaluate` in its PerfDB, as the shared
    artifact gets when test_evaluate runs first: one grid record again, under a run of its own."""
    copy = folder / "artifact"
    shutil.copytree(artifact, copy)
    db = PerfDB(copy / "perfdb")
    record = db.rows("SELECT * FROM records WHERE phase = 'grid' ORDER BY ts DESC LIMIT 1")[0]
    record.update(run_id="evaluation-run", phase="evaluate", ts=record["ts"] + dt.timedelta(minutes=1))
    db.append([record], "evaluation-run")
    return copy


def test_a_table_agrees_with_itself(tiny_llama_artifact, tmp_path):
    artifact = evaluated_copy(tiny_llama_artifact, tmp_path)
    tables = load_script().table_choices(artifact, artifact, "eager")
    assert tables["points"] > 0 and tables["same"] == tables["points"] and tables["differ"] == []


def test_a_changed_leaf_is_found_with_its_cost_in_both_runs(tiny_llama_artifact, tmp_path):
    """A copy whose table sends one signature to another measured kernel everywhere: every point of
    that signature where the table chose otherwise differs, and the cost of the other's choice is
    read from each run's timings."""
    tool = load_script()
    tuned = evaluated_copy(tiny_llama_artifact, tmp_path / "a")
    other = tmp_path / "other"
    shutil.copytree(tuned, other)
    raw = json.loads((other / "dispatch.json").read_text())
    times = tool.point_times(other, "eager")
    entries = {e["signature"]: e for e in raw["ops"]}
    # a signature and a kernel measured at one of its points where the table chooses another
    sig, swap = next((sig, k) for (sig, dims), t in sorted(times.items()) if sig in entries
                     for k in t if k != pick(entries[sig]["tree"], json.loads(dims)))
    entry = entries[sig]
    points = {d: t for (s, d), t in times.items() if s == sig}
    chosen = {d: pick(entry["tree"], json.loads(d)) for d in points}
    entry["tree"] = {"kernel_id": swap}
    (other / "dispatch.json").write_text(json.dumps(raw))

    tables = tool.table_choices(tuned, other, "eager")
    differ = [d for d in tables["differ"] if d["signature"] == entry["signature"]]
    assert {d["dims"] for d in differ} == {dims for dims in points if chosen[dims] != swap}
    assert tables["same"] + len(tables["differ"]) == tables["points"]
    for d in differ:
        own = points[d["dims"]]
        if swap in own:
            assert d["b"] == swap and abs(d["cost_in_a"] - own[swap] / own[d["a"]]) < 1e-9
