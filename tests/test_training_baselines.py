"""The looped and pause-token baselines in the trainer: `model.arch` settings read from their config
classes (misspelt ones name the nearest valid setting), `loop_blocks`, retrofitting a pretrained decoder,
activation checkpointing of the looped blocks, training that learns and checkpoints that load, the
paper's presets at T²MLR(13,18)'s parameter count, and FSDP2 keeping looped blocks gathered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_base_config
from test_training_loop import TINY as LOOP_TINY
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from t2mlr import T2MLRConfig
from t2mlr.baselines import LoopedForCausalLM, PauseForCausalLM
from t2mlr.baselines.matching import t2mlr_parameter_count
from t2mlr.model.shapes import smollm2_135m_t2mlr_config
from t2mlr.training.config import (
    ConfigError,
    TrainConfig,
    apply_overrides,
    config_from_tree,
    load_config,
    load_yaml_tree,
    resolve_config_path,
)
from t2mlr.training.model_factory import (
    build_model,
    decoder_layers,
    describe_path,
    repeated_block_indices,
)
from t2mlr.training.trainer import Trainer, train

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# the training loop's tiny run without its T²MLR settings, with more data and one micro-batch per step
TINY = [override for override in LOOP_TINY if override.split("=")[0].removeprefix("model.")
        not in T2MLRConfig.recurrence_fields()]
TINY += ["data.kwargs.num_samples=256", "train.global_batch_size=8", "train.micro_batch_size=8",
         "schedule.warmup_steps=2"]


def tiny(arch: str, *overrides: str) -> TrainConfig:
    """The debug preset at a tiny size as `arch`: the T²MLR settings are not keys of the other architectures."""
    tree = load_yaml_tree(resolve_config_path("debug"))
    recurrence = T2MLRConfig.recurrence_fields()
    tree["model"] = {key: value for key, value in tree["model"].items() if key not in recurrence}
    tree["model"]["arch"] = arch
    return config_from_tree(apply_overrides(tree, TINY + list(overrides)))


LOOPED = ("model.loop_blocks=2-3", "model.loops=2")


# ---------------------------------------------------------------------------------------------- settings


def test_settings_are_the_config_classes_fields() -> None:
    looped = tiny("looped", *LOOPED)
    assert looped.model.settings == {"loop_blocks": "2-3", "loop_start": None, "loop_end": None, "loops": 2}
    pause = tiny("pause", "model.pauses=2")
    assert pause.model.settings == {"pauses": 2, "pause_token_id": None}
    assert tiny("pause").model.pauses == 1  # the default is the paper's ×2


@pytest.mark.parametrize("arch, override, nearest", [
    ("looped", "model.loop_block=2-3", "loop_blocks"),
    ("looped", "model.loop=2", "loops"),
    ("looped", "model.loop_strat=1", "loop_start"),
    ("pause", "model.pause=1", "pauses"),
    ("pause", "model.pause_token=40", "pause_token_id"),
])
def test_a_misspelt_setting_names_the_nearest_valid_one(arch: str, override: str, nearest: str) -> None:
    with pytest.raises(ConfigError, match=f"Did you mean '{nearest}'"):
        tiny(arch, *(LOOPED if arch == "looped" else ()), override)


@pytest.mark.parametrize("arch, override, owner", [
    ("pause", "model.l_start=2", "t2mlr"), ("t2mlr", "model.loops=2", "looped"), ("looped", "model.pauses=1", "pause"),
])
def test_another_architectures_setting_says_whose_it_is(arch: str, override: str, owner: str) -> None:
    setting = override.split("=")[0]
    with pytest.raises(ConfigError, match=f"{setting} is a setting of model.arch '{owner}', not of '{arch}'.*!replace"):
        if arch == "t2mlr":
            load_config("debug", TINY + [override])
        else:
            tiny(arch, *(LOOPED if arch == "looped" else ()), override)


@pytest.mark.parametrize("arch, overrides, fragment", [
    ("looped", ("model.loop_blocks=2-3", "model.loop_start=1", "model.loops=2"), "names blocks 2-3, but loop_start=1"),
    ("looped", ("model.loop_blocks=2-9", "model.loops=2"), "loop_end <= 3"),
    ("looped", ("model.loop_blocks=2-3", "model.loops=0"), "loops must be an int >= 1, got 0"),
    ("looped", ("model.loops=2",), "name the looped blocks"),
    ("looped", ("model.loop_blocks=most", "model.loops=2"), "loop_blocks must be 'full' or 'S-E'"),
    ("pause", ("model.pauses=0",), "pauses must be an int >= 1, got 0"),
    ("pause", ("model.pause_token_id=5",), "pause ids may not collide with the vocabulary"),
    ("pause", ("model.activation_checkpointing=true",), "refuses it: it runs every block once"),
    ("transformer", ("model.activation_checkpointing=true",), "refuses it"),
    ("looped", (*LOOPED, "eval.recurrence=exact"), "eval.recurrence applies to T²MLR models only"),
])
def test_bad_settings_fail_before_anything_is_built(arch: str, overrides: tuple[str, ...], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        tiny(arch, *overrides)


def test_loop_blocks_full_covers_every_block() -> None:
    model = build_model(tiny("looped", "model.loop_blocks=full", "model.loops=2").model)
    assert (model.config.loop_start, model.config.loop_end) == (1, 3)
    assert repeated_block_indices(model) == {0, 1, 2}
    assert "looped blocks 1-3 × 2 (of 3)" in describe_path(model, training=True)


# ---------------------------------------------------------------------------------------------- building


@pytest.mark.parametrize("arch, settings", [("looped", LOOPED), ("pause", ("model.pauses=1",))])
def test_pretrained_decoder_is_wrapped_with_its_weights(tmp_path: Path, arch: str, settings: tuple[str, ...]) -> None:
    torch.manual_seed(3)
    base = LlamaForCausalLM(tiny_base_config(layers=3, vocab_size=32))
    base.save_pretrained(tmp_path / "base")
    tree = apply_overrides(load_yaml_tree(resolve_config_path("debug")), [])
    tree["model"] = {"arch": arch, "pretrained": str(tmp_path / "base")}
    model = build_model(config_from_tree(apply_overrides(tree, list(settings))).model)
    assert isinstance(model, LoopedForCausalLM if arch == "looped" else PauseForCausalLM)
    for name, value in base.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    assert len(decoder_layers(model)) == 3


def test_looped_activation_checkpointing_covers_the_looped_blocks_and_changes_nothing(tmp_path: Path) -> None:
    cfg = tiny("looped", *LOOPED, "model.activation_checkpointing=true")
    model = build_model(cfg.model)
    assert [getattr(layer, "gradient_checkpointing", False) for layer in model.model.layers] == [False, True, True]

    def run(config: TrainConfig, out: Path) -> tuple[list[float], dict[str, torch.Tensor]]:
        trainer = Trainer(config, out)
        losses = trainer.train().losses
        return losses, {k: v.clone() for k, v in trainer.model.state_dict().items()}

    plain_losses, plain_w = run(tiny("looped", *LOOPED, "train.max_steps=3"), tmp_path / "plain")
    ckpt_losses, ckpt_w = run(tiny("looped", *LOOPED, "train.max_steps=3", "model.activation_checkpointing=true"),
                              tmp_path / "ckpt")
    assert ckpt_losses == pytest.approx(plain_losses, rel=1e-6)
    for name in plain_w:
        torch.testing.assert_close(ckpt_w[name], plain_w[name], rtol=1e-5, atol=1e-6, msg=name)


# ---------------------------------------------------------------------------------------------- training


@pytest.mark.parametrize("arch, settings, describes", [
    ("looped", LOOPED, "looped blocks 2-3 × 2 (of 3) (no recurrence)"),
    ("pause", ("model.pauses=1",), "pause tokens ×2 (1 after every token) (no recurrence)"),
])
def test_baseline_trains_and_its_checkpoint_loads(tmp_path: Path, arch: str, settings, describes: str) -> None:
    run = tmp_path / arch
    cfg = tiny(arch, *settings, "train.max_steps=30", "optim.lr=3e-3", "checkpoint.save_final=true")
    result = train(cfg, run)
    first, last = sum(result.losses[:3]) / 3, sum(result.losses[-3:]) / 3
    assert last < 0.85 * first, result.losses  # learns the synthetic successor rule
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {r["recurrence"] for r in records if r["split"] == "train"} == {"none"}
    assert f"train forward path: {describes}" in (run / "train.log").read_text()
    loaded = AutoModelForCausalLM.from_pretrained(run / "final").eval()
    assert type(loaded).__name__ == ("LoopedForCausalLM" if arch == "looped" else "PauseForCausalLM")
    trained = Trainer(cfg, tmp_path / "fresh").model  # same seed: the untrained weights differ from the saved ones
    ids = torch.randint(0, 32, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        saved_logits = loaded(input_ids=ids).logits
        assert not torch.allclose(saved_logits, trained.eval()(input_ids=ids).logits)
        generated = loaded.generate(input_ids=ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert generated.shape == (2, 14) and int(generated.max()) < 32


# ---------------------------------------------------------------------------------------------- presets

PRESETS = ["smollm2_135m_baseline", "smollm2_135m_looped_full_x2", "smollm2_135m_looped_9_22_x3",
           "smollm2_135m_pause_x2"]


@pytest.fixture(scope="module")
def t2mlr_13_18_parameters() -> int:
    return t2mlr_parameter_count(smollm2_135m_t2mlr_config(13, 18))


@pytest.mark.parametrize("name", PRESETS)
def test_paper_baseline_presets_are_matched_to_t2mlr_13_18(name: str, t2mlr_13_18_parameters: int) -> None:
    cfg = load_config(name)
    reference = load_config("smollm2_135m_13_18")
    assert cfg.data == reference.data and cfg.optim == reference.optim and cfg.train == reference.train
    assert cfg.model.base["hidden_size"] == 584 and cfg.model.base["head_dim"] == 64
    assert cfg.model.base["num_attention_heads"] == 9 and cfg.eval.recurrence is None
    with torch.device("meta"):
        count = sum(p.numel() for p in build_model(cfg.model).parameters())
    assert t2mlr_13_18_parameters <= count <= 1.01 * t2mlr_13_18_parameters


def test_paper_baseline_presets_hold_the_papers_arms() -> None:
    assert load_config("smollm2_135m_baseline").model.arch == "transformer"
    full, middle = load_config("smollm2_135m_looped_full_x2").model, load_config("smollm2_135m_looped_9_22_x3").model
    assert (full.arch, full.loop_blocks, full.loops) == ("looped", "full", 2)
    assert (middle.arch, middle.loop_blocks, middle.loops) == ("looped", "9-22", 3)
    pause = load_config("smollm2_135m_pause_x2").model
    assert (pause.arch, pause.pauses) == ("pause", 1)


@pytest.mark.parametrize("overrides, arch, expected", [
    (["model.arch=looped", "model.loop_blocks=9-22", "model.loops=3"], "looped", {"loop_blocks": "9-22", "loops": 3}),
    (["model.arch=pause", "model.pauses=1"], "pause", {"pauses": 1}),
])
def test_readme_baseline_overrides_on_the_matched_preset(overrides, arch, expected, t2mlr_13_18_parameters) -> None:
    """The README's `t2mlr train smollm2_135m_baseline ... model.arch=...` lines: the arm they name, matched."""
    model = load_config("smollm2_135m_baseline", overrides).model
    assert model.arch == arch and {key: getattr(model, key) for key in expected} == expected
    with torch.device("meta"):
        count = sum(p.numel() for p in build_model(model).parameters())
    assert t2mlr_13_18_parameters <= count <= 1.01 * t2mlr_13_18_parameters


