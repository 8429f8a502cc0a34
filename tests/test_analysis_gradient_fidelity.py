"""`t2mlr analyze gradient-fidelity`: the comparison itself (against hand-made vectors and the exact
path's gradient) and the command end to end on a tiny checkpoint.

The exactness check runs in float64 with a relative tolerance of 1e-5: transformers' RMSNorm computes
its variance in float32, so two evaluation orders of the same function agree only to about that level."""

from __future__ import annotations

import json
import math

import pytest
import torch
from analysis_helpers import save_tiny_t2mlr, save_tiny_transformer, write_ids_jsonl
from conftest import random_ids, tiny_model

from t2mlr.analysis.gradient_fidelity import (
    compare_gradients,
    fidelity_rows,
    gradient_of,
    parse_depth,
    parse_depths,
)
from t2mlr.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _batch(length: int) -> dict[str, torch.Tensor]:
    ids = random_ids(2, length)
    return {"input_ids": ids, "labels": ids.clone()}


def test_comparison_against_hand_computed_vectors() -> None:
    anchor = [torch.tensor([3.0, 0.0]), torch.tensor([4.0])]  # flattened: (3, 0, 4), norm 5
    assert compare_gradients(anchor, anchor) == pytest.approx((1.0, 0.0))
    other = [torch.tensor([0.0, 5.0]), torch.tensor([0.0])]  # orthogonal, same norm
    cosine, distance = compare_gradients(other, anchor)
    assert cosine == pytest.approx(0.0) and distance == pytest.approx(math.sqrt(50) / 5)
    halved = [t / 2 for t in anchor]
    assert compare_gradients(halved, anchor) == pytest.approx((1.0, 0.5))


def test_the_anchor_against_itself_gives_cosine_one_and_distance_zero() -> None:
    model = tiny_model(dtype=torch.float64)
    anchor_row, rows = fidelity_rows(model, _batch(6), [(5, 5), (2, 1)], anchor=(5, 5))
    assert rows[0].cosine == pytest.approx(1.0, abs=1e-12) and rows[0].relative_l2 == pytest.approx(0.0, abs=1e-12)
    assert (anchor_row.cosine, anchor_row.relative_l2) == (1.0, 0.0)
    assert rows[1].relative_l2 > 1e-3  # a shallow setting does differ: the comparison can fail
    assert all(row.seconds > 0 for row in rows)


def test_full_depth_and_full_backward_give_the_exact_paths_gradient() -> None:
    model = tiny_model(dtype=torch.float64)
    length = 7
    batch = _batch(length)
    exact, exact_loss = gradient_of(model, batch, recurrence="exact")
    jacobi, jacobi_loss = gradient_of(model, batch, recurrence="jacobi", d_forward=length + 1, d_backward=length + 1)
    cosine, distance = compare_gradients(jacobi, exact)
    assert jacobi_loss == pytest.approx(exact_loss, rel=1e-9)
    assert distance < 1e-5 and cosine > 1 - 1e-9
    truncated, _ = gradient_of(model, batch, recurrence="jacobi", d_forward=length + 1, d_backward=2)
    assert compare_gradients(truncated, exact)[1] > 1e-3  # truncation shows: the check is not vacuous


def test_depth_lists_are_parsed_and_checked() -> None:
    assert parse_depths("2:1, 4:4,2:1") == [(2, 1), (4, 4)]
    assert parse_depth("32:32") == (32, 32)
    for bad in ("4", "4:5", "0:0", "a:b", "4:0"):
        with pytest.raises(ValueError, match="d_backward|D_FORWARD"):
            parse_depth(bad)


def test_command_writes_table_json_and_figure(tmp_path, capsys) -> None:
    checkpoint = save_tiny_t2mlr(tmp_path / "model")
    data = write_ids_jsonl(tmp_path / "data.jsonl")
    out = tmp_path / "out"
    code = main(["analyze", "gradient-fidelity", str(checkpoint), "--data", str(data), "--seq-len", "12",
                 "--depths", "2:1,4:4,8:4", "--anchor", "12:12", "--batch-size", "2", "--out", str(out),
                 "--threads", "1"])
    assert code == 0, capsys.readouterr().err
    for name in ("gradient_fidelity.md", "gradient_fidelity.json", "gradient_fidelity.png"):
        assert (out / name).is_file(), name
    payload = json.loads((out / "gradient_fidelity.json").read_text())
    assert [(s["d_forward"], s["d_backward"]) for s in payload["settings"]] == [(2, 1), (4, 4), (8, 4)]
    assert all(-1 <= s["cosine"] <= 1 and s["seconds"] > 0 for s in payload["settings"])
    table = (out / "gradient_fidelity.md").read_text()
    assert "| 12 (anchor) | 12 |" in table and "seconds" in table


def test_a_plain_transformer_is_refused_with_a_clear_message(tmp_path, capsys) -> None:
    checkpoint = save_tiny_transformer(tmp_path / "plain")
    data = write_ids_jsonl(tmp_path / "data.jsonl")
    code = main(["analyze", "gradient-fidelity", str(checkpoint), "--data", str(data), "--seq-len", "12",
                 "--out", str(tmp_path / "out"), "--threads", "1"])
    assert code == 2
    assert "without recurrence" in capsys.readouterr().err
