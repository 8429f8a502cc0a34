"""Early-exit ("skip-layer") evaluation against hand-built truncated models: a plain decoder with its blocks
after E skipped scores as the decoder of E blocks holding the same weights, T²MLR with E >= l_end as T²MLR on
that truncated base (exact, Jacobi, cached decoding), and through lm-eval's "t2mlr" model and `t2mlr eval
zero-shot`; exits inside or before the recurrent block, and models without one block list, are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import VOCAB, random_ids, tiny_base_config, tiny_model
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from t2mlr import T2MLRConfig, T2MLRForCausalLM
from t2mlr.baselines import LoopedForCausalLM, PauseForCausalLM, T2MLRGRUConfig, T2MLRGRUForCausalLM
from t2mlr.evaluation.early_exit import SkippedBlock, check_saved_exit_layer, skipped_blocks

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def truncated_weights(model: torch.nn.Module, keep: int) -> dict[str, torch.Tensor]:
    """The state dict without the blocks from index `keep` on (everything else: embedding, norm, head, fusion)."""
    dropped = tuple(f"layers.{index}." for index in range(keep, 64))
    return {key: value for key, value in model.state_dict().items() if not any(part in key for part in dropped)}


def plain_pair(family: str, exit_layer: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    full = AutoModelForCausalLM.from_config(tiny_base_config(family, layers=5)).double().eval()
    short = AutoModelForCausalLM.from_config(tiny_base_config(family, layers=exit_layer)).double().eval()
    short.load_state_dict(truncated_weights(full, exit_layer), strict=True)
    return full, short


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("exit_layer", [1, 3, 5])
def test_a_plain_decoder_exits_as_its_truncated_copy(family: str, exit_layer: int) -> None:
    full, short = plain_pair(family, exit_layer)
    ids = random_ids(2, 9)
    original = full(ids).logits
    with skipped_blocks(full, exit_layer):
        torch.testing.assert_close(full(ids).logits, short(ids).logits, rtol=0, atol=1e-12)
        greedy = full.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert torch.equal(greedy, short.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0))
    assert not any(isinstance(block, SkippedBlock) for block in full.model.layers)  # put back
    torch.testing.assert_close(full(ids).logits, original, rtol=0, atol=0)


@pytest.mark.parametrize("exit_layer", [4, 5])
def test_t2mlr_exits_after_the_recurrent_block_as_t2mlr_on_the_truncated_base(exit_layer: int) -> None:
    full = tiny_model(l_start=2, l_end=4)  # 5 blocks, gates open, float64
    short = T2MLRForCausalLM(T2MLRConfig.from_base(tiny_base_config(layers=exit_layer), l_start=2, l_end=4)).double()
    short.load_state_dict(truncated_weights(full, exit_layer), strict=True)
    short.eval()
    ids = random_ids(2, 9)
    with skipped_blocks(full, exit_layer):
        for path in ({"recurrence": "exact"}, {"recurrence": "jacobi", "d_forward": 3, "d_backward": 1}):
            torch.testing.assert_close(full(ids, **path).logits, short(ids, **path).logits, rtol=0, atol=1e-12)
        greedy = full.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0, prefill="exact")
    assert torch.equal(greedy, short.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0, prefill="exact"))


@pytest.mark.parametrize("exit_layer, message", [
    (3, r"exit_layer 3 is inside the recurrent block 2\.\.4 of T²MLR\(2,4\): choose 4\.\.5.*change R itself"),
    (1, r"exit_layer 1 is before the recurrent block 2\.\.4.*evaluate the base model there"),
    (0, r"exit_layer must be a block number in 1\.\.5"),
    (6, r"exit_layer must be a block number in 1\.\.5"),
])
def test_exits_the_t2mlr_model_does_not_define_are_refused(exit_layer: int, message: str) -> None:
    model = tiny_model(l_start=2, l_end=4)
    with pytest.raises(ValueError, match=message):
        with skipped_blocks(model, exit_layer):
            pass
    assert not any(isinstance(block, SkippedBlock) for block in model.model.layers)


def test_models_without_one_block_list_are_refused() -> None:
    base = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                        num_attention_heads=4, num_key_value_heads=2))
    for model, message in ((LoopedForCausalLM.from_base(base, loop_blocks="2-3", loops=2), "plain decoders and T²MLR"),
                           (PauseForCausalLM.from_base(base, pauses=1), "plain decoders and T²MLR"),
                           (T2MLRGRUForCausalLM(T2MLRGRUConfig(vocab_size=VOCAB, hidden_size=8)), "no early exit")):
        with pytest.raises(ValueError, match=message):
            with skipped_blocks(model, 2):
                pass


lm_eval = pytest.importorskip("lm_eval")


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory) -> tuple[Path, Path]:
    """A saved T²MLR(2,4) of 5 blocks and, by hand, the same weights as T²MLR(2,4) of 4 blocks."""
    from test_generation import build_tokenizer

    root = tmp_path_factory.mktemp("early_exit")
    full = tiny_model(l_start=2, l_end=4, dtype=torch.float32)
    short = T2MLRForCausalLM(T2MLRConfig.from_base(tiny_base_config(layers=4), l_start=2, l_end=4))
    short.load_state_dict(truncated_weights(full, 4), strict=True)
    for model, name in ((full, "full"), (short, "short")):
        model.save_pretrained(root / name)
        build_tokenizer().save_pretrained(root / name)
    return root / "full", root / "short"


def test_lm_eval_scores_the_exit_as_the_truncated_model(saved_pair) -> None:
    from lm_eval.tasks import TaskManager

    import t2mlr.evaluation.lm_eval_model  # noqa: F401  (registers "t2mlr")
    from t2mlr.evaluation import TASKS_DIR

    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False)

    def scores(directory: Path, **model_args: object) -> tuple[list[float], dict]:
        results = lm_eval.simple_evaluate(model="t2mlr", model_args={"pretrained": str(directory), "device": "cpu",
                                                                     **model_args},
                                          tasks=["t2mlr_toy"], task_manager=manager, batch_size=4, log_samples=True)
        return [resp[0][0] for sample in results["samples"]["t2mlr_toy"] for resp in sample["resps"]], results

    full, short = saved_pair
    exited, results = scores(full, exit_layer=4)
    reference, _ = scores(short)
    assert exited == pytest.approx(reference, abs=1e-4)
    assert results["config"]["t2mlr_exit_layer"] == 4
    with pytest.raises(ValueError, match="inside the recurrent block"):
        scores(full, exit_layer=3)


def test_zero_shot_refuses_a_bad_exit_before_scoring(saved_pair, tmp_path, capsys) -> None:
    from test_zero_shot import write_all_tasks

    from t2mlr.cli import main as cli_main

    full, _ = saved_pair
    with pytest.raises(ValueError, match="before the recurrent block"):
        check_saved_exit_layer(str(full), 1)
    data = write_all_tasks(tmp_path / "data", rows=2)
    assert cli_main(["eval", "zero-shot", str(full), "--out", str(tmp_path / "out"), "--data-dir", str(data),
                     "--exit-layer", "2", "--device", "cpu"]) == 2
    assert "inside the recurrent block 2..4" in capsys.readouterr().err
    assert not (tmp_path / "out" / "lm_eval").exists()
    assert cli_main(["eval", "zero-shot", str(full), "--out", str(tmp_path / "out"), "--data-dir", str(data),
                     "--exit-layer", "4", "--device", "cpu"]) == 0
    (row,) = json.loads((tmp_path / "out" / "zero_shot.json").read_text())["rows"]
    assert row["path"] == "exact, exit after block 4"
