"""Atomic training checkpoints: model (safetensors), optimizer, scheduler, RNG states, data position.

Layout under `<run>/checkpoints/`:

    step_00000100/model.safetensors     full (unsharded) weights, tied weights stored once
    step_00000100/optimizer.pt          full optimizer + scheduler state, keyed by parameter name
    step_00000100/rng/rank_00000.pt     python / numpy / torch / cuda generator states, one file per rank
    step_00000100/trainer_state.json    step (= batches consumed = data position), tokens seen, world size
    latest                              text file naming the newest complete checkpoint directory

A checkpoint is written into `.tmp-step_…`, every file is fsynced, then the directory is renamed
into place and only then is `latest` replaced (write, fsync, os.replace). A crash at any point
leaves `latest` pointing at the previous complete checkpoint; stale temporary directories are
removed by the next save.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from t2mlr.training.distributed import DistEnv, barrier

LATEST = "latest"
TMP_PREFIX = ".tmp-"
MODEL_FILE = "model.safetensors"
OPTIM_FILE = "optimizer.pt"
STATE_FILE = "trainer_state.json"
ALIAS_KEY = "t2mlr_aliases"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or does not fit the model being resumed."""


@dataclass
class TrainerState:
    """What the loop needs besides tensors to continue exactly where it stopped."""

    step: int
    tokens_seen: int
    world_size: int
    global_batch_size: int

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def step_dirname(step: int) -> str:
    return f"step_{step:08d}"


# ---------------------------------------------------------------------------------------------
# Durable file primitives


def fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def fsync_dir(path: Path) -> None:
    """Persist a directory's entries (renames, new files); a no-op where directories cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (IsADirectoryError, PermissionError):
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: Path, writer: Callable[[Path], None]) -> None:
    """Run `writer(path)` and fsync the result."""
    writer(path)
    fsync_file(path)


def replace_text_atomic(path: Path, text: str) -> None:
    """Replace a small text file atomically: readers see the old or the new content, never a mix."""
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


# ---------------------------------------------------------------------------------------------
# Model weights in safetensors (tied weights stored once)


def save_weights(state: dict[str, torch.Tensor], path: Path) -> None:
    """Save a full state dict; tensors sharing storage (tied embeddings) are stored once plus an alias map."""
    kept: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[int, tuple[int, ...], tuple[int, ...]], str] = {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr() + tensor.storage_offset() * tensor.element_size(),
               tuple(tensor.shape), tuple(tensor.stride()))
        if key in seen and tensor.numel() > 0:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        kept[name] = tensor.detach().contiguous().cpu()
    write_durable(path, lambda p: save_file(kept, str(p), metadata={ALIAS_KEY: json.dumps(aliases)}))


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    """Load weights written by `save_weights`, restoring aliased names."""
    state: dict[str, torch.Tensor] = {}
    with safe_open(str(path), framework="pt") as handle:
        aliases = json.loads((handle.metadata() or {}).get(ALIAS_KEY, "{}"))
        for name in handle.keys():
            state[name] = handle.get_tensor(name)
    for alias, target in aliases.items():
        state[alias] = state[target]
    return state


# ---------------------------------------------------------------------------------------------
# RNG states (stored as tensors and lists so torch.load can stay weights_only)


def capture_rng() -> dict[str, Any]:
    version, mt_state, gauss = random.getstate()
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(mt_state), gauss],
        "numpy": [np_kind, torch.from_numpy(np_keys.astype(np.int64)), np_pos, np_has_gauss, np_gauss],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    version, mt_state, gauss = state["python"]
    random.setstate((version, tuple(mt_state), gauss))
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = state["numpy"]
    np.random.set_state((np_kind, np_keys.numpy().astype(np.uint32), np_pos, np_has_gauss, np_gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------------------------
# Full (unsharded) state dicts that work for plain, DDP and FSDP2 models alike


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Collective under FSDP/DDP: call on every rank; rank 0 receives the full CPU state."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_model_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=True))


def load_full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


# ---------------------------------------------------------------------------------------------
# Saving


class CheckpointManager:
    """Writes and finds checkpoints under `root`; every rank calls `save` (it contains collectives)."""

    def __init__(self, root: Path, env: DistEnv, keep_last: int | None = None) -> None:
        self.root = Path(root)
        self.env = env
        self.keep_last = keep_last

    def save(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, state: TrainerState,
        extra_files: dict[str, str] | None = None,
    ) -> Path:
        """Write checkpoint `state.step` atomically and point `latest` at it. Returns its directory."""
        model_state = full_model_state(model)
        optim_state = full_optimizer_state(model, optimizer)
        name = step_dirname(state.step)
        tmp = self.root / f"{TMP_PREFIX}{name}"
        if self.env.is_main:
            self._begin(tmp)
            save_weights(model_state, tmp / MODEL_FILE)
            write_durable(tmp / OPTIM_FILE, lambda p: torch.save(
                {"optimizer": optim_state, "scheduler": scheduler.state_dict()}, p))
            write_durable(tmp / STATE_FILE, lambda p: p.write_text(json.dumps(state.to_json(), indent=2)))
            for filename, text in (extra_files or {}).items():
                write_durable(tmp / filename, lambda p, text=text: p.write_text(text))
        barrier(self.env)
        rng_path = tmp / "rng" / f"rank_{self.env.rank:05d}.pt"
        write_durable(rng_path, lambda p: torch.save(capture_rng(), p))
        barrier(self.env)
        final = self.root / name
        if self.env.is_main:
            self._commit(tmp, final)
        barrier(self.env)
        return final

    def _begin(self, tmp: Path) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.glob(f"{TMP_PREFIX}*"):
            if stale.is_dir():
                shutil.rmtree(stale)
            else:
                stale.unlink()
        (tmp / "rng").mkdir(parents=True)

    def _commit(self, tmp: Path, final: Path) -> None:
        fsync_dir(tmp / "rng")
        fsync_dir(tmp)
        if final.exists():
            # Re-saving a step (e.g. after a resume): move the old copy aside, never delete it first.
            trash = self.root / f"{TMP_PREFIX}old-{final.name}"
            os.replace(final, trash)
            os.replace(tmp, final)
            shutil.rmtree(trash)
        else:
            os.replace(tmp, final)
        fsync_dir(self.root)
        replace_text_atomic(self.root / LATEST, final.name + "\n")
        self._prune(final)

    def _prune(self, newest: Path) -> None:
        if not self.keep_last:
            return
        steps = sorted(p for p in self.root.glob("step_*") if p.is_dir())
        for old in steps[: max(0, len(steps) - self.keep_last)]:
            if old != newest:
                shutil.rmtree(old)

    # -----------------------------------------------------------------------------------------
    # Finding and loading

    def latest(self) -> Path | None:
        """The checkpoint `latest` points at, or None when there is none yet."""
        pointer = self.root / LATEST
        if not pointer.is_file():
            return None
        path = self.root / pointer.read_text(encoding="utf-8").strip()
        if not (path / STATE_FILE).is_file() or not (path / MODEL_FILE).is_file():
            raise CheckpointError(f"{pointer} names {path.name}, which is missing or incomplete")
        return path

    def load(
        self, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
    ) -> TrainerState:
        """Restore everything `save` wrote; every rank calls it (it reads files and may run collectives)."""
        state = TrainerState(**json.loads((path / STATE_FILE).read_text(encoding="utf-8")))
        if state.world_size != self.env.world_size:
            raise CheckpointError(
                f"{path} was written by {state.world_size} rank(s), this job has {self.env.world_size}: the "
                "per-rank RNG streams would not continue exactly (resume with the same number of processes)"
            )
        load_full_model_state(model, load_weights(path / MODEL_FILE))
        bundle = torch.load(path / OPTIM_FILE, map_location="cpu", weights_only=True)
        load_full_optimizer_state(model, optimizer, bundle["optimizer"])
        scheduler.load_state_dict(bundle["scheduler"])
        rng_path = path / "rng" / f"rank_{self.env.rank:05d}.pt"
        restore_rng(torch.load(rng_path, weights_only=True))
        return state


