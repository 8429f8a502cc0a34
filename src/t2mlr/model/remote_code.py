"""Saved T²MLR directories that load without t2mlr installed, as Hub models with remote code do.

transformers finds a model type it does not know through the config's `auto_map`, which names modules
saved beside the weights; with `trust_remote_code=True` it copies them, and every module they import
relatively (a `from .x import y` line), into its module cache and imports them. So `save_pretrained`
writes (`write_remote_code_modules`):

* the package's own model code: every module the config and the model import, directly or not, copied
  from the installed sources at save time under its file name (`t2mlr/model/cache.py` → `cache.py`,
  `t2mlr/utils.py` → `utils.py`), with its imports of the package made relative. Nothing is kept twice
  by hand: the copies are the code of the version that saved the weights, and need torch and
  transformers only;
* the two entry modules `AUTO_MAP` names (`configuration_t2mlr.py`, `modeling_t2mlr.py`). Each gives the
  installed package's class when there is one (the class importing `t2mlr.model` registers, so the library's own
  tools recognise the model, and a directory saved by an older release runs today's code) and the copy
  otherwise, which then registers the `t2mlr` type with the Auto classes as the package does. Only a
  missing `t2mlr` selects the copy; any other import error is raised.

Once `t2mlr.model` is imported the Auto classes know the type directly and `auto_map` is not used.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

PACKAGE = "t2mlr"
MODEL_PACKAGE = f"{PACKAGE}.model"
AUTO_MAP = {
    "AutoConfig": "configuration_t2mlr.T2MLRConfig",
    "AutoModelForCausalLM": "modeling_t2mlr.T2MLRForCausalLM",
}
# The modules of the model package the entry modules import: the rest of the copy is what they import.
ENTRY_SOURCES = ("configuration", "modeling")
ENTRY_TEMPLATE = '''# Written by t2mlr's save_pretrained (t2mlr.model.remote_code); regenerated at every save.
"""{name} for `from_pretrained(DIR, trust_remote_code=True)`: the installed t2mlr package's class, or
without the package the copy of its model code saved beside this file (`{module}.py` and what it imports)."""

try:
    from {package}.{module} import {name}
except ModuleNotFoundError as missing:
    if missing.name != "{root}":
        raise
{copy_imports}
'''
# transformers copies into its module cache only the modules an entry module's lines import (and theirs):
# the config's needs the model's as well, so that a config loaded alone registers the model with the Auto classes,
# as importing the installed package does.
MODEL_REGISTRATION = "from .modeling import register_auto_classes  # importing the model registers it"


def entry_modules() -> dict[str, str]:
    """File name -> text of the modules `AUTO_MAP` names. (Their relative imports are filled in here, not
    written in the template: transformers reads every line of this file that starts with one as an import.)"""
    files = {}
    for reference in AUTO_MAP.values():
        entry, _, name = reference.rpartition(".")
        module = entry.removesuffix("_t2mlr")
        copy_imports = [f"from .{module} import {name}"] + ([MODEL_REGISTRATION] if module != "modeling" else [])
        files[f"{entry}.py"] = ENTRY_TEMPLATE.format(
            name=name, module=module, package=MODEL_PACKAGE, root=PACKAGE,
            copy_imports="\n".join(f"    {line}" for line in copy_imports),
        )
    return files


def write_remote_code_modules(directory: str | Path) -> None:
    """Write the entry modules and the copy of the model code into a saved model directory.

    Run from the installed package, the copy is made from its sources; run from a copy (a model loaded
    with `trust_remote_code=True` and no package installed, saved again), the copy's files are written as
    they are."""
    rewrite = __package__ == MODEL_PACKAGE
    files = {**model_code(rewrite), **entry_modules()}
    for name, text in files.items():
        (Path(directory) / name).write_text(text, encoding="utf-8")
    check_transformers_finds_every_module(Path(directory), files)


def check_transformers_finds_every_module(directory: Path, files: dict[str, str]) -> None:
    """Every module transformers will look for beside the entry modules is there: it follows each line
    that reads as a relative import (in strings too) from file to file, and stops a load at the first
    missing file."""
    # imported here: `configuration` imports this module while transformers may still be importing itself
    from transformers.dynamic_module_utils import get_relative_imports

    pending = [f"{reference.rpartition('.')[0]}.py" for reference in AUTO_MAP.values()]
    seen = set(pending)
    while pending:
        file_name = pending.pop()
        for module in get_relative_imports(directory / file_name):
            wanted = f"{module}.py"
            if wanted not in files:
                raise ValueError(f"transformers would look for {wanted} beside {file_name}, which the saved copy does "
                                 "not hold: a line of the package's code there reads as a relative import")
            if wanted not in seen:
                seen.add(wanted)
                pending.append(wanted)


# ---------------------------------------------------------------------------------------------- the copy


def model_code(rewrite: bool = True) -> dict[str, str]:
    """File name -> text of every module the entry sources import, transitively, inside this package.

    `rewrite`: make each import of the package relative to the one flat directory the files go to (the
    installed package); False copies the texts as they are (they are such a copy already)."""
    root = __name__.partition(".")[0]
    pending = [f"{__package__}.{module}" for module in ENTRY_SOURCES]
    files: dict[str, str] = {}
    origins: dict[str, str] = {}
    while pending:
        name = pending.pop()
        file_name = flat_file_name(name)
        if file_name in origins:
            if origins[file_name] != name:
                raise ValueError(f"{name} and {origins[file_name]} would both be saved as {file_name}: rename one")
            continue
        origins[file_name] = name
        files[file_name], needed = module_copy(name, root, rewrite)
        pending.extend(needed)
    return files


def flat_file_name(module: str) -> str:
    return f"{module.rpartition('.')[2]}.py"


def module_copy(name: str, root: str, rewrite: bool) -> tuple[str, list[str]]:
    """The text of module `name` for the flat copy, and the modules of the package it imports."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None or spec.submodule_search_locations is not None:
        raise ValueError(f"{name} is not a plain module, so it cannot be copied beside the weights")
    source = Path(spec.origin).read_text(encoding="utf-8")
    package = name.rpartition(".")[0]
    lines = source.splitlines(keepends=True)
    needed: list[str] = []
    edits: list[tuple[ast.stmt, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(is_inside(alias.name, root) for alias in node.names):
            raise ValueError(f"{name}, line {node.lineno}: write `from ... import ...` for modules of {root} "
                             "(a plain `import` cannot be made relative in the saved copy)")
        if not isinstance(node, ast.ImportFrom):
            continue
        target = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
        if not is_inside(target, root):
            continue
        replacement, modules = relative_import(node, target, package, name)
        needed += modules
        if replacement is not None:
            edits.append((node, replacement))
    if not rewrite:
        return source, needed
    for node, replacement in sorted(edits, key=lambda edit: edit[0].lineno, reverse=True):
        lines[node.lineno - 1 : node.end_lineno] = [statement_lines(lines, node, name, replacement)]
    relative_path = Path(*name.split(".")).with_suffix(".py")
    version = getattr(sys.modules.get(root), "__version__", "unknown")
    header = (f"# {relative_path} of {root} {version}, copied by save_pretrained with the package's imports made "
              "relative (t2mlr.model.remote_code): edit the package, not this copy.\n")
    return header + "".join(lines), needed


def is_inside(module: str, root: str) -> bool:
    return module == root or module.startswith(f"{root}.")


def relative_import(node: ast.ImportFrom, target: str, package: str, name: str) -> tuple[str | None, list[str]]:
    """`from .x import ...` for an import of the package (None: it already reads so), and the modules it needs.

    transformers copies only the modules named on `from .x import` lines, so a module imported as a whole
    (`from . import checks`) gets such a line beside it."""
    names = ", ".join(alias.name if alias.asname is None else f"{alias.name} as {alias.asname}" for alias in node.names)
    spec = importlib.util.find_spec(target)
    if spec is not None and spec.submodule_search_locations is None:  # from a module: names defined there
        flat = flat_file_name(target).removesuffix(".py")
        unchanged = node.level == 1 and node.module is not None and target.rpartition(".")[0] == package
        return (None if unchanged else f"from .{flat} import {names}"), [target]
    statements, modules = [], []
    for alias in node.names:  # from a package: its modules
        module = f"{target}.{alias.name}"
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"{name}, line {node.lineno}: `{alias.name}` is not a module of {target}; import it "
                             "from the module that defines it, so the saved copy can carry that module")
        flat = flat_file_name(module).removesuffix(".py")
        bound = alias.asname or alias.name
        statements += [f"from .{flat} import __name__ as _{flat}_module  # names {flat}.py for transformers",
                       f"from . import {flat}" + ("" if bound == flat else f" as {bound}")]
        modules.append(module)
    return "\n".join(statements), modules


def statement_lines(lines: list[str], node: ast.stmt, name: str, replacement: str) -> str:
    """`replacement` in place of the statement `node` (which must have its lines to itself), indented as it."""
    first, last = lines[node.lineno - 1], lines[node.end_lineno - 1]
    indent = first[: node.col_offset]
    if indent.strip() or last[node.end_col_offset :].strip().split("#")[0].strip():
        raise ValueError(f"{name}, line {node.lineno}: put this import on lines of its own")
    return "".join(f"{indent}{line}\n" for line in replacement.splitlines())
