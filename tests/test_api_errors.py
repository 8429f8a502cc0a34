"""Bad input to the Python API is a `ValueError` that names the argument and what is allowed, raised by
t2mlr before it reaches transformers or torch (where it would surface as someone else's exception);
and `model.double()` makes a model float64 end to end, its logits matching a hand-written float64
T²MLR to 1e-10.
"""

from __future__ import annotations

import re

import pytest
import torch
from conftest import VOCAB, open_gates, random_ids, tiny_base_config, tiny_model
from rounding import float32_tolerance

from t2mlr import T2MLRConfig, T2MLRForCausalLM
from t2mlr.model import T2MLRCache

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---------------------------------------------------------------------------------------------- config


def test_a_config_without_a_base_config_cannot_build_a_model() -> None:
    with pytest.raises(ValueError, match=r"no base_config; build it with T2MLRConfig.from_base"):
        T2MLRForCausalLM(T2MLRConfig())


@pytest.mark.parametrize("name", ["d_forward", "d_backward"])
def test_a_fractional_depth_in_the_config_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match=rf"{name} must be an int, got 2.5"):
        T2MLRConfig.from_base(tiny_base_config(), l_start=2, l_end=4, **{name: 2.5})
    with pytest.raises(ValueError, match=rf"{name} must be an int, got 2.5"):
        T2MLRConfig(base_config=tiny_base_config(), l_start=2, l_end=4, **{name: 2.5})


# ---------------------------------------------------------------------------------------------- forward


@pytest.fixture(scope="module")
def model() -> T2MLRForCausalLM:
    return tiny_model()


@pytest.mark.parametrize("shape", [(0, 5), (2, 0)])
def test_an_empty_batch_is_refused(model, shape) -> None:
    expected = re.escape(f"input_ids must have shape (batch, seq) with batch, seq >= 1, got {shape}")
    with pytest.raises(ValueError, match=expected):
        model(torch.zeros(shape, dtype=torch.long))
    with pytest.raises(ValueError, match=r"inputs_embeds must have shape \(batch, seq, 32\) with batch, seq >= 1"):
        model(inputs_embeds=torch.zeros(*shape, 32, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool])
def test_input_ids_must_be_integers(model, dtype) -> None:
    with pytest.raises(ValueError, match=rf"input_ids must be an integer tensor of token ids, got dtype {dtype}"):
        model(random_ids(2, 5).to(dtype))


@pytest.mark.parametrize("name", ["d_forward", "d_backward"])
def test_a_fractional_depth_per_call_is_refused(model, name) -> None:
    with pytest.raises(ValueError, match=rf"{name} must be an int, got 2.5"):
        model(random_ids(2, 5), recurrence="jacobi", **{name: 2.5})


def test_a_fractional_prefill_depth_is_refused(model) -> None:
    with pytest.raises(ValueError, match=r"d_forward must be an int, got 2.5"):
        model.generate(random_ids(2, 5), max_new_tokens=2, prefill="jacobi", prefill_depth=2.5,
                       do_sample=False, pad_token_id=0)


@pytest.mark.parametrize("bad", [VOCAB, VOCAB + 7, -1, -5, -99, -101])
def test_labels_outside_the_vocabulary_are_refused(model, bad) -> None:
    labels = random_ids(2, 5, seed=3)
    labels[1, 2] = bad
    with pytest.raises(ValueError, match=rf"labels must lie in \[0, {VOCAB}\) or be -100 \(ignored\)"):
        model(random_ids(2, 5), labels=labels)


def test_ignored_labels_are_accepted_and_left_out_of_the_loss(model) -> None:
    ids, labels = random_ids(2, 5), random_ids(2, 5, seed=3)
    partly_ignored = labels.clone()
    partly_ignored[:, 3:] = -100
    with torch.no_grad():
        logits = model(ids).logits
        loss = model(ids, labels=partly_ignored).loss
    scored = torch.nn.functional.cross_entropy(logits[:, :2].reshape(-1, VOCAB), labels[:, 1:3].reshape(-1))
    # transformers' causal-LM loss computes in float32 whatever the logits' dtype: float32 rounding apart
    tolerance = float32_tolerance(lambda dtype: torch.nn.functional.cross_entropy(
        logits[:, :2].reshape(-1, VOCAB).to(dtype), labels[:, 1:3].reshape(-1)))
    torch.testing.assert_close(loss.double(), scored, rtol=0, atol=tolerance)


@pytest.mark.parametrize("bad", [VOCAB, -1])
def test_token_ids_outside_the_vocabulary_are_refused(model, bad) -> None:
    ids = random_ids(2, 5)
    ids[0, 1] = bad
    with pytest.raises(ValueError, match=rf"token ids must lie in \[0, {VOCAB}\)"):
        model(ids)


