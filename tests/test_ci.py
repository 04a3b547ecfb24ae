"""The CI step end to end on CPU: ci/tune_artifacts.py drives `lzsolve tune --json` and
`lzsolve evaluate`, gates on a baseline and exits 0 / 1 / 3 / 5; `lzsolve compare` and the
tune summary on their own; logs without a terminal; a tune on a busy host."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from lzsolve.cli import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INCONCLUSIVE, EXIT_OK, EXIT_REGRESSED, cli
from lzsolve.decide.compare import compare
from lzsolve.errors import LzError
from lzsolve.measure.env import BUSY_LOAD
from tests.tables import QUICK
from tests.test_cli import tiny_llama_config

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "ci" / "tune_artifacts.py"
# Small and quick on 2 cores; a worker process per run, as in real CI.
TUNE_ARGS = ["--grid", "tiny", "--dtype", "fp32", "--device", "cpu", "--kernels", "eager.*,torch.*,sdpa.*", *QUICK]


def run_script(*args, cwd):
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("ci")
    config = tiny_llama_config(root)
    done = run_script("--out", str(root / "out"), f"{config}:2", "no-such-model", "--", *TUNE_ARGS, cwd=root)
    return root, config, done


def invoke(*args):
    """The command's return value is the exit code `lzsolve` ends with (see cli.main)."""
    return CliRunner().invoke(cli, list(args), standalone_mode=False, catch_exceptions=False)


def rewrite(perfdb: Path, **columns) -> None:
    """Every record's `column` through its function (of the column's values)."""
    for part in perfdb.glob("part-*.parquet"):
        table = pq.read_table(part)
        for name, change in columns.items():
            table = table.set_column(table.schema.get_field_index(name), name, change(table[name]))
        pq.write_table(table, part)


def scale_times(perfdb: Path, factor: float) -> None:
    """Pretend the baseline's kernels were `factor` times as fast."""
    rewrite(perfdb, eager_ms=lambda ms: pc.multiply(ms, factor))


def timed_on(perfdb: Path, host_load: float, spread: float | None = None) -> None:
    """Pretend every record was timed at this host load per core (and spread, if given): a quiet host
    (0), so that a comparison judges the change alone (this VM's 2 cores are shared with other jobs).
    A tune that re-solves from records whose spreads changed may choose other kernels."""
    constant = {"host_load": host_load, **({"eager_spread": spread} if spread is not None else {})}
    rewrite(perfdb, **{name: lambda column, value=value: pa.array([value] * len(column), pa.float64())
                       for name, value in constant.items()})


def test_script_tunes_evaluates_and_reports_failures_per_model(ci_run):
    root, _, done = ci_run
    assert done.returncode == EXIT_FAILED, done.stderr  # one model failed, the other was still tuned
    summary = json.loads((root / "out" / "summary.json").read_text())
    by_model = {Path(m["model"]).parent.name or m["model"]: m for m in summary["models"]}
    assert summary["status"] == "failed"
    good, bad = by_model["tiny-llama"], by_model["no-such-model"]
    assert good["status"] == "ok" and good["tune_exit"] == EXIT_OK and good["evaluate_exit"] == EXIT_OK
    assert bad["status"] == "failed" and bad["tune_exit"] == EXIT_BAD_INPUT
    artifact = root / "out" / "tiny-llama-tp2"
    assert (artifact / "dispatch.json").is_file() and good["artifact"] == str(artifact)
    tune = json.loads((root / "out" / "tiny-llama-tp2.tune.json").read_text())
    assert tune["status"] == "ok" and tune["model"]["tp"] == 2 and tune["measured"] > 0 and not tune["blind"]
    # the summary counts what the PerfDB holds (a validation shape's reused records were counted twice:
    # 942 records reported, 877 rows written)
    from lzsolve.store.perfdb import PerfDB
    rows = PerfDB(artifact / "perfdb").rows("SELECT count(*) AS n FROM records WHERE run_id = ?", [tune["run_id"]])
    assert tune["written"] == tune["new"] + len(tune["compiled_ahead"]) == rows[0]["n"]
    assert tune["records"] == tune["new"] + tune["reused"] and tune["reused"] == 0
    assert f"({tune['records']} records: {tune['new']} of this run, 0 reused; {tune['written']} rows written" in done.stderr
    assert {s["signature"] for s in tune["signatures"]} == {e["signature"] for e in
                                                           json.loads((artifact / "dispatch.json").read_text())["ops"]}
    evaluation = json.loads((root / "out" / "tiny-llama-tp2.evaluate.json").read_text())
    assert evaluation["overall"]["points"] > 0 and good["evaluate"] == evaluation["overall"]
    md = (root / "out" / "summary.md").read_text()
    assert "| no-such-model | failed" in md and "ok" in md


