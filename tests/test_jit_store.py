"""The measurement cache's JIT files (lzsolve.store.jit_store): names read from a PerfDB are data."""
import json
import os

from lzsolve.store.jit_store import copy_files, named_files


def test_only_files_a_restore_needs_in_known_caches_are_named():
    records = [{"jit_files": json.dumps(["flashinfer/m/m.so", "flashinfer/m/m.o", "triton/ab/k.cubin"])},
               {"jit_files": json.dumps(["elsewhere/x.so", 7, None, "inductor/fx/g.py"])},
               {"jit_files": "not json"}, {"jit_files": json.dumps({"a": 1})}, {"jit_files": None}, {}]
    assert named_files(records) == {"flashinfer/m/m.so", "triton/ab/k.cubin", "inductor/fx/g.py"}


def test_copies_are_regular_files_inside_the_source_and_never_overwrite(tmp_path):
    source, target, outside = tmp_path / "source", tmp_path / "target", tmp_path / "secret"
    (source / "triton" / "ab").mkdir(parents=True)
    (source / "triton" / "ab" / "k.cubin").write_bytes(b"cubin")
    outside.write_text("not a cache file")
    os.symlink(outside, source / "triton" / "ab" / "link.cubin")
    os.symlink(tmp_path, source / "triton" / "up")
    (target / "triton" / "ab").mkdir(parents=True)
    (target / "triton" / "ab" / "old.cubin").write_bytes(b"mine")
    (source / "triton" / "ab" / "old.cubin").write_bytes(b"theirs")
    names = ["triton/ab/k.cubin", "triton/ab/link.cubin", "triton/up/secret", "triton/../secret", "/etc/passwd",
             "triton/ab/missing.cubin", "triton/ab/old.cubin"]
    assert copy_files(names, source, target) == 1
    assert (target / "triton" / "ab" / "k.cubin").read_bytes() == b"cubin"
    assert (target / "triton" / "ab" / "old.cubin").read_bytes() == b"mine"
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()) == [
        "triton/ab/k.cubin", "triton/ab/old.cubin"], "no link followed, nothing outside, no temporary left"
