"""The exact path's solvers against the plain model: sequential token loop, fixed-point passes, auto (issue 46).

The exact forward costs the plain model's FLOPs when it runs token by token, but on a CPU (and far more on a GPU)
its middle blocks then run as many small steps as there are tokens. The fixed-point solver (`exact_solver=
"fixed_point"`, docs/model.md) runs the middle blocks over spans of `--chunk` tokens at once, pass after pass until
R moves by at most `--tol`, falling back to the sequential step for what `--cap` passes leave unsettled; "auto"
stops trying once a span has fallen back. It pays only on models whose R settles in few passes: a trained model
may, random weights with open gates do not (their spans need as many passes as tokens). So the script measures
both kinds:

* random shapes (`--shapes`): `12x256` is a 12-block hidden-256 Llama with T²MLR(6, 8) and a 1000-token
  vocabulary, `smollm2-135m` SmolLM2-135M's shape with T²MLR(13, 18); gates opened (γ_cur -0.6, γ_rec 0.8);
  random token ids; the worst case for the solver;
* trained checkpoints (`--checkpoint DIR`, repeatable): a saved T²MLR model (e.g. an S5 run's `final/`), fed
  `--rows`: a task's evaluation sequences (a jsonl of {"input_tokens": [...]}, tokenized with the checkpoint's
  tokenizer) packed into rows of `--tokens` tokens with document boundaries (R restarts at each), or a text file
  (e.g. docs/semantics.md for a retrofitted language model) tokenized and cut into rows.

Timed in rounds (each round runs every variant once, in a rotated order); the table gives medians of the
per-round ratios to the plain forward (the base decoder for random shapes, the checkpoint with
recurrence="off" otherwise: the same weights without the recurrence), the FLOPs each variant executed as
counted by torch.utils.flop_counter (so the fixed-point passes show in the FLOP ratio), the fused passes per
span, and the largest |logit difference| from the sequential loop at the real tokens. One torch thread unless
--threads says otherwise.

    python benchmarks/exact_solver.py                                    # 12x256, 512 tokens, 3 rounds
    python benchmarks/exact_solver.py --shapes 12x256,smollm2-135m --tokens 512
    python benchmarks/exact_solver.py --shapes "" --checkpoint runs/s5/t2mlr/final --rows runs/s5/data/eval.jsonl
    python benchmarks/exact_solver.py --quick                            # smoke run: 12x256, 64 tokens, 1 round
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoTokenizer, LlamaConfig

from t2mlr import T2MLRConfig, T2MLRForCausalLM
from t2mlr.analysis.benchmarking import machine_info, print_report, synchronize, timed
from t2mlr.model.shapes import smollm2_135m_base_config
from t2mlr.utils import resolve_device

SHAPES: dict[str, tuple[Callable[[], LlamaConfig], tuple[int, int]]] = {
    "12x256": (lambda: LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=683, num_hidden_layers=12,
                                   num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096), (6, 8)),
    "smollm2-135m": (smollm2_135m_base_config, (13, 18)),
}
GATES = (-0.6, 0.8)
SOLVERS = ("sequential", "fixed_point", "auto")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 or auto")
    p.add_argument("--shapes", default="12x256", help=f"comma-separated random shapes, of {', '.join(SHAPES)}")
    p.add_argument("--checkpoint", action="append", default=[], help="a saved T²MLR model directory (repeatable)")
    p.add_argument("--rows", help="what the checkpoints read: a task's jsonl of {'input_tokens': [...]} (packed, "
                   "R restarting at each sequence) or a text file (tokenized, cut into rows)")
    p.add_argument("--tokenizer", help="the checkpoints' tokenizer directory, when they hold none (an S5 run's data/tokenizer)")
    p.add_argument("--tokens", type=int, default=512, help="tokens per row")
    p.add_argument("--batch", type=int, default=1, help="rows per forward")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--chunk", type=int, default=64, help="fixed_point_chunk")
    p.add_argument("--tol", type=float, default=1e-4, help="fixed_point_tol")
    p.add_argument("--cap", type=int, default=16, help="fixed_point_cap")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the rows and every span's passes here")
    p.add_argument("--quick", action="store_true", help="12x256, 64 tokens, 1 round")
    args = p.parse_args(argv)
    if args.quick:
        args.shapes, args.tokens, args.rounds = "12x256", 64, 1
    args.shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in args.shapes if s not in SHAPES]
    if unknown:
        p.error(f"unknown shape {unknown[0]!r}; known: {', '.join(SHAPES)}")
    if args.checkpoint and not args.rows:
        p.error("--checkpoint needs --rows (the task's sequences the trained model reads)")
    if not args.shapes and not args.checkpoint:
        p.error("nothing to measure: give --shapes or --checkpoint")
    if args.tokens < 2 or args.rounds < 1 or args.batch < 1:
        p.error("need --tokens >= 2, --rounds >= 1 and --batch >= 1")
    args.device = resolve_device(args.device)
    return args


def random_case(shape: str, args: argparse.Namespace) -> tuple[T2MLRForCausalLM, dict[str, torch.Tensor]]:
    base, placement = SHAPES[shape]
    torch.manual_seed(args.seed)
    model = T2MLRForCausalLM(T2MLRConfig.from_base(base(), *placement))
    with torch.no_grad():
        model.fusion.gamma_cur.fill_(GATES[0])
        model.fusion.gamma_rec.fill_(GATES[1])
    ids = torch.randint(3, model.config.vocab_size, (args.batch, args.tokens))
    return model, {"input_ids": ids}


def checkpoint_case(directory: str, args: argparse.Namespace) -> tuple[T2MLRForCausalLM, dict[str, torch.Tensor]]:
    """The trained model and what it reads: a task's sequences (a jsonl of {"input_tokens": [...]}) packed into
    rows with document_ids marking where each starts (R restarts there), or a text file's tokens cut into rows."""
    model = T2MLRForCausalLM.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or directory)
    wanted = args.tokens * args.batch
    if args.rows.endswith(".jsonl"):
        sequences = [json.loads(line)["input_tokens"] for line in Path(args.rows).read_text().splitlines() if line]
        flat, documents = [], []
        for number, tokens in enumerate(sequences * (1 + wanted // max(1, len(sequences)))):
            ids = tokenizer.convert_tokens_to_ids(tokens)
            flat += ids
            documents += [number] * len(ids)
            if len(flat) >= wanted:
                break
    else:
        flat = tokenizer(Path(args.rows).read_text())["input_ids"]
        documents = None
    if len(flat) < wanted:
        raise SystemExit(f"{args.rows} holds {len(flat)} tokens; --tokens × --batch needs {wanted}")
    shape = (args.batch, args.tokens)
    inputs = {"input_ids": torch.tensor(flat[:wanted]).reshape(shape)}
    if documents is not None:
        inputs["document_ids"] = torch.tensor(documents[:wanted]).reshape(shape)
    return model, inputs


def run_variant(model: T2MLRForCausalLM, inputs: dict[str, torch.Tensor], name: str,
                args: argparse.Namespace) -> Callable[[], object]:
    if name == "plain":
        return lambda: model(**inputs, recurrence="off", use_cache=False)
    settings = {"fixed_point_tol": args.tol, "fixed_point_chunk": min(args.chunk, args.tokens)}
    return lambda: model(**inputs, recurrence="exact", exact_solver=name, use_cache=False, **settings)


def flops(run: Callable[[], object]) -> float:
    with FlopCounterMode(display=False) as counter:
        run()
    return float(counter.get_total_flops())


def measure(label: str, model: T2MLRForCausalLM, inputs: dict[str, torch.Tensor],
            args: argparse.Namespace) -> tuple[list[list[object]], dict[str, object]]:
    model = model.to(args.device).eval()
    model.config.fixed_point_cap = args.cap
    inputs = {key: value.to(args.device) for key, value in inputs.items()}
    names = ["plain", *SOLVERS]
    runs = {name: run_variant(model, inputs, name, args) for name in names}
    with torch.no_grad():
        outputs = {name: run() for name, run in runs.items()}  # warm-up; the outputs carry the solver's report
        counted = {name: flops(run) for name, run in runs.items()}
        times: dict[str, list[float]] = {name: [] for name in names}
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                times[name].append(timed(runs[name], args.device))
        synchronize(args.device)
    rows, detail = [], {}
    reference = outputs["sequential"].logits.float()
    for name in SOLVERS:
        ratio = statistics.median(t / p for t, p in zip(times[name], times["plain"]))
        report = outputs[name].exact_solve
        summary = report.summary()
        passes = [p for p in summary["passes"] if p > 0]
        rows.append([
            label, f"{args.batch}×{args.tokens}", name, report.solver,
            f"{statistics.median(times[name]):.3f}", f"{statistics.median(times['plain']):.3f}", f"{ratio:.2f}×",
            f"{counted[name] / counted['plain']:.2f}×",
            "-" if not passes else f"{statistics.median(passes):g} (max {max(passes)})",
            f"{summary['fallback_chunks']}/{summary['chunks']}" if summary["chunks"] else "-",
            f"{float((outputs[name].logits.float() - reference).abs().max()):.1e}",
        ])
        detail[name] = {"ratio": ratio, "flop_ratio": counted[name] / counted["plain"], **summary}
    return rows, detail


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.device.type == "cpu":
        torch.set_num_threads(args.threads)
    cases = [(f"{shape} random, gates open", *random_case(shape, args)) for shape in args.shapes]
    cases += [(Path(directory).as_posix(), *checkpoint_case(directory, args)) for directory in args.checkpoint]
    rows, details = [], {}
    for label, model, inputs in cases:
        case_rows, details[label] = measure(label, model, inputs, args)
        rows += case_rows
    headers = ["model", "rows × tokens", "exact_solver", "ran", "exact s (median)", "plain s (median)",
               "exact / plain", "FLOPs / plain (counted)", "fused passes per span, median", "spans fallen back",
               "max |logit diff| vs sequential"]
    settings = f"chunk {args.chunk}, tol {args.tol:g}, cap {args.cap}"
    print_report(f"Exact path solvers vs plain forward ({settings})", machine_info(args.device), "exact_solver.py",
                 argv, headers, rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args) | {"device": str(args.device)},
                                               "cases": details}, indent=2, default=str))


if __name__ == "__main__":
    main()
