"""The measurement cache (Session's cache, tune --cache-dir): what one tune measured answers any later
tune on the same machine, whatever model or artifact asked, and never across hardware, kernel
versions or a shorter sampling that stayed noisy; tuners filling it at once neither lose nor duplicate
records."""
import dataclasses
import datetime as dt
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from lzsolve.measure.harness import Budget
from lzsolve.pipeline import GridConfig, ModelSource
from lzsolve.store.perfdb import PerfDB, default_cache

from .tables import QUICK_CPU, tuned
from .test_workload import RMS_CALL, write_workload

ROOT = Path(__file__).resolve().parent.parent
EAGER = GridConfig(grid="tiny", kernels=("eager.*", "torch.*"))  # seconds: two kernels a norm


def workload(path: Path, *hiddens: int) -> Path:
    """A recorded workload of RMSNorms of these widths (a model's, as far as a tune can tell)."""
    calls = [{**RMS_CALL, "signature": {**RMS_CALL["signature"], "static": {"hidden": h}}, "dims": {"tokens": t}}
             for h in hiddens for t in (1, 8)]
    return write_workload(path, calls)


def rows(folder: Path, where: str = "true") -> list[dict]:
    return PerfDB(folder).rows(f"SELECT * FROM records WHERE stage <> 'capability' AND {where} ORDER BY signature")


def cached_tune(tmp_path, name: str, hiddens, cache: Path | None, **measure):
    config = dataclasses.replace(QUICK_CPU, cache=cache is not None, cache_dir=cache, **measure)
    return tuned(ModelSource(workload=workload(tmp_path / f"{name}.json", *hiddens)), tmp_path / name, EAGER, config)


def cached_run(tmp_path, name: str, grid: GridConfig, search=None, hiddens=(64,)):
    """A tune in this process of RMSNorms of these widths with the cache tmp_path/cache and the
    repository's search settings unless told: the Tune itself, whose records and jit_named say
    what the packer is given."""
    from lzsolve.pipeline import OutputConfig, SearchConfig, Tune, TuneConfig

    from .tables import SERVING
    measure = dataclasses.replace(QUICK_CPU, cache=True, cache_dir=tmp_path / "cache")
    run = Tune(TuneConfig(ModelSource(workload=workload(tmp_path / f"{name}.json", *hiddens)), grid, measure,
                          search or SearchConfig(), SERVING, OutputConfig(out=tmp_path / name)))
    assert run.run().status == "ok"
    return run


def test_a_second_model_reuses_what_the_first_measured_and_says_where_from(tmp_path):
    cache = tmp_path / "cache"
    first = cached_tune(tmp_path, "first", (64, 96), cache)
    assert first.summary["cached"] == 0 and first.summary["cache"] == str(cache)
    measured = rows(cache)
    assert {r["signature"] for r in measured} == {"norm.rms[hidden=64,fp32]", "norm.rms[hidden=96,fp32]"}
    assert len(measured) == first.summary["measured"] and all(r["cached_from"] is None for r in measured)

    second = cached_tune(tmp_path, "second", (64, 128), cache)  # another model: one signature in common
    shared = [r for r in measured if r["signature"] == "norm.rms[hidden=64,fp32]"]
    assert second.summary["cached"] == len(shared) > 0, second.summary
    assert second.summary["measured"] == len(rows(cache, "signature = 'norm.rms[hidden=128,fp32]'"))
    copies = rows(tmp_path / "second" / "perfdb", "cached_from IS NOT NULL")
    assert {(r["run_id"], r["kernel_id"], r["dims"]) for r in copies} == {
        (r["run_id"], r["kernel_id"], r["dims"]) for r in shared}, "copied into the artifact, provenance kept"
    assert {r["cached_from"] for r in copies} == {str(cache)}
    assert len(rows(cache)) == len(measured) + second.summary["measured"], "nothing measured twice"
    entry = next(e for e in json.loads((tmp_path / "second" / "dispatch.json").read_text())["ops"]
                 if e["signature"] == "norm.rms[hidden=64,fp32]")
    assert entry["grid_regret"] is not None, "the table is solved from the copies"


def test_no_cache_measures_everything_and_leaves_the_cache_alone(tmp_path):
    cache = tmp_path / "cache"
    cached_tune(tmp_path, "first", (64,), cache)
    before = sorted(p.name for p in cache.iterdir())
    alone = cached_tune(tmp_path, "alone", (64,), None)
    assert alone.summary["cached"] == 0 and alone.summary["reused"] == 0 and alone.summary["cache"] is None
    assert alone.summary["measured"] == len(rows(cache)) and sorted(p.name for p in cache.iterdir()) == before


