"""The lm-eval model "t2mlr" scores the shipped offline task through the model's own, explicitly chosen path,
and stock lm-eval (`lm_eval --model hf ... trust_remote_code=True`) scores a saved T²MLR model as it is.

The saved test model's config says eval_recurrence="jacobi" with d_forward=1 (a poor approximation),
so any forward that fell back to the config's path would change the scores: matching the exact
forward by hand shows the path comes from the model args, never from the config.

lm-eval scores requests in padded batches, the reference here one request at a time: two float32 computations
of the same log-likelihoods, which agree to float32 rounding, and that depends on the CPU's kernel set. Each
comparison allows `rounding.MARGIN` times float32's own gap to float64 on the by-hand path for the same
requests (`by_hand_tolerance`); the wrong path (Jacobi at depth 1) moves the scores by 1e-3 or more.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval")

import torch  # noqa: E402
from conftest import tiny_model  # noqa: E402
from rounding import float32_tolerance, in_dtype  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402
from test_generation import build_tokenizer, save_model_dir  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

import t2mlr.evaluation.lm_eval_model  # noqa: E402,F401  (registers "t2mlr")
from t2mlr import cli  # noqa: E402
from t2mlr.evaluation import TASKS_DIR, harness  # noqa: E402
from t2mlr.evaluation.commands import register  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402

from t2mlr.evaluation.harness import (  # noqa: E402
    HFLM_ARGS,
    MODEL_ARGS,
    SHIPPED_TASKS,
    with_device,
    with_shipped_tasks,
)
from t2mlr.evaluation.lm_eval_model import T2MLRLM, check_eval_path, check_eval_solver  # noqa: E402
from t2mlr.model import T2MLRForCausalLM  # noqa: E402
from t2mlr.utils import resolve_device  # noqa: E402

MISLEADING_CONFIG = dict(eval_recurrence="jacobi", d_forward=1, d_backward=1)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


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


def _loglikelihood_by_hand(model: torch.nn.Module, context: str, continuation: str) -> float:
    """Continuation log-probability under the exact forward (a plain causal LM's own forward), tokenised as
    lm-eval does (encode the whole string and the context, the continuation is the difference)."""
    tokenizer = build_tokenizer()
    context_ids = tokenizer.encode(context)
    whole = tokenizer.encode(context + continuation)
    assert whole[: len(context_ids)] == context_ids
    target = torch.tensor(whole[len(context_ids) :])
    path = {"recurrence": "exact"} if isinstance(model, T2MLRForCausalLM) else {}
    with torch.no_grad():
        logits = model(torch.tensor([whole[:-1]]), **path).logits[0]
    logprobs = torch.log_softmax(logits.double(), dim=-1)[len(context_ids) - 1 :]
    return float(logprobs.gather(-1, target[:, None]).sum())


def by_hand_tolerance(model: torch.nn.Module, requests: list[tuple[str, str]]) -> float:
    """How far lm-eval's scores of `requests` may be from `_loglikelihood_by_hand`'s (module docstring)."""
    def loglikelihoods(dtype: torch.dtype) -> torch.Tensor:
        copy = in_dtype(model, dtype)
        return torch.tensor([_loglikelihood_by_hand(copy, *request) for request in requests], dtype=torch.float64)

    return float32_tolerance(loglikelihoods)


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
    tolerance = by_hand_tolerance(model, [request for request, _ in scores])
    for (context, continuation), score in scores:
        assert abs(score - _loglikelihood_by_hand(model, context, continuation)) <= tolerance
    assert 0.0 <= results["results"]["t2mlr_toy"]["acc,none"] <= 1.0
    assert results["config"]["t2mlr_recurrence"] == "exact"


@pytest.mark.slow
def test_jacobi_scores_follow_the_requested_depth(model_dir, task_manager) -> None:
    exact = dict(_scores(_evaluate(model_dir, task_manager, ["t2mlr_toy"], recurrence="exact")))
    deep = _evaluate(model_dir, task_manager, ["t2mlr_toy"], recurrence="jacobi", d_forward=32)
    shallow = _evaluate(model_dir, task_manager, ["t2mlr_toy"], recurrence="jacobi", d_forward=1)
    assert deep["config"]["t2mlr_d_forward"] == 32
    tolerance = by_hand_tolerance(tiny_model(dtype=torch.float32, **MISLEADING_CONFIG), list(exact))
    assert max(abs(score - exact[args]) for args, score in _scores(deep)) <= tolerance  # depth > length: exact
    assert max(abs(score - exact[args]) for args, score in _scores(shallow)) > 1e-3  # depth 1: approximate


@pytest.mark.slow
def test_the_fixed_point_solver_scores_as_the_sequential_loop_and_is_recorded(model_dir, task_manager) -> None:
    exact = dict(_scores(_evaluate(model_dir, task_manager, ["t2mlr_toy"], recurrence="exact")))
    solved = _evaluate(model_dir, task_manager, ["t2mlr_toy"], recurrence="exact", exact_solver="fixed_point")
    tolerance = by_hand_tolerance(tiny_model(dtype=torch.float32, **MISLEADING_CONFIG), list(exact))
    assert max(abs(score - exact[args]) for args, score in _scores(solved)) <= tolerance
    record = solved["config"]["t2mlr_exact_solve"]
    assert solved["config"]["t2mlr_exact_solver"] == "fixed_point" and record["solvers"] == ["fixed_point"]
    assert record["chunks"] >= record["forwards"] >= 1 and record["max_passes"] >= 1


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
    with pytest.raises(ValueError, match="exact_solver must be one of"):
        check_eval_solver("exact", "fast")
    with pytest.raises(ValueError, match="recurrence=exact only"):
        check_eval_solver("jacobi", "auto")


def test_eval_command_passes_lm_eval_options_through() -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    argv = ["--model", "t2mlr", "--model_args", "pretrained=x,recurrence=exact", "--tasks", "t2mlr_toy", "-h"]
    assert parser.parse_args(["eval", *argv]).lm_eval_args == argv
    shipped = with_shipped_tasks(argparse.Namespace(include_path="/my/tasks")).include_path
    assert shipped == ["/my/tasks", str(TASKS_DIR)]
    assert with_shipped_tasks(argparse.Namespace(include_path=None)).include_path == [str(TASKS_DIR)]


# ---------------------------------------------------------------------------------------------- the README's commands


def _saved_results(output_dir: Path) -> tuple[dict, list[dict]]:
    """The results JSON and the logged samples that lm-eval wrote under --output_path."""
    (results_file,) = output_dir.rglob("results_*.json")
    (samples_file,) = output_dir.rglob("samples_t2mlr_toy_*.jsonl")
    samples = [json.loads(line) for line in samples_file.read_text().splitlines()]
    return json.loads(results_file.read_text()), samples


def _check_against_the_exact_forward(results: dict, samples: list[dict]) -> None:
    """Every logged score equals the exact forward by hand, and the accuracy is the argmax's."""
    model = tiny_model(dtype=torch.float32, **MISLEADING_CONFIG)
    right = []
    for sample in samples:
        arguments = [(args["arg_0"], args["arg_1"]) for args in sample["arguments"].values()]
        logged = [float(resp[0][0]) for resp in sample["resps"]]
        by_hand = [_loglikelihood_by_hand(model, context, continuation) for context, continuation in arguments]
        assert max(abs(a - b) for a, b in zip(logged, by_hand)) <= by_hand_tolerance(model, arguments)
        right.append(max(range(len(by_hand)), key=by_hand.__getitem__) == sample["doc"]["answer"])
    assert len(samples) == 8
    assert results["results"]["t2mlr_toy"]["acc,none"] == pytest.approx(sum(right) / len(right))


@pytest.mark.slow
def test_readme_eval_command_runs_without_a_device_option(model_dir, tmp_path) -> None:
    """`t2mlr eval run ... --tasks t2mlr_toy` as the README writes it (no --device): lm-eval's own default
    would be cuda:0; the wrapper picks CUDA if available, else the CPU, and scores with the exact path."""
    argv = ["eval", "run", "--model", "t2mlr", "--model_args", f"pretrained={model_dir},recurrence=exact",
            "--tasks", "t2mlr_toy", "--output_path", str(tmp_path), "--log_samples"]
    assert cli.main(argv) == 0
    results, samples = _saved_results(tmp_path)
    assert results["config"]["device"] == str(resolve_device("auto"))
    assert results["config"]["t2mlr_recurrence"] == "exact"
    _check_against_the_exact_forward(results, samples)


@pytest.mark.slow
def test_readme_module_command_runs_jacobi_without_a_device_option(model_dir, tmp_path) -> None:
    """`python -m t2mlr.evaluation run ... recurrence=jacobi,d_forward=16`: deeper than any toy request,
    so the scores are the exact ones."""
    argv = ["run", "--model", "t2mlr", "--model_args", f"pretrained={model_dir},recurrence=jacobi,d_forward=16",
            "--tasks", "t2mlr_toy", "--output_path", str(tmp_path), "--log_samples"]
    assert harness.main(argv) == 0
    results, samples = _saved_results(tmp_path)
    assert results["config"]["t2mlr_recurrence"] == "jacobi"
    assert results["config"]["t2mlr_d_forward"] == 16
    _check_against_the_exact_forward(results, samples)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.slow
def test_a_cuda_device_on_a_machine_without_cuda_is_a_clear_error(model_dir, capsys) -> None:
    argv = ["eval", "run", "--model", "t2mlr", "--model_args", f"pretrained={model_dir}", "--tasks", "t2mlr_toy",
            "--device", "cuda"]
    assert cli.main(argv) == 2
    assert "t2mlr eval: error: device 'cuda' was asked for, but this machine has no CUDA device" in capsys.readouterr().err


def test_the_device_comes_from_one_place() -> None:
    """lm-eval hands --device to the model as a keyword of its own, so a device in --model_args moves
    there (two would collide); two different devices are an error; no device at all is the default."""
    def run_args(device, model_args):
        return argparse.Namespace(device=device, model_args=model_args, config=None)

    moved = with_device(run_args(None, {"pretrained": "x", "device": "cpu"}))
    assert (moved.device, moved.model_args) == ("cpu", {"pretrained": "x"})
    assert with_device(run_args(None, {"pretrained": "x"})).device == str(resolve_device("auto"))
    assert with_device(run_args("cpu", {"device": "cpu"})).device == "cpu"
    with pytest.raises(ValueError, match="two devices were given"):
        with_device(run_args("cpu", {"device": "meta"}))
    listing = argparse.Namespace(include_path=None)  # `ls` and `validate` run no model: left alone
    assert vars(with_device(listing)) == {"include_path": None}


# ---------------------------------------------------------------------------------------------- help


def test_help_lists_every_model_arg_of_the_t2mlr_model() -> None:
    """The t2mlr model's own arguments are listed one by one; the HFLM ones it lists are HFLM's."""
    own = set(inspect.signature(T2MLRLM.__init__).parameters) - {"self", "pretrained", "kwargs"}
    assert set(MODEL_ARGS) == own
    assert set(HFLM_ARGS) <= set(inspect.signature(HFLM.__init__).parameters)


def test_help_names_only_tasks_that_are_shipped(task_manager) -> None:
    assert set(SHIPPED_TASKS) <= set(task_manager.all_tasks)


def test_eval_help_prints_the_t2mlr_section_then_lm_evals_help(capsys) -> None:
    assert cli.main(["eval", "--help"]) == 0
    printed = capsys.readouterr().out
    t2mlr_part, _, lm_eval_part = printed.partition("lm-eval's own help follows.")
    for name in [*MODEL_ARGS, *HFLM_ARGS, *SHIPPED_TASKS]:
        assert f"\n  {name} " in t2mlr_part
    assert "lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True" in t2mlr_part
    assert "`lm_eval --model t2mlr ...` on its own cannot work" in t2mlr_part
    assert "no plugin discovery" in t2mlr_part
    assert "usage: lm-eval" in lm_eval_part and "usage: lm-eval" not in t2mlr_part
    assert cli.main(["eval", "run", "-h"]) == 0
    printed = capsys.readouterr().out
    assert printed.index("recurrence") < printed.index("usage: lm-eval run")  # the run subcommand's own help


def test_module_help_runs_as_a_program() -> None:
    """`python -m t2mlr.evaluation --help`, in a fresh interpreter as a user types it."""
    source = str(Path(__file__).resolve().parents[1] / "src")
    done = subprocess.run([sys.executable, "-m", "t2mlr.evaluation", "--help"], check=False,
                          capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": source})
    assert done.returncode == 0, done.stderr
    assert done.stdout.index("--model_args of --model t2mlr") < done.stdout.index("usage: lm-eval")


@pytest.mark.parametrize("kind", ["matched transformer", "middle looped"])
def test_baselines_are_scored_through_the_same_entry(kind: str, task_manager, tmp_path: Path) -> None:
    """Every arm of a comparison goes through --model t2mlr: a baseline is scored as the plain causal LM it is."""
    from t2mlr.baselines import (
        LoopedConfig,
        LoopedForCausalLM,
        MatchedLlamaForCausalLM,
        matched_llama_config,
    )

    torch.manual_seed(0)
    base = tiny_model(dtype=torch.float32).config.base_config
    if kind == "matched transformer":
        model = MatchedLlamaForCausalLM(matched_llama_config(base, 40))
    else:
        model = LoopedForCausalLM(LoopedConfig.from_base(base, loop_start=2, loop_end=4, loops=3))
    model.save_pretrained(tmp_path / "baseline")
    build_tokenizer().save_pretrained(tmp_path / "baseline")
    results = _evaluate(tmp_path / "baseline", task_manager, ["t2mlr_toy"])
    assert results["config"]["t2mlr_recurrence"] == "none" and results["config"]["t2mlr_placement"] is None
    scores = _scores(results)
    tolerance = by_hand_tolerance(model.eval(), [request for request, _ in scores])
    for (context, continuation), score in scores:
        assert abs(score - _loglikelihood_by_hand(model, context, continuation)) <= tolerance
    with pytest.raises(ValueError, match="has no recurrence"):
        _evaluate(tmp_path / "baseline", task_manager, ["t2mlr_toy"], recurrence="jacobi")


# ---------------------------------------------------------------------------------------------- stock lm-eval


def _stock_lm_eval(model_dir: Path, out: Path, tasks: str, *extra: str) -> None:
    """The stock `lm_eval` command a user types (docs/ecosystem.md), in a fresh process: --model hf loads the
    directory through its remote code (`trust_remote_code=True`), which imports the installed package."""
    command = [str(Path(sys.executable).parent / "lm_eval"), "--model", "hf",
               "--model_args", f"pretrained={model_dir},trust_remote_code=True", "--tasks", tasks,
               "--include_path", str(TASKS_DIR), "--device", "cpu", "--batch_size", "4",
               "--output_path", str(out), "--log_samples", *extra]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
def test_stock_lm_eval_scores_a_saved_model_as_the_t2mlr_models_exact_path(task_manager, tmp_path) -> None:
    """`lm_eval --model hf ... trust_remote_code=True` on a saved T²MLR model (whose config evaluates on the
    exact path, the default): every logged score equals `--model t2mlr` with recurrence=exact, and the
    exact forward by hand."""
    model_dir = save_model_dir(tmp_path / "model")
    _stock_lm_eval(model_dir, tmp_path / "stock", "t2mlr_toy")
    stock, stock_samples = _saved_results(tmp_path / "stock")
    assert stock["config"]["model"] == "hf"
    ours = _evaluate(model_dir, task_manager, ["t2mlr_toy"], recurrence="exact")
    ours_by_doc = {sample["doc_id"]: [resp[0][0] for resp in sample["resps"]] for sample in ours["samples"]["t2mlr_toy"]}
    model = tiny_model(dtype=torch.float32)
    for sample in stock_samples:
        logged = [float(resp[0][0]) for resp in sample["resps"]]
        arguments = [(args["arg_0"], args["arg_1"]) for args in sample["arguments"].values()]
        tolerance = by_hand_tolerance(model, arguments)
        assert logged == pytest.approx(ours_by_doc[sample["doc_id"]], abs=tolerance)
        assert logged == pytest.approx([_loglikelihood_by_hand(model, *pair) for pair in arguments], abs=tolerance)
    assert stock["results"]["t2mlr_toy"]["acc,none"] == ours["results"]["t2mlr_toy"]["acc,none"]


@pytest.mark.slow
def test_stock_lm_eval_runs_on_a_debug_runs_checkpoint(tmp_path, monkeypatch) -> None:
    """The debug preset (synthetic token ids) saves the tokenizer `t0 .. t63` with BOS and EOS, the ids its
    model config names: stock lm-eval scores and generates with it."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "debug", "--out", "runs/debug", "train.max_steps=2"]) == 0
    final = tmp_path / "runs" / "debug" / "final"
    saved = AutoTokenizer.from_pretrained(final, trust_remote_code=True)
    config = json.loads((final / "config.json").read_text())
    assert (saved.bos_token_id, saved.eos_token_id) == (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    _stock_lm_eval(final, tmp_path / "stock", "t2mlr_toy,t2mlr_toy_gen", "--limit", "2")
    (results_file,) = (tmp_path / "stock").rglob("results_*.json")
    results = json.loads(results_file.read_text())["results"]
    assert 0.0 <= results["t2mlr_toy"]["acc,none"] <= 1.0 and "exact_match,none" in results["t2mlr_toy_gen"]
