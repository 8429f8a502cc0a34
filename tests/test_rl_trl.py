"""GRPO on TRL: `T2MLRGRPOTrainer`'s log-probabilities (π_old, π_ref and the ones carrying gradients) against the
exact path (a plain `model(ids, recurrence="exact")` forward) on rollouts with left-padded prompts of two lengths
and completions that stop early; after the policy moved; under PEFT with the reference's adapters disabled;
a training run that moves γ; plain `GRPOTrainer` (Jacobi path) on the same model; the refusals.

TRL's batched forwards and the plain forward here compute the same log-probabilities with differently shaped
kernels, which round differently on each CPU kernel set (in a float64 model too: transformers' RMSNorm takes its
variance in float32). Each comparison allows `rounding.MARGIN` times float32's own gap to float64 on the
reference's computation (`log_probs_tolerance`, `gradient_tolerances`), an upper bound for a float64 model; stale
states, the wrong path or a truncated gradient move them by 1e-3 or more."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from conftest import open_gates
from datasets import concatenate_datasets
from rounding import float32_tolerance, in_dtype
from transformers import LlamaConfig

from t2mlr import T2MLRConfig, T2MLRForCausalLM
from t2mlr.rl.tasks import build_task, prompt_dataset
from t2mlr.rl.trainer import T2MLRGRPOConfig, T2MLRGRPOTrainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")
GROUP, TEMPERATURE, DEPTH_COVERING_THE_ROWS = 4, 1.3, 64


def tiny_policy(directory, dtype: torch.dtype = torch.float64) -> T2MLRForCausalLM:
    """A 4-block T²MLR(2,3) over the variable-assignment vocabulary, gates open, saved to `directory` and loaded
    back (TRL loads a frozen reference from the policy's path)."""
    torch.manual_seed(0)
    base = LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True)
    open_gates(T2MLRForCausalLM(T2MLRConfig.from_base(base, l_start=2, l_end=3)), cur=0.5, rec=-0.8).save_pretrained(directory)
    return T2MLRForCausalLM.from_pretrained(directory, dtype=dtype).train()


def mixed_prompts():
    """Variable-assignment prompts of two lengths (depth 1 and 2), alternating, so a batch is left-padded."""
    short, long = (prompt_dataset(build_task("variable_assignment", 0, depth=d, num_constants=3, num_distractors=1), 0, 4)
                   for d in (1, 2))
    return concatenate_datasets([short, long]).select([0, 4, 1, 5, 2, 6, 3, 7])


def digit_share(prompts, completions, **columns) -> list[float]:
    """A reward with signal on an untrained model: the share of the completion's symbols that are 0-4."""
    return [sum(c in "01234" for c in text) / max(len(text), 1) for text in completions]


def arguments(tmp_path, config_class=T2MLRGRPOConfig, **settings) -> T2MLRGRPOConfig:
    tokenizer = build_task("variable_assignment", 0).tokenizer
    base = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2 * GROUP, num_generations=GROUP,
                max_completion_length=4, temperature=TEMPERATURE, loss_type="grpo", bf16=False, use_cpu=True,
                report_to="none", save_strategy="no", gradient_checkpointing=False, max_steps=1, disable_tqdm=True,
                seed=3, generation_kwargs={"sequence_bias": {(tokenizer.eos_token_id,): 2.5}})  # some stop early
    if config_class is T2MLRGRPOConfig:
        base["replay_depth"] = DEPTH_COVERING_THE_ROWS
    return config_class(**{**base, **settings})


def trainer_for(model, args, trainer_class=T2MLRGRPOTrainer, **kwargs):
    dataset = mixed_prompts()
    return trainer_class(model=model, reward_funcs=digit_share, args=args, train_dataset=dataset,
                         processing_class=build_task("variable_assignment", 0).tokenizer, **kwargs)


