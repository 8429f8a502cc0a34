"""Calibrate variable assignment's `cpu` preset: the matched Transformer alone, trained by a plain loop.

The findings in `results.md` that say "a plain transformers loop" came from loops like this one (sessions 11 on; the
earlier ones were not kept). It trains a `transformers` LlamaForCausalLM from scratch on this library's
variable-assignment generator and word-level task tokenizer, the answer digit supervised (prompt masked), and prints
the held-out pass@1 (greedy: the argmax after `Answer: |`) every `--every` steps. No T²MLR arm is involved, so it can
size a preset without looking at which arm wins.

    python benchmarks/calibrate_va.py --depth 0 --steps 1500            # one lookup among 3 constants
    python benchmarks/calibrate_va.py --depth 5 --steps 4000 --line-tokens  # "a=5" read as one token

`--line-tokens` adds every assignment (`a=5`, `b=a`) and every query (`z=___`) to the tokenizer as one symbol, so
that a single attention lookup can answer depth 0; the prompt text is unchanged. One torch thread.
"""

from __future__ import annotations

import argparse
import math
import random
import string
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from t2mlr.tasks.sft import sft_row
from t2mlr.tasks.tokenizers import build_task_tokenizer
from t2mlr.tasks.variable_assignment import HEADER, generate_variable_assignment
from t2mlr.training.data import Collator


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=5)
    parser.add_argument("--min-depth", type=int, default=None, help="mix training depths min-depth..depth")
    parser.add_argument("--constants", type=int, default=3)
    parser.add_argument("--distractors", type=int, default=1)
    parser.add_argument("--train", type=int, default=100_000, help="training problems (drawn with replacement)")
    parser.add_argument("--eval", type=int, default=300, help="held-out problems")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--every", type=int, default=250, help="evaluate every this many steps")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64, help="MLP is 4x; heads of hidden/heads")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--line-tokens", action="store_true", help="one token per assignment line and query")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def task_phrases(line_tokens: bool) -> list[str]:
    """The tokenizer's multi-character symbols: the library's, or with every `x=y` and `x=___` as one symbol."""
    if not line_tokens:
        return [HEADER, "=___", "Answer: |"]
    letters, values = string.ascii_lowercase, string.ascii_lowercase + string.digits
    return [HEADER, "Answer: |", *(f"{x}=___" for x in letters), *(f"{x}={y}" for x in letters for y in values)]


@torch.no_grad()
def pass_at_1(model: LlamaForCausalLM, tokenizer, rows: list[dict[str, torch.Tensor]], answers: list[str]) -> float:
    """Share of held-out prompts whose greedy next token is the answer digit (rows end in digit, EOS)."""
    model.eval()
    correct = 0
    for row, answer in zip(rows, answers):
        prompt = row["input_ids"][:-2][None]
        correct += tokenizer.convert_ids_to_tokens(model(prompt).logits[0, -1].argmax().item()) == answer
    model.train()
    return correct / len(rows)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    task = (args.depth, args.constants, args.distractors, args.seed)
    train = generate_variable_assignment(args.train, *task, stream="train", min_depth=args.min_depth)
    held_out = generate_variable_assignment(args.eval, *task, stream="eval")
    tokenizer = build_task_tokenizer((r["prompt"] + r["target"] for r in train[:2000]), task_phrases(args.line_tokens))
    train_rows = [sft_row(tokenizer, r["prompt"], r["target"]) for r in train]
    eval_rows = [sft_row(tokenizer, r["prompt"], r["target"]) for r in held_out]
    print(f"vocabulary {len(tokenizer)}; first row {train_rows[0]['input_ids'].numel()} tokens", flush=True)

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.heads,
                         head_dim=args.hidden // args.heads, tie_word_embeddings=True, max_position_embeddings=512,
                         pad_token_id=tokenizer.pad_token_id)
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)

    def lr_factor(step: int) -> float:  # linear warm-up, then cosine to 0.05 x lr (the cpu presets' schedule)
        return min(1.0, (step + 1) / args.warmup) * (0.05 + 0.475 * (1 + math.cos(math.pi * step / args.steps)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    collate = Collator(pad_token_id=tokenizer.pad_token_id)  # right padding: pad id, label -100, mask 0
    rng, start = random.Random(args.seed), time.time()
    for step in range(1, args.steps + 1):
        loss = model(**collate([rng.choice(train_rows) for _ in range(args.batch)])).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        schedule.step()
        if step % args.every == 0 or step == args.steps:
            score = pass_at_1(model, tokenizer, eval_rows, [r["answer"] for r in held_out])
            print(f"step {step} loss {loss.item():.3f} pass@1 {score:.3f} ({time.time() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
