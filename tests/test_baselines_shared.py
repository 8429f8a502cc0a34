"""What the looped and pause-token baselines share with each other and with T²MLR: wrapping a pretrained
decoder without copying it, the `loop_blocks` spelling, the arms of a comparison (`ModelSpec`,
`matched_arms`, `t2mlr params`), the input checks, and the FLOP model against torch's own FLOP counter."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import random_ids, tiny_base_config
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM, DynamicCache, GPT2Config

import t2mlr.baselines  # noqa: F401  (registers the baseline model types)
from t2mlr import T2MLRConfig, T2MLRForCausalLM
from t2mlr.baselines import (
    LoopedConfig,
    LoopedForCausalLM,
    ModelSpec,
    PauseConfig,
    PauseForCausalLM,
    matched_arms,
    parse_model_spec,
    parse_model_specs,
)
from t2mlr.baselines.costs import decode_step_flops, full_pairs, train_step_flops
from t2mlr.experiments.parameter_counts import SHAPE_NAMES
from t2mlr.experiments.parameter_counts import main as params_main
from t2mlr.model import T2MLRCache
from t2mlr.model.shapes import SHAPES

LAYERS = 5


def eager_base(seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny Llama with eager attention, whose score matmuls torch's FLOP counter sees."""
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_base_config(layers=LAYERS, **overrides), attn_implementation="eager")


# ---------------------------------------------------------------------------------------------- wrapping


@pytest.mark.parametrize("wrap", [
    lambda base: LoopedForCausalLM.from_base(base, loop_blocks="2-4", loops=3),
    lambda base: PauseForCausalLM.from_base(base, pauses=2),
])
def test_from_base_wraps_without_copying_or_reinitialising(wrap) -> None:
    base = eager_base()
    original = copy.deepcopy(base.state_dict())
    pointers = {name: p.data_ptr() for name, p in base.named_parameters()}
    model = wrap(base)
    assert model.model.layers is base.model.layers and model.lm_head is base.lm_head  # adopted, not copied
    own = dict(model.named_parameters())
    assert {name: own[name].data_ptr() for name in pointers} == pointers  # the same storage, the same names
    state = model.state_dict()
    for name, value in original.items():
        assert torch.equal(state[name], value), name
    if isinstance(model, PauseForCausalLM):  # the one new module is initialised like a token embedding
        std = float(model.model.pause_embeddings.weight.detach().std())
        assert 0.5 * base.config.initializer_range < std < 2 * base.config.initializer_range


def test_baselines_refuse_what_they_cannot_wrap() -> None:
    with pytest.raises(ValueError, match="pause-token model cannot wrap base model type 'gpt2'"):
        PauseConfig(base_config=GPT2Config(), pauses=1)
    with pytest.raises(ValueError, match="unknown PauseConfig field 'pause'. Did you mean 'pauses'"):
        PauseForCausalLM.from_base(eager_base(), pause=1)
    with pytest.raises(ValueError, match="load_kwargs applies only"):
        LoopedForCausalLM.from_base(eager_base(), loop_blocks="full", loops=2, load_kwargs={"dtype": "auto"})


# ---------------------------------------------------------------------------------------------- loop_blocks


@pytest.mark.parametrize("settings,expected", [
    ({"loop_blocks": "full", "loops": 2}, (1, LAYERS)),
    ({"loop_blocks": "2-4", "loops": 3}, (2, 4)),
    ({"loop_blocks": " 3-3 ", "loops": 2}, (3, 3)),
    ({"loop_blocks": "2-4", "loop_start": 2, "loops": 3}, (2, 4)),  # agreeing explicit ends are fine
    ({"loop_start": 2, "loop_end": 4, "loops": 3}, (2, 4)),
])
def test_loop_blocks_sets_the_range(settings, expected) -> None:
    config = LoopedConfig(base_config=tiny_base_config(layers=LAYERS), **settings)
    assert (config.loop_start, config.loop_end) == expected
    assert config.block_schedule()[: expected[0] - 1] == list(range(expected[0] - 1))


@pytest.mark.parametrize("settings,message", [
    ({"loop_blocks": "2-4", "loop_end": 5, "loops": 2}, "names blocks 2-4, but loop_end=5 was also given"),
    ({"loop_blocks": "4-2", "loops": 2}, "loop_start <= loop_end"),
    ({"loop_blocks": "2-9", "loops": 2}, f"loop_end <= {LAYERS}"),
    ({"loop_blocks": "middle", "loops": 2}, "loop_blocks must be 'full' or 'S-E'"),
    ({"loop_blocks": "2:4", "loops": 2}, "loop_blocks must be 'full' or 'S-E'"),
    ({"loops": 2}, "name the looped blocks"),
    ({"loop_start": 2, "loops": 2}, "name the looped blocks"),
])
def test_bad_loop_blocks_raise(settings, message) -> None:
    with pytest.raises(ValueError, match=message):
        LoopedConfig(base_config=tiny_base_config(layers=LAYERS), **settings)


