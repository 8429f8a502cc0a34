"""Config validation, input errors, save/load and retrofitting."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import random_ids, tiny_base_config, tiny_model
from rounding import forward_tolerance
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config, LlamaConfig, LlamaForCausalLM

from t2mlr import T2MLRConfig, T2MLRForCausalLM
from t2mlr.model.checkpoint_keys import current_key


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(l_start=3, l_end=2), "l_start <= l_end"),
        (dict(l_start=0, l_end=2), "1 <= l_start"),
        (dict(l_start=2, l_end=6), "<= 5"),
        (dict(l_start=2, l_end=3, d_forward=0), "d_forward must be >= 1"),
        (dict(l_start=2, l_end=3, d_forward=2, d_backward=3), "d_backward"),
        (dict(l_start=2, l_end=3, d_backward=0), "d_backward"),
        (dict(l_start=2, l_end=3, train_recurrence="parallel"), "train_recurrence must be one of"),
        (dict(l_start=2, l_end=3, eval_recurrence="fast"), "eval_recurrence must be one of"),
        (dict(l_start=2, l_end=3, recurrence_mask_policy="some"), "recurrence_mask_policy"),
        (dict(l_start=2.0, l_end=3), "must be an int"),
    ],
)
def test_bad_config_values_raise_clear_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        T2MLRConfig.from_base(tiny_base_config(), **kwargs)


def test_unsupported_base_model_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot wrap base model type 'gpt2'"):
        T2MLRConfig.from_base(GPT2Config(n_layer=2), l_start=1, l_end=1)


def test_bad_inputs_raise_clear_errors(model64) -> None:
    ids = random_ids(1, 6)
    with pytest.raises(ValueError, match="integer tensor"):
        model64(ids.float())
    with pytest.raises(ValueError, match="limit of 256 positions"):
        model64(random_ids(1, 257))
    with pytest.raises(ValueError, match="token ids must lie in"):
        model64(ids + 1000)
    with pytest.raises(ValueError, match="attention_mask must be 2D"):
        model64(ids, attention_mask=torch.ones(1, 5))
    with pytest.raises(ValueError, match="recurrence must be one of"):
        model64(ids, recurrence="fast")
    with pytest.raises(ValueError, match="d_backward"):
        model64(ids, recurrence="jacobi", d_forward=2, d_backward=5)
    with pytest.raises(ValueError, match="recurrence_mask_policy='all'"):
        model64(ids, recurrence_mask=torch.ones(1, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="T2MLRCache"):
        from transformers import DynamicCache

        model64(ids, past_key_values=DynamicCache())


@pytest.mark.parametrize("tied", [True, False])
def test_save_load_round_trip(tmp_path, tied: bool) -> None:
    model = tiny_model(base_overrides=dict(tie_word_embeddings=tied), dtype=torch.float32)
    ids = random_ids(2, 9)
    with torch.no_grad():
        expected = model(ids, recurrence="jacobi", d_forward=3, d_backward=1).logits
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    for loader in (T2MLRForCausalLM, AutoModelForCausalLM):
        loaded = loader.from_pretrained(tmp_path).eval()
        assert isinstance(loaded, T2MLRForCausalLM)
        assert loaded.config.l_start == 2 and loaded.config.l_end == 4
        with torch.no_grad():
            got = loaded(ids, recurrence="jacobi", d_forward=3, d_backward=1).logits
        assert torch.equal(got, expected), loader.__name__
        if tied:
            assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()


def test_retrofit_from_model_and_from_path_keeps_base_logits(tmp_path) -> None:
    torch.manual_seed(3)
    base = LlamaForCausalLM(tiny_base_config()).eval()
    ids = random_ids(2, 10)
    with torch.no_grad():
        expected = base(ids).logits.clone()
    base.save_pretrained(tmp_path / "base")
    from_path = T2MLRForCausalLM.from_base(str(tmp_path / "base"), l_start=2, l_end=3).eval()
    from_object = T2MLRForCausalLM.from_base(base, l_start=2, l_end=3).eval()
    tolerance = forward_tolerance(base, ids)  # the wrapped blocks are another float32 computation of the logits
    for model in (from_path, from_object):
        for path in ("exact", "jacobi", "off"):
            with torch.no_grad():
                got = model(ids, recurrence=path, d_forward=4, d_backward=1).logits
            assert torch.allclose(got, expected, atol=tolerance, rtol=0), path
    assert from_path.fusion.gamma_rec.item() == 0.0


def test_a_checkpoint_saved_by_version_0_1_0_still_loads_and_computes_the_same() -> None:
    """tests/fixtures/t2mlr_v0_1_0: saved by the release before the model package was split, with its
    exact and Jacobi logits and a greedy continuation recorded by that release on this very directory.

    Logits are compared to float32 rounding, not bitwise: another CPU's kernels round differently (4.5e-8 apart
    on an AMD EPYC), so `rounding.MARGIN` times float32's own gap to float64 on each path here is allowed (a few
    1e-7; the logits are at most ~0.4), while any change of semantics moves them far more."""
    fixture = Path(__file__).parent / "fixtures" / "t2mlr_v0_1_0"
    expected = torch.load(fixture / "expected_outputs.pt")
    model = AutoModelForCausalLM.from_pretrained(fixture).eval()
    ids = expected["input_ids"]
    with torch.no_grad():
        exact = model(ids, recurrence="exact").logits
        jacobi = model(ids, recurrence="jacobi", d_forward=3, d_backward=1).logits
    torch.testing.assert_close(exact, expected["exact"], atol=forward_tolerance(model, ids, recurrence="exact"), rtol=0)
    jacobi_tolerance = forward_tolerance(model, ids, recurrence="jacobi", d_forward=3, d_backward=1)
    torch.testing.assert_close(jacobi, expected["jacobi_d3"], atol=jacobi_tolerance, rtol=0)
    with torch.no_grad():
        assert torch.equal(model.generate(ids[:1], max_new_tokens=6, do_sample=False), expected["greedy"])


def test_a_0_1_0_checkpoint_resaves_in_the_backbone_layout(tmp_path: Path) -> None:
    """Loading maps the 0.1 names (`base.model.*`, `fusion.*`, `cache_norm.*`); saving writes today's
    (`model.*` plus `lm_head`), and the re-saved directory computes the same logits."""
    fixture = Path(__file__).parent / "fixtures" / "t2mlr_v0_1_0"
    with safe_open(fixture / "model.safetensors", "pt") as old:
        old_names = set(old.keys())
    assert any(name.startswith("base.model.") for name in old_names)  # the fixture really is the old layout
    model = AutoModelForCausalLM.from_pretrained(fixture).eval()
    model.save_pretrained(tmp_path / "resaved")
    with safe_open(tmp_path / "resaved" / "model.safetensors", "pt") as new:
        new_names = set(new.keys())
    assert new_names == {current_key(name) for name in old_names}
    assert "model.fusion.gamma_rec" in new_names and not any(name.startswith("base.") for name in new_names)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "resaved").eval()
    ids = torch.load(fixture / "expected_outputs.pt")["input_ids"]
    with torch.no_grad():
        assert torch.equal(reloaded(ids, recurrence="exact").logits, model(ids, recurrence="exact").logits)


def _load_in_fresh_process(directory: Path, code: str) -> subprocess.CompletedProcess:
    """Run `code` (with DIR bound to `directory`) in a new interpreter, as a user's script would."""
    probe = f"from pathlib import Path\nDIR = Path({str(directory)!r})\n{code}"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("saved") / "tiny"
    tiny_model().save_pretrained(directory)
    return directory