def test_logs_without_a_terminal_are_lines_not_a_redrawn_bar(ci_run):
    _, _, done = ci_run
    assert "\r" not in done.stderr
    assert "measuring " in done.stderr and "(100%) in" in done.stderr


def test_measurements_a_phase_adds_once_begun_show_as_plus_n(capsys):
    """Validation's second rounds are announced as they are planned: the total grows, and the label
    says by how much, so that a percentage that falls back says why."""
    from lzsolve.progress import _LogProgress, add_measurements

    with _LogProgress(10, "validating") as bar:
        bar.update(10)
        add_measurements(bar, 10, "validating", 4)
        bar.update(4)
    assert capsys.readouterr().err.splitlines()[-1].startswith("validating (10 planned +4) 14/14 (100%) in ")


@pytest.mark.parametrize("baseline_load,code,status", [(0.0, EXIT_REGRESSED, "regressed"),
                                                        (2 * BUSY_LOAD, EXIT_INCONCLUSIVE, "inconclusive")])
def test_script_gates_on_a_faster_baseline(ci_run, tmp_path, baseline_load, code, status):
    """Twice as fast a baseline: a regression, unless the baseline was timed on a busy host, which
    makes the comparison inconclusive (exit 5), not regressed."""
    root, config, _ = ci_run
    baseline = tmp_path / "baseline"
    shutil.copytree(root / "out", baseline)
    timed_on(root / "out" / "tiny-llama-tp2" / "perfdb", host_load=0.0)
    scale_times(baseline / "tiny-llama-tp2" / "perfdb", 0.5)
    timed_on(baseline / "tiny-llama-tp2" / "perfdb", host_load=baseline_load)
    # Same --out: the warm PerfDB is reused, so only the comparison changes.
    done = run_script("--out", str(root / "out"), "--baseline", str(baseline), "--no-evaluate", f"{config}:2",
                      "--", *TUNE_ARGS, cwd=root)
    assert done.returncode == code, done.stderr
    summary = json.loads((root / "out" / "summary.json").read_text())
    model = summary["models"][0]
    comparison = model["tune"]["comparison"]
    assert summary["status"] == model["status"] == status and model["baseline"] == str(baseline / "tiny-llama-tp2")
    assert comparison[status] and comparison["overall"]["ratio_geomean"] == pytest.approx(2.0)
    assert model["tune"]["reused"] > 0 and model["tune"]["measured"] == 0
    assert status.upper() in done.stderr and f"{status}" in (root / "out" / "summary.md").read_text()


def test_compare_with_itself_is_exactly_even(ci_run):
    artifact = ci_run[0] / "out" / "tiny-llama-tp2"
    result = compare(artifact, artifact)
    assert not result["regressed"] and result["overall"]["points"] > 0
    assert all(s["ratio_geomean"] == pytest.approx(1.0) for s in result["signatures"].values())
    cli_result = invoke("compare", str(artifact), str(artifact), "--json")
    assert cli_result.return_value == EXIT_OK and json.loads(cli_result.output)["regressed"] == []


def test_compare_threshold_and_slower_new(ci_run, tmp_path):
    artifact = tmp_path / "quiet"
    shutil.copytree(ci_run[0] / "out" / "tiny-llama-tp2", artifact)
    timed_on(artifact / "perfdb", host_load=0.0, spread=0.0)
    slower = tmp_path / "slower"
    shutil.copytree(artifact, slower)
    scale_times(slower / "perfdb", 1.04)
    assert compare(slower, artifact, 0.05, min_ms=0)["regressed"] == []  # within the allowance
    assert compare(slower, artifact, 0.03, min_ms=0)["regressed"]
    # Points where both times are under the floor are reported, never gated.
    floor = compare(slower, artifact, 0.03, min_ms=1e9)
    assert floor["regressed"] == [] and all(s["gated_points"] == 0 for s in floor["signatures"].values())
    assert floor["overall"]["ratio_geomean"] == pytest.approx(1.04)
    result = invoke("compare", str(slower), str(artifact), "--max-regression", "0.03", "--min-ms", "0")
    assert result.return_value == EXIT_REGRESSED and "REGRESSED" in result.output