def test_loop_blocks_round_trips_through_save_and_load(tmp_path) -> None:
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(tiny_base_config(layers=LAYERS))  # the default attention, as reloaded
    model = LoopedForCausalLM.from_base(base, loop_blocks="full", loops=2).eval()
    model.save_pretrained(tmp_path / "looped")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "looped").eval()
    assert (loaded.config.loop_blocks, loaded.config.loop_start, loaded.config.loop_end) == ("full", 1, LAYERS)
    ids = random_ids(1, 5)
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_pause_positions_must_fit_the_base_limit_after_interleaving() -> None:
    """Real position p becomes p·P .. p·P + P − 1, so a ×2 model over 16 positions takes real positions < 8."""
    model = PauseForCausalLM.from_base(eager_base(max_position_embeddings=16), pauses=1).eval()
    with torch.no_grad():
        model(input_ids=random_ids(1, 8))
    with pytest.raises(ValueError, match="position 8 exceeds"):
        model(input_ids=random_ids(1, 9))


# ---------------------------------------------------------------------------------------------- arms


@pytest.mark.parametrize("text,spec", [
    ("t2mlr:13-18", ModelSpec("t2mlr", start=13, end=18)),
    ("looped:full:2", ModelSpec("looped", loop_blocks="full", loops=2)),
    ("looped:9-22:3", ModelSpec("looped", loop_blocks="9-22", loops=3)),
    ("pause:2", ModelSpec("pause", period=2)),
    ("transformer", ModelSpec("transformer")),
])
def test_model_specs_parse_and_name_themselves(text: str, spec: ModelSpec) -> None:
    assert parse_model_spec(text) == spec and spec.name == text


@pytest.mark.parametrize("text,message", [
    ("t2mlr:13", "S,E or S-E"),
    ("t2mlr:0-3", "must be an integer >= 1"),
    ("looped:9-22", "full:K or S-E:K"),
    ("looped:full:0", "loop count K"),
    ("looped:mid:2", "loop_blocks must be 'full' or 'S-E'"),
    ("pause:1", "P − 1 pauses per token.*>= 2"),
    ("pause:x", "must be an integer >= 2"),
    ("lstm", "unknown model 'lstm'"),
    ("transformer:2", "unknown model"),
    (",", "no models named"),
])
def test_bad_model_specs_raise(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_model_specs(text)


def test_matched_arms_on_a_tiny_shape_reach_t2mlr_with_the_smallest_width() -> None:
    base = tiny_base_config(layers=LAYERS, hidden=32)
    specs = parse_model_specs("t2mlr:2-4,looped:full:2,pause:3,transformer")
    target, arms = matched_arms(base, specs)
    assert target == sum(p.numel() for p in T2MLRForCausalLM(T2MLRConfig.from_base(base, 2, 4)).parameters())
    by_kind = {arm.spec.kind: arm for arm in arms}
    assert by_kind["t2mlr"].parameters == target and by_kind["t2mlr"].hidden_size == 32
    for kind in ("looped", "pause", "transformer"):
        arm = by_kind[kind]
        assert arm.parameters >= target
        narrower = arm.config.base_config if kind != "transformer" else arm.config
        narrower = copy.deepcopy(narrower)
        narrower.hidden_size -= 1
        config = (LoopedConfig(base_config=narrower, loop_blocks="full", loops=2) if kind == "looped"
                  else PauseConfig(base_config=narrower, pauses=2) if kind == "pause" else narrower)
        with torch.device("meta"):
            assert sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters()) < target
    assert by_kind["pause"].config.pauses == 2  # pause:3 is ×3: two pauses after every token
    with pytest.raises(ValueError, match="loop_end <= 5"):
        matched_arms(base, parse_model_specs("looped:2-9:2"))


