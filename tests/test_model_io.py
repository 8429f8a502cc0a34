"""Config validation, input errors, save/load and retrofitting."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import random_ids, tiny_base_config, tiny_model
from safetensors import safe_open
from transformers import AutoModelForCausalLM, GPT2Config, LlamaForCausalLM

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
    for model in (from_path, from_object):
        for path in ("exact", "jacobi", "off"):
            with torch.no_grad():
                got = model(ids, recurrence=path, d_forward=4, d_backward=1).logits
            assert torch.allclose(got, expected, atol=1e-5, rtol=0), path
    assert from_path.fusion.gamma_rec.item() == 0.0


def test_a_checkpoint_saved_by_version_0_1_0_still_loads_and_computes_the_same() -> None:
    """tests/fixtures/t2mlr_v0_1_0: saved by the release before the model package was split, with its
    exact and Jacobi logits and a greedy continuation recorded by that release on this very directory.

    Logits are compared to float32 rounding (1e-6; they are at most ~0.4 here), not bitwise: another CPU's
    kernels round differently (4.5e-8 apart on an AMD EPYC), while any change of semantics moves them far more."""
    fixture = Path(__file__).parent / "fixtures" / "t2mlr_v0_1_0"
    expected = torch.load(fixture / "expected_outputs.pt")
    model = AutoModelForCausalLM.from_pretrained(fixture).eval()
    ids = expected["input_ids"]
    with torch.no_grad():
        exact = model(ids, recurrence="exact").logits
        jacobi = model(ids, recurrence="jacobi", d_forward=3, d_backward=1).logits
    torch.testing.assert_close(exact, expected["exact"], atol=1e-6, rtol=0)
    torch.testing.assert_close(jacobi, expected["jacobi_d3"], atol=1e-6, rtol=0)
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


def test_after_a_bare_import_the_auto_classes_load_without_remote_code(saved_tiny: Path, tmp_path: Path) -> None:
    """`import t2mlr` (which imports neither torch nor transformers) is enough for AutoConfig, AutoModel
    and AutoModelForCausalLM: the directory's remote-code modules are removed, so nothing else could help."""
    bare = tmp_path / "bare"
    shutil.copytree(saved_tiny, bare)
    for module in bare.glob("*_t2mlr.py"):
        module.unlink()
    out = _load_in_fresh_process(bare, (
        "import sys\nimport t2mlr\nprint('LOADED', sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
        "from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, LlamaForCausalLM\n"
        "print(type(AutoConfig.from_pretrained(DIR)).__name__, type(AutoModel.from_pretrained(DIR)).__name__,\n"
        "      type(AutoModelForCausalLM.from_pretrained(DIR)).__name__)\n"
    ))
    assert out.returncode == 0, out.stderr
    assert "LOADED []" in out.stdout and "T2MLRConfig T2MLRModel T2MLRForCausalLM" in out.stdout
    without = _load_in_fresh_process(bare, "from transformers import AutoModelForCausalLM\nAutoModelForCausalLM.from_pretrained(DIR)")
    assert without.returncode != 0 and "trust_remote_code" in without.stderr  # the import is what registered it


def test_without_the_import_trust_remote_code_loads_the_same_model(saved_tiny: Path) -> None:
    out = _load_in_fresh_process(saved_tiny, (
        "import sys, torch\nfrom transformers import AutoModelForCausalLM\n"
        "model = AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)\n"
        "print(type(model).__module__, 't2mlr' in sys.modules)\n"
        "print(model(torch.arange(3, 9)[None], recurrence='exact').logits.double().sum().item())\n"
    ))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[1] == "True"  # the saved modules import the installed package
    with torch.no_grad():
        expected = AutoModelForCausalLM.from_pretrained(saved_tiny)(torch.arange(3, 9)[None], recurrence="exact")
    assert float(out.stdout.split()[-1]) == pytest.approx(expected.logits.double().sum().item(), abs=1e-9)