def test_records_of_other_hardware_kernels_or_a_shorter_sampling_are_never_reused(tmp_path):
    cache = tmp_path / "cache"
    cached_tune(tmp_path, "first", (64,), cache)
    original = rows(cache)
    assert all(r["host_ms"] > 0 for r in original if r["eager_ms"] is not None)
    # the same records, as measured on another machine, by another version of each kernel, sampled
    # for a tenth of the time and still noisy, or by a version that kept no host time beside an eager
    # one (an eager table's solve needs it): each kind alone in a cache of its own
    changes = {"hardware": {"hw_slug": "cuda-nvidia-h100-sm90-torch2.11.0"},
               "version": {"kernel_version": "0.0.0+src.00000000"},
               "sampling": {"sample_time": QUICK_CPU.sample_time / 10, "eager_spread": Budget.target_spread * 5},
               "no host time": {"host_ms": None}}
    for name, change in changes.items():
        other = PerfDB(tmp_path / f"cache-{name}")
        other.append([{**r, **change} for r in original], "elsewhere")
        result = cached_tune(tmp_path, f"after-{name}", (64,), other.path)
        assert result.summary["cached"] == 0 and result.summary["measured"] == len(original), (name, result.summary)
    # and a longer sampling is as good: reused
    longer = PerfDB(tmp_path / "cache-longer")
    longer.append([{**r, "sample_time": QUICK_CPU.sample_time * 10} for r in original], "elsewhere")
    result = cached_tune(tmp_path, "after-longer", (64,), longer.path)
    assert result.summary["cached"] == len(original) and result.summary["measured"] == 0


def test_a_shorter_sampling_that_reached_the_target_spread_is_reused(tmp_path):
    """A timing that stopped at the target spread (tune --quick's, say) is what a longer sampling
    would have stopped at too: reused; one that sampled for its whole shorter cap is measured again."""
    cache = tmp_path / "cache"
    cached_tune(tmp_path, "first", (64,), cache)
    original = rows(cache)
    assert len(original) >= 2
    shorter = PerfDB(tmp_path / "cache-shorter")
    converged = {(r["kernel_id"], r["dims"]) for r in original[::2]}
    shorter.append([{**r, "sample_time": QUICK_CPU.sample_time / 10, "eager_spread": Budget.target_spread / 2
                     if (r["kernel_id"], r["dims"]) in converged else Budget.target_spread * 5}
                    for r in original], "elsewhere")
    result = cached_tune(tmp_path, "after-shorter", (64,), shorter.path)
    reused = rows(tmp_path / "after-shorter" / "perfdb", "cached_from IS NOT NULL")
    assert {(r["kernel_id"], r["dims"]) for r in reused} == converged
    assert result.summary["measured"] == len(original) - len(reused), result.summary


TUNER = """
import sys
from pathlib import Path
from lzsolve.pipeline import GridConfig, MeasureConfig, ModelSource, OutputConfig, Tune, TuneConfig, ValidateConfig
config = TuneConfig(ModelSource(workload=sys.argv[1]), GridConfig(grid="tiny", kernels=("eager.*", "torch.*")),
                    MeasureConfig(device="cpu", isolate=False, sample_time=0.05, cache_dir=sys.argv[3]),
                    validate=ValidateConfig(probe=False, shapes=0), output=OutputConfig(out=sys.argv[2]))
print(Tune(config).run().summary["measured"])
"""


