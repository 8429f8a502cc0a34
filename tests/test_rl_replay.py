"""Replay as the RL update uses it: the states generate() returns, fed back to the Jacobi path, give the exact
forward on every sequence (left-padded prompts, sampled rows that stop early at the end-of-text token), at
any depth, and with d_forward = d_backward ≥ T the exact path's untruncated gradient."""

from __future__ import annotations

import pytest
import torch
from conftest import left_padded, random_ids, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
EOS = 2


def sampled_rollout(model):
    prompt, mask = left_padded([random_ids(1, 4, seed=5)[0], random_ids(1, 7, seed=6)[0]])
    torch.manual_seed(11)
    out = model.generate(prompt, attention_mask=mask, do_sample=True, top_k=0, max_new_tokens=6,
                         num_return_sequences=3, pad_token_id=0, eos_token_id=EOS, sequence_bias={(EOS,): 3.0},  # some rows stop early
                         return_dict_in_generate=True,
                         output_recurrent_states=True)
    generated = out.sequences.shape[1] - prompt.shape[1]
    full_mask = torch.cat([mask.repeat_interleave(3, 0), torch.ones(6, generated, dtype=mask.dtype)], dim=1)
    return out, full_mask


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_replay_from_generated_states_is_the_exact_forward(depth: int) -> None:
    model = tiny_model(dtype=torch.float64)
    out, full_mask = sampled_rollout(model)
    stopped_early = (out.sequences[:, -1] == 0).any()
    with torch.no_grad():
        exact = model(out.sequences, attention_mask=full_mask, recurrence="exact").logits
        replay = model(out.sequences, attention_mask=full_mask, recurrence="jacobi", initial_states=out.recurrent_states,
                       d_forward=depth, d_backward=depth).logits
        seeded = model(out.sequences, attention_mask=full_mask, recurrence="jacobi", d_forward=depth, d_backward=depth).logits
    real = full_mask.bool()
    assert bool(stopped_early)
    assert (replay - exact)[real].abs().max() <= 1e-9
    assert (seeded - exact)[real].abs().max() > 1e-6  # the same depth from the seed pass is not exact


def test_full_window_replay_gradient_is_the_untruncated_exact_gradient() -> None:
    model = tiny_model(dtype=torch.float64)
    out, full_mask = sampled_rollout(model)
    ids, length = out.sequences, out.sequences.shape[1]
    weights = torch.linspace(-1, 1, model.config.vocab_size, dtype=torch.float64)

    def gradients(**path):
        model.zero_grad(set_to_none=True)
        logits = model(ids, attention_mask=full_mask, **path).logits
        (logits * weights * full_mask[..., None]).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    exact = gradients(recurrence="exact")
    replay = gradients(recurrence="jacobi", initial_states=out.recurrent_states, d_forward=length, d_backward=length)
    short = gradients(recurrence="jacobi", initial_states=out.recurrent_states, d_forward=1, d_backward=1)
    # transformers' RMSNorm takes its variance in float32: float64 gradients in two orders agree to ~1e-6
    for name in exact:
        torch.testing.assert_close(replay[name], exact[name], rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    assert (short["model.fusion.w_rec.weight"] - exact["model.fusion.w_rec.weight"]).abs().max() > 1e-3  # truncation bites
