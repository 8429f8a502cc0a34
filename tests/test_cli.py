"""The `t2mlr` dispatcher: every listed command exists in its module, and the help starts without
importing torch or transformers (only the chosen command's module is imported)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from t2mlr.cli import COMMANDS, build_parser, main


def test_every_listed_command_is_registered_by_its_module() -> None:
    parser = build_parser()
    choices = parser._subparsers._group_actions[0].choices  # the COMMAND subparsers
    assert set(choices) == set(COMMANDS)
    for name in COMMANDS:
        assert runnable(choices[name]), name


def runnable(parser) -> bool:
    """A parser that runs something, or a group whose every subcommand does."""
    if parser.get_default("func") is not None:
        return True
    groups = [action for action in parser._actions if action.__class__.__name__ == "_SubParsersAction"]
    return bool(groups) and all(runnable(sub) for group in groups for sub in group.choices.values())


def help_output(argv: list[str]) -> str:
    """What `t2mlr ARGV` prints in a fresh interpreter, then which of torch and transformers it loaded."""
    probe = (
        "import sys\nfrom t2mlr.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print('LOADED', sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout


def test_top_level_help_imports_neither_torch_nor_transformers() -> None:
    out = help_output(["--help"])
    assert "experiment" in out and "LOADED []" in out


@pytest.mark.parametrize("argv, shown", [
    (["train", "--help"], "--stop-after"),
    (["experiment", "--help"], "finetune"),
    (["experiment", "retrofit", "--help"], "--preset"),
    (["rl", "grpo", "--help"], "--resume"),
    (["analyze", "gradient-fidelity", "--help"], "32:32"),
    (["retrofit", "--help"], "--l-start"),
    (["data", "--help"], "variable-assignment"),
    (["data", "s5-retrieval", "--help"], "--alphabet"),
    (["corpus", "--help"], "prepare-offline"),
    (["generate", "--help"], "--prefill-depth"),
    (["plot", "--help"], "run_dir"),
    (["params", "--help"], "--looped"),
    (["serve", "--help"], "--prefill"),
])
def test_command_help_imports_neither_torch_nor_transformers(argv: list[str], shown: str) -> None:
    """Help of the training, experiment and analysis commands shows at once: their heavy imports wait
    until a command runs."""
    out = help_output(argv)
    assert shown in out and "LOADED []" in out


def test_an_unknown_command_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["trian"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'trian'" in capsys.readouterr().err
