"""The tuning pipeline as a library object (lzsolve/pipeline.py): a Tune run in this process, one
phase at a time and whole; its lifecycle; and `lzsolve tune`'s options, each one field of the
TuneConfig it runs."""
import dataclasses
import json
import multiprocessing

import pytest
from click.testing import CliRunner

import runtime_loader
from lzsolve import pipeline
from lzsolve.cli import EXIT_REGRESSED, cli
from lzsolve.errors import LzError
from lzsolve.measure import tuner
from lzsolve.pipeline import (
    GridConfig,
    MeasureConfig,
    ModelSource,
    OutputConfig,
    SearchConfig,
    Tune,
    TuneConfig,
    TuneResult,
    ValidateConfig,
)
from lzsolve.store.perfdb import PerfDB
from runtime_loader import registry
from runtime_loader.inputs import SKEW_ENV

from .test_workload import RMS_CALL, write_workload

NORM = "norm.rms[hidden=64,fp32]"
PHASES = ["start_s", "search_s", "grid_s", "probe_s", "validation_s", "close_s", "solve_s", "write_s"]


def norm_config(tmp_path, **changes) -> TuneConfig:
    """One recorded norm.rms signature, its eager fallback against torch's kernel: a tune of seconds
    in this process (tiny grid, quick sampling, no search), with probes and two validation shapes."""
    workload = write_workload(tmp_path / "w.json", [{**RMS_CALL, "dims": {"tokens": t}} for t in (1, 64)])
    config = TuneConfig(ModelSource(workload=workload), GridConfig(grid="tiny", kernels=("eager.*", "torch.*")),
                        MeasureConfig(device="cpu", isolate=False, sample_time=0.05), SearchConfig(trials=0),
                        ValidateConfig(shapes=2), OutputConfig(out=tmp_path / "out"))
    return dataclasses.replace(config, **changes)


def rows(out, run_id: str) -> int:
    return PerfDB(out / "perfdb").rows("SELECT count(*) AS n FROM records WHERE run_id = ?", [run_id])[0]["n"]


def test_the_phases_one_at_a_time(tmp_path, probes_everywhere):
    out = tmp_path / "out"
    with Tune(norm_config(tmp_path)) as tune:
        tune.start()
        assert tune.measuring == [] and tune.cluster is None, "--no-isolate: no worker process"
        tune.make_plan()
        assert [str(sp.instance.signature) for sp in tune.plan.signatures] == [NORM]
        assert tune.mode == "eager" and tune.out == out and list(tune.phases) == ["start_s"]
        tune.search()
        assert tune.searched is None, "nothing tunable among the candidates"
        tune.measure_grid()
        assert {r["phase"] for r in tune.records} == {"grid"}
        assert {r["kernel_id"] for r in tune.records if r["status"] == "ok"} == {"eager.rms_norm", "torch.rms_norm"}
        tune.probe()
        tune.validate()
        assert {"probe", "validation"} <= {r["phase"] for r in tune.records}
        assert tune.validation[NORM]["shapes"] > 0 and tune.validation[NORM]["after"]["points"] > 0
        tune.close_measuring()
        tune.solve()
        assert [e["signature"] for e in tune.table["ops"]] == [NORM]
        assert not (out / "dispatch.json").exists(), "solved, not written yet"
        tune.write()
        assert (out / "dispatch.json").is_file() and (out / "report.md").is_file()
        result = tune.report()
    assert list(result.summary["phases"]) == PHASES and list(result.summary["parent_cpu_s"]) == PHASES
    assert result.status == "ok" and result.artifact == out and result.table == tune.table
    assert result.blind == result.regressed == [] and result.summary["comparison"] is None
    summary = result.summary
    assert summary["written"] == summary["new"] == rows(out, summary["run_id"]) == summary["records"] > 0
    assert summary["reused"] == 0 and summary["measured"] == len([r for r in result.records if r["stage"] != "capability"])
    assert runtime_loader.load(out, strict=True).table is not None
    assert SKEW_ENV not in __import__("os").environ, "the routing skew is the tune's, and ends with it"