def test_a_replacing_section_drops_what_it_would_inherit(tmp_path: Path) -> None:
    """`model: !replace` replaces the inherited model section instead of merging into it."""
    (tmp_path / "child.yaml").write_text(
        "extends: " + str(resolve_config_path("debug")) + "\nmodel: !replace\n  arch: transformer\n"
        "  base: {model_type: llama, vocab_size: 64, hidden_size: 32, intermediate_size: 64,\n"
        "         num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2}\n"
    )
    cfg = load_config(tmp_path / "child.yaml")
    assert cfg.model.arch == "transformer" and cfg.model.settings == {}
    assert cfg.data == load_config("debug").data  # the other sections are still inherited
    (tmp_path / "merged.yaml").write_text("extends: " + str(resolve_config_path("debug")) + "\nmodel:\n  arch: pause\n")
    with pytest.raises(ConfigError, match="model.l_start is a setting of model.arch 't2mlr'"):  # a plain one merges
        load_config(tmp_path / "merged.yaml")


# ---------------------------------------------------------------------------------------------- FSDP2

DISTRIBUTED = [
    "data.seq_len=16", "data.kwargs.num_samples=64", "data.kwargs.min_doc_len=3", "data.kwargs.max_doc_len=10",
    "optim.lr=1e-2", "schedule.warmup_steps=1", "schedule.total_steps=3", "train.global_batch_size=8",
    "train.max_steps=3", "checkpoint.every=0", "logging.progress_bar=false", "eval.every=0",
]


