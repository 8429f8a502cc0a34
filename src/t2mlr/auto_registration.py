"""`import t2mlr` registers the library's model types with transformers' Auto classes, without importing
transformers or torch.

The package loads its classes lazily so that `t2mlr --help` and the light commands answer at once. But a
user who writes `import t2mlr` and then `AutoModelForCausalLM.from_pretrained(saved_dir)` expects the
`t2mlr` model type to be known, in a fresh process, without `trust_remote_code=True`. So the registration
waits for transformers instead of importing it: a finder on `sys.meta_path` notices when transformers
loads its config Auto module (`configuration_auto`) and registers `T2MLRConfig` right after it has run.
That import can happen while transformers is importing itself (its `modeling_utils` pulls the module in
half-way), so only the config is imported then, which needs nothing from the half-loaded modules. The
models follow when a `T2MLRConfig` is first built, which `AutoModelForCausalLM.from_pretrained` does
before it looks for the model class (`t2mlr.model.configuration`). If the Auto module is already loaded,
the registration runs at once.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

CONFIG_MODULE = "transformers.models.auto.configuration_auto"


def register_configs() -> None:
    """T2MLRConfig with AutoConfig: importing its module registers it (and needs only transformers' config
    classes). Should that module be the one whose import brought transformers in, it is half-loaded here,
    and registers itself when it ends."""
    importlib.import_module("t2mlr.model.configuration")


REGISTRATIONS: dict[str, Callable[[], None]] = {CONFIG_MODULE: register_configs}


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for the hooked modules it returns the spec the other finders return,
    with a loader that runs the module and then our registration."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in REGISTRATIONS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _ThenRegister(spec.loader, REGISTRATIONS[fullname])
                return spec
        return None


class _ThenRegister(importlib.abc.Loader):
    """A loader that runs the wrapped loader's module, then a registration."""

    def __init__(self, loader: Any, register: Callable[[], None]) -> None:
        self.loader, self.register = loader, register

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.register()

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, is_package, ... of the real loader
        return getattr(self.loader, name)


def install() -> None:
    """Register now for the Auto modules already loaded, and after import for the others (once)."""
    if not any(isinstance(finder, _RegisterAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())
    for name, register in REGISTRATIONS.items():
        if name in sys.modules:
            register()