def test_every_phase_times_the_table_s_mode_alone(tmp_path, monkeypatch, probes_everywhere):
    """The grid, the probes and the validation ask the table's timing mode alone: the grid timed
    both, and an eager tune on a GPU captured and sampled a CUDA graph of every candidate it never
    read. (On a CPU the harness times eager alone whatever it is asked: the tasks show the asking.)"""
    from lzsolve.measure import worker
    from lzsolve.measure.tasks import TimingTask
    asked = []

    class Recording(worker.InProcessRunner):
        def run(self, task):
            if isinstance(task, TimingTask):
                asked.append(task.modes)
            return super().run(task)

    monkeypatch.setattr(worker, "InProcessRunner", Recording)
    result = Tune(norm_config(tmp_path)).run()
    assert {"grid", "probe", "validation"} <= {r["phase"] for r in result.records}
    assert asked and set(asked) == {("eager",)}, set(asked)


def test_the_grid_defers_what_the_builders_and_the_primer_still_call(tmp_path):
    """Both compile-ahead groups' pending kernels hold their signatures back in the grid: the
    primer's too, whose library a quick tune's measuring worker would otherwise import beside it."""
    class Ahead:
        def __init__(self, kernels):
            self.kernels = frozenset(kernels)

        def building(self):
            return self.kernels

    tune = Tune(norm_config(tmp_path))
    assert tune._building() == frozenset()
    tune.builders, tune.primer = Ahead({"flashinfer.prefill"}), Ahead({"liger.swiglu"})
    assert tune._building() == {"flashinfer.prefill", "liger.swiglu"}
    tune.builders = None
    assert tune._building() == {"liger.swiglu"}


def test_signatures_waiting_on_a_build_go_through_every_phase_last(tmp_path, monkeypatch, probes_everywhere):
    """A signature with a kernel still being built ahead when the grid begins is measured after the
    others have been through the grid, their probes and their validation, which fill the wait (a
    cold workload tune waited 36 s of its grid for FlashInfer's modules); every phase still covers
    it, each phase keeps one entry in the summary, and the ceilings are probed once."""
    add_call = {"signature": {"op": "norm.rms_add", "static": {"hidden": 64}, "flags": [], "dtype": "fp32"},
                "dims": {"tokens": 12}, "count": 5}
    workload = write_workload(tmp_path / "two.json", [{**call, "dims": {"tokens": t}} for t in (1, 64)
                                                     for call in (RMS_CALL, add_call)])
    config = norm_config(tmp_path, model=ModelSource(workload=workload))
    monkeypatch.setattr(Tune, "_building", lambda self: frozenset({"torch.rms_norm"}))
    ceilings = []
    monkeypatch.setattr(tuner, "measure_ceilings", lambda *args: ceilings.append(args))
    result = Tune(config).run()
    first_norm = next(n for n, r in enumerate(result.records) if r["signature"] == NORM)
    earlier = {(r["signature"].split("[")[0], r["phase"]) for r in result.records[:first_norm]}
    assert earlier == {("norm.rms_add", phase) for phase in ("grid", "probe", "validation")}, earlier
    later = {(r["signature"], r["phase"]) for r in result.records[first_norm:]}
    assert later == {(NORM, phase) for phase in ("grid", "probe", "validation")}, later
    validated = {e["signature"] for e in result.table["ops"] if e.get("validation")}
    assert validated == {NORM, NORM.replace("norm.rms", "norm.rms_add")}, "both cohorts' figures in the table"
    assert list(result.summary["phases"]) == PHASES and len(ceilings) == 1


def test_the_warmer_keeps_the_grid_calls_of_a_cohort_still_to_come(tmp_path):
    """A phase's Inductor first calls replace those still queued for earlier phases, but for the
    signatures of a later cohort, whose grid is still to come (CompileAhead.begin's keep)."""
    begun = []

    class Warmer:
        def begin(self, phase, calls, keep=frozenset()):
            begun.append((phase, keep))

    with Tune(norm_config(tmp_path)) as tune:
        tune.start()
        tune.make_plan()
        tune.warmer = Warmer()
        tune._to_come = tune.plan.signatures
        tune._warm("probe", [])
        tune._to_come = ()
        tune._warm("probe", [])
    assert begun == [("probe", {NORM}), ("probe", frozenset())]


