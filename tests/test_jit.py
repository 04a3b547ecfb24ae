"""JIT caches: packing, safe extraction, restore; hostile archives are refused."""
import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import warnings
from pathlib import Path

import pytest

import runtime_loader
from runtime_loader import jit
from runtime_loader.manifest import MANIFEST, build_manifest
from runtime_loader.table import TableError

from .tables import table


def fake_caches(root: Path):
    (root / "triton" / "ab12").mkdir(parents=True)
    (root / "triton" / "ab12" / "kernel.cubin").write_bytes(b"\x7fELF...")
    (root / "inductor" / "fxgraph").mkdir(parents=True)
    (root / "inductor" / "fxgraph" / "entry").write_bytes(b"data")


def test_pack_and_restore_round_trip(tmp_path, monkeypatch):
    fake_caches(tmp_path / "work")
    archive = tmp_path / "caches.tar"
    assert jit.pack(tmp_path / "work", ["inductor", "triton", "flashinfer"], archive) == ["inductor", "triton"]
    for var in jit.JIT_CACHES.values():
        monkeypatch.delenv(var, raising=False)
    target = jit.restore(archive, "f" * 64, tmp_path / "restored")
    assert (target / "triton" / "ab12" / "kernel.cubin").read_bytes() == b"\x7fELF..."
    assert os.environ["TRITON_CACHE_DIR"] == str(target / "triton")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(target / "inductor")
    assert "FLASHINFER_WORKSPACE_BASE" not in os.environ, "only the caches the archive holds are pointed"
    assert jit.restore(archive, "f" * 64, tmp_path / "restored") == target, "a second restore reuses the folder"


