"""Replay from exact states with `exact_states=True`: one pass of the middle block whose backward equals the
iterated replay's (d_forward = d_backward = d gradient-carrying iterates), checked against that path in float64
on left-padded and packed rows, with the prompt recurrence mask and the cache norm, for losses that read the
logits and the returned state."""

from __future__ import annotations

import pytest
import torch
import transformers.models.llama.modeling_llama as llama
from conftest import exact_states, left_padded, random_ids, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def float64_rms_norm(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' RMSNorm takes its variance in float32, which leaves ~1e-7 between two float64 paths that
    compute the same thing in another order; in float64 throughout, they agree to rounding (~1e-14)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.weight * (hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    monkeypatch.setattr(llama.LlamaRMSNorm, "forward", forward)


def padded_rows(model):
    ids, mask = left_padded([random_ids(1, 6, seed=5)[0], random_ids(1, 11, seed=6)[0]])
    return ids, {"attention_mask": mask}, exact_states(model, ids, attention_mask=mask)


def packed_row(model):
    docs = [random_ids(1, 5, seed=7)[0], random_ids(1, 7, seed=8)[0]]
    ids = torch.cat(docs)[None]
    document_ids = torch.cat([torch.full((len(d),), i) for i, d in enumerate(docs)])[None]
    states = torch.cat([exact_states(model, d[None]) for d in docs], dim=1)  # R restarts at each document
    return ids, {"document_ids": document_ids}, states


def gradients(model, ids: torch.Tensor, extra: dict, **path) -> dict[str, torch.Tensor]:
    """Gradients of a loss that reads every logit and the returned last state."""
    model.zero_grad(set_to_none=True)
    out = model(ids, **extra, **path)
    weights = torch.linspace(-1, 1, model.config.vocab_size, dtype=out.logits.dtype)
    real = extra.get("attention_mask", torch.ones_like(ids))[..., None]
    ((out.logits * weights * real).sum() + (out.recurrent_state ** 2).sum()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("rows", [padded_rows, packed_row], ids=["left-padded", "packed"])
@pytest.mark.parametrize("depth", [1, 2, 4])
def test_one_pass_backward_equals_the_iterated_replay(float64_rms_norm, rows, depth: int) -> None:
    model = tiny_model(dtype=torch.float64, cache_residual=True)
    ids, extra, states = rows(model)
    iterated = gradients(model, ids, extra, recurrence="jacobi", initial_states=states, d_forward=depth, d_backward=depth)
    one_pass = gradients(model, ids, extra, recurrence="jacobi", initial_states=states, d_backward=depth, exact_states=True)
    assert set(one_pass) == set(iterated)
    for name, grad in iterated.items():
        torch.testing.assert_close(one_pass[name], grad, rtol=1e-10, atol=1e-10, msg=lambda m, n=name: f"{n}: {m}")
    if depth > 1:  # the depth matters: one iterate's gradient is not this one
        shallow = gradients(model, ids, extra, recurrence="jacobi", initial_states=states, d_backward=1, exact_states=True)
        assert (shallow["model.fusion.w_rec.weight"] - one_pass["model.fusion.w_rec.weight"]).abs().max() > 1e-4


def test_with_the_prompt_recurrence_mask(float64_rms_norm) -> None:
    model = tiny_model(dtype=torch.float64, recurrence_mask_policy="mask")
    ids = random_ids(2, 9, seed=3)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[:, :4] = False  # the prompt writes R but does not read it
    extra = {"recurrence_mask": mask}
    states = exact_states(model, ids, **extra)
    iterated = gradients(model, ids, extra, recurrence="jacobi", initial_states=states, d_forward=3, d_backward=3)
    one_pass = gradients(model, ids, extra, recurrence="jacobi", initial_states=states, d_backward=3, exact_states=True)
    for name, grad in iterated.items():
        torch.testing.assert_close(one_pass[name], grad, rtol=1e-10, atol=1e-10, msg=lambda m, n=name: f"{n}: {m}")


def test_the_middle_block_runs_once_and_the_forward_is_exact() -> None:
    model = tiny_model(dtype=torch.float64)
    ids, extra, states = padded_rows(model)
    calls = []
    hooks = [model.model.layers[i].register_forward_hook(lambda *_: calls.append(1)) for i in model.model.middle_layer_indices()]
    out = model(ids, **extra, recurrence="jacobi", initial_states=states, d_backward=4, exact_states=True)
    for hook in hooks:
        hook.remove()
    assert len(calls) == len(model.model.middle_layer_indices())
    with torch.no_grad():
        exact = model(ids, **extra, recurrence="exact")
    real = extra["attention_mask"].bool()
    assert (out.logits.detach() - exact.logits)[real].abs().max() <= 1e-9
    assert (out.recurrent_state.detach() - exact.recurrent_state).abs().max() <= 1e-9


def test_exact_states_needs_the_states() -> None:
    model = tiny_model()
    with pytest.raises(ValueError, match="pass initial_states"):
        model(random_ids(1, 5), recurrence="jacobi", exact_states=True)
