"""The tree's shape, as DESIGN.md states it: no module imports one that (through others) imports it
back, and the runtime never imports the solver or its heavy dependencies. Read from the source (every
import statement, at module level or inside a function; not those under TYPE_CHECKING, which never
run), so a circle is caught before it is first executed in a particular order."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("lzsolve", "runtime_loader")
NOT_IN_THE_RUNTIME = ("lzsolve", "pandas", "duckdb", "optuna", "pyarrow")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside `if TYPE_CHECKING:` blocks."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            inside.update(id(n) for child in node.body for n in ast.walk(child))
    return inside


def imported(name: str, path: Path) -> set[str]:
    """The absolute names every import statement of a module names (its modules, and module.attribute)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_nodes(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (a package's own parents left out: importing a
    submodule runs them first anyway, and they import it back by design)."""
    known = modules()
    return {name: {n for n in imported(name, path) if n in known and n != name and not name.startswith(n + ".")}
            for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circles():
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_runtime_imports_no_solver_and_no_solver_dependency():
    """runtime_loader is what a server imports: torch and, lazily, the kernel libraries a table names."""
    for name, path in modules().items():
        if name.startswith("runtime_loader"):
            heavy = {n for n in imported(name, path) if n.split(".")[0] in NOT_IN_THE_RUNTIME}
            assert not heavy, f"{name} imports {sorted(heavy)}"
