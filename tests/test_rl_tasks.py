"""The RL tasks S5-Retrieval and arithmetic: rewards on hand-written completions (right, wrong, malformed)
against references computed apart from the task (the S5 targets recomputed from the input alone, the
arithmetic chain evaluated by hand), deterministic and disjoint prompt streams, strict settings, the tasks as TRL
datasets and reward functions, and a two-step GRPO run on each."""

from __future__ import annotations

import json
import re

import pytest

from t2mlr.tasks.s5 import compose, is_perm_token, token_to_perm
from t2mlr.tasks.s5_retrieval import s5_targets_from_input
from t2mlr.rl.grpo import load_grpo_config, run_grpo
from t2mlr.rl.tasks import TaskReward, build_task, prompt_dataset
from t2mlr.training.config import ConfigError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

S5_SMALL = {"n_range": [1, 3], "k": 2, "dict_size": 4}
ARITHMETIC_SMALL = {"min_steps": 1, "max_steps": 2, "max_operand": 9, "max_factor": 3, "max_value": 40}


# ------------------------------------------------------------------------------------------- S5-Retrieval
def test_s5_prompt_and_answer_follow_the_transduction() -> None:
    task = build_task("s5_retrieval", seed=3, **S5_SMALL)
    for sample in task.prompts(0, 20):
        tokens = task.tokenizer.tokenize(sample["prompt"])
        assert tokens[-1] == "|" and tokens.count("|") == 1
        dict_size, k = 4, 2
        dictionary, actions = tokens[: dict_size * (k + 1)], tokens[dict_size * (k + 1) : -1]
        assert len(actions) == sample["n"] and all(is_perm_token(a) for a in actions)
        # the independent reference: the transduction target recomputed from the input alone
        transduction_input = [*dictionary, "|", *[s for a in actions for s in (a, *"_" * k)]]
        expected = s5_targets_from_input(transduction_input)[dict_size * (k + 1) + 1 :]
        assert task.tokenizer.tokenize(sample["answer"]) == expected
        table = {token_to_perm(dictionary[i]): dictionary[i + 1 : i + 1 + k] for i in range(0, len(dictionary), k + 1)}
        state = token_to_perm(actions[0])  # and by hand: the first step is the first action's own value
        assert expected[0] == actions[0] and expected[1 : k + 1] == table[state]
        for i, action in enumerate(actions[1:], start=1):
            state = compose(state, token_to_perm(action))
            assert expected[i * (k + 1) + 1 : (i + 1) * (k + 1)] == table[state]


def test_s5_reward_on_hand_written_completions() -> None:
    task = build_task("s5_retrieval", seed=0, **S5_SMALL)
    hand = {"target_tokens": ["<A_21345>", "x", "y", "|", "<A_21345>", "x", "y"], "score_start": 4}
    assert task.reward("<A_21345>xy", hand) == 1.0
    assert task.reward(" <A_21345> x y\n", hand) == 1.0  # whitespace is not a symbol
    assert task.reward("<A_21345>xz", hand) == 0.0  # one wrong value
    assert task.reward("<A_12345>xy", hand) == 0.0  # wrong state
    assert task.reward("<A_21345>x", hand) == 0.0  # too short
    assert task.reward("<A_21345>xyx", hand) == 0.0  # too long
    assert task.reward("<A_2134>xy", hand) == 0.0  # not a permutation symbol
    assert task.reward("", hand) == 0.0
    sample = task.prompts(0, 1)[0]
    assert task.reward(sample["answer"], sample) == 1.0


# ------------------------------------------------------------------------------------------- arithmetic
def evaluate_chain(steps: list[str]) -> int:
    """The final value of a "<<a op b=c>>" chain, each step checked by Python's integer arithmetic."""
    value = None
    for step in steps:
        a, op, b, c = re.fullmatch(r"<<(\d+)([-+*/])(\d+)=(\d+)>>", step).groups()
        result = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b), "/": int(a) // int(b)}[op]
        assert op != "/" or int(a) % int(b) == 0
        assert result == int(c) and (value is None or int(a) == value)
        value = result
    return value


