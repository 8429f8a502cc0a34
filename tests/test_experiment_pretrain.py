"""`t2mlr experiment pretrain --preset tiny`: the pipeline end to end on a prepared English corpus (a small one
kept with the tests, in the layout `t2mlr corpus prepare-offline` writes), its table checked against a
hand-written evaluation of the held-out rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from rounding import float32_tolerance, in_dtype

from t2mlr.cli import main as cli_main
from t2mlr.corpus import ShardedTokenDataset

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CORPUS = Path(__file__).resolve().parent / "fixtures" / "golden_experiments" / "inputs" / "corpus"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pretrain") / "run"
    assert cli_main(["experiment", "pretrain", "--preset", "tiny", "--corpus", str(CORPUS), "--out", str(out),
                     "--workers", "1"]) == 0
    return out


@pytest.mark.slow
def test_tiny_pipeline_writes_the_table_and_curves(tiny_run: Path) -> None:
    results = json.loads((tiny_run / "results.json").read_text())
    cells = {(row["model"], row["path"].split()[0]) for row in results["results"]}
    assert cells == {("t2mlr_middle", "exact"), ("t2mlr_middle", "jacobi"), ("t2mlr_full", "exact"),
                     ("t2mlr_full", "jacobi"), ("transformer", "plain")}
    counts = {row["model"]: row["parameters"] for row in results["results"]}
    assert counts["t2mlr_middle"] == counts["t2mlr_full"] <= counts["transformer"] <= 1.1 * counts["t2mlr_middle"]
    for name in ("t2mlr_middle", "t2mlr_full", "transformer"):
        assert len(results["curves"][name]["train"]) == 6 and (tiny_run / name / "final" / "config.json").is_file()
    assert (tiny_run / "loss_curves.png").stat().st_size > 10_000
    assert results["torch_threads"] == 1 and results["cpu_kernels"] == torch.backends.cpu.get_cpu_capability()
    table = (tiny_run / "results.md").read_text()
    assert "T²MLR(2,3) middle" in table and "T²MLR(1,4) full" in table and "Transformer (matched" in table


def test_validation_is_held_out_and_its_loss_matches_a_hand_written_evaluation(tiny_run: Path) -> None:
    from transformers import AutoModelForCausalLM

    import t2mlr.baselines  # noqa: F401  (registers the matched Transformer's model type)

    texts = {split: {json.loads(line)["text"] for line in (CORPUS / f"{split}.jsonl").open()}
             for split in ("train", "validation")}
    assert texts["validation"] and not texts["train"] & texts["validation"]
    results = json.loads((tiny_run / "results.json").read_text())
    config = yaml.safe_load((tiny_run / "transformer" / "config.yaml").read_text())
    rows = ShardedTokenDataset(tiny_run / "data" / "validation_shards", config["data"]["seq_len"])
    model = AutoModelForCausalLM.from_pretrained(tiny_run / "transformer" / "final").eval()
    held_out = [rows[index] for index in range(results["preset"]["eval_batches"] * config["eval"]["batch_size"])]
    loss, count = hand_written_loss(model, held_out)
    (plain,) = [row for row in results["results"] if row["model"] == "transformer"]
    assert plain["tokens"] == count
    # the packed evaluation batches and one forward per document are two float32 computations: rounding apart
    tolerance = float32_tolerance(lambda dtype: hand_written_loss(in_dtype(model, dtype), held_out, dtype)[0])
    assert plain["loss"] == pytest.approx(float(loss), abs=tolerance)


def hand_written_loss(model: torch.nn.Module, rows: list[dict[str, torch.Tensor]],
                      dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, int]:
    """The mean next-token loss over the rows' document pieces, each piece run on its own, summed in `dtype`,
    and the token count."""
    total, count = torch.zeros((), dtype=dtype), 0
    for row in rows:
        ids, positions = row["input_ids"], row["position_ids"]
        starts = (positions == 0).nonzero().flatten().tolist() + [len(ids)]
        for lo, hi in zip(starts[:-1], starts[1:], strict=True):  # each document piece on its own
            with torch.no_grad():
                logits = model(input_ids=ids[None, lo:hi]).logits[0].to(dtype)
            targets = ids[lo + 1 : hi]
            total -= torch.log_softmax(logits[:-1], -1).gather(-1, targets[:, None]).sum()
            count += len(targets)
    return total / count, count


def test_curves_carry_tokens_and_seconds_per_logged_step(tiny_run: Path) -> None:
    """The curves plotted per token and per second: tokens grow by one global batch of rows per step."""
    results = json.loads((tiny_run / "results.json").read_text())
    config = yaml.safe_load((tiny_run / "transformer" / "config.yaml").read_text())
    per_step = config["train"]["global_batch_size"] * config["data"]["seq_len"]
    curve = results["curves"]["transformer"]
    assert [tokens for _, tokens in curve["tokens"]] == [step * per_step for step, _ in curve["train"]]
    seconds = [value for _, value in curve["step_seconds"]]
    assert seconds == sorted(seconds) and seconds[0] > 0


def test_equal_token_comparison_reads_each_curve_at_the_slowest_arms_tokens() -> None:
    """A time budget gives the arms different token counts: each is read at its last evaluation within the fewest."""
    from t2mlr.experiments.pretrain import same_tokens_lines, validation_loss_at_tokens

    slow = {"tokens": [(10, 1000), (20, 2000)], "eval": [(10, 3.0), (20, 2.5)]}
    fast = {"tokens": [(10, 1000), (20, 2000), (30, 3000), (40, 4000)], "eval": [(10, 3.2), (20, 2.7), (40, 2.1)]}
    assert validation_loss_at_tokens(fast, 2000) == (2000, 2.7) and validation_loss_at_tokens(fast, 999) is None
    lines = same_tokens_lines({"slow": slow, "fast": fast}, {"slow": "T²MLR", "fast": "Transformer"})
    assert "after at most 2,000 tokens" in lines[0]
    assert "- T²MLR: 2.5000 after 2,000 tokens" in lines and "- Transformer: 2.7000 after 2,000 tokens" in lines
    assert same_tokens_lines({"slow": slow, "again": slow}, {"slow": "a", "again": "b"}) == []  # equal data: no line


def test_task_settings_are_checked_and_arms_can_be_chosen() -> None:
    from t2mlr.experiments.commands import load
    from t2mlr.experiments.pretrain import dry_run_arms
    from t2mlr.experiments.sections import PretrainTask, preset_config

    for bad, message in ((dict(arms=("transformer", "lstm")), "task.arms"), (dict(arms=()), "task.arms"),
                         (dict(tokenizer_documents=0), "tokenizer_documents"), (dict(tokenize_workers=0), "workers"),
                         (dict(eval_batches=2, exact_eval_batches=3), "exact_eval_batches")):
        with pytest.raises(ValueError, match=message):
            PretrainTask(**bad)
    task, tree = load(preset_config("pretrain", "gpu"), [], PretrainTask)
    arms, _ = dry_run_arms(tree, "/tmp/unused", task.arms)
    assert [arm.name for arm in arms] == ["t2mlr_middle", "transformer"] and tree["train"]["max_seconds"] == 160
