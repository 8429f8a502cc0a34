"""Parameter-matched baselines: matching numbers, the LSTM's interface, save/load, the `params` command."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from transformers import AutoModelForCausalLM, LlamaConfig

import t2mlr.baselines  # noqa: F401  (registers the baseline model types)
from t2mlr.baselines import (
    MatchedLlamaForCausalLM,
    T2MLRLSTMConfig,
    T2MLRLSTMForCausalLM,
    count_parameters,
    head_dim_of,
    lstm_parameter_count,
    matched_hidden_size,
    matched_llama_config,
    matched_models,
    parameter_count_of_config,
    smallest_at_least,
    t2mlr_parameter_count,
    widened_config,
)
from t2mlr.experiments.parameter_counts import main as params_main
from t2mlr.model.shapes import smollm2_135m_t2mlr_config as smollm2_135m_config


@pytest.fixture(scope="module")
def smollm_set():
    return matched_models(smollm2_135m_config(13, 18))


def test_135m_transformer_is_widened_to_584(smollm_set) -> None:
    t2, base = smollm_set.t2mlr, smollm_set.t2mlr.base_config
    assert smollm_set.t2mlr_params == t2mlr_parameter_count(t2)
    assert matched_hidden_size(base, smollm_set.t2mlr_params) == 584
    tf = smollm_set.transformer
    assert (tf.hidden_size, tf.head_dim, tf.num_attention_heads, tf.num_key_value_heads) == (584, 64, 9, 3)
    assert tf.intermediate_size == 1536 and tf.num_hidden_layers == 30
    assert smollm_set.t2mlr_params <= smollm_set.transformer_params <= 1.01 * smollm_set.t2mlr_params
    # one unit narrower would fall short: 584 is the smallest width that reaches T²MLR's count
    narrower = matched_llama_config(base, 583)
    with torch.device("meta"):
        assert sum(p.numel() for p in MatchedLlamaForCausalLM(narrower).parameters()) < smollm_set.t2mlr_params


def test_135m_t2mlr_extra_parameters_follow_spec(smollm_set) -> None:
    d = 576
    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(smollm_set.t2mlr.base_config)
    assert smollm_set.t2mlr_params - sum(p.numel() for p in base.parameters()) == 5 * d * d + 3 * d + 2


def test_135m_lstm_matched_within_one_percent(smollm_set) -> None:
    assert smollm_set.lstm.num_layers == 4
    assert smollm_set.t2mlr_params <= smollm_set.lstm_params <= 1.01 * smollm_set.t2mlr_params
    smaller = T2MLRLSTMConfig(vocab_size=49152, hidden_size=smollm_set.lstm.hidden_size - 1, num_layers=4)
    assert lstm_parameter_count(smaller) < smollm_set.t2mlr_params


def test_smallest_at_least() -> None:
    assert smallest_at_least(lambda w: w * w, 50) == 8
    assert smallest_at_least(lambda w: w, 1) == 1
    assert smallest_at_least(lambda w: 10 * w, 35, start=2) == 4
    with pytest.raises(ValueError):
        smallest_at_least(lambda w: 0, 1)


def _lstm(seed: int = 0) -> T2MLRLSTMForCausalLM:
    torch.manual_seed(seed)
    return T2MLRLSTMForCausalLM(T2MLRLSTMConfig(vocab_size=23, hidden_size=12, num_layers=4))


def test_lstm_padding_does_not_change_real_logits() -> None:
    model = _lstm().eval()
    row = torch.randint(3, 23, (1, 6))
    alone = model(input_ids=row).logits
    pad = torch.zeros(1, 3, dtype=torch.long)
    right = model(input_ids=torch.cat([row, pad], 1), attention_mask=torch.tensor([[1] * 6 + [0] * 3])).logits
    left = model(input_ids=torch.cat([pad, row], 1), attention_mask=torch.tensor([[0] * 3 + [1] * 6])).logits
    torch.testing.assert_close(right[:, :6], alone)
    torch.testing.assert_close(left[:, 3:], alone)


def test_lstm_loss_is_the_causal_lm_loss() -> None:
    model = _lstm().eval()
    ids = torch.randint(3, 23, (2, 7))
    labels = ids.clone()
    labels[:, :3] = -100
    out = model(input_ids=ids, labels=labels)
    expected = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, 23), labels[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, expected)


def test_lstm_accepts_t2mlr_keywords_and_refuses_packed_rows() -> None:
    model = _lstm().eval()
    ids = torch.randint(3, 23, (1, 5))
    plain = model(input_ids=ids).logits
    torch.testing.assert_close(model(input_ids=ids, recurrence="exact", d_forward=4, d_backward=2).logits, plain)
    with pytest.raises(ValueError, match="packed documents"):
        model(input_ids=ids, position_ids=torch.tensor([[0, 1, 2, 0, 1]]))
    with pytest.raises(ValueError, match="token ids"):
        model(input_ids=torch.tensor([[1, 99]]))


def test_lstm_config_validates() -> None:
    with pytest.raises(ValueError, match="hidden_size"):
        T2MLRLSTMConfig(hidden_size=0)


def test_matched_llama_with_uneven_width_saves_and_loads(tmp_path) -> None:
    base = LlamaConfig(vocab_size=31, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                       num_attention_heads=3, num_key_value_heads=1, head_dim=8)
    config = matched_llama_config(base, 26)  # 26 is not a multiple of 3 heads: plain LlamaConfig refuses it
    assert (config.hidden_size, config.head_dim, config.num_attention_heads) == (26, 8, 3)
    torch.manual_seed(0)
    model = MatchedLlamaForCausalLM(config).eval()
    model.save_pretrained(tmp_path / "tf")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "tf").eval()
    ids = torch.randint(0, 31, (2, 5))
    torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_matched_llama_rejects_other_families() -> None:
    from transformers import Qwen2Config

    with pytest.raises(ValueError, match="Llama"):
        matched_llama_config(Qwen2Config(hidden_size=32, num_attention_heads=4), 40)


def test_params_command_prints_all_three(capsys) -> None:
    assert params_main(["params", "--preset", "s5-tiny"]) == 0
    printed = capsys.readouterr().out
    for name in ("T²MLR", "Transformer (matched)", "LSTM (matched)"):
        assert name in printed


def test_matched_hidden_size_keeps_heads_and_reaches_the_parameter_count() -> None:
    model = tiny_model(dtype=torch.float32, l_start=2, l_end=3)
    base_config = model.config.base_config
    target = count_parameters(model)
    hidden = matched_hidden_size(base_config, target)
    widened = widened_config(base_config, hidden)
    assert widened.num_attention_heads == base_config.num_attention_heads
    assert head_dim_of(widened) == head_dim_of(base_config) == 8
    assert parameter_count_of_config(widened) >= target > parameter_count_of_config(widened_config(base_config, hidden - 1))
    assert count_parameters(model.base_decoder()) == parameter_count_of_config(base_config)