def test_params_command_prints_every_arm_side_by_side(capsys) -> None:
    assert SHAPE_NAMES == tuple(SHAPES)
    assert params_main(["params", "--base", "smollm2-135m", "--t2mlr", "13,18", "--looped", "full:2",
                        "--looped", "9-22:3", "--pause", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "136,175,618 parameters" in lines[0]
    rows = {line[2:26].strip(): line[26:].split() for line in lines[2:]}
    assert rows["T²MLR(13,18)"] == ["576", "136,175,618", "1.0000"]
    assert rows["looped full ×2"] == rows["looped 9-22 ×3"] == rows["Transformer (matched)"] == \
        ["584", "136,383,272", "1.0015"]
    assert rows["pause ×2"] == ["584", "136,383,856", "1.0015"]  # plus one 584-wide pause embedding


@pytest.mark.parametrize("argv,message", [
    (["--looped", "9-40:2"], "loop_end <= 30"),
    (["--pause", "1"], "argument --pause"),
    (["--t2mlr", "13"], "argument --t2mlr"),
    (["--preset", "s5-tiny", "--pause", "2"], "cannot be combined"),
])
def test_params_command_bad_specs_exit_2(argv, message, capsys) -> None:
    try:
        code = params_main(["params", *argv])
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2 and message in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- FLOP model


def counted_flops(run) -> int:
    with FlopCounterMode(display=False) as counter:
        run()
    return counter.get_total_flops()


def decoding_cases():
    base = eager_base()
    recurrent = T2MLRForCausalLM.from_base(eager_base(), 2, 4)
    looped = LoopedForCausalLM.from_base(eager_base(), loop_blocks="2-4", loops=3)
    pause = PauseForCausalLM.from_base(eager_base(), pauses=2)
    return [
        (base, lambda: DynamicCache(config=base.config), base.config),
        (recurrent, lambda: T2MLRCache(config=recurrent.config.base_config), recurrent.config),
        (looped, looped.model.new_cache, looped.config),
        (pause, pause.model.new_cache, pause.config),
    ]


@torch.no_grad()
def test_decode_step_flops_match_torch_flop_counter() -> None:
    """One decode step after a 6-token prompt: every matmul torch counts, and nothing else."""
    for model, new_cache, config in decoding_cases():
        model.eval()
        ids = random_ids(1, 7)
        cache = new_cache()
        model(input_ids=ids[:, :6], past_key_values=cache, use_cache=True)
        flops = counted_flops(lambda: model(input_ids=ids[:, 6:], past_key_values=cache, use_cache=True,
                                            logits_to_keep=1))
        assert flops == decode_step_flops(config, 7, pairs=full_pairs), type(model).__name__


def test_train_step_flops_match_torch_flop_counter() -> None:
    """Forward and backward of a 2 × 6 batch; eager attention computes full score matrices (full_pairs)."""
    cases = [
        eager_base(),
        T2MLRForCausalLM.from_base(eager_base(), 2, 4, d_forward=3, d_backward=2),
        T2MLRForCausalLM.from_base(eager_base(), 2, 4, d_forward=3, d_backward=3),  # the seed pass carries gradients
        T2MLRForCausalLM.from_base(eager_base(), 2, 4, train_recurrence="exact", bptt_window=3),  # one-pass replay
        LoopedForCausalLM.from_base(eager_base(), loop_blocks="full", loops=2),
        PauseForCausalLM.from_base(eager_base(), pauses=1),
    ]
    for model in cases:
        model.train()
        ids = random_ids(2, 6)

        def step() -> None:
            model(input_ids=ids, labels=ids).loss.backward()

        assert counted_flops(step) == 2 * train_step_flops(model.config, 6, pairs=full_pairs), type(model).__name__


@pytest.mark.slow
def test_flop_model_at_the_135m_shape_gives_the_papers_cost_order() -> None:
    """Decoding: T²MLR ≈ the Transformer, looping and pauses cost more (pauses growing with the context);
    these are the FLOP ratios the benchmarks print next to the measured ones."""
    from t2mlr.baselines.costs import decode_flops
    from t2mlr.model.shapes import smollm2_135m_base_config

    _, arms = matched_arms(smollm2_135m_base_config(), parse_model_specs(
        "t2mlr:13-18,looped:full:2,looped:9-22:3,pause:2,transformer"))
    ratio = {arm.spec.name: decode_flops(arm.config, 1024) / decode_flops(arms[-1].config, 1024) for arm in arms}
    assert 0.99 < ratio["t2mlr:13-18"] < 1.0  # 576 wide against 584, plus one fusion per token
    assert 1.7 < ratio["looped:9-22:3"] < ratio["looped:full:2"] < 2.0  # the LM head runs once per token
    short = decode_flops(arms[3].config, 64) / decode_flops(arms[-1].config, 64)
    assert 1.75 < short < ratio["pause:2"]  # attention over the doubled context grows with its length
