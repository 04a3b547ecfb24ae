"""Configuration search: spaces are checked against their family, studies prune configs that
fail parity, winners become candidates at every bucket, and a re-run continues the studies."""
import builtins
import dataclasses
import errno
import json
import math
import os
import time
from pathlib import Path

import optuna
import pytest
import torch
from click.testing import CliRunner
from optuna.storages.journal import JournalFileBackend

import tests.tunable_kernels as demo
from lzsolve.cli import EXIT_WRITE_FAILED, cli
from lzsolve.errors import LzError
from lzsolve.measure.grid import GRIDS, Grid
from lzsolve.measure.search import (
    FULL_BUDGET,
    NOISE,
    SMART_BUDGET,
    STORAGE_NAME,
    bucket_order,
    grid_index,
    load_space,
    load_spaces,
    near,
    search,
    stale_trials,
)
from lzsolve.measure.tasks import ParityTask
from lzsolve.measure.tuner import make_plan
from lzsolve.models.capture import capture
from lzsolve.store.perfdb import PerfDB, dims_key
from tests.test_cli import TINY_LLAMA
from tests.test_hostile import run_main


def write_space(folder, text=demo.SPACE, name="demo.rms_norm.yaml"):
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(text)
    return folder / name


def test_repo_spaces_load():
    """The tune's default folder is the repository's search_spaces/, and every space there loads:
    it names a family and stays inside its domain."""
    spaces = load_spaces()
    shipped = {path.name.removesuffix(".yaml") for path in (Path(__file__).parent.parent / "search_spaces").glob("*.yaml")}
    assert shipped and set(spaces) == shipped
    assert all(space.trials >= 1 for space in spaces.values())


@pytest.mark.parametrize("text,message", [
    ("kernel: nope.kernel\ntrials: 3\nparams: {}\n", "is not a tunable kernel"),
    ("kernel: demo.rms_norm\ntrials: 3\nparams: {exact: [1], rows: [1]}\n", "in that order"),
    ("kernel: demo.rms_norm\ntrials: 3\nparams: {rows: [1, 3], exact: [1]}\n", "must be a list of values from"),
    ("kernel: demo.rms_norm\ntrials: 3\nparams: {rows: [2], exact: [1]}\n", "must contain the default"),
    ("kernel: demo.rms_norm\ntrials: 0\nparams: {rows: [1], exact: [1]}\n", "trials must be a positive integer"),
    ("kernel: demo.rms_norm\ntrials: 3\nparams: {rows: [1], exact: [1]}\nstarts: [{rows: 2, exact: 1}]\n",
     "starts must be a list of configurations"),
    ("kernel: demo.rms_norm\ntrials: 3\nparams: {rows: [1], exact: [1]}\nstarts: [{rows: 1}]\n",
     "starts must be a list of configurations"),
    ("kernel: [\n", "cannot read search space"),
    ("just text\n", "needs 'kernel', 'trials' and 'params'"),
])
def test_bad_spaces_are_refused(tmp_path, text, message):
    with pytest.raises(LzError, match=message):
        load_space(write_space(tmp_path / "spaces", text))


def tune(tmp_path, *extra, space=demo.SPACE, out="out", config=TINY_LLAMA, name="tiny-llama"):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(config))
    spaces = write_space(tmp_path / "spaces", space).parent
    result = CliRunner().invoke(cli, [
        "tune", "--config", str(path), "--grid", "tiny", "--dtype", "fp32", "--device", "cpu", "--no-isolate",
        "--plugin", "tests.tunable_kernels", "--spaces", str(spaces), "--kernels", "demo.*",
        "--out", str(tmp_path / out), *extra])
    assert result.exit_code == 0, result.output
    return result


def journal(path):
    return optuna.storages.JournalStorage(JournalFileBackend(str(path)))


def studies(tmp_path):
    storage = journal(tmp_path / "out" / STORAGE_NAME)
    return {s.study_name: optuna.load_study(study_name=s.study_name, storage=storage)
            for s in optuna.get_all_study_summaries(storage)}


