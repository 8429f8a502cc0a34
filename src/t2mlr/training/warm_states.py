"""Warm starts for multi-epoch finetuning: each training row's recurrent states from its last visit.

The Jacobi path normally starts every step from a seed pass (the middle block without fusion), far from
the fixed point. A row seen before already had its states computed, by the final pass of its last visit:
R after every token, with the weights of that time. Starting the next visit's iteration from them
(`initial_states=`) begins near the fixed point; how near depends on how far the weights moved since (one
epoch of updates), which `benchmarks/stale_states.py` measures together with the effect on the loss and
the gradients. The store captures R through a `T2MLRCache` passed to the training forward: the model
appends the final pass's states (detached) to it, so the model code needs nothing new.
"""

from __future__ import annotations

from pathlib import Path

import torch

from t2mlr.model import T2MLRCache

STORE_DIR = "warm_states"  # inside a checkpoint directory; not part of the exported model directory
STORE_FILE = "rank_00000.pt"


class WarmStartStore:
    """Row index → R after every token of that row (CPU, float32), from the row's latest visit."""

    def __init__(self, model_config: object) -> None:
        self.model_config = model_config
        self.states: dict[int, torch.Tensor] = {}

    def forward_inputs(self, rows: list[int], length: int, device: torch.device) -> dict[str, object]:
        """What a training forward of these rows gets: a cache that captures their new states, and the
        stored states as the first Jacobi iterate when every row has some of this length."""
        inputs: dict[str, object] = {"past_key_values": T2MLRCache(config=self.model_config), "use_cache": True}
        stored = [self.states.get(row) for row in rows]
        if all(s is not None and s.shape[0] == length for s in stored):
            inputs["initial_states"] = torch.stack(stored).to(device)  # type: ignore[arg-type]
        return inputs

    def remember(self, rows: list[int], cache: T2MLRCache) -> None:
        """Keep the states the forward wrote into `cache` (one row of states per dataset row)."""
        states = cache.recurrent_states
        if states is None or states.shape[0] != len(rows):
            raise ValueError(f"expected states for {len(rows)} rows in the cache, got "
                             f"{None if states is None else tuple(states.shape)}")
        for row, row_states in zip(rows, states.detach().float().cpu()):
            self.states[int(row)] = row_states.clone()

    def save(self, checkpoint_dir: Path) -> None:
        folder = Path(checkpoint_dir) / STORE_DIR
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(self.states, folder / STORE_FILE)

    def load(self, checkpoint_dir: Path) -> None:
        """The states saved with a checkpoint (none when it was written without this option)."""
        file = Path(checkpoint_dir) / STORE_DIR / STORE_FILE
        self.states = torch.load(file, weights_only=True) if file.is_file() else {}