def test_arithmetic_prompts_are_the_question_and_the_target_is_gsm_aug() -> None:
    task = build_task("arithmetic", seed=1, **ARITHMETIC_SMALL)
    for sample in task.prompts(0, 10):
        assert sample["prompt"] == sample["question"] + "\n"
        assert sample["target"] == "\n".join(sample["steps"]) + "\n#### " + sample["answer"]
        assert str(evaluate_chain(sample["steps"])) == sample["answer"]
        ids = task.tokenizer(sample["prompt"] + sample["target"], add_special_tokens=False)["input_ids"]
        assert task.tokenizer.unk_token_id not in ids
        assert task.tokenizer.decode(ids) == sample["prompt"] + sample["target"]  # one token per character
        assert len(ids) == len(sample["prompt"] + sample["target"])


def test_arithmetic_reward_on_hand_written_completions() -> None:
    task = build_task("arithmetic", seed=0)
    sample = {"answer": "11"}
    assert task.reward("<<2*6=12>>\n<<12-1=11>>\n#### 11", sample) == 1.0
    assert task.reward("#### 11.0", sample) == 1.0  # the scorer compares numbers by value
    assert task.reward("The answer is 11.", sample) == 1.0
    assert task.reward("<<2*6=12>>\n<<12-1=11>>\n#### 12", sample) == 0.0  # the final answer counts, not the steps
    assert task.reward("#### 11\n#### 7", sample) == 0.0  # the last "####" counts
    assert task.reward("", sample) == 0.0
    assert task.reward("no number at all", sample) == 0.0
    real = task.prompts(0, 1)[0]
    assert task.reward(real["target"], real) == 1.0


# ------------------------------------------------------------------------------------------- streams, settings
@pytest.mark.parametrize(("name", "settings"), [("s5_retrieval", S5_SMALL), ("arithmetic", ARITHMETIC_SMALL)])
def test_prompts_are_deterministic_and_the_streams_disjoint(name, settings) -> None:
    task = build_task(name, seed=5, **settings)
    first = [s["prompt"] for s in task.prompts(0, 30)]
    again = build_task(name, seed=5, **settings)
    assert [s["prompt"] for s in again.prompts(0, 30)] == first
    assert [s["prompt"] for s in again.prompts(10, 5)] == first[10:15]  # a sample depends on its index only
    assert [s["prompt"] for s in build_task(name, seed=6, **settings).prompts(0, 30)] != first
    evaluation = [s["prompt"] for s in task.prompts(0, 30, "eval")]
    assert evaluation == [s["prompt"] for s in again.prompts(0, 30, "eval")]
    assert not set(first) & set(evaluation)


def test_settings_are_strict() -> None:
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['depth'\]; allowed: n_range, k, dict_size, alphabet"):
        build_task("s5_retrieval", depth=3)
    with pytest.raises(ValueError, match="allowed: min_steps, max_steps, max_operand, max_factor, max_value"):
        build_task("arithmetic", max_stpes=3)
    with pytest.raises(ValueError, match="dict_size=2 is smaller than the largest N=3"):
        build_task("s5_retrieval", n_range=[1, 3], k=2, dict_size=2)
    with pytest.raises(ValueError, match="min_steps <= max_steps"):
        build_task("arithmetic", min_steps=3, max_steps=2)
    with pytest.raises(ConfigError, match="allowed: n_range"):
        load_grpo_config("grpo_tiny", ["task.name=s5_retrieval", "task.kwargs={depth: 1}"])


# ------------------------------------------------------------------------------------------- GRPO on each
@pytest.mark.parametrize(("name", "settings", "vocab", "positions", "new_tokens"), [
    ("s5_retrieval", {"n_range": [1, 2], "k": 1, "dict_size": 2}, 192, 64, 5),
    ("arithmetic", {"min_steps": 1, "max_steps": 1, "max_operand": 9, "max_factor": 3, "max_value": 40}, 104, 256, 4),
])
def test_two_grpo_steps_on_the_task(tmp_path, name, settings, vocab, positions, new_tokens) -> None:
    kwargs = json.dumps(settings)
    cfg = load_grpo_config("grpo_tiny", [
        "logging.progress_bar=false", f"task.name={name}", f"task.kwargs={kwargs}", f"model.base.vocab_size={vocab}",
        f"model.base.max_position_embeddings={positions}", f"grpo.max_new_tokens={new_tokens}", "grpo.prompts_per_step=2",
        "grpo.group_size=2", "train.max_steps=2", "eval.every=1", "eval.num_prompts=2", "checkpoint.every=0"])
    records = run_grpo(cfg, tmp_path / "run")
    assert [r["step"] for r in records] == [1, 2]
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if r["split"] == "eval"] == [0, 1, 2]
    train = [r for r in lines if r["split"] != "eval"]
    assert [r["step"] for r in train] == [1, 2] and all(0.0 <= r["reward"] <= 1.0 for r in train)
    assert all(r[f"rewards/{name}/mean"] == r["reward"] for r in train)  # the task's scorer is the one reward


