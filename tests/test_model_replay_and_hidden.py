"""Starting the Jacobi path from given states (replay), exact-path training with truncated
backpropagation through time, and the hidden states of every block."""

from __future__ import annotations

import pytest
import torch
from conftest import exact_states, random_ids, tiny_model

from t2mlr import T2MLRCache

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ----------------------------------------------------------------------------- replay
@pytest.mark.parametrize("d_forward", [1, 2, 5])
def test_jacobi_from_exact_states_is_the_exact_forward(d_forward: int) -> None:
    model = tiny_model()
    ids = random_ids(2, 9)
    states = exact_states(model, ids)
    with torch.no_grad():
        exact = model(ids, recurrence="exact").logits
        replay = model(ids, recurrence="jacobi", initial_states=states, d_forward=d_forward, d_backward=1)
        shallow = model(ids, recurrence="jacobi", d_forward=d_forward, d_backward=1).logits
    assert (replay.logits - exact).abs().max() <= 1e-9
    assert replay.jacobi_iterations == d_forward
    assert (shallow - exact).abs().max() > 1e-6  # without the states, a shallow Jacobi is an approximation


def test_replay_starts_from_the_given_states_not_a_seed() -> None:
    model = tiny_model()
    ids = random_ids(2, 9)
    wrong = torch.randn(2, 9, model.config.hidden_size, dtype=torch.float64)
    with torch.no_grad():
        exact = model(ids, recurrence="exact").logits
        from_wrong = model(ids, recurrence="jacobi", initial_states=wrong, d_forward=1, d_backward=1).logits
    assert (from_wrong - exact).abs().max() > 1e-3


def test_initial_states_are_checked() -> None:
    model = tiny_model()
    ids = random_ids(2, 5)
    with pytest.raises(ValueError, match="recurrence='jacobi'"):
        model(ids, recurrence="exact", initial_states=torch.zeros(2, 5, model.config.hidden_size))
    with pytest.raises(ValueError, match=r"shape \(2, 5, 32\)"):
        model(ids, recurrence="jacobi", initial_states=torch.zeros(2, 4, model.config.hidden_size))


# ----------------------------------------------------------------------------- truncated BPTT on the exact path
# transformers' RMSNorm computes its variance in float32, so two float64 computations of the same gradient
# in a different order agree to about 1e-7 relative; a truncation that bites changes them by far more.
GRAD_RTOL, GRAD_ATOL = 1e-5, 1e-5


def parameter_gradients(model, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def weighted_logit_loss(logits: torch.Tensor) -> torch.Tensor:
    weights = torch.linspace(-1.0, 1.0, logits.numel(), dtype=logits.dtype).reshape(logits.shape)
    return (logits * weights).sum()


def test_a_window_covering_the_sequence_gives_the_untruncated_exact_gradients() -> None:
    model = tiny_model().train()
    ids = random_ids(2, 7)
    full = parameter_gradients(model, weighted_logit_loss(model(ids, recurrence="exact").logits))
    windowed = parameter_gradients(model, weighted_logit_loss(model(ids, recurrence="exact", bptt_window=7).logits))
    assert full.keys() == windowed.keys()
    for name in full:
        torch.testing.assert_close(windowed[name], full[name], rtol=GRAD_RTOL, atol=GRAD_ATOL, msg=name)


def hand_window_one_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """Window 1, written out token by token on growing prefixes: the state a token reads is computed with
    gradients from its predecessor's middle-block output, on top of the detached exact state before it;
    nothing reaches further back through R."""
    layers, l0, l1 = model.model.layers, model.config.l_start - 1, model.config.l_end
    zero = torch.zeros(1, model.config.hidden_size, dtype=torch.float64)
    exact = exact_states(model, ids)[0]  # (T, d), detached
    exact_read = [zero[0]] + [exact[t - 1] for t in range(1, ids.shape[1])]

    def below(prefix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple]:
        positions = torch.arange(prefix.shape[1])[None]
        hidden = model.model.embed_tokens(prefix)
        rotary = model.model.rotary_emb(hidden, positions)
        for i in range(l0):
            hidden = layers[i](hidden, attention_mask=None, position_ids=positions, position_embeddings=rotary)
        return hidden, positions, rotary

    def run(hidden: torch.Tensor, positions, rotary, indices: range) -> torch.Tensor:
        for i in indices:
            hidden = layers[i](hidden, attention_mask=None, position_ids=positions, position_embeddings=rotary)
        return hidden

    one_step_states = []  # R written by token t with one step of gradient
    for t in range(ids.shape[1]):
        hidden, positions, rotary = below(ids[:, : t + 1])
        fused = torch.stack([model.fusion(hidden[:, j], exact_read[j][None]) for j in range(t + 1)], dim=1)
        middle = run(fused, positions, rotary, range(l0, l1))
        one_step_states.append(model.model.cache_norm(middle[:, t] + exact_read[t][None]))
    reads = [zero] + one_step_states[:-1]
    logits = []
    for t in range(ids.shape[1]):
        hidden, positions, rotary = below(ids[:, : t + 1])
        fused = torch.stack([model.fusion(hidden[:, j], reads[j]) for j in range(t + 1)], dim=1)
        out = run(run(fused, positions, rotary, range(l0, l1)), positions, rotary, range(l1, len(layers)))
        logits.append(model.lm_head(model.model.norm(out[:, t])))
    return torch.stack(logits, dim=1)


def test_window_one_equals_the_hand_written_one_step_reference() -> None:
    model = tiny_model().train()
    ids = random_ids(1, 6)
    windowed_logits = model(ids, recurrence="exact", bptt_window=1).logits
    reference_logits = hand_window_one_logits(model, ids)
    torch.testing.assert_close(windowed_logits, reference_logits, rtol=0, atol=1e-10)
    windowed = parameter_gradients(model, weighted_logit_loss(windowed_logits))
    reference = parameter_gradients(model, weighted_logit_loss(reference_logits))
    full = parameter_gradients(model, weighted_logit_loss(model(ids, recurrence="exact").logits))
    for name in reference:
        torch.testing.assert_close(windowed[name], reference[name], rtol=GRAD_RTOL, atol=GRAD_ATOL, msg=name)
    assert (windowed["model.fusion.w_rec.weight"] - full["model.fusion.w_rec.weight"]).abs().max() > 1e-2  # truncation bites


def test_the_window_is_a_config_field_and_the_path_says_so() -> None:
    model = tiny_model(bptt_window=3, train_recurrence="exact").train()
    assert model.forward_path().describe() == "exact (bptt_window=3)"
    with pytest.raises(ValueError, match="bptt_window must be >= 1"):
        tiny_model(bptt_window=0)


# ----------------------------------------------------------------------------- hidden states
@pytest.mark.parametrize("path", ["exact", "jacobi", "off"])
def test_hidden_states_follow_the_base_models_convention(path: str) -> None:
    closed = tiny_model(gates=False)
    ids = random_ids(2, 6)
    with torch.no_grad():
        base = closed.base_decoder()(ids, output_hidden_states=True).hidden_states
        ours = closed(ids, recurrence=path, d_forward=3, d_backward=1, output_hidden_states=True).hidden_states
    assert len(ours) == len(base) == closed.config.num_layers + 1
    for index, (got, expected) in enumerate(zip(ours, base)):
        assert got.shape == expected.shape
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-10, msg=f"entry {index}")


