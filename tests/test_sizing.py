"""`t2mlr train --dry-run` and `t2mlr.training.sizing`: the sized run, its arithmetic against hand-computed
references, the launch line, and the bad input that exits 2 before any weights exist."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from test_benchmarks import load_script

from t2mlr.cli import main as cli_main
from t2mlr.training.config import load_config
from t2mlr.training.model_factory import build_model
from t2mlr.training.sizing import (
    FP32,
    GPU_KINDS,
    estimate_memory,
    gpu_kind,
    launch_line,
    model_facts,
    plan_for,
    size_run,
)

DOCS = Path(__file__).resolve().parents[1] / "docs" / "scale.md"
bench = load_script("memory_estimate")  # its allocation counter
REQUIRED_KINDS = ("h100", "h200", "a100-80gb", "a100-40gb", "l40s", "a10g", "rtx4090")


def dry_run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = cli_main(["train", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_issue_command_prints_the_sized_run_and_its_torchrun_line(capsys) -> None:
    code, out, _ = dry_run(capsys, "smollm2_1b_9_24", "--dry-run", "--devices", "4", "--gpu", "h100")
    assert code == 0
    assert "993,343,490 parameters" in out  # the count the preset's comment states
    assert "jacobi (d_forward=16, d_backward=4" in out
    assert "256 rows × 2048 tokens = 524,288 tokens/step" in out and "accumulation 32" in out
    for part in ("weights", "gradients", "optimizer state", "activations", "GPU-hours", "MFU 30%"):
        assert part in out
    assert "torchrun --nproc_per_node 4 -m t2mlr train smollm2_1b_9_24 --out runs/smollm2_1b_9_24 --parallel fsdp" in out
    assert ": fits" in out


def test_json_output_carries_the_same_numbers(capsys) -> None:
    code, out, _ = dry_run(capsys, "smollm2_135m_13_18", "--dry-run", "--devices", "8", "--gpu", "a100-80gb", "--json")
    assert code == 0
    report = json.loads(out)
    memory = report["memory_bytes"]
    parts = ("weights", "gradients", "optimizer", "gathered_parameters", "gradient_buckets", "autocast_copies",
             "activations_total", "backward_transient")
    assert memory["peak"] == pytest.approx(max(sum(memory[p] for p in parts), memory["weights"] + memory["gradients"]
                                               + memory["optimizer"] + memory["optimizer_step_transient"]))
    assert report["tokens_per_step"] == 256 * 2048 and report["plan"]["parallel"] == "fsdp"
    assert report["gpu_hours"] == pytest.approx(report["step_seconds"] * 20000 * 8 / 3600)


def test_the_meta_model_counts_what_the_built_model_holds() -> None:
    cfg = load_config("debug")
    assert model_facts(cfg.model).parameters == sum(p.numel() for p in build_model(cfg.model).parameters())


def test_sizing_a_billion_parameters_allocates_no_weights(capsys) -> None:
    """3.7 GiB of float32 weights if they were built; the whole dry run stays far below one of its layers."""
    peak = bench.peak_allocated(lambda: cli_main(["train", "smollm2_1b_9_24", "--dry-run", "--devices", "4",
                                                   "--gpu", "h100"]))
    capsys.readouterr()
    assert peak < 64 * 2**20


def test_flops_per_step_follow_the_textbook_count_for_a_plain_transformer() -> None:
    """6 FLOPs per parameter per token in the matmuls, plus causal attention: 3 × 4·L·heads·head_dim per
    query-key pair, (S + 1) / 2 pairs per token."""
    cfg = load_config("smollm2_135m_baseline")
    run = size_run(cfg, 8, "h100")
    facts = model_facts(cfg.model)
    base, seq = cfg.model.base, cfg.data.seq_len
    per_token = 6 * facts.linear_weights + 6 * base["num_hidden_layers"] * base["num_attention_heads"] * 64 * (seq + 1)
    assert run.flops_per_step == pytest.approx(per_token * run.tokens_per_step, rel=1e-9)
    assert run.step_seconds == pytest.approx(run.flops_per_step / (8 * 989.4e12 * 0.30))


def test_sharding_splits_weights_and_optimizer_state_but_not_activations() -> None:
    cfg = load_config("smollm2_135m_13_18")
    facts, seq = model_facts(cfg.model), cfg.data.seq_len
    total = facts.parameters
    single = estimate_memory(facts, plan_for(cfg, 1, "none"), seq, False)
    fsdp = estimate_memory(facts, plan_for(cfg, 8, "fsdp"), seq, False)  # micro 8 × 8 devices × accumulation 4
    fsdp_one_step = estimate_memory(facts, plan_for(cfg, 32, "fsdp"), seq, False)  # accumulation 1
    ddp = estimate_memory(facts, plan_for(cfg, 8, "ddp"), seq, False)
    assert single.weights == FP32 * total and single.optimizer == 2 * FP32 * total
    assert fsdp.weights == pytest.approx(FP32 * total / 8, rel=1e-6)
    assert fsdp.optimizer == pytest.approx(2 * FP32 * total / 8, rel=1e-6)
    assert fsdp.gradients == FP32 * total  # unsharded across accumulation micro-steps
    assert fsdp_one_step.gradients == pytest.approx(FP32 * total / 32, rel=1e-6)
    assert ddp.weights == FP32 * total and ddp.gradient_buckets == FP32 * total
    assert fsdp.activations == single.activations == ddp.activations
    middle = range(cfg.model.l_start - 1, cfg.model.l_end)
    assert fsdp.gathered_parameters >= FP32 * sum(facts.layer_parameters[i] for i in middle)
    assert single.autocast_copies == 2 * facts.linear_weights  # bf16 on a GPU (precision auto)


def test_exact_path_activations_grow_quadratically_with_the_sequence_and_jacobi_linearly() -> None:
    def activations(path: str, seq: int) -> float:
        cfg = load_config("smollm2_135m_13_18", [f"model.train_recurrence={path}", f"data.seq_len={seq}"])
        return estimate_memory(model_facts(cfg.model), plan_for(cfg, 1, "none"), seq, False).activations_total

    assert activations("jacobi", 4096) / activations("jacobi", 2048) < 2.5  # only the per-call masks are S²
    assert activations("exact", 4096) / activations("exact", 2048) > 3  # every step saves all earlier keys


def test_launch_lines() -> None:
    assert launch_line("debug", 1, "none", "runs/x") == "t2mlr train debug --out runs/x"
    assert launch_line("debug", 2, "ddp", "runs/x", ["optim.lr=1e-3"]) == (
        "torchrun --nproc_per_node 2 -m t2mlr train debug --out runs/x --parallel ddp optim.lr=1e-3")
    multi = launch_line("smollm2_135m_13_18", 16, "fsdp", "runs/y")
    assert multi.startswith("torchrun --nnodes 2 --nproc_per_node 8 ") and "--parallel fsdp" in multi
    assert shlex.split(launch_line("a b.yaml", 1, "none", "runs/x"))[2] == "a b.yaml"


def test_the_gpu_table_holds_the_kinds_the_docs_name() -> None:
    for name in REQUIRED_KINDS:
        kind = gpu_kind(name.upper())
        assert kind.bf16_flops > kind.fp32_flops > 0 and kind.usable_bytes < kind.memory_bytes and kind.source
    assert gpu_kind("h200").memory_gb > gpu_kind("h100").memory_gb


# ---------------------------------------------------------------------------------------------- bad input


def test_devices_that_do_not_divide_the_batch_exit_2_with_the_numbers(capsys) -> None:
    code, out, err = dry_run(capsys, "smollm2_1b_9_24", "--dry-run", "--devices", "3", "--gpu", "h100")
    assert code == 2 and not out
    assert "global_batch_size 256" in err and "micro_batch_size 2 × 3 devices = 6" in err
    assert err.strip().endswith("device counts that do: 1, 2, 4, 8, 16, 32, 64")  # 128: not eval.batch_size 64


def test_an_unknown_gpu_kind_exits_2_listing_the_known_ones(capsys) -> None:
    code, _, err = dry_run(capsys, "debug", "--dry-run", "--gpu", "v100")
    assert code == 2 and "'v100'" in err
    assert all(name in err for name in GPU_KINDS)


def test_a_run_that_cannot_fit_even_at_the_widest_sharding_exits_2_with_needed_and_available(capsys) -> None:
    code, out, err = dry_run(capsys, "smollm2_1b_9_24", "--dry-run", "--devices", "8", "--gpu", "rtx4090",
                             "data.seq_len=65536", "model.base.max_position_embeddings=65536")
    assert code == 2 and not out
    match = re.search(r"FSDP2 over (\d+) devices .* needs ([\d,.]+) GiB per device .* and ([\d,.]+) GiB is usable", err)
    assert match and match.group(1) == "64"  # global 256 / micro 2 = 128, but eval.batch_size 64 splits over 64
    assert float(match.group(2).replace(",", "")) > float(match.group(3).replace(",", ""))


def test_a_run_that_fits_only_elsewhere_says_where(capsys) -> None:
    code, out, _ = dry_run(capsys, "smollm2_360m_9_24", "--dry-run", "--devices", "8", "--gpu", "a100-40gb")
    assert code == 0 and "DOES NOT FIT" in out
    assert "note: fits on 8 device(s) with train.micro_batch_size=" in out


def test_parallel_without_torchrun_exits_2_before_anything_is_built(capsys, tmp_path: Path, monkeypatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    out_dir = tmp_path / "run"
    code, _, err = dry_run(capsys, "debug", "--out", str(out_dir), "--parallel", "fsdp")
    assert code == 2 and "--parallel fsdp needs torchrun" in err and "torchrun --nproc_per_node" in err
    assert not out_dir.exists()


@pytest.mark.parametrize("argv, message", [
    (["debug", "--out", "x", "--devices", "2"], "--devices applies to --dry-run only"),
    (["debug", "--dry-run"], "--dry-run needs --gpu"),
    (["debug"], "--out is required"),
    (["debug", "--dry-run", "--gpu", "h100", "--mfu", "1.5"], "utilisation must be in (0, 1]"),
])
def test_options_that_do_not_go_together_exit_2(capsys, argv: list[str], message: str) -> None:
    code, _, err = dry_run(capsys, *argv)
    assert code == 2 and message in err


@pytest.mark.slow
def test_every_dry_run_in_docs_scale_runs_as_written(capsys) -> None:
    blocks = re.findall(r"```bash\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.DOTALL)
    commands = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines() if "--dry-run" in line]
    assert commands
    for command in commands:
        words = shlex.split(command)
        assert cli_main(words[1:]) == 0, command
        capsys.readouterr()
