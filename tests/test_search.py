"""Configuration search: spaces are checked against their family, studies prune configs that
fail parity, winners become candidates at every bucket, and a re-run continues the studies."""
import json

import optuna
import pytest
from click.testing import CliRunner

import tests.tunable_kernels as demo
from lzsolve.cli import cli
from lzsolve.errors import LzError
from lzsolve.perfdb import PerfDB, dims_key
from lzsolve.search import STORAGE_NAME, load_space, load_spaces
from tests.test_cli import TINY_LLAMA


def write_space(folder, text=demo.SPACE, name="demo.rms_norm.yaml"):
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(text)
    return folder / name


def test_repo_spaces_load():
    for space in load_spaces().values():  # every shipped space names a family and stays inside its domain
        assert space.trials >= 1


@pytest.mark.parametrize("text,message", [
    ("kernel: nope.kernel\ntrials: 3\nparams: {}\n", "is not a tunable kernel"),
    ("kernel: demo.rms_norm\ntrials: 3\nparams: {exact: [1], rows: [1]}\n", "in that order"),
    ("kernel: demo.rms_norm\ntrials: 3\nparams: {rows: [1, 3], exact: [1]}\n", "must be a list of values from"),
    ("kernel: demo.rms_norm\ntrials: 3\nparams: {rows: [2], exact: [1]}\n", "must contain the default"),
    ("kernel: demo.rms_norm\ntrials: 0\nparams: {rows: [1], exact: [1]}\n", "trials must be a positive integer"),
    ("kernel: [\n", "cannot read search space"),
    ("just text\n", "needs 'kernel', 'trials' and 'params'"),
])
def test_bad_spaces_are_refused(tmp_path, text, message):
    with pytest.raises(LzError, match=message):
        load_space(write_space(tmp_path / "spaces", text))


def tune(tmp_path, *extra):
    config = tmp_path / "tiny-llama.json"
    config.write_text(json.dumps(TINY_LLAMA))
    spaces = write_space(tmp_path / "spaces").parent
    result = CliRunner().invoke(cli, [
        "tune", "--config", str(config), "--grid", "tiny", "--dtype", "fp32", "--device", "cpu", "--no-isolate",
        "--plugin", "tests.tunable_kernels", "--spaces", str(spaces), "--kernels", "demo.*",
        "--out", str(tmp_path / "out"), *extra])
    assert result.exit_code == 0, result.output
    return result


def studies(tmp_path):
    url = f"sqlite:///{tmp_path / 'out' / STORAGE_NAME}"
    return {s.study_name: optuna.load_study(study_name=s.study_name, storage=url)
            for s in optuna.get_all_study_summaries(url)}


def test_search_prunes_wrong_configs_and_adds_winners_everywhere(tmp_path):
    tune(tmp_path)
    found = studies(tmp_path)
    assert len(found) == 2, "one study per bucket of the one norm.rms signature (tiny grid: tokens 1 and 8)"
    for name, study in found.items():
        assert name.startswith("norm.rms[hidden=256,fp32]|") and "|demo.rms_norm|" in name
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


def test_rerun_continues_the_studies_and_trials_zero_skips_search(tmp_path):
    tune(tmp_path, "--trials", "3")
    assert [len(s.trials) for s in studies(tmp_path).values()] == [3, 3]
    tune(tmp_path, "--trials", "5")
    assert [len(s.trials) for s in studies(tmp_path).values()] == [5, 5], "continued, not restarted"
    result = tune(tmp_path, "--trials", "0")
    assert "searching" not in result.output
    assert [len(s.trials) for s in studies(tmp_path).values()] == [5, 5]
