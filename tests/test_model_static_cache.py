"""`T2MLRStaticCache`: R preallocated beside a `StaticCache`'s keys and values, so a decode step has fixed
shapes (issue 19's compiled / CUDA-graph decoding). Reference: the same decoding with `T2MLRCache`, whose
steps are checked against the exact forward in test_generation.py; the compiled step is in test_compile.py."""

from __future__ import annotations

import pytest
import torch
from conftest import random_ids, tiny_model
from transformers import LlamaForCausalLM

from t2mlr import T2MLRCache, T2MLRStaticCache

TOL = 1e-10


def left_padded_prompt(batch: int = 3, length: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    ids = random_ids(batch, length)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    mask[-1, :1] = 0
    return ids, mask


def greedy(model, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int = 6, **kwargs):
    return model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0,
                          eos_token_id=None, return_dict_in_generate=True, output_logits=True, **kwargs)


@pytest.mark.parametrize("placement", [(2, 4), (1, 5), (3, 3)])
@pytest.mark.parametrize("prefill", [{"prefill": "exact"}, {"prefill": "jacobi", "prefill_depth": 7}])
@pytest.mark.parametrize("padded", [True, False])
def test_static_generation_equals_the_dynamic_cache(placement: tuple[int, int], prefill: dict, padded: bool) -> None:
    """Without padding the prefill's mask is one transformers would skip (sdpa's is_causal); the exact path's
    one-query steps over a static cache's free positions must not see it skipped."""
    model = tiny_model(l_start=placement[0], l_end=placement[1])
    ids, mask = left_padded_prompt()
    mask = mask if padded else torch.ones_like(mask)
    dynamic = greedy(model, ids, mask, **prefill)
    static = greedy(model, ids, mask, cache_implementation="static", **prefill)
    assert isinstance(static.past_key_values, T2MLRStaticCache)
    assert torch.equal(static.sequences, dynamic.sequences)
    torch.testing.assert_close(torch.stack(static.logits), torch.stack(dynamic.logits), rtol=0, atol=TOL)
    torch.testing.assert_close(static.past_key_values.recurrent_states, dynamic.past_key_values.recurrent_states,
                               rtol=0, atol=TOL)


@pytest.mark.parametrize("search", [{"num_beams": 3}, {"num_beams": 3, "num_return_sequences": 2},
                                    {"do_sample": True, "num_return_sequences": 2}])
def test_static_beams_and_samples_equal_the_dynamic_cache(search: dict) -> None:
    """Beam search reorders R with the keys (without that the beams decode other tokens)."""
    model = tiny_model()
    ids, mask = left_padded_prompt(batch=2, length=6)
    settings = {"attention_mask": mask, "max_new_tokens": 5, "pad_token_id": 0, "eos_token_id": None, **search}
    torch.manual_seed(0)
    dynamic = model.generate(ids, **settings)
    torch.manual_seed(0)
    static = model.generate(ids, cache_implementation="static", **settings)
    assert torch.equal(static, dynamic)


def test_a_fixed_width_mask_and_a_growing_mask_give_the_same_step() -> None:
    """A static cache takes the 2D mask either as (batch, past + chunk) or padded to its length."""
    model = tiny_model()
    ids, mask = left_padded_prompt()
    step = random_ids(3, 1, seed=4)
    grown = torch.cat([mask, torch.ones(3, 1, dtype=mask.dtype)], dim=1)
    outputs = []
    for fixed in (False, True):
        cache = T2MLRStaticCache(model.config, max_cache_len=12)
        widen = (lambda m: torch.nn.functional.pad(m, (0, 12 - m.shape[1]))) if fixed else (lambda m: m)
        with torch.no_grad():
            model(ids, attention_mask=widen(mask), past_key_values=cache, use_cache=True)
            outputs.append(model(step, attention_mask=widen(grown), past_key_values=cache, use_cache=True).logits)
    reference = T2MLRCache(config=model.config)
    with torch.no_grad():
        model(ids, attention_mask=mask, past_key_values=reference, use_cache=True)
        expected = model(step, attention_mask=grown, past_key_values=reference, use_cache=True).logits
    for logits in outputs:
        torch.testing.assert_close(logits, expected, rtol=0, atol=TOL)


def test_reset_empties_r_and_the_cache_decodes_afresh() -> None:
    model = tiny_model()
    ids, mask = left_padded_prompt()
    cache = T2MLRStaticCache(model.config, max_cache_len=10)
    with torch.no_grad():
        first = model(ids, attention_mask=mask, past_key_values=cache, use_cache=True).logits
        cache.reset()
        assert cache.recurrent_states.shape[1] == 0 and cache.recurrent_state is None
        again = model(ids, attention_mask=mask, past_key_values=cache, use_cache=True).logits
    torch.testing.assert_close(again, first, rtol=0, atol=0)


