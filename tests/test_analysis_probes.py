"""`t2mlr analyze probes`: the probe recovers a token that the features contain by construction, finds
nothing in noise, targets respect documents, offsets t+1..t+K are spelt as a range and refused outside
1..seq_len−1 before any forward pass, saved heads reload to the same held-out loss (against a float64
hand-written forward of their tensors), the model-against-baseline table is the difference of the two
models' probes, and the command runs end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from analysis_helpers import save_tiny_t2mlr, save_tiny_transformer, write_ids_jsonl
from conftest import VOCAB as MODEL_VOCAB
from conftest import tiny_model

import t2mlr.analysis.probes as probes_module
from t2mlr.analysis.common import data_config_for, load_analysis_model, model_batches
from t2mlr.analysis.probes import (
    ProbeSettings,
    block_hidden_states,
    check_offsets,
    collect_features,
    fit_probe,
    load_probe_heads,
    parse_offsets,
    probe_targets,
    save_probe_heads,
    train_probe,
)
from t2mlr.cli import main
from t2mlr.training.data import build_dataset

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


def _probe_tiny_pair(tmp_path, capsys, *options: str) -> tuple[Path, Path, Path, Path]:
    """`t2mlr analyze probes` on a tiny T²MLR and a tiny Transformer (16-token rows); (out, model, baseline, data)."""
    model_dir = save_tiny_t2mlr(tmp_path / "t2mlr")
    baseline = save_tiny_transformer(tmp_path / "transformer")
    data = write_ids_jsonl(tmp_path / "data.jsonl", documents=60)
    out = tmp_path / "out"
    code = main(["analyze", "probes", str(model_dir), str(baseline), "--data", str(data), "--seq-len", "16",
                 *options, "--out", str(out), "--threads", "1"])
    assert code == 0, capsys.readouterr().err
    return out, model_dir, baseline, data


def test_command_probes_both_models_at_both_offsets(tmp_path, capsys) -> None:
    out, *_ = _probe_tiny_pair(tmp_path, capsys, "--rows", "40", "--probe-steps", "30", "--probe-batch", "64")
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


# ---------------------------------------------------------------------------------------------- offsets t+1..t+K


def test_offsets_are_spelt_as_lists_and_ranges() -> None:
    assert parse_offsets("1..4") == [1, 2, 3, 4]
    assert parse_offsets("1..3,6") == [1, 2, 3, 6]
    assert parse_offsets("2,1,2") == [2, 1]
    assert parse_offsets("3..3") == [3]


@pytest.mark.parametrize("bad", ["0..3", "3..1", "x", "1...3", "1..", "", "-1"])
def test_a_misspelt_offset_is_refused_with_the_form(bad) -> None:
    with pytest.raises(ValueError, match="--offset|at least one"):
        parse_offsets(bad)


def test_offsets_past_the_row_are_refused_with_the_valid_range() -> None:
    assert check_offsets([1, 15], seq_len=16) == [1, 15]
    with pytest.raises(ValueError, match=r"must lie in 1\.\.15"):
        check_offsets([1, 16], seq_len=16)


def _no_forward_pass(*args, **kwargs):
    raise AssertionError("a forward pass ran before the offsets were checked")


@pytest.mark.parametrize("offset, documents, message", [
    ("1..16", {}, "offsets must lie in 1..15"),  # past the row
    ("2..6", {"low": 3, "high": 5}, "--offset 4: no train token has a target 4 tokens ahead"),  # past every document
])
def test_bad_offsets_stop_before_any_forward_pass(tmp_path, capsys, monkeypatch, offset, documents, message) -> None:
    monkeypatch.setattr(probes_module, "block_hidden_states", _no_forward_pass)
    model_dir = save_tiny_t2mlr(tmp_path / "t2mlr")
    data = write_ids_jsonl(tmp_path / "data.jsonl", documents=150, **documents)  # documents of 3 or 4 tokens
    code = main(["analyze", "probes", str(model_dir), "--data", str(data), "--seq-len", "16", "--rows", "20",
                 "--offset", offset, "--out", str(tmp_path / "out"), "--threads", "1"])
    assert code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------- saved heads


def _reference_loss(tensors: dict[str, torch.Tensor], prefix: str, kind: str, x: torch.Tensor,
                    y: torch.Tensor) -> float:
    """The held-out loss from a head's raw tensors, written out in float64 (standardise, layers, log-softmax)."""
    t = {name[len(prefix):]: value.double() for name, value in tensors.items() if name.startswith(prefix)}
    z = (x.double() - t["mean"]) / t["spread"]
    if kind == "linear":
        logits = z @ t["net.weight"].T + t["net.bias"]
    else:
        hidden = torch.nn.functional.gelu(z @ t["net.0.weight"].T + t["net.0.bias"])
        logits = hidden @ t["net.2.weight"].T + t["net.2.bias"]
    return float(-torch.log_softmax(logits, dim=-1).gather(1, y[:, None]).mean())


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_saved_heads_reload_to_the_same_held_out_loss(tmp_path, kind) -> None:
    from safetensors.torch import load_file

    generator = torch.Generator().manual_seed(5)
    train_y, eval_y = torch.randint(0, VOCAB, (800,), generator=generator), torch.randint(0, VOCAB, (300,), generator=generator)
    train_x, eval_x = _features_holding(train_y, noise=1.0), _features_holding(eval_y, noise=1.0, seed=4)
    settings = ProbeSettings(kind=kind, steps=60, batch_size=128, lr=1e-2)
    heads = {3: {2: fit_probe(train_x, train_y, VOCAB, settings), 4: fit_probe(2 * train_x, train_y, VOCAB, settings)}}
    results = {3: {b: train_probe(f * train_x, train_y, f * eval_x, eval_y, VOCAB, settings)
                   for b, f in ((2, 1), (4, 2))}}
    weights, index = save_probe_heads(heads, tmp_path / "model", {"label": "hand-made"}, results, num_layers=4)
    loaded = load_probe_heads(index)
    tensors = load_file(weights)
    meta = json.loads(index.read_text())
    assert {(h["offset"], h["block"], h["layer"]) for h in meta["heads"]} == {(3, 2, "ℓ−3"), (3, 4, "ℓ−1")}
    for block, factor in ((2, 1), (4, 2)):
        loss, accuracy = loaded[3][block].score(factor * eval_x, eval_y)
        assert loss == pytest.approx(results[3][block].loss, abs=1e-6)
        assert accuracy == results[3][block].accuracy
        reference = _reference_loss(tensors, f"offset3.block{block}.", kind, factor * eval_x, eval_y)
        assert loss == pytest.approx(reference, abs=1e-5)
    assert results[3][2].loss < 0.5 * math.log(VOCAB)  # the features hold the target: the probe learnt something


