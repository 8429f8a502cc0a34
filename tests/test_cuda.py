"""The model's contract on a CUDA device, in float32 and under bf16 autocast (issue 45, part A).

Every test runs on the CPU too, so CI (which has no GPU) checks the tests themselves; the CUDA cases skip
without a GPU and run in `benchmarks/gpu/run.sh A`. References are the exact path (the definition), the
float32 model for bf16 autocast, and the GPU model for the CPU copy that loads its checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import random_ids, tiny_model

from t2mlr import T2MLRCache, T2MLRForCausalLM

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")),
]
FP32 = dict(rtol=1e-4, atol=1e-4)  # float32 on either device: SDPA and matmul kernels order sums differently


def fp32_model(device: str, **kwargs) -> T2MLRForCausalLM:
    """The tiny model of the other tests (five blocks, T²MLR(2,4), gates opened) in float32 on `device`."""
    return tiny_model(dtype=torch.float32, **kwargs).to(device)


def left_padded_mask(ids: torch.Tensor, pads: int) -> torch.Tensor:
    mask = torch.ones_like(ids)
    mask[0, :pads] = 0
    return mask


@pytest.mark.parametrize("device", DEVICES)
def test_jacobi_at_the_sequence_length_is_the_exact_path(device: str) -> None:
    """T + 1 Jacobi passes reach the exact fixed point of a T-token row (docs/semantics.md §5.2), padding included."""
    model = fp32_model(device)
    ids = random_ids(2, 12).to(device)
    mask = left_padded_mask(ids, 3)
    with torch.no_grad():
        exact = model(ids, attention_mask=mask, recurrence="exact")
        jacobi = model(ids, attention_mask=mask, recurrence="jacobi", d_forward=ids.shape[1], d_backward=1)
        off = model(ids, attention_mask=mask, recurrence="off")
    real = mask.bool()
    assert (exact.logits - off.logits)[real].abs().max() > 1e-2  # the recurrence matters in this model
    torch.testing.assert_close(jacobi.logits[real], exact.logits[real], **FP32)
    torch.testing.assert_close(jacobi.recurrent_state, exact.recurrent_state, **FP32)


@pytest.mark.parametrize("device", DEVICES)
def test_token_by_token_decoding_continues_the_exact_forward(device: str) -> None:
    """A prompt prefilled into a T2MLRCache, then one token per step: every step's logits are the full
    exact forward's at that position, and generate()'s greedy tokens follow them."""
    model = fp32_model(device)
    ids = random_ids(2, 10).to(device)
    prompt = 4
    with torch.no_grad():
        reference = model(ids, recurrence="exact").logits
        cache = T2MLRCache(config=model.config)
        steps = [model(ids[:, :prompt], past_key_values=cache, use_cache=True, recurrence="exact").logits[:, -1]]
        for t in range(prompt, ids.shape[1]):
            steps.append(model(ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits[:, -1])
    torch.testing.assert_close(torch.stack(steps, dim=1), reference[:, prompt - 1:], **FP32)

    out = model.generate(ids[:, :prompt], max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None,
                         return_dict_in_generate=True, output_logits=True)
    with torch.no_grad():
        rescored = model(out.sequences, recurrence="exact").logits[:, prompt - 1:-1]
    torch.testing.assert_close(torch.stack(out.logits, dim=1), rescored, **FP32)


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_autocast_training_step_is_finite_and_near_float32(device: str) -> None:
    """The trainer's mixed precision (bf16 autocast over float32 weights) on the Jacobi path: the loss is
    within bf16's rounding of the float32 loss and the gradients point the same way."""
    model = fp32_model(device).train()
    ids = random_ids(2, 16).to(device)
    losses, grads = [], []
    for dtype in (None, torch.bfloat16):
        model.zero_grad()
        with torch.autocast(device_type=device, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = model(ids, labels=ids, recurrence="jacobi", d_forward=4, d_backward=2).loss
        loss.backward()
        losses.append(loss.detach().float())
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert torch.isfinite(losses[1]) and torch.isfinite(grads[1]).all()
    torch.testing.assert_close(losses[1], losses[0], rtol=2e-2, atol=0)
    cosine = torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0)
    assert cosine > 0.99, f"bf16 gradients point elsewhere than float32's (cosine {cosine:.4f})"


@pytest.mark.parametrize("device", DEVICES)
def test_trainer_runs_its_steps_on_the_device(device: str, tmp_path: Path) -> None:
    """The trainer on `device` (bf16 autocast on a GPU, its default there): finite losses, weights stay there."""
    from t2mlr.training.config import load_config
    from t2mlr.training.trainer import Trainer

    overrides = [
        "model.base.hidden_size=32", "model.base.intermediate_size=64", "model.base.num_hidden_layers=3",
        "model.base.vocab_size=32", "model.l_start=2", "model.l_end=3", "model.d_forward=4", "model.d_backward=2",
        "data.seq_len=32", "data.kwargs.vocab_size=32", "data.kwargs.num_samples=32", "eval.every=0",
        "train.global_batch_size=4", "train.micro_batch_size=2", "train.max_steps=3", "logging.progress_bar=false",
        "checkpoint.every=0", "checkpoint.save_final=false", f"train.device={device}",
    ]
    trainer = Trainer(load_config("debug", overrides), tmp_path / "run")
    result = trainer.train()
    assert len(result.losses) == 3 and all(torch.isfinite(torch.tensor(result.losses)))
    assert {p.device.type for p in trainer.model.parameters()} == {device}


@pytest.mark.parametrize("device", DEVICES)
def test_a_checkpoint_saved_on_the_device_loads_on_the_cpu(device: str, tmp_path: Path) -> None:
    """save_pretrained from `device`, from_pretrained on the CPU: the same weights, the same logits."""
    model = fp32_model(device)
    ids = random_ids(2, 9)
    with torch.no_grad():
        on_device = model(ids.to(device), recurrence="exact").logits.cpu()
    model.save_pretrained(tmp_path / "ckpt")
    loaded = T2MLRForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32)
    assert next(loaded.parameters()).device.type == "cpu"
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor.cpu()), name
    with torch.no_grad():
        on_cpu = loaded.eval()(ids, recurrence="exact").logits
    torch.testing.assert_close(on_cpu, on_device, **FP32)
