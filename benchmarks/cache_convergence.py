"""How many Jacobi iterations a trained finetune checkpoint's cache needs to settle (ProsQA-Hard `cpu` preset).

The `cpu` preset of ProsQA-Hard trained its T²MLR arms on Jacobi (3, 1) and evaluated them on the exact path. This
measures, on the trained T²MLR arms of one `t2mlr experiment finetune` run, what the Jacobi path at depth d computes
compared with the exact path, on teacher-forced rows (BOS, prompt, target, EOS) of the run's held-out problems and of
its training data:

- max |Δ logit| over every real position, and over the target positions only;
- the target tokens' mean loss on each path, and how often the Jacobi argmax equals the exact argmax there;
- max |Δ R| of the state after each row's last token, relative to max |R| (the exact path's);
- the iterations the Jacobi path's early stop runs (d_forward 64, `jacobi_tol` 1e-2 / 1e-3 / 1e-4, one row at a
  time: the stop looks at the whole batch), as `benchmarks/train_overhead.py` measured the pretraining checkpoint;
- pass@1 of greedy generation with the Jacobi prefill at the training depth beside the exact prefill the run
  reported (every generated token is an exact step either way);
- with `--time`, the seconds of one training step's forward and backward (a batch of the preset's size of
  training rows) on the exact path and on Jacobi paths, median of 5 rounds in rotated order, one thread.

    python benchmarks/cache_convergence.py runs/prosqa_j31_seed0 --arms t2mlr:2-3 t2mlr:1-4 \
        --out results/finetune_cpu/cache_convergence

The run's settings come from the arm's recorded trainer config (its run directory's config.yaml), the task's from
its preset (`--preset`, default cpu: configs/experiments/finetune_cpu_<task>.yaml) and its data/meta.json, so an arm
can be measured while the run's other arms are still training. (Moved here from results/finetune_cpu/, where its
results stay: results/finetune_cpu/prosqa-hard_cache_convergence/.)

One torch thread (the numbers do not depend on it; the timing is not reported).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import yaml

from t2mlr import T2MLRForCausalLM
from t2mlr.experiments.finetune import prediction_rows
from t2mlr.experiments.sections import FinetuneTask, preset_config
from t2mlr.generation.text import GenerationSettings, generate_batched
from t2mlr.tasks.jsonl import read_jsonl
from t2mlr.tasks.sft import sft_row
from t2mlr.training.config import load_sections
from t2mlr.training.data import Collator
from t2mlr.utils import IGNORE_INDEX, load_tokenizer

DEPTHS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32)
TOLERANCES = (1e-2, 1e-3, 1e-4)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="output directory of `t2mlr experiment finetune`")
    parser.add_argument("--arms", nargs="+", required=True, help="T²MLR arms to measure, e.g. t2mlr:2-3")
    parser.add_argument("--preset", default="cpu", help="the run's finetune preset (default: cpu)")
    parser.add_argument("--out", type=Path, required=True, help="where convergence.md and convergence.json go")
    parser.add_argument("--rows", type=int, default=64, help="held-out and training rows measured (each)")
    parser.add_argument("--time", action="store_true", help="also time a training step on each path")
    parser.add_argument("--train-depth", type=int, default=None, help="Jacobi prefill depth for pass@1 "
                        "(default: the run's d_forward)")
    return parser.parse_args(argv)


def batch_of(records: list[dict], tokenizer) -> dict[str, torch.Tensor]:
    rows = [sft_row(tokenizer, r["prompt"], r["target"]) for r in records]
    return Collator(pad_token_id=tokenizer.pad_token_id)(rows)


def forward(model: T2MLRForCausalLM, batch: dict[str, torch.Tensor], **path) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"), **path)
    return out.logits.double(), out.recurrent_state.double()


def target_loss(logits: torch.Tensor, labels: torch.Tensor) -> float:
    shifted, gold = logits[:, :-1], labels[:, 1:]
    return float(torch.nn.functional.cross_entropy(shifted.reshape(-1, shifted.shape[-1]), gold.reshape(-1),
                                                   ignore_index=IGNORE_INDEX))


def depth_table(model: T2MLRForCausalLM, batch: dict[str, torch.Tensor]) -> list[dict]:
    """Each depth's deviation from the exact path on one teacher-forced batch."""
    real = batch.get("attention_mask", torch.ones_like(batch["input_ids"])).bool()
    target = batch["labels"] != IGNORE_INDEX
    target_pred = torch.zeros_like(target)
    target_pred[:, :-1] = target[:, 1:]  # the logits that predict a target token
    exact_logits, exact_r = forward(model, batch, recurrence="exact")
    exact_argmax = exact_logits.argmax(-1)
    rows = [{"depth": "exact", "target_loss": target_loss(exact_logits, batch["labels"])}]
    for d in DEPTHS:
        logits, r = forward(model, batch, recurrence="jacobi", d_forward=d, d_backward=1)
        delta = (logits - exact_logits).abs().amax(-1)
        rows.append({
            "depth": d,
            "max_dlogit_all": float(delta[real].max()),
            "max_dlogit_target": float(delta[target_pred].max()),
            "target_loss": target_loss(logits, batch["labels"]),
            "argmax_agreement_target": float((logits.argmax(-1) == exact_argmax)[target_pred].double().mean()),
            "rel_dR_last": float((r - exact_r).abs().max() / exact_r.abs().max()),
        })
    return rows


