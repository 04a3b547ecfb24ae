"""End to end through the command line: tune -> artifact -> load -> replay; explain, db query;
bad input ends in one line, a non-zero exit and nothing written."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import runtime_loader
from lzsolve.cli import cli
from lzsolve.models import CATALOGUE

from .tables import QUICK, assert_replays_references, plugin_kernels, table, write

TINY_LLAMA = {**CATALOGUE["llama3-8b"], "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}


def tiny_llama_config(root: Path) -> Path:
    """TINY_LLAMA as root/tiny-llama/config.json (the folder names the model)."""
    config = root / "tiny-llama" / "config.json"
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps(TINY_LLAMA))
    return config


@pytest.fixture(scope="module")
def artifact(tiny_llama_artifact):
    """The tests' shared tune of TINY_LLAMA (conftest.py: default probes and validation, in-process through
    lzsolve.pipeline, as the command runs it); the command's own tunes are the re-run below and the others."""
    return tiny_llama_artifact


def run_cli(*args, cwd):
    """The `lzsolve` command in a process of its own, as the console script runs it (cli.run)."""
    return subprocess.run([sys.executable, "-m", "lzsolve", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_artifact_layout(artifact):
    assert (artifact / "dispatch.json").is_file() and (artifact / "report.md").is_file()
    assert list((artifact / "perfdb").glob("*.parquet"))
    assert not [p for p in artifact.rglob("*") if p.name.endswith(".tmp")]
    table = json.loads((artifact / "dispatch.json").read_text())
    assert table["schema_version"] == 1 and table["model"]["id"] == "tiny-llama" and table["model"]["tp"] == 1
    assert table["hardware"]["device"] == "cpu"
    assert {e["op"] for e in table["ops"]} == {"embedding", "attention.prefill", "attention.decode", "norm.rms",
                                               "norm.rms_add", "posenc.rope", "act.swiglu", "linear"}
    assert "# lzsolve report: tiny-llama" in (artifact / "report.md").read_text()


def test_replay_reproduces_fp32_references_inside_and_outside_the_grid(artifact):
    assert_replays_references(artifact)


def test_explain_and_db_query(artifact):
    runner = CliRunner()
    result = runner.invoke(cli, ["explain", str(artifact)])
    assert result.exit_code == 0, result.output
    assert "attention.prefill[hq=4,hkv=2,d=64,causal,fp32]" in result.output
    assert "rejected sdpa.flash" in result.output and "PLATFORM_MISMATCH" in result.output
    assert "rejected compile.rms_norm" in result.output and "EXCLUDED" in result.output
    result = runner.invoke(cli, ["db", "query", "--db", str(artifact), "--json",
                                 "SELECT status, count(*) AS n FROM records GROUP BY status ORDER BY status"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["status"] for r in rows] == ["ok", "rejected"] and all(r["n"] > 0 for r in rows)
    result = runner.invoke(cli, ["db", "query", "--db", str(artifact / "perfdb"),
                                 "SELECT kernel_id, eager_ms FROM admitted WHERE op = 'norm.rms' LIMIT 2"])
    assert result.exit_code == 0 and result.output.startswith("kernel_id")


def test_rerun_reuses_measurements(artifact, tmp_path, probes_everywhere):
    config = tiny_llama_config(tmp_path)  # the same model (its folder names it), into its own artifact
    from lzsolve.store.perfdb import PerfDB
    artifact = shutil.copytree(artifact, tmp_path / "artifact")  # the shared one stays as it was tuned
    before = list((artifact / "perfdb").glob("*.parquet"))
    rows = PerfDB(artifact / "perfdb").rows("SELECT count(*) AS n FROM records")[0]["n"]
    result = CliRunner().invoke(cli, ["tune", "--config", str(config), "--grid", "tiny", "--dtype", "fp32",
                                      "--device", "cpu", "--exclude", ",".join(("compile.*", *plugin_kernels())),
                                      "--out", str(artifact), *QUICK])  # as the shared artifact was: its records answer
    assert result.exit_code == 0, result.output
    runs = PerfDB(artifact / "perfdb").rows(  # the tunes' runs (an evaluation may have added its own)
        "SELECT run_id, count(*) FILTER (WHERE stage <> 'capability') AS measured FROM records "
        "WHERE run_id NOT LIKE 'eval-%' GROUP BY run_id ORDER BY min(ts)")
    # the re-run measured nothing and recorded no rejection again (they doubled before issue 22)
    assert len(runs) == 1 and runs[0]["measured"] > 0
    assert PerfDB(artifact / "perfdb").rows("SELECT count(*) AS n FROM records")[0]["n"] == rows
    assert list((artifact / "perfdb").glob("*.parquet")) == before
    # The device's ceilings were probed once, by the first run, in the run's dtype.
    ceilings = PerfDB(artifact / "perfdb").rows("SELECT run_id, dtype, kind, mode, per_s, probe FROM ceilings ORDER BY kind")
    assert [(c["kind"], c["mode"], c["dtype"]) for c in ceilings] == [("compute", "eager", "fp32"), ("memory", "eager", "fp32")]
    assert {c["run_id"] for c in ceilings} == {runs[0]["run_id"]} and all(c["per_s"] > 0 for c in ceilings)
    assert ceilings[0]["probe"].startswith("matmul 512x512x512 fp32")


def test_sample_time_reaches_the_measuring_runner(tmp_path, monkeypatch):
    from lzsolve.measure import worker
    budgets = []

    class Recording(worker.InProcessRunner):
        def __post_init__(self):
            budgets.append(self.budget)
            super().__post_init__()

    monkeypatch.setattr(worker, "InProcessRunner", Recording)
    result = CliRunner().invoke(cli, ["tune", "--config", str(tiny_llama_config(tmp_path)), "--grid", "tiny", "--dtype",
                                      "fp32", "--device", "cpu", "--kernels", "torch.linear", "--no-isolate",
                                      "--no-probe", "--validate", "0", "--sample-time", "0.02",
                                      "--out", str(tmp_path / "artifact")])
    assert result.exit_code == 0, result.output
    assert [(b.time_cap_s, b.warmup_s) for b in budgets] == [(0.02, 0.002)]


# runtime_loader itself is not among them: its package imports its modules (and torch) at first use,
# and the CLI's one-line errors use its torch-free safeio.
HEAVY = ("torch", "transformers", "duckdb", "pandas", "optuna", "runtime_loader.dispatcher")


@pytest.mark.parametrize("args,code", [(["--help"], 0), (["tune", "--help"], 0), (["compare", "--help"], 0),
                                       (["tune", "--dtype", "int4"], 2), (["tune", "--tp", "x"], 2),
                                       (["tune", "--grid", "huge"], 2), (["evaluate", "--random", "0"], 2)])
def test_help_and_bad_options_answer_without_torch(tmp_path, args, code):
    """The command's help and click's checks of its options import none of the heavy modules: with
    them at the top of cli.py every command paid 2.2-2.5 s and 276 MB first, `--help` included
    (0.2 s and 18 MB without, on this project's VM). A subcommand's help reads its deferred defaults
    (cli.Deferred), which may import them."""
    probe = ("import sys\nfrom lzsolve.cli import main\ntry:\n    main()\nexcept SystemExit as e:\n"
             f"    print(e.code, sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", probe, *args], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    heavy = [] if "--help" not in args or args == ["--help"] else None
    got_code, got_heavy = result.stderr.strip().splitlines()[-1].split(" ", 1)
    assert int(got_code) == code, result.stderr
    if heavy is not None:
        assert got_heavy == str(heavy), f"imported {got_heavy}"
    if code:
        assert result.stderr.startswith("error: "), result.stderr


def test_the_options_choices_are_the_runtimes():
    """cli.py names the dtypes and grids click checks without importing their modules."""
    from lzsolve import cli as cli_module
    from lzsolve.measure.grid import GRIDS
    from lzsolve.models.capture import FP8
    from runtime_loader.dtypes import DTYPES

    assert cli_module.DTYPE_CHOICES == tuple(DTYPES) and cli_module.FP8 == FP8
    assert cli_module.GRID_CHOICES == tuple(GRIDS)
    help_text = " ".join(CliRunner().invoke(cli, ["tune", "--help"]).output.split())  # deferred defaults read
    assert "[default: 0.5; x>=0.001]" in help_text and "stays above 2%" in help_text


def test_plan_llama3_70b_tp8(tmp_path):
    result = CliRunner().invoke(cli, ["plan", "--model", "llama3-70b", "--tp", "8", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "linear[k=8192,n=16032,bf16]" in result.output and "lm_head" in result.output
    assert "sdpa.efficient" in result.output and "FEATURE_UNSUPPORTED:gqa" in result.output


def test_plan_escapes_the_name_a_workload_gives_its_model(tmp_path):
    """A workload file names its model: "\x1b[2J\nx" printed a raw newline in the plan's header (click
    strips the escape sequence where the output is no terminal, not the newline)."""
    call = {"signature": {"op": "norm.rms", "static": {"hidden": 64}, "flags": [], "dtype": "fp32"},
            "dims": {"tokens": 12}, "count": 5}
    path = tmp_path / "wl.json"
    path.write_text(json.dumps({"format": "lzsolve-workload", "version": 1, "name": "\x1b[2J\nx", "calls": [call]}))
    result = CliRunner().invoke(cli, ["plan", "--workload", str(path), "--device", "cpu", "--grid", "tiny"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("\\x1b[2J\\nx: recorded workload "), result.output


@pytest.mark.parametrize("args,needle", [
    (["tune", "--model", "llama9"], "known: llama3-8b, llama3-70b"),
    (["tune", "--config", "{config}"], "not valid JSON"),
    (["tune", "--model", "llama3-70b", "--tp", "3"], "--tp 3 cannot shard llama3-70b"),
    (["tune", "--model", "llama3-70b", "--tp", "0"], "'--tp': 0 is not in the range x>=1"),
    # nan passed FloatRange and turned the regression gate off; a count that no run ends
    (["tune", "--model", "llama3-8b", "--max-regression", "nan"], "'nan' is not a finite number"),
    (["db", "query", "SELECT 1", "--timeout", "inf"], "'inf' is not a finite number"),
    (["tune", "--model", "llama3-8b", "--validate", "10000000000"], "is not in the range 0<=x<=10000"),
    (["evaluate", "--json", "{file}/eval.json"], "eval.json: not a file in an existing folder"),
    (["tune", "--model", "llama3-8b", "--out", "{file}/sub"], "cannot write to --out"),
    (["tune", "--model", "llama3-8b", "--dtype", "int4"], "'int4' is not one of"),
    (["tune"], "pass exactly one of --model NAME, --config PATH or --workload FILE"),
    (["tune", "--model", "llama3-8b", "--kernels", "nope.*"], "matches no kernel"),
    # an empty --out wrote to the default folder, an empty --kernels was no filter at all
    (["tune", "--model", "llama3-8b", "--out", ""], "'--out': an empty path; name a folder"),
    (["tune", "--model", "llama3-8b", "--kernels", ",,,"], "',,,' names no kernel pattern"),
    (["plan", "--model", "llama3-8b", "--exclude", "sdpa.*", "--exclude", ""], "'' names no kernel pattern"),
    (["plan", "--model", "llama3-8b", "--device", "tpu"], "--device"),
    (["db", "query", "SELECT 1"], "no artifact under ./artifacts"),
    (["explain"], "no artifact under ./artifacts"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, needle):
    config = tmp_path / "bad.json"
    config.write_text("{oops")
    blocker = tmp_path / "afile"
    blocker.write_text("")
    args = [a.format(config=config, file=blocker) for a in args]
    before = sorted(p.name for p in tmp_path.iterdir())
    result = run_cli(*args, cwd=tmp_path)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "nothing half-written"


def test_a_tune_into_another_models_artifact_is_refused(tmp_path):
    """It replaced that artifact's dispatch.json and added its records to that artifact's PerfDB."""
    other = Path(write(tmp_path / "other", table()))  # model "test", tp 1, fp32
    before = sorted(p.name for p in other.iterdir())
    result = run_cli("tune", "--model", "llama3-8b", "--device", "cpu", "--out", str(other), cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --out ") and "holds the artifact of 'test' (tp 1, 'fp32'), " \
        "not of this tune's llama3-8b (tp 1, bf16); pass another --out, or remove" in lines[0], result.stderr
    assert sorted(p.name for p in other.iterdir()) == before


def processes_in(folder: Path) -> list[str]:
    """The processes working in `folder` (a command's, and its workers', which start there)."""
    found = []
    for cwd in Path("/proc").glob("[0-9]*/cwd"):
        try:
            if os.readlink(cwd) == str(folder):
                found.append(cwd.parent.name)
        except OSError:  # gone meanwhile, a zombie, or not ours to read
            pass
    return found


def test_the_command_leaves_quickly_with_its_exit_handlers_run_and_no_worker_behind(tmp_path):
    """cli.run skips the interpreter's teardown (os._exit), after the exit handlers: a handler a
    library registered has run (Ray's, multiprocessing's), the summary on stdout is whole, the exit
    code is the command's, and no process is left of the run's."""
    (tmp_path / "exit_probe.py").write_text(
        "import atexit, pathlib, multiprocessing\n"
        "if multiprocessing.parent_process() is None:  # the command's process, not its workers\n"
        "    atexit.register(lambda: pathlib.Path('handler-ran').write_text('yes'))\n")
    config = tiny_llama_config(tmp_path)
    out = tmp_path / "out"
    result = run_cli("tune", "--config", str(config), "--grid", "tiny", "--dtype", "fp32", "--device", "cpu",
                     "--kernels", "eager.*", "--no-probe", "--validate", "0", "--out", str(out), "--json", *QUICK,
                     "--plugin", "exit_probe", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "ok"
    assert (tmp_path / "handler-ran").read_text() == "yes"
    assert not processes_in(tmp_path), "processes left behind"


def test_a_tune_stopped_by_bad_input_leaves_no_worker_behind(tmp_path):
    """The measuring worker starts before the planning (WorkerRunner.prestart); input the planning
    finds bad ends the command, and the worker with it, whatever it was still importing."""
    import multiprocessing
    config = tiny_llama_config(tmp_path)
    args = ["tune", "--config", str(config), "--grid", "tiny", "--dtype", "fp32", "--device", "cpu",
            "--mode", "graph", "--out", str(tmp_path / "out")]
    result = run_cli(*args, cwd=tmp_path)
    assert result.returncode == 2 and "--mode graph needs a CUDA device" in result.stderr, result.stderr
    assert not processes_in(tmp_path), "processes left behind"
    before = set(multiprocessing.active_children())
    assert CliRunner().invoke(cli, args).exit_code != 0
    assert set(multiprocessing.active_children()) <= before, "in-process too (no exit handlers to count on)"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_device_without_gpu(tmp_path):
    result = run_cli("plan", "--model", "llama3-8b", "--device", "cuda", cwd=tmp_path)
    assert result.returncode != 0 and "no CUDA device is available" in result.stderr


def test_runtime_loader_needs_no_solver_stack(artifact):
    """runtime_loader imports and replays with lzsolve, pandas, pyarrow, duckdb and optuna unimportable."""
    code = textwrap.dedent(f"""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] in {{'lzsolve', 'pandas', 'pyarrow', 'duckdb', 'optuna'}}:
                    raise ImportError('blocked ' + name)
        sys.meta_path.insert(0, Block())
        import torch, runtime_loader
        d = runtime_loader.load({str(artifact)!r}, strict=True)
        x = torch.randn(4, 128)
        print(d.rms_norm(x, torch.ones(128), 1e-5).shape)
        assert not [m for m in sys.modules if m.split('.')[0] in {{'lzsolve', 'pandas', 'pyarrow', 'duckdb', 'optuna'}}]
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(runtime_loader.__file__).parents[1])}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "torch.Size([4, 128])" in result.stdout
