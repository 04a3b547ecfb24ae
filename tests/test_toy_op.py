"""Adding an op takes one op record and one kernel module: tests/toy_op.py does only that, and
its op is tuned, dispatched, warmed up and compiled with fullgraph (in a process of its own)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_toy_op_is_tuned_dispatched_warmed_up_and_compiled(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "tests.toy_op", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "tuned, dispatched, warmed up and compiled" in done.stdout
