"""Generation through `generate()` hands the recurrent state over correctly (docs/semantics.md §5.4), and the
`t2mlr generate` command streams it.

Every test compares decoding against the exact forward over the final sequence (the definition): a
wrong handoff of R from the prompt to the first decode step, a wrong reordering under beam search,
a wrong expansion for num_return_sequences or a wrong crop all change logits there.

"Recurrence over the prompt on and off" is tested as: gates open (the prompt writes a non-trivial R
that decoding must continue from) and gates closed (the recurrence contributes nothing, so T²MLR
decoding must equal its base model's own `generate`, token for token and logit for logit).

Decoding step by step and one exact pass over the sequence are two float32 computations of the same logits
with differently shaped kernels, so they agree to float32 rounding, which depends on the CPU's kernel set:
each comparison allows `rounding.MARGIN` times float32's own gap to float64 on the reference's path and input,
measured here and now (`exact_tolerance`; about 1e-6 on these models). A wrong state or position moves the
logits by 1e-2 or more (test_open_gates_change_what_is_decoded, test_shallow_jacobi_prefill_is_an_approximation).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import VOCAB, left_padded, random_ids, tiny_model
from rounding import float32_tolerance, forward_tolerance, in_dtype
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerFast

from t2mlr.generation import GenerationSettings, generate_kwargs
from t2mlr.generation.commands import register
from t2mlr.model import T2MLRCache, T2MLRForCausalLM

GREEDY = dict(do_sample=False, pad_token_id=0)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _generate(model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor | None = None, new: int = 6, **kwargs: Any):
    return model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids) if mask is None else mask,
        max_new_tokens=new,
        min_new_tokens=new,
        return_dict_in_generate=True,
        output_logits=True,
        **{**GREEDY, **kwargs},
    )


def _exact_logits(model: T2MLRForCausalLM, ids: torch.Tensor, **inputs: Any) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, recurrence="exact", **inputs).logits


def exact_tolerance(model: T2MLRForCausalLM, ids: torch.Tensor, **inputs: Any) -> float:
    """How far two float32 computations of the exact logits over `ids` may differ (module docstring)."""
    return forward_tolerance(model, ids, recurrence="exact", **inputs)


def prefill_tolerance(model: T2MLRForCausalLM, prompt: torch.Tensor,
                      part: Callable[[T2MLRCache], torch.Tensor]) -> float:
    """Likewise for one part of the cache an exact prefill of `prompt` leaves (R, a layer's keys or values)."""
    return float32_tolerance(lambda dtype: part(_prefill(in_dtype(model, dtype), prompt, recurrence="exact")[1]))


def _assert_decoding_matches_exact(model: T2MLRForCausalLM, prompt: torch.Tensor, out: Any) -> None:
    """Logits of every generated step equal the exact forward's logits over the final sequence."""
    generated = torch.stack(out.logits, dim=1)
    expected = _exact_logits(model, out.sequences)[:, prompt.shape[1] - 1 : -1]
    assert (generated - expected).abs().max() <= exact_tolerance(model, out.sequences)


# ----------------------------------------------------------------------------- prefill → decode handoff
@pytest.mark.parametrize("gates", [True, False], ids=["gates-open", "gates-closed"])
@pytest.mark.parametrize("prefill", [dict(prefill="exact"), dict(prefill="jacobi", prefill_depth=10)], ids=["exact", "jacobi-full"])
def test_greedy_decoding_reproduces_the_exact_forward(gates: bool, prefill: dict) -> None:
    model = tiny_model(dtype=torch.float32, gates=gates)
    prompt = random_ids(1, 9)
    out = _generate(model, prompt, new=8, **prefill)
    _assert_decoding_matches_exact(model, prompt, out)
    with torch.no_grad():  # the prefill itself (with a cache) gives the exact prompt logits too
        cached = model(prompt, past_key_values=T2MLRCache(config=model.config), recurrence="exact").logits
    assert (cached - _exact_logits(model, prompt)).abs().max() <= exact_tolerance(model, prompt)
    if not gates:  # closed gates: T²MLR is its base model, so decoding must be the base model's
        base = _generate(model.base_decoder(), prompt, new=8)
        assert torch.equal(base.sequences, out.sequences)
        tolerance = exact_tolerance(model, out.sequences)
        assert (torch.stack(base.logits, 1) - torch.stack(out.logits, 1)).abs().max() <= tolerance


def test_open_gates_change_what_is_decoded() -> None:
    """Guard for the test above: with open gates the recurrence really changes the logits."""
    prompt = random_ids(1, 9)
    opened = _generate(tiny_model(dtype=torch.float32, gates=True), prompt)
    closed = _generate(tiny_model(dtype=torch.float32, gates=False), prompt)
    assert (torch.stack(opened.logits, 1) - torch.stack(closed.logits, 1)).abs().max() > 1e-2


# ----------------------------------------------------------------------------- padding and batches
@pytest.mark.parametrize("prefill", [dict(prefill="exact"), dict(prefill="jacobi", prefill_depth=2)], ids=["exact", "jacobi-2"])
def test_left_padded_batch_generation_equals_each_row_alone(prefill: dict) -> None:
    model = tiny_model(dtype=torch.float32)
    rows = [random_ids(1, n, seed=n)[0] for n in (5, 9, 3)]
    ids, mask = left_padded(rows)
    batch = _generate(model, ids, mask, new=7, **prefill)
    width = ids.shape[1]
    for i, row in enumerate(rows):
        alone = _generate(model, row[None], new=7, **prefill)
        assert torch.equal(batch.sequences[i, width:], alone.sequences[0, len(row) :])
        step_logits = torch.stack([step[i] for step in batch.logits])
        tolerance = exact_tolerance(model, alone.sequences)
        assert (step_logits - torch.stack(alone.logits, 1)[0]).abs().max() <= tolerance


# ----------------------------------------------------------------------------- beam search
BEAMS = dict(num_beams=4, length_penalty=0.0, output_scores=True, prefill="exact")


def _sequence_logprob(model: T2MLRForCausalLM, sequence: torch.Tensor, prompt_length: int) -> torch.Tensor:
    logprobs = torch.log_softmax(_exact_logits(model, sequence[None]).double(), dim=-1)[0]
    targets = sequence[prompt_length:]
    return logprobs[prompt_length - 1 : -1].gather(-1, targets[:, None]).sum()


def score_tolerance(model: T2MLRForCausalLM, sequences: torch.Tensor, prompt_length: int) -> float:
    """How far two float32 computations of the sequences' log-probabilities may differ (module docstring)."""
    return float32_tolerance(lambda dtype: torch.stack([_sequence_logprob(in_dtype(model, dtype), s, prompt_length)
                                                        for s in sequences]))


def test_beam_search_score_is_the_exact_sequence_logprob() -> None:
    model = tiny_model(dtype=torch.float32)
    prompt = random_ids(1, 7)
    out = _generate(model, prompt, new=6, **BEAMS)
    expected = float(_sequence_logprob(model, out.sequences[0], prompt.shape[1]))
    assert abs(float(out.sequences_scores[0]) - expected) <= score_tolerance(model, out.sequences[:1], prompt.shape[1])


def test_beam_search_gives_each_row_the_beams_it_gets_alone() -> None:
    model = tiny_model(dtype=torch.float32)
    rows = [random_ids(1, n, seed=10 + n)[0] for n in (4, 8)]
    ids, mask = left_padded(rows)
    batch = _generate(model, ids, mask, new=6, num_return_sequences=2, **BEAMS)
    width = ids.shape[1]
    for i, row in enumerate(rows):
        alone = _generate(model, row[None], new=6, num_return_sequences=2, **BEAMS)
        assert torch.equal(batch.sequences[2 * i : 2 * i + 2, width:], alone.sequences[:, len(row) :])
        tolerance = score_tolerance(model, alone.sequences, len(row))
        assert (batch.sequences_scores[2 * i : 2 * i + 2] - alone.sequences_scores).abs().max() <= tolerance


# ----------------------------------------------------------------------------- Jacobi prefill handoff
def _prefill(model: T2MLRForCausalLM, prompt: torch.Tensor, **path: Any) -> tuple[torch.Tensor, T2MLRCache]:
    cache = T2MLRCache(config=model.config)
    with torch.no_grad():
        logits = model(prompt, past_key_values=cache, use_cache=True, **path).logits
    return logits, cache


def test_jacobi_prefill_at_full_depth_hands_over_the_exact_state() -> None:
    model = tiny_model(dtype=torch.float32)
    prompt = random_ids(2, 8)
    for depth in (prompt.shape[1] + 1, prompt.shape[1] + 5):
        exact_logits, exact = _prefill(model, prompt, recurrence="exact")
        logits, cache = _prefill(model, prompt, recurrence="jacobi", d_forward=depth, d_backward=1)
        assert (logits[:, -1] - exact_logits[:, -1]).abs().max() <= exact_tolerance(model, prompt)
        assert cache.recurrent_states.shape == exact.recurrent_states.shape == (2, 8, model.config.hidden_size)
        states_tolerance = prefill_tolerance(model, prompt, lambda c: c.recurrent_states)
        assert (cache.recurrent_states - exact.recurrent_states).abs().max() <= states_tolerance
        for layer, (mine, ref) in enumerate(zip(cache.layers, exact.layers)):
            keys_tolerance = prefill_tolerance(model, prompt, lambda c: c.layers[layer].keys)
            values_tolerance = prefill_tolerance(model, prompt, lambda c: c.layers[layer].values)
            assert (mine.keys - ref.keys).abs().max() <= keys_tolerance
            assert (mine.values - ref.values).abs().max() <= values_tolerance
        step = random_ids(2, 1, seed=5)  # and the next decode step continues identically
        with torch.no_grad():
            after = model(step, past_key_values=cache, recurrence="exact").logits
            after_exact = model(step, past_key_values=exact, recurrence="exact").logits
        assert (after - after_exact).abs().max() <= exact_tolerance(model, torch.cat([prompt, step], dim=1))


def test_shallow_jacobi_prefill_is_an_approximation() -> None:
    """Guard: at depth 1 the handed-over state differs, so the full-depth test can fail."""
    model = tiny_model(dtype=torch.float32)
    prompt = random_ids(1, 8)
    _, exact = _prefill(model, prompt, recurrence="exact")
    _, shallow = _prefill(model, prompt, recurrence="jacobi", d_forward=1, d_backward=1)
    assert (shallow.recurrent_states - exact.recurrent_states).abs().max() > 1e-3


def test_jacobi_prefill_with_a_tolerance_stops_once_converged_and_decodes_exactly() -> None:
    model = tiny_model(dtype=torch.float32)
    prompt = random_ids(2, 8)
    with torch.no_grad():
        iterations = model(prompt, recurrence="jacobi", d_forward=40, d_backward=1, jacobi_tol=1e-6).jacobi_iterations
    assert iterations < 40  # converged: position t is exact after t iterations, so at most ~9 are needed
    out = _generate(model, prompt, new=5, prefill="jacobi", prefill_depth=40, prefill_tol=1e-6)
    exact, tolerance = _exact_logits(model, out.sequences), exact_tolerance(model, out.sequences)
    for step, logits in enumerate(out.logits):
        assert (logits - exact[:, prompt.shape[1] - 1 + step]).abs().max() <= tolerance
    with pytest.raises(ValueError, match="prefill_tol must be >= 0"):
        model.generate(prompt, max_new_tokens=1, prefill="jacobi", prefill_tol=-1.0)
    with pytest.raises(ValueError, match="apply to prefill='jacobi' only"):
        model.generate(prompt, max_new_tokens=1, prefill="exact", prefill_tol=1e-3)


@contextlib.contextmanager
def count_host_reads() -> Iterator[dict[str, int]]:
    """Counts tensor → Python conversions (each one a host sync on a GPU) while the block runs."""
    names = ("__bool__", "__int__", "__float__", "__index__", "item", "tolist")
    originals = {name: getattr(torch.Tensor, name) for name in names}
    counts = dict.fromkeys(names, 0)

    def counting(name: str) -> Any:
        def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return originals[name](self, *args, **kwargs)

        return read

    for name in names:
        setattr(torch.Tensor, name, counting(name))
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def test_a_decode_step_adds_one_host_read_to_the_base_models() -> None:
    """GPU decoding stalls at every host sync; T²MLR's input checks share one (the 1.03× target)."""
    model = tiny_model(dtype=torch.float32)
    prompt, step = random_ids(2, 6), random_ids(2, 1, seed=3)
    ours, theirs = T2MLRCache(config=model.config), DynamicCache(config=model.config.base_config)
    with torch.no_grad():
        model(prompt, past_key_values=ours, use_cache=True, recurrence="exact")
        model.base_decoder()(prompt, past_key_values=theirs, use_cache=True)
        mask = torch.ones(2, 7, dtype=torch.long)
        with count_host_reads() as t2mlr_reads:
            model(step, attention_mask=mask, past_key_values=ours, use_cache=True, recurrence="exact")
        with count_host_reads() as base_reads:
            model.base_decoder()(step, attention_mask=mask, past_key_values=theirs, use_cache=True)
    assert sum(t2mlr_reads.values()) == sum(base_reads.values()) + 1


# ----------------------------------------------------------------------------- expansion and cropping
def test_num_return_sequences_keeps_each_sample_on_its_own_state() -> None:
    model = tiny_model(dtype=torch.float32)
    rows = [random_ids(1, n, seed=20 + n)[0] for n in (6, 3)]
    ids, mask = left_padded(rows)
    torch.manual_seed(0)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=True,
        top_k=0,
        num_return_sequences=3,
        max_new_tokens=6,
        min_new_tokens=6,
        return_dict_in_generate=True,
        output_logits=True,
        pad_token_id=0,
        prefill="exact",
    )
    width = ids.shape[1]
    for r in range(6):
        row = rows[r // 3]
        sequence = torch.cat([row, out.sequences[r, width:]])[None]
        expected = _exact_logits(model, sequence)[0, len(row) - 1 : -1]
        tolerance = exact_tolerance(model, sequence)
        assert (torch.stack([step[r] for step in out.logits]) - expected).abs().max() <= tolerance
    assert len({tuple(s.tolist()) for s in out.sequences}) > 2  # the samples really differ


def test_cropped_cache_continues_as_if_never_extended() -> None:
    model = tiny_model(dtype=torch.float32)
    prompt, detour, path = random_ids(2, 6), random_ids(2, 4, seed=2), random_ids(2, 3, seed=3)
    _, cache = _prefill(model, torch.cat([prompt, detour], 1), recurrence="exact")
    cache.crop(-detour.shape[1])
    assert cache.get_seq_length() == cache.recurrent_states.shape[1] == prompt.shape[1]
    with torch.no_grad():
        resumed = model(path, past_key_values=cache, recurrence="exact").logits
    _, direct = _prefill(model, prompt, recurrence="exact")
    with torch.no_grad():
        straight = model(path, past_key_values=direct, recurrence="exact").logits
    assert (resumed - straight).abs().max() <= exact_tolerance(model, torch.cat([prompt, path], dim=1))
    states_tolerance = prefill_tolerance(model, prompt, lambda c: c.recurrent_states)
    assert (cache.recurrent_states - direct.recurrent_states).abs().max() <= states_tolerance


def test_prompt_lookup_decoding_crops_and_matches_plain_greedy() -> None:
    """Prompt-lookup (assisted) decoding verifies guessed tokens and crops the cache back to the accepted
    ones; with R cropped alongside the KV cache it must reproduce plain greedy decoding."""
    model = tiny_model(dtype=torch.float32, seed=2)
    ids = random_ids(1, 6, seed=2)
    prompt = torch.cat([ids, ids, ids[:, :3]], dim=1)  # repeated n-grams, so lookup proposes candidates
    crops: list[int] = []
    original = T2MLRCache.crop

    def counting_crop(self: T2MLRCache, tokens: int) -> None:
        crops.append(tokens)
        original(self, tokens)

    T2MLRCache.crop = counting_crop
    try:
        assisted = _generate(model, prompt, new=12, prompt_lookup_num_tokens=3, prefill="exact")
    finally:
        T2MLRCache.crop = original
    plain = _generate(model, prompt, new=12, prefill="exact")
    assert any(tokens < 0 for tokens in crops)  # some candidates were rejected and cropped away
    assert torch.equal(assisted.sequences, plain.sequences)


# ----------------------------------------------------------------------------- settings and the CLI
def test_generate_kwargs_pin_the_prefill_path() -> None:
    model = tiny_model(dtype=torch.float32)
    assert generate_kwargs(model, GenerationSettings(max_new_tokens=3))["prefill"] == "exact"
    jacobi = generate_kwargs(model, GenerationSettings(prefill="jacobi", prefill_depth=4))
    assert (jacobi["prefill"], jacobi["prefill_depth"], jacobi["prefill_tol"]) == ("jacobi", 4, None)
    assert generate_kwargs(model, GenerationSettings(prefill="jacobi", prefill_tol=1e-3))["prefill_tol"] == 1e-3
    with pytest.raises(ValueError, match="jacobi only"):
        generate_kwargs(model, GenerationSettings(prefill_tol=1e-3))
    with pytest.raises(ValueError, match="not a T²MLR model"):
        generate_kwargs(model.base_decoder(), GenerationSettings(prefill="jacobi"))
    with pytest.raises(ValueError, match="jacobi only"):
        generate_kwargs(model, GenerationSettings(prefill_depth=4))
    with pytest.raises(ValueError, match="need --do-sample"):
        generate_kwargs(model, GenerationSettings(top_p=0.9))
    compiled = generate_kwargs(model, GenerationSettings(compile="reduce-overhead"))
    assert compiled["cache_implementation"] == "static" and compiled["compile_config"].mode == "reduce-overhead"
    assert compiled["compile_config"].fullgraph and "cache_implementation" not in generate_kwargs(model, GenerationSettings())
    with pytest.raises(ValueError, match="compile must be one of"):
        generate_kwargs(model, GenerationSettings(compile="fast"))
    from t2mlr.generation.commands import COMPILE_CHOICES
    from t2mlr.generation.text import COMPILE_MODES
    assert COMPILE_CHOICES == COMPILE_MODES  # the CLI lists them without importing torch


def test_jacobi_prefill_then_assisted_decoding_continues_exactly() -> None:
    """Verification chunks after a Jacobi prefill run token by token on the exact path."""
    model = tiny_model(dtype=torch.float32, seed=2)
    ids = random_ids(1, 6, seed=2)
    prompt = torch.cat([ids, ids, ids[:, :3]], dim=1)  # repeats give prompt lookup candidates
    assisted = _generate(model, prompt, new=8, prefill="jacobi", prefill_depth=16, prompt_lookup_num_tokens=3)
    plain = _generate(model, prompt, new=8, prefill="exact")
    assert torch.equal(assisted.sequences, plain.sequences)


def test_masked_recurrence_model_generates_with_prompt_mask() -> None:
    """recurrence_mask_policy="mask": the prompt follows the given mask, generated tokens recur."""
    model = tiny_model(dtype=torch.float32, recurrence_mask_policy="mask")
    prompt = random_ids(2, 5)
    prompt_mask = torch.tensor([[False] * 5, [False, False, True, True, True]])
    out = _generate(model, prompt, new=4, recurrence_mask=prompt_mask)
    full_mask = torch.cat([prompt_mask, torch.ones(2, 4, dtype=torch.bool)], dim=1)
    logits = _exact_logits(model, out.sequences, recurrence_mask=full_mask)
    tolerance = exact_tolerance(model, out.sequences, recurrence_mask=full_mask)
    assert (torch.stack(out.logits, dim=1) - logits[:, 4:8]).abs().max() <= tolerance
    with pytest.raises(ValueError, match="pass generate"):
        _generate(model, prompt, new=2)


# The words of the shipped lm-eval toy task (tests/test_lm_eval.py reuses this tokenizer), 51 symbols.
WORDS = (
    "Question Answer : . what color is the sky blue green red grass how many legs has a dog two six four plus "
    "five three which animal says moo cat cow do bees make milk bread honey season cold winter summer spring "
    "frozen water steam ice sand"
).split()


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level tokenizer whose special ids match the tiny test configs (pad 0, bos 1, eos 2)."""
    vocab = ["<pad>", "<bos>", "<eos>", "<unk>", *WORDS]
    vocab += [f"w{i}" for i in range(VOCAB - len(vocab))]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


def save_model_dir(path: Path, with_tokenizer: bool = True, **model_kwargs: Any) -> Path:
    """A tiny float32 T²MLR model (gates open) saved with its tokenizer: what `t2mlr generate` and the
    lm-eval model load."""
    model = tiny_model(dtype=torch.float32, **model_kwargs)
    model.save_pretrained(path)
    if with_tokenizer:
        build_tokenizer().save_pretrained(path)
    return path


def _run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["generate", *argv])
    return args.func(args)


@pytest.mark.parametrize("prefill", [[], ["--prefill", "jacobi", "--prefill-depth", "16"], ["--compile", "default"]],
                         ids=["exact", "jacobi", "compiled static cache"])
def test_generate_command_streams_the_greedy_continuation(tmp_path, capsys, prefill: list[str]) -> None:
    model_dir = save_model_dir(tmp_path / "model")
    code = _run_cli([str(model_dir), "--prompt", "what color is the sky", "--max-new-tokens", "5", "--device", "cpu", *prefill])
    assert code == 0
    printed = capsys.readouterr().out.strip()
    tokenizer, model = build_tokenizer(), tiny_model(dtype=torch.float32)
    ids = torch.tensor([tokenizer.encode("what color is the sky")])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, **GREEDY, prefill="exact")
    assert printed == tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()


def test_generate_command_explains_a_missing_tokenizer(tmp_path, capsys) -> None:
    model_dir = save_model_dir(tmp_path / "model", with_tokenizer=False)
    assert _run_cli([str(model_dir), "--prompt", "what color"]) == 2
    assert "has no tokenizer" in capsys.readouterr().err
    assert _run_cli([str(tmp_path / "nowhere"), "--prompt", "x"]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("rank, shown", [(None, True), ("0", True), ("1", False)], ids=["alone", "rank 0", "rank 1"])
def test_batched_generation_shows_its_progress_bar_on_one_rank_only(monkeypatch, capsys, rank: str | None,
                                                                      shown: bool) -> None:
    """Under torchrun every rank generates a share of the batches; only rank 0 draws the bar, so N ranks do not
    print N copies of it (the replies are the same either way)."""
    from t2mlr.generation.text import generate_batched

    for name, value in (("RANK", rank), ("WORLD_SIZE", None if rank is None else "2")):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    replies = generate_batched(tiny_model(dtype=torch.float32), build_tokenizer(), ["what color", "how many legs"],
                               GenerationSettings(max_new_tokens=2), 1, desc="replies")
    assert len(replies) == 2
    assert ("replies" in capsys.readouterr().err) is shown
