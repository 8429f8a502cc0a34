"""T²MLR as a transformers causal LM, switch by switch, on every backbone family it wraps.

Each behaviour transformers offers on a causal LM is called here the way its users and its own model tests
call it, on tiny Llama, Qwen2, Mistral and Qwen3 backbones with the gates open (so the recurrence changes
every number), and checked against an independent reference: the full forward (a cache continued by hand
must give its logits), the plain base model (`base_decoder()`, with closed gates or on blocks the recurrence
does not reach), or another path at its fixed point (exact against Jacobi with d_forward > T). When the next
transformers release moves an internal, the test that names the switch fails. Where a behaviour cannot apply
to a recurrent model, the test checks that it is refused, and says why.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import left_padded, random_ids, tiny_model
from transformers import AutoModelForCausalLM, DynamicCache

from t2mlr import T2MLRCache, T2MLRForCausalLM

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FAMILIES = ["llama", "qwen2", "mistral", "qwen3"]
TOL32 = 1e-5  # float32 against float32: the same computation in another order
TOL64 = 1e-10


def model32(family: str, **kwargs) -> T2MLRForCausalLM:
    """The tiny backbone of `family` as T²MLR(2, 4), gates open, in float32 (what users decode in)."""
    return tiny_model(family, dtype=torch.float32, **kwargs)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: float = TOL32, msg: str = "") -> None:
    torch.testing.assert_close(actual, expected, rtol=0, atol=tol, msg=msg or None)


# ------------------------------------------------------------------------------------------ the cache


@pytest.mark.parametrize("family", FAMILIES)
def test_use_cache_returns_the_models_own_cache(family: str) -> None:
    """As `LlamaForCausalLM` returns a DynamicCache: here a T2MLRCache holding the keys and R after every token.
    use_cache=None follows the config in evaluation mode (as Llama); training forwards keep none."""
    model = model32(family)
    ids = random_ids(2, 6)
    with torch.no_grad():
        out = model(ids, use_cache=True)
        assert isinstance(out.past_key_values, T2MLRCache)
        assert out.past_key_values.get_seq_length() == 6 and out.past_key_values.recurrent_states.shape == (2, 6, 32)
        assert_close(out.past_key_values.recurrent_state, out.recurrent_state, 0.0)
        assert isinstance(model(ids).past_key_values, T2MLRCache)  # the config's use_cache, True
        assert model(ids, use_cache=False).past_key_values is None
        assert model.train()(ids).past_key_values is None
        assert model(ids, use_cache=True).past_key_values.get_seq_length() == 6


@pytest.mark.parametrize("family", FAMILIES)
def test_a_greedy_loop_written_by_hand_gives_the_full_forwards_logits(family: str) -> None:
    """The loop of every transformers tutorial: prompt with use_cache=True, then one token at a time from
    out.past_key_values. Each step's logits are those of the full forward over the sequence so far, and the
    tokens are generate()'s."""
    model = model32(family)
    prompt = random_ids(2, 5)
    sequence, steps = prompt, []
    with torch.no_grad():
        out = model(prompt, use_cache=True)
        for _ in range(6):
            steps.append(out.logits[:, -1])
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            sequence = torch.cat([sequence, token], dim=1)
            out = model(token, past_key_values=out.past_key_values, use_cache=True)
        full = model(sequence).logits
        generated = model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
    for t, logits in enumerate(steps):
        assert_close(logits, full[:, prompt.shape[1] - 1 + t], msg=f"step {t}")
    assert torch.equal(generated, sequence)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_sampled_loop_with_a_left_padded_batch_gives_the_full_forwards_logits(family: str) -> None:
    """Sampling by hand from a left-padded batch, the attention mask grown by one column per step as users
    write it: every step equals the full forward of the padded sequences, and each row what it gets alone."""
    model = model32(family)
    ids, mask = left_padded([random_ids(1, 7, seed=3)[0], random_ids(1, 4, seed=4)[0]])
    generator = torch.Generator().manual_seed(0)
    sequence, steps = ids, []
    with torch.no_grad():
        out = model(ids, attention_mask=mask, use_cache=True)
        for _ in range(5):
            steps.append(out.logits[:, -1])
            token = torch.multinomial(out.logits[:, -1].softmax(-1), 1, generator=generator)
            sequence, mask = torch.cat([sequence, token], dim=1), torch.cat([mask, torch.ones_like(token)], dim=1)
            out = model(token, attention_mask=mask, past_key_values=out.past_key_values)
        full = model(sequence, attention_mask=mask).logits
        alone = model(sequence[1:, 3:]).logits  # row 1 without its 3 pads
    for t, logits in enumerate(steps):
        assert_close(logits, full[:, ids.shape[1] - 1 + t], msg=f"step {t}")
    assert_close(full[1, 3:], alone[0])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padded", [False, True], ids=["no-mask", "left-padded"])
