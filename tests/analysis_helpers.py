"""Tiny saved models and data files shared by the tests of `t2mlr analyze` (CPU, seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from conftest import VOCAB, tiny_base_config, tiny_model
from transformers import LlamaForCausalLM

# the debug preset made tiny: a few steps, no periodic evaluation or checkpoints, Jacobi (4, 2)
TINY_TRAINING = ["train.max_steps=3", "eval.every=0", "checkpoint.every=0", "logging.progress_bar=false",
                 "model.d_forward=4", "model.d_backward=2", "data.kwargs.num_samples=64", "eval.max_batches=1"]


def save_tiny_t2mlr(directory: Path, dtype: torch.dtype = torch.float32, **config) -> Path:
    """A 5-block T²MLR(2,4) with open gates (so R changes the output), saved with save_pretrained."""
    model = tiny_model(dtype=dtype, **config)
    model.save_pretrained(directory)
    return directory


def save_tiny_transformer(directory: Path, hidden: int = 32) -> Path:
    """A plain 5-block Llama of the same vocabulary (a stand-in for the matched baseline)."""
    torch.manual_seed(1)
    LlamaForCausalLM(tiny_base_config(hidden=hidden)).save_pretrained(directory)
    return directory


def write_ids_jsonl(path: Path, documents: int = 40, seed: int = 0, low: int = 8, high: int = 30) -> Path:
    """Documents of token ids following a fixed successor rule with some noise (learnable, not constant)."""
    generator = torch.Generator().manual_seed(seed)
    successor = torch.randperm(VOCAB - 3, generator=generator) + 3
    lines = []
    for _ in range(documents):
        length = int(torch.randint(low, high, (1,), generator=generator))
        token = int(torch.randint(3, VOCAB, (1,), generator=generator))
        ids = []
        for _ in range(length):
            ids.append(token)
            noisy = float(torch.rand(1, generator=generator)) < 0.2
            token = int(torch.randint(3, VOCAB, (1,), generator=generator)) if noisy else int(successor[token - 3])
        lines.append(json.dumps({"input_ids": ids}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