def test_a_change_inside_the_noise_is_inconclusive_not_regressed(ci_run, tmp_path):
    """Past the allowance, a signature whose timings spread more than it changed, or most of whose
    points were timed on a busy host (load per core past BUSY_LOAD), is inconclusive: exit 5."""
    old = tmp_path / "old"
    shutil.copytree(ci_run[0] / "out" / "tiny-llama-tp2", old)
    timed_on(old / "perfdb", host_load=0.0, spread=0.0)
    new = tmp_path / "new"
    shutil.copytree(old, new)
    scale_times(new / "perfdb", 1.5)
    assert compare(new, old, min_ms=0)["inconclusive"] == []  # 50% slower, quietly: regressed
    timed_on(new / "perfdb", host_load=0.0, spread=0.6)  # the same, at a 60% spread
    spread = compare(new, old, min_ms=0)
    assert spread["regressed"] == [] and spread["inconclusive"] == sorted(spread["signatures"])
    assert all(c["noise"] == pytest.approx(0.6) for c in spread["signatures"].values())
    timed_on(new / "perfdb", host_load=BUSY_LOAD + 0.5, spread=0.0)  # no spread, but the host's cores were short
    busy = compare(new, old, min_ms=0)
    assert busy["regressed"] == [] and all(c["busy_points"] == c["gated_points"] for c in busy["signatures"].values())
    result = invoke("compare", str(new), str(old), "--min-ms", "0")
    assert result.return_value == EXIT_INCONCLUSIVE and "INCONCLUSIVE" in result.output
    assert "inconclusive: the host was too busy to judge" in result.output and "REGRESSED" not in result.output


def test_a_tune_on_a_busy_host_flags_its_noisy_decisions_and_compares_inconclusive(tiny_llama_artifact, tmp_path):
    """Processes spinning on every core beside a small tune: report.md, `tune --json` and `lzsolve
    explain` count the decisions resting on noisy data, and the comparison with the shared tiny
    artifact (tuned without them) is inconclusive, not regressed."""
    cores = len(os.sched_getaffinity(0))
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * cores)]
    try:
        deadline = time.monotonic() + 90  # the 1-minute load average takes ~20 s to pass the cores
        while os.getloadavg()[0] / cores <= BUSY_LOAD + 0.2 and time.monotonic() < deadline:
            time.sleep(1)
        out = tmp_path / "busy"
        result = invoke("tune", "--config", str(tiny_llama_config(tmp_path)), "--grid", "tiny", "--dtype", "fp32",
                        "--device", "cpu", "--kernels", "eager.*,torch.*,sdpa.*", "--no-probe", "--validate", "0",
                        *QUICK, "--out", str(out), "--baseline", str(tiny_llama_artifact), "--json")
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    summary = json.loads(result.stdout)
    noise = summary["noise"]
    assert result.return_value == EXIT_INCONCLUSIVE and summary["status"] == "inconclusive", result.stderr
    assert summary["comparison"]["regressed"] == [] and summary["comparison"]["inconclusive"]
    assert 0 < noise["noisy_decisions"] <= noise["decisions"] and noise["host_load"]["max"] > BUSY_LOAD
    assert noise["busy_timings"] > 0 and noise["spread_over"]["0.1"] > 0
    counted = f"{noise['noisy_decisions']} of {noise['decisions']} decisions rest on noisy data"
    assert f"- noise: {counted}" in (out / "report.md").read_text()
    explained = invoke("explain", str(out))
    assert f"noise: {counted}" in explained.output and "NOISY: timings spread" in explained.output
    assert invoke("compare", str(out), str(tiny_llama_artifact)).return_value == EXIT_INCONCLUSIVE


def test_compare_refuses_unlike_artifacts(ci_run, tmp_path):
    artifact = ci_run[0] / "out" / "tiny-llama-tp2"
    other = tmp_path / "other"
    shutil.copytree(artifact, other)
    table = json.loads((other / "dispatch.json").read_text())
    table["model"]["dtype"] = "bf16"
    (other / "dispatch.json").write_text(json.dumps(table))
    with pytest.raises(LzError, match="dtype is bf16"):
        compare(artifact, other)


