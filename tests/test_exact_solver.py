"""The exact path's fixed-point solver (`exact_solver="fixed_point"` / `"auto"`) against the sequential token loop
(the definition, `exact_solver="sequential"`): the same logits, recurrent states, KV cache, hidden states and
truncated-BPTT gradients on padded, packed and cache-continued chunks, in float32 with the gates open; settled
spans, spans that hit the cap (the sequential step finishing them) and spans of uneven length; the report of
what ran; and the refusals of settings and situations the solver cannot honour."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from t2mlr import T2MLRCache
from t2mlr.model.cache import T2MLRStaticCache
from tests.conftest import left_padded, random_ids, tiny_model

VALUE_TOL = 1e-5  # float32 logits of a 5-block model: the solvers differ only in summation order or settled R
GRADIENT_TOL = 1e-6
SETTLED = 1e-7  # a tolerance tighter than float32 can move R by: every span runs until it is exact


def fp32_model(**kwargs):
    return tiny_model(dtype=torch.float32, **kwargs)


def exact_forward(model, ids, solver: str = "sequential", **inputs):
    cache = T2MLRCache(config=model.config)
    with torch.no_grad():
        out = model(ids, recurrence="exact", exact_solver=solver, past_key_values=cache, use_cache=True, **inputs)
    return out, cache


def assert_same_forward(solved, reference, real: torch.Tensor | None = None) -> None:
    """Logits, R and every block's keys and values equal at the real tokens (`real`: the attention mask; a
    padding query attends to nothing real, so what it computes is not defined by either solver)."""
    (out, cache), (ref_out, ref_cache) = solved, reference
    keep = torch.ones(out.logits.shape[:2], dtype=torch.bool) if real is None else real.bool()
    torch.testing.assert_close(out.logits[keep], ref_out.logits[keep], atol=VALUE_TOL, rtol=0)
    torch.testing.assert_close(cache.recurrent_states, ref_cache.recurrent_states, atol=VALUE_TOL, rtol=0)
    for layer, ref_layer in zip(cache.layers, ref_cache.layers):
        torch.testing.assert_close(layer.keys.transpose(1, 2)[keep], ref_layer.keys.transpose(1, 2)[keep],
                                   atol=VALUE_TOL, rtol=0)
        torch.testing.assert_close(layer.values.transpose(1, 2)[keep], ref_layer.values.transpose(1, 2)[keep],
                                   atol=VALUE_TOL, rtol=0)


def assert_gates_matter(model, ids, reference_logits, **inputs) -> None:
    """The comparison means something: with the recurrence off the logits move far beyond the tolerance."""
    with torch.no_grad():
        off = model(ids, recurrence="off", **inputs).logits
    assert (off - reference_logits).abs().max() > 100 * VALUE_TOL


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("chunk, cap", [(4, 16), (5, 2), (11, 16)])
def test_fixed_point_equals_sequential_on_a_padded_batch(attn, chunk, cap):
    model = fp32_model(fixed_point_chunk=chunk, fixed_point_cap=cap, fixed_point_tol=SETTLED)
    model.set_attn_implementation(attn)
    ids, mask = left_padded([random_ids(1, 11, seed=2)[0], random_ids(1, 7, seed=3)[0], random_ids(1, 9, seed=4)[0]])
    reference = exact_forward(model, ids, attention_mask=mask)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the cap-2 case falls back (its own test checks the warning)
        solved = exact_forward(model, ids, "fixed_point", attention_mask=mask)
    assert_same_forward(solved, reference, mask)
    assert_gates_matter(model, ids, reference[0].logits, attention_mask=mask)
    report = solved[0].exact_solve
    assert report.solver == "fixed_point" and sum(report.lengths) == 11
    assert report.lengths == [min(chunk, 11 - start) for start in range(0, 11, chunk)]
    assert all(1 <= passes <= min(cap, length) for passes, length in zip(report.passes, report.lengths) if length > 1)
    assert reference[0].exact_solve.solver == "sequential"


def test_fixed_point_equals_sequential_on_packed_rows():
    model = fp32_model(fixed_point_chunk=4, fixed_point_tol=SETTLED)
    ids = random_ids(2, 12, seed=5)
    documents = torch.tensor([[0] * 5 + [1] * 4 + [2] * 3, [0] * 12])
    reference = exact_forward(model, ids, document_ids=documents)
    solved = exact_forward(model, ids, "fixed_point", document_ids=documents)
    assert_same_forward(solved, reference)
    alone = exact_forward(model, ids[:1, 5:9])[0].logits  # a packed document is computed as if alone
    torch.testing.assert_close(solved[0].logits[:1, 5:9], alone, atol=VALUE_TOL, rtol=0)


def test_fixed_point_continues_a_cache_and_generates_the_same_tokens():
    model = fp32_model(fixed_point_chunk=3, fixed_point_tol=SETTLED)
    ids = random_ids(2, 14, seed=6)
    reference = exact_forward(model, ids)
    cache = T2MLRCache(config=model.config)
    with torch.no_grad():
        first = model(ids[:, :6], recurrence="exact", past_key_values=cache, use_cache=True)
        second = model(ids[:, 6:], recurrence="exact", exact_solver="fixed_point", past_key_values=cache, use_cache=True)
    torch.testing.assert_close(torch.cat([first.logits, second.logits], 1), reference[0].logits, atol=VALUE_TOL, rtol=0)
    torch.testing.assert_close(cache.recurrent_states, reference[1].recurrent_states, atol=VALUE_TOL, rtol=0)
    model.config.exact_solver = "auto"
    solved = model.generate(ids[:, :9], max_new_tokens=6, do_sample=False)
    model.config.exact_solver = "sequential"
    assert torch.equal(solved, model.generate(ids[:, :9], max_new_tokens=6, do_sample=False))


def test_fixed_point_returns_the_same_hidden_states():
    model = fp32_model(fixed_point_chunk=4, fixed_point_cap=2, fixed_point_tol=SETTLED)
    ids = random_ids(2, 10, seed=7)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = model(ids, recurrence="exact", output_hidden_states=True).hidden_states
        solved = model(ids, recurrence="exact", exact_solver="fixed_point", output_hidden_states=True).hidden_states
    assert len(solved) == len(reference)
    for layer, ref_layer in zip(solved, reference):
        torch.testing.assert_close(layer, ref_layer, atol=VALUE_TOL, rtol=0)


def test_truncated_bptt_gradients_are_unchanged_with_the_fixed_point_solver():
    ids = random_ids(2, 9, seed=8)
    gradients = []
    for solver in ("sequential", "fixed_point"):
        model = fp32_model(fixed_point_chunk=4, fixed_point_tol=SETTLED).train()
        loss = model(ids, labels=ids, recurrence="exact", bptt_window=2, exact_solver=solver).loss
        loss.backward()
        gradients.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    assert gradients[0].keys() == gradients[1].keys()
    for name in gradients[0]:
        torch.testing.assert_close(gradients[1][name], gradients[0][name], atol=GRADIENT_TOL, rtol=1e-5)


def test_a_span_whose_states_are_exact_after_the_seed_settles_in_one_pass():
    """With the gates closed Φ(h, r) = h, and without the cache residual R_t = h_t: nothing depends on R, so the
    seed pass writes the exact R and the first fused pass moves it by nothing (the early stop fires)."""
    model = fp32_model(gates=False, cache_residual=False, fixed_point_chunk=8)
    ids = random_ids(2, 16, seed=9)
    reference = exact_forward(model, ids)
    solved = exact_forward(model, ids, "fixed_point")
    assert solved[0].exact_solve.passes == [1, 1]  # one fused pass reads the seed's R, which is already exact
    assert_same_forward(solved, reference)


def test_a_span_that_hits_the_cap_warns_once_and_auto_goes_sequential():
    model = fp32_model(fixed_point_chunk=4, fixed_point_cap=2, fixed_point_tol=SETTLED)
    ids = random_ids(1, 12, seed=10)
    reference = exact_forward(model, ids)
    with pytest.warns(UserWarning, match="had not settled") as caught:
        fixed = exact_forward(model, ids, "fixed_point")
    assert len(caught) == 1
    assert caught[0].filename == __file__  # the warning names the caller's line, not the library's
    assert fixed[0].exact_solve.summary()["fallback_chunks"] == 3
    assert fixed[0].exact_solve.sequential_tokens == [2, 2, 2]
    with pytest.warns(UserWarning, match="rest of the forward ran sequentially"):
        auto = exact_forward(model, ids, "auto")
    assert auto[0].exact_solve.passes == [2, 0, 0]
    assert auto[0].exact_solve.sequential_tokens == [2, 4, 4]
    assert_same_forward(fixed, reference)
    assert_same_forward(auto, reference)


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"exact_solver": "fixedpoint"}, "exact_solver must be one of"),
        ({"fixed_point_tol": 0.0}, "fixed_point_tol must be a finite number > 0"),
        ({"fixed_point_tol": math.nan}, "fixed_point_tol must be a finite number > 0"),
        ({"fixed_point_tol": -1e-3}, "fixed_point_tol must be a finite number > 0"),
        ({"fixed_point_chunk": 1}, "fixed_point_chunk must be >= 2"),
        ({"fixed_point_chunk": 13}, "longer than this forward's 12 tokens"),
    ],
)
def test_settings_that_cannot_be_honoured_are_refused_before_compute(setting, message, monkeypatch):
    model = fp32_model()
    monkeypatch.setattr(type(model.model), "_solved_exact_middle", lambda *a, **k: pytest.fail("computed"))
    with torch.no_grad(), pytest.raises(ValueError, match=message):
        model(random_ids(1, 12), recurrence="exact", **{"exact_solver": "fixed_point", **setting})


@pytest.mark.parametrize("field, value", [("fixed_point_cap", 0), ("fixed_point_chunk", 0), ("exact_solver", "x")])
def test_config_settings_are_checked(field, value):
    with pytest.raises(ValueError, match=field):
        fp32_model(**{field: value})


def test_where_fixed_point_cannot_run_it_is_refused_and_auto_runs_sequentially():
    model = fp32_model()
    ids = random_ids(1, 8)
    with pytest.raises(ValueError, match="without gradients"):
        model(ids, recurrence="exact", exact_solver="fixed_point")
    model.set_attn_implementation("eager")
    with torch.no_grad():
        with pytest.raises(ValueError, match="output_attentions"):
            model(ids, recurrence="exact", exact_solver="fixed_point", output_attentions=True)
        static = T2MLRStaticCache(config=model.config, max_cache_len=16)
        with pytest.raises(ValueError, match="static cache"):
            model(ids, recurrence="exact", exact_solver="fixed_point", past_key_values=static)
        report = model(ids, recurrence="exact", exact_solver="auto", output_attentions=True).exact_solve
        assert report.solver == "sequential"
    assert model(ids, recurrence="exact", exact_solver="auto").exact_solve.solver == "sequential"  # gradients on
    with torch.no_grad():
        assert model(ids[:, :1], recurrence="exact", exact_solver="fixed_point").exact_solve.solver == "sequential"
        assert model(ids, recurrence="jacobi").exact_solve is None


def test_the_trainer_evaluates_with_the_configured_solver_and_records_what_ran(tmp_path):
    """`t2mlr train ... model.exact_solver=fixed_point`: the evaluation's loss is the sequential loop's (to the
    tolerance) and its record names the solver and the passes it took."""
    from t2mlr.training.config import load_config
    from t2mlr.training.trainer import Trainer

    settings = [
        "model.base.hidden_size=32", "model.base.intermediate_size=64", "model.base.num_hidden_layers=3",
        "model.base.vocab_size=32", "model.l_start=2", "model.l_end=3", "model.eval_recurrence=exact",
        "data.seq_len=24", "data.kwargs.vocab_size=32", "data.kwargs.num_samples=16", "eval.every=5",
        "train.global_batch_size=4", "train.micro_batch_size=4", "train.max_steps=1", "logging.progress_bar=false",
        "checkpoint.every=0", "checkpoint.save_final=false", "model.fixed_point_chunk=8", "model.fixed_point_tol=1e-7",
        "eval.data.seq_len=24", "eval.data.kwargs.vocab_size=32", "eval.max_batches=2", "eval.batch_size=4",
    ]
    results = {}
    for solver in ("sequential", "fixed_point"):
        trainer = Trainer(load_config("debug", settings + [f"model.exact_solver={solver}"]), tmp_path / solver)
        results[solver] = trainer.evaluate()
    assert results["sequential"]["eval_exact_solve"] is None  # the path's description names the sequential loop
    solved = results["fixed_point"]["eval_exact_solve"]
    assert solved["solvers"] == ["fixed_point"] and solved["chunks"] == 3 * solved["forwards"]
    assert 1 <= solved["mean_passes"] <= solved["max_passes"] <= 8
    assert results["fixed_point"]["eval_loss"] == pytest.approx(results["sequential"]["eval_loss"], abs=VALUE_TOL)


def test_generate_with_a_fixed_point_prefill_decodes_the_exact_prefills_tokens():
    from t2mlr.generation.text import GenerationSettings, generate_kwargs

    model = fp32_model(fixed_point_chunk=4)
    prompt = random_ids(2, 11, seed=11)
    exact = model.generate(prompt, max_new_tokens=5, do_sample=False, prefill="exact")
    solved = model.generate(prompt, max_new_tokens=5, do_sample=False, prefill="fixed_point", prefill_tol=SETTLED)
    assert torch.equal(solved, exact)
    kwargs = generate_kwargs(model, GenerationSettings(max_new_tokens=2, prefill="fixed_point", prefill_tol=1e-3))
    assert (kwargs["prefill"], kwargs["prefill_tol"]) == ("fixed_point", 1e-3)
    with pytest.raises(ValueError, match="apply to prefill='jacobi' only"):
        model.generate(prompt, max_new_tokens=1, prefill="fixed_point", prefill_depth=4)
    with pytest.raises(ValueError, match="fixed_point_tol must be a finite number > 0"):
        model.generate(prompt, max_new_tokens=1, prefill="fixed_point", prefill_tol=0.0)
