"""Supervised-finetuning rows: a prompt the loss ignores, then the target the model learns to write.

A row is ``[BOS] prompt target EOS`` as token ids with causal-LM labels (the model shifts them):
``IGNORE_INDEX`` on BOS and the prompt, the ids themselves on the target and EOS, so the loss is the
target's alone. Prompt and target are tokenized separately, as generation tokenizes a prompt before it
continues it. With ``recurrence_mask`` the row also carries ``recurrence_mask`` (False on BOS and the
prompt, True on the target): a T²MLR model with ``recurrence_mask_policy="mask"`` then fuses its
recurrent state only into target tokens (the prompt still writes the state).
"""

from __future__ import annotations

from typing import Any

import torch

from t2mlr.utils import IGNORE_INDEX

__all__ = ["mask_prompt_labels", "prompt_ids", "sft_row"]


def prompt_ids(tokenizer: Any, prompt: str, bos: bool = True) -> list[int]:
    """BOS (with `bos`, when the tokenizer has one) and the prompt's tokens: what generation starts from."""
    ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    return ([tokenizer.bos_token_id] if bos and tokenizer.bos_token_id is not None else []) + ids


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
