"""Every experiment under torchrun (2 gloo processes on the CPU) gives what one process gives.

Each case runs a tiny preset through `python -m torch.distributed.run --standalone --nproc_per_node 2 -m t2mlr
experiment ... --parallel ddp|fsdp` and compares it with the same command in one process (in this process):
the training losses and gradient norms of every arm to float32 rounding, the final weights to float32
rounding, and the evaluation exactly: every greedy reply (finetune, retrofit), every per-N score (S5), every
number of results.json but times. The evaluation is shared out over the ranks (several batches per run, so
both ranks generate), and the FSDP S5 run trains on rows of unequal lengths (the exact path's token loop).
The rest checks the helpers one by one and the launches that are refused.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from golden_experiments import normalise, tiny_pretrained
from test_cli import run_in_fresh_interpreter

from t2mlr.cli import main as cli_main
from t2mlr.training import checkpoint as ckpt
from t2mlr.training.distributed import DistEnv, computed_by_main, shard_and_gather

SRC = Path(__file__).resolve().parents[1] / "src"
TWO_RANKS = ["train.micro_batch_size=4", "logging.every=1"]  # 8 rows: 2 ranks × 4, or 1 process × 4 × accumulation 2
FINETUNE = ["experiment", "finetune", "variable-assignment", "--preset", "tiny", "--threads", "1", "--eval-batch-size",
            "3", *TWO_RANKS]  # 10 held-out prompts in 4 generation batches
S5 = ["experiment", "s5-retrieval", *TWO_RANKS, "--preset", "tiny"]  # 4 evaluation batches (one per N)


def torchrun(argv: list[str], timeout: int = 240) -> subprocess.CompletedProcess:
    """`t2mlr ARGV` on 2 ranks (torchrun's module form, on this checkout's sources, one thread per rank)."""
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "t2mlr",
           *map(str, argv)]
    # Own session, so a timeout ends the launcher *and* its workers.
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, stdout[-3000:] + stderr[-6000:]
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def one_process(argv: list[str]) -> None:
    assert cli_main([str(a) for a in argv]) == 0


def train_records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == "train"]


def assert_same_training(run_dir: Path, reference: Path) -> None:
    """The same losses and gradient norms at every step, and the same final weights, to float32 rounding."""
    got, want = train_records(run_dir), train_records(reference)
    assert [r["step"] for r in got] == [r["step"] for r in want] and len(want) >= 2
    for key in ("loss", "grad_norm", "lr"):
        assert [r[key] for r in got] == pytest.approx([r[key] for r in want], rel=1e-5, abs=1e-7), (run_dir, key)
    final = f"step_{want[-1]['step']:08d}"
    ref_w = ckpt.load_weights(reference / "checkpoints" / final / ckpt.MODEL_FILE)
    got_w = ckpt.load_weights(run_dir / "checkpoints" / final / ckpt.MODEL_FILE)
    assert ref_w.keys() == got_w.keys()
    for name in ref_w:
        torch.testing.assert_close(got_w[name], ref_w[name], rtol=1e-4, atol=1e-6, msg=f"{run_dir}: {name}")


def results(out: Path) -> dict:
    """results.json without times and paths (every other value compared exactly)."""
    return normalise(json.loads((out / "results.json").read_text(encoding="utf-8")), str(out))


# ---------------------------------------------------------------------------------------------- the helpers


def test_shard_and_gather_in_one_process_runs_every_item_in_order() -> None:
    seen: list[int] = []

    def work(item: int) -> int:
        seen.append(item)
        return item * item

    assert shard_and_gather([3, 1, 2], work, None) == [9, 1, 4]
    assert shard_and_gather([3, 1, 2], work, DistEnv()) == [9, 1, 4]
    assert seen == [3, 1, 2, 3, 1, 2]
    assert computed_by_main(lambda: "rank 0's", DistEnv()) == "rank 0's"


def _two_rank_worker(rank: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    env = DistEnv(rank=rank, world_size=2)
    ran: list[str] = []

    def work(item: str) -> tuple[str, int]:
        ran.append(item)
        return item.upper(), rank

    gathered = shard_and_gather(["a", "b", "c", "d", "e"], work, env)
    shared = computed_by_main(lambda: {"made by": rank}, env)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"ran": ran, "gathered": gathered, "shared": shared}))
    dist.destroy_process_group()


@pytest.mark.slow
def test_shard_and_gather_on_two_gloo_ranks_runs_each_item_once_and_returns_them_in_order(tmp_path: Path) -> None:
    torch.multiprocessing.spawn(_two_rank_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2)
    by_rank = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert by_rank[0]["ran"] == ["a", "c", "e"] and by_rank[1]["ran"] == ["b", "d"]  # item i on rank i mod 2
    expected = [["A", 0], ["B", 1], ["C", 0], ["D", 1], ["E", 0]]  # in the items' order, each from its rank
    assert by_rank[0]["gathered"] == by_rank[1]["gathered"] == expected
    assert by_rank[0]["shared"] == by_rank[1]["shared"] == {"made by": 0}


# ---------------------------------------------------------------------------------------------- refused launches


def test_parallel_outside_torchrun_is_refused_before_torch_loads(tmp_path: Path) -> None:
    out = tmp_path / "ft"
    done = run_in_fresh_interpreter(["experiment", "finetune", "variable-assignment", "--preset", "tiny", "--out",
                                     str(out), "--parallel", "fsdp"])
    assert done.stdout.strip().endswith("EXIT 2 LOADED []"), done.stdout + done.stderr
    assert "--parallel fsdp needs torchrun" in done.stderr
    assert ("torchrun --nproc_per_node 4 -m t2mlr experiment finetune variable-assignment --preset tiny --out "
            f"{out} --parallel fsdp") in done.stderr
    assert not out.exists()


@pytest.mark.parametrize("argv, message", [
    (["experiment", "s5-retrieval", "--preset", "tiny", "--parallel", "ddp", "--workers", "2"],
     "--workers 2 under torchrun"),
    (["experiment", "s5-evidence", "--preset", "tiny"], "a CPU study that trains in its own worker processes"),
    (["experiment", "finetune-summary", "a", "--out", "b"], "runs without torchrun"),
])
def test_what_cannot_run_under_torchrun_is_refused_before_torch_loads(argv: list[str], message: str,
                                                                       tmp_path: Path) -> None:
    done = run_in_fresh_interpreter([*argv, "--out", str(tmp_path / "o")] if "--out" not in argv else argv,
                                    env={"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    assert done.stdout.strip().endswith("EXIT 2 LOADED []"), done.stdout + done.stderr
    assert message in done.stderr
    assert not (tmp_path / "o").exists()


def test_torchrun_without_parallel_is_refused_before_anything_is_written(tmp_path: Path, monkeypatch, capsys) -> None:
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    assert cli_main(["experiment", "s5-retrieval", "--preset", "tiny", "--out", str(tmp_path / "o")]) == 2
    assert "pass --parallel ddp or --parallel fsdp" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------------------------- the experiments


@pytest.fixture(scope="module")
def finetune_one_process(tmp_path_factory: pytest.TempPathFactory, one_torch_thread_per_module: None) -> Path:
    out = tmp_path_factory.mktemp("finetune") / "one"
    one_process([*FINETUNE, "--out", out, "--workers", "1"])
    return out


def assert_same_finetune(out: Path, reference: Path) -> None:
    for arm in ("t2mlr_1-2", "transformer"):
        assert_same_training(out / arm, reference / arm)
    assert (out / "predictions.jsonl").read_text() == (reference / "predictions.jsonl").read_text()  # every reply
    assert results(out) == results(reference)


@pytest.mark.slow
def test_finetune_under_torchrun_with_ddp_matches_one_process(tmp_path: Path, finetune_one_process: Path) -> None:
    out = tmp_path / "ddp"
    torchrun([*FINETUNE, "--out", out, "--parallel", "ddp"])
    assert_same_finetune(out, finetune_one_process)
    assert "parallel ddp × 2 rank(s)" in (out / "t2mlr_1-2" / "train.log").read_text()


@pytest.mark.slow
def test_finetune_launch_line_of_the_dry_run_runs_under_torchrun_with_fsdp(tmp_path: Path, capsys,
                                                                          finetune_one_process: Path) -> None:
    """The dry run's launch line for 2 devices, run as printed (torchrun's module form): FSDP2, same results."""
    out = tmp_path / "fsdp"
    one_process([*FINETUNE, "--out", out, "--dry-run", "--devices", "2", "--gpu", "h100"])
    launch = capsys.readouterr().out.split("\nlaunch\n")[1].splitlines()[0].strip()
    words = shlex.split(launch)
    assert words[:5] == ["torchrun", "--nproc_per_node", "2", "-m", "t2mlr"] and words[-2:] == ["--parallel", "fsdp"]
    torchrun(words[5:])
    assert_same_finetune(out, finetune_one_process)
    assert "parallel fsdp × 2 rank(s)" in (out / "t2mlr_1-2" / "train.log").read_text()


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_s5_retrieval_under_torchrun_with_fsdp_matches_one_process(tmp_path: Path) -> None:
    """T²MLR on the exact path over rows of unequal lengths, the matched Transformer and the LSTM; the ranks'
    micro-batches differ in width, which FSDP must even out (the token loop runs once per column)."""
    reference, out = tmp_path / "one", tmp_path / "fsdp"
    one_process([*S5, "--out", reference, "--workers", "1"])
    torchrun([*S5, "--out", out, "--parallel", "fsdp"])
    for arm in ("t2mlr", "transformer", "lstm"):
        assert_same_training(out / arm, reference / arm)
    assert results(out) == results(reference)
    widths = {len(json.loads(line)["input_tokens"]) for line in (out / "data" / "train_sample.jsonl").open()}
    assert len(widths) > 1  # the training rows do differ in length


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_retrofit_under_torchrun_with_ddp_matches_one_process(tmp_path: Path) -> None:
    """The pretrained model's evaluation before finetuning, both arms' finetuning and their evaluations."""
    source = tiny_pretrained(tmp_path / "pretrained")
    argv = ["experiment", "retrofit", "--preset", "tiny", "--source", source, "--threads", "1",
            "train.micro_batch_size=1", "logging.every=1", "eval.batch_size=2"]  # 4 problems in 2 batches
    reference, out = tmp_path / "one", tmp_path / "ddp"
    one_process([*argv, "--out", reference])
    torchrun([*argv, "--out", out, "--parallel", "ddp"])
    for arm in ("transformer", "t2mlr"):
        assert_same_training(out / "runs" / arm, reference / "runs" / arm)
    for model in ("base", "transformer", "t2mlr"):
        assert (out / "predictions" / f"{model}.jsonl").read_text() == (
            reference / "predictions" / f"{model}.jsonl").read_text()
    got, want = results(out)["models"], results(reference)["models"]
    for arm in ("transformer", "t2mlr"):  # the training losses: compared above, to float32 rounding
        assert got[arm].pop("losses") == pytest.approx(want[arm].pop("losses"), rel=1e-5)
    assert got == want


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_pretrain_under_torchrun_with_fsdp_matches_one_process(tmp_path: Path) -> None:
    """Rank 0 prepares the tokenizer and shards; the final validation loss is shared out over the ranks."""
    from golden_experiments import INPUTS

    argv = ["experiment", "pretrain", "--preset", "tiny", "--corpus", INPUTS / "corpus", "--threads", "1",
            "train.micro_batch_size=2", "logging.every=1"]
    reference, out = tmp_path / "one", tmp_path / "fsdp"
    one_process([*argv, "--out", reference, "--workers", "1"])
    torchrun([*argv, "--out", out, "--parallel", "fsdp"])
    for arm in ("t2mlr_middle", "t2mlr_full", "transformer"):
        assert_same_training(out / arm, reference / arm)
    got, want = results(out)["results"], results(reference)["results"]
    assert [(r["model"], r["path"], r["tokens"]) for r in got] == [(r["model"], r["path"], r["tokens"]) for r in want]
    assert [r["loss"] for r in got] == pytest.approx([r["loss"] for r in want], rel=1e-6)


@pytest.mark.usefixtures("one_torch_thread")
def test_widening_a_batch_leaves_the_exact_path_loss_and_its_gradients_unchanged() -> None:
    """The padding FSDP ranks add to reach a common width (`Collator.widen`) is masked from attention and loss."""
    from t2mlr.training.config import load_config
    from t2mlr.training.data import Collator
    from t2mlr.training.model_factory import build_model

    torch.manual_seed(0)
    model = build_model(load_config("debug", ["model.base.hidden_size=32", "model.base.intermediate_size=64",
                                              "model.base.num_hidden_layers=3", "model.base.vocab_size=32",
                                              "model.l_start=2", "model.l_end=2"]).model).double()
    collator = Collator(pad_token_id=0)
    ragged = collator([{"input_ids": torch.randint(1, 32, (n,))} for n in (5, 7)])  # padded: an attention mask
    even = collator([{"input_ids": torch.randint(1, 32, (6,))} for _ in range(2)])  # not padded: none
    for batch in (ragged, even):
        wide = collator.widen(batch, batch["input_ids"].shape[1] + 3)
        assert wide["input_ids"].shape[1] == batch["input_ids"].shape[1] + 3
        losses, grads = [], []
        for inputs in (batch, wide):
            model.zero_grad()
            loss = model(**inputs, recurrence="exact").loss
            loss.backward()
            losses.append(loss.detach())
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(grads[1], grads[0], rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_periodic_evaluation_under_fsdp_on_rows_of_unequal_width_matches_one_process(tmp_path: Path) -> None:
    """`t2mlr train --parallel fsdp` with periodic evaluation on the exact path over S5 rows of unequal lengths
    (the ranks' evaluation batches differ in width, which stalls FSDP training steps until they are evened out):
    the evaluation, which is not evened out, runs to the end all the same and gives one process's losses."""
    import yaml

    source = tmp_path / "s5"
    one_process([*S5, "--out", source, "--workers", "1", "--models", "t2mlr"])
    tree = yaml.safe_load((source / "t2mlr" / "config.yaml").read_text(encoding="utf-8"))
    assert tree["model"]["train_recurrence"] == "exact"
    tree["eval"].update(every=1, max_batches=4, batch_size=2, data={**tree["data"], "seed": 1})  # 1 row per rank
    tree["train"].update(max_steps=2, micro_batch_size=4, parallel="none")
    tree["logging"].update(every=1)
    config = tmp_path / "with_eval.yaml"
    config.write_text(yaml.safe_dump(tree), encoding="utf-8")
    from t2mlr.training.config import load_config
    from t2mlr.training.data import build_dataset

    rows = build_dataset(load_config(config).eval.data, vocab_size=tree["model"]["base"]["vocab_size"])
    widths = [len(rows[i]["input_ids"]) for i in range(8)]
    assert any(widths[2 * b] != widths[2 * b + 1] for b in range(4)), widths  # the ranks' batches differ in width
    one_process(["train", config, "--out", tmp_path / "one", "--threads", "1"])
    torchrun(["train", config, "--out", tmp_path / "fsdp", "--parallel", "fsdp"], timeout=180)

    def eval_losses(run: Path) -> list[float]:
        lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        return [r["eval_loss"] for r in map(json.loads, lines) if r["split"] == "eval"]

    assert len(eval_losses(tmp_path / "one")) >= 2
    assert eval_losses(tmp_path / "fsdp") == pytest.approx(eval_losses(tmp_path / "one"), rel=1e-5)


def test_each_rank_takes_its_share_of_the_free_cores_unless_threads_are_given(monkeypatch) -> None:
    """Under torchrun an experiment without --threads sets each rank's torch threads as `t2mlr train` does (the
    free cores over the ranks on this machine), not torch's default of every core per rank; --threads wins."""
    import t2mlr.utils
    from t2mlr.experiments.commands import _set_threads

    saved = torch.get_num_threads()
    monkeypatch.setattr(t2mlr.utils, "free_cores", lambda: 6)
    try:
        for env, threads, expected in (({}, None, saved), ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"},
                                                           None, 3), ({"RANK": "1", "WORLD_SIZE": "2"}, 1, 1)):
            for name in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
                monkeypatch.delenv(name, raising=False)
            for name, value in env.items():
                monkeypatch.setenv(name, value)
            torch.set_num_threads(saved)
            _set_threads(threads)
            assert torch.get_num_threads() == expected, env
    finally:
        torch.set_num_threads(saved)