def test_two_tuners_filling_the_cache_at_once_lose_nothing_and_duplicate_nothing(tmp_path):
    """Two tunes of two models sharing three signatures, started together into one cache (each into its
    own artifact): each shared signature is measured once, by whichever tuner took its lock first,
    and the other reuses it; every record of both artifacts is in the cache once."""
    cache = tmp_path / "cache"
    loads = [workload(tmp_path / f"{n}.json", *hiddens) for n, hiddens in (("a", (64, 96, 128, 160)),
                                                                            ("b", (64, 96, 128, 192)))]
    tuners = [subprocess.Popen([sys.executable, "-c", TUNER, str(w), str(tmp_path / w.stem), str(cache)], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in loads]
    outputs = [t.communicate(timeout=600) for t in tuners]
    assert all(t.returncode == 0 for t in tuners), [err[-2000:] for _, err in outputs]
    in_cache = rows(cache)
    keys = [(r["signature"], r["kernel_id"], r["dims"]) for r in in_cache]
    assert len(keys) == len(set(keys)), "a record measured twice"
    assert {r["signature"] for r in in_cache} == {f"norm.rms[hidden={h},fp32]" for h in (64, 96, 128, 160, 192)}
    assert sum(int(out.strip().splitlines()[-1]) for out, _ in outputs) == len(in_cache), "each measurement kept once"
    for name in ("a", "b"):
        artifact = rows(tmp_path / name / "perfdb")
        assert {(r["signature"], r["kernel_id"], r["dims"]) for r in artifact} <= set(keys)
        assert len({r["signature"] for r in artifact}) == 4, "every signature of its model, measured or copied"


def test_the_default_cache_is_the_users_unless_told(monkeypatch, tmp_path):
    monkeypatch.setenv("LZSOLVE_CACHE", str(tmp_path / "shared"))
    assert default_cache() == tmp_path / "shared"
    monkeypatch.setenv("LZSOLVE_CACHE", "off")
    assert default_cache() is None
    monkeypatch.delenv("LZSOLVE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache() == tmp_path / "xdg" / "lzsolve" / "perfdb"


def test_a_cache_that_cannot_be_written_is_left_and_the_tune_goes_on(tmp_path):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache's folder would be")
    result = cached_tune(tmp_path, "first", (64,), blocked)
    assert result.status == "ok" and result.summary["cache"] is None and result.summary["measured"] > 0


@pytest.mark.parametrize("args", [["--no-cache"], ["--cache-dir", "{cache}"]])
def test_the_command_takes_the_cache_options(tmp_path, args):
    from click.testing import CliRunner

    from lzsolve.cli import cli

    path = workload(tmp_path / "w.json", 64)
    args = [a.format(cache=tmp_path / "cache") for a in args]
    result = CliRunner().invoke(cli, ["tune", "--workload", str(path), "--grid", "tiny", "--device", "cpu",
                                      "--kernels", "eager.*", "--no-isolate", "--no-probe", "--validate", "0",
                                      "--sample-time", "0.05", "--out", str(tmp_path / "out"), "--json", *args],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["cache"] == (str(tmp_path / "cache") if "--cache-dir" in args else None)
    assert (tmp_path / "cache").is_dir() == ("--cache-dir" in args)


PLAIN, LABELLED = "attention.prefill[hq=2,hkv=1,d=16,causal,fp32]", "attention.prefill[hq=2,hkv=1,d=16,causal,qk_norm,fp32]"


def attention_workload(path: Path, *flag_sets: tuple[str, ...]) -> Path:
    """Causal prefills at two lengths, once per flag set (("qk_norm",): Qwen3's; (): Llama's)."""
    signature = {"op": "attention.prefill", "static": {"hq": 2, "hkv": 1, "d": 16}, "dtype": "fp32"}
    return write_workload(path, [{"signature": {**signature, "flags": ["causal", *flags]},
                                  "dims": {"batch": 1, "seq": seq}, "count": 1}
                                 for flags in flag_sets for seq in (8, 24)])


def test_signatures_that_differ_only_in_a_label_are_timed_once(tmp_path):
    """Attention with and without qk_norm (Llama 4's layers; Qwen3's and Llama's at equal heads)
    computes the same: each kernel is timed once at each shape, and the other signature's record is a
    copy naming the signature it was timed under; both get their trees. A later tune of the
    labelled signature alone, into another artifact, takes every timing from the cache."""
    cache = tmp_path / "cache"
    config = dataclasses.replace(QUICK_CPU, cache=True, cache_dir=cache)
    grid = GridConfig(grid="tiny", kernels=("sdpa.*",))
    both = tuned(ModelSource(workload=attention_workload(tmp_path / "both.json", (), ("qk_norm",))),
                 tmp_path / "both", grid, config)
    timed = {sig: {(r["kernel_id"], r["dims"]): r for r in rows(tmp_path / "both" / "perfdb", f"signature = '{sig}'")}
             for sig in (PLAIN, LABELLED)}
    assert len(timed[PLAIN]) >= 4 and timed[PLAIN].keys() == timed[LABELLED].keys()
    for key, first in timed[PLAIN].items():
        original, copy = (first, timed[LABELLED][key]) if timed[LABELLED][key]["timed_as"] else (timed[LABELLED][key], first)
        assert original["timed_as"] is None and copy["timed_as"] == original["signature"], key
        assert (copy["eager_ms"], copy["seed"], copy["run_id"]) == (original["eager_ms"], original["seed"], original["run_id"])
    assert both.summary["measured"] == both.summary["shared"] == len(timed[PLAIN]), both.summary
    assert len(rows(cache)) == len(timed[PLAIN]), "the cache holds each timing once"
    entries = {e["signature"]: e for e in json.loads((tmp_path / "both" / "dispatch.json").read_text())["ops"]}
    assert entries[PLAIN]["grid_regret"] is not None and entries[LABELLED]["grid_regret"] is not None

    labelled = tuned(ModelSource(workload=attention_workload(tmp_path / "one.json", ("qk_norm",))),
                     tmp_path / "one", grid, config)
    assert labelled.summary["measured"] == 0 and labelled.summary["cached"] == len(timed[PLAIN]), labelled.summary


def test_what_a_kernel_compiled_comes_with_its_records_to_another_folder(tmp_path, monkeypatch):
    """A record reused from the cache names a build made in another run's folder: the cache keeps
    the files it names (jit_store), a later run brings those of its kernels into its own folder
    before it measures, so it builds nothing again and its artifact can pack them."""
    from lzsolve.store.artifact import JIT_WORK, jit_files
    from lzsolve.store.jit_store import store_root
    from runtime_loader import jit

    from .nvcc_kernels import MODULE

    for variable in jit.JIT_CACHES.values():  # each tune points them at its folder, process-wide
        monkeypatch.setenv(variable, "")
    cache = tmp_path / "cache"
    built = GridConfig(grid="tiny", kernels=("built.*",), plugins=("tests.nvcc_kernels",))
    module = f"flashinfer/{MODULE.as_posix()}"

    first = cached_run(tmp_path, "first", built)
    builds = tmp_path / "first" / JIT_WORK / "flashinfer" / "builds.log"
    assert builds.read_text().count("\n") == 1
    hw_slug = rows(cache)[0]["hw_slug"]
    assert (store_root(cache, hw_slug) / module).is_file(), "the cache keeps the module its record names"
    assert not (store_root(cache, hw_slug) / "flashinfer" / "builds.log").exists(), "only what a restore needs"
    assert first.jit_named == []
    # a later timing of each workload by a process that found the module built names no file (on a GPU
    # the builders build, the measuring worker times): the cache answers with it, and still brings the module
    naming = [r for r in rows(cache) if r["jit_files"] not in (None, "[]")]
    assert naming
    PerfDB(cache).append([{**r, "jit_files": None, "ts": r["ts"] + dt.timedelta(seconds=1)} for r in naming], "later")

    second = cached_run(tmp_path, "second", built, hiddens=(64, 128))  # a signature of its own: a first call here
    assert (tmp_path / "second" / JIT_WORK / module).is_file()
    assert not (tmp_path / "second" / JIT_WORK / "flashinfer" / "builds.log").exists(), "nothing built again"
    # an artifact whose table chose the kernel packs its module (which kernel wins a tiny CPU race is noise)
    table = {"kernels": {"built.rms_norm": {"jit_caches": ["flashinfer"]}}}
    files = jit_files(table, second.records + second.compiled + second.jit_named)
    assert jit.pack(tmp_path / "second" / JIT_WORK, ["flashinfer"], tmp_path / "caches.tar", files) == ["flashinfer"]
    with tarfile.open(tmp_path / "caches.tar") as tar:
        assert tar.getnames() == [module]


def test_a_searched_winner_names_and_brings_what_its_trial_compiled(tmp_path, monkeypatch):
    """A searched configuration compiles in its trial; its grid calls, in the same process, compile
    nothing, yet its records name its trial's files (tasks.first_call_fields), so the cache keeps them
    and a later run, whose search continues the study and runs no trial, brings them for the winner."""
    from lzsolve.pipeline import SearchConfig
    from lzsolve.store.artifact import JIT_WORK, jit_files
    from runtime_loader import jit

    from .jitted_kernels import SPACE

    for variable in jit.JIT_CACHES.values():  # each tune points them at its folder, process-wide
        monkeypatch.setenv(variable, "")
    (tmp_path / "spaces").mkdir()
    (tmp_path / "spaces" / "jitted.rms_norm.yaml").write_text(SPACE)
    grid = GridConfig(grid="tiny", kernels=("jitted.*",), plugins=("tests.jitted_kernels",))
    search = SearchConfig(spaces=tmp_path / "spaces")
    winner, entry = "jitted.rms_norm[rows=64]", "triton/jitted/rows-64.bin"

    first = cached_run(tmp_path, "first", grid, search)
    named = [json.loads(r["jit_files"]) for r in first.records if r["kernel_id"] == winner and r.get("jit_files")]
    assert named and all(entry in files for files in named), "the winner's grid records name its trial's entry"
    second = cached_run(tmp_path, "second", grid, search)
    assert second.searched.run == 0, "the study continued from the cache: no trial"
    assert (tmp_path / "second" / JIT_WORK / entry).is_file()
    kept = next((tmp_path / "cache" / "jit").glob("*/triton/jitted/compiles.log")).read_text()
    assert (tmp_path / "second" / JIT_WORK / "triton" / "jitted" / "compiles.log").read_text() == kept, \
        "the log came with the entries: nothing compiled again"
    files = jit_files({"kernels": {winner: {"jit_caches": ["triton"]}}}, second.records + second.compiled + second.jit_named)
    assert jit.pack(tmp_path / "second" / JIT_WORK, ["triton"], tmp_path / "caches.tar", files) == ["triton"]
    with tarfile.open(tmp_path / "caches.tar") as tar:
        assert entry in tar.getnames(), "an artifact choosing the winner packs its entry"