def test_run_again_reuses_every_record(tmp_path, capsys):
    config = norm_config(tmp_path, validate=ValidateConfig(probe=False, shapes=0))
    first = Tune(config).run()
    again = Tune(config).run()
    assert again.status == "ok" and again.summary["measured"] == 0 and again.summary["new"] == 0
    assert again.summary["reused"] == again.summary["records"] == first.summary["records"]
    assert "\nincremental: " in capsys.readouterr().err
    fresh = Tune(dataclasses.replace(config, output=OutputConfig(out=tmp_path / "out", fresh=True))).run()
    assert fresh.summary["measured"] == first.summary["measured"], "fresh: measured again"


def test_a_quick_table_leaves_out_what_it_says_and_the_full_tune_adds_it(tmp_path, capsys, probes_everywhere):
    """tune --quick: the next smaller grid, no search, probes or validation, no kernel with a slow first
    call (Inductor's compile.*, here the one such candidate); report.md and the summary name each. A
    full tune into the same folder measures what was left out and reuses every quick record."""
    workload = write_workload(tmp_path / "w.json", [{**RMS_CALL, "dims": {"tokens": t}} for t in (1, 9, 64, 700)])
    base = TuneConfig(ModelSource(workload=workload), GridConfig(kernels=("eager.*", "torch.*", "compile.rms_norm")),
                      MeasureConfig(device="cpu", isolate=False, sample_time=0.05),
                      output=OutputConfig(out=tmp_path / "out"))
    quick = Tune(dataclasses.replace(base, grid=dataclasses.replace(base.grid, quick=True))).run()
    assert quick.status == "ok" and quick.table["grid"].endswith("tiny"), quick.table["grid"]
    skipped = quick.summary["quick"]["skipped"]
    assert len(skipped) == 5 and "compile.rms_norm" in skipped[-1], skipped
    assert {r["phase"] for r in quick.records} == {"grid"}
    compiled = [r for r in quick.records if r["kernel_id"] == "compile.rms_norm"]
    assert compiled and all(r["status"] == "rejected" and r["reason_code"] == "EXCLUDED" for r in compiled)
    assert "- quick (tune --quick): left out" in (tmp_path / "out" / "report.md").read_text()
    assert "\nquick: left out " in capsys.readouterr().out
    full = Tune(dataclasses.replace(base, grid=dataclasses.replace(base.grid, exclude=("compile.*",)),
                                    validate=ValidateConfig(shapes=1))).run()
    assert full.summary["quick"] is None and full.table["grid"].endswith("small")
    measured = {(r["kernel_id"], r["dims"]) for r in quick.records if r["stage"] != "capability"}
    reused = {(r["kernel_id"], r["dims"]) for r in full.records
              if r["run_id"] == quick.summary["run_id"] and r["stage"] != "capability"}
    assert reused == measured and len(measured) == quick.summary["measured"] > 0, "every quick record reused"
    assert {"grid", "probe", "validation"} <= {r["phase"] for r in full.records}
    assert "quick" not in (tmp_path / "out" / "report.md").read_text()

def test_a_quick_tune_samples_shorter_unless_told_and_says_so(tmp_path):
    """Left at its default, --sample-time becomes QUICK_SAMPLE_S under --quick (named in what it left
    out); a sample time the user gave is kept."""
    base = TuneConfig(ModelSource(name="llama3-8b"), GridConfig(quick=True))
    config, skipped = pipeline.quick(base)
    assert config.measure.sample_time == pipeline.QUICK_SAMPLE_S < base.measure.sample_time
    assert any(s.startswith(f"the full sampling ({pipeline.QUICK_SAMPLE_S:g} s a candidate") for s in skipped), skipped
    told, skipped = pipeline.quick(dataclasses.replace(base, measure=MeasureConfig(sample_time=0.3)))
    assert told.measure.sample_time == 0.3 and not any("sampling" in s for s in skipped)
    assert pipeline.quick(dataclasses.replace(base, grid=GridConfig()))[0].measure.sample_time == base.measure.sample_time


