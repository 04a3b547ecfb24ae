"""lzsolve evaluate: off-grid shapes, regret against the best kernel and the default."""
import json

import pytest
from click.testing import CliRunner

from lzsolve.cli import cli
from lzsolve.decide.evaluate import between, off_grid_points, parse_shapes, retimed
from lzsolve.decide.validate import PointResult, judge, summarize
from lzsolve.errors import LzError
from runtime_loader.manifest import read_manifest, verify


def test_midpoints_between_buckets():
    assert between([1, 4, 16, 64]) == [2, 8, 32]
    assert between([1, 2]) == []  # no integer strictly between
    assert off_grid_points({"tokens": [1, 8, 64]}) == [{"tokens": 3}, {"tokens": 23}]
    assert off_grid_points({"batch": [1, 2], "seq": [32, 128]}) == [{"batch": 1, "seq": 64}, {"batch": 2, "seq": 64}]
    assert off_grid_points({"tokens": [1, 2]}) == []


def test_parse_shapes():
    assert parse_shapes(("tokens=24", "batch=2,seq=700")) == [{"tokens": 24}, {"batch": 2, "seq": 700}]
    for bad in ("tokens", "tokens=0", "tokens=x", "width=3", "tokens=" + "9" * 23):  # past a float: OverflowError once
        with pytest.raises(LzError, match="--shapes"):
            parse_shapes((bad,))


def test_summary_geomean_and_worst():
    results = [PointResult("s", {"tokens": 3}, "a", "a", 1.0, 1.0, 2.0),
               PointResult("s", {"tokens": 5}, "a", "b", 4.0, 1.0, 2.0),
               PointResult("s", {"tokens": 7}, "c", "b", None, 1.0, 2.0, problem="c failed here: RAISED: x")]
    o = summarize(results)["overall"]
    assert o["regret_geomean"] == pytest.approx(2.0) and o["regret_worst"] == 4.0
    assert o["vs_default_geomean"] == pytest.approx(1.0) and o["vs_default_worst"] == 2.0
    assert o["problems"] == 1 and o["points"] == 3


def _timed(times: dict[str, float]) -> list[dict]:
    return [{"kernel_id": k, "status": "ok", "eager_ms": t} for k, t in times.items()]


CHOSEN, FALLBACK, OTHER = "triton.rms_norm", "torch.rms_norm", "liger.rms_norm"


@pytest.mark.parametrize("again, regret", [({CHOSEN: 1.00, FALLBACK: 1.01}, 1.0),  # a transient: no loss
                                           ({CHOSEN: 1.20, FALLBACK: 1.00}, 1.1)])  # a cliff: timed twice
def test_a_loss_is_timed_again_and_each_kernel_counts_at_its_faster_timing(again, regret):
    first = _timed({CHOSEN: 1.10, FALLBACK: 1.00, OTHER: 1.30})
    asked = []

    def measure(specs):
        asked.append(sorted(s.kernel_id for s in specs))
        return _timed(again)

    result, recs = retimed(judge("s", {"tokens": 5}, CHOSEN, FALLBACK, first, "eager"), first, measure, "eager")
    assert asked == [sorted([CHOSEN, FALLBACK])], "the choice, the best and the fallback: once"
    assert result.first_loss == pytest.approx(1.1) and result.regret == pytest.approx(regret)
    assert len(recs) == 5, "both timings are kept"
    assert summarize([result])["overall"]["retimed"] == 1


def test_a_choice_within_the_loss_margin_is_not_timed_again():
    first = _timed({CHOSEN: 1.04, FALLBACK: 1.00})
    result, recs = retimed(judge("s", {"tokens": 5}, CHOSEN, FALLBACK, first, "eager"), first,
                           lambda specs: pytest.fail("timed again"), "eager")
    assert result.first_loss is None and recs == first


def test_evaluate_cli_on_the_spine_artifact(tmp_path, tiny_llama_artifact):
    out = tiny_llama_artifact
    runner = CliRunner()
    result = runner.invoke(cli, ["evaluate", str(out), "--json", str(tmp_path / "eval.json"), "--no-isolate",
                                 "--shapes", "tokens=3", "--shapes", "batch=1,seq=32", "--shapes", "batch=2,kv_len=40"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "eval.json").read_text())
    ops = {p["signature"].split("[")[0] for p in summary["points"]}
    assert ops == {"embedding", "norm.rms", "norm.rms_add", "linear", "posenc.rope", "act.swiglu",
                   "attention.prefill", "attention.decode"}
    o = summary["overall"]
    assert o["points"] == len(summary["points"]) and o["regret_worst"] >= o["regret_geomean"] >= 1.0
    assert "regret" in result.output and "all" in result.output
    manifest = read_manifest(out)
    assert any(p.startswith("perfdb/") for p in manifest["files"])
    verify(out, manifest, "dispatch.json")
    from lzsolve.store.perfdb import PerfDB
    runs = PerfDB(out / "perfdb").rows("SELECT DISTINCT run_id FROM records WHERE run_id LIKE 'eval-%'")
    assert len(runs) == 1, "evaluation records are kept in the PerfDB"


def test_a_borrowed_table_is_evaluated_on_this_gpu_only_when_asked(tmp_path, tiny_llama_artifact):
    """An artifact tuned on another device of this architecture (here: another CPU model) is refused
    by evaluate as by load, unless --on-this-gpu: then what it serves here is measured here, and the
    artifact, which holds the other device's records, gets none of this one's."""
    import shutil

    from lzsolve.store.artifact import refresh_manifest
    from lzsolve.store.perfdb import PerfDB

    borrowed = tmp_path / "borrowed"
    shutil.copytree(tiny_llama_artifact, borrowed)
    raw = json.loads((borrowed / "dispatch.json").read_text())
    raw["hardware"]["name"] = "A CPU of another model"
    (borrowed / "dispatch.json").write_text(json.dumps(raw))
    refresh_manifest(borrowed)
    args = ["evaluate", str(borrowed), "--no-isolate", "--shapes", "tokens=3", "--op", "norm.rms*"]
    refused = CliRunner().invoke(cli, args)
    assert isinstance(refused.exception, LzError), refused.output  # exit 2 from the command, one line
    assert "--on-this-gpu" in str(refused.exception) and "name: table" in str(refused.exception)
    before = PerfDB(borrowed / "perfdb").rows("SELECT count(*) AS n FROM records")[0]["n"]
    result = CliRunner().invoke(cli, [*args, "--on-this-gpu", "--json", str(tmp_path / "eval.json")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "eval.json").read_text())
    assert summary["on_this_gpu"] and summary["overall"]["points"] >= 1
    assert summary["overall"]["vs_default_geomean"] > 0 and "regret" in result.output
    assert PerfDB(borrowed / "perfdb").rows("SELECT count(*) AS n FROM records")[0]["n"] == before


def test_a_cuda_artifact_on_a_machine_without_cuda_is_one_line_that_names_no_wrong_fix(tmp_path, monkeypatch):
    """It said "use --device cpu", and --device cpu was then refused as other hardware."""
    import torch

    from .tables import table, write

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    folder = write(tmp_path / "a", table(hardware={**table()["hardware"], "device": "cuda", "name": "NVIDIA H200"}))
    result = CliRunner().invoke(cli, ["evaluate", folder])
    assert isinstance(result.exception, LzError), result.output
    assert str(result.exception) == (f"{folder} was tuned on NVIDIA H200 and no CUDA device is available here; "
                                     "evaluate it on the machine it was tuned on")
