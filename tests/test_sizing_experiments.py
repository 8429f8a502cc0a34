"""`t2mlr experiment NAME --dry-run`: every experiment and preset sizes its arms without writing anything, each
arm's numbers are what `t2mlr train --dry-run` prints for that arm's own config.yaml, and bad input exits 2."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from t2mlr.cli import main as cli_main
from t2mlr.experiments import finetune, pathfinding, pretrain, retrofit, s5
from t2mlr.experiments.commands import EXPERIMENT_CONFIGS, FINETUNE_TASKS, load, presets
from t2mlr.experiments.sections import preset_config
from t2mlr.training.commands import GPU_KIND_NAMES
from t2mlr.training.config import save_config
from t2mlr.training.sizing import GPU_KINDS

REPO = Path(__file__).resolve().parents[1]
# The retrofit paper preset places T²MLR(5,28) in SmolLM2-1.7B-Instruct, which has 24 blocks, and its micro-batch
# of 8 rows of 4096 tokens does not fit an 80 GB GPU at any sharding: the dry run says both (exit 2; the real run
# would find the first after loading the weights). Its sizing is checked at a placement that exists and a
# micro-batch that fits (the data paths are not read).
PAPER_RETROFIT = ["--train-path", "omr.parquet", "--eval-path", "gsm8k_test.jsonl", "model.l_end=24",
                  "train.micro_batch_size=1"]


def experiment_cases() -> list[tuple[str, ...]]:
    """Every experiment with every preset its configs define (read from the file names, so a new preset is
    covered without editing this list)."""
    cases = [("s5-retrieval", p) for p in presets("s5")] + [("s5-evidence", p) for p in ("cpu", "tiny")]
    cases += [("finetune", task, p) for task in FINETUNE_TASKS for p in ("paper", "cpu", "tiny")
              if (EXPERIMENT_CONFIGS / f"finetune_{p}_{task.replace('-', '_')}.yaml").is_file()]
    cases += [("retrofit", p) for p in presets("retrofit")] + [("pretrain", p) for p in presets("pretrain")]
    return cases + [("pathfinding", p) for p in presets("pathfinding")]


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = cli_main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def experiment_argv(case: tuple[str, ...], out: Path, *extra: str) -> list[str]:
    *words, preset = case
    argv = ["experiment", *words, "--preset", preset, "--out", str(out), "--dry-run", *extra]
    return argv + (PAPER_RETROFIT if case == ("retrofit", "paper") else [])


def comparable(report: dict) -> dict:
    """A sized run's numbers without what names the config and the command (they differ by design)."""
    return {k: v for k, v in report.items() if k not in ("name", "label", "directory", "config", "launch")}


