"""`t2mlr rl grpo` (T2MLRGRPOTrainer behind a YAML config): the config's strictness and its translation into TRL's
batch layout, the command end to end (metrics, curve, final model, no silent overwrite), a resumed run repeating
the uninterrupted one, the KL reference of a fresh policy, and the README's RL chain at a tiny scale. The
trainer's log-probabilities, loss and gradients are checked against the exact path in test_rl_trl.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from t2mlr.cli import main
from t2mlr.rl.grpo import INITIAL_DIR, batch_layout, load_grpo_config, run_grpo, trainer_arguments
from t2mlr.training.config import ConfigError

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TIMINGS = ("rollout_s", "step_time", "update_s")
RL_PAGE = Path(__file__).resolve().parents[1] / "docs" / "rl.md"
# docs/rl.md's commands and the tests here that run them (at a tiny scale)
PAGE_COMMANDS = {
    "t2mlr rl grpo grpo_tiny --out runs/grpo_tiny": "test_the_command_runs_and_draws_the_curve",
    "t2mlr train grpo_va_sft_cpu --out runs/grpo_sft": "test_readme_rl_commands_at_a_tiny_scale",
    "t2mlr rl grpo grpo_cpu --out runs/grpo_cpu": "test_readme_rl_commands_at_a_tiny_scale",
}


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_config_is_strict(tmp_path) -> None:
    with pytest.raises(ConfigError, match="Did you mean 'group_size'"):
        load_grpo_config("grpo_tiny", ["grpo.group_sise=4"])
    with pytest.raises(ConfigError, match="group_size must be >= 2"):
        load_grpo_config("grpo_tiny", ["grpo.group_size=1"])
    with pytest.raises(ConfigError, match="task.name must be one of"):
        load_grpo_config("grpo_tiny", ["task.name=chess"])
    with pytest.raises(ConfigError, match="exactly one of policy"):
        load_grpo_config("grpo_tiny", ["policy=runs/x"])
    with pytest.raises(ConfigError, match="micro_batch_size=3 must divide the 16 completions"):
        load_grpo_config("grpo_tiny", ["grpo.micro_batch_size=3"])


def test_the_batch_layout_fills_each_step_with_its_completions(tmp_path) -> None:
    cfg = load_grpo_config("grpo_tiny", ["grpo.prompts_per_step=6", "grpo.group_size=4", "grpo.micro_batch_size=4"])
    assert batch_layout(cfg.grpo, world_size=1) == (4, 6)  # 24 completions: 6 chunks of 4
    assert batch_layout(cfg.grpo, world_size=2) == (4, 3)  # 12 per process
    args = trainer_arguments(cfg, tmp_path, world_size=1)
    per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
    assert per_step == args.generation_batch_size == 24 and args.num_generations == 4
    assert args.replay_depth == cfg.grpo.replay_depth and args.scale_rewards == "group" and not args.bf16
    with pytest.raises(ConfigError, match="do not split over 5 processes"):
        batch_layout(cfg.grpo, world_size=5)


def test_the_command_runs_and_draws_the_curve(tmp_path, capsys) -> None:
    out = tmp_path / "cli"
    assert main(["rl", "grpo", "grpo_tiny", "--out", str(out), "train.max_steps=2", "eval.every=1"]) == 0
    assert "mean reward" in capsys.readouterr().out
    assert (out / "reward.png").is_file() and (out / "final" / "model.safetensors").is_file()
    records = metrics(out)
    assert [(r["split"], r["step"]) for r in records] == [("eval", 0), ("eval", 1), ("train", 1), ("eval", 2), ("train", 2)]
    assert all(r["update_s"] > 0 and "entropy" in r for r in records if r["split"] == "train")
    assert main(["rl", "grpo", "grpo_tiny", "--out", str(out), "train.max_steps=2"]) == 2  # refuses to overwrite
    assert main(["rl", "grpo", "grpo_tiny", "--out", str(out), "--resume", "grpo.beta=0.1"]) == 2  # another config


@pytest.mark.slow
def test_a_resumed_run_repeats_the_uninterrupted_one(tmp_path) -> None:
    overrides = ["logging.progress_bar=false", "eval.every=0", "checkpoint.every=0", "grpo.prompts_per_step=8",
                 "train.seed=1"]  # a seed whose step 4 samples a rewarded completion, so a gradient moves the policy

    def run(out, stop_after=None, resume=False):
        return run_grpo(load_grpo_config("grpo_tiny", overrides), out, resume=resume, stop_after=stop_after)

    straight = run(tmp_path / "a")
    run(tmp_path / "b", stop_after=2)
    resumed = run(tmp_path / "b", resume=True)
    drop = lambda r: {k: v for k, v in r.items() if k not in TIMINGS}  # noqa: E731
    assert [drop(r) for r in resumed] == [drop(r) for r in straight[2:]]
    assert any(r["grad_norm"] > 0 for r in straight[2:])
    assert [r["step"] for r in metrics(tmp_path / "b")] == [1, 2, 3, 4]


def test_a_kl_term_loads_its_reference_from_the_saved_initial_policy(tmp_path) -> None:
    """A fresh policy with beta > 0 is saved first, so that TRL loads the frozen reference from its path; with
    iterations = 2 every second step reuses a rollout (no rollout metrics, the iterated replay)."""
    cfg = load_grpo_config("grpo_tiny", ["logging.progress_bar=false", "eval.every=0", "checkpoint.every=0",
                                          "grpo.beta=0.5", "grpo.iterations=2"])
    records = run_grpo(cfg, tmp_path / "run")
    assert (tmp_path / "run" / INITIAL_DIR / "model.safetensors").is_file()
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert ["reward" in r for r in records] == [True, False, True, False] and all("kl" in r for r in records)


def load_benchmark(name: str):
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_readme_rl_commands_at_a_tiny_scale(tmp_path, capsys) -> None:
    """The README's chain at a tiny scale: SFT warm-up with the trainer, GRPO from its policy, the replay
    benchmark (timing and gradient fidelity on that checkpoint) and the stale-state measurement."""
    sft, rl = tmp_path / "sft", tmp_path / "rl"
    assert main(["train", "grpo_va_sft_cpu", "--out", str(sft), "--threads", "1", "train.max_steps=2",
                 "data.kwargs.num_samples=64", "checkpoint.every=0", "logging.progress_bar=false"]) == 0
    assert main(["rl", "grpo", "grpo_cpu", "--out", str(rl), f"policy={sft / 'final'}", "train.max_steps=2",
                 "grpo.prompts_per_step=2", "grpo.group_size=2", "eval.every=1", "eval.num_prompts=4",
                 "checkpoint.every=0", "logging.progress_bar=false"]) == 0
    assert [r["step"] for r in metrics(rl) if r["split"] == "eval"] == [0, 1, 2]
    capsys.readouterr()

    load_benchmark("replay_overhead").main(["--hidden", "64", "--vocab", "128", "--seq", "12", "--repeats", "1",
                                             "--warmup", "0", "--checkpoint", str(sft / "final"), "--fidelity-rows", "2"])
    text = capsys.readouterr().out
    assert "| (13,18) |" in text and "| (5,26) |" in text and "FLOPs" in text
    cosine = next(line for line in text.splitlines() if line.startswith("| replay d_f = d_b = 4 |")).split("|")[2]
    assert 0.9 < float(cosine) <= 1.0 + 1e-9
    one_pass = next(line for line in text.splitlines() if line.startswith("| replay, one pass")).split("|")[2]
    assert abs(float(one_pass) - float(cosine)) <= 2e-4  # the same gradient, computed the short way

    load_benchmark("stale_states").main(["--epochs", "2", "--rows", "8", "--batch", "4", "--seq", "16"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 2 |")]
    assert len(rows) == 3 and "warm" in rows[2]


def test_the_rl_page_runs_as_written(tmp_path, monkeypatch) -> None:
    """docs/rl.md: its python block runs as written; each of its commands is run by a test of this file."""
    from test_readme_commands import readme_commands

    assert sorted(readme_commands(RL_PAGE)) == sorted(PAGE_COMMANDS)
    assert all(callable(globals().get(name)) for name in PAGE_COMMANDS.values())
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", RL_PAGE.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 1
    namespace = {"__name__": "__main__"}
    exec(compile(blocks[0], "docs/rl.md", "exec"), namespace)  # noqa: S102
    assert namespace["trainer"].state.global_step == 4


def test_the_update_benchmark_at_a_tiny_scale(capsys) -> None:
    """benchmarks/grpo_update.py: the three update steps side by side; the two replays give one gradient."""
    result = load_benchmark("grpo_update").main(["--hidden", "64", "--vocab", "128", "--prompt", "12", "--completion",
                                                  "4", "--repeats", "1", "--warmup", "1"])
    text = capsys.readouterr().out
    assert all(f"| {name} |" in text for name in ("T2MLRGRPOTrainer", "hand-written", "GRPOTrainer"))
    norms = result["gradient_norms"]
    assert norms["T2MLRGRPOTrainer"] == pytest.approx(norms["hand-written"], rel=1e-4)
    assert result["flops"]["GRPOTrainer"] > result["flops"]["T2MLRGRPOTrainer"] == result["flops"]["hand-written"]