@pytest.mark.slow
def test_importing_the_model_registers_the_auto_classes_and_a_bare_import_stays_light(
    saved_tiny: Path, tmp_path: Path
) -> None:
    """`import t2mlr` loads neither torch nor transformers and registers nothing; importing the model package
    registers AutoConfig, AutoModel and AutoModelForCausalLM. The directory's remote-code modules are removed,
    so nothing else could help; without them a bare import leaves transformers asking for remote code."""
    bare = tmp_path / "bare"
    shutil.copytree(saved_tiny, bare)
    for module in bare.glob("*.py"):
        module.unlink()
    out = _load_in_fresh_process(bare, (
        "import sys\nimport t2mlr\nprint('LOADED', sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
        "import t2mlr.model\n"
        "from transformers import AutoConfig, AutoModel, AutoModelForCausalLM\n"
        "print(type(AutoConfig.from_pretrained(DIR)).__name__, type(AutoModel.from_pretrained(DIR)).__name__,\n"
        "      type(AutoModelForCausalLM.from_pretrained(DIR)).__name__)\n"
    ))
    assert out.returncode == 0, out.stderr
    assert "LOADED []" in out.stdout and "T2MLRConfig T2MLRModel T2MLRForCausalLM" in out.stdout
    without = _load_in_fresh_process(
        bare, "import t2mlr\nfrom transformers import AutoModelForCausalLM\nAutoModelForCausalLM.from_pretrained(DIR)")
    assert without.returncode != 0 and "trust_remote_code" in without.stderr  # the model's import registers it


