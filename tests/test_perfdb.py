"""PerfDB: append whole files, query through DuckDB views."""
import datetime as dt
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from lzsolve.errors import LzError
from lzsolve.store.perfdb import LOCK_FILE, PerfDB


def rec(kernel, status="ok", ms=1.0, **kw):
    return {"run_id": "r1", "ts": dt.datetime(2026, 11, 22, 12, 0), "signature": "norm.rms[hidden=8,bf16]",
            "op": "norm.rms", "kernel_id": kernel, "status": status, "eager_ms": ms if status == "ok" else None,
            "tokens": 4, "dims": '{"tokens": 4}', **kw}


def test_append_and_query(tmp_path):
    db = PerfDB(tmp_path / "perfdb")
    db.append([rec("a", ms=2.0), rec("b", ms=1.0)], "r1")
    db.append([rec("c", status="rejected", reason_code="PARITY_FAILED", reason_message="rel_l2 1")], "r1")
    assert len(db.files()) == 2
    assert not list((tmp_path / "perfdb").glob("*.tmp")), "no temp files left behind"
    assert db.rows("SELECT kernel_id FROM admitted ORDER BY eager_ms") == [{"kernel_id": "b"}, {"kernel_id": "a"}]
    assert db.rows("SELECT kernel_id, reason_code FROM rejected") == [{"kernel_id": "c", "reason_code": "PARITY_FAILED"}]
    columns, rows = db.query("SELECT count(*) AS n FROM records")
    assert columns == ["n"] and rows == [(3,)]


def test_files_from_before_a_column_existed_read_as_null(tmp_path):
    """A PerfDB written before phase, device_index and routing_skew existed (a re-tune reads it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lzsolve.store.perfdb import COLUMNS, SCHEMA

    folder = tmp_path / "perfdb"
    folder.mkdir()
    older = pa.schema([f for f in SCHEMA if f.name not in ("phase", "device_index", "routing_skew")])
    pq.write_table(pa.Table.from_pylist([rec("a")], schema=older), folder / "part-old-00000.parquet")
    db = PerfDB(folder)
    db.append([rec("b", routing_skew=0.0)], "new")
    rows = db.rows("SELECT * FROM records ORDER BY kernel_id")
    assert list(rows[0]) == COLUMNS
    assert [(r["kernel_id"], r["routing_skew"], r["phase"], r["eager_ms"]) for r in rows] == \
        [("a", None, None, 1.0), ("b", 0.0, None, 1.0)]
    only_old = PerfDB(tmp_path / "only-old")
    only_old.path.mkdir()
    (folder / "part-old-00000.parquet").rename(only_old.path / "part-old-00000.parquet")
    assert only_old.rows("SELECT routing_skew, device_index FROM records") == [{"routing_skew": None, "device_index": None}]


def test_errors_are_one_line(tmp_path):
    db = PerfDB(tmp_path / "none")
    with pytest.raises(LzError, match="no PerfDB records"):
        db.query("SELECT 1")
    db.append([rec("a")], "r1")
    with pytest.raises(LzError, match="query failed") as e:
        db.query("SELEC nonsense")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="unknown columns"):
        db.append([{**rec("a"), "bogus": 1}], "r1")


def test_ceilings_view_is_there_empty_or_filled(tmp_path):
    db = PerfDB(tmp_path / "perfdb")
    db.append([rec("a")], "r1")
    assert db.rows("SELECT count(*) AS n FROM ceilings") == [{"n": 0}]  # a PerfDB from before the probe
    db.append_ceilings([{"run_id": "r1", "ts": dt.datetime(2026, 11, 22, 12, 0), "hw_slug": "h", "dtype": "bf16",
                         "kind": "memory", "mode": "graph", "per_s": 3.0e12, "probe": "copy"}], "r1")
    assert db.files() == sorted((tmp_path / "perfdb").glob("part-*.parquet"))  # records stay records
    assert db.rows("SELECT kind, per_s FROM ceilings") == [{"kind": "memory", "per_s": 3.0e12}]
    assert db.rows("SELECT count(*) AS n FROM records") == [{"n": 1}]


@pytest.mark.parametrize("sql", [
    "COPY (SELECT 1) TO '{out}/x.csv'",
    "COPY records TO '{db}/part-evil.parquet'",
    "SELECT * FROM read_csv('{secret}')",
    "SELECT * FROM read_parquet('{db}/../secret.csv')",
    "ATTACH '{out}/new.duckdb' AS other",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET enable_external_access = true",
    "EXPORT DATABASE '{out}/dump'",
])
def test_the_perfdb_is_data_not_a_shell(tmp_path, sql):
    """Queries see the PerfDB and nothing else: no file read or written, no extension, no setting."""
    db = PerfDB(tmp_path / "perfdb")
    db.append([rec("a")], "r1")
    (tmp_path / "secret.csv").write_text("x\n1\n")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(LzError, match="query failed: .*(disabled|locked)") as e:
        db.query(sql.format(out=tmp_path, db=tmp_path / "perfdb", secret=tmp_path / "secret.csv"))
    assert "\n" not in str(e.value) and "read-only" in str(e.value)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before, "nothing was written"
    assert db.rows("SELECT count(*) AS n FROM records") == [{"n": 1}], "its own data still reads"


def test_db_query_refuses_file_access_with_exit_2(tmp_path):
    import subprocess
    import sys

    db = PerfDB(tmp_path / "perfdb")
    db.append([rec("a")], "r1")
    run = subprocess.run([sys.executable, "-m", "lzsolve", "db", "query", "--db", str(tmp_path / "perfdb"),
                          "SELECT * FROM read_csv('/etc/passwd')"], capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "read-only" in run.stderr


LOCKED_BY_OTHERS = """
import fcntl, hashlib, sys
offset = int.from_bytes(hashlib.sha256(sys.argv[2].encode()).digest()[:4], "big") >> 1
with open(sys.argv[1], "a+b") as f:
    try:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset)
    except OSError:
        print("held")
    else:
        print("free")
