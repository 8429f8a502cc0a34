"""GRPO with replayed states: rewards, advantages and the loss of one group against an independent
reference (hand-decoded answers, the task's own solver, `statistics`, the exact path row by row), the
loss formula on hand-computed cases, resume, config strictness and the command."""

from __future__ import annotations

import json
import math
import statistics

import pytest
import torch

from t2mlr.cli import main
from t2mlr.tasks.variable_assignment import solve_variable_assignment
from t2mlr.training.config import ConfigError
from t2mlr.training.grpo import (
    GrpoTrainer,
    clipped_token_losses,
    completion_mask,
    group_advantages,
    load_grpo_config,
    token_weights,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny_trainer(tmp_path, *overrides: str) -> GrpoTrainer:
    cfg = load_grpo_config("grpo_tiny", ["logging.progress_bar=false", *overrides])
    return GrpoTrainer(cfg, tmp_path / "run")


def open_gates(model) -> None:
    with torch.no_grad():
        model.fusion.gamma_cur.fill_(0.5)
        model.fusion.gamma_rec.fill_(-0.8)
        model.fusion.w_rec.weight.mul_(10.0)


def hand_reward(tokenizer, prompt: str, generated: list[int]) -> float:
    """Symbols up to the end-of-text token, read by hand; right when the first is the solver's answer."""
    symbols = []
    for token in generated:
        if token == tokenizer.eos_token_id:
            break
        symbols.append(tokenizer.convert_ids_to_tokens(token))
    return 1.0 if symbols and symbols[0] == solve_variable_assignment(prompt) else 0.0


def exact_row_log_probs(model, sequence: torch.Tensor, prompt_length: int, temperature: float) -> torch.Tensor:
    """log π of every generated token of one row, alone and on the exact path (token by token)."""
    out = model(sequence[None], recurrence="exact")
    logits = out.logits[0, prompt_length - 1 : -1].double() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, sequence[prompt_length:, None]).squeeze(-1)