def rollout(trainer):
    """One generation batch as TRL's sampler forms it: two prompts of different lengths, GROUP completions each."""
    dataset = trainer.train_dataset
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop; compute_loss reads it
    out = trainer._generate_and_score_completions([dataset[i // GROUP] for i in range(2 * GROUP)])
    assert len(set(out["prompt_mask"].sum(dim=1).tolist())) == 2  # left padding in the batch
    assert bool((out["completion_mask"] == 0).any())  # a completion that stopped early
    return out


def exact_log_probs(model, out, **path) -> torch.Tensor:
    """log π of every completion token from one plain forward (the exact path unless `path` says otherwise)."""
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
    mask = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
    width = out["completion_ids"].shape[1]
    logits = model(ids, attention_mask=mask, **({"recurrence": "exact"} | path)).logits[:, -width - 1 : -1]
    log_probs = torch.log_softmax(logits.double() / TEMPERATURE, dim=-1)
    return log_probs.gather(-1, out["completion_ids"][..., None]).squeeze(-1)


def log_probs_tolerance(model, out, reference: Callable = exact_log_probs, **path) -> float:
    """How far two computations of `reference(model, out, **path)` may differ (module docstring)."""
    def log_probs(dtype: torch.dtype) -> torch.Tensor:
        with torch.no_grad():
            return reference(in_dtype(model, dtype), out, **path)[out["completion_mask"].bool()]

    return float32_tolerance(log_probs)


def assert_close_on_completions(got, expected, out, tolerance: float) -> None:
    kept = out["completion_mask"].bool()
    assert float((got.double() - expected.double())[kept].abs().max()) <= tolerance


def grpo_loss(log_probs, out, beta=0.0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """TRL's "grpo" loss written out, computed in `dtype`: clipped ratio to π_old, KL to π_ref, mean over each
    completion's tokens, then over completions."""
    old, mask = out["old_per_token_logps"].to(dtype), out["completion_mask"].to(dtype)
    advantages = out["advantages"].to(dtype)[:, None]
    log_probs = log_probs.to(dtype)
    ratio = torch.exp(log_probs - old)
    token_loss = -torch.minimum(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages)
    if beta:
        delta = out["ref_per_token_logps"].to(dtype) - log_probs
        token_loss = token_loss + beta * (torch.exp(delta) - delta - 1)
    return ((token_loss * mask).sum(dim=1) / mask.sum(dim=1)).mean()


def loss_tolerance(model, out, beta: float = 0.0) -> float:
    """How far two computations of `grpo_loss` on the exact path may differ: its terms (ratio × advantage, of
    either sign) are of the advantages' size and cancel to a loss near 0, so float32's rounding is of theirs."""
    def loss(dtype: torch.dtype) -> torch.Tensor:
        with torch.no_grad():
            return grpo_loss(exact_log_probs(in_dtype(model, dtype), out), out, beta=beta, dtype=dtype)

    return float32_tolerance(loss, scale=float(out["advantages"].abs().max()))


def gradients(model, loss) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    named = model.named_parameters(remove_duplicate=False)  # a tied weight under each of its names, in any copy
    return {n: p.grad.clone() for n, p in named if p.grad is not None}


def gradient_tolerances(model, out, beta: float) -> dict[str, float]:
    """How far two computations of each parameter's gradient of `grpo_loss` on the exact path may differ."""
    by_dtype = {}
    for dtype in (torch.float32, torch.float64):
        copy = in_dtype(model, dtype)
        by_dtype[dtype] = gradients(copy, grpo_loss(exact_log_probs(copy, out), out, beta=beta, dtype=dtype))
    return {name: float32_tolerance(lambda dtype, n=name: by_dtype[dtype][n]) for name in by_dtype[torch.float64]}


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "gradient_checkpointing"])  # TRL's default: on
def test_log_probs_loss_and_gradient_equal_the_exact_path(tmp_path, checkpointing) -> None:
    model = tiny_policy(tmp_path / "policy")
    trainer = trainer_for(model, arguments(tmp_path, num_iterations=2, beta=0.5,  # π_old and π_ref are computed
                                           gradient_checkpointing=checkpointing))
    if checkpointing:  # what the training loop does with the setting
        trainer.model.gradient_checkpointing_enable(trainer.args.gradient_checkpointing_kwargs)
        assert trainer.model.is_gradient_checkpointing
    out = rollout(trainer)
    assert trainer.replay_path(trainer.model)["exact_states"]  # the policy that sampled the rollout: one pass
    with torch.no_grad():
        exact = exact_log_probs(model, out)
    tolerance = log_probs_tolerance(model, out)
    assert_close_on_completions(out["old_per_token_logps"], exact, out, tolerance)
    assert_close_on_completions(out["ref_per_token_logps"], exact, out, tolerance)  # the reference, before any step

    replayed = gradients(model, trainer.compute_loss(trainer.model, out))
    loss_value = float(trainer.compute_loss(trainer.model, out).detach())
    reference = grpo_loss(exact_log_probs(model, out), out, beta=0.5)
    expected = gradients(model, reference)
    assert loss_value == pytest.approx(float(reference.detach()), abs=loss_tolerance(model, out, beta=0.5))
    # replay_depth covers the rows, so the truncated BPTT gradient is the exact path's untruncated one
    tolerances = gradient_tolerances(model, out, beta=0.5)
    for name, grad in expected.items():
        torch.testing.assert_close(replayed[name], grad, rtol=0, atol=tolerances[name],
                                   msg=lambda m, n=name: f"{n}: {m}")
    assert expected["model.fusion.w_rec.weight"].abs().max() > 0  # the recurrence takes part in the gradient


def test_once_the_policy_moved_the_replay_iterates_to_its_fixed_point(tmp_path) -> None:
    model = tiny_policy(tmp_path / "policy")
    trainer = trainer_for(model, arguments(tmp_path, num_iterations=2))
    out = rollout(trainer)
    with torch.no_grad():  # an optimizer step on the same rollout (num_iterations = 2): the states are now stale
        model.model.fusion.w_rec.weight.add_(0.3 * torch.randn_like(model.model.fusion.w_rec.weight))
    trainer.state.global_step += 1
    assert not trainer.replay_path(trainer.model)["exact_states"]
    with torch.no_grad():
        moved = exact_log_probs(model, out)
        one_pass = exact_log_probs(model, out, recurrence="jacobi", initial_states=out["recurrent_states"], exact_states=True)
    kept = out["completion_mask"].bool()
    assert float((one_pass - moved)[kept].abs().max()) > 1e-4  # the stale states are not the moved policy's
    loss_value = float(trainer.compute_loss(trainer.model, out).detach())
    assert loss_value == pytest.approx(float(grpo_loss(moved, out)), abs=loss_tolerance(model, out))


def without_adapters(policy, out) -> torch.Tensor:
    with policy.disable_adapter():
        return exact_log_probs(policy, out)


def test_peft_scores_the_reference_with_its_adapters_disabled(tmp_path) -> None:
    from peft import LoraConfig

    model = tiny_policy(tmp_path / "policy", dtype=torch.float32)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    trainer = trainer_for(model, arguments(tmp_path, num_iterations=2, beta=0.1), peft_config=lora)
    policy = trainer.model
    with torch.no_grad():  # adapters that change the policy, so that the reference (adapters off) differs from it
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.5)
    out = rollout(trainer)
    with torch.no_grad():
        adapted, base = exact_log_probs(policy, out), without_adapters(policy, out)
    kept = out["completion_mask"].bool()
    assert float((adapted - base)[kept].abs().max()) > 1e-3
    assert_close_on_completions(out["old_per_token_logps"], adapted, out, log_probs_tolerance(policy, out))
    reference_tolerance = log_probs_tolerance(policy, out, without_adapters)
    assert_close_on_completions(out["ref_per_token_logps"], base, out, reference_tolerance)


def test_training_steps_move_the_gates_and_log_trl_metrics(tmp_path) -> None:
    model = tiny_policy(tmp_path / "policy", dtype=torch.float32)
    gates = {n: float(getattr(model.fusion, n)) for n in model.fusion.gate_names}
    trainer = trainer_for(model, arguments(tmp_path, max_steps=2, learning_rate=0.05, replay_depth=2, logging_steps=1))
    trainer.train()
    moved = {n: float(getattr(model.fusion, n)) for n in model.fusion.gate_names}
    assert all(abs(moved[n] - gates[n]) > 1e-6 for n in gates), (gates, moved)
    logged = [record for record in trainer.state.log_history if "reward" in record]
    assert [record["step"] for record in logged] == [1, 2]
    assert all(record["rollout_s"] > 0 and record["grad_norm"] > 0 for record in logged)


def test_plain_grpo_trainer_runs_and_scores_on_the_jacobi_path(tmp_path) -> None:
    from trl import GRPOConfig, GRPOTrainer

    model = tiny_policy(tmp_path / "policy")
    trainer = trainer_for(model, arguments(tmp_path, GRPOConfig, num_iterations=2), trainer_class=GRPOTrainer)
    trainer.current_gradient_accumulation_steps = 1
    dataset = trainer.train_dataset
    out = trainer._generate_and_score_completions([dataset[i // GROUP] for i in range(2 * GROUP)])
    with torch.no_grad():
        jacobi = exact_log_probs(model, out, recurrence=None)  # the model's training path: Jacobi from the seed pass
        exact = exact_log_probs(model, out)
    assert model.training and model.forward_path().recurrence == "jacobi"
    tolerance = log_probs_tolerance(model, out, recurrence=None)
    assert_close_on_completions(out["old_per_token_logps"], jacobi, out, tolerance)
    kept = out["completion_mask"].bool()
    assert float((jacobi - exact)[kept].abs().max()) > 1e-3  # which is not the exact path
    trainer.train()
    assert trainer.state.global_step == 1


def test_refuses_rollouts_without_states_and_other_models(tmp_path) -> None:
    from transformers import LlamaForCausalLM

    model = tiny_policy(tmp_path / "policy", dtype=torch.float32)
    with pytest.raises(ValueError, match="does not support rollout_func"):
        trainer_for(model, arguments(tmp_path), rollout_func=lambda prompts, trainer: {})
    with pytest.raises(ValueError, match="does not support use_vllm"):  # refused before vLLM would start
        trainer_for(model, arguments(tmp_path, use_vllm=True))
    torch.manual_seed(0)
    plain = LlamaForCausalLM(LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    with pytest.raises(ValueError, match="trains T²MLR models"):
        trainer_for(plain, arguments(tmp_path))
    with pytest.raises(ValueError, match="replay_depth must be >= 1"):
        arguments(tmp_path, replay_depth=0)
