"""Truncated BPTT, cost of the Jacobi path, early stop and middle-block checkpointing (docs/semantics.md §5.2).

Gradient tolerances are ~1e-6 relative although the models are float64: transformers' RMSNorm computes
its variance in float32, so two evaluation orders of the same function agree to about that level
(finite differences on the plain base model disagree with autograd by as much).
"""

from __future__ import annotations

import pytest
import torch
from conftest import random_ids, tiny_model


def _grads(model, ids, **call) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    logits = model(ids, **call).logits  # float64 loss here: transformers' loss upcasts only to float32
    torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:]).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _reference_jacobi_loss(model, ids, d_forward: int, d_backward: int) -> torch.Tensor:
    """Algorithm 1 written out by hand (no padding, one document): `.detach()` where the model uses
    no_grad, and a plain ShiftRight."""
    base = model.model
    positions = torch.arange(ids.shape[1])[None]
    hidden = base.embed_tokens(ids)
    rotary = base.rotary_emb(hidden, positions)

    def run(h, indices):
        for i in indices:
            h = model.model.layers[i](h, attention_mask=None, position_ids=positions, position_embeddings=rotary)
        return h

    low = run(hidden, range(model.config.l_start - 1))
    middle = range(model.config.l_start - 1, model.config.l_end)

    def shift(x):
        return torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)

    r = torch.zeros_like(low)
    for k in range(1, d_forward + 1):
        h_end = run(low if k == 1 else model.fusion(low, r), middle)
        r = shift(model.model.cache_norm(h_end + r))
        if k <= d_forward - d_backward:
            r = r.detach()
    top = run(model.fusion(low, r), range(model.config.l_start - 1, model.config.num_layers))
    logits = model.lm_head(base.norm(top))
    return torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])


@pytest.mark.parametrize("d_forward,d_backward", [(4, 4), (4, 2), (5, 1)])
def test_gradients_match_hand_written_algorithm(d_forward: int, d_backward: int) -> None:
    model = tiny_model().train()
    ids = random_ids(1, 9)
    got = _grads(model, ids, recurrence="jacobi", d_forward=d_forward, d_backward=d_backward)
    model.zero_grad(set_to_none=True)
    _reference_jacobi_loss(model, ids, d_forward, d_backward).backward()
    for name, param in model.named_parameters():
        assert torch.allclose(got[name], param.grad, atol=1e-7, rtol=1e-6), name


def test_full_backward_at_full_depth_equals_exact_bptt() -> None:
    """With d_forward >= T the Jacobi output equals the exact output for every parameter value, so full
    backpropagation through the iterations must give the exact path's (full BPTT) gradient."""
    model = tiny_model().train()
    ids = random_ids(1, 7)
    exact = _grads(model, ids, recurrence="exact")
    jacobi = _grads(model, ids, recurrence="jacobi", d_forward=8, d_backward=8)
    truncated = _grads(model, ids, recurrence="jacobi", d_forward=8, d_backward=2)
    for name in exact:
        assert torch.allclose(jacobi[name], exact[name], atol=1e-7, rtol=1e-6), name
    gap = max((truncated[n] - exact[n]).abs().max().item() for n in exact)
    assert gap > 1e-3  # truncation really cuts the gradient, far beyond the tolerance above


def _saved_tensor_count(model, ids, **call) -> int:
    count = 0

    def pack(tensor):
        nonlocal count
        count += 1
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids, labels=ids, **call).loss.backward()
    return count


def test_detached_iterations_store_no_graph() -> None:
    model = tiny_model().train()
    ids = random_ids(1, 8)
    shallow = _saved_tensor_count(model, ids, recurrence="jacobi", d_forward=2, d_backward=1)
    deep = _saved_tensor_count(model, ids, recurrence="jacobi", d_forward=7, d_backward=1)
    more_grad = _saved_tensor_count(model, ids, recurrence="jacobi", d_forward=7, d_backward=3)
    assert deep == shallow  # five more detached iterations, not one more saved tensor
    assert more_grad > deep


class _CallCounter:
    def __init__(self, model) -> None:
        self.counts: dict[str, int] = {}
        modules = {f"layer{i}": layer for i, layer in enumerate(model.model.layers)}
        modules["lm_head"] = model.lm_head
        modules["fusion"] = model.fusion
        self.handles = [m.register_forward_hook(self._hook(name)) for name, m in modules.items()]

    def _hook(self, name):
        def hook(*_):
            self.counts[name] = self.counts.get(name, 0) + 1

        return hook


@pytest.mark.parametrize("d_forward", [1, 4, 16])
def test_jacobi_cost_in_block_calls(d_forward: int) -> None:
    model = tiny_model(l_start=2, l_end=3)  # 5 blocks: 1 below, 2 middle, 2 above
    counter = _CallCounter(model)
    with torch.no_grad():
        model(random_ids(2, 10), recurrence="jacobi", d_forward=d_forward, d_backward=1)
    assert counter.counts["layer0"] == 1
    assert counter.counts["layer1"] == counter.counts["layer2"] == d_forward + 1
    assert counter.counts["layer3"] == counter.counts["layer4"] == 1
    assert counter.counts["lm_head"] == 1
    assert counter.counts["fusion"] == d_forward  # every pass but the unfused seed


def test_exact_cost_in_block_calls() -> None:
    model = tiny_model(l_start=2, l_end=3)
    counter = _CallCounter(model)
    with torch.no_grad():
        model(random_ids(2, 10), recurrence="exact")
    assert counter.counts["layer0"] == 1 and counter.counts["layer4"] == 1  # parallel over the sequence
    assert counter.counts["layer1"] == counter.counts["layer2"] == 10  # one call per token


def test_early_stop_at_zero_tolerance_equals_fixed_depth() -> None:
    model = tiny_model().train()
    ids = random_ids(1, 12)
    fixed = _grads(model, ids, recurrence="jacobi", d_forward=6, d_backward=2)
    model.zero_grad(set_to_none=True)
    out = model(ids, recurrence="jacobi", d_forward=6, d_backward=2, jacobi_tol=0.0)
    assert out.jacobi_iterations == 6
    torch.nn.functional.cross_entropy(out.logits[0, :-1], ids[0, 1:]).backward()
    for name, param in model.named_parameters():
        assert torch.equal(param.grad, fixed[name]), name


def test_early_stop_skips_iterations_once_the_cache_converged() -> None:
    model = tiny_model()
    ids = random_ids(2, 5)  # converges after 5 iterations
    with torch.no_grad():
        full = model(ids, recurrence="jacobi", d_forward=16, d_backward=2)
        early = model(ids, recurrence="jacobi", d_forward=16, d_backward=2, jacobi_tol=1e-12)
    assert early.jacobi_iterations < 16
    assert full.jacobi_iterations == 16
    assert (early.logits - full.logits).abs().max() <= 1e-9


def test_middle_checkpointing_keeps_gradients() -> None:
    model = tiny_model().train()
    ids = random_ids(1, 8)
    call = dict(recurrence="jacobi", d_forward=4, d_backward=2)
    plain = _grads(model, ids, **call)
    model.model.set_middle_checkpointing(True)
    checkpointed = _grads(model, ids, **call)
    for name in plain:
        assert torch.allclose(plain[name], checkpointed[name], atol=1e-12, rtol=1e-10), name