def test_compare_reads_its_tables_and_records_as_data(ci_run, tmp_path):
    """Fields the schema leaves optional (created_at, hw_slug, run_id: every tune writes them) and
    records whose dims are not a point of the tree: one-line errors and skipped records, not
    KeyError or ValueError tracebacks."""
    artifact = ci_run[0] / "out" / "tiny-llama-tp2"
    for field, value, needle in (("created_at", None, "has no created_at"), ("run_id", None, "has no run_id"),
                                 ("created_at", "yesterday", "is not an ISO date")):
        other = tmp_path / f"{field}-{value}"
        shutil.copytree(artifact, other)
        table = json.loads((other / "dispatch.json").read_text())
        table.pop(field) if value is None else table.update({field: value})
        (other / "dispatch.json").write_text(json.dumps(table))
        with pytest.raises(LzError, match=needle):
            compare(other, artifact)
    for name, dims in (("foreign-dims", '{"width": "x"}'), ("past-a-float", '{"tokens": 1%s}' % ("0" * 400))):
        foreign = tmp_path / name
        shutil.copytree(artifact, foreign)
        rewrite(foreign / "perfdb", dims=lambda column, dims=dims: pa.array([dims] * len(column), pa.string()))
        result = compare(artifact, foreign)
        assert result["overall"]["points"] == 0 and not result["regressed"], (name, result["overall"])


def test_tune_rejects_a_missing_baseline(tmp_path):
    result = CliRunner().invoke(cli, ["tune", "--model", "gpt2", "--baseline", str(tmp_path), "--out",
                                      str(tmp_path / "a")])
    assert result.exit_code != 0 and "no dispatch.json" in str(result.exception)
    assert not (tmp_path / "a").exists()


def test_the_readmes_example_writes_outside_the_clone():
    """ci/README's commands wrote ci-artifacts/ into the repo root, where `ruff check .` then linted the
    code Inductor generated there."""
    import shlex

    commands = [shlex.split(line) for line in (REPO / "ci" / "README.md").read_text().splitlines()
                if line.strip().startswith("python ci/tune_artifacts.py")]
    folders = [Path(args[args.index(option) + 1]) for args in commands for option in ("--out", "--baseline")
               if option in args]
    assert len(commands) == 2 and len(folders) == 3
    assert all(f.is_absolute() and REPO not in f.parents for f in folders), folders
    ruff = next(line for line in (REPO / "pyproject.toml").read_text().splitlines() if "extend-exclude" in line)
    assert '".jit-work"' in ruff, "an artifact's generated code is never linted, wherever it lands"


def test_workflow_calls_the_script_on_a_gpu_runner():
    workflow = yaml.safe_load((REPO / "ci" / "github" / "lzsolve-artifacts.yml").read_text())
    job = workflow["jobs"]["tune"]
    assert "self-hosted" in job["runs-on"] and "gpu" in job["runs-on"]
    steps = {s.get("name", s.get("uses")): s for s in job["steps"]}
    assert any("ci/tune_artifacts.py --out ci-artifacts" in s.get("run", "") for s in steps.values())
    upload = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "always()" and upload["with"]["path"] == "ci-artifacts/"
    download = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/download-artifact"))
    assert download["with"]["name"] == upload["with"]["name"]


def test_tune_exits_failed_when_a_signature_has_no_admitted_kernel(tmp_path, monkeypatch):
    """A signature whose every candidate, its fallback included, was rejected leaves the table
    blind there: the artifact is still written (to be inspected) but the exit code says failed."""
    from lzsolve.measure import tuner
    real_tune = tuner.tune

    def parity_fails_for_swiglu(*args, **kwargs):
        records = real_tune(*args, **kwargs)
        return [dict(r, status="rejected", stage="parity", reason_code="PARITY_FAILED", reason_message="rel_l2 1")
                if r["op"] == "act.swiglu" else r for r in records]

    monkeypatch.setattr(tuner, "tune", parity_fails_for_swiglu)
    config = tiny_llama_config(tmp_path)
    result = invoke("tune", "--config", str(config), "--tp", "2", "--grid", "tiny", "--dtype", "fp32", "--device", "cpu",
                    "--kernels", "eager.*", "--no-isolate", "--no-probe", "--validate", "0", "--out", str(tmp_path / "a"),
                    "--json")
    summary = json.loads(result.stdout)
    assert result.return_value == EXIT_FAILED and summary["status"] == "failed"
    assert summary["blind"] == ["act.swiglu[width=256,fp32]"]
    assert "error: act.swiglu[width=256,fp32]: no kernel was admitted" in result.stderr
    assert (tmp_path / "a" / "dispatch.json").is_file()