@pytest.mark.slow
def test_without_the_import_trust_remote_code_loads_the_same_model(saved_tiny: Path) -> None:
    out = _load_in_fresh_process(saved_tiny, (
        "import sys, torch\nfrom transformers import AutoModelForCausalLM\n"
        "model = AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)\n"
        "print(type(model).__module__, 't2mlr' in sys.modules)\n"
        "print(model(torch.arange(3, 9)[None], recurrence='exact').logits.double().sum().item())\n"
    ))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[1] == "True"  # with the package installed, the saved entry modules give its classes
    with torch.no_grad():
        expected = AutoModelForCausalLM.from_pretrained(saved_tiny)(torch.arange(3, 9)[None], recurrence="exact")
    assert float(out.stdout.split()[-1]) == pytest.approx(expected.logits.double().sum().item(), abs=1e-9)


@pytest.mark.slow
def test_a_model_loaded_through_auto_map_saves_with_the_same_auto_map(saved_tiny: Path, tmp_path: Path) -> None:
    """transformers marks a class it loaded through `auto_map` and would copy its module into later saves,
    pointing `auto_map` at that copy (past the entry modules); the saved directory names the entry modules
    again and computes the same."""
    resaved = tmp_path / "resaved"
    out = _load_in_fresh_process(saved_tiny, (
        "from transformers import AutoModelForCausalLM\n"
        f"AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True).save_pretrained({str(resaved)!r})\n"
    ))
    assert out.returncode == 0, out.stderr
    assert json.loads((resaved / "config.json").read_text())["auto_map"] == json.loads(
        (saved_tiny / "config.json").read_text())["auto_map"]
    code = [{path.name: path.read_text() for path in directory.glob("*.py")} for directory in (resaved, saved_tiny)]
    assert code[0] == code[1]


# ---------------------------------------------------------------------------------------------- the composite config

STANDARD_ATTRIBUTES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                       "num_key_value_heads", "head_dim", "max_position_embeddings", "use_cache")


def test_the_config_is_a_composite_config_whose_base_attributes_read_and_write_through() -> None:
    """`sub_configs` declares the base config; the standard attributes of a causal LM's config are the
    base's, read and written through the top config (a tool that sets `config.vocab_size` after resizing
    sets the one value there is), but for the depth, which places the recurrence."""
    config = T2MLRConfig.from_base(tiny_base_config(), l_start=2, l_end=3)
    assert config.sub_configs == {"base_config": AutoConfig}
    for name in STANDARD_ATTRIBUTES:
        assert getattr(config, name) == getattr(config.base_config, name), name
    assert config.get_text_config() is config.base_config and config.get_text_config(decoder=True) is config.base_config
    config.vocab_size = 120
    config.use_cache = False
    assert (config.base_config.vocab_size, config.base_config.use_cache) == (120, False)
    assert T2MLRConfig.from_dict(config.to_dict()).vocab_size == 120
    with pytest.raises(ValueError, match="num_hidden_layers cannot be set on a T2MLRConfig: .* place the recurrence"):
        config.num_hidden_layers = 7  # the depth l_start..l_end count in
    assert config.base_config.num_hidden_layers == 5


def test_a_config_without_a_base_answers_as_any_config_lacking_an_attribute() -> None:
    config = T2MLRConfig()
    assert not any(hasattr(config, name) for name in STANDARD_ATTRIBUTES)
    assert config.get_text_config() is config
    assert "base_config" in config.to_json_string()
    with pytest.raises(AttributeError, match="no base_config, so no vocab_size; build it with T2MLRConfig.from_base"):
        config.vocab_size = 120


