"""Every misspelt key fails before any compute, at every level of a training config and in the Python
API's keyword arguments, with the nearest valid spelling in the message."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import tiny_base_config, tiny_model

from t2mlr import T2MLRConfig, T2MLRForCausalLM
from t2mlr.baselines.looped import LoopedConfig
from t2mlr.baselines.pause import PauseConfig
from t2mlr.cli import main as cli_main
from t2mlr.training.config import ConfigError, load_config
from t2mlr.training.model_factory import build_model


@pytest.mark.parametrize("override, nearest", [
    ("modle.l_start=2", "model"),  # top level
    ("model.l_stat=2", "l_start"),  # a T2MLRConfig field in the model section
    ("model.cache_residul=false", "cache_residual"),  # a field the old config passed through untyped
    ("model.activation_checkpointin=true", "activation_checkpointing"),  # the trainer's own model key
    ("model.base.hidden_sizee=32", "hidden_size"),  # the nested base config, checked by LlamaConfig
    ("data.seq_lne=32", "seq_len"),
    ("data.kwargs.num_sample=8", "num_samples"),  # the synthetic dataset's own keywords
    ("optim.weight_dacay=0.1", "weight_decay"),
    ("eval.data.seq_lne=32", "seq_len"),
    ("schedule.warmup=3", "warmup_steps"),
])
def test_a_misspelt_key_at_any_level_names_the_nearest_valid_key(override: str, nearest: str) -> None:
    with pytest.raises(ConfigError, match=f"Did you mean '{nearest}'"):
        load_config("debug", [override])


def test_the_old_untyped_pass_through_is_gone() -> None:
    with pytest.raises(ConfigError, match="unknown config key 'model.extra'"):
        load_config("debug", ["model.extra={cache_residul: false}"])


def test_a_misspelt_key_stops_the_cli_before_any_compute(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert cli_main(["train", "debug", "--out", str(out), "model.cache_residul=false"]) == 2
    assert "Did you mean 'cache_residual'" in capsys.readouterr().err
    assert not out.exists()  # nothing was built or written


def test_model_settings_reach_the_model() -> None:
    cfg = load_config("debug", ["model.cache_residual=false", "model.gate_init_scale=0.5",
                                "model.recurrence_mask_policy=mask", "model.jacobi_tol=1e-3"])
    model = build_model(cfg.model)
    assert model.model.cache_norm is None
    config = model.config
    assert (config.gate_init_scale, config.recurrence_mask_policy, config.jacobi_tol) == (0.5, "mask", 1e-3)
    assert (config.l_start, config.l_end, config.d_forward, config.d_backward) == (2, 3, 4, 2)


def test_model_settings_are_typed_by_the_config_class() -> None:
    with pytest.raises(ConfigError, match="model.cache_residual: expected a bool"):
        load_config("debug", ["model.cache_residual=maybe"])
    with pytest.raises(ConfigError, match="model.eval_recurrence: must be one of"):
        load_config("debug", ["model.eval_recurrence=sometimes"])


def test_keyword_arguments_of_from_base_are_checked() -> None:
    base = tiny_base_config()
    with pytest.raises(ValueError, match="Did you mean 'd_forward'"):
        T2MLRConfig.from_base(base, l_start=2, l_end=3, d_foward=4)
    with pytest.raises(ValueError, match="Did you mean 'l_start'"):
        T2MLRForCausalLM.from_base(tiny_model(gates=False).base_decoder(), 2, 3, l_stat=5)
    with pytest.raises(ValueError, match="Did you mean 'hidden_size'"):
        T2MLRConfig.from_base({"model_type": "llama", "hidden_sizee": 32}, l_start=1, l_end=1)


def test_a_base_key_that_transformers_converts_is_accepted() -> None:
    config = T2MLRConfig.from_base({"model_type": "llama", "num_hidden_layers": 2, "rope_theta": 5e4}, 1, 2)
    assert config.base_config.rope_parameters["rope_theta"] == 5e4


@pytest.mark.parametrize("arch", ["t2mlr", "looped", "pause", "transformer"])
def test_the_keys_checked_before_transformers_loads_are_what_the_built_config_holds(arch: str) -> None:
    """The setting names a `model:` section is checked against (pure data, `t2mlr.settings`) are the
    architecture's settings, and a config class built with no settings holds each one at its schema default."""
    from t2mlr.settings import ARCHITECTURE_SETTINGS, settings_fields
    from t2mlr.training.architectures import ARCHITECTURES
    from t2mlr.training.config import declared_settings

    assert list(ARCHITECTURE_SETTINGS) == list(ARCHITECTURES)
    assert declared_settings(arch) == list(ARCHITECTURES[arch].settings())
    config_class = {"t2mlr": T2MLRConfig, "looped": LoopedConfig, "pause": PauseConfig}.get(arch)
    if config_class is not None:
        built = config_class()
        assert {name: getattr(built, name) for name in declared_settings(arch)} == {
            name: field.default for name, field in settings_fields(ARCHITECTURE_SETTINGS[arch]).items()}


def test_a_misspelt_model_key_is_answered_before_transformers_loads(tmp_path: Path) -> None:
    from test_cli import run_in_fresh_interpreter

    for override, said in (("model.l_strat=2", "Did you mean 'l_start'?"),
                           ("model.loops=2", "model.loops is a setting of model.arch 'looped'")):
        result = run_in_fresh_interpreter(["train", "debug", "--out", str(tmp_path / "run"), override])
        assert "EXIT 2 LOADED []" in result.stdout and said in result.stderr, (result.stdout, result.stderr)
    assert not (tmp_path / "run").exists()
