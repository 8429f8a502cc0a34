"""Training config: presets load, overrides are typed, unknown keys fail clearly, CLI parsing."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from t2mlr.training.commands import register, train_overrides
from t2mlr.training.config import (
    PRESET_DIRS,
    ConfigError,
    OptimConfig,
    ScheduleConfig,
    load_config,
    load_yaml_tree,
    parse_override,
    resolve_config_path,
)
from t2mlr.training.optim import is_no_decay, lr_multiplier, param_groups

CONFIG_DIR = PRESET_DIRS[0]


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_preset_loads(path: Path) -> None:
    if "grpo" in load_yaml_tree(path):  # a reinforcement-learning preset (`t2mlr rl grpo`)
        from t2mlr.rl.grpo import load_grpo_config

        load_grpo_config(path)
        return
    cfg = load_config(path)
    if cfg.model.arch == "t2mlr":  # the baseline presets' settings are checked in test_training_baselines.py
        assert 1 <= cfg.model.l_start <= cfg.model.l_end


@pytest.mark.parametrize("placement", [(13, 18), (9, 22), (5, 26), (1, 30)])
def test_paper_presets_hold_the_paper_settings(placement: tuple[int, int]) -> None:
    cfg = load_config(f"smollm2_135m_{placement[0]}_{placement[1]}")
    base = cfg.model.base
    assert (cfg.model.l_start, cfg.model.l_end) == placement
    assert (base["num_hidden_layers"], base["hidden_size"], base["num_attention_heads"]) == (30, 576, 9)
    assert (base["num_key_value_heads"], base["intermediate_size"], base["vocab_size"]) == (3, 1536, 49152)
    assert base["tie_word_embeddings"] is True and base["rope_theta"] == 100000.0
    assert cfg.optim.lr == 5e-4 and cfg.optim.betas == (0.9, 0.98) and cfg.optim.weight_decay == 0.01
    assert cfg.schedule.kind == "cosine" and cfg.schedule.min_lr_ratio == 0.001
    assert cfg.data.seq_len == 2048 and cfg.train.global_batch_size == 256
    assert (cfg.model.d_forward, cfg.model.d_backward) == (16, 4)


def test_overrides_are_typed_and_nested() -> None:
    cfg = load_config("debug", ["optim.lr=5e-4", "optim.betas=[0.8, 0.9]", "model.jacobi_tol=null",
                                "model.base.hidden_size=32", "train.max_steps=7", "logging.tensorboard=true"])
    assert cfg.optim.lr == 5e-4 and isinstance(cfg.optim.lr, float)
    assert cfg.optim.betas == (0.8, 0.9)
    assert cfg.model.jacobi_tol is None and cfg.model.base["hidden_size"] == 32
    assert cfg.train.max_steps == 7 and cfg.logging.tensorboard is True


@pytest.mark.parametrize("override, fragment", [
    ("optim.lrr=1", "Did you mean 'lr'"),
    ("optim.learning_rate=1e-3", "Did you mean 'lr'"),  # other libraries' name for it
    ("train.per_device_train_batch_size=4", "Did you mean 'micro_batch_size'"),
    ("optim.max_grad_norm=1", "Did you mean 'grad_clip'"),
    ("nosuch.key=1", "unknown config key 'nosuch'"),
    ("train.max_steps=ten", "expected an int"),
    ("model.train_recurrence=sometimes", "must be one of"),
    ("train.global_batch_size=6", "multiple of train.micro_batch_size"),
    ("model.pretrained=some/model", "exactly one of model.base"),
    ("model.l_end=9", "l_start <= l_end <= 4"),
    ("model.d_backward=9", "d_backward <= d_forward"),
])
def test_bad_configs_fail_with_clear_messages(override: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(")):
        load_config("debug", [override])


def test_any_data_source_can_be_chosen_on_any_preset(tmp_path: Path) -> None:
    """The debug preset's synthetic settings (data.kwargs) give way to a source chosen on the command line;
    settings given with it stay, and a kwargs override keeps the preset's others."""
    rows = tmp_path / "ids.jsonl"
    rows.write_text('{"input_ids": [1, 2, 3, 4, 5]}\n', encoding="utf-8")
    cfg = load_config("debug", ["data.source=jsonl", f"data.path={rows}"])
    assert (cfg.data.source, cfg.data.path, cfg.data.kwargs) == ("jsonl", str(rows), {})
    assert cfg.eval.data.source == "synthetic" and cfg.eval.data.kwargs  # another section keeps its own
    kept = load_config("debug", ["data.kwargs.num_samples=16"])
    assert kept.data.kwargs["num_samples"] == 16 and kept.data.kwargs["vocab_size"] == 64
    with pytest.raises(ConfigError, match="kwargs applies to source synthetic or factory only"):
        load_config("debug", ["data.source=jsonl", f"data.path={rows}", "data.kwargs.num_samples=16"])


def test_unknown_preset_lists_presets() -> None:
    with pytest.raises(ConfigError, match="debug"):
        load_config("no_such_preset")


