"""The three forward paths against each other and against the base model (docs/semantics.md §5)."""

from __future__ import annotations

import pytest
import torch
from conftest import random_ids, tiny_model
from rounding import forward_tolerance

FAMILIES = ["llama", "qwen2", "mistral"]
PATHS = ["exact", "jacobi", "off"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("path", PATHS)
def test_fresh_model_equals_base_model(family: str, path: str) -> None:
    model = tiny_model(family, gates=False)
    ids = random_ids(2, 12)
    with torch.no_grad():
        expected = model.base_decoder()(ids).logits
        got = model(ids, recurrence=path, d_forward=3, d_backward=1).logits
    assert torch.allclose(got, expected, atol=1e-10, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_jacobi_reaches_exact_at_full_depth(family: str) -> None:
    model = tiny_model(family)
    ids = random_ids(2, 11)
    with torch.no_grad():
        exact = model(ids, recurrence="exact").logits
        jacobi = model(ids, recurrence="jacobi", d_forward=12, d_backward=1).logits
        shallow = model(ids, recurrence="jacobi", d_forward=3, d_backward=1).logits
    assert (jacobi - exact).abs().max() <= 1e-9
    assert (shallow - exact).abs().max() > 1e-3  # a shallow iteration is an approximation


def test_position_t_is_exact_once_depth_reaches_t(model64) -> None:
    ids = random_ids(2, 9)
    with torch.no_grad():
        exact = model64(ids, recurrence="exact").logits
        for depth in (1, 3, 6):
            error = (model64(ids, recurrence="jacobi", d_forward=depth, d_backward=1).logits - exact).abs()
            per_position = error.amax(dim=(0, 2))  # position index p = t - 1 (t is 1-based)
            assert per_position[:depth].max() <= 1e-9, depth
            assert per_position[depth:].min() > 1e-6, depth


def test_exact_path_matches_a_hand_rolled_token_loop(model64) -> None:
    """Independent reference: the full base forward on growing prefixes, R carried by hand."""
    ids = random_ids(1, 6)
    model = model64
    layers, l0, l1 = model.model.layers, model.config.l_start - 1, model.config.l_end
    with torch.no_grad():
        state = torch.zeros(1, model.config.hidden_size, dtype=torch.float64)
        fused_inputs = []
        for t in range(ids.shape[1]):
            prefix = ids[:, : t + 1]
            hidden = model.model.embed_tokens(prefix)
            positions = torch.arange(t + 1)[None]
            rotary = model.model.rotary_emb(hidden, positions)
            for i in range(l0):
                hidden = layers[i](hidden, attention_mask=None, position_ids=positions, position_embeddings=rotary)
            fused_inputs.append(model.fusion(hidden[:, t], state))
            hidden = torch.cat([torch.stack(fused_inputs, dim=1)], dim=1)
            for i in range(l0, l1):
                hidden = layers[i](hidden, attention_mask=None, position_ids=positions, position_embeddings=rotary)
            state = model.model.cache_norm(hidden[:, t] + state)
            for i in range(l1, len(layers)):
                hidden = layers[i](hidden, attention_mask=None, position_ids=positions, position_embeddings=rotary)
        reference = model.lm_head(model.model.norm(hidden))
        got = model(ids, recurrence="exact")
    assert torch.allclose(got.logits, reference, atol=1e-10, rtol=0)
    assert torch.allclose(got.recurrent_state, state, atol=1e-10, rtol=0)


def test_no_cache_residual_uses_raw_hidden_state() -> None:
    model = tiny_model(cache_residual=False)
    assert model.model.cache_norm is None
    ids = random_ids(2, 8)
    with torch.no_grad():
        exact = model(ids, recurrence="exact").logits
        jacobi = model(ids, recurrence="jacobi", d_forward=9, d_backward=1).logits
    assert (jacobi - exact).abs().max() <= 1e-9


@pytest.mark.parametrize("l_start,l_end", [(1, 5), (3, 3), (1, 1), (5, 5)])
def test_placements_including_full_and_single_block(l_start: int, l_end: int) -> None:
    model = tiny_model(l_start=l_start, l_end=l_end)
    ids = random_ids(2, 7)
    with torch.no_grad():
        exact = model(ids, recurrence="exact").logits
        jacobi = model(ids, recurrence="jacobi", d_forward=8, d_backward=1).logits
    assert (jacobi - exact).abs().max() <= 1e-9


def test_float32_jacobi_matches_exact_to_float32_rounding() -> None:
    """The parallel iterates and the token loop are two float32 computations: `rounding.MARGIN` times float32's
    own gap to float64 on the exact path apart at most (a shallow depth is 1e-3 or more off, above)."""
    model = tiny_model(dtype=torch.float32)
    ids = random_ids(3, 16)
    with torch.no_grad():
        exact = model(ids, recurrence="exact").logits
        jacobi = model(ids, recurrence="jacobi", d_forward=17, d_backward=1).logits
    assert (jacobi - exact).abs().max() <= forward_tolerance(model, ids, recurrence="exact")


def test_default_path_follows_train_and_eval_mode() -> None:
    model = tiny_model(train_recurrence="jacobi", eval_recurrence="exact", d_forward=2, d_backward=1)
    ids = random_ids(1, 8)
    with torch.no_grad():
        model.eval()
        assert model(ids).jacobi_iterations is None
        model.train()
        assert model(ids).jacobi_iterations == 2
    assert model.forward_path().recurrence == "jacobi"


def test_bfloat16_cast_keeps_gates_in_float32() -> None:
    model = tiny_model(dtype=torch.bfloat16)
    assert model.fusion.gamma_cur.dtype == torch.float32
    assert model.fusion.gamma_rec.dtype == torch.float32
    assert model.fusion.f_cur.weight.dtype == torch.bfloat16
    with torch.no_grad():
        out = model(random_ids(1, 5), recurrence="jacobi", d_forward=2, d_backward=1)
    assert out.logits.dtype == torch.bfloat16 and torch.isfinite(out.logits).all()


def test_extra_parameter_count_is_5d2_plus_3d_plus_2() -> None:
    model = tiny_model(gates=False)
    d = model.config.hidden_size
    base = sum(p.numel() for p in model.base_decoder().parameters())
    total = sum(p.numel() for p in model.parameters())
    assert total - base == 5 * d * d + 2 * d + 2 + d