def test_command_saves_heads_that_reproduce_the_table_and_compares_per_offset(tmp_path, capsys) -> None:
    out, model_dir, baseline, data = _probe_tiny_pair(tmp_path, capsys, "--rows", "24", "--offset", "1..3", "--layers",
                                                      "2", "--probe", "linear", "--probe-steps", "20", "--probe-batch", "64")
    payload = json.loads((out / "probes.json").read_text())
    assert payload["offsets"] == [1, 2, 3]
    # the comparison is each layer's model loss minus the baseline's, matched by layer name
    by_layer = [{(k, p["layer"]): p["loss"] for k, per in m["probes"].items() for p in per} for m in payload["models"]]
    for k, rows in payload["comparison"].items():
        assert [r["layer"] for r in rows] == ["ℓ−1", "ℓ−2"]
        for r in rows:
            assert r["model"] == by_layer[0][(k, r["layer"])] and r["baseline"] == by_layer[1][(k, r["layer"])]
            assert r["difference"] == pytest.approx(r["model"] - r["baseline"], abs=1e-12)
    table = (out / "probes.md").read_text()
    assert "| x(t+3) | ℓ−1 | ℓ−2 |" in table and table.count("| difference |") == 3
    # the saved heads, reloaded, give the table's held-out loss on the held-out rows' features
    rows = payload["heldout_rows"]
    dataset = build_dataset(data_config_for(str(data), model_dir, 16, None, None), MODEL_VOCAB, name="--data")
    batches = model_batches(dataset, rows, 8)
    for entry, directory in zip(payload["models"], (model_dir, baseline)):
        heads = load_probe_heads(out / entry["heads"])
        features = collect_features(load_analysis_model(directory, "cpu"), batches, [1, 2, 3], "reload")
        for k, per_block in heads.items():
            assert sorted(per_block) == [4, 5]
            x, y = features[k]
            for p in entry["probes"][str(k)]:
                assert per_block[p["block"]].score(x[p["block"] - 1], y)[0] == pytest.approx(p["loss"], abs=1e-6)


def test_no_save_heads_writes_none(tmp_path, capsys) -> None:
    model_dir = save_tiny_t2mlr(tmp_path / "t2mlr")
    data = write_ids_jsonl(tmp_path / "data.jsonl", documents=40)
    out = tmp_path / "out"
    code = main(["analyze", "probes", str(model_dir), "--data", str(data), "--seq-len", "16", "--rows", "12",
                 "--offset", "1", "--layers", "1", "--probe", "linear", "--probe-steps", "3", "--no-save-heads",
                 "--out", str(out), "--threads", "1"])
    assert code == 0, capsys.readouterr().err
    assert not (out / "probe_heads").exists()
    assert json.loads((out / "probes.json").read_text())["models"][0]["heads"] is None


@pytest.mark.parametrize("offset", [1, 3])
def test_features_coding_the_token_k_ahead_are_read_only_at_offset_k(offset) -> None:
    """i.i.d. tokens: a state that encodes x(t+k) is probed to ~0 loss against probe_targets' offset-k targets,
    and to about log(vocab) against the offset-(k+1) targets (x(t+k+1) is independent of x(t+k))."""
    ids = torch.randint(0, VOCAB, (40, 64), generator=torch.Generator().manual_seed(offset))
    valid, targets = probe_targets(ids, None, offset)
    features = torch.zeros(40, 64, 32)
    features[valid] = _features_holding(targets[valid])
    split = 30  # rows 0..29 train the probe, 30..39 score it
    settings = ProbeSettings(kind="linear", steps=300, batch_size=256, lr=1e-2)
    for k, bound in ((offset, "low"), (offset + 1, "uniform")):
        valid_k, targets_k = probe_targets(ids, None, k)
        both = valid_k & valid  # positions whose feature was written
        train, held = both.clone(), both.clone()
        train[split:], held[:split] = False, False
        result = train_probe(features[train], targets_k[train], features[held], targets_k[held], VOCAB, settings)
        if bound == "low":
            assert result.loss < 0.05
        else:
            assert result.loss > 0.9 * math.log(VOCAB)