def test_search_prunes_wrong_configs_and_adds_winners_everywhere(tmp_path):
    tune(tmp_path, "--full-search")  # every study spends its whole budget
    found = studies(tmp_path)
    assert len(found) == 2, "one study per bucket of the one norm.rms signature (tiny grid: tokens 1 and 8)"
    for name, study in found.items():
        assert name.startswith("norm.rms[hidden=256,fp32]|") and "|demo.rms_norm@" in name
        assert len(study.trials) == 6
        assert study.trials[0].params == demo.DEMO.default, "the default is the first trial, the baseline"
        pruned = [t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED]
        assert all(t.params["exact"] == 0 and t.user_attrs["reason"].startswith("PARITY_FAILED") for t in pruned)
        assert all(t.params["exact"] == 1 for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE)
    rows = PerfDB(tmp_path / "out" / "perfdb").rows(
        "SELECT kernel_id, dims, status, phase FROM records WHERE kernel_id LIKE 'demo.rms_norm[%'")
    searched = {r["kernel_id"] for r in rows}
    assert searched, "a searched configuration that beat the default joined the candidates"
    assert all(r["status"] == "ok" and "exact=1" in r["kernel_id"] for r in rows), "never a wrong config"
    for kernel_id in searched:  # timed at every bucket, not only where it won (probes may add more)
        assert {r["dims"] for r in rows if r["kernel_id"] == kernel_id and r["phase"] == "grid"} == {dims_key({"tokens": 1}), dims_key({"tokens": 8})}


def test_another_models_tune_continues_the_studies_in_the_measurement_cache(tmp_path):
    """The studies live in the measurement cache, named by what decides their trials' times: a tune
    of another model with the same norm, into another folder, runs none of their trials again and
    finds the same winners; a model whose norm is another width searches its own. --no-cache keeps
    the studies in the artifact."""
    cache = tmp_path / "cache"
    first = json.loads(tune(tmp_path, "--trials", "4", "--cache-dir", str(cache), "--json").stdout)
    assert first["search"]["trials_run"] > 0 and (cache / STORAGE_NAME).exists()
    assert not (tmp_path / "out" / STORAGE_NAME).exists()
    deeper = {**TINY_LLAMA, "num_hidden_layers": TINY_LLAMA["num_hidden_layers"] + 1}
    second = json.loads(tune(tmp_path, "--trials", "4", "--cache-dir", str(cache), "--json", out="deeper",
                             config=deeper, name="deeper-llama").stdout)
    assert second["search"]["trials_run"] == 0, second["search"]
    winners = {out: {r["kernel_id"] for r in PerfDB(tmp_path / out / "perfdb").rows(
        "SELECT kernel_id FROM records WHERE kernel_id LIKE 'demo.rms_norm[%'")} for out in ("out", "deeper")}
    assert winners["out"] == winners["deeper"]
    wider = {**TINY_LLAMA, "hidden_size": 2 * TINY_LLAMA["hidden_size"]}
    third = json.loads(tune(tmp_path, "--trials", "4", "--cache-dir", str(cache), "--json", out="wider",
                            config=wider, name="wider-llama").stdout)
    assert third["search"]["trials_run"] > 0, "another signature: studies of its own"
    tune(tmp_path, "--trials", "4", "--no-cache", out="alone")
    assert (tmp_path / "alone" / STORAGE_NAME).exists()


def test_every_study_tries_the_spaces_starts_right_after_the_default(tmp_path):
    """A search of a few trials missed the tiles that won by hand on the H100 (benchmark log §16.2.1):
    a space names them in `starts`, and every study tries them first."""
    start = {"rows": 64, "exact": 1}
    tune(tmp_path, "--trials", "3", "--full-search", space=demo.SPACE + "starts:\n  - {rows: 64, exact: 1}\n")
    for study in studies(tmp_path).values():
        assert [t.params for t in study.trials[:2]] == [demo.DEMO.default, start]


def test_rerun_continues_the_studies_and_trials_zero_skips_search(tmp_path):
    tune(tmp_path, "--trials", "3", "--full-search")
    assert [len(s.trials) for s in studies(tmp_path).values()] == [3, 3]
    tune(tmp_path, "--trials", "5", "--full-search")
    assert [len(s.trials) for s in studies(tmp_path).values()] == [5, 5], "continued, not restarted"
    result = tune(tmp_path, "--trials", "0", "--full-search")
    assert "searching" not in result.output
    assert [len(s.trials) for s in studies(tmp_path).values()] == [5, 5]


