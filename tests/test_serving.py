"""Serving without vLLM: the prefill choice of a served model and the `t2mlr serve` wrapper's checks.

Everything here runs whether or not vLLM is installed: the options are read from a model config, and
`t2mlr serve --dry-run` checks a model directory and prints the server command without starting it.
The engine itself is tested against `generate()` in tests/test_serving_vllm.py.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig

from t2mlr import T2MLRConfig
from t2mlr.cli import main
from t2mlr.serving.jacobi import JacobiIterates
from t2mlr.serving.options import OVERRIDE_KEYS, PrefillChoice


def config_with(**overrides: object) -> argparse.Namespace:
    """A stand-in for a T²MLR config after `--hf-overrides`: d_forward plus the given fields."""
    return argparse.Namespace(d_forward=16, **overrides)


def test_the_default_prefill_is_exact() -> None:
    assert PrefillChoice.from_config(config_with()) == PrefillChoice("exact", None, None)
    assert PrefillChoice.from_config(config_with(t2mlr_prefill="exact")) == PrefillChoice("exact", None, None)


def test_jacobi_takes_the_configs_depth_unless_given() -> None:
    assert PrefillChoice.from_config(config_with(t2mlr_prefill="jacobi")) == PrefillChoice("jacobi", 16, None)
    given = config_with(t2mlr_prefill="jacobi", t2mlr_prefill_depth=4, t2mlr_prefill_tol=1e-3)
    assert PrefillChoice.from_config(given) == PrefillChoice("jacobi", 4, 1e-3)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"t2mlr_prefill_depth": 4}, "apply to prefill='jacobi' only"),
        ({"t2mlr_prefill": "jacobi", "t2mlr_prefill_depth": 0}, "d_forward must be >= 1"),
        ({"t2mlr_prefill": "jacobi", "t2mlr_prefill_tol": -1.0}, "prefill_tol must be >= 0"),
        ({"t2mlr_prefill": "parallel"}, "prefill must be one of"),
        ({"t2mlr_prefil": "jacobi"}, "Did you mean 't2mlr_prefill'"),
    ],
)
def test_bad_prefill_settings_name_the_cause(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PrefillChoice.from_config(config_with(**fields))


def test_overrides_select_the_same_choice_again() -> None:
    choice = PrefillChoice("jacobi", 5, 0.01)
    overrides = choice.overrides()
    assert set(overrides) == set(OVERRIDE_KEYS)
    assert PrefillChoice.from_config(config_with(**overrides)) == choice


def test_jacobi_iterates_stop_each_request_on_its_own_states() -> None:
    """The early stop of `generate(prefill_tol=...)`, per request: request 0 settles at iterate 2 and takes one
    more; request 1 never settles and runs all `depth` iterates."""
    iterates = JacobiIterates(torch.tensor([2, 3]), torch.zeros(2, 1), torch.device("cpu"))
    depth, tol, r_read, history = 5, 0.1, iterates.start(), []
    for k in range(1, depth + 1):
        moves = torch.tensor([[0.0], [0.0], [1.0], [1.0], [1.0]]) if k >= 2 else torch.ones(5, 1)
        r_read = iterates.advance(k, r_read, r_read + moves, depth, tol)
        history.append(r_read.squeeze(1).tolist())
        if iterates.finished(k):
            break
    assert iterates.stop_after.tolist() == [3, 5]
    assert history[-1] == [1.0, 1.0, 5.0, 5.0, 5.0]  # request 0: 1 + 0 + 0; request 1: every iterate taken


# ---------------------------------------------------------------------------------------------- t2mlr serve


def tiny_llama() -> LlamaConfig:
    return LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Config-only directories: what `t2mlr serve` checks before vLLM reads any weight."""
    root = tmp_path_factory.mktemp("serve")
    dirs = {name: root / name for name in ("t2mlr", "llama", "gemma", "empty")}
    T2MLRConfig.from_base(tiny_llama(), l_start=2, l_end=3, d_forward=6).save_pretrained(dirs["t2mlr"])
    tiny_llama().save_pretrained(dirs["llama"])
    T2MLRConfig.from_base(tiny_llama(), l_start=2, l_end=3).save_pretrained(dirs["gemma"])
    saved = json.loads((dirs["gemma"] / "config.json").read_text())
    saved["base_config"]["model_type"] = "gemma"
    (dirs["gemma"] / "config.json").write_text(json.dumps(saved))
    dirs["empty"].mkdir()
    return dirs


def serve(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    code = main(["serve", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("llama", "is not a T²MLR checkpoint (config.json has model_type 'llama')"),
        ("gemma", "T²MLR cannot wrap base model type 'gemma'"),
        ("empty", "has no config.json"),
    ],
)
def test_serve_refuses_what_is_not_a_servable_t2mlr_checkpoint(
    model_dirs: dict[str, Path], capsys: pytest.CaptureFixture, name: str, message: str
) -> None:
    code, _, err = serve([str(model_dirs[name]), "--dry-run"], capsys)
    assert code == 2
    assert message in err


def test_serve_refuses_a_bad_prefill_setting(model_dirs: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    code, _, err = serve([str(model_dirs["t2mlr"]), "--prefill-depth", "4", "--dry-run"], capsys)
    assert code == 2
    assert "apply to prefill='jacobi' only" in err


def test_serve_starts_the_openai_server_with_the_prefill_as_overrides(
    model_dirs: dict[str, Path], capsys: pytest.CaptureFixture
) -> None:
    code, out, _ = serve([str(model_dirs["t2mlr"]), "--prefill", "jacobi", "--dry-run", "--vllm", "--port", "8001",
                          "--hf-overrides", '{"max_position_embeddings": 64}'], capsys)
    assert code == 0
    command = shlex.split(out)
    assert command[1:5] == ["-m", "vllm.entrypoints.launchers.api_server.entry", "--model", str(model_dirs["t2mlr"])]
    assert command[5:7] == ["--port", "8001"]
    overrides = json.loads(command[command.index("--hf-overrides") + 1])
    # the user's override kept; the Jacobi depth defaults to the saved config's d_forward (6)
    assert overrides == {"max_position_embeddings": 64, "t2mlr_prefill": "jacobi", "t2mlr_prefill_depth": 6}


def test_serve_refuses_two_different_prefills(model_dirs: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    code, _, err = serve([str(model_dirs["t2mlr"]), "--prefill", "jacobi", "--dry-run", "--vllm",
                          "--hf-overrides", '{"t2mlr_prefill": "exact"}'], capsys)
    assert code == 2
    assert "sets t2mlr_prefill differently" in err
