"""Every preset of the paper's pretraining tables: its placement, shape and parameter count, checked
against the shapes in `t2mlr.model.shapes` and against hand-written facts from the paper."""

from __future__ import annotations

import pytest
import torch

from t2mlr.model.shapes import base_config_for_shape
from t2mlr.training.config import load_config, resolve_config_path
from t2mlr.training.model_factory import build_model

# preset -> (shape, (l_start, l_end) or None for a Transformer, max_steps, exact parameter count)
# T²MLR counts: the backbone's (Llama formula) + 5d² + 3d + 2 for the fusion and the cache norm, e.g. 135M:
# 134,515,008 + 1,658,880 + 1,728 + 2; the matched baselines' counts are those `t2mlr params` prints.
PAPER_PRESETS = {
    "smollm2_135m_baseline": ("smollm2-135m", None, 20000, 136_383_272),
    "smollm2_135m_1_30": ("smollm2-135m", (1, 30), 20000, 136_175_618),
    "smollm2_135m_5_26": ("smollm2-135m", (5, 26), 20000, 136_175_618),
    "smollm2_135m_9_22": ("smollm2-135m", (9, 22), 20000, 136_175_618),
    "smollm2_135m_13_18": ("smollm2-135m", (13, 18), 20000, 136_175_618),
    "smollm2_135m_15_16": ("smollm2-135m", (15, 16), 20000, 136_175_618),
    "smollm2_135m_1_6": ("smollm2-135m", (1, 6), 20000, 136_175_618),
    "smollm2_135m_25_30": ("smollm2-135m", (25, 30), 20000, 136_175_618),
    "smollm2_135m_1_14": ("smollm2-135m", (1, 14), 20000, 136_175_618),
    "smollm2_135m_17_30": ("smollm2-135m", (17, 30), 20000, 136_175_618),
    "smollm2_135m_baseline_compute_matched": ("smollm2-135m", None, 44800, 136_383_272),
    "smollm2_360m_9_24": ("smollm2-360m", (9, 24), 20000, 366_432_002),
    "smollm2_360m_baseline": ("smollm2-360m", None, 20000, 366_720_781),
    "smollm2_1b_9_24": ("smollm2-1b", (9, 24), 20000, 993_343_490),
    "smollm2_1b_baseline": ("smollm2-1b", None, 20000, 993_683_875),
    # the 50B-token runs of the 135M and 360M rows: the same models, ceil(50e9 / (256 × 2048)) steps
    "smollm2_135m_13_18_50b": ("smollm2-135m", (13, 18), 95368, 136_175_618),
    "smollm2_135m_baseline_50b": ("smollm2-135m", None, 95368, 136_383_272),
    "smollm2_360m_9_24_50b": ("smollm2-360m", (9, 24), 95368, 366_432_002),
    "smollm2_360m_baseline_50b": ("smollm2-360m", None, 95368, 366_720_781),
}
FIFTY_B = [name for name in PAPER_PRESETS if name.endswith("_50b")]
SHAPE_FIELDS = ("intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "vocab_size", "tie_word_embeddings")


def _count(model_cfg) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in build_model(model_cfg).parameters())


@pytest.mark.parametrize("name", list(PAPER_PRESETS))
def test_paper_preset_shape_placement_and_parameters(name: str) -> None:
    shape, placement, steps, parameters = PAPER_PRESETS[name]
    cfg = load_config(name)
    base, reference = cfg.model.base, base_config_for_shape(shape)
    assert {f: base[f] for f in SHAPE_FIELDS} == {f: getattr(reference, f) for f in SHAPE_FIELDS}
    if placement is None:
        assert cfg.model.arch == "transformer" and cfg.eval.recurrence is None
        assert base["hidden_size"] > reference.hidden_size and base["head_dim"] == 64
    else:
        assert cfg.model.arch == "t2mlr" and (cfg.model.l_start, cfg.model.l_end) == placement
        assert base["hidden_size"] == reference.hidden_size
        assert (cfg.model.d_forward, cfg.model.d_backward) == (16, 4)
    assert _count(cfg.model) == parameters
    # the paper's training: FineWeb-Edu shards, 2048-token rows, batch 256, AdamW (0.9, 0.98), cosine to 0.001×
    assert cfg.data.source == "shards" and cfg.data.seq_len == 2048 and cfg.train.global_batch_size == 256
    assert cfg.optim.betas == (0.9, 0.98) and cfg.optim.lr == 5e-4 and cfg.schedule.min_lr_ratio == 0.001
    assert cfg.train.max_steps == steps


