"""Resume is exact by construction, picks the newest checkpoint that verifies, and every checkpoint and
finished run is a model directory that loads (weights, config, tokenizer)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from t2mlr.cli import main as cli_main
from t2mlr.tasks.tokenizers import build_word_tokenizer
from t2mlr.training import checkpoint as ckpt
from t2mlr.training.commands import choose_threads
from t2mlr.training.trainer import FINAL_DIR

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = [
    "model.base.hidden_size=32", "model.base.intermediate_size=64", "model.base.num_hidden_layers=3",
    "model.base.vocab_size=32", "model.base.attention_dropout=0.1", "model.l_start=2", "model.l_end=2",
    "model.d_forward=3", "model.d_backward=2", "data.seq_len=16", "data.kwargs.vocab_size=32",
    "data.kwargs.num_samples=64", "eval.data.seq_len=16", "eval.data.kwargs.vocab_size=32", "eval.max_batches=1",
    "train.global_batch_size=4", "train.micro_batch_size=2", "train.max_steps=8", "schedule.warmup_steps=2",
    "logging.progress_bar=false", "checkpoint.every=2", "checkpoint.keep_last=0", "eval.every=4", "--threads", "1",
]


def run(out: Path, *extra: str) -> int:
    return cli_main(["train", "debug", "--out", str(out), *TINY, *extra])


def losses(out: Path) -> list[float]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if r["split"] == "train"]


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    return ckpt.load_weights(out / "checkpoints" / "step_00000008" / ckpt.MODEL_FILE)


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("straight") / "run"
    before = torch.get_num_threads()
    try:
        assert run(out) == 0
    finally:
        torch.set_num_threads(before)
    return out


def assert_same_run(a: Path, b: Path) -> None:
    assert losses(a) == losses(b)
    wa, wb = final_weights(a), final_weights(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_stop_after_then_resume_equals_the_straight_run_bit_for_bit(straight: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert run(out, "--stop-after", "3") == 0
    assert (out / "checkpoints" / "step_00000003").is_dir() and not (out / FINAL_DIR).exists()
    assert run(out, "--resume") == 0
    assert_same_run(straight, out)
    assert (out / FINAL_DIR / "model.safetensors").is_file()


def _train_records(out: Path) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["split"] == "train"]


def test_the_step_time_carries_over_an_interruption(tmp_path: Path) -> None:
    """The optimizer steps' running total is saved with each checkpoint and continued on resume (here a total
    of 1000 s written into the checkpoint stands for the attempts before), so a resumed run reports every
    attempt's time; the records carry the same total."""
    out = tmp_path / "run"
    assert run(out, "--stop-after", "3") == 0
    state_file = out / "checkpoints" / "step_00000003" / ckpt.STATE_FILE
    state = json.loads(state_file.read_text())
    assert state["step_seconds"] == _train_records(out)[-1]["step_seconds"] > 0
    state_file.write_text(json.dumps({**state, "step_seconds": 1000.0}))
    (out / "checkpoints" / "step_00000003" / ckpt.MANIFEST_FILE).unlink()  # the edited file would not match it
    assert run(out, "--resume") == 0
    after = [r["step_seconds"] for r in _train_records(out) if r["step"] > 3]
    assert len(after) == 5 and 1000.0 < after[0] < after[-1]


def test_a_checkpoint_without_a_step_time_continues_from_the_records_estimate(tmp_path: Path) -> None:
    """A checkpoint written before the trainer kept the total: resuming starts from the estimate of the step
    records up to it (`optimizer_step_seconds` on tokens/s; made 10,000 s here by slowing the recorded rates)."""
    out = tmp_path / "run"
    assert run(out, "--stop-after", "3") == 0
    records = [{k: v for k, v in r.items() if k != "step_seconds"} for r in map(json.loads,
                                                                              (out / "metrics.jsonl").read_text().splitlines())]
    tokens = [r["tokens_seen"] for r in records if r["split"] == "train"]
    assert records[0]["split"] == "train"
    for record in records:
        if record["split"] == "train":
            record["tokens_per_s"] = tokens[0] / 10_000 if record is records[0] else 1e9
    # an attempt that died after the checkpoint logged a step past it: not part of the time up to step 3
    last = [r for r in records if r["split"] == "train"][-1]
    records.append({**last, "step": 4, "tokens_seen": last["tokens_seen"] + 1000, "tokens_per_s": 1e-3})
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    step = out / "checkpoints" / "step_00000003"
    state = json.loads((step / ckpt.STATE_FILE).read_text())
    del state["step_seconds"]
    (step / ckpt.STATE_FILE).write_text(json.dumps(state))
    (step / ckpt.MANIFEST_FILE).unlink()
    assert run(out, "--resume") == 0
    after = [r["step_seconds"] for r in _train_records(out) if r["step"] > 3]
    assert 10_000.0 < after[0] < 10_010.0