def test_one_group_matches_an_independent_reference(tmp_path) -> None:
    group, depth_covering_the_row = 4, 64
    trainer = tiny_trainer(tmp_path, "grpo.prompts_per_step=2", f"grpo.group_size={group}",
                           f"grpo.replay_depth={depth_covering_the_row}", "grpo.max_new_tokens=3", "grpo.temperature=1.3",
                           "train.seed=1")  # a seed whose first group holds a right and a wrong completion
    model = trainer.model.to(torch.float64)
    open_gates(model)
    rollout = trainer.collect(0)
    rows, temperature = rollout.sequences.shape[0], 1.3
    assert rows == 2 * group and rollout.states.dtype == torch.float64

    prompt_length = rollout.prompt_length  # variable-assignment prompts of one setting share their length
    assert bool(rollout.attention_mask.all())
    rewards = [hand_reward(trainer.tokenizer, rollout.samples[i // group]["prompt"], rollout.sequences[i, prompt_length:].tolist())
               for i in range(rows)]
    assert rollout.rewards.tolist() == rewards

    first = rewards[:group]
    assert 0 < sum(first) < group
    spread = statistics.stdev(first)
    expected_advantages = [(r - statistics.mean(first)) / (spread + 1e-4) for r in first]
    torch.testing.assert_close(rollout.advantages[:group].double(), torch.tensor(expected_advantages, dtype=torch.float64),
                               rtol=1e-6, atol=1e-6)

    # the loss of group 0 and its gradient: replay (from the rollout's states) against the exact path, row by row
    weights = token_weights(rollout.mask, "grpo", 3)
    model.zero_grad(set_to_none=True)
    loss, _, _ = trainer.policy_loss(rollout, slice(0, group), weights)
    loss.backward()
    replay_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    model.zero_grad(set_to_none=True)
    reference = torch.zeros((), dtype=torch.float64)
    for i in range(group):
        log_probs = exact_row_log_probs(model, rollout.sequences[i], prompt_length, temperature)
        counted = [t for t in range(log_probs.numel()) if bool(rollout.mask[i, t])]
        ratio_terms = [torch.exp(log_probs[t] - log_probs[t].detach()) for t in counted]  # π_old = π (one iteration)
        per_row = sum(-(ratio * expected_advantages[i]) for ratio in ratio_terms) / len(counted)
        reference = reference + per_row / rows
    reference.backward()
    assert abs(float(loss.detach()) - float(reference.detach())) < 1e-9
    assert abs(float(reference.detach()) + sum(expected_advantages) / rows) < 1e-9  # ratio 1: the value is −Σ A / N
    # transformers' RMSNorm takes its variance in float32: two float64 orders of the same sum agree to ~1e-7
    for name, grad in replay_grads.items():
        torch.testing.assert_close(grad, model.get_parameter(name).grad, rtol=1e-5, atol=1e-7, msg=lambda m, n=name: f"{n}: {m}")
    assert replay_grads["model.fusion.w_rec.weight"].abs().max() > 0  # the recurrence takes part in the gradient


def test_clipped_losses_and_kl_on_hand_computed_tokens() -> None:
    log_probs = torch.log(torch.tensor([[0.5, 0.2], [0.3, 0.9]]))
    old = torch.log(torch.tensor([[0.25, 0.2], [0.6, 0.9]]))  # ratios 2, 1 / 0.5, 1
    ref = torch.log(torch.tensor([[0.4, 0.1], [0.3, 0.5]]))
    advantages = torch.tensor([1.5, -2.0])
    losses, kl, clipped = clipped_token_losses(log_probs, old, advantages, 0.2, 0.28, ref, beta=0.1)
    expected = []
    rows = zip([[0.5, 0.2], [0.3, 0.9]], [[0.25, 0.2], [0.6, 0.9]], [[0.4, 0.1], [0.3, 0.5]])
    for i, (row_p, row_old, row_ref) in enumerate(rows):
        for p, o, q in zip(row_p, row_old, row_ref):
            ratio = p / o
            a = float(advantages[i])
            clip = min(max(ratio, 0.8), 1.28)
            k = q / p - math.log(q / p) - 1
            expected.append(-min(ratio * a, clip * a) + 0.1 * k)
    torch.testing.assert_close(losses.flatten(), torch.tensor(expected), rtol=1e-6, atol=1e-6)
    assert clipped.tolist() == [[True, False], [True, False]]  # 2 > 1.28 with A > 0; 0.5 < 0.8 with A < 0
    assert float(kl[1, 0]) == pytest.approx(0.0, abs=1e-7)


def test_completion_mask_and_the_three_normalisations() -> None:
    ids = torch.tensor([[5, 2, 7, 7], [5, 6, 7, 8], [2, 2, 2, 2]])
    mask = completion_mask(ids, eos_token_id=2)
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    losses = torch.tensor([[1.0, 2.0, 9.0, 9.0], [1.0, 1.0, 1.0, 5.0], [4.0, 9.0, 9.0, 9.0]])
    per_row_means = [(1 + 2) / 2, (1 + 1 + 1 + 5) / 4, 4.0]
    assert float((losses * token_weights(mask, "grpo", 4)).sum()) == pytest.approx(sum(per_row_means) / 3)
    assert float((losses * token_weights(mask, "bnpo", 4)).sum()) == pytest.approx((3 + 8 + 4) / 7)
    assert float((losses * token_weights(mask, "dr_grpo", 4)).sum()) == pytest.approx((3 + 8 + 4) / 12)
    advantages = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0]), 3, scale=False)
    assert advantages.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, -2 / 3, 1 / 3, 1 / 3])


