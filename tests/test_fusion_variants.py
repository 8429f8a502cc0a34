"""The fusion variants beside the paper's gated Φ (`T2MLRConfig.fusion`, `t2mlr.model.fusion`).

Each variant is checked against its formula written out by hand (float64 matrix products from its own
weights), then on every path of a small float32 model whose fusion weights are all drawn at random (so Φ
is far from the identity): exact == Jacobi at depth T+1, decode with the cache == the full forward,
`generate`'s step logits == a full forward over its tokens, and a save/load round trip. The default
stays the paper's Φ with its checkpoint keys; a retrofit with a variant that is not the identity when
fresh is refused, one that is keeps the base model's logits.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import random_ids, tiny_base_config
from torch.nn import functional as F

from t2mlr import T2MLRConfig, T2MLRForCausalLM
from t2mlr.baselines.costs import DecoderShape, train_step_flops
from t2mlr.baselines.matching import t2mlr_parameter_count
from t2mlr.settings import FUSION_KINDS, GATE_PROJECTED_FUSIONS
from t2mlr.model.fusion import FUSIONS, GATE_PROJECTED, GatedFusion, build_fusion, fusion_multiply_adds
from t2mlr.training.config import ConfigError, load_config
from t2mlr.training.model_factory import gate_values
from t2mlr.training.sizing import fusion_token_bytes

pytestmark = pytest.mark.usefixtures("one_torch_thread")

EPS = 1e-6
# every variant, plus the settings that change a variant's maths (gate projection, R norm)
VARIANTS = [
    {"fusion": "gated"},
    {"fusion": "gated", "fusion_gate": "mlp", "fusion_r_norm": True},
    {"fusion": "none"},
    {"fusion": "constant", "fusion_weight": 0.7},
    {"fusion": "concat", "fusion_r_norm": True},
    {"fusion": "variance_normalized"},
    {"fusion": "variance_normalized", "fusion_gate": "mlp"},
    {"fusion": "alpha_coupled", "fusion_r_norm": True},
    {"fusion": "recurrent_only"},
    {"fusion": "bottleneck", "fusion_bottleneck": 5},
]
# the cache-update variants (`StateUpdate`), around the paper's Φ
CACHE_VARIANTS = [
    {"cache_residual_weight": 0.5},
    {"cache_residual_weight": -0.7, "cache_post_norm": False},
    {"cache_residual_detach": True},
    {"state_detach": True},
    {"cache_residual": False},
]


def variant_id(v: dict) -> str:
    settings = (f"{k.removeprefix('fusion_')}={x}" for k, x in v.items() if k != "fusion")
    return ",".join([v.get("fusion", "gated"), *settings])


IDS = [variant_id(v) for v in VARIANTS]


def config_of(hidden: int = 32, **fields) -> T2MLRConfig:
    return T2MLRConfig.from_base(tiny_base_config(hidden=hidden, rms_norm_eps=EPS), l_start=2, l_end=4, **fields)


def randomise(fusion: torch.nn.Module, seed: int = 3) -> None:
    """Every weight of Φ drawn at random (γ's and gains included), so no branch is closed."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in fusion.parameters():
            drawn = torch.randn(param.shape, generator=generator, dtype=torch.float64)
            param.copy_(drawn * 0.4 + (param.ndim < 2) * 0.5)


# ---------------------------------------------------------------------------------------------- by hand


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return x @ weight.T + (0 if bias is None else bias)


def gate_logits(p: dict[str, torch.Tensor], name: str, x: torch.Tensor, mlp: bool) -> torch.Tensor:
    if not mlp:
        return linear(x, p[f"{name}.weight"], p[f"{name}.bias"])
    hidden = linear(x, p[f"{name}.0.weight"], p[f"{name}.0.bias"])
    return linear(hidden * torch.sigmoid(hidden), p[f"{name}.2.weight"], p[f"{name}.2.bias"])


def by_hand(variant: dict, p: dict[str, torch.Tensor], h: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """The documented formula of each variant (docs/model.md), from the module's own weights."""
    kind, mlp = variant["fusion"], variant.get("fusion_gate") == "mlp"
    empty = (r == 0).all(-1, keepdim=True)
    if variant.get("fusion_r_norm"):
        r = r / torch.sqrt((r * r).mean(-1, keepdim=True) + EPS) * p["r_norm.weight"]
    hr = torch.cat([h, r], -1)
    if kind == "gated":
        cur = torch.sigmoid(gate_logits(p, "f_cur", hr, mlp)) * h
        rec = torch.sigmoid(gate_logits(p, "f_rec", hr, mlp)) * linear(r, p["w_rec.weight"])
        return h + math.tanh(p["gamma_cur"]) * cur + math.tanh(p["gamma_rec"]) * rec
    if kind == "none":
        return h
    if kind == "constant":
        return h + variant["fusion_weight"] * linear(r, p["w_rec.weight"])
    if kind == "concat":
        return linear(hr, p["proj.weight"])
    if kind in ("variance_normalized", "alpha_coupled"):
        alpha = torch.sigmoid(gate_logits(p, "f_alpha", hr, mlp))
        variance = kind == "variance_normalized"
        w_in, w_rec = (torch.sqrt(1 - alpha), torch.sqrt(alpha)) if variance else (1 - alpha, alpha)
        return w_in * h + w_rec * linear(r, p["w_rec.weight"])
    if kind == "recurrent_only":
        return torch.where(empty, h, linear(r, p["w_rec.weight"]))
    assert kind == "bottleneck"
    z = linear(F.gelu(linear(r, p["w_down.weight"])), p["w_up.weight"])
    z = (z - z.mean(-1, keepdim=True)) / torch.sqrt(z.var(-1, unbiased=False, keepdim=True) + EPS)
    return h + math.tanh(p["gamma_rec"]) * (z * p["norm.weight"] + p["norm.bias"])


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_each_variant_computes_its_formula(variant: dict) -> None:
    fusion = build_fusion(config_of(hidden=8, **variant)).double()
    randomise(fusion)
    generator = torch.Generator().manual_seed(5)
    h = torch.randn(2, 3, 8, generator=generator, dtype=torch.float64)
    r = torch.randn(2, 3, 8, generator=generator, dtype=torch.float64)
    r[1, 0] = 0  # a document's first token: R is the zero state
    params = {name: value.detach() for name, value in fusion.named_parameters()}
    expected = by_hand(variant, {k: (float(v) if v.ndim == 0 else v) for k, v in params.items()}, h, r)
    torch.testing.assert_close(fusion(h, r), expected, rtol=1e-10, atol=1e-10)
    if variant["fusion"] == "recurrent_only":  # the zero state keeps the token's own h, any other drops it
        assert torch.equal(fusion(h, r)[1, 0], h[1, 0]) and not torch.allclose(fusion(h, r)[0, 0], h[0, 0])


def test_every_variant_name_has_its_class_and_the_default_is_the_papers() -> None:
    assert set(FUSIONS) == set(FUSION_KINDS)
    assert {name for name, kind in FUSIONS.items() if issubclass(kind, GATE_PROJECTED)} == set(GATE_PROJECTED_FUSIONS)
    config = config_of()
    assert config.fusion == "gated" and isinstance(build_fusion(config), GatedFusion)
    keys = set(T2MLRForCausalLM(config).state_dict())
    assert {k for k in keys if ".fusion." in k} == {
        f"model.fusion.{name}" for name in ("f_cur.weight", "f_cur.bias", "f_rec.weight", "f_rec.bias", "w_rec.weight",
                                            "gamma_cur", "gamma_rec")}


# ---------------------------------------------------------------------------------------------- paths


def random_model(variant: dict) -> T2MLRForCausalLM:
    torch.manual_seed(0)
    model = T2MLRForCausalLM(config_of(**variant)).float().eval()
    randomise(model.fusion)
    return model


@pytest.mark.parametrize("variant", VARIANTS + CACHE_VARIANTS, ids=[variant_id(v) for v in VARIANTS + CACHE_VARIANTS])
def test_every_path_agrees_for_each_variant(variant: dict, tmp_path: Path) -> None:
    model = random_model(variant)
    ids = random_ids(2, 9)
    length = ids.shape[1]
    with torch.no_grad():
        exact = model(ids, recurrence="exact").logits
        jacobi = model(ids, recurrence="jacobi", d_forward=length + 1, d_backward=1).logits
        torch.testing.assert_close(jacobi, exact, rtol=1e-4, atol=1e-4)
        solved = model(ids, recurrence="exact", exact_solver="fixed_point", fixed_point_tol=1e-7, fixed_point_chunk=4)
        torch.testing.assert_close(solved.logits, exact, rtol=1e-4, atol=1e-4)
        if variant.get("fusion") != "none":  # R reaches the logits
            assert (model(ids, recurrence="off").logits - exact).abs().max() > 1e-2

        prompt = model(ids[:, :4], recurrence="exact", use_cache=True)
        steps, cache = [prompt.logits], prompt.past_key_values
        for t in range(4, length):
            out = model(ids[:, t : t + 1], past_key_values=cache, use_cache=True)
            steps.append(out.logits)
            cache = out.past_key_values
        torch.testing.assert_close(torch.cat(steps, dim=1), exact, rtol=1e-4, atol=1e-4)

        generated = model.generate(ids[:, :5], max_new_tokens=4, do_sample=False, output_logits=True,
                                   return_dict_in_generate=True, pad_token_id=0)
        full = model(generated.sequences, recurrence="exact").logits
        torch.testing.assert_close(torch.stack(generated.logits, dim=1), full[:, 4:-1], rtol=1e-4, atol=1e-4)

    model.save_pretrained(tmp_path)
    loaded = T2MLRForCausalLM.from_pretrained(tmp_path).eval()
    assert all(getattr(loaded.config, key) == value for key, value in variant.items())
    assert type(loaded.fusion) is type(model.fusion) and loaded.model.state_update == model.model.state_update
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, recurrence="exact").logits, exact, rtol=0, atol=0)
    saved_fusion = (tmp_path / "fusion.py").read_text()
    assert all(f"class {kind.__name__}(" in saved_fusion for kind in FUSIONS.values())  # the remote-code copy


