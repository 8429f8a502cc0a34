"""What a T²MLR retrofit of a pretrained model costs: memory of the retrofit against the base alone, and
training throughput of the retrofit against the plain model (fp32 and bf16 autocast), side by side.

Memory: each measurement runs in a fresh process (peak RSS is a process-wide high-water mark): (1) load
the base model; (2) load it and retrofit it with `T2MLRForCausalLM.from_base(model, l_start, l_end)`;
then one short forward pass, so every weight is resident (safetensors maps files lazily). A GGUF
source is dequantised into ordinary memory.
It also records whether the retrofit shares the caller's base object and its weight storage.

Throughput: one training step (forward, backward, AdamW step) on the same batch of generated arithmetic
problems, plain model and retrofit interleaved step by step, medians over the repeats; tokens/s from the
wall clock and from the process's CPU time (the machine may be shared: CPU time is what the step
itself used). One torch thread.

    PYTHONPATH=src python benchmarks/retrofit_cost.py --source /tmp/base_dir --out results/retrofit_cost.json
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_memory_child(source: str, mode: str, l_start: int, l_end: int) -> dict[str, Any]:
    """Runs inside the fresh process: load (and retrofit), then report peak RSS and sharing."""
    from t2mlr import T2MLRForCausalLM
    from t2mlr.model.pretrained import load_pretrained_base

    before = peak_rss_mib()
    base, _ = load_pretrained_base(source, with_tokenizer=False)
    report: dict[str, Any] = {"mode": mode, "peak_rss_before_mib": before}
    if mode == "retrofit":
        pointers = {name: p.data_ptr() for name, p in base.named_parameters()}
        model = T2MLRForCausalLM.from_base(base, l_start, l_end)
        report["shares_base_object"] = model.model.layers is base.model.layers and model.lm_head is base.lm_head
        own = dict(model.named_parameters())  # the base's parameters keep their names in the retrofit
        report["shares_weight_storage"] = all(own[name].data_ptr() == pointer for name, pointer in pointers.items())
    else:
        model = base
    with torch.no_grad():  # touch every weight: safetensors maps the file lazily, so a bare load looks small
        model(torch.arange(3, 11)[None])
    report["parameters"] = sum(p.numel() for p in base.parameters())
    report["peak_rss_mib"] = peak_rss_mib()
    return report


def measure_memory(source: str, l_start: int, l_end: int) -> dict[str, Any]:
    results = {}
    for mode in ("base", "retrofit"):
        out = subprocess.run(
            [sys.executable, __file__, "--child", mode, "--source", source, "--l-start", str(l_start),
             "--l-end", str(l_end)],
            check=True, capture_output=True, text=True,
        )
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    results["ratio"] = results["retrofit"]["peak_rss_mib"] / results["base"]["peak_rss_mib"]
    # what loading added on top of the interpreter with torch and transformers imported
    added = {mode: results[mode]["peak_rss_mib"] - results[mode]["peak_rss_before_mib"] for mode in ("base", "retrofit")}
    results["added_mib"] = added
    results["added_ratio"] = added["retrofit"] / added["base"]
    return results


def training_batch(tokenizer: Any, rows: int) -> dict[str, torch.Tensor]:
    from t2mlr.tasks.arithmetic import ArithmeticSettings, arithmetic_retrofit_records
    from t2mlr.tasks.sft import SFTDataset
    from t2mlr.training.data import Collator

    records = arithmetic_retrofit_records(rows, "train", 0, ArithmeticSettings(min_steps=2, max_steps=3))
    dataset = SFTDataset(records, tokenizer, bos=False, max_length=512)
    return Collator(tokenizer.pad_token_id)([dataset[i] for i in range(rows)])


def step_timer(model: torch.nn.Module, batch: dict[str, torch.Tensor], autocast: bool) -> tuple[float, float]:
    """Wall and CPU seconds of one optimizer step."""
    optimizer = model._bench_optimizer  # type: ignore[attr-defined]
    wall, cpu = time.perf_counter(), time.process_time()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - wall, time.process_time() - cpu


def measure_throughput(
    source: str, l_start: int, l_end: int, rows: int, repeats: int, precisions: tuple[str, ...] = ("fp32", "bf16")
) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from t2mlr import T2MLRForCausalLM
    from t2mlr.model.pretrained import load_pretrained_base

    base, tokenizer = load_pretrained_base(source)
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(source)
    batch = training_batch(tokenizer, rows)
    tokens = int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["input_ids"].numel()
    models = {
        "plain": copy.deepcopy(base).train(),
        "retrofit": T2MLRForCausalLM.from_base(base, l_start, l_end, d_forward=2, d_backward=1).train(),
    }
    for model in models.values():
        model._bench_optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    report: dict[str, Any] = {"tokens_per_step": tokens, "rows": rows, "repeats": repeats}
    for precision in precisions:
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in models}
        for name, model in models.items():  # warm-up step each
            step_timer(model, batch, precision == "bf16")
        for _ in range(repeats):
            for name, model in models.items():  # interleaved: both see the same machine load
                times[name].append(step_timer(model, batch, precision == "bf16"))
        entry = {}
        for name, samples in times.items():
            wall = statistics.median(s[0] for s in samples)
            cpu = statistics.median(s[1] for s in samples)
            entry[name] = {"median_wall_s": wall, "median_cpu_s": cpu, "tokens_per_s_wall": tokens / wall,
                           "tokens_per_s_cpu": tokens / cpu}
        entry["retrofit_over_plain_cpu_time"] = entry["retrofit"]["median_cpu_s"] / entry["plain"]["median_cpu_s"]
        report[precision] = entry
        print(precision, json.dumps(entry), flush=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default="smollm2-135m-instruct")
    parser.add_argument("--l-start", type=int, default=5)
    parser.add_argument("--l-end", type=int, default=26)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16 (autocast)")
    parser.add_argument("--child", choices=("base", "retrofit"), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.child is not None:
        print(json.dumps(measure_memory_child(args.source, args.child, args.l_start, args.l_end)))
        return
    report: dict[str, Any] = {
        "source": args.source, "l_start": args.l_start, "l_end": args.l_end, "threads": 1,
        "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if not args.skip_memory:
        report["memory"] = measure_memory(args.source, args.l_start, args.l_end)
        print("memory", json.dumps(report["memory"]), flush=True)
    if not args.skip_throughput:
        precisions = tuple(args.precisions.split(","))
        report["throughput"] = measure_throughput(args.source, args.l_start, args.l_end, args.rows, args.repeats,
                                                  precisions)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
