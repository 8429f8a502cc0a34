"""The package's layers import only downward:

    utils → model → auto_registration → (tasks, generation, corpus, serving) → baselines
          → (training, evaluation) → analysis → experiments → cli

A module may import its own subpackage and any lower layer, never a higher one or a sibling on its own
layer. Lazy imports inside functions count too: the whole source is parsed."""

from __future__ import annotations

import ast
from pathlib import Path

import t2mlr

PACKAGE = Path(t2mlr.__file__).resolve().parent
LAYERS = {
    "utils": 0,
    "model": 1,
    "auto_registration": 1.4,  # registers the model's config with the Auto classes once transformers loads them
    "__init__": 1.5,  # the package root re-exports the model and registers it with the Auto classes
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
