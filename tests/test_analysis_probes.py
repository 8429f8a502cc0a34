"""`t2mlr analyze probes`: the probe recovers a token that the features contain by construction, finds
nothing in noise, targets respect documents, and the command runs end to end."""

from __future__ import annotations

import json
import math

import pytest
import torch
from analysis_helpers import save_tiny_t2mlr, save_tiny_transformer, write_ids_jsonl
from conftest import tiny_model

from t2mlr.analysis.probes import (
    ProbeSettings,
    block_hidden_states,
    check_offsets,
    probe_targets,
    train_probe,
)
from t2mlr.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")
VOCAB = 20


def _features_holding(targets: torch.Tensor, hidden: int = 32, noise: float = 0.1, seed: int = 0) -> torch.Tensor:
    """Hidden states that contain the target: a fixed random code per token, plus noise."""
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randn(VOCAB, hidden, generator=torch.Generator().manual_seed(99))
    return codes[targets] + noise * torch.randn(len(targets), hidden, generator=generator)


def test_a_state_that_holds_the_next_token_is_probed_to_near_zero_loss() -> None:
    generator = torch.Generator().manual_seed(0)
    train_y = torch.randint(0, VOCAB, (2000,), generator=generator)
    eval_y = torch.randint(0, VOCAB, (500,), generator=generator)
    settings = ProbeSettings(steps=300, batch_size=256, lr=1e-2)
    result = train_probe(_features_holding(train_y), train_y, _features_holding(eval_y, seed=1), eval_y, VOCAB, settings)
    assert result.loss < 0.05 and result.accuracy > 0.99
    noise = train_probe(torch.randn(2000, 32, generator=generator), train_y, torch.randn(500, 32, generator=generator),
                        eval_y, VOCAB, settings)
    assert noise.loss > 0.9 * math.log(VOCAB)  # nothing to read: about the uniform loss, never near zero


def test_the_two_layer_probe_also_reads_it() -> None:
    generator = torch.Generator().manual_seed(3)
    train_y = torch.randint(0, VOCAB, (2000,), generator=generator)
    eval_y = torch.randint(0, VOCAB, (500,), generator=generator)
    result = train_probe(_features_holding(train_y), train_y, _features_holding(eval_y, seed=2), eval_y, VOCAB,
                         ProbeSettings(kind="mlp", steps=300, batch_size=256, lr=1e-2))
    assert result.loss < 0.1


def test_targets_look_ahead_by_the_offset_inside_each_document() -> None:
    ids = torch.tensor([[10, 11, 12, 13, 14, 15]])
    positions = torch.tensor([[0, 1, 2, 0, 1, 2]])  # two documents of three tokens
    valid, targets = probe_targets(ids, positions, 1)
    assert valid.tolist() == [[True, True, False, True, True, False]]
    assert targets[valid].tolist() == [11, 12, 14, 15]
    valid, targets = probe_targets(ids, positions, 2)
    assert valid.tolist() == [[True, False, False, True, False, False]]
    assert targets[valid].tolist() == [12, 15]
    valid, _ = probe_targets(ids, None, 6)
    assert not valid.any()
    padded = torch.tensor([[1, 1, 1, 1, 0, 0]])
    valid, _ = probe_targets(ids, None, 1, attention_mask=padded)
    assert valid.tolist() == [[True, True, True, False, False, False]]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_offsets_must_be_positive_ints(bad) -> None:
    with pytest.raises(ValueError, match="offsets must be ints >= 1"):
        check_offsets([1, bad])
    assert check_offsets([2, 1, 2]) == [2, 1]


def test_hidden_states_are_the_blocks_outputs_on_the_exact_path() -> None:
    model = tiny_model(dtype=torch.float64)
    ids = torch.randint(3, 61, (2, 9), generator=torch.Generator().manual_seed(0))
    states = block_hidden_states(model, {"input_ids": ids})
    assert states.shape == (5, 2, 9, 32)
    with torch.no_grad():
        reference = model(ids, recurrence="exact", output_hidden_states=True).hidden_states
    assert torch.allclose(states[2], reference[3].float())  # block 3 (inside the recurrent block 2..4)


def test_command_probes_both_models_at_both_offsets(tmp_path, capsys) -> None:
    model_dir = save_tiny_t2mlr(tmp_path / "t2mlr")
    baseline = save_tiny_transformer(tmp_path / "transformer")
    data = write_ids_jsonl(tmp_path / "data.jsonl", documents=60)
    out = tmp_path / "out"
    code = main(["analyze", "probes", str(model_dir), str(baseline), "--data", str(data), "--seq-len", "16",
                 "--rows", "40", "--probe-steps", "30", "--probe-batch", "64", "--out", str(out), "--threads", "1"])
    assert code == 0, capsys.readouterr().err
    for name in ("probes.md", "probes.json", "probes.png"):
        assert (out / name).is_file(), name
    payload = json.loads((out / "probes.json").read_text())
    assert payload["offsets"] == [1, 2] and len(payload["models"]) == 2
    for model in payload["models"]:
        assert set(model["probes"]) == {"1", "2"}
        assert all(len(per_block) == 5 for per_block in model["probes"].values())
    assert not set(payload["train_rows"]) & set(payload["heldout_rows"])
    table = (out / "probes.md").read_text()
    assert "T²MLR(2,4)" in table and "Transformer" in table and "+2" in table
    assert payload["settings"]["kind"] == "mlp"  # the paper's two-layer probe by default
    # columns count back from the head: the first layer column (ℓ−1) holds the last block's loss
    header = next(line for line in table.splitlines() if line.startswith("| model"))
    assert [c.strip() for c in header.split("|")[3:8]] == ["ℓ−1", "ℓ−2", "ℓ−3", "ℓ−4", "ℓ−5"]
    first_row = next(line for line in table.splitlines() if line.startswith("| T²MLR") and "+1" in line)
    last_block = payload["models"][0]["probes"]["1"][-1]["loss"]
    assert first_row.split("|")[3].strip() == f"{last_block:.3f}"


def test_command_refuses_offset_zero(tmp_path, capsys) -> None:
    model_dir = save_tiny_t2mlr(tmp_path / "t2mlr")
    data = write_ids_jsonl(tmp_path / "data.jsonl")
    code = main(["analyze", "probes", str(model_dir), "--data", str(data), "--seq-len", "16", "--offset", "0,1",
                 "--out", str(tmp_path / "out"), "--threads", "1"])
    assert code == 2 and ">= 1" in capsys.readouterr().err


def test_layers_probes_only_the_blocks_nearest_the_head(tmp_path, capsys) -> None:
    model_dir = save_tiny_t2mlr(tmp_path / "t2mlr")
    data = write_ids_jsonl(tmp_path / "data.jsonl", documents=60)
    out = tmp_path / "out"
    code = main(["analyze", "probes", str(model_dir), "--data", str(data), "--seq-len", "16", "--rows", "20",
                 "--offset", "2", "--layers", "2", "--probe", "linear", "--probe-steps", "5", "--probe-batch", "32",
                 "--out", str(out), "--threads", "1"])
    assert code == 0, capsys.readouterr().err
    payload = json.loads((out / "probes.json").read_text())
    assert [(p["block"], p["layer"]) for p in payload["models"][0]["probes"]["2"]] == [(4, "ℓ−2"), (5, "ℓ−1")]
    code = main(["analyze", "probes", str(model_dir), "--data", str(data), "--seq-len", "16", "--layers", "6",
                 "--out", str(tmp_path / "bad"), "--threads", "1"])
    assert code == 2 and "--layers must lie in [1, 5]" in capsys.readouterr().err
