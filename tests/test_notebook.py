"""notebooks/perfdb_analysis.ipynb runs headless on a real (tiny CPU) PerfDB and on a GPU-like one,
saves its figures and shows them inline."""
import json
import os
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from lzsolve.perfdb import PerfDB

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "perfdb_analysis.ipynb"


@pytest.fixture(scope="module")
def artifact(tiny_llama_artifact):
    return tiny_llama_artifact


def grid_points(text):
    line = next(s for s in text.splitlines() if "grid points over" in s)
    return int(line.split()[0]), int(line.split("(")[1].split()[0])


def execute(monkeypatch, perfdb, figures):
    # The kernel inherits this process's environment: that is how the parameters get in.
    monkeypatch.setenv("LZSOLVE_PERFDB", str(perfdb))
    monkeypatch.setenv("LZSOLVE_FIGURES", str(figures))
    monkeypatch.delenv("LZSOLVE_MODE", raising=False)
    monkeypatch.delenv("MPLBACKEND", raising=False)  # a forced Agg backend would hide the inline images
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # Raises CellExecutionError, with the cell and its traceback, if any cell fails.
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    return text, images


def pngs(folder, pattern):
    found = sorted(folder.glob(pattern))
    assert found, f"no {pattern} in {sorted(p.name for p in folder.iterdir())}"
    assert all(p.stat().st_size > 1000 for p in found)
    return found


def test_stored_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert "parameters" in code[0].metadata.get("tags", [])


def test_notebook_on_artifact(artifact, tmp_path, monkeypatch):
    figures = tmp_path / "figures"
    text, images = execute(monkeypatch, artifact, figures)
    assert "timing: eager_ms" in text and "no NVML readings (CPU run)" in text
    assert grid_points(text)[0] > 10
    names = {p.name for p in pngs(figures, "winners_*.png")}
    assert "winners_attention.prefill.png" in names and "winners_linear.png" in names
    pngs(figures, "speedup_*.png")
    for name in ("roofline.png", "noise.png", "jit.png"):
        pngs(figures, name)
    assert len(images) >= len(list(figures.glob("*.png")))


def test_notebook_on_perfdb_folder_gpu_like(artifact, tmp_path, monkeypatch):
    """The perfdb folder itself, with what a GPU run adds (graph timings, NVML, setup_ms) and no
    ceilings: graph mode is picked, the roofline is skipped with a line, eval-* points stay out."""
    rnd = random.Random(0)
    rows = [r for f in PerfDB(artifact / "perfdb").files() for r in pq.read_table(f).to_pylist()
            if not r["run_id"].startswith("eval-")]  # the shared artifact may hold evaluation records
    for r in rows:
        if r["status"] == "ok":
            r.update(graph_ms=r["eager_ms"] * rnd.uniform(0.2, 0.6), graph_spread=rnd.uniform(0, 0.05),
                     temp_c=rnd.uniform(40, 80), sm_clock_mhz=rnd.choice([1755.0, 1980.0]),
                     env_bucket=rnd.choice(["cold", "warm", "hot"]), throttled=rnd.random() < 0.1,
                     setup_ms=rnd.uniform(0.01, 0.2) if r["op"].startswith("attention") else None)
    off_grid = [dict(r, run_id="eval-1", kv_len=999, dims=json.dumps({"batch": r["batch"], "kv_len": 999}))
                for r in rows if r["op"] == "attention.decode"]
    db = PerfDB(tmp_path / "perfdb")
    db.append(rows, "gpu")
    db.append(off_grid, "eval-1")
    figures = tmp_path / "figures"
    text, images = execute(monkeypatch, db.path, figures)
    assert "timing: graph_ms" in text and "roofline skipped" in text and "NVML" not in text
    with PerfDB(artifact / "perfdb").connect() as con:  # the same grid as the tune: eval-* points left out
        points = con.execute("SELECT count(DISTINCT (signature, dims)) FROM admitted "
                             "WHERE run_id NOT LIKE 'eval-%'").fetchone()[0]
    assert grid_points(text) == (points, len(off_grid))
    assert not (figures / "roofline.png").exists()
    for pattern in ("winners_*.png", "speedup_*.png", "noise.png", "jit.png"):
        pngs(figures, pattern)
    assert images

