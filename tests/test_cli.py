"""The `t2mlr` dispatcher: every listed command exists in its module, and the help starts without
importing torch or transformers (only the chosen command's module is imported)."""

from __future__ import annotations

import os
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


def run_in_fresh_interpreter(argv: list[str], heavy: tuple[str, ...] = ("torch", "transformers"),
                             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `t2mlr ARGV` in a fresh interpreter (with `env`, e.g. torchrun's variables, added to this one's);
    stdout ends with its exit code and which of `heavy` it loaded (`EXIT 2 LOADED []`: refused before any heavy
    library was imported)."""
    probe = (
        "import sys\nfrom t2mlr.cli import main\n"
        f"code = main({argv!r})\n"
        f"print('EXIT', code, 'LOADED', sorted(m for m in {heavy!r} if m in sys.modules))"
    )
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          env={**os.environ, **(env or {})})


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


def every_help_argv(parser=None, prefix: tuple[str, ...] = ()) -> list[list[str]]:
    """`[..., "--help"]` for every command and subcommand the parser knows, groups included."""
    parser = parser or build_parser()
    found = [[*prefix, "--help"]]
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            for name, sub in action.choices.items():
                found += every_help_argv(sub, (*prefix, name))
    return found


def test_every_help_shows_before_torch_transformers_or_lm_eval_load() -> None:
    """All helps in one fresh interpreter, in turn: the first that loads a heavy library is named. `t2mlr eval
    --help` ends in lm-eval's own help, so only lm-eval's light command-line module may load there."""
    argvs = every_help_argv() + [["eval", "zero-shot", "--help"], ["eval", "run", "--help"]]  # eval's own words
    argvs.sort(key=lambda argv: argv[0] == "eval")  # eval, which loads lm-eval's parser, last
    assert ["experiment", "finetune", "--help"] in argvs and ["analyze", "placement", "--help"] in argvs
    probe = (
        "import contextlib, io, sys\nfrom t2mlr.cli import main\n"
        f"for argv in {argvs!r}:\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        try:\n            main(argv)\n        except SystemExit:\n            pass\n"
        "    heavy = ('torch', 'transformers') + (() if argv[0] == 'eval' else ('lm_eval',))\n"
        "    loaded = [m for m in heavy if m in sys.modules]\n"
        "    if loaded:\n        print('LOADED', argv, loaded)\n        break\n"
        "else:\n    print('LOADED none')\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("LOADED none"), out[-2000:]


@pytest.mark.parametrize("overrides, said", [
    (["optim.learning_rate=1"], "Did you mean 'lr'?"),
    (["train.max_steps=0"], "train.max_steps must be >= 1"),
    (["data.source=jsonl", "data.path={missing}"], "no such data file (data.path)"),
    (["data.source=jsonl", "data.path={bad}"], ":2: invalid JSON at column 2"),
    (["data.source=jsonl", "data.path={listed}"], ":1: expected a JSON object, got list"),
])
def test_train_reports_config_and_data_file_errors_before_torch_loads(tmp_path, overrides, said) -> None:
    """`t2mlr train`'s config typos (the model section's in tests/test_config_strictness.py) and bad data
    files are reported at once, exit 2, before torch or transformers are imported."""
    files = {"missing": tmp_path / "missing.jsonl", "bad": tmp_path / "bad.jsonl", "listed": tmp_path / "listed.jsonl"}
    files["bad"].write_text('{"input_ids": [1, 2]}\n{oops\n', encoding="utf-8")
    files["listed"].write_text("[1, 2]\n", encoding="utf-8")
    argv = ["train", "debug", "--out", str(tmp_path / "run"), *(o.format(**files) for o in overrides)]
    result = run_in_fresh_interpreter(argv)
    assert "EXIT 2 LOADED []" in result.stdout and said in result.stderr, (result.stdout, result.stderr)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv, said", [
    (["s5-retrieval", "--preset", "tiny", "optim.lrr=1"], "Did you mean 'lr'?"),
    (["s5-evidence", "--preset", "tiny", "task.dict_sise=3"], "Did you mean 'dict_size'?"),
    (["finetune", "variable-assignment", "--preset", "tiny", "optim.learning_rate=1"], "Did you mean 'lr'?"),
    (["retrofit", "--preset", "tiny", "train.max_stepz=2"], "Did you mean 'max_steps'?"),
    (["pretrain", "--preset", "tiny", "task.eval_batchez=2"], "Did you mean 'eval_batches'?"),
    (["pathfinding", "--preset", "tiny", "task.eval_sise=2"], "Did you mean 'eval_size'?"),
    (["pathfinding", "--preset", "tiny", "--data", "no/such/rows.jsonl"], "no such file or directory"),
    (["finetune", "hotpotqa", "--preset", "tiny", "--data", "no/such/file.jsonl"], "is neither a local file"),
])
def test_every_experiment_reports_a_config_typo_before_torch_loads(tmp_path, argv, said) -> None:
    """`t2mlr experiment NAME --preset P key=value` takes `t2mlr train`'s dotted overrides with the same typo
    errors (exit 2), for every experiment, and says so before torch or transformers are imported (a finetune's
    missing data file too)."""
    argv = ["experiment", *argv, "--out", str(tmp_path / "out")]
    result = run_in_fresh_interpreter(argv)
    assert "EXIT 2 LOADED []" in result.stdout and said in result.stderr, (result.stdout, result.stderr)
    assert not (tmp_path / "out").exists()


def test_rl_grpo_reports_a_config_typo_before_torch_loads(tmp_path) -> None:
    argv = ["rl", "grpo", "grpo_tiny", "--out", str(tmp_path / "run"), "grpo.group_sise=4"]
    result = run_in_fresh_interpreter(argv, heavy=("torch", "transformers", "trl"))
    assert "EXIT 2 LOADED []" in result.stdout and "Did you mean 'group_size'?" in result.stderr, result.stderr


def test_generate_reports_a_missing_model_directory_before_torch_loads(tmp_path) -> None:
    argv = ["generate", str(tmp_path / "no_model"), "--prompt", "hi"]
    result = run_in_fresh_interpreter(argv)
    assert "EXIT 2 LOADED []" in result.stdout and "does not exist" in result.stderr, result.stderr


@pytest.mark.parametrize("argv, heavy, said", [
    (["eval", "zero-shot", "{missing}", "--out", "{out}"], ("torch", "transformers", "lm_eval"), "does not exist"),
    (["eval", "run", "--model", "t2mlr", "--model_args", "pretrained={missing}", "--tasks", "t2mlr_toy"],
     ("torch", "transformers"), "does not exist"),
    (["eval", "run", "--model", "hf", "--model_args", "pretrained=org/name", "--tasks", "arc_eazy,t2mlr_toy"],
     ("torch", "transformers"), "lm-eval knows no task 'arc_eazy' (did you mean 'arc_easy'?)"),
])
def test_eval_reports_a_bad_model_directory_or_task_before_torch_loads(tmp_path, argv, heavy, said) -> None:
    """A missing checkpoint (zero-shot, or a local `pretrained=`) and an unknown task name exit 2 with the cause
    before torch or transformers are imported (zero-shot: before lm-eval too); a shipped task is known."""
    argv = [word.format(missing=tmp_path / "no_model", out=tmp_path / "out") for word in argv]
    result = run_in_fresh_interpreter(argv, heavy=heavy)
    assert "EXIT 2 LOADED []" in result.stdout and said in result.stderr, (result.stdout, result.stderr)
    assert not (tmp_path / "out").exists()
