"""A saved T²MLR directory is self-contained for `trust_remote_code=True`, as a Hub model with remote code is.

Loaded in a fresh virtual environment that has torch and transformers but not t2mlr (checked: `import t2mlr`
fails there), the directory's own copy of the model code computes the library's logits on the exact and
Jacobi paths and generates its tokens; saved again there, it writes the same modules. The copy is the
package's source with only its imports changed, so nothing is maintained twice, and what the copy cannot
carry (an import it cannot make relative, a line transformers would take for an import of a missing module)
stops the save with the reason.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import site
import subprocess
import sys
import venv
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from conftest import random_ids, tiny_model

from t2mlr.model import remote_code

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GREEDY_TOKENS = 6


def environment_without_t2mlr(directory: Path) -> Path:
    """A new virtual environment holding this one's packages (linked, not installed) except t2mlr: every
    entry of this interpreter's site-packages but t2mlr's own (the package, its metadata, an editable
    install's path file). Returns its python."""
    venv.EnvBuilder(with_pip=False).create(directory)
    packages = next(directory.glob("lib/python*/site-packages"))
    parents = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    for parent in filter(Path.is_dir, map(Path, parents)):
        for entry in parent.iterdir():
            if "t2mlr" not in entry.name.lower() and not (packages / entry.name).exists():
                (packages / entry.name).symlink_to(entry)
    return directory / "bin" / "python"


def run_isolated(python: Path, code: str, work: Path) -> subprocess.CompletedProcess:
    """`code` in the environment, as a user's script: no PYTHONPATH, a module cache of its own, offline."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_MODULES_CACHE=str(work / "modules"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.run([str(python), "-c", code], cwd=work, env=env, capture_output=True, text=True, timeout=600)


LOAD_AND_RUN = """
import json, sys, torch
torch.set_num_threads(1)
try:
    import t2mlr
except ModuleNotFoundError as missing:
    assert missing.name == "t2mlr"
else:
    raise SystemExit(f"t2mlr is importable here ({t2mlr.__file__}): not an environment without the package")
from transformers import AutoConfig, AutoModelForCausalLM

def outputs(directory):
    config = AutoConfig.from_pretrained(directory, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True).eval()
    ids = torch.load(IDS)
    with torch.no_grad():
        generated = model.generate(ids, max_new_tokens=GREEDY_TOKENS, do_sample=False, output_logits=True,
                                   return_dict_in_generate=True)
        return model, {
            "exact": model(ids, recurrence="exact").logits,
            "jacobi": model(ids, recurrence="jacobi", d_forward=3, d_backward=1).logits,
            "tokens": generated.sequences, "step_logits": torch.stack(generated.logits, dim=1),
            "classes": [type(config).__module__, type(model).__module__, type(model.config) is type(config)],
        }

model, first = outputs(SAVED)
model.save_pretrained(RESAVED)
_, second = outputs(RESAVED)
first["classes"].append("t2mlr" in sys.modules)
torch.save({"first": first, "second": second}, OUT)
"""


@pytest.fixture(scope="module")
def fresh_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    python = environment_without_t2mlr(tmp_path_factory.mktemp("venv") / "env")
    probe = run_isolated(python, "import t2mlr", python.parent)
    assert probe.returncode != 0 and "No module named 't2mlr'" in probe.stderr, probe.stderr
    return python


@pytest.mark.slow
def test_a_saved_directory_runs_in_an_environment_without_t2mlr(fresh_python: Path, tmp_path: Path) -> None:
    model = tiny_model(dtype=torch.float32)  # gates open: the recurrence changes every logit
    model.save_pretrained(tmp_path / "saved")
    ids = random_ids(2, 7)
    torch.save(ids, tmp_path / "ids.pt")
    code = "\n".join(f"{name} = {value!r}" for name, value in {
        "SAVED": str(tmp_path / "saved"), "RESAVED": str(tmp_path / "resaved"), "IDS": str(tmp_path / "ids.pt"),
        "OUT": str(tmp_path / "out.pt"), "GREEDY_TOKENS": GREEDY_TOKENS}.items()) + LOAD_AND_RUN
    done = run_isolated(fresh_python, code, tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    got = torch.load(tmp_path / "out.pt")

    with torch.no_grad():
        generated = model.generate(ids, max_new_tokens=GREEDY_TOKENS, do_sample=False, output_logits=True,
                                   return_dict_in_generate=True)
        expected = {
            "exact": model(ids, recurrence="exact").logits,
            "jacobi": model(ids, recurrence="jacobi", d_forward=3, d_backward=1).logits,
            "step_logits": torch.stack(generated.logits, dim=1),
        }
    for run in ("first", "second"):  # as saved by the library, and saved again by the copy
        for key, value in expected.items():
            torch.testing.assert_close(got[run][key], value, rtol=0, atol=1e-5, msg=f"{run} {key}")
        assert torch.equal(got[run]["tokens"], generated.sequences), run
    config_module, model_module, one_config_class, imported = got["first"]["classes"]
    assert config_module.startswith("transformers_modules.") and model_module.startswith("transformers_modules.")
    assert one_config_class and not imported  # the copy's own classes, t2mlr never imported
    saved_code = {path.name: path.read_text() for path in (tmp_path / "saved").glob("*.py")}
    assert saved_code == {path.name: path.read_text() for path in (tmp_path / "resaved").glob("*.py")}
    assert json.loads((tmp_path / "resaved" / "config.json").read_text())["auto_map"] == remote_code.AUTO_MAP


class WithoutImports(ast.NodeTransformer):
    def visit_Import(self, node: ast.AST) -> None:
        return None

    visit_ImportFrom = visit_Import


def without_imports(text: str) -> str:
    return ast.dump(WithoutImports().visit(ast.parse(text)))


def test_the_copy_is_the_package_source_with_its_imports_made_relative(tmp_path: Path) -> None:
    """Each saved module is the installed module's code statement for statement once the imports are set
    aside; the imports of the package in the copy are all relative; the copy holds every module that the
    model's and the config's modules import from the package."""
    tiny_model().save_pretrained(tmp_path)
    package = Path(remote_code.__file__).parents[1]
    copies = {path.name: path.read_text() for path in tmp_path.glob("*.py")}
    entries = {f"{reference.rpartition('.')[0]}.py" for reference in remote_code.AUTO_MAP.values()}
    assert {"modeling.py", "configuration.py", "cache.py", "utils.py"} <= copies.keys()
    for name, text in copies.items():
        if name in entries:
            continue
        source = package / "model" / name if (package / "model" / name).is_file() else package / name
        assert without_imports(text) == without_imports(source.read_text()), name
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("t2mlr"):
                pytest.fail(f"{name} still imports {node.module}")
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.module is None or f"{node.module}.py" in copies, (name, node.module)


@pytest.fixture
def fake_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[dict[str, str]], None]]:
    """Writes a package `fakepkg` (its `__init__` defines THING) with the given modules, importable for one test."""

    def write(modules: dict[str, str]) -> None:
        (tmp_path / "fakepkg").mkdir()
        (tmp_path / "fakepkg" / "__init__.py").write_text("THING = 1\n")
        for name, text in modules.items():
            (tmp_path / "fakepkg" / f"{name}.py").write_text(text)

    monkeypatch.syspath_prepend(str(tmp_path))
    yield write
    for name in [name for name in sys.modules if name.split(".")[0] in ("fakepkg", "flat")]:
        del sys.modules[name]


@pytest.mark.parametrize("text,message", [
    ("import fakepkg.other\n", "write `from ... import ...`"),
    ("from fakepkg import THING\n", "`THING` is not a module of fakepkg"),
    ("import os; from fakepkg.other import X\n", "on lines of its own"),
])
def test_imports_the_copy_cannot_carry_are_refused(fake_package, text: str, message: str) -> None:
    fake_package({"entry": text, "other": "X = 1\n"})
    with pytest.raises(ValueError, match=message):
        remote_code.module_copy("fakepkg.entry", "fakepkg", rewrite=True)


def test_imports_are_made_relative_and_whole_modules_are_named_for_transformers(fake_package, tmp_path: Path) -> None:
    """The copies of a package's modules, written side by side into one flat package, import each other
    and compute what the package computes; a module imported whole gets a line transformers follows."""
    entry = "from fakepkg.other import X as Y\n\n\ndef f():\n    from . import other\n    return other.X + Y\n"
    fake_package({"entry": entry, "other": "X = 1\n"})
    text, needed = remote_code.module_copy("fakepkg.entry", "fakepkg", rewrite=True)
    assert set(needed) == {"fakepkg.other"}
    assert "\nfrom .other import X as Y\n" in text
    assert "\n    from .other import __name__ as _other_module" in text and "\n    from . import other\n" in text
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "__init__.py").write_text("")
    (flat / "entry.py").write_text(text)
    (flat / "other.py").write_text(remote_code.module_copy("fakepkg.other", "fakepkg", rewrite=True)[0])
    assert importlib.import_module("flat.entry").f() == 2


def test_a_line_transformers_would_read_as_an_import_of_a_missing_module_stops_the_save(tmp_path: Path) -> None:
    files = remote_code.entry_modules()
    stray = files["modeling_t2mlr.py"] + '\nNOTE = """\nfrom .missing import thing\n"""\n'
    for name, text in {**files, "modeling_t2mlr.py": stray}.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "configuration.py").write_text("")
    (tmp_path / "modeling.py").write_text("")
    with pytest.raises(ValueError, match="look for missing.py beside modeling_t2mlr.py"):
        remote_code.check_transformers_finds_every_module(
            tmp_path, {**files, "configuration.py": "", "modeling.py": ""})