def test_presets_ship_inside_the_package_and_the_checkout_links_them() -> None:
    import t2mlr

    shipped = Path(t2mlr.__file__).resolve().parent / "configs"
    assert resolve_config_path("debug").resolve().parent == shipped  # a wheel carries them (package data)
    repo = Path(__file__).resolve().parents[1]
    assert (repo / "configs").resolve() == repo / "src" / "t2mlr" / "configs"  # <repo>/configs is that folder
    assert "configs/*.yaml" in (repo / "pyproject.toml").read_text()


def test_extends_merges_parent(tmp_path: Path) -> None:
    (tmp_path / "child.yaml").write_text(f"extends: {CONFIG_DIR / 'debug.yaml'}\noptim:\n  lr: 1.0e-4\n")
    cfg = load_config(tmp_path / "child.yaml")
    assert cfg.optim.lr == 1e-4 and cfg.model.l_start == 2 and cfg.optim.betas == (0.9, 0.98)


def test_parse_override_requires_equals() -> None:
    assert parse_override("a.b=3") == (["a", "b"], 3)
    with pytest.raises(ConfigError):
        parse_override("a.b")


def test_cli_accepts_overrides_after_options() -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["train", "debug", "a.b=1", "--out", "runs/x", "--max-steps", "5", "c.d=2",
                              "--parallel", "fsdp", "--resume"])
    assert args.config == "debug" and args.out == "runs/x" and args.resume
    assert train_overrides(args) == ["a.b=1", "c.d=2", "train.max_steps=5", "train.parallel=fsdp"]
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "debug", "--out", "x", "--bogus"])


def test_experiment_overrides_after_a_many_valued_option_are_overrides() -> None:
    """`--models t2mlr transformer optim.lr=1e-3` gives two models and one override; `--from ARM=DIR` values
    (no dotted key) stay the option's."""
    from t2mlr.experiments.commands import register as register_experiments

    parser = argparse.ArgumentParser()
    register_experiments(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["experiment", "s5-retrieval", "--models", "t2mlr", "transformer", "optim.lr=1e-3",
                              "train.max_steps=3", "--out", "x", "task.train_size=8"])
    assert args.models == ["t2mlr", "transformer"]
    assert args.overrides == ["optim.lr=1e-3", "train.max_steps=3", "task.train_size=8"]
    args = parser.parse_args(["experiment", "finetune", "variable-assignment", "--from", "t2mlr:1-2=runs/a.b",
                              "transformer=runs/c", "optim.lr=1e-3"])
    assert args.from_ == ["t2mlr:1-2=runs/a.b", "transformer=runs/c"] and args.overrides == ["optim.lr=1e-3"]


def test_param_groups_keep_gates_norms_biases_out_of_weight_decay() -> None:
    named = [
        ("model.fusion.gamma_cur", torch.nn.Parameter(torch.zeros(()))),
        ("model.fusion.f_cur.weight", torch.nn.Parameter(torch.zeros(4, 8))),
        ("model.fusion.f_cur.bias", torch.nn.Parameter(torch.zeros(4))),
        ("model.cache_norm.weight", torch.nn.Parameter(torch.ones(4))),
        ("model.layers.0.mlp.up_proj.weight", torch.nn.Parameter(torch.zeros(8, 4))),
    ]
    groups = param_groups(named, OptimConfig(lr=1.0, weight_decay=0.1, fusion_lr_mult=3.0))
    by_name = {name: g for g in groups for name in g["names"]}
    assert by_name["model.fusion.gamma_cur"]["weight_decay"] == 0.0 and by_name["model.fusion.gamma_cur"]["lr"] == 3.0
    assert by_name["model.fusion.f_cur.weight"]["weight_decay"] == 0.1 and by_name["model.fusion.f_cur.weight"]["lr"] == 3.0
    assert by_name["model.cache_norm.weight"]["weight_decay"] == 0.0 and by_name["model.cache_norm.weight"]["lr"] == 1.0
    assert by_name["model.layers.0.mlp.up_proj.weight"]["weight_decay"] == 0.1
    assert is_no_decay("model.fusion.f_cur.bias", named[2][1])


def test_schedule_warms_up_then_decays_to_floor() -> None:
    cfg = ScheduleConfig(kind="cosine", warmup_steps=10, min_lr_ratio=0.001)
    values = [lr_multiplier(s, cfg, 100) for s in range(120)]
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(values[9:], values[10:]))
    assert values[100] == pytest.approx(0.001) and values[119] == pytest.approx(0.001)


def test_eval_recurrence_takes_the_model_s_path_names() -> None:
    """training.config spells eval.recurrence's values itself (importing the model's config would load
    transformers before a config error could be reported); they must stay the model's."""
    import typing

    from t2mlr.settings import RECURRENCE_PATHS
    from t2mlr.training.config import EvalConfig

    literal = next(arg for arg in typing.get_args(typing.get_type_hints(EvalConfig)["recurrence"]) if arg is not type(None))
    assert typing.get_args(literal) == RECURRENCE_PATHS