def test_the_variants_train_on_the_jacobi_path() -> None:
    """Gradients reach every fusion parameter through the Jacobi path (the trainer's default)."""
    for variant in VARIANTS:
        if variant["fusion"] == "none":
            continue
        model = random_model(variant).train()
        ids = random_ids(2, 6)
        model(ids, labels=ids, recurrence="jacobi", d_forward=3, d_backward=2).loss.backward()
        for name, param in model.fusion.named_parameters():
            assert param.grad is not None and param.grad.abs().sum() > 0, (variant, name)


# ---------------------------------------------------------------------------------------------- retrofit


@pytest.mark.parametrize("fusion", ["gated", "none", "concat", "bottleneck"])
def test_a_retrofit_with_an_identity_variant_keeps_the_base_models_logits(fusion: str) -> None:
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    base = LlamaForCausalLM(tiny_base_config()).eval()
    ids = random_ids(2, 7)
    with torch.no_grad():
        expected = base(ids).logits
        model = T2MLRForCausalLM.from_base(base, 2, 4, fusion=fusion)
        torch.testing.assert_close(model(ids, recurrence="exact").logits, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("fields", [{"fusion": "recurrent_only"}, {"fusion": "alpha_coupled"},
                                    {"fusion": "variance_normalized"}, {"fusion": "constant"}])
def test_a_retrofit_with_a_variant_that_is_not_the_identity_is_refused(fields: dict) -> None:
    from transformers import LlamaForCausalLM

    base = LlamaForCausalLM(tiny_base_config())
    with pytest.raises(ValueError, match="not the identity when fresh.*retrofit with one that is"):
        T2MLRForCausalLM.from_base(base, 2, 4, **fields)
    T2MLRForCausalLM.from_base(base, 2, 4, fusion="constant", fusion_weight=0.0)  # c = 0 is the identity


# ---------------------------------------------------------------------------------------------- config language


@pytest.mark.parametrize(("fields", "message"), [
    ({"fusion": "gatd"}, "unknown fusion 'gatd'. Did you mean 'gated'.*Valid: gated, none, constant"),
    ({"fusion_gate": "conv"}, "fusion_gate must be one of"),
    ({"fusion": "concat", "fusion_gate": "mlp"}, "fusion='concat' has none: leave fusion_gate='linear'"),
    ({"fusion": "none", "fusion_r_norm": True}, "does not read R"),
    ({"fusion_r_norm": 1}, "fusion_r_norm must be a bool"),
    ({"fusion_weight": 0.5}, "fusion_weight is the fixed c of fusion='constant'"),
    ({"fusion": "constant", "fusion_weight": float("nan")}, "fusion_weight must be a finite number"),
    ({"fusion_bottleneck": 4}, "fusion_bottleneck is the width of fusion='bottleneck'"),
    ({"fusion": "bottleneck", "fusion_bottleneck": 0}, "fusion_bottleneck must be >= 1"),
])
def test_bad_fusion_settings_are_refused_with_the_fix(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config_of(**fields)


def test_the_trainer_spells_the_variant_and_refuses_a_misspelt_one() -> None:
    config = load_config("debug", ["model.fusion=alpha_coupled", "model.fusion_gate=mlp", "model.fusion_r_norm=true"])
    assert config.model.settings["fusion"] == "alpha_coupled"
    with pytest.raises(ConfigError, match="model.fusion: must be one of .*'alpha_coupled'.*got 'alpha_couple'"):
        load_config("debug", ["model.fusion=alpha_couple"])


def test_the_trainer_refuses_a_retrofit_with_a_variant_that_is_not_the_identity() -> None:
    overrides = ["model.base=null", "model.pretrained=some/model", "model.fusion=recurrent_only"]
    with pytest.raises(ConfigError, match="model.pretrained with model.fusion: fusion='recurrent_only'"):
        load_config("debug", overrides)


def test_the_dry_run_sizes_a_variant(capsys: pytest.CaptureFixture) -> None:
    from t2mlr.cli import main as cli_main

    code = cli_main(["train", "debug", "--dry-run", "--gpu", "h100", "model.fusion=bottleneck"])
    assert code == 0, capsys.readouterr().err
    assert "parameters" in capsys.readouterr().out
    assert cli_main(["train", "debug", "--dry-run", "--gpu", "h100", "model.fusion=bottlenek"]) == 2


# ---------------------------------------------------------------------------------------------- readers


def test_flops_parameters_and_activations_follow_the_variant() -> None:
    d = 32
    counts = {name: fusion_multiply_adds(config_of(**fields)) for name, fields in zip(IDS, VARIANTS)}
    assert counts["gated"] == 5 * d * d and counts["none"] == 0 and counts["concat,r_norm=True"] == 2 * d * d
    assert counts["gated,gate=mlp,r_norm=True"] == 2 * (2 * d * d + d * d) + d * d
    assert counts["bottleneck,bottleneck=5"] == 2 * d * 5
    gated, none = config_of(), config_of(fusion="none")
    assert DecoderShape.of(gated).fusion(7) == 10 * 7 * d * d  # the paper's Φ, as before
    fused_passes = gated.d_forward + 2 * (gated.d_backward + 1)  # forward fusions; twice the gradient-carrying ones
    assert train_step_flops(gated, 16) - train_step_flops(none, 16) == pytest.approx(fused_passes * 10 * 16 * d * d)
    base_count = t2mlr_parameter_count(none)
    assert t2mlr_parameter_count(gated) - base_count == 5 * d * d + 2 * d + 2  # f_cur, f_rec, W_rec, biases, γ's
    for fields in VARIANTS:
        assert fusion_token_bytes(config_of(**fields), 4) > 0


def test_the_gates_are_read_where_a_variant_has_them() -> None:
    assert set(gate_values(random_model({"fusion": "gated"}))) == {"gamma_cur", "gamma_rec"}
    assert set(gate_values(random_model({"fusion": "bottleneck"}))) == {"gamma_rec"}
    assert gate_values(random_model({"fusion": "concat"})) == {}
    model = random_model({"fusion": "bottleneck"}).to(torch.bfloat16)
    assert model.fusion.gamma_rec.dtype == torch.float32  # kept wide, as the paper's γ's


REMOTE_LOAD = """
import sys, torch
from transformers import AutoModelForCausalLM
torch.set_num_threads(1)
ids = torch.load(IDS)
logits = {}
for name in NAMES:
    model = AutoModelForCausalLM.from_pretrained(f"{SAVED}/{name}", trust_remote_code=True).eval()
    with torch.no_grad():
        logits[name] = (model(ids, recurrence="exact").logits, model(ids, recurrence="jacobi", d_forward=8).logits)
assert "t2mlr" not in sys.modules
torch.save(logits, OUT)
"""


@pytest.mark.slow
def test_the_remote_code_copy_computes_each_variant_without_t2mlr(tmp_path: Path) -> None:
    """A saved variant loads with `trust_remote_code=True` where t2mlr is not installed, and computes the
    library's logits (the copy of `t2mlr.model.fusion` carries every variant)."""
    from test_model_remote_code import environment_without_t2mlr, run_isolated

    python = environment_without_t2mlr(tmp_path / "env")
    variants = {name: fields for name, fields in zip(IDS, VARIANTS) if fields["fusion"] != "gated"}
    ids = random_ids(2, 7)
    torch.save(ids, tmp_path / "ids.pt")
    expected = {}
    for name, fields in variants.items():
        model = random_model(fields)
        model.save_pretrained(tmp_path / "saved" / name)
        with torch.no_grad():
            expected[name] = model(ids, recurrence="exact").logits
    settings = {"SAVED": str(tmp_path / "saved"), "IDS": str(tmp_path / "ids.pt"), "OUT": str(tmp_path / "out.pt"),
                "NAMES": list(variants)}
    done = run_isolated(python, "\n".join(f"{k} = {v!r}" for k, v in settings.items()) + REMOTE_LOAD, tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    got = torch.load(tmp_path / "out.pt")
    for name, logits in expected.items():
        exact, jacobi = got[name]
        torch.testing.assert_close(exact, logits, rtol=0, atol=1e-5, msg=name)
        torch.testing.assert_close(jacobi, logits, rtol=1e-4, atol=1e-4, msg=name)


# ---------------------------------------------------------------------------------------------- cache update


def rms_normed(x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + EPS) * gain


@pytest.mark.parametrize("fields", CACHE_VARIANTS, ids=[variant_id(v) for v in CACHE_VARIANTS])
def test_each_cache_update_writes_its_formula(fields: dict) -> None:
    """R_t = RMSNorm(h_t + w·R_{t-1}) (or without the norm, or h_t alone), with the gradient each detach
    leaves: checked on the model's own `_write_state` against the formula by hand."""
    model = T2MLRForCausalLM(config_of(**fields)).double()
    backbone = model.model
    if backbone.cache_norm is not None:
        with torch.no_grad():
            backbone.cache_norm.weight.uniform_(0.5, 1.5)
    generator = torch.Generator().manual_seed(2)
    h = torch.randn(2, 5, 32, generator=generator, dtype=torch.float64, requires_grad=True)
    r = torch.randn(2, 5, 32, generator=generator, dtype=torch.float64, requires_grad=True)
    real = torch.ones(2, 5, dtype=torch.bool)
    written = backbone._write_state(h, r, real)

    w = fields.get("cache_residual_weight", 1.0)
    expected = h + w * r if fields.get("cache_residual", True) else h
    if fields.get("cache_post_norm", True) and fields.get("cache_residual", True):
        expected = rms_normed(expected, backbone.cache_norm.weight)
    torch.testing.assert_close(written, expected, rtol=1e-12, atol=1e-12)
    normed = fields.get("cache_post_norm", True) and fields.get("cache_residual", True)
    assert (backbone.cache_norm is None) == (not normed)

    grad_h, grad_r = torch.autograd.grad(written.sum(), (h, r), allow_unused=True)
    if fields.get("state_detach"):  # R is written without gradient (padding would still pass R through)
        assert all(g is None or not g.abs().any() for g in (grad_h, grad_r))
        return
    grad_h_hand, grad_r_hand = torch.autograd.grad(expected.sum(), (h, r), allow_unused=True)
    torch.testing.assert_close(grad_h, grad_h_hand)
    if fields.get("cache_residual_detach") or not fields.get("cache_residual", True):
        assert grad_r is None or not grad_r.abs().any()  # the previous state gets no gradient from the update
    else:
        torch.testing.assert_close(grad_r, grad_r_hand)


def test_with_the_state_detached_the_jacobi_gradient_is_the_exact_paths() -> None:
    """No gradient crosses tokens through R, on either path: the converged Jacobi path's weight gradients
    equal the exact path's, whatever d_backward (with R connected they would not)."""
    ids = random_ids(2, 6)

    def gradients(recurrence: str, **path) -> dict[str, torch.Tensor]:
        model = random_model({"state_detach": True}).double().train()
        model(ids, labels=ids, recurrence=recurrence, **path).loss.backward()
        return {name: p.grad for name, p in model.named_parameters() if p.grad is not None}

    exact = gradients("exact")
    for d_backward in (1, 3):
        jacobi = gradients("jacobi", d_forward=7, d_backward=d_backward)
        assert exact.keys() == jacobi.keys()
        for name in exact:
            torch.testing.assert_close(jacobi[name], exact[name], rtol=1e-9, atol=1e-11, msg=name)


@pytest.mark.parametrize(("fields", "message"), [
    ({"cache_residual": False, "cache_residual_weight": 0.5}, "cache_residual_weight=0.5 shape"),
    ({"cache_residual": False, "cache_post_norm": False}, "cache_residual=False writes R_t = h_t"),
    ({"cache_residual_detach": "yes"}, "cache_residual_detach must be a bool"),
    ({"state_detach": 1}, "state_detach must be a bool"),
    ({"cache_residual_weight": float("inf")}, "cache_residual_weight must be a finite number"),
])
def test_bad_cache_update_settings_are_refused(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config_of(**fields)
