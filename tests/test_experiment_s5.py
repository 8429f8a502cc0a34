"""The S5-Retrieval experiment: restricted-action data, label alignment, evaluation, end to end (tiny)."""

from __future__ import annotations

import argparse
import json
import time

import pytest
import torch
import yaml
from torch import nn
from transformers import PreTrainedTokenizerBase

from t2mlr.experiments import s5
from t2mlr.experiments.commands import register
from t2mlr.experiments.s5 import RESULTS_MD, evaluate_by_n, forward_kwargs, summarize
from t2mlr.experiments.sections import preset_config
from t2mlr.tasks.jsonl import write_jsonl
from t2mlr.tasks.s5 import generates_s5, generating_set, token_to_perm
from t2mlr.tasks.s5_data import (
    S5DataSpec,
    StreamedS5Dataset,
    encode_row,
    s5_retrieval_dataset,
)
from t2mlr.tasks.s5_retrieval import generate_s5_retrieval, s5_targets_from_input
from t2mlr.tasks.tokenizers import build_s5_tokenizer
from t2mlr.training.config import ConfigError, load_sections
from t2mlr.training.data import Collator

ALPHABET = "ABCDEFGH"


def load_s5(preset: str, overrides: tuple[str, ...] = ()) -> tuple[s5.S5Task, dict]:
    tree, sections = load_sections(preset_config("s5", preset), overrides, {"task": s5.S5Task})
    return sections["task"], tree


def run_experiment(out, preset: str = "tiny", overrides: tuple[str, ...] = (), **options) -> list:
    task, tree = load_s5(preset, ("train.device=cpu", *overrides))
    return s5.run(preset, task, tree, out, **options)


def test_generating_sets() -> None:
    assert generates_s5([(2, 3, 4, 5, 1), (2, 1, 3, 4, 5)])  # 5-cycle and a transposition
    assert not generates_s5([(2, 3, 4, 5, 1)])  # a cyclic subgroup of order 5
    assert not generates_s5([(2, 1, 3, 4, 5), (1, 2, 4, 3, 5)])  # two commuting transpositions
    chosen = generating_set(3, seed=7)
    assert len(set(chosen)) == 3 and generates_s5(chosen) and chosen == generating_set(3, seed=7)


def test_restricted_samples_follow_the_tasks_layout() -> None:
    spec = S5DataSpec(k=2, dict_size=10, alphabet=ALPHABET, num_actions=3, seed=1)
    reference_keys = set(generate_s5_retrieval(1, (2, 2), 2, 10, 0, ALPHABET)[0])
    actions = set(spec.action_set())
    for index in range(20):
        sample = spec.sample((1, 6), "train", index)
        assert set(sample) == reference_keys
        assert s5_targets_from_input(sample["input_tokens"]) == sample["target_tokens"]
        action_tokens = sample["input_tokens"][sample["score_start"] :: 3]
        assert len(action_tokens) == sample["n"] and {token_to_perm(t) for t in action_tokens} <= actions
    assert spec.sample((1, 6), "train", 3) == spec.sample((1, 6), "train", 3)
    assert spec.sample((1, 6), "train", 3) != spec.sample((1, 6), "eval-n3", 3)


def test_full_group_spec_uses_the_tasks_generator() -> None:
    spec = S5DataSpec(k=1, dict_size=120, alphabet=ALPHABET)
    sample = spec.sample((2, 4), "train", 0)
    assert sample == generate_s5_retrieval(1, (2, 4), 1, 120, 0, ALPHABET, stream="train-0")[0]


