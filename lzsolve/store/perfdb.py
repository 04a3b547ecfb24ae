"""PerfDB: every record of every run as Parquet files, queried with DuckDB.

A run appends whole files (written to a temp name, then renamed), so an
interrupted run loses at most the signature it was measuring, and readers
never see a partial file. Views: `records` (everything), `admitted`
(status = 'ok'), `rejected` (with their Reasons), and `ceilings` (the
device's measured compute and memory peaks per run, for roofline fractions).
"""
from __future__ import annotations

import collections
import contextlib
import fcntl
import fnmatch
import hashlib
import itertools
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from lzsolve.errors import LzError, WriteError
from lzsolve.store.fsutil import atomic_write_bytes
from runtime_loader import safeio

if TYPE_CHECKING:  # DuckDB is imported where a query runs: measuring needs the schema and the files
    # alone, and a device call that only measures (benchmarks/device.sh cute) carries no DuckDB
    import duckdb

DIMS = ("batch", "seq", "kv_len", "tokens")  # every dynamic dim of runtime_loader.ops.OPS gets a column

SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("ts", pa.timestamp("us")),  # UTC
    ("model", pa.string()),
    ("tp", pa.int32()),
    ("signature", pa.string()),
    ("op", pa.string()),
    ("dtype", pa.string()),
    ("roles", pa.string()),
    ("kernel_id", pa.string()),
    ("library", pa.string()),
    ("kernel_version", pa.string()),
    ("is_fallback", pa.bool_()),
    ("status", pa.string()),  # 'ok' or 'rejected'
    ("stage", pa.string()),  # where it was decided: 'capability', 'parity', 'bench'; or 'compile',
    # a first call made ahead unchecked (lzsolve.measure.ahead), which decides nothing
    ("phase", pa.string()),  # which points: 'grid' (buckets), 'probe' (unaligned, in-bucket),
    # 'validation' (random shapes after solving), 'evaluate' (lzsolve evaluate), 'compile' (a first
    # call made ahead to build a kernel: lzsolve.measure.ahead; no times); null in older PerfDBs
    ("reason_code", pa.string()),
    ("reason_message", pa.string()),
    *[(d, pa.int64()) for d in DIMS],
    ("dims", pa.string()),  # the dynamic dims as JSON, for exact keys
    ("eager_ms", pa.float64()),  # median, back-to-back launches (host overhead included)
    ("eager_p95_ms", pa.float64()),
    ("eager_min_ms", pa.float64()),
    ("eager_samples", pa.int32()),
    ("eager_spread", pa.float64()),  # IQR / median
    # median host time per call of the eager passes: what issuing the call costs the CPU, all an eager
    # model pays for it where the model is host-bound (on a CPU the same as eager_ms); null in older PerfDBs
    ("host_ms", pa.float64()),
    ("graph_ms", pa.float64()),  # median of CUDA-graph replays (GPU time only)
    ("graph_p95_ms", pa.float64()),
    ("graph_min_ms", pa.float64()),
    ("graph_samples", pa.int32()),
    ("graph_spread", pa.float64()),
    ("graph_safe", pa.bool_()),
    ("graph_error", pa.string()),  # why a CUDA graph could not be captured
    ("rotation_sets", pa.int32()),  # input sets cycled per sample so caches do not flatter
    ("jit_ms", pa.float64()),  # first call on the workload, never mixed into the above
    ("jit_files", pa.string()),  # JSON list of the JIT cache files that first call wrote (artifact packs these)
    ("setup_ms", pa.float64()),  # one-time setup per call layout the adapter reports (FlashInfer's plan)
    ("rel_l2", pa.float64()),
    ("max_rel", pa.float64()),
    ("flops", pa.float64()),
    ("bytes", pa.float64()),
    ("temp_c", pa.float64()),  # NVML readings around the measurement (worst of before/after)
    ("sm_clock_mhz", pa.float64()),
    ("mem_clock_mhz", pa.float64()),
    ("power_w", pa.float64()),
    ("throttle_reasons", pa.string()),
    ("env_bucket", pa.string()),  # cold / warm / hot
    ("throttled", pa.bool_()),  # still throttled after a bounded re-measure
    # who else used the machine when the timing ended (env.contention); null in older PerfDBs
    ("host_load", pa.float64()),  # the host's 1-minute load average per core (above 1: cores were short)
    ("gpu_others", pa.int32()),  # compute processes of other programs on the GPU (NVML; null where it cannot tell)
    ("timer", pa.string()),
    ("device", pa.string()),
    ("device_index", pa.int32()),  # which of the run's devices measured it (tune --devices); null in older PerfDBs
    ("hw_slug", pa.string()),
    ("hw_json", pa.string()),
    ("torch_version", pa.string()),
    ("lzsolve_version", pa.string()),
    ("capabilities_hash", pa.string()),
    ("seed", pa.int64()),
    # moe.experts: the expert popularity skew its inputs were drawn with (tune --routing-skew); null
    # for other ops, and in older PerfDBs (which drew at runtime_loader.inputs.ROUTING_SKEW)
    ("routing_skew", pa.float64()),
    # the timing's sampling cap, seconds per mode (tune --sample-time): a record is reused by a tune
    # that samples as long or less; null in older PerfDBs (which sampled the default, Budget.time_cap_s)
    ("sample_time", pa.float64()),
    # where a reused record came from: the measurement cache it was copied out of (tune --cache-dir),
    # null for a record this PerfDB's own runs measured
    ("cached_from", pa.string()),
    # the signature the timing was taken under, where it is another that differs from this one only in
    # labels (tuner.measured_as: attention with and without qk_norm); null where it was its own
    ("timed_as", pa.string()),
])
COLUMNS = SCHEMA.names

