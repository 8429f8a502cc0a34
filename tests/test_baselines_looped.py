"""Looped Transformer baseline: equality with the base model and with a hand-written loop, cached decoding,
generation, save/load, parameter matching at the SmolLM2-135M shape, and input checks."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB, left_padded, random_ids, tiny_base_config
from transformers import AutoModelForCausalLM, GPT2Config, Qwen3Config

import t2mlr.baselines  # noqa: F401  (registers the baseline model types)
from t2mlr.baselines import (
    LoopedCache,
    LoopedConfig,
    LoopedForCausalLM,
    matched_llama_config,
    matched_looped_config,
    t2mlr_parameter_count,
    transformer_parameter_count,
)
from t2mlr.baselines.matching import parameter_count_of_config as looped_parameter_count
from t2mlr.model.shapes import smollm2_135m_t2mlr_config as smollm2_135m_config

LAYERS = 5


def base_model(family: str = "llama", seed: int = 0, **overrides) -> torch.nn.Module:
    torch.manual_seed(seed)
    if family == "qwen3":
        config = Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0,
                             bos_token_id=1, eos_token_id=2, **overrides)
    else:
        config = tiny_base_config(family, layers=LAYERS, **overrides)
    return AutoModelForCausalLM.from_config(config).to(torch.float64).eval()


def looped(start: int, end: int, loops: int, family: str = "llama", **overrides) -> LoopedForCausalLM:
    return LoopedForCausalLM.from_base(base_model(family, **overrides), start, end, loops).eval()


def hand_looped_logits(base, ids: torch.Tensor, start: int, end: int, loops: int) -> torch.Tensor:
    """Reference: the base LlamaModel's own layers called by hand, the range start..end `loops` times."""
    inner = base.model
    length = ids.shape[1]
    hidden = inner.embed_tokens(ids)
    positions = torch.arange(length)[None].expand(ids.shape[0], -1)
    cos_sin = inner.rotary_emb(hidden, position_ids=positions)
    future = torch.ones(length, length, dtype=torch.bool).triu(1)
    mask = torch.zeros(length, length, dtype=hidden.dtype).masked_fill(future, float("-inf"))[None, None]

    def block(i: int, h: torch.Tensor) -> torch.Tensor:
        return inner.layers[i](h, attention_mask=mask, position_ids=positions, position_embeddings=cos_sin)

    for i in range(start - 1):
        hidden = block(i, hidden)
    for _ in range(loops):
        for i in range(start - 1, end):
            hidden = block(i, hidden)
    for i in range(end, len(inner.layers)):
        hidden = block(i, hidden)
    return base.lm_head(inner.norm(hidden))