def test_a_quick_tune_leaves_out_every_kernel_whose_first_call_takes_seconds():
    """Inductor's and nvcc's builds, and Liger's import (transformers, PEFT, torch._dynamo: 10.8 s to a first
    call on an H100 host); our own Triton kernels and torch's stay candidates."""
    config, skipped = pipeline.quick(TuneConfig(ModelSource(name="llama3-8b"), GridConfig(quick=True)))
    excluded = set(config.grid.exclude)
    ids = {registry.family(spec.kernel_id): spec for spec in registry.REGISTRY.values()}
    slow = {i for i, spec in ids.items() if spec.library in ("liger-kernel", "flashinfer-python")
            or "inductor" in spec.jit_caches}
    assert {"liger.rms_norm", "flashinfer.prefill", "compile.rms_norm"} <= slow <= excluded
    assert not {"triton.rms_norm", "torch.rms_norm", "sdpa.default", "eager.rms_norm"} & excluded
    assert "liger.rms_norm" in skipped[-2], skipped


def test_the_summary_lines_go_to_stdout_unless_json(tmp_path, capsys):
    config = norm_config(tmp_path, validate=ValidateConfig(probe=False, shapes=0))
    Tune(config).run()
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / 'out'}/dispatch.json")
    Tune(dataclasses.replace(config, output=OutputConfig(out=tmp_path / "out", json=True))).run()
    captured = capsys.readouterr()
    assert captured.out == "" and f"  {NORM}: " in captured.err


def test_a_signature_no_kernel_was_admitted_for_fails_the_result(tmp_path, monkeypatch):
    real_tune = tuner.tune

    def parity_fails(*args, **kwargs):
        return [dict(r, status="rejected", stage="parity", reason_code="PARITY_FAILED", reason_message="rel_l2 1")
                for r in real_tune(*args, **kwargs)]

    monkeypatch.setattr(tuner, "tune", parity_fails)
    result = Tune(norm_config(tmp_path, validate=ValidateConfig(probe=False, shapes=0))).run()
    assert result.status == "failed" and result.blind == [NORM] and (result.artifact / "dispatch.json").is_file()


def test_bad_settings_end_the_tune_and_its_workers(tmp_path):
    """A worker is started ahead of the plan (isolate); input the plan finds bad ends the run, and
    leaving the Tune stops the worker, whatever it was still importing. Nothing is written."""
    config = norm_config(tmp_path, measure=MeasureConfig(device="cpu", mode="graph"))
    before = set(multiprocessing.active_children())
    with pytest.raises(LzError, match="--mode graph needs a CUDA device"):
        with Tune(config) as tune:
            tune.start()
            assert len(tune.measuring) == 1
            tune.make_plan()
    assert set(multiprocessing.active_children()) <= before
    assert not (tmp_path / "out").exists()
    with pytest.raises(LzError, match="--ray-workers applies to --ray only"):
        Tune(norm_config(tmp_path, measure=MeasureConfig(ray_workers=2))).run()
    with pytest.raises(LzError, match="no dispatch.json there"):
        Tune(norm_config(tmp_path, validate=ValidateConfig(baseline=tmp_path))).run()


# --- the command line: one option, one field ----------------------------------------------------

