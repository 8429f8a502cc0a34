"""Padding, packed documents and the recurrence mask (docs/semantics.md §4)."""

from __future__ import annotations

import pytest
import torch
from conftest import random_ids, tiny_model

CALLS = [
    dict(recurrence="exact"),
    dict(recurrence="jacobi", d_forward=3, d_backward=1),
    dict(recurrence="jacobi", d_forward=12, d_backward=2),
    dict(recurrence="off"),
]


def _pad(rows: list[torch.Tensor], side: str) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        span = slice(width - len(row), width) if side == "left" else slice(0, len(row))
        ids[i, span], mask[i, span] = row, 1
    return ids, mask


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("call", CALLS, ids=lambda c: "-".join(map(str, c.values())))
def test_each_padded_row_equals_the_row_alone(side: str, call: dict) -> None:
    model = tiny_model()
    rows = [random_ids(1, n, seed=n)[0] for n in (9, 4, 6)]
    ids, mask = _pad(rows, side)
    with torch.no_grad():
        batched = model(ids, attention_mask=mask, **call)
        for i, row in enumerate(rows):
            alone = model(row[None], **call)
            span = slice(ids.shape[1] - len(row), None) if side == "left" else slice(0, len(row))
            assert torch.allclose(batched.logits[i, span], alone.logits[0], atol=1e-10, rtol=0)
            if call["recurrence"] != "off":
                assert torch.allclose(batched.recurrent_state[i], alone.recurrent_state[0], atol=1e-10, rtol=0)


@pytest.mark.parametrize("call", CALLS[:3], ids=lambda c: "-".join(map(str, c.values())))
@pytest.mark.parametrize("boundary", ["position_ids", "document_ids"])
def test_packed_documents_equal_documents_run_separately(call: dict, boundary: str) -> None:
    model = tiny_model()
    docs = [random_ids(1, n, seed=10 + n)[0] for n in (5, 3, 7)]
    packed = torch.cat(docs)[None]
    if boundary == "position_ids":
        extra = dict(position_ids=torch.cat([torch.arange(len(d)) for d in docs])[None])
    else:
        extra = dict(document_ids=torch.cat([torch.full((len(d),), i) for i, d in enumerate(docs)])[None])
    with torch.no_grad():
        together = model(packed, **extra, **call).logits[0]
        start = 0
        for doc in docs:
            alone = model(doc[None], **call).logits[0]
            assert torch.allclose(together[start : start + len(doc)], alone, atol=1e-10, rtol=0)
            start += len(doc)


def test_packing_changes_nothing_when_documents_do_not_restart() -> None:
    """Control for the test above: without the restart the second document sees the first."""
    model = tiny_model()
    first, second = random_ids(1, 5, seed=3)[0], random_ids(1, 4, seed=4)[0]
    with torch.no_grad():
        joined = model(torch.cat([first, second])[None], recurrence="exact").logits[0, 5:]
        alone = model(second[None], recurrence="exact").logits[0]
    assert (joined - alone).abs().max() > 1e-3


def test_recurrence_mask_switches_fusion_off_per_token() -> None:
    model = tiny_model(recurrence_mask_policy="mask")
    ids = random_ids(2, 10)
    with torch.no_grad():
        none = torch.zeros(2, 10, dtype=torch.bool)
        assert torch.allclose(model(ids, recurrence_mask=none).logits, model.base_decoder()(ids).logits, atol=1e-10, rtol=0)
        every = torch.ones(2, 10, dtype=torch.bool)
        assert (model(ids, recurrence_mask=every).logits - model.base_decoder()(ids).logits).abs().max() > 1e-3
        partial = torch.arange(10)[None].expand(2, 10) >= 4  # "response tokens only"
        exact = model(ids, recurrence_mask=partial, recurrence="exact").logits
        jacobi = model(ids, recurrence_mask=partial, recurrence="jacobi", d_forward=11, d_backward=1).logits
        assert (exact - jacobi).abs().max() <= 1e-9
        # tokens before the first recurring one are untouched by the recurrence
        assert torch.allclose(exact[:, :4], model.base_decoder()(ids).logits[:, :4], atol=1e-10, rtol=0)
        assert (exact[:, 4:] - model.base_decoder()(ids).logits[:, 4:]).abs().max() > 1e-3


def test_recurrence_mask_policy_all_matches_all_true_mask() -> None:
    masked = tiny_model(recurrence_mask_policy="mask")
    plain = tiny_model()
    ids = random_ids(2, 8)
    with torch.no_grad():
        got = masked(ids, recurrence_mask=torch.ones(2, 8, dtype=torch.bool)).logits
        assert torch.allclose(got, plain(ids).logits, atol=1e-10, rtol=0)
