"""Supervised-finetuning rows: a prompt the loss ignores, then the target the model learns to write.

A row is ``[BOS] prompt target EOS`` as token ids with causal-LM labels (the model shifts them):
``IGNORE_INDEX`` on BOS and the prompt, the ids themselves on the target and EOS, so the loss is the
target's alone. Prompt and target are tokenized separately, as generation tokenizes a prompt before it
continues it (`t2mlr.utils.prompt_ids`). With ``recurrence_mask`` the row also carries ``recurrence_mask``
(False on BOS and the prompt, True on the target): a T²MLR model with ``recurrence_mask_policy="mask"``
then fuses its recurrent state only into target tokens (the prompt still writes the state), which is how
the authors' release finetunes.

`SFTDataset` is the one dataset of such rows that every finetune trains on (the reasoning finetunes, the
retrofit experiment, the GRPO policy's SFT start); `sft_dataset` is its trainer factory
(`data.factory: t2mlr.tasks.sft:sft_dataset`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from t2mlr.tasks.jsonl import read_jsonl
from t2mlr.utils import IGNORE_INDEX, load_tokenizer, prompt_ids

__all__ = ["SFTDataset", "mask_prompt_labels", "sft_dataset", "sft_row"]


def mask_prompt_labels(labels: torch.Tensor, prompt_length: int) -> torch.Tensor:
    """Labels with the first `prompt_length` positions (BOS and the prompt) ignored by the loss, in place."""
    labels[..., :prompt_length] = IGNORE_INDEX
    return labels


def sft_row(tokenizer: Any, prompt: str, target: str, *, bos: bool = True,
            recurrence_mask: bool = False) -> dict[str, torch.Tensor]:
    """One training row (see the module docstring); a tokenizer without an EOS token is refused, since a
    model finetuned on its rows would never learn to stop."""
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS (end-of-text) token: a finetuned model would never learn to stop")
    head = prompt_ids(tokenizer, prompt, bos)
    tail = list(tokenizer(target, add_special_tokens=False)["input_ids"]) + [int(tokenizer.eos_token_id)]
    input_ids = torch.tensor(head + tail, dtype=torch.long)
    row = {"input_ids": input_ids, "labels": mask_prompt_labels(input_ids.clone(), len(head))}
    if recurrence_mask:
        row["recurrence_mask"] = torch.tensor([False] * len(head) + [True] * len(tail))
    return row


class SFTDataset(Dataset):
    """SFT rows of ``{prompt, target}`` records, encoded once up front. With `max_length`, a row longer than
    that is refused rather than cut (a cut reply would teach a wrong answer)."""

    labels_aligned_to_inputs = False  # causal-LM labels: the model shifts them

    def __init__(self, records: Sequence[Mapping[str, Any]], tokenizer: Any, bos: bool = True,
                 prompt_recurrence_mask: bool = False, max_length: int | None = None) -> None:
        self.tokenizer = tokenizer  # saved with every checkpoint by the trainer
        self.rows = []
        for index, record in enumerate(records):
            row = sft_row(tokenizer, record["prompt"], record["target"], bos=bos, recurrence_mask=prompt_recurrence_mask)
            if max_length is not None and row["input_ids"].numel() > max_length:
                raise ValueError(f"record {index} has {row['input_ids'].numel()} tokens, more than max_length={max_length}")
            self.rows.append(row)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.rows[index]


def sft_dataset(path: str, tokenizer: str, bos: bool = True, prompt_recurrence_mask: bool = False,
                max_length: int | None = None) -> SFTDataset:
    """The trainer's data factory: `{prompt, target}` records of a JSON-lines file, tokenized with the
    tokenizer saved at `tokenizer` (which the run's checkpoints then carry)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"SFT data file not found: {path}")
    return SFTDataset(read_jsonl(path), load_tokenizer(tokenizer), bos, prompt_recurrence_mask, max_length)
