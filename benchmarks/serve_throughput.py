"""Serving throughput of T²MLR in vLLM against the same backbone served by vLLM's own Llama.

Both models are the SmolLM2-135M shape with the same random backbone weights (speed does not depend on
the values): vLLM's `LlamaForCausalLM` serves the plain decoder, and T²MLR(13,18) serves it with the
fusion and the cache norm around blocks 13..18 (gates opened to γ_cur = -0.5, γ_rec = 0.5, so R reaches
the output; docs/serving.md). Both engines run in this process with the same settings (dtype, eager
mode, KV-cache size, scheduler limits, one engine thread binding), and each request is a random prompt
of `--prompt-len` tokens that generates exactly `--new-tokens` tokens (ignore_eos).

For each concurrency (1 and 16 requests submitted together) and `--repeats` pairs of runs alternating
which engine goes first: the wall time of the whole generation (→ output tokens/s), the engine's time per
output token (TPOT: per request, (last token − first token) / (new tokens − 1) from vLLM's timestamps, the
decode steps alone; median over requests), and the same requests with one new token (the prefill). CPU time
of this process is taken too, which other load on a shared machine moves far less than wall time (the
engines run in this process, one thread each): CPU TPOT = (whole − prefill) / (new tokens − 1). Reported:
each engine's median output tokens/s and TPOT, the median of the per-pair TPOT ratios (T²MLR / Llama) in
wall and in CPU time, the FLOP model's prediction of that ratio (`t2mlr.baselines.costs.decode_step_flops` over the same
contexts: T²MLR adds the fusion's 10d² per token), and the prefill's wall-time ratio (T²MLR's exact
prefill runs the middle block once per prompt position). Target on CPU: TPOT ratio ≤ 1.10.

    OMP_NUM_THREADS=1 python benchmarks/serve_throughput.py   # 1 and 16 requests, 32-token prompts, 64 new tokens
    python benchmarks/serve_throughput.py --quick          # < 2 minutes: 16 new tokens, 1 pair
    python benchmarks/serve_throughput.py --concurrency 1,4,16 --new-tokens 128 --repeats 5

Threads: vLLM's CPU worker binds its OpenMP threads itself (`VLLM_CPU_OMP_THREADS_BIND`, default `auto`:
every core but one); the binding and torch's thread count are printed with the machine.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from t2mlr import T2MLRConfig, T2MLRForCausalLM
from t2mlr.utils import parse_int_list
from t2mlr.analysis.benchmarking import (
    machine_info,
    median_ratio,
    open_gates,
    print_report,
)
from t2mlr.baselines.costs import decode_step_flops
from t2mlr.model.shapes import smollm2_135m_base_config


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", default="1,16", help="requests submitted together (default: %(default)s)")
    p.add_argument("--prompt-len", type=int, default=32, help="prompt tokens per request")
    p.add_argument("--new-tokens", type=int, default=64, help="generated tokens per request (>= 2)")
    p.add_argument("--repeats", type=int, default=3, help="pairs of runs per concurrency")
    p.add_argument("--placement", default="13-18", help="l_start-l_end, 1-based (default: %(default)s)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="smoke run: 16 new tokens, 1 pair")
    args = p.parse_args(argv)
    if args.quick:
        args.new_tokens, args.repeats = 16, 1
    args.concurrency = parse_int_list(args.concurrency)
    start, _, end = args.placement.partition("-")
    args.placement = (int(start), int(end))
    if args.new_tokens < 2 or args.prompt_len < 1 or args.repeats < 1:
        p.error("--new-tokens must be >= 2, --prompt-len and --repeats >= 1")
    return args


def save_models(directory: Path, args: argparse.Namespace) -> tuple[Path, Path, T2MLRConfig]:
    """The random backbone as a Llama checkpoint, and the same backbone wrapped into T²MLR."""
    torch.manual_seed(args.seed)
    base = AutoModelForCausalLM.from_config(smollm2_135m_base_config())
    llama_dir, t2mlr_dir = directory / "llama", directory / "t2mlr"
    base.save_pretrained(llama_dir)
    model = open_gates(T2MLRForCausalLM.from_base(base, *args.placement)).eval()  # wraps base's weights
    model.save_pretrained(t2mlr_dir)
    return llama_dir, t2mlr_dir, model.config


def engine(path: Path, args: argparse.Namespace):
    from vllm import LLM

    context = args.prompt_len + args.new_tokens
    return LLM(str(path), dtype=args.dtype, enforce_eager=True, skip_tokenizer_init=True, seed=args.seed,
               max_model_len=context, max_num_seqs=max(args.concurrency), kv_cache_memory_bytes=512 << 20,
               distributed_executor_backend="uni", disable_log_stats=False)  # log stats: per-request timestamps


def prompts(count: int, args: argparse.Namespace) -> list:
    from vllm.inputs import TokensPrompt

    generator = torch.Generator().manual_seed(args.seed + count)
    ids = torch.randint(1, 49152, (count, args.prompt_len), generator=generator)
    return [TokensPrompt(prompt_token_ids=row.tolist()) for row in ids]


@dataclass(frozen=True)
class Run:
    """One generation: wall and CPU seconds of the call, and the engine's time per output token (the median
    over requests of (last token − first token) / (new tokens − 1), from vLLM's per-request timestamps)."""

    wall: float
    cpu: float
    tpot: float


