"""transformers' own switches never make T²MLR compute something else silently: gradient checkpointing
(`gradient_checkpointing_enable()`, which TRL turns on) leaves every training path's loss and gradients as
they are, padded batches included, and `generate()` decodes the config's evaluation path (exact) whether
the model is in train or eval mode."""

from __future__ import annotations

import pytest
import torch
from conftest import random_ids, tiny_model

PATHS = [
    {"recurrence": "exact"},
    {"recurrence": "exact", "bptt_window": 2},
    {"recurrence": "jacobi", "d_forward": 4, "d_backward": 2},
]


def _loss_and_grads(model, ids, mask, path, document_ids=None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    labels = ids.masked_fill(mask == 0, -100)
    loss = model(ids, attention_mask=mask, labels=labels, document_ids=document_ids, **path).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _batch(kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Ids, attention mask and document ids of a padded (left and right) or a packed (two documents) batch."""
    ids = random_ids(3, 9)
    mask = torch.ones_like(ids)
    if kind == "padded":
        mask[0, :3] = 0  # left padding
        mask[2, -2:] = 0  # right padding
        return ids, mask, None
    return ids, mask, torch.tensor([[0] * 4 + [1] * 5] * 3)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("kind", ["padded", "packed"])
@pytest.mark.parametrize("path", PATHS, ids=["exact", "exact-bptt2", "jacobi-4-2"])
def test_gradient_checkpointing_changes_neither_loss_nor_gradients(path: dict, kind: str, reentrant: bool) -> None:
    """On every transformers version of the supported range: 5.23 moved its checkpointing wrapper from the
    layer's `__call__` to its `forward`, where it dropped the exact path's KV cache (`call_block`)."""
    model = tiny_model(l_start=2, l_end=4).train()
    ids, mask, documents = _batch(kind)
    loss, grads = _loss_and_grads(model, ids, mask, path, documents)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    assert all(layer.gradient_checkpointing for layer in model.model.layers)
    if reentrant and "bptt_window" in path:  # the replay's backward calls torch.autograd.grad: refused, with the fix
        with pytest.raises(ValueError, match="use_reentrant"):
            _loss_and_grads(model, ids, mask, path, documents)
        return
    checkpointed_loss, checkpointed = _loss_and_grads(model, ids, mask, path, documents)
    torch.testing.assert_close(checkpointed_loss, loss, rtol=0, atol=1e-12)
    assert checkpointed.keys() == grads.keys() and "model.fusion.w_rec.weight" in grads
    for name, grad in grads.items():
        torch.testing.assert_close(checkpointed[name], grad, rtol=0, atol=1e-10, msg=name)
    assert all(layer.gradient_checkpointing for layer in model.model.layers)  # pausing it for a call restored it


def test_gradient_checkpointing_recomputes_the_blocks_it_may(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a no-op: the prefix, suffix and Jacobi passes (no KV cache) run again in backward."""
    model = tiny_model(l_start=2, l_end=4).train()
    mlp, calls = model.model.layers[0].mlp, []
    forward = mlp.forward
    monkeypatch.setattr(mlp, "forward", lambda *a, **k: calls.append(1) or forward(*a, **k))
    ids = random_ids(2, 6)
    model(ids, labels=ids, recurrence="jacobi", d_forward=2, d_backward=1).loss.backward()
    plain = len(calls)
    model.gradient_checkpointing_enable()
    calls.clear()
    model(ids, labels=ids, recurrence="jacobi", d_forward=2, d_backward=1).loss.backward()
    assert (plain, len(calls)) == (1, 2)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_generate_in_train_mode_decodes_the_exact_path(checkpointing: bool) -> None:
    model = tiny_model(l_start=2, l_end=4, d_forward=2, d_backward=1)  # Jacobi at depth 2 is far from exact
    prompt = random_ids(2, 12)
    settings = {"max_new_tokens": 6, "do_sample": False, "output_scores": True, "return_dict_in_generate": True}
    with torch.no_grad():
        reference = model.eval().generate(prompt, **settings)
        if checkpointing:
            model.gradient_checkpointing_enable()
        in_train = model.train().generate(prompt, **settings)
        jacobi = model.train().generate(prompt, prefill="jacobi", **settings)
    assert torch.equal(in_train.sequences, reference.sequences)
    torch.testing.assert_close(in_train.scores[0], reference.scores[0], rtol=0, atol=1e-10)
    assert (jacobi.scores[0] - reference.scores[0]).abs().max() > 1e-4  # asked for, Jacobi still differs


def test_a_misspelt_argument_is_refused_not_ignored() -> None:
    """Unknown keywords pass (tools add their own, as to LlamaModel), but one spelt like ours is a typo."""
    model = tiny_model()
    ids = random_ids(1, 5)
    with pytest.raises(ValueError, match="did you mean 'recurrence'"):
        model(ids, recurence="exact")
    with pytest.raises(ValueError, match="did you mean 'd_forward'"):
        model.model(ids, d_froward=4)
    with torch.no_grad():  # foreign keywords such as the Trainer's are still accepted
        model(ids, labels=ids, num_items_in_batch=5)
        model.model(ids, logits_to_keep=1)