class Oracle(nn.Module):
    """Emits the correct target at every position: a model whose logits are aligned by construction."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.weight = nn.Parameter(torch.zeros(()))

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, **_: object) -> object:
        vocab = len(self.tokenizer)
        logits = torch.full((*input_ids.shape, vocab), -30.0)
        for b, row in enumerate(input_ids.tolist()):
            tokens = self.tokenizer.convert_ids_to_tokens(row)
            real = [t for t in tokens if t not in ("<eos>", "<pad>")]
            targets = self.tokenizer.convert_tokens_to_ids(s5_targets_from_input(real))
            for t, target in enumerate(targets):
                logits[b, t, target] = 30.0
        loss = None
        if labels is not None:  # Hugging Face convention: logits[t] scored against labels[t + 1]
            loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab), labels[:, 1:].reshape(-1))
        return argparse.Namespace(logits=logits + self.weight, loss=loss)


def test_label_alignment_and_scoring_with_an_oracle() -> None:
    tokenizer = build_s5_tokenizer(2, ALPHABET)
    spec = S5DataSpec(k=2, dict_size=8, alphabet=ALPHABET, num_actions=4)
    oracle = Oracle(tokenizer)
    dataset = StreamedS5Dataset(spec, (1, 5), 6, tokenizer)
    batch = Collator(pad_token_id=0, labels_aligned_to_inputs=dataset.labels_aligned_to_inputs)([dataset[i] for i in range(6)])
    # the collated (shifted) labels put target[t] at t + 1, so the oracle's loss is ~0 and every target counts
    assert float(oracle(**batch).loss) < 1e-6
    row, sample = dataset[0], spec.sample((1, 5), "train", 0)
    assert row["input_ids"][-1] == tokenizer.eos_token_id and row["labels"][-1] == -100
    scored = sum(sample["score_mask"])
    assert int((batch["labels"][0] != -100).sum()) == scored
    samples = [spec.sample((n, n), f"eval-n{n}", j) for n in (1, 2, 3) for j in range(3)]
    metrics = evaluate_by_n(oracle, samples, tokenizer, batch_size=2)
    assert all(m.exact_match == 1.0 and m.token_accuracy == 1.0 and m.count == 3 for m in metrics.values())
    assert summarize(metrics, 1, 3) == (1.0, 1.0) and summarize(metrics, 7, 9) is None


def test_jsonl_factory_reads_the_data_command_output(tmp_path) -> None:
    tokenizer = build_s5_tokenizer(1, ALPHABET)
    tokenizer.save_pretrained(str(tmp_path / "tokenizer"))
    samples = generate_s5_retrieval(5, (1, 3), 1, 4, 0, ALPHABET)
    write_jsonl(samples, tmp_path / "train.jsonl")
    dataset = s5_retrieval_dataset(str(tmp_path / "train.jsonl"), str(tmp_path / "tokenizer"))
    assert len(dataset) == 5 and dataset.labels_aligned_to_inputs
    assert dataset[0]["input_ids"].shape == dataset[0]["labels"].shape == (len(samples[0]["input_tokens"]) + 1,)
    with pytest.raises(FileNotFoundError):
        s5_retrieval_dataset(str(tmp_path / "missing.jsonl"), str(tmp_path / "tokenizer"))


def test_encode_row_rejects_a_tokenizer_without_eos() -> None:
    tokenizer = build_s5_tokenizer(1, ALPHABET)
    tokenizer.eos_token = None
    with pytest.raises(ValueError, match="eos"):
        encode_row(tokenizer, S5DataSpec(1, 4, ALPHABET).sample((1, 2), "train", 0))


def test_t2mlr_is_evaluated_on_the_exact_path() -> None:
    from t2mlr import T2MLRForCausalLM
    from t2mlr.baselines import T2MLRLSTMConfig, T2MLRLSTMForCausalLM

    config = s5.t2mlr_config("tiny")
    assert config.eval_recurrence == "exact"
    assert forward_kwargs(T2MLRForCausalLM(config)) == {"recurrence": "exact"}
    assert forward_kwargs(T2MLRLSTMForCausalLM(T2MLRLSTMConfig(vocab_size=40, hidden_size=4))) == {}


def test_paper_preset_matches_the_paper() -> None:
    task, tree = load_s5("paper")
    m, base = tree["model"], tree["model"]["base"]
    assert (task.k, task.dict_size, task.train_n, task.eval_n, task.num_actions) == (4, 120, (1, 32), (1, 48), None)
    assert (base["num_hidden_layers"], base["num_attention_heads"], base["hidden_size"], m["l_start"], m["l_end"]) == (
        4, 6, 384, 1, 4)
    assert (tree["optim"]["lr"], tree["train"]["global_batch_size"], m["d_forward"], m["d_backward"],
            m["train_recurrence"]) == (1e-3, 64, 16, 4, "jacobi")
    assert (tree["train"]["max_steps"], task.baseline_steps) == (150_000, 400_000)
    assert len(task.alphabet) == 62
    with pytest.raises(ConfigError, match="preset"):
        load_s5("huge")


def test_a_typo_in_the_task_or_the_trainer_keys_names_the_valid_key() -> None:
    with pytest.raises(ConfigError, match="Did you mean 'dict_size'"):
        load_s5("tiny", ("task.dict_sise=3",))
    with pytest.raises(ConfigError, match="Did you mean 'lr'"):
        load_s5("tiny", ("optim.lrr=1",))


def test_paper_preset_builds_valid_trainer_configs(tmp_path) -> None:
    task, tree = load_s5("paper")
    tokenizer = build_s5_tokenizer(task.k, task.alphabet)
    filled = s5.filled_tree(task, tree, tokenizer, tmp_path / "tokenizer")
    arms = s5.build_arms(task, filled, s5.MODEL_NAMES)
    from t2mlr.baselines.matching import count_parameters
    from t2mlr.training.sizing import build_on_meta

    counts = {name: count_parameters(build_on_meta(arm.config.model)) for name, arm in arms.items()}
    assert counts["t2mlr"] <= counts["transformer"] <= 1.01 * counts["t2mlr"]
    assert counts["t2mlr"] <= counts["lstm"] <= 1.01 * counts["t2mlr"]
    for name, steps in (("t2mlr", 150_000), ("transformer", 400_000), ("lstm", 400_000)):
        cfg = arms[name].config
        assert cfg.train.max_steps == steps and cfg.train.global_batch_size == 64
        assert cfg.data.labels_aligned_to_inputs is True and cfg.optim.lr == 1e-3
    t2 = arms["t2mlr"].config.model
    assert (t2.train_recurrence, t2.eval_recurrence, t2.d_forward, t2.d_backward) == ("jacobi", "exact", 16, 4)


def test_cli_registers_the_experiment() -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["experiment", "s5-retrieval", "--preset", "tiny", "--out", "x", "--models", "lstm"])
    assert args.preset == "tiny" and args.models == ["lstm"] and callable(args.func)


def test_cli_seed_reaches_the_data_and_the_training(tmp_path) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    runs = {}
    for seed in (None, 7):
        out = tmp_path / f"seed{seed}"
        argv = ["experiment", "s5-retrieval", "--preset", "tiny", "--out", str(out), "--models", "lstm", "--steps", "2"]
        args = parser.parse_args(argv + ([] if seed is None else ["--seed", str(seed)]))
        assert args.func(args) == 0
        meta = json.loads((out / "data" / "meta.json").read_text())
        train_seed = yaml.safe_load((out / "lstm" / "config.yaml").read_text())["train"]["seed"]
        runs[seed] = (meta["data"]["seed"], (out / "data" / "eval.jsonl").read_text())
        assert train_seed == runs[seed][0]
    assert runs[None][0] == 0 and runs[7][0] == 7
    assert runs[None][1] != runs[7][1]  # other held-out sequences


@pytest.mark.slow
def test_cli_workers_reach_the_schedule(tmp_path) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    base = ["experiment", "s5-retrieval", "--preset", "tiny", "--models", "transformer", "lstm", "--steps", "2"]
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        args = parser.parse_args([*base, "--out", str(out), "--workers", str(workers)])
        assert args.func(args) == 0
        assert json.loads((out / "results.json").read_text())["training_workers"] == workers
        schedule = "2 at a time in worker processes" if workers == 2 else "one after another"
        assert schedule in (out / RESULTS_MD).read_text(encoding="utf-8")
    args = parser.parse_args([*base, "--out", str(tmp_path / "w0"), "--workers", "0"])
    assert args.func(args) == 2  # a clear error, not a silent fallback


def test_tiny_experiment_end_to_end(tmp_path) -> None:
    started = time.perf_counter()
    out = tmp_path / "s5"
    results = run_experiment(out)
    assert time.perf_counter() - started < 60
    assert [r.name for r in results] == ["t2mlr", "transformer", "lstm"]
    text = (out / RESULTS_MD).read_text(encoding="utf-8")
    for label in ("T²MLR", "Transformer (matched)", "LSTM (matched)", "EM (N 1–3)", "EM (N 4)"):
        assert label in text
    assert (out / "accuracy_vs_length.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "results.json").is_file() and (out / "data" / "eval.jsonl").is_file()
    assert all(set(r.per_n) == {1, 2, 3, 4} and r.parameters > 0 for r in results)
    with pytest.raises(FileExistsError, match="--resume"):
        run_experiment(out)
    again = run_experiment(out, resume=True, models=("lstm",))  # re-evaluates
    assert again[0].per_n == results[2].per_n


def test_any_arm_of_the_comparison_joins_the_experiment(tmp_path) -> None:
    """Looped and pause-token baselines and another T²MLR placement train beside the preset's T²MLR, each a
    run of its own, the baselines at T²MLR's parameter count (never below it)."""
    out = tmp_path / "s5"
    models = ("t2mlr", "t2mlr:2-2", "looped:full:2", "pause:2")
    results = run_experiment(out, overrides=("train.max_steps=2", "task.baseline_steps=2"), models=models, workers=1)
    assert [r.label for r in results] == ["T²MLR", "T²MLR(2,2)", "looped full ×2", "pause ×2"]
    arches = {name: yaml.safe_load((out / name.replace(":", "_") / "config.yaml").read_text())["model"]
              for name in models}
    assert arches["t2mlr:2-2"]["arch"] == "t2mlr" and (arches["t2mlr:2-2"]["l_start"], arches["t2mlr:2-2"]["l_end"]) == (2, 2)
    assert (arches["looped:full:2"]["arch"], arches["looped:full:2"]["loops"]) == ("looped", 2)
    assert (arches["pause:2"]["arch"], arches["pause:2"]["pauses"]) == ("pause", 1)
    t2mlr_params = results[0].parameters
    assert results[1].parameters == t2mlr_params
    assert all(r.parameters >= t2mlr_params for r in results[2:])
    assert all(set(r.per_n) == {1, 2, 3, 4} for r in results)
    assert "looped full ×2" in (out / RESULTS_MD).read_text(encoding="utf-8")


@pytest.mark.parametrize("models, message", [
    (("t2mlr", "looped:9-22"), "unknown model 'looped:9-22'"),
    (("gruu",), "unknown model .gruu.*use t2mlr, transformer, lstm, gru, rnn"),
    ((), "at least one model"),
    (("lstm", "lstm"), "named twice"),
    (("t2mlr", "t2mlr:2-3"), "blocks 2-3 are outside the preset's 1-2"),
    (("looped:1-5:2",), "blocks 1-5 are outside"),
])
def test_bad_model_names_fail_before_anything_is_written(tmp_path, models, message) -> None:
    with pytest.raises(ValueError, match=message):
        run_experiment(tmp_path / "s5", models=models)
    assert not (tmp_path / "s5").exists()