@pytest.mark.parametrize("case", experiment_cases(), ids="-".join)
def test_every_experiment_and_preset_dry_runs_and_writes_nothing(case, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    code, stdout, stderr = run(capsys, *experiment_argv(case, out, "--gpu", "h100", "--json"))
    assert code == 0, stderr
    report = json.loads(stdout)
    sized = [arm for arm in report["arms"] if "not_sized" not in arm]
    assert sized and report["total"]["sized_arms"] == len(sized)
    assert report["total"]["gpu_hours"] == pytest.approx(math.fsum(arm["gpu_hours"] for arm in sized))
    assert report["total"]["steps"] == sum(arm["steps"] for arm in sized)
    for arm in sized:  # a time budget (train.max_seconds) ends a run before max_steps at the modelled speed
        budget = arm["max_seconds"]
        assert arm["steps"] == (arm["max_steps"] if budget is None else
                                min(arm["max_steps"], math.ceil(budget / arm["step_seconds"])))
    assert report["launch"].startswith(f"t2mlr experiment {' '.join(case[:-1])} --preset {case[-1]} --out {out}")
    assert not out.exists() and list(tmp_path.iterdir()) == []


def arms_of(case: tuple[str, ...], out: Path, overrides: list[str]) -> list:
    """The arms as each experiment's own builder makes them for a dry run (what the test checks against)."""
    name, *rest = case
    if name == "s5-retrieval":
        task, tree = load(preset_config("s5", rest[-1]), overrides, s5.S5Task)
        return list(s5.dry_run_arms(task, tree, out)[0].values())
    if name == "finetune":
        task, tree = load(preset_config("finetune", rest[-1], rest[0]), overrides, finetune.FinetuneTask)
        return finetune.dry_run_arms(finetune.make_plan(rest[-1], task, tree, dry_run=True), out)[0]
    if name == "pathfinding":
        task, tree = load(preset_config("pathfinding", rest[-1]), overrides, pathfinding.PathfindingTask)
        return finetune.dry_run_arms(pathfinding.plan(rest[-1], task, tree, dry_run=True), out)[0]
    if name == "retrofit":
        task, tree = load(preset_config("retrofit", rest[-1]), overrides, retrofit.RetrofitTask)
        return retrofit.dry_run_arms(task, tree, out)[0]
    task, tree = load(preset_config("pretrain", rest[-1]), overrides, pretrain.PretrainTask)
    return pretrain.dry_run_arms(tree, out, task.arms)[0]


@pytest.mark.parametrize(("case", "devices"), [(("finetune", "gsm-aug", "paper"), "4"), (("pretrain", "cpu"), "1"),
                                               (("retrofit", "tiny"), "1"), (("s5-retrieval", "tiny"), "1"),
                                               (("pathfinding", "paper"), "1"), (("pathfinding", "cpu"), "1")],
                         ids=["finetune-gsm-aug-paper", "pretrain-cpu", "retrofit-tiny", "s5-tiny", "pathfinding-paper",
                              "pathfinding-cpu"])
def test_each_arm_is_sized_as_train_dry_run_sizes_its_config(case, devices, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    code, stdout, stderr = run(capsys, *experiment_argv(case, out, "--devices", devices, "--gpu", "a100-80gb", "--json"))
    assert code == 0, stderr
    reported = {arm["name"]: arm for arm in json.loads(stdout)["arms"]}
    arms = arms_of(case, out, [])
    assert sorted(reported) == sorted(arm.name for arm in arms)
    for arm in arms:  # the arm's config.yaml, as its run directory would hold it, through `t2mlr train`
        path = tmp_path / "configs" / arm.dir_name / "config.yaml"
        path.parent.mkdir(parents=True)
        save_config(arm.config, path)
        code, single, err = run(capsys, "train", str(path), "--dry-run", "--devices", devices, "--gpu", "a100-80gb",
                                "--json")
        if "not_sized" in reported[arm.name]:  # a model the memory model does not cover: train refuses it too
            assert code == 2 and reported[arm.name]["not_sized"] in err
            continue
        assert code == 0, err
        assert comparable(reported[arm.name]) == comparable(json.loads(single))
    assert any("not_sized" not in arm for arm in reported.values())


def test_from_checkpoints_are_sized_from_their_own_configs(tmp_path, capsys) -> None:
    """`--from` reads each checkpoint's config.json only (no weights there at all): every arm has the
    parameters of the model its checkpoint's config builds."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from t2mlr.model import T2MLRConfig, T2MLRForCausalLM

    base = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, tie_word_embeddings=True)
    t2mlr = T2MLRConfig.from_base(base, l_start=1, l_end=2)
    t2mlr.save_pretrained(tmp_path / "ckpts" / "t2mlr_1-2")
    base.save_pretrained(tmp_path / "ckpts" / "transformer")
    out = tmp_path / "out"
    code, stdout, err = run(capsys, "experiment", "finetune", "variable-assignment", "--preset", "tiny", "--arms",
                            "t2mlr:1-2,transformer", "--from", str(tmp_path / "ckpts"), "--out", str(out), "--dry-run",
                            "--gpu", "h100", "--json")
    assert code == 0, err
    arms = {arm["name"]: arm for arm in json.loads(stdout)["arms"]}
    for name, model in (("t2mlr:1-2", T2MLRForCausalLM(t2mlr)), ("transformer", LlamaForCausalLM(base))):
        assert arms[name]["parameters"] == sum(p.numel() for p in model.parameters())
    assert not out.exists()


@pytest.mark.parametrize(("argv", "words"), [
    (["finetune", "gsm-aug", "--preset", "paper", "--devices", "3", "--gpu", "h100"],
     ("3 devices do not divide the batch", "global_batch_size 32", "1, 2, 4")),
    (["finetune", "gsm-aug", "--preset", "paper", "--gpu", "b200"], ("unknown GPU kind 'b200'", "h100")),
    (["finetune", "gsm-aug", "--preset", "paper", "--gpu", "a10", "task.max_length=32768"],
     ("does not fit on NVIDIA A10 24GB", "even with FSDP2 over", "GiB")),
    (["pretrain", "--preset", "tiny", "--gpu", "h100", "--mfu", "1.5"], ("model-FLOP utilisation", "1.5")),
    (["s5-retrieval", "--preset", "tiny", "--gpu", "h100", "optim.lrr=1"], ("Did you mean 'lr'?",)),
    (["retrofit", "--preset", "tiny", "--gpu", "h100", "model.l_end=99"], ("l_end <= 30", "l_end=99")),
    (["pretrain", "--preset", "tiny"], ("--dry-run needs --gpu KIND",)),
], ids=["devices", "gpu", "no-fit", "mfu", "typo", "placement", "no-gpu"])
def test_bad_input_exits_2_with_the_numbers_and_writes_nothing(argv, words, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    code, _, err = run(capsys, "experiment", *argv, "--dry-run", "--out", str(out))
    assert code == 2
    for word in words:
        assert word in err
    assert not out.exists()


def test_sizing_options_without_dry_run_are_refused(tmp_path, capsys) -> None:
    code, _, err = run(capsys, "experiment", "pretrain", "--preset", "tiny", "--devices", "4", "--out", str(tmp_path / "o"))
    assert code == 2 and "--devices applies to --dry-run only" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_the_issue_command_from_a_shell(tmp_path) -> None:
    """The issue's command line, run as a user runs it (its own process, in an empty directory): the table, the
    sum over the arms, the experiment's torchrun line, and nothing written."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "t2mlr", "experiment", "finetune", "gsm-aug", "--preset", "paper",
                           "--dry-run", "--devices", "4", "--gpu", "h100"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for part in ("t2mlr:13-18", "t2mlr:1-30", "transformer", "total: 5 arms, 40,000 steps", "GPU-hours",
                 "torchrun --nproc_per_node 4 -m t2mlr experiment finetune gsm-aug --preset paper",
                 "--parallel fsdp", "sized as a checkpoint of the preset's backbone"):
        assert part in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_the_gpu_kinds_named_in_help_are_the_table_s() -> None:
    assert GPU_KIND_NAMES.split(", ") == list(GPU_KINDS)