def test_hidden_states_of_the_recurrent_paths_agree_at_the_fixed_point() -> None:
    model = tiny_model()
    ids = random_ids(2, 6)
    with torch.no_grad():
        exact = model(ids, recurrence="exact", output_hidden_states=True).hidden_states
        jacobi = model(ids, recurrence="jacobi", d_forward=7, d_backward=1, output_hidden_states=True).hidden_states
        plain = model(ids, recurrence="exact").hidden_states
    assert plain is None
    for got, expected in zip(jacobi, exact):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-9)


# ----------------------------------------------------------------------------- states from generate()
GENERATIONS = {
    "greedy": dict(do_sample=False),
    "sampling": dict(do_sample=True, top_k=0, num_return_sequences=2),
    "beams": dict(do_sample=False, num_beams=3, num_return_sequences=2),
    "prompt lookup": dict(do_sample=False, prompt_lookup_num_tokens=2),
    "jacobi prefill": dict(do_sample=False, prefill="jacobi", prefill_depth=2),
    "static greedy": dict(do_sample=False, cache_implementation="static"),
    "static sampling": dict(do_sample=True, top_k=0, num_return_sequences=2, cache_implementation="static"),
    "static beams": dict(do_sample=False, num_beams=3, num_return_sequences=2, cache_implementation="static"),
}


@pytest.mark.parametrize("name", list(GENERATIONS))
def test_generate_returns_the_exact_states_of_the_returned_sequences(name: str) -> None:
    model = tiny_model(dtype=torch.float64)
    prompt = random_ids(2, 6)
    mask = torch.ones_like(prompt)
    prompt[0, :2], mask[0, :2] = 0, 0  # the first row is left-padded
    if name == "prompt lookup":
        prompt, mask = prompt[1:], mask[1:]  # assisted decoding takes one row
    torch.manual_seed(3)
    out = model.generate(prompt, attention_mask=mask, max_new_tokens=5, pad_token_id=0, return_dict_in_generate=True,
                         output_recurrent_states=True, **GENERATIONS[name])
    rows, length = out.sequences.shape
    assert out.recurrent_states.shape == (rows, length, model.config.hidden_size)
    expand = rows // prompt.shape[0]
    full_mask = torch.cat([mask.repeat_interleave(expand, 0), torch.ones(rows, length - prompt.shape[1], dtype=mask.dtype)], 1)
    torch.testing.assert_close(out.recurrent_states, exact_states(model, out.sequences, attention_mask=full_mask),
                               rtol=0, atol=1e-9)


@pytest.mark.parametrize("cache_implementation", [None, "static"])
def test_greedy_states_are_read_from_the_decoding_cache(cache_implementation: str | None, monkeypatch) -> None:
    """After an exact prefill, the states come from the cache the decoding filled: no second cache is built. A
    static cache has room for the last token's step when decoding stops early (here at an EOS)."""
    model = tiny_model(dtype=torch.float64)
    prompt = random_ids(1, 6)
    first = model.generate(prompt, max_new_tokens=1, do_sample=False)[0, -1].item()
    built = []
    original = T2MLRCache.__init__
    monkeypatch.setattr(T2MLRCache, "__init__", lambda self, *a, **k: built.append(1) or original(self, *a, **k))
    out = model.generate(prompt, max_new_tokens=4, do_sample=False, eos_token_id=first, return_dict_in_generate=True,
                         output_recurrent_states=True, cache_implementation=cache_implementation)
    assert out.sequences.shape[1] == 7  # stopped at the EOS
    assert len(built) == (1 if cache_implementation is None else 0)  # the decoding's own growing cache only
    torch.testing.assert_close(out.recurrent_states, exact_states(model, out.sequences), rtol=0, atol=1e-9)


def test_generate_states_need_the_dict_output() -> None:
    model = tiny_model()
    with pytest.raises(ValueError, match="return_dict_in_generate=True"):
        model.generate(random_ids(1, 3), max_new_tokens=2, output_recurrent_states=True)
