"""Helpers of the scripts under benchmarks/: machine description, synchronised wall-clock timing,
paired runs, and markdown tables for benchmarks/RESULTS.md.

CPU threads: the CPU benchmarks default to one torch thread. With torch's default (one thread per
core) on a 2-core machine that other processes also use, every small operator's threads spin-wait for
a descheduled partner and timings swing by 10× within a minute; one thread gives stable numbers (pass
--threads N on an idle machine).

Paired runs: on a shared machine the load changes during a benchmark, so two variants are timed
alternately (A B, then B A, ...) and compared per pair; the median of the per-pair ratios is far less
sensitive to a burst of foreign load than the ratio of two separately measured medians.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import transformers

from t2mlr.analysis.report import markdown_table
from t2mlr.training.config import DataConfig
from t2mlr.training.data import build_dataset


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else what `platform` knows."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine_info(device: torch.device) -> dict[str, str]:
    """Everything a reader needs to compare timings taken on another machine."""
    info = {
        "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "cpu": cpu_model(),
        "cores": str(os.cpu_count()),
        "torch threads": str(torch.get_num_threads()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    if hasattr(os, "getloadavg"):
        info["load average (1 min) at start"] = f"{os.getloadavg()[0]:.2f}"
    return info


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Wall-clock seconds of one call, with the accelerator's queue drained before and after."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def paired_times(
    first: Callable[[], object], second: Callable[[], object], repeats: int, device: torch.device
) -> tuple[list[float], list[float]]:
    """`repeats` timings of each, alternating which one runs first (ABBA...), so that neither variant
    always runs right after the other's cache or allocator state."""
    a_times, b_times = [], []
    for r in range(repeats):
        if r % 2 == 0:
            a_times.append(timed(first, device))
            b_times.append(timed(second, device))
        else:
            b_times.append(timed(second, device))
            a_times.append(timed(first, device))
    return a_times, b_times


def profile_table(fn: Callable[[], object], device: torch.device, rows: int = 15) -> str:
    """torch.profiler's summary of one call of `fn`: the operators that took the most time on the device
    (self CUDA time on a GPU, self CPU time otherwise), so a missed target names where the time went."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    synchronize(device)
    with torch.profiler.profile(activities=activities) as prof:
        fn()
        synchronize(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows)


def median_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    """Median of per-pair ratios."""
    return statistics.median(n / d for n, d in zip(numerators, denominators))


def print_report(title: str, info: dict[str, str], script: str, argv: Sequence[str] | None,
                 headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A benchmark's result as pasted into benchmarks/RESULTS.md: title, machine, command, table."""
    print(f"\n### {title}\n")
    print("\n".join(f"- {key}: {value}" for key, value in info.items()))
    print(f"- command: python benchmarks/{script} {' '.join(sys.argv[1:] if argv is None else argv)}\n")
    print(markdown_table(headers, rows))


def open_gates(model: torch.nn.Module) -> torch.nn.Module:
    """Set a random T²MLR model's gates to γ_cur = -0.5, γ_rec = 0.5, off the fusion's identity point, so
    the benchmarks time a fusion whose R reaches the output (it costs the same either way)."""
    with torch.no_grad():
        model.fusion.gamma_cur.fill_(-0.5)
        model.fusion.gamma_rec.fill_(0.5)
    return model


def parse_placements(text: str) -> list[tuple[int, int]]:
    """"1-30,5-26" → [(1, 30), (5, 26)] (1-based, inclusive, as everywhere in the project)."""
    placements = []
    for part in text.split(","):
        start, sep, end = part.strip().partition("-")
        if not sep:
            raise ValueError(f"placements look like 5-26,9-22; got {part!r}")
        placements.append((int(start), int(end)))
    return placements


def text_rows(data: Path, tokenizer: str, seq_len: int, count: int | None = None) -> dict[str, torch.Tensor]:
    """The first `count` (default: all) packed rows of `seq_len` tokens of a jsonl of {"text"} lines (the
    trainer's packing: positions restart at every document start), for benchmarks on trained checkpoints."""

    rows = build_dataset(DataConfig(source="jsonl", path=str(data), tokenizer=tokenizer, seq_len=seq_len))
    count = len(rows) if count is None else count
    if len(rows) < count:
        raise SystemExit(f"{data} holds {len(rows)} rows of {seq_len} tokens, fewer than the {count} needed")
    return {key: torch.stack([rows[i][key] for i in range(count)]) for key in ("input_ids", "position_ids", "labels")}