def test_a_new_document_inside_a_chunk_that_continues_a_cache_is_refused(model) -> None:
    ids = random_ids(2, 6)
    cache = T2MLRCache(config=model.config)
    with torch.no_grad():
        model(ids[:, :3], past_key_values=cache)
        with pytest.raises(ValueError, match=r"a new document \(position 0\) cannot start inside a chunk that continues"):
            model(ids[:, 3:], past_key_values=cache, position_ids=torch.tensor([[3, 0, 1], [3, 4, 5]]))
        model(ids[:, 3:], past_key_values=cache, position_ids=torch.tensor([[3, 4, 5], [3, 4, 5]]))  # continuing: fine


# ---------------------------------------------------------------------------------------------- float64


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _phi(model: T2MLRForCausalLM, h: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Φ(h, r) written out from its definition, reading the fusion's weights."""
    fusion = model.fusion
    hr = torch.cat([h, r], dim=-1)
    gate_cur = torch.sigmoid(hr @ fusion.f_cur.weight.T + fusion.f_cur.bias)
    gate_rec = torch.sigmoid(hr @ fusion.f_rec.weight.T + fusion.f_rec.bias)
    return h + torch.tanh(fusion.gamma_cur) * gate_cur * h + torch.tanh(fusion.gamma_rec) * gate_rec * (r @ fusion.w_rec.weight.T)


def _reference_logits(model: T2MLRForCausalLM, ids: torch.Tensor) -> torch.Tensor:
    """T²MLR by its definition, without caches: token t's middle-block input is Φ(h_t, R_{t-1}) and the
    middle block is rerun causally over the fused inputs of tokens 0..t (O(T²), fine for 6 tokens)."""
    decoder, config = model.model, model.config
    length = ids.shape[1]
    positions = torch.arange(length)[None]
    hidden = decoder.embed_tokens(ids)
    cos, sin = decoder.rotary_emb(hidden, position_ids=positions)

    def blocks(indices: range, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]  # no mask: the decoder's attention is causal by itself
        for i in indices:
            x = decoder.layers[i](x, attention_mask=None, position_ids=positions[:, :n],
                                  position_embeddings=(cos[:, :n], sin[:, :n]))
        return x

    low = blocks(range(config.l_start - 1), hidden)
    r = torch.zeros_like(low[:, 0])
    fused, outputs = [], []
    for t in range(length):
        fused.append(_phi(model, low[:, t], r))
        out = blocks(range(config.l_start - 1, config.l_end), torch.stack(fused, dim=1))[:, -1]
        r = _rms_norm(out + r, model.model.cache_norm.weight, model.model.cache_norm.eps)
        outputs.append(out)
    top = blocks(range(config.l_end, config.num_layers), torch.stack(outputs, dim=1))
    return model.lm_head(decoder.norm(top))


def _float64_model() -> T2MLRForCausalLM:
    torch.manual_seed(0)
    config = T2MLRConfig.from_base(tiny_base_config(), l_start=2, l_end=4)
    return open_gates(T2MLRForCausalLM(config).eval().double())


def test_double_makes_every_parameter_float64_including_the_gates() -> None:
    model = _float64_model()
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    assert model.fusion.gamma_cur.dtype == model.fusion.gamma_rec.dtype == torch.float64
    low = T2MLRForCausalLM(T2MLRConfig.from_base(tiny_base_config(), l_start=2, l_end=4)).to(torch.bfloat16)
    assert low.fusion.gamma_cur.dtype == low.fusion.gamma_rec.dtype == torch.float32  # only 16-bit casts keep them wider
    assert low.model.embed_tokens.weight.dtype == torch.bfloat16


def test_float64_logits_match_a_hand_written_float64_t2mlr() -> None:
    model = _float64_model()
    ids = random_ids(2, 6)
    with torch.no_grad():
        closed = _float64_model()
        closed.fusion.gamma_cur.zero_()
        closed.fusion.gamma_rec.zero_()
        # the reference's plumbing (blocks, rotary, causal attention) reproduces the base model itself
        torch.testing.assert_close(_reference_logits(closed, ids), closed.base_decoder()(ids).logits, rtol=0, atol=1e-12)
        reference = _reference_logits(model, ids)
        exact = model(ids, recurrence="exact").logits
        jacobi = model(ids, recurrence="jacobi", d_forward=ids.shape[1] + 1, d_backward=1).logits
    assert exact.dtype == jacobi.dtype == torch.float64
    assert (reference - model.base_decoder()(ids).logits).abs().max() > 1e-2  # the open gates matter
    torch.testing.assert_close(exact, reference, rtol=0, atol=1e-10)
    torch.testing.assert_close(jacobi, reference, rtol=0, atol=1e-10)