# One row per (run, kind, timing mode): what a dense matmul and a large copy achieve on the
# device, measured with the same harness as the kernels. Roofline fractions divide by these.
CEILINGS_SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("ts", pa.timestamp("us")),
    ("hw_slug", pa.string()),
    ("device", pa.string()),
    ("timer", pa.string()),
    ("dtype", pa.string()),
    ("kind", pa.string()),  # 'compute' (FLOP/s) or 'memory' (bytes/s, read + write)
    ("mode", pa.string()),  # 'eager' or 'graph', as the records' *_ms columns; PLAIN_MODE: torch's own forms
    ("per_s", pa.float64()),
    ("probe", pa.string()),  # what was run, e.g. 'matmul 8192x8192x8192 bf16'
    ("spread", pa.float64()),
])
# The mode of the rows of torch's own copy and matmul, timed apart from the tuner's harness in the same
# run (triton.testing.do_bench): what the probe's ceilings are checked against (roofline.ceilings_check)
PLAIN_MODE = "plain"
RECORDS_GLOB, CEILINGS_GLOB = "part-*.parquet", "ceilings-*.parquet"
LOCK_FILE = ".measuring.lock"  # PerfDB.measuring; hidden, so no artifact manifest lists it
MAX_PART_BYTES = 1 << 30  # a part holds one signature's records of one run: tens of KB
# What SQL over the PerfDB may use beyond the copy of the PerfDB itself (PerfDB.connect; DuckDB's
# own default is 80% of the host's memory, and `SELECT * FROM range(100000000)` took 3.5 GB)
QUERY_MEMORY = 1 << 30
CACHE_ENV = "LZSOLVE_CACHE"  # default_cache: where the measurement cache lives, or "off"