def timed_generation(llm, requests: list, new_tokens: int) -> Run:
    """Generate exactly `new_tokens` tokens for every request (the engine runs in this process, so the CPU
    time is the engine's)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, min_tokens=new_tokens, ignore_eos=True,
                            detokenize=False)
    start, start_cpu = time.perf_counter(), time.process_time()
    outputs = llm.generate(requests, params, use_tqdm=False)
    wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    if any(len(out.outputs[0].token_ids) != new_tokens for out in outputs):
        raise RuntimeError(f"a request did not generate exactly {new_tokens} tokens")
    steps = max(new_tokens - 1, 1)
    tpot = statistics.median((out.metrics.last_token_ts - out.metrics.first_token_ts) / steps for out in outputs)
    return Run(wall, cpu, tpot)


def predicted_tpot_ratio(config: T2MLRConfig, args: argparse.Namespace) -> float:
    """The FLOP model's ratio over the decode steps timed (contexts prompt+2 .. prompt+new tokens)."""
    contexts = range(args.prompt_len + 2, args.prompt_len + args.new_tokens + 1)
    ours = sum(decode_step_flops(config, c) for c in contexts)
    base = sum(decode_step_flops(config.base_config, c) for c in contexts)
    return ours / base


def measure(engines: dict, count: int, args: argparse.Namespace) -> dict[str, dict[str, list[Run]]]:
    """Paired runs (alternating which engine goes first) of the whole generation and of the prefill alone."""
    requests = prompts(count, args)
    runs: dict[str, dict[str, list[Run]]] = {name: {"whole": [], "prefill": []} for name in engines}
    for llm in engines.values():  # warm-up: allocator, kernels, first-call paths
        timed_generation(llm, requests, 2)
    for r in range(args.repeats):
        for name in (list(engines) if r % 2 == 0 else list(reversed(engines))):
            runs[name]["whole"].append(timed_generation(engines[name], requests, args.new_tokens))
            runs[name]["prefill"].append(timed_generation(engines[name], requests, 1))
    return runs


def cpu_tpot(runs: dict[str, list[Run]], args: argparse.Namespace) -> list[float]:
    """CPU seconds per decode step: (whole − prefill) / (new tokens − 1), run by run."""
    return [(w.cpu - p.cpu) / (args.new_tokens - 1) for w, p in zip(runs["whole"], runs["prefill"])]


def table_row(count: int, runs: dict[str, dict[str, list[Run]]], predicted: float, args: argparse.Namespace) -> list:
    llama, ours = runs["llama"], runs["t2mlr"]
    tokens = count * args.new_tokens
    tpot_llama, tpot_ours = [r.tpot for r in llama["whole"]], [r.tpot for r in ours["whole"]]
    print(f"  {count} requests: TPOT ratio pairs " + ", ".join(f"{o / b:.3f}" for o, b in zip(tpot_ours, tpot_llama))
          + "; CPU-time pairs " + ", ".join(f"{o / b:.3f}" for o, b in zip(cpu_tpot(ours, args), cpu_tpot(llama, args))),
          flush=True)
    return [
        count,
        f"{tokens / statistics.median(r.wall for r in llama['whole']):.1f}",
        f"{tokens / statistics.median(r.wall for r in ours['whole']):.1f}",
        f"{1000 * statistics.median(tpot_llama):.1f}",
        f"{1000 * statistics.median(tpot_ours):.1f}",
        f"{median_ratio(tpot_ours, tpot_llama):.3f}",
        f"{median_ratio(cpu_tpot(ours, args), cpu_tpot(llama, args)):.3f}",
        f"{predicted:.3f}",
        f"{median_ratio([r.wall for r in ours['prefill']], [r.wall for r in llama['prefill']]):.2f}",
    ]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # both engines in this process, side by side
    import vllm

    info = machine_info(torch.device("cpu"))
    info["vllm"] = vllm.__version__
    info["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto (unset)")
    info["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "unset")
    with tempfile.TemporaryDirectory() as tmp:
        llama_dir, t2mlr_dir, config = save_models(Path(tmp), args)
        gc.collect()
        engines = {"llama": engine(llama_dir, args), "t2mlr": engine(t2mlr_dir, args)}
        info["torch threads (engine)"] = str(torch.get_num_threads())
        predicted = predicted_tpot_ratio(config, args)
        rows = [table_row(count, measure(engines, count, args), predicted, args) for count in args.concurrency]
    placement = f"T²MLR({args.placement[0]},{args.placement[1]})"
    print_report(
        f"vLLM serving: {placement} vs vLLM's Llama, SmolLM2-135M shape, {args.dtype}, {args.prompt_len}-token "
        f"prompts, {args.new_tokens} new tokens, {args.repeats} pairs", info, "serve_throughput.py", argv,
        ["requests", "Llama tok/s", "T²MLR tok/s", "Llama TPOT ms", "T²MLR TPOT ms", "TPOT ratio (median of pairs)",
         "CPU-time TPOT ratio", "FLOP model", "prefill wall ratio"], rows)


if __name__ == "__main__":
    main()
