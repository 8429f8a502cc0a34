"""Every recipe of docs/ecosystem.md runs as written, in document order, in one scratch directory (later recipes
use what earlier ones saved): python blocks as scripts, bash commands through the CLI in this process or, for
stock tools (`lm_eval`), in a shell. The retrofit they start from is a tiny T²MLR model saved where
`t2mlr retrofit` would write it; that command is run by the test named for it. The command lines are read
with test_readme_commands' machinery, so a command the page adds is run here or fails the coverage test."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")
pytest.importorskip("lm_eval")

from test_readme_commands import REPO, block_commands, readme_commands, run  # noqa: E402
from test_trl import save_tiny_t2mlr  # noqa: E402

DOC = REPO / "docs" / "ecosystem.md"
RETROFIT = "t2mlr retrofit smollm2-135m-instruct --l-start 13 --l-end 18 --out runs/smollm2_13_18"
# Run at full scale by these tests (the recipes get a tiny stand-in at the same path).
COVERED_BY = {RETROFIT: "tests/test_retrofit.py::test_retrofit_command_writes_a_checkpoint_that_reloads_alone"}
# Written by the recipes, in this order.
OUTPUTS = ["runs/trainer/final/config.json", "runs/sft/final/config.json", "runs/lora/adapter/adapter_config.json",
           "runs/lora/merged/config.json", "runs/dpo/final/config.json"]


def doc_blocks() -> list[tuple[str, str]]:
    """(language, text) of every python and bash block, in document order."""
    return re.findall(r"```(python|bash)\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def run_shell(command: str) -> str:
    """A command of a stock tool, as a user's shell runs it; returns its output."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(["bash", "-c", command], check=False, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, command + "\n" + done.stderr[-3000:]
    return done.stdout


def test_every_command_is_run_or_covered() -> None:
    commands = readme_commands(DOC)
    assert RETROFIT in commands and any(command.startswith("lm_eval --model hf") for command in commands)
    for target in COVERED_BY.values():
        path, _, name = target.partition("::")
        assert f"def {name}(" in (REPO / path).read_text(encoding="utf-8"), target
    languages = [language for language, _ in doc_blocks()]
    assert languages.count("python") >= 5, "the Trainer, SFT, LoRA, reload and DPO recipes"


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.slow
def test_the_recipes_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    save_tiny_t2mlr(tmp_path / "runs" / "smollm2_13_18", d_forward=4, d_backward=2)
    stock_outputs = []
    for number, (language, text) in enumerate(doc_blocks()):
        if language == "python":
            exec(compile(text, f"{DOC.name} block {number}", "exec"), {"__name__": "__main__"})  # noqa: S102
            continue
        for command in block_commands(text):
            if command in COVERED_BY:
                continue
            if command.startswith("t2mlr "):
                run(command)
            else:
                stock_outputs.append(run_shell(command))
    for output in OUTPUTS:
        assert (tmp_path / output).is_file(), output
    assert "adapter_model.safetensors" in os.listdir(tmp_path / "runs" / "lora" / "adapter")
    assert json.loads((tmp_path / "runs/lora/merged/config.json").read_text())["model_type"] == "t2mlr"
    assert any("t2mlr_toy" in output and "acc" in output for output in stock_outputs)  # lm-eval's table