@pytest.mark.slow
def test_a_resume_on_other_arithmetic_warns_that_it_will_not_replay(tmp_path: Path) -> None:
    """The checkpoint records its CPU thread count and torch's CPU kernel set; resuming on another count or
    another kernel set (another CPU: planted here by editing the record) still trains, and train.log says the
    steps from there will not match an uninterrupted run; resuming on the same says nothing of it."""
    threads, kernels, same = tmp_path / "threads", tmp_path / "kernels", tmp_path / "same"
    for run_dir in (threads, kernels, same):
        assert run(run_dir, "--stop-after", "3") == 0
    step = kernels / "checkpoints" / "step_00000003"
    state = json.loads((step / ckpt.STATE_FILE).read_text())
    here = torch.backends.cpu.get_cpu_capability()
    assert state["torch_threads"] == 1 and state["cpu_kernels"] == here
    other = "AVX2" if here != "AVX2" else "DEFAULT"
    (step / ckpt.STATE_FILE).write_text(json.dumps({**state, "cpu_kernels": other}))
    (step / ckpt.MANIFEST_FILE).unlink()  # the edited file would not match it
    assert run(threads, "--resume", "--threads", "2") == 0
    assert run(kernels, "--resume") == 0
    assert run(same, "--resume") == 0
    logs = {path.name: (path / "train.log").read_text() for path in (threads, kernels, same)}
    assert "written on 1 torch CPU thread(s), this attempt runs on 2:" in logs["threads"]
    assert f"written on {other} CPU kernels, this attempt runs on {here}:" in logs["kernels"]
    assert "CPU thread(s), this attempt" not in logs["kernels"]
    assert "this attempt runs on" not in logs["same"]
    assert (threads / FINAL_DIR / "model.safetensors").is_file()


def test_a_resume_that_would_change_the_schedule_is_refused(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert run(out, "--stop-after", "2") == 0
    assert run(out, "--resume", "--max-steps", "4") == 2
    err = capsys.readouterr().err
    assert "the schedule's length: 8 → 4 steps" in err and "--allow-config-change" in err
    assert run(out, "--resume", "optim.lr=1e-2") == 2
    assert "optim.lr: 0.003 → 0.01" in capsys.readouterr().err
    assert run(out, "--resume", "logging.every=5", "eval.every=2") == 0  # neither changes the result


def test_a_resume_may_change_the_configuration_when_allowed(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert run(out, "--stop-after", "2") == 0
    assert run(out, "--resume", "--max-steps", "4", "--allow-config-change") == 0
    assert (out / "checkpoints" / "step_00000004").is_dir()


@pytest.mark.parametrize("damage", ["truncate", "flip a byte"])
def test_resume_skips_a_damaged_newest_checkpoint_and_keeps_it(
    damage: str, straight: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "run"
    assert run(out, "--stop-after", "4") == 0
    newest = out / "checkpoints" / "step_00000004" / ckpt.MODEL_FILE
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2] if damage == "truncate" else data[:-1] + bytes([data[-1] ^ 1]))
    assert run(out, "--resume") == 0
    err = capsys.readouterr().err
    assert "skipping checkpoint step_00000004" in err and "model.safetensors" in err
    assert ("truncated" if damage == "truncate" else "SHA-256") in err
    assert "resumed from" in err and "step_00000002" in err
    kept = sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith(ckpt.CORRUPT_PREFIX))
    assert len(kept) == 1 and kept[0].startswith("corrupt-step_00000004")  # set aside, never deleted
    assert_same_run(straight, out)


