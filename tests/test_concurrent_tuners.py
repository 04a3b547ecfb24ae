"""Two tuners on one --out: each workload is measured once (PerfDB.measuring), each capability verdict
recorded once, and both runs see every record."""
import json
import subprocess
import sys
from pathlib import Path

TUNER = """
import dataclasses, json, sys, time
import torch
from lzsolve.models.capture import capture
from lzsolve.store.perfdb import PerfDB
from lzsolve.measure.tuner import Session, make_plan, tune
from lzsolve.measure.worker import InProcessRunner
from tests.test_cli import TINY_LLAMA

class LoggedRunner(InProcessRunner):
    def run(self, task):
        if type(task).__name__ == "TimingTask":
            time.sleep(0.2)  # slow enough that the two runs overlap
            with open(sys.argv[2], "a") as log:
                log.write(json.dumps([str(task.signature), json.dumps(task.dims, sort_keys=True)]) + "\\n")
        return super().run(task)

model = capture(TINY_LLAMA, "tiny", dtype="fp32")
plan = make_plan(model, "fp32", torch.device("cpu"), "tiny", only=("torch.*",))
plan = dataclasses.replace(plan, signatures=tuple(dataclasses.replace(sp, workloads=sp.workloads[:2])
                                                  for sp in plan.signatures[:4]))
records = tune(plan, Session(plan, PerfDB(sys.argv[1]), LoggedRunner(torch.device("cpu"))), "eager")
print(json.dumps(len([r for r in records if r["stage"] != "capability"])))
"""


def test_two_tuners_on_one_perfdb_measure_each_workload_once(tmp_path):
    root = Path(__file__).parent.parent
    log = tmp_path / "timings.log"
    runs = [subprocess.Popen([sys.executable, "-c", TUNER, str(tmp_path / "perfdb"), str(log)], cwd=root,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [run.communicate(timeout=600) for run in runs]
    assert all(run.returncode == 0 for run in runs), [err[-2000:] for _, err in outputs]
    timed = [tuple(json.loads(line)) for line in log.read_text().splitlines()]
    assert timed and len(timed) == len(set(timed)), "a workload was timed by both tuners"
    seen = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert seen[0] == seen[1] > 0, "both runs hold every measured record, reused or their own"
    assert not list((tmp_path / "perfdb").glob("*.tmp"))
    # the kernels left out (--kernels) and those CPU cannot run have their verdicts: once each
    from lzsolve.measure.tuner import _rejection_key
    from lzsolve.store.perfdb import PerfDB
    verdicts = PerfDB(tmp_path / "perfdb").rows("SELECT * FROM records WHERE stage = 'capability'")
    keys = [_rejection_key(r) for r in verdicts]
    assert keys and len(keys) == len(set(keys)), f"{len(keys)} verdict rows, {len(set(keys))} distinct"
