"""CoT loaders from local JSON-lines files (the hub path is not exercised in tests)."""

from __future__ import annotations

import json

import pytest

from t2mlr.tasks.loaders import DataUnavailableError, load_gsm_aug, load_hotpotqa_cot
from t2mlr.tasks.scoring import extract_gsm_answer


def write(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def test_gsm_local(tmp_path) -> None:
    path = tmp_path / "gsm.jsonl"
    write(path, [
        {"question": "Q1?", "steps": ["<<600*30/100=180>>", "<<180+60=240>>"], "answer": "360"},
        {"question": " Q2? ", "steps": "one step", "answer": 1200},
    ])
    rows = load_gsm_aug(path=path)
    assert rows[0] == {"prompt": "Q1?\n", "target": "<<600*30/100=180>>\n<<180+60=240>>\n#### 360", "answer": "360"}
    assert rows[1] == {"prompt": "Q2?\n", "target": "one step\n#### 1200", "answer": "1200"}
    assert [extract_gsm_answer(r["target"]) for r in rows] == ["360", "1200"]
    assert len(load_gsm_aug(path=path, limit=1)) == 1


def test_hotpotqa_local(tmp_path) -> None:
    path = tmp_path / "hotpot.jsonl"
    write(path, [{
        "question": "Which magazine was founded first?",
        "context": ["The Economist was founded in 1843.", "The Atlantic was founded in 1857."],
        "steps": ["The Economist: 1843.", "The Atlantic: 1857."],
        "answer": "The Economist",
    }])
    (row,) = load_hotpotqa_cot(path)
    assert row["prompt"] == (
        "Which magazine was founded first?\nContext:\n"
        "Document 1: The Economist was founded in 1843.\nDocument 2: The Atlantic was founded in 1857.\n"
    )
    assert row["target"].endswith("\n#### The Economist") and row["answer"] == "The Economist"


def test_errors(tmp_path) -> None:
    with pytest.raises(DataUnavailableError, match="not found"):
        load_gsm_aug(path=tmp_path / "missing.jsonl")
    with pytest.raises(DataUnavailableError):
        load_hotpotqa_cot(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="variant"):
        load_gsm_aug(path=tmp_path / "x.jsonl", variant="latin")
    bad = tmp_path / "bad.jsonl"
    write(bad, [{"question": "Q", "answer": "1"}])
    with pytest.raises(ValueError, match="steps"):
        load_gsm_aug(path=bad)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "Q",\n', encoding="utf-8")
    with pytest.raises(ValueError, match=":1:"):
        load_gsm_aug(path=broken)