def prefilled_static_cache(max_cache_len: int):
    """A tiny model and a static cache holding its left-padded prompt (batch 3, 7 tokens)."""
    model = tiny_model()
    ids, mask = left_padded_prompt()
    cache = T2MLRStaticCache(model.config, max_cache_len=max_cache_len)
    with torch.no_grad():
        model(ids, attention_mask=mask, past_key_values=cache, use_cache=True)
    return model, ids, mask, cache


def test_static_cache_refuses_what_it_cannot_do() -> None:
    model, ids, mask, cache = prefilled_static_cache(8)
    with torch.no_grad():
        with pytest.raises(ValueError, match="static cache holds 8"):
            model(random_ids(3, 2), attention_mask=torch.ones(3, 9, dtype=torch.long), past_key_values=cache,
                  use_cache=True)
        with pytest.raises(ValueError, match="static cache holds 8"):  # no mask: the same check
            model(random_ids(3, 2), past_key_values=cache, use_cache=True)
    with pytest.raises(ValueError, match="cannot be cropped"):
        cache.crop(-1)
    with pytest.raises(ValueError, match="fixed"):
        cache.batch_repeat_interleave(2)
    with pytest.raises(ValueError, match="'static'"):
        model.generate(ids, attention_mask=mask, max_new_tokens=2, cache_implementation="offloaded", pad_token_id=0)


def test_static_cache_filled_without_recurrence_is_refused() -> None:
    model = tiny_model()
    ids = random_ids(2, 5)
    cache = T2MLRStaticCache(model.config, max_cache_len=8)
    with torch.no_grad():
        model(ids, past_key_values=cache, use_cache=True, recurrence="off")
        with pytest.raises(ValueError, match="keys for 5 tokens but recurrent states for 0"):
            model(random_ids(2, 1), past_key_values=cache, use_cache=True, recurrence="exact")


HOST_READS = ("tolist", "item", "__int__", "__index__", "__bool__", "__float__")


def test_an_eager_static_step_reads_the_device_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every check of a decode step (value ranges, room in the cache, one R per cached key) shares one host
    read: each read stalls a GPU step. Counted by wrapping the Tensor methods that copy a value to the host."""
    model, ids, mask, cache = prefilled_static_cache(12)
    with torch.no_grad():
        reads: list[str] = []
        for name in HOST_READS:
            method = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _m=method, _n=name, **k: reads.append(_n) or _m(self, *a, **k))
        grown = torch.cat([mask, torch.ones(mask.shape[0], 1, dtype=mask.dtype)], dim=1)
        model(random_ids(3, 1), attention_mask=grown, past_key_values=cache, use_cache=True)
        model(random_ids(3, 1), attention_mask=cache.padded_mask(torch.cat([grown, grown[:, :1]], dim=1)),
              past_key_values=cache, use_cache=True)
    assert reads == ["tolist", "tolist"]


def test_a_growing_mask_must_cover_the_cached_tokens() -> None:
    model, ids, mask, cache = prefilled_static_cache(12)
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"past \+ seq\) = \(3, 8\), got \(3, 9\)"):
            model(random_ids(3, 1), attention_mask=torch.ones(3, 9, dtype=torch.long), past_key_values=cache,
                  use_cache=True)
        with pytest.raises(ValueError, match="batch 3"):
            model(random_ids(3, 1), attention_mask=torch.ones(2, 8, dtype=torch.long), past_key_values=cache,
                  use_cache=True)


def test_generate_sizes_static_caches_as_transformers_does() -> None:
    """A later, shorter generation reuses the earlier width (no new trace of a compiled step), as a plain
    transformers model's StaticCache does, and still decodes what the growing cache decodes."""
    model = tiny_model()
    plain = LlamaForCausalLM(model.config.base_config).to(torch.float64).eval()
    ids, mask = left_padded_prompt()
    widths = []
    for new_tokens in (6, 2):
        ours = greedy(model, ids, mask, cache_implementation="static", max_new_tokens=new_tokens)
        theirs = plain.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                                eos_token_id=None, cache_implementation="static", return_dict_in_generate=True)
        widths.append((ours.past_key_values.get_max_length(), theirs.past_key_values.get_max_length()))
        reference = greedy(model, ids, mask, max_new_tokens=new_tokens)
        assert torch.equal(ours.sequences, reference.sequences)
    assert widths[1] == widths[0] and widths[0][0] == widths[0][1]