def test_a_run_with_no_resumable_checkpoint_says_why(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert run(out, "--stop-after", "2") == 0
    (out / "checkpoints" / "step_00000002" / ckpt.OPTIM_FILE).write_bytes(b"broken")
    assert run(out, "--resume") == 2
    err = capsys.readouterr().err
    assert "no checkpoint" in err and "optimizer.pt has 6 bytes" in err


@pytest.mark.slow
def test_checkpoints_and_the_final_directory_hold_config_and_tokenizer_and_load(tmp_path: Path) -> None:
    words = [f"w{i}" for i in range(20)]
    tokenizer = build_word_tokenizer(words)
    tokenizer.save_pretrained(str(tmp_path / "tok"))
    texts = [" ".join(words[(i + j) % 20] for j in range(12)) for i in range(40)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "run"
    code = cli_main([
        "train", "debug", "--out", str(out), "--threads", "1", "model.base.vocab_size=32", "data.source=jsonl",
        f"data.path={tmp_path / 'data.jsonl'}", f"data.tokenizer={tmp_path / 'tok'}", "data.kwargs={}",
        "data.seq_len=16", "eval.every=0", "train.max_steps=2", "logging.progress_bar=false", "checkpoint.every=0",
    ])
    assert code == 0
    final = out / FINAL_DIR
    for directory in (final, out / "checkpoints" / "step_00000002"):
        assert {"config.json", "model.safetensors", "tokenizer.json", "modeling_t2mlr.py"} <= {
            p.name for p in directory.iterdir()}
    assert not (final / ckpt.OPTIM_FILE).exists()
    # loads without `import t2mlr` in a fresh interpreter (transformers' trust_remote_code)
    probe = (
        "import sys; from transformers import AutoModelForCausalLM, AutoTokenizer;"
        f"m = AutoModelForCausalLM.from_pretrained({str(final)!r}, trust_remote_code=True);"
        f"t = AutoTokenizer.from_pretrained({str(final)!r});"
        "print(type(m).__name__, len(t))"
    )
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert shown.split()[-2:] == ["T2MLRForCausalLM", str(len(tokenizer))]
    assert cli_main(["generate", str(final), "--prompt", "w1 w2 w3", "--max-new-tokens", "4", "--device", "cpu"]) == 0


def test_thread_choice_prefers_the_flag_then_the_resumed_run(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "run"
    assert run(out, "--stop-after", "2") == 0
    assert choose_threads(3, str(out))[0] == 3
    assert choose_threads(None, str(out)) == (1, "the count the resumed run used")
    monkeypatch.setattr("os.getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    from t2mlr.utils import available_cores

    assert choose_threads(None, None)[0] == available_cores()
    monkeypatch.setattr("os.getloadavg", lambda: (100.0, 0.0, 0.0))
    assert choose_threads(None, None)[0] == 1


def _legacy_name(name: str) -> str:
    """The 0.1 layout's name of a tensor (the inverse of `t2mlr.model.checkpoint_keys.current_key`)."""
    for new, old in (("model.fusion.", "fusion."), ("model.cache_norm.", "cache_norm."), ("model.", "base.model."),
                     ("lm_head.", "base.lm_head.")):
        if name.startswith(new):
            return old + name[len(new):]
    return name


def test_a_checkpoint_in_the_0_1_layout_resumes_exactly(straight: Path, tmp_path: Path) -> None:
    """A run checkpointed by 0.1 (weights and optimizer state under `base.model.*`, `fusion.*`, no manifest)
    continues as if never stopped: names are mapped for the weights and, by name, for the optimizer state."""
    out = tmp_path / "run"
    assert run(out, "--stop-after", "3") == 0
    step = out / "checkpoints" / "step_00000003"
    weights = ckpt.load_weights(step / ckpt.MODEL_FILE)
    ckpt.save_weights({_legacy_name(k): v for k, v in weights.items()}, step / ckpt.MODEL_FILE)
    bundle = torch.load(step / ckpt.OPTIM_FILE, weights_only=True)
    optimizer = bundle["optimizer"]
    assert set(optimizer["state"]) <= set(weights)  # the optimizer state is keyed by parameter names
    bundle["optimizer"] = {
        "state": {_legacy_name(k): v for k, v in optimizer["state"].items()},
        "param_groups": [{**g, "params": [_legacy_name(p) for p in g["params"]]} for g in optimizer["param_groups"]],
    }
    torch.save(bundle, step / ckpt.OPTIM_FILE)
    (step / ckpt.MANIFEST_FILE).unlink()  # 0.1 wrote no manifest
    assert run(out, "--resume") == 0
    assert_same_run(straight, out)
