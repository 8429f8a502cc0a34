"""Pause-token baseline: equality with the base model run on the interleaved sequence, the loss over real
positions only, cached decoding, generation (never a pause token), save/load, matching, input checks."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB, left_padded, random_ids, tiny_base_config
from transformers import AutoModelForCausalLM

import t2mlr.baselines  # noqa: F401  (registers the baseline model types)
from t2mlr.baselines import (
    PauseCache,
    PauseConfig,
    PauseForCausalLM,
    matched_llama_config,
    matched_pause_config,
    t2mlr_parameter_count,
    transformer_parameter_count,
)
from t2mlr.baselines.matching import parameter_count_of_config as pause_parameter_count
from t2mlr.model.shapes import smollm2_135m_t2mlr_config as smollm2_135m_config


def base_model(family: str = "llama", seed: int = 0, **overrides) -> torch.nn.Module:
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_base_config(family, layers=3, **overrides)).to(torch.float64).eval()


def pause_model(pauses: int = 1, family: str = "llama", **overrides) -> PauseForCausalLM:
    model = PauseForCausalLM.from_base(base_model(family, **overrides), pauses).eval()
    with torch.no_grad():
        model.model.pause_embeddings.weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(5))
    return model


def base_logits_on_interleaved(model: PauseForCausalLM, ids: torch.Tensor) -> torch.Tensor:
    """Reference: the plain base model run on the interleaved sequence (x1 p.. x2 p.. ...), every position."""
    extended = model.model.extended_input_ids(ids)
    return model.base_decoder()(inputs_embeds=model.model.embed_extended_ids(extended)).logits


def test_extended_ids_insert_pauses_after_every_token() -> None:
    model = pause_model(pauses=2)
    ids = torch.tensor([[5, 6, 7]])
    v = VOCAB
    assert model.model.extended_input_ids(ids).tolist() == [[5, v, v + 1, 6, v, v + 1, 7, v, v + 1]]
    assert model.config.pause_token_ids == [v, v + 1] and model.config.period == 3


@torch.no_grad()
@pytest.mark.parametrize("pauses", [1, 2])
def test_logits_are_the_base_model_at_the_last_pause(pauses: int) -> None:
    model = pause_model(pauses)
    ids = random_ids(2, 7)
    reference = base_logits_on_interleaved(model, ids)
    out = model(input_ids=ids).logits
    assert out.shape == (2, 7, VOCAB)
    torch.testing.assert_close(out, reference[:, pauses :: pauses + 1], rtol=0, atol=1e-12)
    assert not torch.allclose(out, model.base_decoder()(input_ids=ids).logits)  # the pauses do change the function


@torch.no_grad()
def test_loss_is_over_real_positions_only() -> None:
    model = pause_model(pauses=2)
    ids = random_ids(2, 6)
    labels = ids.clone()
    labels[1, :3] = -100
    out = model(input_ids=ids, labels=labels)
    hand = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, hand.to(out.loss.dtype))
    # Goyal et al.'s rule on the interleaved sequence: targets that are pause tokens are not scored
    extended_labels = model.model.extended_input_ids(labels.clamp(min=0))
    extended_labels[torch.isin(extended_labels, torch.tensor(model.config.pause_token_ids))] = -100
    extended_labels[:, :: model.config.period][labels == -100] = -100
    reference = base_logits_on_interleaved(model, ids)
    goyal = torch.nn.functional.cross_entropy(
        reference[:, :-1].reshape(-1, VOCAB), extended_labels[:, 1:].reshape(-1), ignore_index=-100
    )
    torch.testing.assert_close(out.loss, goyal.to(out.loss.dtype))


@torch.no_grad()
def test_outputs_at_unscored_positions_change_nothing() -> None:
    """Whatever the last block emits at real tokens and at earlier pauses of a group, logits and loss are unchanged."""
    model = pause_model(pauses=2)
    ids = random_ids(2, 5)
    before = model(input_ids=ids, labels=ids)
    period = model.config.period
    generator = torch.Generator().manual_seed(0)

    def scramble_unscored(module, args, output):
        unscored = torch.arange(output.shape[1]) % period != period - 1
        noise = torch.randn(output.shape, generator=generator, dtype=output.dtype) * 100
        return torch.where(unscored[None, :, None], output + noise, output)

    handle = model.model.layers[-1].register_forward_hook(scramble_unscored)
    try:
        after = model(input_ids=ids, labels=ids)
    finally:
        handle.remove()
    assert torch.equal(after.logits, before.logits) and torch.equal(after.loss, before.loss)


@torch.no_grad()
@pytest.mark.parametrize(
    "pauses,family,overrides",
    [(1, "llama", {}), (2, "llama", {}), (1, "mistral", {"sliding_window": 5}), (1, "qwen2", {})],
)
def test_cached_decoding_equals_full_forward_left_padded(pauses, family, overrides) -> None:
    model = pause_model(pauses, family, **overrides)
    rows = [random_ids(1, 5, seed=4)[0], random_ids(1, 9, seed=5)[0], random_ids(1, 7, seed=6)[0]]
    ids, mask = left_padded(rows)
    full = model(input_ids=ids, attention_mask=mask).logits
    cache = PauseCache(model.config)
    chunks = [(0, 4), (4, 5), (5, 7), (7, 8), (8, 9)]
    pieces = [
        model(input_ids=ids[:, a:b], attention_mask=mask[:, :b], past_key_values=cache).logits for a, b in chunks
    ]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-10)
    assert cache.get_seq_length() == 9 and cache.extended_length() == 9 * (pauses + 1)
    for i, row in enumerate(rows):  # a row's logits do not depend on its padding
        alone = model(input_ids=row[None]).logits
        torch.testing.assert_close(full[i, ids.shape[1] - len(row):], alone[0], rtol=0, atol=1e-10)


@torch.no_grad()
def test_cropping_the_cache_removes_tokens_with_their_pauses() -> None:
    model = pause_model(pauses=2)
    ids = random_ids(1, 8)
    cache = PauseCache(model.config)
    model(input_ids=ids[:, :6], past_key_values=cache)
    cache.crop(-2)
    assert cache.get_seq_length() == 4 and cache.extended_length() == 12
    resumed = model(input_ids=ids[:, 4:], past_key_values=cache).logits
    torch.testing.assert_close(resumed, model(input_ids=ids).logits[:, 4:], rtol=0, atol=1e-10)


@torch.no_grad()
def test_generate_rows_match_alone_and_never_emit_a_pause() -> None:
    model = pause_model(pauses=1)
    assert model.get_output_embeddings().weight.shape[0] == VOCAB  # no LM-head rows for pause ids
    rows = [random_ids(1, 4, seed=7)[0], random_ids(1, 7, seed=8)[0]]
    ids, mask = left_padded(rows)
    for options in ({"do_sample": False}, {"do_sample": False, "num_beams": 3}):
        batch = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6, **options)
        assert batch.shape[1] == ids.shape[1] + 6  # the user sees real tokens only
        for i, row in enumerate(rows):
            alone = model.generate(input_ids=row[None], max_new_tokens=6, min_new_tokens=6, **options)
            assert torch.equal(batch[i, ids.shape[1]:], alone[0, len(row):]), options
    # continuing from a cache that already holds most of the prompt: generate() slices by real tokens
    cache = PauseCache(model.config)
    model(input_ids=ids[:, :-2], attention_mask=mask[:, :-2], past_key_values=cache)
    continued = model.generate(input_ids=ids, attention_mask=mask, past_key_values=cache, max_new_tokens=6,
                               min_new_tokens=6, do_sample=False)
    assert torch.equal(continued, model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6,
                                                 min_new_tokens=6, do_sample=False))
    torch.manual_seed(3)
    sampled = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=5.0, max_new_tokens=15)
    torch.manual_seed(3)
    uncached = model.generate(
        input_ids=ids, attention_mask=mask, do_sample=True, temperature=5.0, max_new_tokens=15, use_cache=False
    )
    assert torch.equal(sampled, uncached)
    assert int(sampled.max()) < VOCAB and not torch.isin(sampled, torch.tensor(model.config.pause_token_ids)).any()


@pytest.mark.parametrize("tied", [False, True])
def test_save_and_load_through_auto_model(tmp_path, tied: bool) -> None:
    model = pause_model(pauses=2, tie_word_embeddings=tied)
    model.save_pretrained(tmp_path / "pause")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "pause", dtype=torch.float64).eval()
    assert isinstance(loaded, PauseForCausalLM)
    assert (loaded.config.pauses, loaded.config.pause_token_id) == (2, VOCAB)
    assert (loaded.lm_head.weight is loaded.model.embed_tokens.weight) == tied
    assert torch.equal(loaded.model.pause_embeddings.weight, model.model.pause_embeddings.weight)
    ids = random_ids(2, 6)
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_training_reaches_the_pause_embeddings() -> None:
    model = pause_model(pauses=1).train()
    ids = random_ids(2, 6)
    model(input_ids=ids, labels=ids).loss.backward()
    assert model.model.pause_embeddings.weight.grad.abs().sum() > 0


def test_matched_pause_at_smollm2_135m() -> None:
    t2mlr_config = smollm2_135m_config(13, 18)
    target = t2mlr_parameter_count(t2mlr_config)
    config = matched_pause_config(t2mlr_config, pauses=1)
    base = config.base_config
    assert (base.hidden_size, base.head_dim, base.num_attention_heads, base.num_key_value_heads) == (584, 64, 9, 3)
    assert (base.intermediate_size, base.num_hidden_layers, config.pauses) == (1536, 30, 1)
    count = pause_parameter_count(config)
    assert target <= count <= 1.01 * target
    assert count == transformer_parameter_count(base) + 584  # the backbone plus one pause embedding
    narrower = PauseConfig.from_base(matched_llama_config(t2mlr_config.base_config, 583), pauses=1)
    assert pause_parameter_count(narrower) < target


def test_bad_inputs_raise() -> None:
    base = tiny_base_config(layers=3)
    with pytest.raises(ValueError, match="pauses must be an int >= 1, got 0"):
        PauseConfig(base_config=base, pauses=0)
    with pytest.raises(ValueError, match=f"pause_token_id must be an int >= vocab_size={VOCAB}.*got {VOCAB - 1}"):
        PauseConfig(base_config=base, pauses=1, pause_token_id=VOCAB - 1)
    with pytest.raises(ValueError, match="pauses must be"):
        matched_pause_config(smollm2_135m_config(), pauses=0)
    model = pause_model(pauses=1)
    with pytest.raises(ValueError, match="token ids must lie in"):
        model(input_ids=torch.tensor([[3, VOCAB]]))  # a pause id is not a valid input: pauses are inserted inside
    with pytest.raises(ValueError, match="pause ids"):
        model.model.embed_extended_ids(torch.tensor([[3, VOCAB + 1]]))
    with pytest.raises(ValueError, match="PauseCache"):
        model(input_ids=random_ids(1, 3), past_key_values=PauseCache(pause_model(pauses=2).config))


@torch.no_grad()
def test_packed_documents_do_not_see_each_other() -> None:
    """The trainer packs documents into one row with position_ids restarting at 0 (no attention mask); the
    pauses of a document share its positions, so they restart with it."""
    model = pause_model(pauses=2)
    first, second = random_ids(1, 4, seed=1), random_ids(1, 5, seed=2)
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4]])
    packed = model(input_ids=torch.cat([first, second], dim=1), position_ids=positions).logits
    alone = torch.cat([model(input_ids=first).logits, model(input_ids=second).logits], dim=1)
    torch.testing.assert_close(packed, alone, rtol=0, atol=1e-10)