def test_an_edited_space_starts_studies_of_its_own(tmp_path):
    """optuna cannot continue a study whose parameters took other values: the tune used to raise
    there (a family given a new parameter, on the H100) instead of searching the new space."""
    tune(tmp_path, "--trials", "2", "--full-search")
    tune(tmp_path, "--trials", "2", "--full-search", space=demo.SPACE.replace("rows: [1, 2, 4, 64, 1024]", "rows: [1, 4, 64]"))
    assert [len(s.trials) for s in studies(tmp_path).values()] == [2, 2, 2, 2], "two buckets, two spaces"


class ShortWrite:
    """A journal file on a full disk: the bytes that fit are written, then flushing fails with
    ENOSPC (what a 64 KiB tmpfs does to optuna's JournalFileBackend, measured)."""

    def __init__(self, f):
        self.f = f

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def write(self, data):
        self.f.write(data[:len(data) // 2])
        self.f.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_under_the_journal_is_one_line_exit_4_and_a_rerun_continues(tmp_path, capsys, monkeypatch):
    """The disk fills half way through a trial's line in the studies' journal: one `error:` line
    naming the journal, exit 4, no traceback (optuna raises its own AssertionError while it ends the
    trial, ours as its context). The re-run drops the cut line and continues the studies."""
    tune(tmp_path, "--trials", "0")  # the artifact's folder, nothing searched yet
    path = tmp_path / "out" / STORAGE_NAME
    real_open, appends = builtins.open, []

    def open_on_a_full_disk(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if "a" in mode and str(file) == str(path):
            appends.append(mode)
            if len(appends) > 12:  # the first study's second or third trial
                return ShortWrite(f)
        return f

    monkeypatch.setattr(builtins, "open", open_on_a_full_disk)
    code, err = run_main(
        "tune", "--config", str(tmp_path / "tiny-llama.json"), "--grid", "tiny", "--dtype", "fp32", "--device", "cpu",
        "--no-isolate", "--plugin", "tests.tunable_kernels", "--spaces", str(tmp_path / "spaces"),
        "--kernels", "demo.*", "--out", str(tmp_path / "out"), "--trials", "3", "--full-search",
        cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch)
    monkeypatch.undo()
    assert len(appends) > 12 and code == EXIT_WRITE_FAILED, (code, err)
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        f"error: no space left on device writing {path}; measured records are kept, re-run to continue"], err
    assert "Traceback" not in err and not path.read_bytes().endswith(b"\n"), "a line cut short"
    state = optuna.trial.TrialState
    kept = sum(len(s.get_trials(states=(state.COMPLETE, state.PRUNED))) for s in studies(tmp_path).values())
    assert 0 < kept < 6

    result = tune(tmp_path, "--trials", "3", "--full-search")
    assert f"search: {6 - kept} of 6 budgeted trials run" in result.output, "continued, not restarted"
    assert [len(s.get_trials(states=(state.COMPLETE, state.PRUNED))) for s in studies(tmp_path).values()] == [3, 3]
    assert path.read_bytes().endswith(b"\n")


def test_tune_reports_trials_run_and_why_studies_stopped(tmp_path):
    summary = json.loads(tune(tmp_path, "--json", "--no-probe", "--validate", "0").stdout)
    search = summary["search"]
    assert search["trials_budgeted"] == 12, "6 trials at each of the tiny grid's two buckets"
    assert 0 < search["trials_run"] <= 12
    assert sum(search["studies_stopped_by"].values()) == 2
    report = (tmp_path / "out" / "report.md").read_text()
    assert f"- search: {search['trials_run']} of 12 budgeted trials run" in report


# The smarter budget (patience, neighbours' winners as seeds, skipped buckets) against the full one,
# on a deterministic fake runner: no timing noise, so any difference is the budget's.
TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]


class FakeRunner:
    """Parity fails the wrong configs (exact=0); a demo config costs more the further its `rows` is
    from the bucket's tokens; every other kernel costs `other_ms(tokens)`."""
    timer = "fake"

    def __init__(self, other_ms=lambda tokens: 100.0):
        self.other_ms = other_ms

    def cost(self, kernel_id: str, dims: dict) -> float:
        if not kernel_id.startswith("demo.rms_norm"):
            return self.other_ms(dims["tokens"])
        rows = int(kernel_id.split("rows=")[1].split(",")[0].rstrip("]")) if "rows=" in kernel_id else 1
        return 1.0 + abs(math.log2(rows) - math.log2(dims["tokens"])) * 0.2

    def run(self, task):
        if isinstance(task, ParityTask):
            return {"reason_code": "PARITY_FAILED", "reason_message": "wrong"} if "exact=0" in task.kernel_id else {}
        return {"per_kernel": {k: {f"{m}_ms": self.cost(k, task.dims) for m in task.modes} for k in task.kernel_ids}}


def norm_plan():
    model = capture(TINY_LLAMA, "tiny", dtype="fp32")
    grid = Grid("fake", {**GRIDS["tiny"], "*": {"tokens": TOKENS}})
    plan = make_plan(model, "fp32", torch.device("cpu"), grid, only=("demo.*",))
    return dataclasses.replace(plan, signatures=tuple(sp for sp in plan.signatures if sp.instance.signature.op == "norm.rms"))


def searched(tmp_path, name, runner, budget, trials=10):
    plan, stats = search(norm_plan(), {"demo.rms_norm": load_space(write_space(tmp_path / "spaces"))}, [runner],
                         tmp_path / f"{name}.journal", "eager", "fake", trials=trials, budget=budget)
    family = {c.spec.kernel_id for sp in plan.signatures for c in sp.candidates if c.spec.kernel_id.startswith("demo.")}
    return family, stats


def best_at(runner, kernels, tokens):
    return min(runner.cost(k, {"tokens": tokens}) for k in kernels)


def test_smarter_budget_runs_fewer_trials_and_agrees_with_the_full_one(tmp_path):
    runner = FakeRunner()
    full, full_stats = searched(tmp_path, "full", runner, FULL_BUDGET)
    smart, smart_stats = searched(tmp_path, "smart", runner, SMART_BUDGET)
    assert full_stats.run == full_stats.budgeted == 10 * len(TOKENS)
    assert full_stats.stopped == {"budget": len(TOKENS), "patience": 0, "host-bound": 0, "skipped": 0}
    assert smart_stats.budgeted == full_stats.budgeted
    assert smart_stats.run < 0.8 * full_stats.run, smart_stats.line()
    assert smart_stats.stopped["patience"] > 0
    for tokens in TOKENS:  # the grid times every winner at every bucket: the table sees the best of them
        assert best_at(runner, smart, tokens) <= best_at(runner, full, tokens) * (1 + NOISE), tokens
    again, again_stats = searched(tmp_path, "again", runner, SMART_BUDGET)
    assert (again, again_stats) == (smart, smart_stats), "seeded: the same trials, the same winners"


def test_buckets_where_the_family_cannot_win_are_skipped(tmp_path):
    runner = FakeRunner(other_ms=lambda tokens: 0.5 if tokens >= 64 else 100.0)  # from 64 on, others win by 2x
    smart, stats = searched(tmp_path, "smart", runner, SMART_BUDGET)
    skipped = stats.stopped["skipped"]
    assert skipped == 2, "the odd buckets between two losing ones: 128 and 512 (2048 has one neighbour)"
    assert stats.run + skipped * 10 > stats.run
    full, _ = searched(tmp_path, "full", runner, FULL_BUDGET)
    for tokens in TOKENS:  # where the family loses, it loses with either budget; elsewhere it agrees
        smart_best, full_best = best_at(runner, smart, tokens), best_at(runner, full, tokens)
        other = runner.other_ms(tokens)
        assert (min(smart_best, other) <= min(full_best, other) * (1 + NOISE)), tokens


def test_patience_counts_trials_since_the_last_real_gain():
    done, pruned = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED
    trial = lambda state, value=None: optuna.trial.create_trial(state=state, value=value, params={}, distributions={})  # noqa: E731
    assert stale_trials([]) == 0
    assert stale_trials([trial(done, 1.0), trial(done, 0.995), trial(pruned), trial(done, 1.2)]) == 3
    assert stale_trials([trial(done, 1.0), trial(pruned), trial(done, 0.9)]) == 0


def test_checkerboard_order_searches_every_neighbour_first():
    points = [{"a": a, "b": b} for a in (1, 2, 3) for b in (10, 20)]
    order = bucket_order(points)
    for n, i in enumerate(order):
        if sum(grid_index(points)[i]) % 2:
            assert set(near(points, i, 1)) <= set(order[:n])


def test_hill_climbing_walks_from_the_searched_best_to_a_better_neighbour(tmp_path):
    """Two trials per bucket (the default, rows=1, and one TPE sample) leave most buckets short of
    their best rows; climbing one step at a time reaches it (the fake cost has one minimum in rows)."""
    runner = FakeRunner()
    plain, plain_stats = searched(tmp_path, "plain", runner, dataclasses.replace(FULL_BUDGET), trials=2)
    climbed, stats = searched(tmp_path, "climbed", runner, dataclasses.replace(FULL_BUDGET, refine=8), trials=2)
    every = [f"demo.rms_norm[rows={rows},exact=1]" for rows in (1, 2, 4, 64, 1024)]
    for tokens in TOKENS:
        assert best_at(runner, climbed, tokens) == best_at(runner, every, tokens), tokens
    assert any(best_at(runner, plain, t) > best_at(runner, every, t) for t in TOKENS), "TPE alone stops short"
    assert 0 < stats.refined <= 8 * len(TOKENS) and stats.run == plain_stats.run + stats.refined
    assert "hill-climbing" in stats.line()


class HostRunner(FakeRunner):
    """FakeRunner whose eager calls wait on the host below `host_from` tokens (their host
    time is their eager time there, a tenth of it above), on a device of type `device`."""

    def __init__(self, device: str, host_from: int):
        super().__init__()
        self.device, self.host_from = torch.device(device), host_from

    def run(self, task):
        outcome = super().run(task)
        for fields in outcome.get("per_kernel", {}).values():
            fields["host_ms"] = fields["eager_ms"] * (1 if task.dims["tokens"] < self.host_from else 0.1)
        return outcome


def test_an_eager_study_on_a_gpu_stops_at_a_host_bound_trial(tmp_path):
    """Where an eager call waits on the host no configuration gains: such a study stops after that
    trial (counted as stopped by host-bound), the rest search on. Not on a CPU (the host's time is all of
    an eager call there), nor with the full budget."""
    host_bound_buckets = sum(t < 16 for t in TOKENS)
    gpu, gpu_stats = searched(tmp_path, "gpu", HostRunner("cuda", host_from=16), SMART_BUDGET)
    assert gpu_stats.stopped["host-bound"] == host_bound_buckets, gpu_stats.line()
    cpu, cpu_stats = searched(tmp_path, "cpu", HostRunner("cpu", host_from=16), SMART_BUDGET)
    assert cpu_stats.stopped["host-bound"] == 0 and cpu_stats.run > gpu_stats.run
    assert gpu_stats.run <= cpu_stats.run - host_bound_buckets, "one trial at each host-bound bucket"
    runner = HostRunner("cuda", host_from=16)
    for tokens in TOKENS[host_bound_buckets:]:  # where the host does not decide, the search finds as much
        assert best_at(runner, gpu, tokens) <= best_at(runner, cpu, tokens) * (1 + NOISE), tokens
    _, full_stats = searched(tmp_path, "full", HostRunner("cuda", host_from=16), FULL_BUDGET)
    assert full_stats.stopped["host-bound"] == 0
    _, again_stats = searched(tmp_path, "gpu", HostRunner("cuda", host_from=16), SMART_BUDGET)
    assert again_stats.run == 0 and again_stats.stopped["host-bound"] == host_bound_buckets, "a re-run runs none"


class CountingRunner(FakeRunner):
    """FakeRunner that remembers how many trials it ran."""

    def __init__(self):
        super().__init__()
        self.trials = 0

    def run(self, task):
        self.trials += isinstance(task, ParityTask)
        return super().run(task)



def test_a_trial_times_its_study_s_mode_alone(tmp_path):
    """A study ranks configurations by one mode's time, the mode every phase times. A trial
    that timed both (a CUDA graph captured and sampled beside the eager passes) cost twice the time."""
    modes = []

    class ModeRunner(FakeRunner):
        def run(self, task):
            if not isinstance(task, ParityTask):
                modes.append(task.modes)
            return super().run(task)
    searched(tmp_path, "eager", ModeRunner(), SMART_BUDGET, trials=3)
    assert modes and set(modes) == {("eager",)}

def test_studies_are_shared_out_over_the_devices_with_the_same_winners(tmp_path):
    """tune --devices: each (signature, family) search goes whole to the next free device; the
    winners and the trials spent are those of one device."""
    wider = capture({**TINY_LLAMA, "hidden_size": 512, "intermediate_size": 1024}, "wider", dtype="fp32")
    grid = Grid("fake", {**GRIDS["tiny"], "*": {"tokens": TOKENS}})
    two_signatures = dataclasses.replace(norm_plan(), signatures=norm_plan().signatures + tuple(
        sp for sp in make_plan(wider, "fp32", torch.device("cpu"), grid, only=("demo.*",)).signatures
        if sp.instance.signature.op == "norm.rms"))
    space = {"demo.rms_norm": load_space(write_space(tmp_path / "spaces"))}

    def run(name, runners):
        plan, stats = search(two_signatures, space, runners, tmp_path / f"{name}.journal", "eager", "fake", trials=4,
                             budget=FULL_BUDGET)
        return [tuple(c.spec.kernel_id for c in sp.candidates) for sp in plan.signatures], stats

    one = run("one", [CountingRunner()])
    lanes = [CountingRunner(), CountingRunner()]
    two = run("two", lanes)
    assert len(two[0]) == 2 and two == one
    assert sum(lane.trials for lane in lanes) == 2 * 4 * len(TOKENS) and two[1].run == one[1].run
    assert all(lane.trials > 0 for lane in lanes)


def test_a_device_with_no_search_to_begin_takes_buckets_of_one_in_progress(tmp_path):
    """One family's search, two devices: the second takes the buckets the first has not begun, each
    bucket's study run once, the winners those of one device."""
    space = {"demo.rms_norm": load_space(write_space(tmp_path / "spaces"))}

    def run(name, runners):
        plan, stats = search(norm_plan(), space, runners, tmp_path / f"{name}.journal", "eager", "fake", trials=4,
                             budget=FULL_BUDGET)
        studies = optuna.get_all_study_summaries(journal(tmp_path / f"{name}.journal"))
        return [c.spec.kernel_id for c in plan.signatures[0].candidates], stats, sorted(s.n_trials for s in studies)

    lanes = [SlowRunner(), SlowRunner()]
    one, two = run("one", [SlowRunner()]), run("two", lanes)
    assert two[0] == one[0] and two[2] == one[2] == [4] * len(TOKENS)
    assert two[1].run == one[1].run == 4 * len(TOKENS) and two[1].budgeted == one[1].budgeted
    assert all(lane.trials >= 4 for lane in lanes), [lane.trials for lane in lanes]


class SlowRunner(CountingRunner):
    """A trial that takes a few ms, so that the device that takes the search first cannot finish it
    before the other has started."""

    def run(self, task):
        time.sleep(0.003)
        return super().run(task)


def test_devices_start_on_different_families_then_take_the_largest_searches():
    """On several devices the searches start on different families (one family's searches compile
    the same configurations), then go largest first."""
    from types import SimpleNamespace

    from lzsolve.measure.search import search_units
    plan = make_plan(capture(TINY_LLAMA, "tiny", dtype="fp32"), "fp32", torch.device("cpu"), "tiny", only=("torch.*",))
    spaces = {"torch.linear": SimpleNamespace(kernel="torch.linear", trials=8),
              "torch.rms_norm": SimpleNamespace(kernel="torch.rms_norm", trials=2)}
    units = search_units(plan, spaces, None)
    families = [space.kernel for _, space, _ in units]
    assert families.count("torch.linear") >= 3 and "torch.rms_norm" in families
    assert families[:2] == ["torch.linear", "torch.rms_norm"], "the second device starts on the other family"
    cost = [len(plan.signatures[n].workloads) * budget for n, _, budget in units]
    assert cost[2:] == sorted(cost[2:], reverse=True) and cost[0] == max(cost)
    assert search_units(plan, spaces, 3)[0][2] == 3, "--trials overrides the spaces' budgets"