"""


def held_elsewhere(db: PerfDB, what: str) -> bool:
    """Whether another process (a second tuner) would find `what` locked."""
    out = subprocess.run([sys.executable, "-c", LOCKED_BY_OTHERS, str(db.path / LOCK_FILE), what],
                         capture_output=True, text=True, check=True).stdout.strip()
    return out == "held"


def test_a_lane_leaving_does_not_release_another_lanes_lock(tmp_path):
    """The lanes of a --devices run are threads of one process, and fcntl's locks belong to the
    process: one lane done with a signature (or closing its copy of the lock file) must leave the
    other lanes' signatures locked against a second tuner until they are done too."""
    db = PerfDB(tmp_path / "perfdb")
    entered, leave = threading.Event(), threading.Event()

    def lane() -> None:
        with db.measuring("sig-a"):
            entered.set()
            leave.wait(30)

    other = threading.Thread(target=lane)
    other.start()
    assert entered.wait(30)
    with db.measuring("sig-b"):
        pass
    with db.measuring("sig-a"):  # a second lane on the same signature, done first
        pass
    assert held_elsewhere(db, "sig-a"), "the first lane's lock was dropped by the others"
    assert not held_elsewhere(db, "sig-b")
    leave.set()
    other.join()
    assert not held_elsewhere(db, "sig-a")


def test_a_query_is_bounded_in_rows_time_and_memory(tmp_path):
    """A result is streamed (the first limit + 1 rows of a hundred million, without holding them), a
    query that runs forever stops at its timeout, and DuckDB may use 1 GiB besides the PerfDB's copy
    with no spilling to disk (issue 55: `SELECT * FROM range(100000000)` took 3.5 GB, then a
    MemoryError traceback; a recursive CTE ran until killed)."""
    import resource
    import time

    from lzsolve.store.perfdb import QUERY_MEMORY

    db = PerfDB(tmp_path / "perfdb")
    db.append([rec("a")], "r1")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    columns, rows = db.query("SELECT * FROM range(100000000)", limit=1000)
    assert len(rows) == 1001 and time.perf_counter() - started < 5
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024 < 200, "MB"
    started = time.perf_counter()
    with pytest.raises(LzError, match="query stopped after 1 s; narrow it, or allow longer with --timeout"):
        db.query("WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) SELECT count(*) FROM t",
                 timeout_s=1)
    assert time.perf_counter() - started < 10
    [limits] = db.rows("SELECT current_setting('temp_directory') AS spill, "
                       "current_setting('memory_limit') AS memory")
    assert limits["spill"] == "", "spilling is off: nothing is written beside the user's files"
    gib = float(limits["memory"].removesuffix(" GiB")) if limits["memory"].endswith("GiB") else 0.0
    assert 0 < gib * (1 << 30) <= QUERY_MEMORY * 1.1, limits


def _part(db: PerfDB) -> Path:
    return db.files()[0]


def _symlink_outside(db: PerfDB) -> None:
    outside = db.path.parent / "outside.parquet"
    _part(db).rename(outside)
    db.path.joinpath("part-r1-00000.parquet").symlink_to(outside)


def _fifo(db: PerfDB) -> None:
    import os
    _part(db).unlink()
    os.mkfifo(db.path / "part-r1-00000.parquet")


@pytest.mark.parametrize("change,needle", [
    (lambda db: _part(db).write_bytes(_part(db).read_bytes()[:100]), "cannot be read"),  # a truncated part
    (lambda db: _part(db).write_bytes(b"not parquet at all" * 10), "cannot be read"),
    (lambda db: _part(db).write_bytes(b""), "cannot be read"),
    (_symlink_outside, "outside"),
    (_fifo, "FIFO"),
], ids=["truncated", "not_parquet", "empty", "symlink_outside", "fifo"])
def test_a_part_is_read_only_as_a_regular_parquet_file_inside_the_perfdb(tmp_path, change, needle):
    """A part that is corrupt, or leads out of the folder, or would block, is one line naming it
    (issue 55: a 38-line DuckDB traceback; a part linked to a Parquet file outside was read)."""
    db = PerfDB(tmp_path / "perfdb")
    db.append([rec("a")], "r1")
    db.append([rec("b")], "r1")
    change(db)
    with pytest.raises(LzError) as e:
        db.query("SELECT count(*) FROM records")
    message = str(e.value)
    assert needle in message and "part-r1-00000.parquet" in message and "\n" not in message, message
    if needle == "cannot be read":
        assert "move it out of" in message and "measures that part's records again" in message
    assert (tmp_path / "perfdb" / "part-r1-00000.parquet").is_symlink() or \
        (tmp_path / "perfdb" / "part-r1-00000.parquet").exists(), "the user's file is left where it was"


def test_measuring_imports_no_duckdb(tmp_path):
    """The measuring side (parity, timing, search) and a PerfDB's appends need pyarrow alone: a device
    call that only measures (benchmarks/device.sh cute, whose carried packages leave no room for DuckDB)
    imports them, and only a query needs DuckDB."""
    code = ("import sys; sys.modules['duckdb'] = None\n"
            "import lzsolve.measure.tasks, lzsolve.measure.search\n"
            "from lzsolve.store.perfdb import PerfDB\n"
            "from tests.test_perfdb import rec\n"
            f"PerfDB({str(tmp_path / 'db')!r}).append([rec('a')], 'r1')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
