"""The GRU and vanilla-RNN baselines beside the LSTM: parameter matching against a hand count, the forward
against torch's own cell run by hand, save/load, the FLOP model, training in the S5 experiment, and misspelt
names refused with the valid choices."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

import t2mlr.baselines  # noqa: F401  (registers the baseline model types)
from t2mlr.baselines import (
    RECURRENT_CELLS,
    T2MLRGRUConfig,
    T2MLRGRUForCausalLM,
    T2MLRLSTMConfig,
    T2MLRLSTMForCausalLM,
    T2MLRRNNConfig,
    T2MLRRNNForCausalLM,
    matched_models,
    matched_recurrent_config,
    recurrent_parameter_count,
    t2mlr_parameter_count,
)
from t2mlr.baselines.costs import decode_step_flops, train_step_flops
from t2mlr.baselines.recurrent import recurrent_config_class
from t2mlr.model.shapes import smollm2_135m_t2mlr_config

GATES = {"lstm": 4, "gru": 3, "rnn": 1}  # gate blocks per layer of torch's cells
TORCH_CELLS = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}


def hand_count(cell: str, vocab: int, hidden: int, layers: int) -> int:
    """Embedding, per layer and gate block an input and a recurrent matrix with their two biases, head + bias."""
    return vocab * hidden + layers * GATES[cell] * (2 * hidden * hidden + 2 * hidden) + hidden * vocab + vocab


@pytest.mark.parametrize("cell", RECURRENT_CELLS)
def test_parameter_count_is_the_hand_count(cell: str) -> None:
    config = recurrent_config_class(cell)(vocab_size=37, hidden_size=11, num_layers=3)
    assert recurrent_parameter_count(config) == hand_count(cell, 37, 11, 3)
    model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == hand_count(cell, 37, 11, 3)


@pytest.mark.parametrize("cell", RECURRENT_CELLS)
def test_matched_width_is_the_smallest_reaching_the_target(cell: str) -> None:
    target = 100_000
    config = matched_recurrent_config(cell, 50, target, num_layers=4)
    assert type(config).cell == cell and config.num_layers == 4
    assert hand_count(cell, 50, config.hidden_size, 4) >= target > hand_count(cell, 50, config.hidden_size - 1, 4)


def test_135m_set_matches_every_recurrent_baseline_within_one_percent() -> None:
    matched = matched_models(smollm2_135m_t2mlr_config(13, 18))
    target = t2mlr_parameter_count(matched.t2mlr)
    assert [row[0] for row in matched.rows()] == ["T²MLR", "Transformer (matched)", "LSTM (matched)",
                                                   "GRU (matched)", "RNN (matched)"]
    for cell, config in matched.recurrent.items():
        assert matched.recurrent_params[cell] == hand_count(cell, 49152, config.hidden_size, 4)
        assert target <= matched.recurrent_params[cell] <= 1.01 * target
    # fewer gates per layer, so a wider cell at the same count
    assert matched.lstm.hidden_size < matched.recurrent["gru"].hidden_size < matched.recurrent["rnn"].hidden_size


@pytest.mark.parametrize("cell", RECURRENT_CELLS)
def test_forward_is_torchs_cell_between_the_embedding_and_the_head(cell: str) -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(recurrent_config_class(cell)(vocab_size=23, hidden_size=8, num_layers=2))
    model.eval()
    recurrent = getattr(model.model, cell)
    assert type(recurrent) is TORCH_CELLS[cell] and recurrent.num_layers == 2
    ids = torch.randint(0, 23, (2, 6))
    embeds = model.model.embed_tokens.weight[ids]
    expected = model.lm_head(recurrent(embeds)[0])
    torch.testing.assert_close(model(input_ids=ids).logits, expected)
    # padding (left or right) leaves a row's logits as they are alone
    row, pad = ids[:1], torch.zeros(1, 3, dtype=torch.long)
    left = model(input_ids=torch.cat([pad, row], 1), attention_mask=torch.tensor([[0] * 3 + [1] * 6])).logits
    torch.testing.assert_close(left[:, 3:], model(input_ids=row).logits)


@pytest.mark.parametrize("config_class, model_class", [(T2MLRLSTMConfig, T2MLRLSTMForCausalLM),
                                                       (T2MLRGRUConfig, T2MLRGRUForCausalLM),
                                                       (T2MLRRNNConfig, T2MLRRNNForCausalLM)])
def test_each_cell_trains_and_round_trips(tmp_path, config_class, model_class) -> None:
    torch.manual_seed(0)
    model = model_class(config_class(vocab_size=23, hidden_size=12, num_layers=2))
    ids = torch.randint(3, 23, (4, 9))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(3):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]
    model.save_pretrained(tmp_path / "saved")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
    assert type(loaded) is model_class and loaded.config.model_type == config_class.model_type
    assert loaded.config.num_layers == 2 and hasattr(loaded.model, config_class.cell)  # the cell's own key
    torch.testing.assert_close(loaded(input_ids=ids).logits, model.eval()(input_ids=ids).logits)
    with pytest.raises(ValueError, match=f"the {loaded.config.cell_label} baseline cannot reset"):
        loaded(input_ids=ids[:1, :4], position_ids=torch.tensor([[0, 1, 0, 1]]))


@pytest.mark.parametrize("cell", RECURRENT_CELLS)
def test_flops_are_the_hand_count(cell: str) -> None:
    hidden, layers, vocab, seq = 10, 3, 40, 7
    config = recurrent_config_class(cell)(vocab_size=vocab, hidden_size=hidden, num_layers=layers)
    per_token = layers * GATES[cell] * 2 * (hidden * hidden + hidden * hidden)  # 2 FLOPs per multiply-add
    head = 2 * hidden * vocab
    assert decode_step_flops(config, context=5) == per_token + head
    assert train_step_flops(config, seq) == 3 * seq * (per_token + head)


def test_unknown_cells_and_baselines_are_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="cells are lstm, gru, rnn"):
        recurrent_config_class("lstmm")
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        T2MLRLSTMConfig(tie_word_embeddings=True)
    from t2mlr.training.arms import matched_arm

    with pytest.raises(ValueError, match="unknown baseline 'grU': use one of transformer, lstm, gru, rnn"):
        matched_arm({}, "x", "grU")


def test_gru_and_rnn_train_in_the_s5_experiment(tmp_path) -> None:
    """`--models gru rnn` trains both on the tiny preset, matched to T²MLR's count (never below it)."""
    import yaml
    from test_experiment_s5 import run_experiment

    from t2mlr.experiments.parameter_counts import preset_model

    out = tmp_path / "s5"
    results = run_experiment(out, overrides=("train.max_steps=2", "task.baseline_steps=2"), models=("gru", "rnn"),
                             workers=1)
    assert [r.label for r in results] == ["GRU (matched)", "RNN (matched)"]
    target = t2mlr_parameter_count(preset_model("s5-tiny"))
    for result in results:
        base = yaml.safe_load((out / result.name / "config.yaml").read_text())["model"]["base"]
        assert base["model_type"] == f"t2mlr_{result.name}"
        assert target <= result.parameters == hand_count(result.name, base["vocab_size"], base["hidden_size"], 4)
        assert set(result.per_n) == {1, 2, 3, 4}
    text = (out / "results.md").read_text(encoding="utf-8")
    assert "GRU: 4 layers" in text and "RNN: 4 layers" in text