@pytest.mark.slow
def test_fsdp_two_ranks_train_a_looped_model_like_one_process(tmp_path: Path) -> None:
    """torchrun, 2 gloo ranks: FSDP2 shards every block and keeps the looped ones gathered between their
    runs (reshard_after_forward=False); losses and final weights equal one process's on the same batch."""
    import yaml
    from test_training_distributed import torchrun

    from t2mlr.training import checkpoint as ckpt

    tree = load_yaml_tree(resolve_config_path("debug"))
    recurrence = T2MLRConfig.recurrence_fields()
    tree["model"] = {key: value for key, value in tree["model"].items() if key not in recurrence}
    tree["model"].update(arch="looped", loop_blocks="2-3", loops=3)
    config = tmp_path / "looped.yaml"
    config.write_text(yaml.safe_dump(apply_overrides(tree, TINY[:4] + ["data.kwargs.vocab_size=32"] + DISTRIBUTED)))
    train(load_config(config, ["train.micro_batch_size=4"]), tmp_path / "single")
    torchrun(tmp_path / "fsdp", "fsdp", config=str(config), overrides=[])

    def losses(run: Path) -> list[float]:
        lines = (run / "metrics.jsonl").read_text().splitlines()
        return [r["loss"] for r in map(json.loads, lines) if r["split"] == "train"]

    assert losses(tmp_path / "fsdp") == pytest.approx(losses(tmp_path / "single"), rel=1e-5)
    last = Path("checkpoints") / "step_00000003" / ckpt.MODEL_FILE
    single, sharded = ckpt.load_weights(tmp_path / "single" / last), ckpt.load_weights(tmp_path / "fsdp" / last)
    assert single.keys() == sharded.keys()
    for name in single:
        torch.testing.assert_close(sharded[name], single[name], rtol=1e-4, atol=1e-5, msg=name)
    assert "parallel fsdp × 2 rank(s)" in (tmp_path / "fsdp" / "train.log").read_text()


