"""Every cache operation that changes the batch or the length changes R with it: after the operation,
the next decode step equals the exact forward over the correspondingly changed sequences, and the
stored states equal those of a fresh prefill of them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from conftest import random_ids, tiny_model
from transformers import DynamicCache

from t2mlr import T2MLRCache

CacheOp = Callable[[T2MLRCache], None]
RowsOp = Callable[[torch.Tensor], torch.Tensor]

OPERATIONS: dict[str, tuple[CacheOp, RowsOp]] = {
    "reorder_cache (beam search)": (lambda c: c.reorder_cache(torch.tensor([2, 0, 1])), lambda ids: ids[[2, 0, 1]]),
    "batch_select_indices": (lambda c: c.batch_select_indices(torch.tensor([0, 2])), lambda ids: ids[[0, 2]]),
    "batch_repeat_interleave (expand)": (lambda c: c.batch_repeat_interleave(2), lambda ids: ids.repeat_interleave(2, 0)),
    "crop (remove the last 2)": (lambda c: c.crop(-2), lambda ids: ids[:, :-2]),
    "crop (remove the last 4)": (lambda c: c.crop(-4), lambda ids: ids[:, :-4]),
}


def prefill(model, ids: torch.Tensor) -> T2MLRCache:
    cache = T2MLRCache(config=model.config)
    with torch.no_grad():
        model(ids, past_key_values=cache, use_cache=True, recurrence="exact")
    return cache


@pytest.mark.parametrize("name", list(OPERATIONS))
def test_cache_operation_moves_r_with_the_keys_and_values(name: str) -> None:
    change_cache, change_rows = OPERATIONS[name]
    model = tiny_model()
    ids = random_ids(3, 7)
    cache = prefill(model, ids)
    change_cache(cache)
    rows = change_rows(ids)
    assert cache.get_seq_length() == rows.shape[1]
    torch.testing.assert_close(cache.recurrent_states, prefill(model, rows).recurrent_states, rtol=0, atol=1e-12)

    following = random_ids(rows.shape[0], 1, seed=5)
    with torch.no_grad():
        step = model(following, past_key_values=cache, use_cache=True).logits[:, -1]
        exact = model(torch.cat([rows, following], dim=1), recurrence="exact").logits[:, -1]
    torch.testing.assert_close(step, exact, rtol=0, atol=1e-10)


def test_reset_forgets_r() -> None:
    model = tiny_model()
    cache = prefill(model, random_ids(2, 5))
    cache.reset()
    assert cache.recurrent_states is None and cache.recurrent_state is None


@pytest.mark.parametrize("method", ["batch_split", "from_batch_splits"])
def test_batch_split_and_merge_would_carry_r(method: str) -> None:
    """transformers 5.17–5.23's DynamicCache has no batch split/merge (older versions had them). If a
    future version brings them back, T2MLRCache must override them so R is split and merged too."""
    if hasattr(DynamicCache, method):
        assert method in vars(T2MLRCache), f"DynamicCache.{method} exists: T2MLRCache must carry R through it"