def early_stop_iterations(model: T2MLRForCausalLM, records: list[dict], tokenizer) -> dict[str, dict[str, float]]:
    """Iterations the early stop ran, per tolerance, one row at a time (median, max over the rows)."""
    found: dict[str, list[int]] = {f"{tol:g}": [] for tol in TOLERANCES}
    for record in records:
        batch = batch_of([record], tokenizer)
        for tol in TOLERANCES:
            with torch.no_grad():
                out = model(input_ids=batch["input_ids"], recurrence="jacobi", d_forward=64, d_backward=1,
                            jacobi_tol=tol)
            found[f"{tol:g}"].append(int(out.jacobi_iterations))
    return {tol: {"median": statistics.median(v), "max": max(v), "min": min(v)} for tol, v in found.items()}


def pass_at_1(model, tokenizer, records: list[dict], task: str, settings: GenerationSettings, batch_size: int) -> float:
    texts = generate_batched(model, tokenizer, [r["prompt"] for r in records], settings, batch_size, desc="pass@1")
    rows = prediction_rows(task, "t2mlr", records, texts)
    return sum(r["correct"] for r in rows) / len(rows)


def measure_arm(arm_dir: Path, run_dir: Path, task: FinetuneTask, tokenizer, held_out: list[dict], train: list[dict],
                depth: int, time_steps: bool = False) -> dict:
    config = yaml.safe_load((arm_dir / "config.yaml").read_text(encoding="utf-8"))
    model = T2MLRForCausalLM.from_pretrained(str(arm_dir / "final")).eval()
    if time_steps:
        batch = batch_of(train[: config["train"]["global_batch_size"]], tokenizer)
        return {"step_seconds": step_seconds(model, {k: batch[k] for k in ("input_ids", "attention_mask", "labels")
                                                     if k in batch})}
    gates = {name: float(torch.tanh(p)) for name, p in model.named_parameters() if name.endswith(("gamma_cur", "gamma_rec"))}
    exact = GenerationSettings(max_new_tokens=task.max_new_tokens)
    jacobi = GenerationSettings(max_new_tokens=task.max_new_tokens, prefill="jacobi", prefill_depth=depth)
    eval_batch = config["eval"]["batch_size"]
    evaluation = read_jsonl(run_dir / "data" / "eval.jsonl")
    return {
        "gates_tanh": gates,
        "held_out": depth_table(model, batch_of(held_out, tokenizer)),
        "train": depth_table(model, batch_of(train, tokenizer)),
        "early_stop_iterations_held_out": early_stop_iterations(model, held_out, tokenizer),
        "pass_at_1_exact_prefill": pass_at_1(model, tokenizer, evaluation, task.name, exact, eval_batch),
        f"pass_at_1_jacobi_prefill_{depth}": pass_at_1(model, tokenizer, evaluation, task.name, jacobi, eval_batch),
    }


TIMED_PATHS = (("exact", None, None, None), ("jacobi", 3, 1, None), ("jacobi", 4, 2, None), ("jacobi", 8, 2, None),
               ("jacobi", 12, 4, None), ("jacobi", 16, 4, None), ("jacobi", 16, 4, 1e-3))


def _path_name(recurrence: str, d_forward: int | None, d_backward: int | None, tol: float | None) -> str:
    if recurrence == "exact":
        return "exact"
    return f"jacobi ({d_forward}, {d_backward})" + (f", tol {tol:g}" if tol is not None else "")