@pytest.mark.parametrize(("name", "settings"), [("variable_assignment", {}), ("s5_retrieval", S5_SMALL),
                                                ("arithmetic", ARITHMETIC_SMALL)])
def test_the_task_as_a_trl_dataset_and_reward_function(name, settings) -> None:
    """`prompt_dataset` rows carry the prompt and the sample; `TaskReward` scores completions with the task's scorer
    (the gold answer gets 1, a wrong one 0)."""
    task = build_task(name, seed=2, **settings)
    dataset = prompt_dataset(task, 3, 4, "eval")
    samples = task.prompts(3, 4, "eval")
    assert dataset["prompt"] == [s["prompt"] for s in samples]
    gold = [s["answer"] for s in samples]
    reward = TaskReward(task)
    assert reward.__name__ == name
    assert reward(dataset["prompt"], gold, sample=dataset["sample"]) == [1.0] * 4
    assert reward(dataset["prompt"], ["#### -1 x"] * 4, sample=dataset["sample"]) == [0.0] * 4
    with pytest.raises(ValueError, match="'sample' column"):
        reward(dataset["prompt"], gold)


@pytest.mark.parametrize("name, settings", [
    ("variable_assignment", {}),
    ("s5_retrieval", {"n_range": [1, 3], "k": 1, "dict_size": 6}),
    ("arithmetic", {}),
])
def test_windows_read_forward_and_rewind_to_the_same_samples(name, settings) -> None:
    """Consecutive, skipping and rewinding windows give what a fresh task draws for the same indices."""
    task = build_task(name, seed=3, **settings)
    fresh = build_task(name, seed=3, **settings).prompts(0, 12)
    got = task.prompts(0, 4) + task.prompts(4, 2) + task.prompts(8, 4)  # forward, then a skip over 6-7
    assert got == fresh[:6] + fresh[8:12]
    assert task.prompts(2, 3) == fresh[2:5]  # a rewind reopens the stream
    assert task.prompts(0, 2, stream="eval") != fresh[:2]  # streams keep separate cursors
    assert task.prompts(5, 1) == fresh[5:6]


# ------------------------------------------------------------------------------------------- greedy evaluation
def test_greedy_accuracy_is_the_reward_of_each_prompt_decoded_alone() -> None:
    """The RL callback's greedy accuracy (the library's batched generator, prompts encoded as TRL encodes them)
    equals the mean reward of each prompt decoded alone with the tokenizer's own encoding, unpadded, on the
    exact path; the model is handed back in training mode."""
    import torch
    from conftest import tiny_model

    from t2mlr.generation.text import generate_batched
    from t2mlr.rl.callbacks import greedy_accuracy
    from t2mlr.rl.config import RlEvalConfig

    task = build_task("s5_retrieval", seed=1, **S5_SMALL)
    tokenizer = task.tokenizer
    model = tiny_model(l_start=2, l_end=3, base_overrides={"vocab_size": len(tokenizer)}, seed=4).train()
    settings = RlEvalConfig(every=1, num_prompts=7, batch_size=3)
    samples = task.prompts(0, settings.num_prompts, "eval")
    alone = []
    for sample in samples:
        encoded = tokenizer(sample["prompt"], return_tensors="pt")
        with torch.no_grad():
            out = model.eval().generate(**encoded, do_sample=False, max_new_tokens=4, prefill="exact",
                                        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        row = out[0, encoded["input_ids"].shape[1]:].tolist()
        row = row[: row.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in row else row
        alone.append(tokenizer.decode(row, skip_special_tokens=True))
    model.train()
    got = greedy_accuracy(model, task, tokenizer, settings, max_new_tokens=4)
    assert model.training
    assert got == {"eval_accuracy": sum(task.reward(t, s) for t, s in zip(alone, samples)) / 7, "eval_prompts": 7}
    from t2mlr.generation.text import GenerationSettings

    batched = generate_batched(model, tokenizer, [s["prompt"] for s in samples],
                               GenerationSettings(max_new_tokens=4), 3, bos=None)
    assert batched == alone and len(set(alone)) > 1  # the replies themselves, not only their rewards
