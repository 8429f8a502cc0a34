"""The lm-eval model "t2mlr" scores the shipped offline task through the model's own, explicitly chosen path.

The saved test model's config says eval_recurrence="jacobi" with d_forward=1 (a poor approximation),
so any forward that fell back to the config's path would change the scores: matching the exact
forward by hand shows the path comes from the model args, never from the config.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval")

import torch  # noqa: E402
from conftest import tiny_model  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402
from test_generation import build_tokenizer, save_model_dir  # noqa: E402

import t2mlr.evaluation.lm_eval_model  # noqa: E402,F401  (registers "t2mlr")
from t2mlr.evaluation import TASKS_DIR  # noqa: E402
from t2mlr.evaluation.commands import register  # noqa: E402
from t2mlr.evaluation.harness import with_shipped_tasks  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
from t2mlr.evaluation.lm_eval_model import check_eval_path  # noqa: E402
from t2mlr.model import T2MLRForCausalLM  # noqa: E402

MISLEADING_CONFIG = dict(eval_recurrence="jacobi", d_forward=1, d_backward=1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_model_dir(tmp_path_factory.mktemp("lm_eval") / "model", **MISLEADING_CONFIG)


@pytest.fixture(scope="module")
def task_manager() -> TaskManager:
    return TaskManager(include_path=str(TASKS_DIR), include_defaults=False)


def _evaluate(model_dir: Path, task_manager: TaskManager, tasks: list[str], **model_args: object) -> dict:
    return lm_eval.simple_evaluate(
        model="t2mlr",
        model_args={"pretrained": str(model_dir), "device": "cpu", **model_args},
        tasks=tasks,
        task_manager=task_manager,
        batch_size=4,
        log_samples=True,
    )


def _loglikelihood_by_hand(model: T2MLRForCausalLM, context: str, continuation: str) -> float:
    """Continuation log-probability under the exact forward, tokenised as lm-eval does (encode the
    whole string and the context, the continuation is the difference)."""
    tokenizer = build_tokenizer()
    context_ids = tokenizer.encode(context)
    whole = tokenizer.encode(context + continuation)
    assert whole[: len(context_ids)] == context_ids
    target = torch.tensor(whole[len(context_ids) :])
    with torch.no_grad():
        logits = model(torch.tensor([whole[:-1]]), recurrence="exact").logits[0]
    logprobs = torch.log_softmax(logits.double(), dim=-1)[len(context_ids) - 1 :]
    return float(logprobs.gather(-1, target[:, None]).sum())


def _scores(results: dict) -> list[tuple[tuple[str, str], float]]:
    return [
        (tuple(args), resp[0][0])
        for sample in results["samples"]["t2mlr_toy"]
        for args, resp in zip(sample["arguments"], sample["resps"])
    ]


def test_toy_task_loglikelihoods_equal_the_exact_forward_by_hand(model_dir, task_manager) -> None:
    results = _evaluate(model_dir, task_manager, ["t2mlr_toy"], recurrence="exact")
    model = tiny_model(dtype=torch.float32, **MISLEADING_CONFIG)
    scores = _scores(results)
    assert len(scores) == 24  # 8 questions x 3 choices
    for (context, continuation), score in scores:
        assert abs(score - _loglikelihood_by_hand(model, context, continuation)) <= 1e-4
    assert 0.0 <= results["results"]["t2mlr_toy"]["acc,none"] <= 1.0
    assert results["config"]["t2mlr_recurrence"] == "exact"


def test_jacobi_scores_follow_the_requested_depth(model_dir, task_manager) -> None:
    exact = dict(_scores(_evaluate(model_dir, task_manager, ["t2mlr_toy"], recurrence="exact")))
    deep = _evaluate(model_dir, task_manager, ["t2mlr_toy"], recurrence="jacobi", d_forward=32)
    shallow = _evaluate(model_dir, task_manager, ["t2mlr_toy"], recurrence="jacobi", d_forward=1)
    assert deep["config"]["t2mlr_d_forward"] == 32
    assert max(abs(score - exact[args]) for args, score in _scores(deep)) <= 1e-4  # depth > length: exact
    assert max(abs(score - exact[args]) for args, score in _scores(shallow)) > 1e-3  # depth 1: approximate


def test_generation_task_runs_through_generate_with_the_chosen_prefill(model_dir, task_manager) -> None:
    results = _evaluate(model_dir, task_manager, ["t2mlr_toy_gen"], recurrence="exact")
    tokenizer, model = build_tokenizer(), tiny_model(dtype=torch.float32, **MISLEADING_CONFIG)
    for sample in results["samples"]["t2mlr_toy_gen"]:
        prompt = sample["arguments"][0][0]
        ids = torch.tensor([tokenizer.encode(prompt)])
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False, pad_token_id=0, prefill="exact"
        )
        expected = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).split("\n")[0].split(".")[0]
        assert sample["resps"][0][0] == expected


def test_model_args_are_checked() -> None:
    with pytest.raises(ValueError, match="recurrence must be one of"):
        check_eval_path("off", None)
    with pytest.raises(ValueError, match="jacobi only"):
        check_eval_path("exact", 8)
    with pytest.raises(ValueError, match="d_forward must be >= 1"):
        check_eval_path("jacobi", 0)


def test_eval_command_passes_lm_eval_options_through() -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    argv = ["--model", "t2mlr", "--model_args", "pretrained=x,recurrence=exact", "--tasks", "t2mlr_toy", "-h"]
    assert parser.parse_args(["eval", *argv]).lm_eval_args == argv
    shipped = with_shipped_tasks(argparse.Namespace(include_path="/my/tasks")).include_path
    assert shipped == ["/my/tasks", str(TASKS_DIR)]
    assert with_shipped_tasks(argparse.Namespace(include_path=None)).include_path == [str(TASKS_DIR)]