def test_a_chunk_continuing_the_cache_gives_the_full_forwards_logits(family: str, padded: bool) -> None:
    """Several tokens at once after the prompt (speculative decoding's verification, chunked prefill)."""
    model = model32(family)
    if padded:
        ids, mask = left_padded([random_ids(1, 9, seed=5)[0], random_ids(1, 6, seed=6)[0]])
    else:
        ids, mask = random_ids(2, 9), None
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
        prompt = model(ids[:, :5], attention_mask=None if mask is None else mask[:, :5], use_cache=True)
        chunk = model(ids[:, 5:], attention_mask=mask, past_key_values=prompt.past_key_values)
    assert_close(chunk.logits, full[:, 5:])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_float64_continuation_is_the_full_forward_to_rounding(family: str) -> None:
    model = tiny_model(family)
    ids = random_ids(2, 8)
    with torch.no_grad():
        full = model(ids).logits
        cache = model(ids[:, :3], use_cache=True).past_key_values
        one = model(ids[:, 3:4], past_key_values=cache)
        rest = model(ids[:, 4:], past_key_values=one.past_key_values)
    assert_close(torch.cat([one.logits, rest.logits], dim=1), full[:, 3:], TOL64)


def test_a_plain_dynamic_cache_is_refused_with_the_fix() -> None:
    """R cannot be recovered from keys and values, and converting an empty DynamicCache would fill another
    object: a loop passing the caller's own cache again would restart at position 0 without a word."""
    model = model32("llama")
    ids = random_ids(1, 4)
    filled = DynamicCache()
    with torch.no_grad():
        model.base_decoder()(ids, past_key_values=filled, use_cache=True)
        for cache in (DynamicCache(), filled):
            with pytest.raises(ValueError, match=r"T2MLRCache.*use_cache=True and continue from out.past_key_values"):
                model(ids, past_key_values=cache, use_cache=True)


# ------------------------------------------------------------------------------------------ training switches


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("path", [{"recurrence": "exact"}, {"recurrence": "jacobi", "d_forward": 3, "d_backward": 2}],
                         ids=["exact", "jacobi"])