# tune's options (click's names), each with a value other than its default and the field it sets
OPTIONS = {
    "model": (["--model", "m"], "model.name", "m"),
    "config": (["--config", "c.json"], "model.config", "c.json"),
    "recorded": (["--workload", "w.json"], "model.workload", "w.json"),
    "tp": (["--tp", "2"], "model.tp", 2),
    "ep": (["--ep", "4"], "model.ep", 4),
    "dtype": (["--dtype", "fp16"], "model.dtype", "fp16"),
    "fp8_kv": (["--fp8-kv"], "model.fp8_kv", True),
    "grid": (["--grid", "small"], "grid.grid", "small"),
    "kernels": (["--kernels", "a.*,b.*", "--kernels", "c.*"], "grid.kernels", ("a.*", "b.*", "c.*")),
    "exclude": (["--exclude", "d.*"], "grid.exclude", ("d.*",)),
    "plugins": (["--plugin", "p", "--plugin", "q"], "grid.plugins", ("p", "q")),
    "device": (["--device", "cuda:1"], "measure.device", "cuda:1"),
    "devices": (["--devices", "cuda:0,cuda:1"], "measure.devices", "cuda:0,cuda:1"),
    "ray_address": (["--ray", "auto"], "measure.ray", "auto"),
    "ray_workers": (["--ray-workers", "3"], "measure.ray_workers", 3),
    "mode": (["--mode", "graph"], "measure.mode", "graph"),
    "sample_time": (["--sample-time", "0.25"], "measure.sample_time", 0.25),
    "timeout": (["--timeout", "7"], "measure.timeout", 7.0),
    "isolate": (["--no-isolate"], "measure.isolate", False),
    "routing_skew": (["--routing-skew", "0.7"], "measure.routing_skew", 0.7),
    "quick": (["--quick"], "grid.quick", True),
    "cache": (["--no-cache"], "measure.cache", False),
    "cache_dir": (["--cache-dir", "c"], "measure.cache_dir", "c"),
    "trials": (["--trials", "5"], "search.trials", 5),
    "spaces": (["--spaces", "{spaces}"], "search.spaces", "{spaces}"),
    "patience": (["--patience", "9"], "search.patience", 9),
    "skip_behind": (["--skip-behind", "0.5"], "search.skip_behind", 0.5),
    "refine": (["--refine", "2"], "search.refine", 2),
    "full_search": (["--full-search"], "search.full", True),
    "probe": (["--no-probe"], "validate.probe", False),
    "validate_shapes": (["--validate", "3"], "validate.shapes", 3),
    "baseline": (["--baseline", "b"], "validate.baseline", "b"),
    "max_regression": (["--max-regression", "0.2"], "validate.max_regression", 0.2),
    "min_ms": (["--min-ms", "0.5"], "validate.min_ms", 0.5),
    "out": (["--out", "o"], "output.out", "o"),
    "fresh": (["--fresh"], "output.fresh", True),
    "as_json": (["--json"], "output.json", True),
}


def config_fields() -> set[str]:
    return {f"{group.name}.{f.name}" for group in dataclasses.fields(TuneConfig)
            for f in dataclasses.fields(group.type if isinstance(group.type, type) else getattr(pipeline, group.type))}


def field_of(config: TuneConfig, path: str):
    group, name = path.split(".")
    return getattr(getattr(config, group), name)


@pytest.fixture
def recorded_configs(monkeypatch, tmp_path):
    """`lzsolve tune` with pipeline.Tune replaced: the configs it was given (its run regresses)."""
    seen = []

    class Recording:
        def __init__(self, config, entered=None):
            seen.append(config)

        def run(self):
            return TuneResult(tmp_path, "regressed", {"status": "regressed"}, {}, [])

    monkeypatch.setattr(pipeline, "Tune", Recording)
    return seen


def test_every_tune_option_is_one_field_of_the_config(tmp_path, recorded_configs):
    params = [p.name for p in cli.commands["tune"].params]
    assert sorted(params) == sorted(OPTIONS), "an option tune has and this table has not, or the reverse"
    fields = [path for _, path, _ in OPTIONS.values()]
    assert len(set(fields)) == len(fields) and set(fields) == config_fields(), "one field each, every field one"
    (tmp_path / "spaces").mkdir()
    args = [a.format(spaces=tmp_path / "spaces") for option, _, _ in OPTIONS.values() for a in option]
    result = CliRunner().invoke(cli, ["tune", *args], standalone_mode=False, catch_exceptions=False)
    assert result.return_value == EXIT_REGRESSED and json.loads(result.stdout) == {"status": "regressed"}
    (config,) = recorded_configs
    for name, (_, path, value) in OPTIONS.items():
        expected = value.format(spaces=tmp_path / "spaces") if isinstance(value, str) else value
        assert field_of(config, path) == expected, name


def test_the_options_defaults_are_the_configs(recorded_configs):
    """The command's defaults (some read from the modules that hold them, cli.Deferred) and the
    dataclasses' agree; --dtype reaches the config only where the command line gave it."""
    CliRunner().invoke(cli, ["tune"], catch_exceptions=False)
    CliRunner().invoke(cli, ["tune", "--dtype", "bf16"], catch_exceptions=False)
    assert recorded_configs == [TuneConfig(ModelSource()), TuneConfig(ModelSource(dtype="bf16"))]
