"""The README's Python examples run as written (each ```python block, in order, in one namespace)."""

from __future__ import annotations

import os
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run(tmp_path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    namespace: dict = {}
    cwd = os.getcwd()
    os.chdir(tmp_path)  # examples save checkpoints to relative paths
    try:
        for block in blocks:
            exec(compile(block, str(README), "exec"), namespace)
    finally:
        os.chdir(cwd)
    assert float(namespace["gap"]) <= 1e-4