@torch.no_grad()
@pytest.mark.parametrize("start,end", [(1, LAYERS), (2, 4), (3, 3)])
def test_one_loop_is_exactly_the_base_model(start: int, end: int) -> None:
    base = base_model()
    model = LoopedForCausalLM.from_base(base, start, end, 1).eval()
    ids = random_ids(3, 9)
    assert torch.equal(model(input_ids=ids).logits, base(input_ids=ids).logits)
    ids, mask = left_padded([random_ids(1, 6, seed=2)[0], random_ids(1, 9, seed=3)[0]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    assert torch.equal(
        model(input_ids=ids, attention_mask=mask).logits,
        base(input_ids=ids, attention_mask=mask, position_ids=positions).logits,
    )


@torch.no_grad()
@pytest.mark.parametrize("start,end,loops", [(1, LAYERS, 2), (2, 4, 3), (5, 5, 4)])
def test_loops_equal_a_hand_written_loop(start: int, end: int, loops: int) -> None:
    base = base_model()
    model = LoopedForCausalLM.from_base(base, start, end, loops).eval()
    ids = random_ids(2, 8)
    expected = hand_looped_logits(base, ids, start, end, loops)
    torch.testing.assert_close(model(input_ids=ids).logits, expected, rtol=0, atol=1e-12)
    assert not torch.allclose(expected, base(input_ids=ids).logits)  # looping does change the function
    assert len(model.config.block_schedule()) == LAYERS + (loops - 1) * (end - start + 1)


@torch.no_grad()
@pytest.mark.parametrize(
    "family,start,end,loops,overrides",
    [
        ("llama", 1, LAYERS, 2, {}),
        ("llama", 2, 4, 3, {}),
        ("mistral", 2, 4, 3, {"sliding_window": 3}),
        ("qwen2", 1, LAYERS, 2, {}),
        ("qwen3", 2, 4, 2, {}),
    ],
)
def test_cached_decoding_equals_full_forward_left_padded(family, start, end, loops, overrides) -> None:
    model = looped(start, end, loops, family, **overrides)
    rows = [random_ids(1, 5, seed=4)[0], random_ids(1, 9, seed=5)[0], random_ids(1, 7, seed=6)[0]]
    ids, mask = left_padded(rows)
    full = model(input_ids=ids, attention_mask=mask).logits
    cache = LoopedCache(model.config)
    chunks = [(0, 4), (4, 5), (5, 7), (7, 8), (8, 9)]  # a prefill, single steps and a two-token chunk
    pieces = [
        model(input_ids=ids[:, a:b], attention_mask=mask[:, :b], past_key_values=cache).logits for a, b in chunks
    ]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-10)
    assert len(cache.layers) == LAYERS + (loops - 1) * (end - start + 1) and cache.get_seq_length() == 9
    for i, row in enumerate(rows):  # a row's logits do not depend on its padding
        alone = model(input_ids=row[None]).logits
        torch.testing.assert_close(full[i, ids.shape[1] - len(row):], alone[0], rtol=0, atol=1e-10)


@torch.no_grad()
def test_generate_greedy_and_beam_rows_match_the_row_alone() -> None:
    model = looped(2, 4, 3)
    rows = [random_ids(1, 4, seed=7)[0], random_ids(1, 7, seed=8)[0]]
    ids, mask = left_padded(rows)
    for options in ({"do_sample": False}, {"do_sample": False, "num_beams": 3}):
        batch = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6, **options)
        for i, row in enumerate(rows):
            alone = model.generate(input_ids=row[None], max_new_tokens=6, min_new_tokens=6, **options)
            assert torch.equal(batch[i, ids.shape[1]:], alone[0, len(row):]), options
    cache = LoopedCache(model.config)  # continuing from a cache that already holds most of the prompt
    model(input_ids=ids[:, :-2], attention_mask=mask[:, :-2], past_key_values=cache)
    continued = model.generate(input_ids=ids, attention_mask=mask, past_key_values=cache, max_new_tokens=6,
                               min_new_tokens=6, do_sample=False)
    assert torch.equal(continued, model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6,
                                                 min_new_tokens=6, do_sample=False))


@torch.no_grad()
def test_sampling_with_cache_equals_sampling_without() -> None:
    model = looped(1, LAYERS, 2)
    ids = random_ids(2, 5, seed=9)
    torch.manual_seed(3)
    cached = model.generate(input_ids=ids, do_sample=True, max_new_tokens=8, min_new_tokens=8, temperature=2.0)
    torch.manual_seed(3)
    uncached = model.generate(
        input_ids=ids, do_sample=True, max_new_tokens=8, min_new_tokens=8, temperature=2.0, use_cache=False
    )
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("tied", [False, True])
def test_save_and_load_through_auto_model(tmp_path, tied: bool) -> None:
    model = looped(2, 4, 3, tie_word_embeddings=tied)
    model.save_pretrained(tmp_path / "looped")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "looped", dtype=torch.float64).eval()
    assert isinstance(loaded, LoopedForCausalLM)
    assert (loaded.config.loop_start, loaded.config.loop_end, loaded.config.loops) == (2, 4, 3)
    assert (loaded.lm_head.weight is loaded.model.embed_tokens.weight) == tied
    ids = random_ids(2, 6)
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_training_loss_is_the_causal_lm_loss_and_reaches_every_block() -> None:
    model = looped(2, 4, 2).train()
    ids = random_ids(2, 6)
    labels = ids.clone()
    labels[0, :2] = -100
    out = model(input_ids=ids, labels=labels)
    expected = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, expected.to(out.loss.dtype))
    out.loss.backward()
    assert all(layer.mlp.down_proj.weight.grad.abs().sum() > 0 for layer in model.model.layers)