def test_gradient_checkpointing_changes_no_loss_and_no_gradient(family: str, path: dict) -> None:
    """TRL turns it on by default. A packed row (two documents) and a right-padded one."""
    model = tiny_model(family).train()
    ids = random_ids(2, 8)
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4], list(range(8))])

    def loss_and_grads() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad()
        labels = ids.masked_fill(mask == 0, -100)
        loss = model(ids, attention_mask=mask, position_ids=position_ids, labels=labels, **path).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    loss, grads = loss_and_grads()
    model.gradient_checkpointing_enable()
    checkpointed_loss, checkpointed = loss_and_grads()
    assert_close(checkpointed_loss, loss, 1e-12)
    assert checkpointed.keys() == grads.keys() and "model.fusion.gamma_rec" in grads
    for name, grad in grads.items():
        assert_close(checkpointed[name], grad, TOL64, msg=name)


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_in_train_mode_with_checkpointing_decodes_what_eval_mode_decodes(family: str) -> None:
    model = tiny_model(family, d_forward=2, d_backward=1)  # its training path, Jacobi at depth 2, is far from exact
    prompt = random_ids(2, 8)
    with torch.no_grad():
        reference = model.eval().generate(prompt, max_new_tokens=5, do_sample=False, pad_token_id=0)
        model.gradient_checkpointing_enable()
        in_training = model.train().generate(prompt, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert torch.equal(in_training, reference)


# ------------------------------------------------------------------------------------------ attention


@pytest.mark.parametrize("family", FAMILIES)
def test_set_attn_implementation_reaches_the_blocks(family: str) -> None:
    """The blocks' attention and the masks read the base config: the switch must reach it, as in Llama.
    (float32: in float64 transformers' eager attention gives NaN for a left-padded row, the plain model's too.)"""
    model = model32(family)
    ids, mask = left_padded([random_ids(1, 7)[0], random_ids(1, 5, seed=2)[0]])
    with torch.no_grad():
        sdpa = model(ids, attention_mask=mask).logits
        model.set_attn_implementation("eager")
        attention_configs = {layer.self_attn.config._attn_implementation for layer in model.model.layers}
        assert model.config.base_config._attn_implementation == "eager" and attention_configs == {"eager"}
        eager = model(ids, attention_mask=mask, output_attentions=True)  # only eager attention returns weights
    real = mask.bool()  # a pad position's output is each kernel's own (its query sees no key)
    assert_close(eager.logits[real], sdpa[real])
    assert len(eager.attentions) == model.config.num_layers


@pytest.mark.parametrize("family", FAMILIES)
def test_attention_weights_with_closed_gates_are_the_base_models(family: str) -> None:
    """Closed gates: T²MLR computes the base model, so every block's weights, the exact path's assembled rows
    and the Jacobi final pass's alike, are the plain model's; also when continuing a cache."""
    model = tiny_model(family, gates=False)
    model.set_attn_implementation("eager")
    base = model.base_decoder()
    ids = random_ids(2, 7)
    with torch.no_grad():
        expected = base(ids, output_attentions=True).attentions
        base_prompt = base(ids[:, :4], use_cache=True)
        expected_continued = base(ids[:, 4:], past_key_values=base_prompt.past_key_values, output_attentions=True)
        prompt = model(ids[:, :4], use_cache=True)
        continued = model(ids[:, 4:], past_key_values=prompt.past_key_values, output_attentions=True).attentions
        for path in ({"recurrence": "exact"}, {"recurrence": "jacobi", "d_forward": 2, "d_backward": 1}):
            got = model(ids, output_attentions=True, **path).attentions
            for i, (a, b) in enumerate(zip(got, expected, strict=True)):
                assert_close(a, b, TOL64, msg=f"{path} block {i + 1}")
    for i, (a, b) in enumerate(zip(continued, expected_continued.attentions, strict=True)):
        assert_close(a, b, TOL64, msg=f"continued, block {i + 1}")


@pytest.mark.parametrize("family", FAMILIES)
def test_attention_weights_of_the_exact_path_are_jacobis_at_its_fixed_point(family: str) -> None:
    """Open gates: the exact path's rows (one per token, over its cached keys) assembled into the T×T matrix
    equal the Jacobi final pass's once d_forward > T; the blocks below l_start are the base model's, those from
    l_start on differ from it (the recurrence reaches them). Asked through the config, as transformers allows."""
    model = tiny_model(family)
    model.set_attn_implementation("eager")
    model.config.output_attentions = True
    ids = random_ids(2, 6)
    with torch.no_grad():
        exact = model(ids, recurrence="exact").attentions
        jacobi = model(ids, recurrence="jacobi", d_forward=7, d_backward=1).attentions
        base = model.base_decoder()(ids, output_attentions=True).attentions
    for i, (a, b) in enumerate(zip(exact, jacobi, strict=True)):
        assert a.shape == (2, 4, 6, 6)
        assert_close(a, b, TOL64, msg=f"block {i + 1}")
        assert_close(a.sum(-1), torch.ones_like(a.sum(-1)), 1e-6)  # eager's softmax runs in float32
        assert torch.equal(a.triu(1), torch.zeros_like(a))  # causal: no weight on later tokens
    assert_close(exact[0], base[0], TOL64)  # block 1 lies below l_start = 2
    assert all((a - b).abs().max() > 1e-4 for a, b in zip(exact[1:], base[1:]))


@pytest.mark.parametrize("family", FAMILIES)
def test_attention_weights_are_refused_where_the_kernel_cannot_give_them(family: str) -> None:
    """SDPA never forms the weights: refused before any compute, from the argument and from the config."""
    model = tiny_model(family)
    ids = random_ids(1, 4)
    with pytest.raises(ValueError, match="output_attentions=True needs attn_implementation='eager'"):
        model(ids, output_attentions=True)
    with pytest.raises(ValueError, match="eager"):  # transformers' own check, on the config's switch
        model.config.output_attentions = True


# ------------------------------------------------------------------------------------------ outputs and inputs


@pytest.mark.parametrize("family", FAMILIES)
def test_return_dict_false_returns_the_tuple_transformers_returns(family: str) -> None:
    model = tiny_model(family)
    base = model.base_decoder()
    ids = random_ids(2, 5)
    with torch.no_grad():
        out = model(ids, labels=ids)
        loss, logits, cache, *rest = model(ids, labels=ids, return_dict=False)
        base_tuple = base(ids, labels=ids, return_dict=False)
        model.config.return_dict = False
        from_config = model.model(ids)
    assert isinstance(base_tuple, tuple) and len(base_tuple) == 3  # (loss, logits, past_key_values), as here
    assert_close(loss, out.loss, 0.0)
    assert_close(logits, out.logits, 0.0)
    assert isinstance(cache, T2MLRCache)
    assert_close(rest[0], out.recurrent_state, 0.0)  # then T²MLR's own fields
    assert isinstance(from_config, tuple) and from_config[0].shape == (2, 5, 32)


@pytest.mark.parametrize("family", FAMILIES)
def test_output_hidden_states_with_closed_gates_are_the_base_models(family: str) -> None:
    model = tiny_model(family, gates=False)
    ids = random_ids(2, 5)
    with torch.no_grad():
        expected = model.base_decoder()(ids, output_hidden_states=True).hidden_states
        for path in ("exact", "jacobi"):
            got = model(ids, recurrence=path, output_hidden_states=True).hidden_states
            assert len(got) == len(expected) == model.config.num_layers + 1
            for i, (a, b) in enumerate(zip(got, expected)):
                assert_close(a, b, TOL64, msg=f"{path}, entry {i}")


@pytest.mark.parametrize("family", FAMILIES)
def test_inputs_embeds_in_forward_and_generate(family: str) -> None:
    """Soft prompts and multimodal front-ends hand in embeddings: the forward equals the ids' forward, and
    generate() (which returns only the new tokens then, as for Llama) decodes the same tokens."""
    model = model32(family)
    prompt = random_ids(2, 6)
    embeds = model.get_input_embeddings()(prompt).detach()
    settings = {"max_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        assert_close(model(inputs_embeds=embeds).logits, model(prompt).logits, 0.0)
        from_ids = model.generate(prompt, **settings)
        from_embeds = model.generate(inputs_embeds=embeds, **settings)
    assert torch.equal(from_embeds, from_ids[:, prompt.shape[1]:])


# ------------------------------------------------------------------------------------------ positions


@pytest.mark.parametrize("family", FAMILIES)
def test_rope_scaling_runs_positions_beyond_max_position_embeddings(family: str) -> None:
    """Linear ×4 on a 32-position config: 100 tokens run as on the plain base model (closed gates), and
    decoding past position 32 continues the full forward (open gates); beyond 4 × 32 is refused."""
    scaled = {"max_position_embeddings": 32, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}
    closed = tiny_model(family, gates=False, base_overrides=scaled)
    opened = tiny_model(family, base_overrides=scaled)
    ids = random_ids(1, 100)
    with torch.no_grad():
        assert_close(closed(ids).logits, closed.base_decoder()(ids).logits, TOL64)
        full = opened(ids).logits
        cache = opened(ids[:, :40], use_cache=True).past_key_values
        assert_close(opened(ids[:, 40:], past_key_values=cache).logits, full[:, 40:], TOL64)
        with pytest.raises(ValueError, match="limit of 128 positions"):
            opened(random_ids(1, 129))


def test_without_rope_scaling_positions_stop_at_max_position_embeddings() -> None:
    model = tiny_model(base_overrides={"max_position_embeddings": 32})
    with pytest.raises(ValueError, match=r"limit of 32 positions .*rope_parameters"):
        model(random_ids(1, 33))


# ------------------------------------------------------------------------------------------ weights


@pytest.mark.parametrize("family", FAMILIES)
def test_resize_token_embeddings_keeps_the_old_tokens_logits(family: str) -> None:
    """The vocabulary grows in the embedding, the head and the config (vocab_size), tied or not as the base
    model; the old tokens' logits stay as they were and the new ids are accepted."""
    model = tiny_model(family)
    ids = random_ids(2, 6)
    with torch.no_grad():
        before = model(ids).logits
        model.resize_token_embeddings(80, mean_resizing=False)
        after = model(ids).logits
        model(torch.tensor([[70, 79]]))
    assert model.config.vocab_size == model.config.base_config.vocab_size == 80
    assert after.shape[-1] == 80 and model.lm_head.weight.shape[0] == 80
    assert_close(after[..., :61], before, TOL64)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_tied_and_untied_heads_load_as_saved(family: str, tied: bool, tmp_path: Path) -> None:
    model = tiny_model(family, base_overrides={"tie_word_embeddings": tied})
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    model.save_pretrained(tmp_path)
    loaded = T2MLRForCausalLM.from_pretrained(tmp_path)
    ids = random_ids(2, 5)
    with torch.no_grad():
        assert_close(loaded(ids).logits, model(ids).logits, TOL64)
    assert (loaded.lm_head.weight is loaded.model.embed_tokens.weight) == tied


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("load", [{"dtype": torch.bfloat16}, {"device_map": "cpu"}], ids=["dtype", "device_map"])
def test_dtype_and_device_map_load_as_for_the_base_model(family: str, load: dict, tmp_path: Path) -> None:
    """`from_pretrained(dir, dtype=...)` and `device_map="cpu"`, as on the plain model saved beside it; closed
    gates, so the bfloat16 logits must be the plain model's bfloat16 logits. The gates stay float32
    (docs/semantics.md §2)."""
    if "device_map" in load:
        pytest.importorskip("accelerate", reason="transformers needs accelerate for a device_map, for any model")
    model = tiny_model(family, gates=False, dtype=torch.float32)
    model.save_pretrained(tmp_path / "t2mlr")
    model.base_decoder().save_pretrained(tmp_path / "base")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "t2mlr", **load)
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base", **load)
    assert isinstance(loaded, T2MLRForCausalLM) and loaded.dtype == base.dtype
    assert loaded.fusion.gamma_cur.dtype == torch.float32
    ids = random_ids(2, 5)
    with torch.no_grad():
        assert_close(loaded(ids).logits.float(), base(ids).logits.float(), 1e-6)


# ------------------------------------------------------------------------------------------ declared abilities


def test_declared_abilities_are_the_tested_ones() -> None:
    """Each flag transformers reads is declared true only where a test shows it: full-graph compile of a
    cached step (tests/test_compile.py), SDPA and eager attention (above), gradient checkpointing (above).
    Not declared: flex attention (the exact path steps through 4D masks, which flex does not build), and
    context parallelism, which cannot apply to a recurrent model: R runs through every token of a row, so a
    row split over devices would lose it at the split."""
    assert T2MLRForCausalLM._can_compile_fullgraph and T2MLRForCausalLM.supports_gradient_checkpointing
    assert T2MLRForCausalLM._supports_sdpa and not T2MLRForCausalLM._supports_flex_attn
    assert T2MLRForCausalLM._supports_context_parallel is False
    assert tiny_model().supports_context_parallel is False  # what transformers' context-parallel setup asks


def test_what_cannot_apply_to_a_recurrent_model_is_refused_with_the_reason() -> None:
    """A Jacobi chunk continuing a cache: the fixed point over a chunk needs R before it, which only a prefill
    from the start has (continue with the exact path); keys cached by the base model alone (recurrence='off')
    carry no R to continue from."""
    model = tiny_model()
    ids = random_ids(1, 6)
    with torch.no_grad():
        cache = model(ids[:, :3], use_cache=True).past_key_values
        with pytest.raises(ValueError, match="Jacobi over a multi-token chunk needs an empty cache"):
            model(ids[:, 3:], past_key_values=cache, recurrence="jacobi")
        plain = model(ids[:, :3], use_cache=True, recurrence="off").past_key_values
        with pytest.raises(ValueError, match="recurrent states for 0"):
            model(ids[:, 3:], past_key_values=plain)
