"""`t2mlr data …`: progress bars on stderr that change no sample, and one-line errors with exit code 2."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from t2mlr.cli import main as cli_main
from t2mlr.tasks.commands import main as data_main
from t2mlr.tasks.prosqa import generate_prosqa_hard, iter_prosqa_hard
from t2mlr.tasks.s5_retrieval import generate_s5_eval, iter_s5_eval
from t2mlr.tasks.variable_assignment import (
    generate_variable_assignment,
    iter_variable_assignment,
)

SRC = Path(__file__).resolve().parents[1] / "src"

# sha256 of the files written by the commands as they were before progress bars were added (commit f73630e):
# the bars and the streamed generation must not change a byte. The second variable-assignment setting
# draws eval prompts that collide with training ones (5 are skipped), so the disjoint eval is covered too.
GOLDEN = {
    ("s5-retrieval", "--k", "2", "--train-n", "1-6", "--eval-n", "1-8", "--train-size", "300", "--eval-size", "7",
     "--dict-size", "10", "--seed", "3"): {
        "train.jsonl": "52593c45af024f14d870aea1a3267c5133d8d5a53a335575f88c5978da1f2fdd",
        "eval.jsonl": "bc85878f87349ea656a866ecf2bf070187434fbf9f2bc6a8360b95fbd1330e83",
    },
    ("variable-assignment", "--depth", "3", "--size", "400", "--eval-size", "150", "--num-constants", "2",
     "--num-distractors", "1", "--seed", "5"): {
        "train.jsonl": "ceba80623abbdb8fc28b477cbdbf66d7cef3a7530e776fe11ee60b9308b90670",
        "eval.jsonl": "6cd14849630126abe66e7aec972c52a2d831cb1bdb6d9e2e65a19748ae27ab46",
    },
    ("variable-assignment", "--depth", "1", "--size", "300", "--eval-size", "100", "--num-constants", "1",
     "--num-distractors", "0", "--seed", "1"): {
        "train.jsonl": "7dd97da3cf0a0b74a450ff19f2fa4df0bf814a21216fa08cea830a9f369e9f97",
        "eval.jsonl": "dcf121f2eca48c732760ab3f20d829bf76440a052c58137ad3a41cc314d9cf9e",
    },
    ("prosqa-hard", "--train-size", "40", "--eval-size", "15", "--nodes", "20-26", "--path-len", "4-6",
     "--seed", "2"): {
        "train.jsonl": "00be807c860a4d933b644bca6eeb95cce3dee8d06a6832dde1be9d64db506e68",
        "eval.jsonl": "30d5d5c2f95ed34889de837f017bf0673d9d7e77a2b6f76f817ff1d92834c953",
    },
}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("command", list(GOLDEN), ids=lambda c: f"{c[0]}-seed{c[-1]}")
def test_progress_bars_change_no_sample(tmp_path: Path, capsys, command: tuple[str, ...]) -> None:
    out = tmp_path / "data"
    assert cli_main(["data", command[0], "--out", str(out), *command[1:]]) == 0
    captured = capsys.readouterr()
    assert {name: _sha256(out / name) for name in GOLDEN[command]} == GOLDEN[command]
    # the bars go to stderr, with the sample counts; stdout keeps only the list of written files
    train_size = command[command.index("--size" if "--size" in command else "--train-size") + 1]
    assert "train: 100%" in captured.err and f"{train_size}/{train_size}" in captured.err
    assert "eval: 100%" in captured.err
    assert all(line.startswith("wrote ") for line in captured.out.splitlines())


def test_streams_are_prefixes_of_the_generated_lists() -> None:
    assert list(iter_prosqa_hard(3, (20, 24), (4, 5), seed=4)) == generate_prosqa_hard(3, (20, 24), (4, 5), seed=4)
    endless = iter_prosqa_hard(None, (20, 24), (4, 5), seed=4)
    assert [next(endless) for _ in range(5)] == generate_prosqa_hard(5, (20, 24), (4, 5), seed=4)
    endless = iter_variable_assignment(None, 2, seed=9, stream="eval")
    assert [next(endless) for _ in range(7)] == generate_variable_assignment(7, 2, seed=9, stream="eval")
    assert list(iter_s5_eval(2, (1, 3), 1, 4, 0, "ABC")) == generate_s5_eval(2, (1, 3), 1, 4, 0, "ABC")
    with pytest.raises(ValueError, match="num_samples"):
        iter_prosqa_hard(-1)  # on the call, before any sample is drawn
    with pytest.raises(ValueError, match="26 letters"):
        iter_variable_assignment(None, depth=20)
    with pytest.raises(ValueError, match="dict_size"):
        iter_s5_eval(1, (1, 9), 1, 4)


BAD_SETTINGS = {
    "s5-retrieval": (["--train-n", "1-32", "--dict-size", "8"], "dict_size=8 is smaller than the largest N=32"),
    "variable-assignment": (["--depth", "20"], "needs 63 distinct variables but only 26 letters exist"),
    "prosqa-hard": (["--nodes", "6-8", "--path-len", "7-9"], "nodes_range (6, 8) too small"),
}


@pytest.mark.parametrize("task", list(BAD_SETTINGS))
def test_bad_settings_are_one_line_and_exit_code_2(tmp_path: Path, capsys, task: str) -> None:
    extra, message = BAD_SETTINGS[task]
    out = tmp_path / "out"
    assert cli_main(["data", task, "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"t2mlr data {task}: error: ") and message in err
    assert not out.exists()  # checked before anything is written
    with pytest.raises(SystemExit) as caught:  # the module's own entry point exits the same way
        data_main(["data", task, "--out", str(out), *extra])
    assert caught.value.code == 2 and capsys.readouterr().err == err


def test_too_few_distinct_eval_samples(tmp_path: Path, capsys) -> None:
    # depth 0 and one constant: 260 possible prompts, all of them drawn for training
    code = cli_main(["data", "variable-assignment", "--out", str(tmp_path), "--depth", "0", "--num-constants", "1",
                     "--num-distractors", "0", "--size", "2000", "--eval-size", "10"])
    assert code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == ("t2mlr data variable-assignment: error: only 0 eval samples differ from the training set; "
                    "lower --eval-size")


def test_the_installed_command_exits_2_without_a_traceback(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "t2mlr", "data", "s5-retrieval", "--out", str(tmp_path / "d"),
                           "--train-n", "1-32", "--dict-size", "8"], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": str(SRC)})
    assert done.returncode == 2 and "Traceback" not in done.stderr
    expected = ("t2mlr data s5-retrieval: error: dict_size=8 is smaller than the largest N=32: a sample may visit "
                "up to N distinct states and every one must be in the dictionary")
    assert done.stderr.strip().splitlines() == [expected]