def test_matched_baselines_are_the_smallest_width_at_least_their_t2mlr() -> None:
    for shape in ("smollm2_135m", "smollm2_360m", "smollm2_1b"):
        baseline = load_config(f"{shape}_baseline")
        t2mlr = PAPER_PRESETS[{"smollm2_135m": "smollm2_135m_13_18"}.get(shape, f"{shape}_9_24")][3]
        assert _count(baseline.model) >= t2mlr
        narrower = load_config(f"{shape}_baseline", [f"model.base.hidden_size={baseline.model.base['hidden_size'] - 1}"])
        assert _count(narrower.model) < t2mlr


def test_backbones_have_the_papers_model_sizes() -> None:
    """The paper labels its 361M and 1B T²MLR models by the backbone's count: 361.8M and 981.5M."""
    from transformers import LlamaForCausalLM

    for shape, label in (("smollm2-360m", 361.8e6), ("smollm2-1b", 981.5e6)):
        with torch.device("meta"):
            count = sum(p.numel() for p in LlamaForCausalLM(base_config_for_shape(shape)).parameters())
        assert abs(count - label) < 0.05e6, (shape, count)


def test_every_preset_header_says_what_it_reproduces() -> None:
    for name in PAPER_PRESETS:
        header = resolve_config_path(name).read_text(encoding="utf-8").split("\nextends:")[0]
        assert "Reproduces" in header or "reproduces" in header, name


def test_the_readme_training_line_loads_with_its_overrides() -> None:
    """`t2mlr train smollm2_135m_15_16 ... data.path=data/fineweb data.tokenizer=...` (loading reads no data)."""
    cfg = load_config("smollm2_135m_15_16", ["data.path=data/fineweb", "data.tokenizer=HuggingFaceTB/SmolLM2-135M"])
    assert (cfg.data.source, cfg.data.path, cfg.data.tokenizer) == ("shards", "data/fineweb", "HuggingFaceTB/SmolLM2-135M")
    assert (cfg.model.l_start, cfg.model.l_end) == (15, 16) and cfg.eval.data.path == "data/fineweb_val"


@pytest.mark.parametrize("name", FIFTY_B)
def test_fifty_billion_token_presets_differ_from_their_10b_row_only_in_length_and_data(name: str) -> None:
    long_run, short_run = load_config(name).to_dict(), load_config(name.removesuffix("_50b")).to_dict()
    tokens = long_run["train"]["max_steps"] * long_run["train"]["global_batch_size"] * long_run["data"]["seq_len"]
    step_tokens = long_run["train"]["global_batch_size"] * long_run["data"]["seq_len"]
    assert 50e9 <= tokens < 50e9 + step_tokens  # the fewest whole steps that reach 50B tokens
    # a 50B run cannot read the 10BT sample once: its own training shards and a held-out split outside them
    assert long_run["data"]["path"] != short_run["data"]["path"]
    assert long_run["eval"]["data"]["path"] not in (short_run["eval"]["data"]["path"], long_run["data"]["path"])
    for section in ("model", "optim", "schedule"):
        assert long_run[section] == short_run[section], section
    for run in (long_run, short_run):
        run["train"].pop("max_steps"), run["data"].pop("path"), run["eval"]["data"].pop("path")
    assert long_run["train"] == short_run["train"] and long_run["data"] == short_run["data"]
