"""TRL's trainers run on T²MLR models as they are, with no override (docs/ecosystem.md), and the TRL
settings a T²MLR model cannot honour stop with a clear error before anything is computed wrong.

SFTTrainer (full finetune; LoRA with the fusion trainable is in test_peft.py) and DPOTrainer on a tiny
T²MLR model whose gates start closed, as a retrofit's do: the loss falls, the gates γ open, and the
saved model reloads computing the same logits. TRL scores tokens through the backbone
(`model.base_model`, its fused LM head) with TRL's defaults, gradient checkpointing included.

Padding-free batches (TRL's `padding_free`, and `packing` with the bfd strategy: one row, position_ids
restarting at 0 per sequence, no attention mask) are read by T²MLR as documents: R restarts at each
position 0 and attention stays inside each document, so they score exactly as the padded batch.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

trl = pytest.importorskip("trl")

import torch  # noqa: E402
from conftest import random_ids, tiny_model  # noqa: E402
from datasets import Dataset  # noqa: E402
from rounding import forward_tolerance  # noqa: E402
from test_generation import build_tokenizer  # noqa: E402
from transformers import AttentionInterface, AutoModelForCausalLM  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask  # noqa: E402
from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer  # noqa: E402
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling  # noqa: E402

import t2mlr.model  # noqa: E402,F401  (registers the t2mlr model type with the Auto classes)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEXTS = [
    "what color is the sky blue", "what color is grass green", "how many legs has a dog four",
    "which animal says moo cow", "what is two plus two four", "do bees make honey",
]
PREFERENCES = {
    "prompt": ["what color is the sky", "what color is grass", "how many legs has a dog", "which animal says moo"],
    "chosen": [" blue", " green", " four", " cow"],
    "rejected": [" red", " blue", " six", " cat"],
}
# a Jacobi depth far below the sequence lengths: the training path differs from the exact one
SHALLOW_JACOBI = dict(train_recurrence="jacobi", d_forward=1, d_backward=1)


def save_tiny_t2mlr(path: Path, gates: bool = False, **config: object) -> Path:
    """A tiny float32 T²MLR model and its tokenizer; closed gates (γ = 0) unless `gates`, as a fresh retrofit."""
    tiny_model(dtype=torch.float32, gates=gates, **config).save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    return path


def trainer_args(config_class: type, out: Path, **overrides: object):
    """TRL's defaults (gradient checkpointing on) at a tiny scale, in float32 on the CPU, no saving or reports."""
    settings = dict(output_dir=str(out), max_steps=8, per_device_train_batch_size=4, learning_rate=1e-2,
                    logging_steps=1, report_to=[], use_cpu=True, bf16=False, save_strategy="no", seed=0)
    return config_class(**{**settings, **overrides})


def mean_nll(model: torch.nn.Module, texts: list[str]) -> float:
    """Mean next-token loss of the texts, each on its own, on the exact path (what evaluation computes)."""
    tokenizer = build_tokenizer()
    was_training = model.training
    model.eval()
    with torch.no_grad():
        losses = [float(model(ids, labels=ids, recurrence="exact").loss)
                  for ids in (torch.tensor([tokenizer.encode(text)]) for text in texts)]
    model.train(was_training)
    return sum(losses) / len(losses)


def gates(model: torch.nn.Module) -> torch.Tensor:
    return torch.stack([model.fusion.gamma_cur.detach(), model.fusion.gamma_rec.detach()]).clone()