@pytest.mark.parametrize("kind", ["matched transformer", "looped"])
def test_a_plain_model_keeps_a_packed_rows_documents_apart(kind: str) -> None:
    """The inputs the trainer and the analyses give a model without recurrence (`PLAIN_FORWARD`): a packed row's
    second document (position_ids restarting at 0) gets the logits it gets alone. With transformers' default
    use_cache=True the plain Llama created a cache, which turns off its packed-row detection, and the document
    attended to the one before it (0.4 apart in the matched Transformer of `experiment pretrain --preset tiny`)."""
    from t2mlr.analysis.common import model_inputs
    from t2mlr.baselines import LoopedConfig, MatchedLlamaForCausalLM, matched_llama_config

    torch.manual_seed(0)
    base = tiny_base_config(layers=4)
    plain = (MatchedLlamaForCausalLM(matched_llama_config(base, 40)) if kind == "matched transformer"
             else LoopedForCausalLM(LoopedConfig.from_base(base, loop_start=1, loop_end=2, loops=2)))
    plain = plain.double().eval()
    ids = torch.randint(3, 61, (1, 10))
    batch = {"input_ids": ids, "position_ids": torch.tensor([[0, 1, 2, 3, 4, 5, 0, 1, 2, 3]]), "labels": ids}
    inputs = model_inputs(plain, batch)
    inputs.pop("labels")
    with torch.no_grad():
        packed = plain(**inputs).logits[0, 6:]
        alone = plain(input_ids=ids[:, 6:]).logits[0]
        crossing = plain(input_ids=ids, position_ids=batch["position_ids"]).logits[0, 6:]  # the default use_cache
    torch.testing.assert_close(packed, alone, rtol=0, atol=1e-12)
    if kind == "matched transformer":
        assert (crossing - alone).abs().max() > 1e-3  # without PLAIN_FORWARD the test would fail