def hostile(kind: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(name, data=b"x", **attrs):
            info = tarfile.TarInfo(name)
            info.size = len(data) if attrs.get("type", tarfile.REGTYPE) == tarfile.REGTYPE else 0
            for k, v in attrs.items():
                setattr(info, k, v)
            tar.addfile(info, io.BytesIO(data) if info.size else None)
        add("triton/ok.json")
        {
            "absolute": lambda: add("/etc/cron.d/evil"),
            "dotdot": lambda: add("triton/../../evil.py"),
            "symlink": lambda: add("triton/link", type=tarfile.SYMTYPE, linkname="/etc/passwd"),
            "hardlink": lambda: add("triton/hard", type=tarfile.LNKTYPE, linkname="triton/ok.json"),
            "device": lambda: add("triton/dev", type=tarfile.CHRTYPE),
            "unknown_top": lambda: add("site-packages/evil.py"),
            # each passed the check, then failed restore_jit with an IsADirectoryError or NotADirectoryError
            "empty_name": lambda: add(""),
            "under_a_file": lambda: add("triton/ok.json/b"),
            "file_over_a_folder": lambda: (add("triton/d/x"), add("triton/d")),
        }[kind]()
    return buf.getvalue()


KINDS = ["absolute", "dotdot", "symlink", "hardlink", "device", "unknown_top", "empty_name", "under_a_file",
         "file_over_a_folder"]


@pytest.mark.parametrize("kind", KINDS)
def test_hostile_archives_are_refused_and_nothing_extracted(tmp_path, kind):
    folder = tmp_path / "artifact"
    (folder / "jit").mkdir(parents=True)
    (folder / "jit" / "caches.tar").write_bytes(hostile(kind))
    (folder / "dispatch.json").write_text(json.dumps(table(jit={"archive": "jit/caches.tar", "caches": ["triton"]})))
    (folder / MANIFEST).write_text(json.dumps(build_manifest(folder)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d = runtime_loader.load(folder, restore_jit=True, jit_dir=tmp_path / "jit")
    assert d.table is None and len(caught) == 1 and "jit archive member" in str(caught[0].message)
    with pytest.raises(TableError, match="jit archive member"):
        runtime_loader.load(folder, strict=True)  # refused even when not restoring
    assert not (tmp_path / "jit").exists(), "nothing was extracted"
    assert not Path("/etc/cron.d/evil").exists()


def test_an_empty_archive_is_said_to_be_empty(tmp_path):
    """It was reported as "not a plain tar (a compressed one could unpack to terabytes...)"."""
    archive = tmp_path / "caches.tar"
    archive.write_bytes(b"")
    with pytest.raises(TableError, match=r"jit archive caches.tar is empty \(0 bytes"):
        jit.check_archive(archive)


LONG = "triton/" + "a" * 60 + "/" + "b" * 90 + ".json"  # past a header's 100-byte name field


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
@pytest.mark.parametrize("name,link,problem", [
    (LONG, None, None),
    ("site-packages/" + "x" * 120 + "/evil.py", None, "outside the known caches"),
    ("triton/" + "x" * 120 + "/../../../evil.py", None, "climbs out"),
    ("triton/" + "l" * 120 + "/link", "/etc/passwd", "is a link"),
])
def test_the_header_walk_reads_names_as_tarfile_does(tmp_path, fmt, name, link, problem):
    """check_archive reads each member's name from the headers alone (ustar's name prefix, GNU's long
    names, pax records), as tarfile does, and refuses what extraction would refuse; restore's check of
    tarfile's own reading agrees."""
    archive = tmp_path / "caches.tar"
    with tarfile.open(archive, "w", format=fmt) as tar:
        tar.addfile(tarfile.TarInfo("triton/ok"), None)
        info = tarfile.TarInfo(name)
        if link:
            info.type, info.linkname = tarfile.SYMTYPE, link
        tar.addfile(info, None)
    if problem is None:
        assert jit.check_archive(archive) == len(tarfile.open(archive).getmembers()) + (fmt != tarfile.USTAR_FORMAT)
        assert [m.name for m in jit.check_members(archive)] == ["triton/ok", name]
        return
    for check in (jit.check_archive, jit.check_members):
        with pytest.raises(TableError, match=problem):
            check(archive)


def test_an_archive_at_the_member_limit_loads_within_a_second(tmp_path):
    """Every load walks the archive's headers (restoring or not): at the member limit that stays well
    under a second (tarfile's own walk of 200,000 members took 7-9 s on a loaded VM)."""
    import time

    archive = tmp_path / "caches.tar"
    archive.write_bytes(tarfile.TarInfo("triton/x").tobuf() * jit.MAX_ARCHIVE_MEMBERS + bytes(2 * tarfile.BLOCKSIZE))
    started = time.perf_counter()
    assert jit.check_archive(archive) == jit.MAX_ARCHIVE_MEMBERS
    assert time.perf_counter() - started < 1.0
    archive.write_bytes(tarfile.TarInfo("triton/x").tobuf() * (jit.MAX_ARCHIVE_MEMBERS + 1) + bytes(1024))
    with pytest.raises(TableError, match="members"):
        jit.check_archive(archive)

COMPILE_TWO_AND_PACK_ONE = """
import json, sys, time, torch
from pathlib import Path
from runtime_loader import jit, registry
from runtime_loader.ops import Signature
out = Path(sys.argv[1])
jit.point_caches(out / ".jit-work")
records = []
# the kernel the table leaves out compiles first: whatever its first compile shares with later ones
# (Inductor's headers, say) is written then, and must not be what the chosen kernel's restore needs
# the chosen kernel at both of the table's buckets, which a server's warm-up calls
for kernel_id, calls in (("compile.gelu", [(torch.randn(8, 64),)]),
                         ("compile.rms_norm", [(torch.randn(tokens, 64), torch.randn(64), 1e-6) for tokens in (4, 8)])):
    since = time.time() - 0.05
    for args in calls:
        registry.get(kernel_id).impl(*args)
    records.append({"kernel_id": kernel_id, "jit_files": json.dumps(jit.written_since(["inductor", "triton"], since))})
sys.path.insert(0, sys.argv[2])
from tests.tables import entry, table
from lzsolve.store.artifact import kernel_provenance, write_artifact
sig = Signature.make("norm.rms", {"hidden": 64}, (), "fp32")
raw = table(ops=[entry(sig, {"kernel_id": "compile.rms_norm"})], kernels=kernel_provenance(["compile.rms_norm"]),
            buckets={"norm.rms": {"tokens": [4, 8]}})
write_artifact(out, raw, "report", records)
print(json.dumps({r["kernel_id"]: json.loads(r["jit_files"]) for r in records}))
"""

LOAD_AND_CALL = """
import json, sys, torch
import runtime_loader
from torch._dynamo.utils import counters
d = runtime_loader.load(sys.argv[1], strict=True, restore_jit=sys.argv[2] == "restore", warmup=True,
                        jit_dir=sys.argv[3])
graphs = counters["stats"]["unique_graphs"]
out = d.rms_norm(torch.randn(8, 64), torch.randn(64), 1e-6)  # the first "request"
print(json.dumps({"hit": counters["inductor"]["fxgraph_cache_hit"], "miss": counters["inductor"]["fxgraph_cache_miss"],
                  "compiled_on_request": counters["stats"]["unique_graphs"] - graphs,
                  "kernel": d.kernel_for("rms_norm", torch.randn(8, 64), torch.randn(64))}))
"""


def run(code, *args, cwd, env):
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], capture_output=True,
                            text=True, cwd=cwd, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """One process compiles two Inductor kernels (on CPU: a C++ compile each, most of a minute) and
    writes an artifact whose table chose one of them: (its folder, the files each first call wrote,
    the environment, whose default caches are empty)."""
    repo, root = Path(__file__).resolve().parents[1], tmp_path_factory.mktemp("compiled")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(root / "empty-default-cache"),
           "TRITON_CACHE_DIR": str(root / "empty-default-triton")}
    written = json.loads(run(COMPILE_TWO_AND_PACK_ONE, root / "artifact", repo, cwd=repo, env=env))
    return root / "artifact", written, env


def test_restored_caches_mean_the_first_request_compiles_nothing(compiled, tmp_path):
    artifact, _, env = compiled
    assert (artifact / "jit" / "caches.tar").is_file()
    assert json.loads((artifact / "dispatch.json").read_text())["jit"]["caches"] == ["inductor"]
    restored = json.loads(run(LOAD_AND_CALL, artifact, "restore", tmp_path / "jit", cwd=tmp_path, env=env))
    assert restored["kernel"] == "compile.rms_norm"
    assert restored["compiled_on_request"] == 0, "warm-up compiled everything before the first request"
    assert restored["hit"] > 0 and restored["miss"] == 0, "Inductor found every graph in the restored cache"
    cold = json.loads(run(LOAD_AND_CALL, artifact, "cold", tmp_path / "jit2", cwd=tmp_path, env=env))
    assert cold["miss"] > 0, "without the artifact's caches Inductor compiles from scratch"


def test_pack_takes_the_named_files_of_a_kind_and_the_whole_of_the_others(tmp_path):
    fake_caches(tmp_path / "work")
    (tmp_path / "work" / "triton" / "cd34").mkdir()
    (tmp_path / "work" / "triton" / "cd34" / "other.cubin").write_bytes(b"other")
    (tmp_path / "secret").write_text("no")
    archive = tmp_path / "caches.tar"
    files = {"triton": ["triton/ab12/kernel.cubin", "triton/gone.cubin",  # removed since: skipped
                        "triton/../secret", "/etc/passwd", "inductor/fxgraph/entry"]}  # never outside triton/
    assert jit.pack(tmp_path / "work", ["inductor", "triton"], archive, files) == ["inductor", "triton"]
    with tarfile.open(archive) as tar:
        names = sorted(m.name for m in tar if m.isfile())
    assert names == ["inductor/fxgraph/entry", "triton/ab12/kernel.cubin"]


def test_pack_keeps_only_the_shared_objects_of_flashinfer(tmp_path):
    """A restored FlashInfer loads <name>/<name>.so from its AOT folder without ninja: the
    build's object files, sources and ninja files stay out of the archive, packed whole or by name."""
    ops = tmp_path / "work" / "flashinfer" / ".cache" / "flashinfer" / "0.5.3" / "90a" / "cached_ops"
    (ops / "norm").mkdir(parents=True)
    for name in ("norm.so", "norm.cuda.o", "build.ninja", ".ninja_log"):
        (ops / "norm" / name).write_bytes(b"x" * 10)
    so = (ops / "norm" / "norm.so").relative_to(tmp_path / "work").as_posix()
    for files in (None, {"flashinfer": [so, so.replace("norm.so", "norm.cuda.o")]}):
        archive = tmp_path / "caches.tar"
        assert jit.pack(tmp_path / "work", ["flashinfer"], archive, files) == ["flashinfer"]
        with tarfile.open(archive) as tar:
            assert [m.name for m in tar if m.isfile()] == [so]
    (ops / "norm" / "norm.so").unlink()
    assert jit.pack(tmp_path / "work", ["flashinfer"], tmp_path / "caches.tar") == [], "nothing a restore needs"


RELOCATED_COMPILE = """
import os, sys
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

@triton.jit
def copy(x, y, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + i, tl.load(x + i, mask=i < n), mask=i < n)

source = ASTSource(copy, signature={"x": "*fp32", "y": "*fp32", "n": "i32", "BLOCK": "constexpr"}, constexprs={"BLOCK": 128})
triton.compile(source, target=GPUTarget("cuda", 90, 32))  # compiles for Hopper with no GPU here
"""


def test_a_restored_triton_cache_is_a_hit_where_it_lands(tmp_path):
    """Triton's cache groups name their files by absolute path, where the tuning run compiled them:
    restored elsewhere, each is a miss and the server compiles again. restore points them home."""
    pytest.importorskip("triton.backends.nvidia")
    work, script = tmp_path / "work", tmp_path / "compile.py"  # Triton reads a kernel's source from its file
    script.write_text(RELOCATED_COMPILE)
    env = {**os.environ, "TRITON_CACHE_DIR": str(work / "triton")}
    subprocess.run([sys.executable, str(script)], env=env, check=True, capture_output=True)
    archive = tmp_path / "caches.tar"
    assert jit.pack(work, ["triton"], archive) == ["triton"]
    target = jit.restore(archive, "e" * 64, tmp_path / "restored")
    before = {p: p.stat().st_mtime_ns for p in (target / "triton").rglob("*")}
    env["TRITON_CACHE_DIR"] = str(target / "triton")
    subprocess.run([sys.executable, str(script)], env=env, check=True, capture_output=True)
    after = {p: p.stat().st_mtime_ns for p in (target / "triton").rglob("*")}
    assert after == before, "the second compile found every file where the group says"
    groups = list((target / "triton").rglob("__grp__*.json"))
    assert groups and all(str(target) in g.read_text() for g in groups)


def test_written_since_lists_what_a_first_call_wrote(tmp_path, monkeypatch):
    import time
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    (tmp_path / "triton" / "old").mkdir(parents=True)
    (tmp_path / "triton" / "old" / "k.json").write_text("{}")
    os.utime(tmp_path / "triton" / "old" / "k.json", (1, 1))
    since = time.time() - 0.05
    (tmp_path / "triton" / "new").mkdir()
    (tmp_path / "triton" / "new" / "k.cubin").write_bytes(b"x")
    assert jit.written_since(["triton"], since) == ["triton/new/k.cubin"]
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert jit.written_since(["inductor"], since) == [], "a cache this process does not point anywhere"


def test_the_archive_carries_the_chosen_kernels_entries_alone(compiled):
    """(That they suffice: the restore of this artifact, test_restored_caches_mean_the_first_request_compiles_nothing.)"""
    artifact, written, _ = compiled
    assert written["compile.gelu"] and written["compile.rms_norm"], "each first call compiled something"
    with tarfile.open(artifact / "jit" / "caches.tar") as tar:
        packed = {m.name for m in tar if m.isfile()}
    assert packed == set(written["compile.rms_norm"]), "the files the chosen kernel's first call wrote"
    assert set(written["compile.gelu"]) - packed, "the other kernel's entries stay out"


def test_a_cache_goes_whole_unless_every_kernel_of_it_wrote_its_own_files():
    from lzsolve.store.artifact import jit_files
    kernels = {"a": {"jit_caches": ["triton"]}, "b": {"jit_caches": ["triton", "inductor"]}, "c": {"jit_caches": []}}
    own = [{"kernel_id": "a", "jit_files": json.dumps(["triton/a1"])},
           {"kernel_id": "b", "jit_files": json.dumps(["triton/b1", "inductor/b2"])},
           {"kernel_id": "z", "jit_files": json.dumps(["triton/z1"])},  # not in the table
           {"kernel_id": "a", "jit_files": None}]  # a fast first call: nothing to say
    assert jit_files({"kernels": kernels}, own) == {"triton": ["triton/a1", "triton/b1"], "inductor": ["inductor/b2"]}
    # b once took its time and wrote nothing: it loaded what another kernel compiled
    borrowed = own + [{"kernel_id": "b", "jit_files": "[]"}]
    assert jit_files({"kernels": kernels}, borrowed) == {}
    # a never recorded what it wrote (an older run): triton goes whole, inductor (b's alone) by file
    older = [r for r in own if r["kernel_id"] != "a"]
    assert jit_files({"kernels": kernels}, older) == {"inductor": ["inductor/b2"]}