def test_a_resumed_run_repeats_the_uninterrupted_one(tmp_path) -> None:
    def run(out, stop_after=None, resume=False):
        cfg = load_grpo_config("grpo_tiny", ["logging.progress_bar=false", "eval.every=0"])
        return GrpoTrainer(cfg, out, resume=resume).train(stop_after)

    straight = run(tmp_path / "a")
    run(tmp_path / "b", stop_after=2)
    resumed = run(tmp_path / "b", resume=True)
    keys = ("reward_mean", "loss", "grad_norm")
    assert [[r[k] for k in keys] for r in resumed] == [[r[k] for k in keys] for r in straight[2:]]
    lines = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3, 4]


def test_config_is_strict(tmp_path) -> None:
    with pytest.raises(ConfigError, match="Did you mean 'group_size'"):
        load_grpo_config("grpo_tiny", ["grpo.group_sise=4"])
    with pytest.raises(ConfigError, match="group_size must be >= 2"):
        load_grpo_config("grpo_tiny", ["grpo.group_size=1"])
    with pytest.raises(ConfigError, match="task.name must be one of"):
        load_grpo_config("grpo_tiny", ["task.name=chess"])
    with pytest.raises(ConfigError, match="exactly one of policy"):
        load_grpo_config("grpo_tiny", ["policy=runs/x"])


def test_the_command_runs_and_draws_the_curve(tmp_path, capsys) -> None:
    out = tmp_path / "cli"
    assert main(["rl", "grpo", "grpo_tiny", "--out", str(out), "train.max_steps=2", "eval.every=1"]) == 0
    assert "mean reward" in capsys.readouterr().out
    assert (out / "reward.png").is_file() and (out / "final" / "model.safetensors").is_file()
    assert main(["rl", "grpo", "grpo_tiny", "--out", str(out), "train.max_steps=2"]) == 2  # refuses to overwrite


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


def test_readme_rl_commands_at_a_tiny_scale(tmp_path, capsys) -> None:
    """The README's chain at a tiny scale: SFT warm-up with the trainer, GRPO from its policy, the replay
    benchmark (timing and gradient fidelity on that checkpoint) and the stale-state measurement."""
    sft, rl = tmp_path / "sft", tmp_path / "rl"
    assert main(["train", "grpo_va_sft_cpu", "--out", str(sft), "--threads", "1", "train.max_steps=2",
                 "data.kwargs.num_samples=64", "checkpoint.every=0", "logging.progress_bar=false"]) == 0
    assert main(["rl", "grpo", "grpo_cpu", "--out", str(rl), f"policy={sft / 'final'}", "train.max_steps=2",
                 "grpo.prompts_per_step=2", "grpo.group_size=2", "eval.every=1", "eval.num_prompts=4",
                 "checkpoint.every=0", "logging.progress_bar=false"]) == 0
    records = [json.loads(x) for x in (rl / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "eval"] == [0, 1, 2]
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


def test_kl_to_the_reference_and_several_updates_per_rollout(tmp_path) -> None:
    """beta > 0 keeps a frozen copy of the initial policy (log-probs on the exact path); iterations > 1 takes
    π_old from the rollout (replayed at depth 1), so the second update's ratios move away from 1."""
    trainer = tiny_trainer(tmp_path, "grpo.beta=0.5", "grpo.iterations=2", "train.seed=1", "optim.lr=0.05",
                           "grpo.prompts_per_step=2", "eval.every=0", "checkpoint.every=0")
    assert trainer.reference is not None and not any(p.requires_grad for p in trainer.reference.parameters())
    rollout = trainer.collect(0)
    with torch.no_grad():  # π_old, π_ref and the replayed π agree before any update
        now = torch.cat([trainer.policy_loss(rollout, slice(i, i + 1), token_weights(rollout.mask, "grpo", 2))[1][None]
                         for i in range(rollout.sequences.shape[0])])
    torch.testing.assert_close(rollout.old_log_probs, rollout.ref_log_probs, rtol=0, atol=1e-5)
    assert float(now.abs().max()) < 1e-6  # KL to the reference is 0 at the start
    stats = trainer.update(rollout)
    assert stats.kl > 0 and math.isfinite(stats.loss)  # after the first update the policy left the reference
