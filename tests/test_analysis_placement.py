"""`t2mlr analyze placement`: the placements a sweep names, and the command end to end on the debug preset
made tiny (two placements of three steps, with the Transformer, then with a given baseline)."""

from __future__ import annotations

import json

import pytest
from analysis_helpers import TINY_TRAINING

from t2mlr.analysis.placement import parse_starts, placements, position_name
from t2mlr.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_symmetric_sweep_gives_the_papers_placements() -> None:
    assert placements(30, parse_starts("1,5,9,13,15")) == [(1, 30), (5, 26), (9, 22), (13, 18), (15, 16)]


def test_fixed_width_and_named_positions() -> None:
    assert placements(30, parse_starts("early,middle,late"), width=6) == [(1, 6), (13, 18), (25, 30)]
    assert placements(30, parse_starts("early,middle,late"), width=14) == [(1, 14), (9, 22), (17, 30)]
    assert placements(8, [3, 3], width=2) == [(3, 4)]
    assert [position_name(*p, 30) for p in [(1, 30), (1, 6), (13, 18), (25, 30)]] == ["full", "early", "middle", "late"]


@pytest.mark.parametrize("starts,width,message", [
    ("16", None, "l_start <= 15"), ("26", 6, "l_start <= 25"), ("middle", None, "need --width"), ("0", None, "fit"),
    ("x", None, "early/middle/late"), ("1", 31, "--width"),
])
def test_bad_placements_are_refused(starts, width, message) -> None:
    with pytest.raises(ValueError, match=message):
        placements(30, parse_starts(starts), width)


def test_command_trains_each_placement_and_the_transformer(tmp_path, capsys) -> None:
    out = tmp_path / "placement"
    code = main(["analyze", "placement", "debug", *TINY_TRAINING, "--starts", "early,late", "--width", "1",
                 "--out", str(out), "--threads", "1"])
    assert code == 0, capsys.readouterr().err
    for name in ("placement.md", "placement.json", "placement.png"):
        assert (out / name).is_file(), name
    payload = json.loads((out / "placement.json").read_text())
    assert [(r["l_start"], r["l_end"]) for r in payload["placements"]] == [(1, 1), (4, 4)]
    assert [r["position"] for r in payload["placements"]] == ["early", "late"]
    assert payload["transformer"]["loss"] > 0
    table = (out / "placement.md").read_text()
    assert "T²MLR(1,1)" in table and "Δ vs Transformer" in table

    # the same sweep against the baseline just trained, given as a model directory: nothing else trains
    again = tmp_path / "again"
    code = main(["analyze", "placement", "debug", *TINY_TRAINING, "--starts", "1", "--width", "1",
                 "--baseline", str(out / "transformer" / "final"), "--out", str(again), "--threads", "1"])
    assert code == 0, capsys.readouterr().err
    second = json.loads((again / "placement.json").read_text())
    assert not (again / "transformer").exists()
    assert second["transformer"]["loss"] == pytest.approx(payload["transformer"]["loss"], abs=1e-7)
    assert second["placements"][0]["loss"] == pytest.approx(payload["placements"][0]["loss"], abs=1e-7)


def test_a_t2mlr_model_as_baseline_is_refused(tmp_path, capsys) -> None:
    out = tmp_path / "p"
    args = ["analyze", "placement", "debug", *TINY_TRAINING, "--starts", "2", "--width", "1", "--no-transformer",
            "--out", str(out), "--threads", "1"]
    assert main(args) == 0, capsys.readouterr().err
    assert not (out / "transformer").exists()
    code = main([*args, "--resume", "--baseline", str(out / "t2mlr_2_2" / "final")])
    assert code == 2 and "expected a plain Transformer" in capsys.readouterr().err