@pytest.fixture(scope="module")
def smollm_t2mlr():
    config = smollm2_135m_config(13, 18)
    return config, t2mlr_parameter_count(config)


@pytest.mark.parametrize("start,end,loops", [(1, 30, 2), (9, 22, 3)])
def test_matched_looped_at_smollm2_135m(smollm_t2mlr, start: int, end: int, loops: int) -> None:
    t2mlr_config, target = smollm_t2mlr
    config = matched_looped_config(t2mlr_config, start, end, loops)
    base = config.base_config
    assert (config.loop_start, config.loop_end, config.loops) == (start, end, loops)
    assert (base.hidden_size, base.head_dim, base.num_attention_heads, base.num_key_value_heads) == (584, 64, 9, 3)
    assert (base.intermediate_size, base.num_hidden_layers) == (1536, 30)
    count = looped_parameter_count(config)
    assert target <= count <= 1.01 * target
    assert count == transformer_parameter_count(base)  # looping adds no parameters
    narrower = LoopedConfig.from_base(matched_llama_config(t2mlr_config.base_config, 583), loop_start=start, loop_end=end,
                                      loops=loops)
    assert looped_parameter_count(narrower) < target


def test_block_cost_ratio_follows_the_cost_model() -> None:
    base = smollm2_135m_config().base_config
    assert LoopedConfig.from_base(base, loop_blocks="full", loops=2).block_cost_ratio == 2.0
    assert LoopedConfig.from_base(base, loop_blocks="9-22", loops=3).block_cost_ratio == pytest.approx((30 + 2 * 14) / 30)
    assert LoopedConfig.from_base(base, loop_start=9, loop_end=22, loops=1).block_cost_ratio == 1.0


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"loop_start": 0, "loop_end": 3, "loops": 2}, "loop_start=0"),
        ({"loop_start": 2, "loop_end": LAYERS + 1, "loops": 2}, f"loop_end={LAYERS + 1}"),
        ({"loop_start": 4, "loop_end": 3, "loops": 2}, "loop_start <= loop_end"),
        ({"loop_start": 1, "loop_end": 3, "loops": 0}, "loops must be an int >= 1, got 0"),
        ({"loop_start": 1, "loop_end": 3, "loops": 2.0}, "loops must be an int >= 1"),
        ({"loop_start": "1", "loop_end": 3, "loops": 2}, "loop_start must be an int"),
    ],
)
def test_bad_loop_fields_raise(fields, message) -> None:
    with pytest.raises(ValueError, match=message):
        LoopedConfig(base_config=tiny_base_config(layers=LAYERS), **fields)


def test_bad_base_and_cache_raise() -> None:
    with pytest.raises(ValueError, match="gpt2"):
        LoopedConfig(base_config=GPT2Config(), loop_start=1, loop_end=2, loops=2)
    with pytest.raises(ValueError, match="loops must be"):
        matched_looped_config(smollm2_135m_config(), 9, 22, 0)
    model = looped(2, 4, 2)
    other = looped(2, 4, 3)
    with pytest.raises(ValueError, match="LoopedCache"):
        model(input_ids=random_ids(1, 3), past_key_values=LoopedCache(other.config))
    with pytest.raises(ValueError, match="token ids"):
        model(input_ids=torch.tensor([[1, VOCAB]]))


@torch.no_grad()
def test_packed_documents_do_not_see_each_other() -> None:
    """The trainer packs documents into one row with position_ids restarting at 0 (no attention mask)."""
    model = looped(2, 4, 3)
    first, second = random_ids(1, 4, seed=1), random_ids(1, 5, seed=2)
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4]])
    packed = model(input_ids=torch.cat([first, second], dim=1), position_ids=positions).logits
    alone = torch.cat([model(input_ids=first).logits, model(input_ids=second).logits], dim=1)
    torch.testing.assert_close(packed, alone, rtol=0, atol=1e-10)
