"""Saved T²MLR directories that load without `import t2mlr`.

transformers finds a model type it does not know through the config's `auto_map`, which names modules
saved beside the weights; it imports them when the caller passes `trust_remote_code=True`. The
modules written here hold no model code of their own: they import the classes from the installed
`t2mlr` package, so the directory always runs the library's code (and an error tells the user to
install it). With `import t2mlr` the Auto classes know the type directly and `auto_map` is not used.
"""

from __future__ import annotations

from pathlib import Path

AUTO_MAP = {
    "AutoConfig": "configuration_t2mlr.T2MLRConfig",
    "AutoModelForCausalLM": "modeling_t2mlr.T2MLRForCausalLM",
}
MODULES = {
    "configuration_t2mlr.py": (
        '"""T²MLR config from the installed t2mlr package (pip install t2mlr); written by save_pretrained."""\n\n'
        "from t2mlr.model.configuration import T2MLRConfig\n\n__all__ = [\"T2MLRConfig\"]\n"
    ),
    "modeling_t2mlr.py": (
        '"""T²MLR model from the installed t2mlr package (pip install t2mlr); written by save_pretrained."""\n\n'
        "from t2mlr.model.modeling import T2MLRForCausalLM\n\n__all__ = [\"T2MLRForCausalLM\"]\n"
    ),
}


def write_remote_code_modules(directory: str | Path) -> None:
    """Write the modules `AUTO_MAP` names into a saved model directory."""
    for name, text in MODULES.items():
        (Path(directory) / name).write_text(text, encoding="utf-8")
