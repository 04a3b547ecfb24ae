"""The docs cannot drift from the tree (issue 56): every relative link in the project's markdown
resolves, to a heading where it names one; the reference pages in docs/ cite only names, Dispatcher
methods and `lzsolve` commands that exist, as README.md's test checks for the README; every
section of the benchmark log that code, tests or docs cite exists; and BENCHMARKS.md's table cites
only scripts and device-runner stages that exist."""
import re
from pathlib import Path

import pytest

import runtime_loader
from lzsolve.cli import cli

from .test_readme import resolves

REPO = Path(__file__).resolve().parents[1]
LOG = REPO / "docs" / "benchmark-log.md"
PAGES = sorted(p for p in (REPO / "docs").glob("*.md") if p != LOG)
MARKDOWN = [REPO / "README.md", REPO / "BENCHMARKS.md", REPO / "CONTRIBUTING.md", REPO / "DESIGN.md",
            REPO / "ci" / "README.md", REPO / "benchmarks" / "archive" / "README.md", LOG, *PAGES]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}


def links(path: Path) -> list[str]:
    text = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", path.read_text(), flags=re.S))  # code is no link
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+://|mailto:", t)]


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(path):
    broken = []
    for target in links(path):
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists():
            broken.append(target)
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(target)
    assert broken == []


def test_the_pages_cite_names_that_exist():
    text = "\n".join(p.read_text() for p in PAGES)
    names = set(re.findall(r"(?<![\w./])((?:runtime_loader|lzsolve)(?:\.\w+)+)", text))
    assert [n for n in sorted(names) if not resolves(n)] == []
    methods = set(re.findall(r"(?<![\w.])d\.(\w+)\(", text))
    assert {"attention", "explain", "coverage"} <= methods
    assert [m for m in sorted(methods) if not hasattr(runtime_loader.Dispatcher, m)] == []
    commands = set(re.findall(r"`lzsolve (\w+)", text))
    assert [c for c in sorted(commands) if c not in cli.commands] == []


def log_sections() -> set[str]:
    return set(re.findall(r"^##+ (\d+(?:\.\d+)*)\.? ", LOG.read_text(), re.M))


def test_every_cited_log_section_exists():
    """A citation of the benchmark log ("log §N", "docs/benchmark-log.md §N") must name a section there:
    the log keeps its numbers. (Code comments cite the script behind a figure where there is one.)"""
    sections, cited = log_sections(), {}
    sources = [REPO / "README.md", REPO / "BENCHMARKS.md", *PAGES]
    for folder in ("lzsolve", "runtime_loader", "tests", "benchmarks", "ci"):
        sources += [p for p in (REPO / folder).rglob("*") if p.suffix in (".py", ".sh", ".md")]
    for path in sources:
        for first, last in re.findall(r"§(\d+(?:\.\d+)*)(?:-(\d+(?:\.\d+)*))?", path.read_text()):
            for n in (first, last and (first.rsplit(".", 1)[0] + "." + last if "." not in last and "." in first
                                       else last)):
                if n and n not in sections:
                    cited.setdefault(n, []).append(str(path.relative_to(REPO)))
    assert cited == {}


def test_benchmarks_table_cites_what_exists():
    text = (REPO / "BENCHMARKS.md").read_text()
    runner = (REPO / "benchmarks" / "device.sh").read_text()
    dispatch = runner[runner.rindex('case "$stage" in'):]  # the runner's last case: the stages it takes
    stages = {s for branch in re.findall(r"^  ([\w|]+)\)", dispatch, re.M) for s in branch.split("|")}
    assert {"setup", "session", "cute", "parity", "e2e", "batch"} <= stages
    rows = [line for line in text.splitlines() if line.startswith("| ") and line.count("|") >= 8]
    assert len(rows) > 20
    for row in rows:
        for script in re.findall(r"([\w/]+\.(?:py|sh))\b", row):
            assert any((REPO / d / Path(script).name).exists() for d in ("benchmarks", "ci", ".")), (script, row)
        for stage in re.findall(r"device\.sh (\w+)", row):
            assert stage in stages, (stage, row)
        assert set(re.findall(r"§(\d+(?:\.\d+)*)", row)) <= log_sections(), row


def test_the_code_cites_scripts_not_sections():
    """lzsolve/ and runtime_loader/ cite the script behind a figure (benchmarks/..., ci/...); a log
    section only where no script made it, and then by its file ("docs/benchmark-log.md §N")."""
    for folder in ("lzsolve", "runtime_loader"):
        for path in (REPO / folder).rglob("*.py"):
            for line in path.read_text().splitlines():
                for match in re.finditer(r"(\S*)\s*§\d", line):
                    assert match.group(1).lstrip("(") == "docs/benchmark-log.md", f"{path.relative_to(REPO)}: {line.strip()}"