def assert_reloads_with_the_same_logits(model: torch.nn.Module, directory: Path) -> None:
    """A fresh process's load (the Auto class) computes what the trained model computes, on both paths."""
    reloaded = AutoModelForCausalLM.from_pretrained(directory).eval()
    ids = random_ids(2, 9)
    model.eval()
    with torch.no_grad():
        for path in ({"recurrence": "exact"}, {"recurrence": "jacobi", "d_forward": 3, "d_backward": 1}):
            torch.testing.assert_close(reloaded(ids, **path).logits, model(ids, **path).logits, rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------- SFT and DPO


def test_sft_trainer_trains_a_t2mlr_model_as_it_is(tmp_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(save_tiny_t2mlr(tmp_path / "base", d_forward=4, d_backward=2))
    before, closed = mean_nll(model, TEXTS), gates(model)
    trainer = SFTTrainer(model=model, args=trainer_args(SFTConfig, tmp_path / "out"),
                         train_dataset=Dataset.from_dict({"text": TEXTS * 2}), processing_class=build_tokenizer())
    trainer.train()
    assert model.is_gradient_checkpointing  # TRL's default, on the T²MLR blocks
    assert mean_nll(model, TEXTS) < before - 0.2
    assert (gates(model) - closed).abs().min() > 1e-4  # both gates opened
    trainer.save_model(str(tmp_path / "trained"))
    assert_reloads_with_the_same_logits(model, tmp_path / "trained")


def test_dpo_trainer_trains_against_a_reference_on_the_policys_path(tmp_path: Path) -> None:
    """DPO's reference runs in eval mode, where T²MLR takes its evaluation path (exact), while the policy
    trains on its training path (here a Jacobi depth of 1): TRL's own reference would not start equal to
    the policy. The recipe's reference, loaded with eval_recurrence = the policy's train_recurrence, does:
    the first loss is exactly log 2."""
    base = save_tiny_t2mlr(tmp_path / "base", gates=True, **SHALLOW_JACOBI)
    data = Dataset.from_dict(PREFERENCES)

    def dpo(reference, out: str, steps: int):
        policy = AutoModelForCausalLM.from_pretrained(base)
        trainer = DPOTrainer(model=policy, ref_model=reference, train_dataset=data, processing_class=build_tokenizer(),
                             args=trainer_args(DPOConfig, tmp_path / out, max_steps=steps, learning_rate=5e-3))
        trainer.train()
        return policy, trainer, [log["loss"] for log in trainer.state.log_history if "loss" in log]

    _, _, trl_reference = dpo(None, "trl_reference", steps=1)
    assert abs(trl_reference[0] - math.log(2)) > 1e-3  # the exact-path reference differs from the policy
    policy = AutoModelForCausalLM.from_pretrained(base)
    reference = AutoModelForCausalLM.from_pretrained(base, eval_recurrence=policy.config.train_recurrence)
    policy, trainer, losses = dpo(reference, "recipe", steps=8)
    assert losses[0] == pytest.approx(math.log(2), abs=1e-6)
    assert losses[-1] < math.log(2) - 0.02
    assert (gates(policy) - gates(reference)).abs().min() > 1e-4
    trainer.save_model(str(tmp_path / "trained"))
    assert_reloads_with_the_same_logits(policy, tmp_path / "trained")


@pytest.mark.parametrize("precision", ["bf16 autocast", "bf16 weights", "fp32"])
def test_trls_own_reference_starts_at_log_2_on_an_unchanged_retrofit_given_the_policys_path(
        tmp_path: Path, precision: str) -> None:
    """An unchanged retrofit (γ = 0) computes its base model on every path, so DPO starts at log 2. TRL loads
    its own reference from the policy's directory and runs it in eval mode: the evaluation path (exact, the
    middle block token by token over its cache), while the policy trains on the Jacobi path (the whole
    sequence at once). In float32 the two round alike; in bf16 they do not, and the first loss is off. Given
    the policy's path for evaluation (`model_init_kwargs`: the keywords TRL loads its reference with), the
    reference computes what the policy computes, bit for bit, in every precision."""
    base = save_tiny_t2mlr(tmp_path / "base", d_forward=4, d_backward=2)
    dtype = torch.bfloat16 if precision == "bf16 weights" else torch.float32
    data = Dataset.from_dict(PREFERENCES)

    def first_loss(out: str, **settings: object) -> float:
        policy = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
        args = trainer_args(DPOConfig, tmp_path / out, max_steps=1, learning_rate=0.0, bf16=precision != "fp32",
                            **settings)
        trainer = DPOTrainer(model=policy, train_dataset=data, processing_class=build_tokenizer(), args=args)
        assert trainer.ref_model is not None and not trainer.ref_model.training  # TRL's own, in eval mode
        trainer.train()
        return next(log["loss"] for log in trainer.state.log_history if "loss" in log)

    given_path = first_loss("policy_path", model_init_kwargs={"eval_recurrence": "jacobi"})
    assert given_path == pytest.approx(math.log(2), abs=1e-6)
    evaluation_path = first_loss("evaluation_path")
    if precision == "fp32":
        assert evaluation_path == pytest.approx(math.log(2), abs=1e-6)
    else:
        assert abs(evaluation_path - math.log(2)) > 2e-6  # the exact path rounds otherwise in bf16


# ---------------------------------------------------------------------------------------------- padding-free


@pytest.mark.parametrize("path", [{"recurrence": "exact"}, {"recurrence": "jacobi", "d_forward": 2, "d_backward": 1}],
                         ids=["exact", "jacobi"])
def test_padding_free_batches_score_as_padded_batches(path: dict) -> None:
    """TRL's padding-free collator flattens the batch into one row whose position_ids restart at 0 for each
    sequence: T²MLR restarts R there and keeps attention inside each sequence, so the loss and every
    gradient equal the padded batch's."""
    tokenizer = build_tokenizer()
    examples = [{"input_ids": tokenizer.encode(text)} for text in TEXTS[:4]]
    padded = DataCollatorForLanguageModeling(pad_token_id=0)(examples)
    flat = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(examples)
    assert flat["input_ids"].shape[0] == 1 and "attention_mask" not in flat

    def loss_and_grads(batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model = tiny_model().train()  # float64, gates open
        loss = model(**batch, **path).loss
        loss.backward()
        return loss.detach(), {name: p.grad for name, p in model.named_parameters() if p.grad is not None}

    padded_loss, padded_grads = loss_and_grads(padded)
    flat_loss, flat_grads = loss_and_grads(flat)
    torch.testing.assert_close(flat_loss, padded_loss, rtol=0, atol=1e-12)
    assert flat_grads.keys() == padded_grads.keys()
    for name, grad in padded_grads.items():
        torch.testing.assert_close(flat_grads[name], grad, rtol=0, atol=1e-10, msg=name)


def maskless_attention(module, query, key, value, attention_mask, **kwargs):
    """sdpa that, like flash attention, gets no 4D mask from the model (causal when the mask is None)."""
    return sdpa_attention_forward(module, query, key, value, None, **kwargs)


def test_packed_rows_need_an_attention_that_keeps_documents_apart(tmp_path: Path) -> None:
    """An attention implementation whose masks are flash attention's (None or 2D, the same-document mask
    dropped) computes unpacked, unpadded rows as sdpa does on both paths, but a packed row is refused (its
    documents would attend to each other), and so is a padded row on the exact path."""
    AttentionInterface.register("maskless", maskless_attention)
    AttentionMaskInterface.register("maskless", lambda *args, **kwargs: flash_attention_mask(*args, **kwargs))
    save_tiny_t2mlr(tmp_path / "model")
    sdpa = AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()
    maskless = AutoModelForCausalLM.from_pretrained(tmp_path / "model", attn_implementation="maskless").eval()
    ids = random_ids(2, 10)
    paths = ({"recurrence": "exact"}, {"recurrence": "jacobi", "d_forward": 2, "d_backward": 1})
    with torch.no_grad():
        for path in paths:
            tolerance = forward_tolerance(sdpa, ids, **path)  # two attention kernels: float32 rounding apart
            torch.testing.assert_close(maskless(ids, **path).logits, sdpa(ids, **path).logits, rtol=0, atol=tolerance)
        packed = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2]] * 2)
        for path in paths:
            with pytest.raises(ValueError, match="packed rows .* need attn_implementation 'sdpa' or 'eager'"):
                maskless(ids, position_ids=packed, **path)
        padded = torch.ones_like(ids)
        padded[0, :3] = 0
        with pytest.raises(ValueError, match="the exact path needs 'eager' or 'sdpa' attention"):
            maskless(ids, attention_mask=padded, recurrence="exact")