def step_seconds(model: T2MLRForCausalLM, batch: dict[str, torch.Tensor], rounds: int = 5) -> dict[str, float]:
    """Median seconds of forward + backward per path; each round runs every path once, the order rotated."""
    import time

    model.train()
    times: dict[str, list[float]] = {_path_name(*path): [] for path in TIMED_PATHS}
    for r in range(rounds + 1):  # round 0 warms up and is not counted
        order = TIMED_PATHS[r % len(TIMED_PATHS):] + TIMED_PATHS[: r % len(TIMED_PATHS)]
        for recurrence, d_forward, d_backward, tol in order:
            kwargs = {"recurrence": recurrence}
            if recurrence == "jacobi":
                kwargs.update(d_forward=d_forward, d_backward=d_backward, jacobi_tol=tol)
            started = time.perf_counter()
            model(**batch, **kwargs).loss.backward()
            elapsed = time.perf_counter() - started
            model.zero_grad(set_to_none=True)
            if r:
                times[_path_name(recurrence, d_forward, d_backward, tol)].append(elapsed)
    model.eval()
    return {name: statistics.median(values) for name, values in times.items()}


def markdown(run_dir: Path, results: dict[str, dict], rows: int, depth: int) -> str:
    lines = [f"# Cache convergence of `{run_dir}`", "",
             (f"{rows} held-out and {rows} training rows, teacher-forced; Jacobi with d_backward 1 at every depth. "
             "rel ΔR: max |R_jacobi − R_exact| / max |R_exact| after each row's last token."), ""]
    for arm, r in results.items():
        gates = ", ".join(f"tanh({k.split('.')[-1]}) {v:+.3f}" for k, v in r["gates_tanh"].items())
        lines += [f"## {arm}", "", f"Gates: {gates}.", ""]
        for split in ("held_out", "train"):
            table = r[split]
            lines += [f"{split.replace('_', '-')} rows (exact path's target loss {table[0]['target_loss']:.4f}):", "",
                      "| depth | max Δlogit (all) | max Δlogit (targets) | target loss | argmax = exact (targets) | rel ΔR |",
                      "|---:|---:|---:|---:|---:|---:|"]
            for row in table[1:]:
                lines.append(f"| {row['depth']} | {row['max_dlogit_all']:.2e} | {row['max_dlogit_target']:.2e} | "
                             f"{row['target_loss']:.4f} | {100 * row['argmax_agreement_target']:.1f}% | "
                             f"{row['rel_dR_last']:.2e} |")
            lines.append("")
        stops = "; ".join(f"tol {tol}: median {v['median']}, max {v['max']}"
                          for tol, v in r["early_stop_iterations_held_out"].items())
        lines += [f"Early stop (d_forward 64, one held-out row at a time): {stops}.", "",
                  (f"pass@1 on the run's held-out problems: exact prefill {100 * r['pass_at_1_exact_prefill']:.1f}%, "
                  f"Jacobi prefill at depth {depth} {100 * r[f'pass_at_1_jacobi_prefill_{depth}']:.1f}%."), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    meta = json.loads((args.run / "data" / "meta.json").read_text(encoding="utf-8"))
    _, sections = load_sections(preset_config("finetune", args.preset, meta["task"]), [], {"task": FinetuneTask})
    tokenizer = load_tokenizer(str(args.run / "data" / "tokenizer"))
    held_out = read_jsonl(args.run / "data" / "eval.jsonl")[: args.rows]
    train = read_jsonl(args.run / "data" / "train.jsonl")[: args.rows]
    first = yaml.safe_load((args.run / args.arms[0].replace(":", "_") / "config.yaml").read_text(encoding="utf-8"))
    depth = args.train_depth or first["model"]["d_forward"]
    results = {}
    for arm in args.arms:
        results[arm] = measure_arm(args.run / arm.replace(":", "_"), args.run, sections["task"], tokenizer, held_out,
                                   train, depth, args.time)
        print(f"{arm}: done", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.time:
        (args.out / "step_seconds.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
        for arm, r in results.items():
            exact = r["step_seconds"]["exact"]
            print(f"{arm}: " + "; ".join(f"{name} {sec:.3f} s ({sec / exact:.2f}x exact)"
                                         for name, sec in r["step_seconds"].items()))
        return
    (args.out / "convergence.json").write_text(json.dumps({"run": str(args.run), "rows": args.rows,
                                                           "arms": results}, indent=1) + "\n", encoding="utf-8")
    (args.out / "convergence.md").write_text(markdown(args.run, results, args.rows, depth), encoding="utf-8")
    print((args.out / "convergence.md").read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
