"""The package's layers import only downward:

    utils → settings → model → (tasks, generation, corpus, serving) → baselines
          → (training, evaluation) → analysis → experiments → cli

A module may import its own subpackage and any lower layer, never a higher one or a sibling on its own
layer. Lazy imports inside functions count too: the whole source is parsed. Inside a subpackage, no two
modules may import each other, directly or round a longer circle. And nothing imports the package from
above it: no Python file lives among the results, configs or docs (a script belongs in benchmarks/ or
becomes a command), and the package imports neither benchmarks nor tests."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import t2mlr

PACKAGE = Path(t2mlr.__file__).resolve().parent
LAYERS = {
    "utils": 0,
    "settings": 0.5,  # every architecture's settings and their checks, as pure data (torch-free)
    "model": 1,
    "__init__": 1.5,  # the package root re-exports the model's classes, loaded on first use
    "tasks": 2, "generation": 2, "corpus": 2, "serving": 2,
    "baselines": 3,
    "training": 4, "evaluation": 4,
    "rl": 4.5,  # reinforcement learning on TRL, above the training loop it reuses (configs, optimizer, metrics)
    "analysis": 5,
    "experiments": 6,
    "cli": 7,
    "__main__": 8,  # `python -m t2mlr` runs the CLI
}


def part_of(module_path: Path) -> str:
    relative = module_path.relative_to(PACKAGE)
    return relative.parts[0].removesuffix(".py")


def imported_parts(source: str, module_path: Path) -> set[str]:
    """The top-level t2mlr parts a module imports (absolute or relative)."""
    parts = set()
    depth = len(module_path.relative_to(PACKAGE).parts)  # 1 for t2mlr/x.py, 2 for t2mlr/pkg/x.py
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                names = [node.module or ""]
            elif node.level < depth:  # relative inside a subpackage: stays in it
                names = [f"t2mlr.{part_of(module_path)}"]
            else:  # relative from the package root: `from . import x` / `from .x import y`
                names = [f"t2mlr.{node.module or node.names[0].name}"]
        for name in names:
            if name == "t2mlr":
                parts.add("__init__")
            elif name.startswith("t2mlr."):
                parts.add(name.split(".")[1])
    return parts


def test_every_module_imports_only_from_lower_layers() -> None:
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = part_of(path)
        assert own in LAYERS, f"{path}: part {own!r} has no layer; add it to LAYERS"
        for target in imported_parts(path.read_text(encoding="utf-8"), path) - {own}:
            if LAYERS.get(target, 99) >= LAYERS[own]:
                violations.append(f"{path.relative_to(PACKAGE)} ({own}) imports t2mlr.{target}")
    assert not violations, "imports that run up or across the layers:\n" + "\n".join(violations)


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    fake = PACKAGE / "model" / "modeling.py"
    assert imported_parts("from t2mlr.training import train\nfrom .cache import T2MLRCache\n", fake) == {
        "training", "model"}
    assert imported_parts("def f():\n    import t2mlr.experiments.s5_presets\n", fake) == {"experiments"}


# ---------------------------------------------------------------------------------------------- import circles


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The t2mlr modules one module imports (a name imported from a package counts as its submodule when
    there is one), relative imports resolved."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names}
    return {name for name in found if name in known and name != module}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for node in graph:
        if node not in index:
            visit(node)
    return circles


def package_graph() -> dict[str, set[str]]:
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    known = set(paths)
    return {name: imported_modules(path.read_text(encoding="utf-8"), name, path.name == "__init__.py", known)
            for name, path in paths.items()}


def test_no_module_imports_itself_round_a_circle() -> None:
    circles = import_circles(package_graph())
    assert not circles, "modules importing each other: " + "; ".join(" ⇄ ".join(c) for c in circles)


def test_the_circle_finder_sees_a_circle() -> None:
    known = {"t2mlr.x.a", "t2mlr.x.b", "t2mlr.x.c", "t2mlr.x"}
    edges = {"t2mlr.x.a": "from t2mlr.x.b import f\n", "t2mlr.x.b": "def g():\n    from . import c\n",
             "t2mlr.x.c": "import t2mlr.x.a\n", "t2mlr.x": ""}
    graph = {name: imported_modules(source, name, name == "t2mlr.x", known) for name, source in edges.items()}
    assert graph["t2mlr.x.b"] == {"t2mlr.x.c"}
    assert import_circles(graph) == [["t2mlr.x.a", "t2mlr.x.b", "t2mlr.x.c"]]
    del graph["t2mlr.x.c"], graph["t2mlr.x.b"]
    graph["t2mlr.x.a"] = set()
    assert import_circles(graph) == []


# ---------------------------------------------------------------------------------------------- the repository

REPOSITORY = PACKAGE.parents[1]
NO_CODE = ("results", "docs", "configs")  # data and words: what produced them is a benchmark or a command


def test_no_script_lives_among_results_docs_or_configs() -> None:
    if not (REPOSITORY / "pyproject.toml").is_file():
        return  # an installed package without its repository
    scripts = [str(path.relative_to(REPOSITORY)) for folder in NO_CODE for path in (REPOSITORY / folder).rglob("*.py")]
    assert not scripts, f"scripts that import the package from above it (move them to benchmarks/): {scripts}"


def test_the_package_imports_no_script() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            offenders += [f"{path.relative_to(PACKAGE)}: {name}" for name in names
                          if name.split(".")[0] in ("benchmarks", "tests", "conftest")]
    assert not offenders, "the package imports scripts above it: " + ", ".join(offenders)


TEST_HELPERS = {path.stem for path in (REPOSITORY / "tests").glob("*.py")} | {"tests"}


def test_every_script_lives_in_benchmarks_or_tests() -> None:
    """Code above the package is either a benchmark or a test: no script among data, docs or anywhere else."""
    if not (REPOSITORY / ".git").exists():
        return  # an installed package without its repository
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=REPOSITORY, capture_output=True, text=True,
                             check=True).stdout.split()
    elsewhere = [name for name in tracked if name.split("/")[0] not in ("src", "tests", "benchmarks")]
    assert not elsewhere, f"scripts outside benchmarks/ and tests/ (move them to benchmarks/): {elsewhere}"


def test_benchmarks_import_neither_tests_nor_each_other_round_a_circle() -> None:
    """Benchmarks sit above the package and below the tests (tests load them): they may import the package and
    each other, never a test or a test helper, and never round a circle."""
    if not (REPOSITORY / "benchmarks").is_dir():
        return
    scripts = {path.stem: path for path in (REPOSITORY / "benchmarks").glob("*.py")}
    graph: dict[str, set[str]] = {}
    offenders = []
    for name, path in sorted(scripts.items()):
        graph[name] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            modules = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                       else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            for module in modules:
                top = module.split(".")[0]
                if top in TEST_HELPERS - set(scripts) or top == "tests":
                    offenders.append(f"benchmarks/{path.name}: {module}")
                if top == "benchmarks" and module.count("."):
                    top = module.split(".")[1]
                if top in scripts and top != name:
                    graph[name].add(top)
    assert not offenders, "benchmarks that import tests: " + ", ".join(offenders)
    assert not import_circles(graph), f"benchmarks importing each other: {import_circles(graph)}"
