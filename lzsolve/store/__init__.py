"""Storing: the PerfDB (Parquet records, DuckDB views: perfdb), the artifact a tune writes
(dispatch.json, report.md, manifest, JIT caches: artifact) and atomic writes (fsutil)."""
