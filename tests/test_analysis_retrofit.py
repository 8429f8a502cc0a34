"""The analyses on a retrofitted pretrained model: a saved Qwen2 decoder (another family than the Llama
the other analysis tests use) turned into T²MLR with `T2MLRForCausalLM.from_base`, saved, and analysed
with the base model itself as the baseline."""

from __future__ import annotations

import json

import pytest
import torch
from analysis_helpers import write_ids_jsonl
from conftest import open_gates, tiny_base_config
from transformers import Qwen2ForCausalLM

from t2mlr.cli import main
from t2mlr.model import T2MLRForCausalLM

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def retrofit(tmp_path):
    """(retrofitted T²MLR directory, pretrained base directory)."""
    torch.manual_seed(0)
    base_dir = tmp_path / "pretrained"
    Qwen2ForCausalLM(tiny_base_config("qwen2", layers=4)).save_pretrained(base_dir)
    model = T2MLRForCausalLM.from_base(str(base_dir), l_start=2, l_end=3)
    open_gates(model)  # as if trained a little: R reaches the output
    model.save_pretrained(tmp_path / "retrofit")
    return tmp_path / "retrofit", base_dir


def test_gradient_fidelity_and_probes_run_on_a_retrofitted_model(retrofit, tmp_path, capsys) -> None:
    model_dir, base_dir = retrofit
    data = write_ids_jsonl(tmp_path / "data.jsonl", documents=50)
    code = main(["analyze", "gradient-fidelity", str(model_dir), "--data", str(data), "--seq-len", "10",
                 "--depths", "2:1,11:11", "--anchor", "16:16", "--batch-size", "2", "--dtype", "float64",
                 "--out", str(tmp_path / "grad"), "--threads", "1"])
    assert code == 0, capsys.readouterr().err
    settings = json.loads((tmp_path / "grad" / "gradient_fidelity.json").read_text())["settings"]
    # depth >= T + 1 with full backward is the exact gradient, as is the anchor: they agree
    assert settings[1]["cosine"] == pytest.approx(1.0, abs=1e-6) and settings[1]["relative_l2"] < 1e-4
    assert settings[0]["cosine"] < settings[1]["cosine"]

    code = main(["analyze", "probes", str(model_dir), str(base_dir), "--data", str(data), "--seq-len", "10",
                 "--rows", "30", "--probe-steps", "5", "--probe-batch", "32", "--out", str(tmp_path / "probes"),
                 "--threads", "1"])
    assert code == 0, capsys.readouterr().err
    models = json.loads((tmp_path / "probes" / "probes.json").read_text())["models"]
    assert [m["recurrent"] for m in models] == [True, False]
    assert all(len(m["probes"]["2"]) == 4 for m in models)