def test_resize_token_embeddings_keeps_one_vocabulary_size(tmp_path: Path) -> None:
    model = tiny_model(dtype=torch.float32)
    model.resize_token_embeddings(70)
    assert model.config.vocab_size == model.config.base_config.vocab_size == 70
    ids = torch.tensor([[3, 69, 5]])
    with torch.no_grad():
        assert model(ids, recurrence="exact").logits.shape[-1] == 70
    model.save_pretrained(tmp_path)
    assert AutoModelForCausalLM.from_pretrained(tmp_path).config.vocab_size == 70


def test_the_attention_implementation_is_the_base_configs_and_follows_the_top_config() -> None:
    """A retrofit keeps the attention its base model was loaded with (transformers sets a composite
    config's implementation on its sub-configs, so an unset one would reset the base's), and setting the
    top config's sets the base's."""
    base = LlamaForCausalLM._from_config(tiny_base_config(), attn_implementation="eager")
    retrofit = T2MLRForCausalLM.from_base(base, l_start=2, l_end=3)
    assert retrofit.config._attn_implementation == "eager"
    assert retrofit.config.base_config._attn_implementation == "eager"
    assert retrofit.model.layers[0].self_attn.config._attn_implementation == "eager"
    config = T2MLRConfig.from_base(tiny_base_config(), l_start=2, l_end=3)
    config._attn_implementation = "sdpa"
    assert config.base_config._attn_implementation == "sdpa"


def outcome(call) -> tuple[str, object]:
    """What a forward call gives: its attention weights, or the error that refused it."""
    try:
        return "returned", call().attentions
    except ValueError as err:
        return "refused", str(err)


def test_output_attentions_set_on_the_config_is_what_the_argument_does(tmp_path: Path) -> None:
    """Set through the config, `output_attentions` reaches the forward's decision exactly as the argument
    does (returned or refused alike); the argument still wins; on an attention that cannot give the
    weights, transformers refuses the setting itself."""
    tiny_model(dtype=torch.float32).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ids = random_ids(1, 5)
    with torch.no_grad():
        asked = outcome(lambda: model(ids, recurrence="exact", output_attentions=True))
        model.config.output_attentions = True
        configured = outcome(lambda: model(ids, recurrence="exact"))
        declined = model(ids, recurrence="exact", output_attentions=False)
    assert configured[0] == asked[0]
    if asked[0] == "refused":
        assert configured == asked
    else:
        for mine, theirs in zip(configured[1], asked[1]):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
    assert getattr(declined, "attentions", None) is None
    sdpa = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa")
    with pytest.raises(ValueError, match="output_attentions.*eager"):
        sdpa.config.output_attentions = True


def test_a_saved_config_records_no_path_of_the_machine_that_made_it(tmp_path: Path) -> None:
    """A retrofit of a base model loaded from a directory: its config.json names no local path (the base
    config's `_name_or_path` is dropped, as transformers drops the top config's), and reloads the same."""
    LlamaForCausalLM(tiny_base_config()).save_pretrained(tmp_path / "base")
    retrofit = T2MLRForCausalLM.from_base(str(tmp_path / "base"), l_start=2, l_end=3)
    assert retrofit.config.base_config.name_or_path == str(tmp_path / "base")  # kept in memory
    retrofit.save_pretrained(tmp_path / "retrofit")
    text = (tmp_path / "retrofit" / "config.json").read_text()

    def strings(value) -> list[str]:
        if isinstance(value, dict):
            return [s for item in value.values() for s in strings(item)]
        if isinstance(value, list):
            return [s for item in value for s in strings(item)]
        return [value] if isinstance(value, str) else []

    assert str(tmp_path) not in text
    assert not [value for value in strings(json.loads(text)) if value.startswith(("/", "~")) or ":\\" in value]
    reloaded = T2MLRConfig.from_pretrained(tmp_path / "retrofit")
    assert isinstance(reloaded.base_config, LlamaConfig) and reloaded.base_config.to_dict() == {
        **retrofit.config.base_config.to_dict(), "_name_or_path": reloaded.base_config.name_or_path}