# ---------------------------------------------------------------------------------------------- checkpointing


def test_reentrant_checkpointing_is_refused_where_the_replay_needs_autograd_grad(tmp_path: Path) -> None:
    """Reentrant checkpointing (`gradient_checkpointing_kwargs={"use_reentrant": True}`) leaves the exact and
    Jacobi training paths as they are, but cannot run the replay's backward (bptt_window, exact_states):
    that is a clear error at the first forward, under TRL too, not torch's mid-backward failure."""
    ids = random_ids(3, 8)

    def loss_and_grads(model, **path):
        model.zero_grad()
        model(ids, labels=ids, **path).loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    model = tiny_model().train()
    jacobi = {"recurrence": "jacobi", "d_forward": 3, "d_backward": 2}
    plain = [loss_and_grads(model, recurrence="exact"), loss_and_grads(model, **jacobi)]
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    for reference, path in zip(plain, ({"recurrence": "exact"}, jacobi)):
        for name, grad in loss_and_grads(model, **path).items():
            torch.testing.assert_close(grad, reference[name], rtol=0, atol=1e-10, msg=name)
    with pytest.raises(ValueError, match="use_reentrant=True cannot run the replayed middle block"):
        model(ids, labels=ids, recurrence="exact", bptt_window=2)

    base = save_tiny_t2mlr(tmp_path / "base", train_recurrence="exact", bptt_window=2)
    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(base), processing_class=build_tokenizer(),
                         train_dataset=Dataset.from_dict({"text": TEXTS}),
                         args=trainer_args(SFTConfig, tmp_path / "out", gradient_checkpointing_kwargs={"use_reentrant": True}))
    with pytest.raises(ValueError, match="gradient_checkpointing_kwargs=\\{'use_reentrant': False\\}"):
        trainer.train()


def test_attention_implementations_the_model_cannot_run_are_refused_on_load(tmp_path: Path) -> None:
    """`model_init_kwargs={"attn_implementation": ...}`: flex attention has no T²MLR support (transformers
    refuses it when loading); eager and sdpa compute the same exact path."""
    save_tiny_t2mlr(tmp_path / "model")
    with pytest.raises(ValueError, match="flex_attention"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "model", attn_implementation="flex_attention")
    ids = random_ids(2, 7)
    with torch.no_grad():
        eager, sdpa = (AutoModelForCausalLM.from_pretrained(tmp_path / "model", attn_implementation=name).eval()
                       for name in ("eager", "sdpa"))
        tolerance = forward_tolerance(sdpa, ids, recurrence="exact")  # two attention kernels: rounding apart
        torch.testing.assert_close(eager(ids, recurrence="exact").logits, sdpa(ids, recurrence="exact").logits,
                                   rtol=0, atol=tolerance)