def default_cache() -> Path | None:
    """The measurement cache every tune on this machine shares (MeasureConfig.cache_dir's default):
    $LZSOLVE_CACHE (a folder; "off" turns the cache off), else $XDG_CACHE_HOME/lzsolve/perfdb, else
    ~/.cache/lzsolve/perfdb."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "off", "none", "0") else Path(chosen).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lzsolve" / "perfdb"


def dims_key(dims: dict) -> str:
    return json.dumps(dims, sort_keys=True)


class PerfDB:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._seq = itertools.count()
        self._guard = threading.Lock()
        self._lock_file = None  # opened by the first `measuring`, then kept open
        self._turns: dict[int, threading.Lock] = {}
        self._holders: collections.Counter = collections.Counter()

    def files(self, pattern: str = RECORDS_GLOB) -> list[Path]:
        return sorted(self.path / name for name in self.names(pattern))

    def names(self, pattern: str = RECORDS_GLOB) -> set[str]:
        """The names of this PerfDB's files matching `pattern`. Cheap enough to ask before every
        workload: a --devices run writes one file per workload, thousands in a tune, and globbing
        them into Paths took 14 ms a call at 2700 files (os.listdir: 2 ms)."""
        return set(fnmatch.filter(os.listdir(self.path), pattern)) if self.path.is_dir() else set()

    def append(self, records: list[dict], run_id: str) -> Path | None:
        """Write `records` as one new Parquet file; returns its path (None if nothing to write)."""
        return self._write(records, SCHEMA, f"part-{run_id}-{next(self._seq):05d}.parquet")

    def append_ceilings(self, rows: list[dict], run_id: str) -> Path | None:
        return self._write(rows, CEILINGS_SCHEMA, f"ceilings-{run_id}.parquet")

    def ceilings(self) -> list[dict]:
        """Every ceilings row (roofline.peaks picks the latest of each), without reading the records."""
        return [row for path in self.files(CEILINGS_GLOB) for row in self._read_part(path).to_pylist()]

    def _write(self, rows: list[dict], schema: pa.Schema, name: str) -> Path | None:
        if not rows:
            return None
        unknown = set().union(*rows) - set(schema.names)
        if unknown:
            raise ValueError(f"records carry unknown columns {sorted(unknown)}")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise WriteError(self.path, e) from e
        sink = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), sink, compression="zstd")
        target = self.path / name
        atomic_write_bytes(target, sink.getvalue().to_pybytes())
        return target

    @contextlib.contextmanager
    def measuring(self, what: str):
        """An advisory lock held while one tuner measures `what` (a signature) into this PerfDB: a
        second tuner on the same folder waits for it, then reuses its records instead of timing the
        same workloads again. One byte of the hidden LOCK_FILE per `what` (fcntl byte-range locks:
        released by the kernel if the holder dies; a hash collision only makes two signatures wait
        for each other). fcntl's locks belong to the process, so the lanes of a --devices run (threads)
        share them: the byte stays locked while any lane holds it, and the file stays open (closing
        any descriptor of it would drop every lock this process holds there)."""
        offset = int.from_bytes(hashlib.sha256(what.encode()).digest()[:4], "big") >> 1
        with self._guard:
            if self._lock_file is None:
                try:
                    self.path.mkdir(parents=True, exist_ok=True)
                    self._lock_file = open(self.path / LOCK_FILE, "a+b")
                except OSError as e:
                    raise WriteError(self.path, e) from e
            turn = self._turns.setdefault(offset, threading.Lock())
        with turn:  # lanes wanting a byte another tuner holds wait for it one at a time
            if not self._holders[offset]:
                fcntl.lockf(self._lock_file, fcntl.LOCK_EX, 1, offset)
            self._holders[offset] += 1
        try:
            yield
        finally:
            with turn:
                self._holders[offset] -= 1
                if not self._holders[offset]:
                    fcntl.lockf(self._lock_file, fcntl.LOCK_UN, 1, offset)

    def connect(self) -> duckdb.DuckDBPyConnection:
        """An in-memory DuckDB connection holding this PerfDB and nothing else: its records and
        ceilings are copied in (tables records and ceilings; views admitted and rejected), then
        file access is switched off and the configuration locked, so SQL over it (`lzsolve db
        query`, the notebook) cannot read, write or attach a file, install or load an extension,
        or change a setting back. The PerfDB's files themselves are never opened for writing."""
        import duckdb
        if not self.files() and not self.files(CEILINGS_GLOB):
            raise LzError(f"no PerfDB records under {self.path}; run `lzsolve tune` first or pass --db")
        # spilling off (temp_directory ''): a query that outgrows its memory fails instead of writing
        # beside the user's files (DuckDB's default for an in-memory database: ./.tmp)
        con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False,
                                     "temp_directory": ""})
        try:  # no progress bar on stdout past 2 s (copying 2,200 parts in takes longer) amid `db query --json`
            con.execute("SET enable_progress_bar = false")
        except duckdb.Error:  # in Jupyter without ipywidgets, where DuckDB draws none and refuses the setting
            pass
        self._copy_in(con, "records", RECORDS_GLOB, SCHEMA)
        self._copy_in(con, "ceilings", CEILINGS_GLOB, CEILINGS_SCHEMA)
        con.execute("CREATE VIEW admitted AS SELECT * FROM records WHERE status = 'ok'")
        con.execute("CREATE VIEW rejected AS SELECT * FROM records WHERE status = 'rejected'")
        held = con.execute("SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory()").fetchone()[0]
        con.execute(f"SET memory_limit = '{held + QUERY_MEMORY}B'")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        return con

    def _copy_in(self, con: duckdb.DuckDBPyConnection, table: str, pattern: str, schema: pa.Schema) -> None:
        """Table `table` with every column of `schema`, from this PerfDB's files matching `pattern`
        (none: older PerfDBs have no ceilings, and a run may stop before its first records). A column
        that files written before it existed lack (phase, device_index, routing_skew) is null there."""
        con.register(f"_no_{table}", pa.Table.from_pylist([], schema=schema))
        parts = [self._read_part(path) for path in self.files(pattern)]
        if parts:
            con.register(f"_parts_{table}", pa.concat_tables(parts, promote_options="permissive"))
            con.execute(f"CREATE TABLE {table} AS SELECT * FROM _no_{table} UNION ALL BY NAME SELECT * FROM _parts_{table}")
            con.unregister(f"_parts_{table}")
        else:
            con.execute(f"CREATE TABLE {table} AS SELECT * FROM _no_{table}")
        con.unregister(f"_no_{table}")

    def _read_part(self, path: Path) -> pa.Table:
        """One Parquet file of this PerfDB, opened as the runtime opens an artifact's files: a regular
        file inside the folder (a link may not lead out of it), within MAX_PART_BYTES. A file that is
        not Parquet (truncated by a crash outside our atomic writes, or corrupt) is one LzError line
        naming it and the repair."""
        data = safeio.read_regular(path, MAX_PART_BYTES, LzError, root=self.path, what=f"PerfDB part {path}")
        try:  # from memory, one thread: a third faster than from the file over 2,200 small parts
            return pq.ParquetFile(pa.BufferReader(data)).read(use_threads=False)
        except (pa.ArrowException, OSError, ValueError) as e:
            why = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise LzError(f"PerfDB part {path} cannot be read ({why}): it is truncated or corrupt; move it "
                          f"out of {self.path} and run the tune again (it measures that part's records "
                          "again)") from None

    def query(self, sql: str, params: list | None = None, *, limit: int | None = None,
              timeout_s: float | None = None) -> tuple[list[str], list[tuple]]:
        """(columns, rows) of `sql`: every row, or the first `limit` + 1 (the caller tells from the
        extra row that there is more; DuckDB streams the result, so a huge one is never held)."""
        batches = self.stream(sql, params, timeout_s=timeout_s, batch_rows=None if limit is None else limit + 1)
        with contextlib.closing(batches):
            return next(batches)

    def stream(self, sql: str, params: list | None = None, *, timeout_s: float | None = None,
               batch_rows: int | None = None) -> Iterator[tuple[list[str], list[tuple]]]:
        """(columns, rows) of `sql` in batches of `batch_rows` rows (None: one batch of every row),
        at least one; a query still running after `timeout_s` is interrupted (a recursive CTE may
        run forever). Every failure is one LzError line."""
        import duckdb
        con = self.connect()
        timer = threading.Timer(timeout_s, con.interrupt) if timeout_s else None
        if timer:
            timer.daemon = True
            timer.start()
        try:
            result = con.execute(sql, params or [])
            columns = [d[0] for d in result.description or ()]
            while True:
                rows = [] if not columns else result.fetchall() if batch_rows is None else result.fetchmany(batch_rows)
                yield columns, rows
                if batch_rows is None or len(rows) < batch_rows:
                    return
        except duckdb.InterruptException:
            raise LzError(f"query stopped after {timeout_s:g} s; narrow it, or allow longer with --timeout") from None
        except duckdb.OutOfMemoryException as e:
            raise LzError(f"query failed: {_query_error(e)} (a query may use {QUERY_MEMORY >> 30} GiB besides the "
                          "PerfDB; narrow it or aggregate)") from None
        except duckdb.Error as e:
            raise LzError(f"query failed: {_query_error(e)}") from None
        except MemoryError:
            raise LzError("the query's result does not fit in memory; narrow it or use --limit") from None
        finally:
            if timer:
                timer.cancel()
            con.close()

    def rows(self, sql: str, params: list | None = None) -> list[dict]:
        columns, rows = self.query(sql, params)
        return [dict(zip(columns, row)) for row in rows]


def _query_error(e: duckdb.Error) -> str:
    """DuckDB's first line, with why when the sandbox refused (PerfDB.connect)."""
    first = str(e).splitlines()[0]
    if "disabled by configuration" in first or "configuration has been locked" in first or "extensions" in first:
        return (f"{first} (the PerfDB is opened alone and read-only: no files, extensions or settings; "
                "query the tables records and ceilings, the views admitted and rejected)")
    return first
