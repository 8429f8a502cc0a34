"""Atomic, verifiable training checkpoints: model (safetensors), optimizer, scheduler, RNG states,
data position, and what a user needs to load the model (config.json, the tokenizer).

Layout under `<run>/checkpoints/`:

    step_00000100/model.safetensors     full (unsharded) weights, tied weights stored once
    step_00000100/config.json           the model config: the directory loads with from_pretrained
    step_00000100/tokenizer*.json       the run's tokenizer, when it has one
    step_00000100/optimizer.pt          full optimizer + scheduler state, keyed by parameter name
    step_00000100/rng/rank_00000.pt     python / numpy / torch / cuda generator states, one file per rank
    step_00000100/trainer_state.json    step (= batches consumed = data position), tokens seen, world size
    step_00000100/manifest.json         size and SHA-256 of every other file; written last
    latest                              text file naming the newest complete checkpoint directory

A checkpoint is written into `.tmp-step_…`, every file is fsynced, the manifest is written last (also
atomically), then the directory is renamed into place and only then is `latest` replaced. A crash at
any point leaves the previous checkpoint as the newest complete one; stale temporary directories are
removed by the next save.

Resume does not trust names or pointers: it takes the newest checkpoint whose files match its
manifest (sizes and checksums), and says which newer ones it skipped and why. A checkpoint that does
not verify is never loaded and never deleted: pruning passes over it, and a later save of the same
step moves it aside as `corrupt-step_…` instead of removing it.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from t2mlr.model.checkpoint_keys import current_key
from t2mlr.training.distributed import DistEnv, barrier, broadcast_object
from t2mlr.utils import fsync_directory, sha256_of_file, write_text_atomic

log = logging.getLogger(__name__)

LATEST = "latest"
TMP_PREFIX = ".tmp-"
CORRUPT_PREFIX = "corrupt-"
MODEL_FILE = "model.safetensors"
OPTIM_FILE = "optimizer.pt"
STATE_FILE = "trainer_state.json"
MANIFEST_FILE = "manifest.json"
TRAINING_ONLY = (OPTIM_FILE, STATE_FILE, MANIFEST_FILE, "rng")  # what a model directory does not need
UNREADABLE = (SafetensorError, RuntimeError, ValueError, OSError, KeyError, EOFError)  # a damaged file's errors
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
    torch_threads: int | None = None  # CPU threads of the run (None: not recorded by older versions)
    step_seconds: float | None = None  # time spent in optimizer steps so far (None: not recorded by older versions)
    cpu_kernels: str | None = None  # torch's CPU kernel set, e.g. AVX512 (None: not recorded by older versions)


# ---------------------------------------------------------------------------------------------
# Durable file primitives


def write_durable(path: Path, writer: Callable[[Path], None]) -> None:
    """Run `writer(path)` and fsync the result."""
    writer(path)
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def replace_text_atomic(path: Path, text: str) -> None:
    """Replace a small text file atomically: readers see the old or the new content, never a mix."""
    write_text_atomic(path, text, path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}"))


def write_manifest(directory: Path) -> None:
    """Record size and SHA-256 of every file below `directory`; the manifest itself is written last."""
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)
    entries = {p.relative_to(directory).as_posix(): {"size": p.stat().st_size, "sha256": sha256_of_file(p)}
               for p in files}
    replace_text_atomic(directory / MANIFEST_FILE, json.dumps({"format": 1, "files": entries}, indent=1))


def manifest_problems(directory: Path, checksums: bool = True) -> list[str]:
    """Why `directory` does not match its manifest (empty when it does). Without `checksums` only
    presence and sizes are compared (cheap enough to run on every save)."""
    manifest = directory / MANIFEST_FILE
    if not manifest.is_file():
        return [f"no {MANIFEST_FILE} (an interrupted write, or a checkpoint of an older t2mlr)"]
    try:
        entries = json.loads(manifest.read_text(encoding="utf-8"))["files"]
    except (ValueError, KeyError) as err:
        return [f"{MANIFEST_FILE} cannot be read ({err})"]
    problems = []
    for name, expected in entries.items():
        path = directory / name
        if not path.is_file():
            problems.append(f"{name} is missing")
        elif path.stat().st_size != expected["size"]:
            problems.append(f"{name} has {path.stat().st_size} bytes, {expected['size']} recorded (truncated?)")
        elif checksums and sha256_of_file(path) != expected["sha256"]:
            problems.append(f"{name} does not match its recorded SHA-256 (damaged)")
    for required in (MODEL_FILE, STATE_FILE, OPTIM_FILE):
        if required not in entries:
            problems.append(f"{required} is not in the manifest")
    return problems


def recorded_state(run_dir: str | Path) -> dict[str, Any]:
    """The trainer state the newest readable checkpoint of a run recorded ({} if none)."""
    root = Path(run_dir) / "checkpoints"
    for path in sorted(root.glob("step_*"), reverse=True):
        try:
            return json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
    return {}


def export_model_dir(checkpoint: Path, target: Path) -> Path:
    """A plain model directory (weights, config, tokenizer) from a checkpoint: what `from_pretrained`,
    `t2mlr generate` and `t2mlr eval` read, without the optimizer and RNG states. Hard links when the
    filesystem allows, else copies; the directory appears atomically."""
    tmp = target.with_name(f"{TMP_PREFIX}{target.name}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for item in checkpoint.iterdir():
        if item.name in TRAINING_ONLY or not item.is_file():
            continue
        try:
            os.link(item, tmp / item.name)
        except OSError:
            shutil.copy2(item, tmp / item.name)
    if target.exists():
        old = target.with_name(f"{TMP_PREFIX}old-{target.name}")
        os.replace(target, old)
        os.replace(tmp, target)
        shutil.rmtree(old)
    else:
        os.replace(tmp, target)
    fsync_directory(target.parent)
    return target


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
    """Load weights written by `save_weights`, restoring aliased names; names of the 0.1 layout are
    renamed to today's (`t2mlr.model.checkpoint_keys`), so older runs resume."""
    with safe_open(str(path), framework="pt") as handle:
        aliases = json.loads((handle.metadata() or {}).get(ALIAS_KEY, "{}"))
        state = {current_key(name): handle.get_tensor(name) for name in handle.keys()}
    for alias, target in aliases.items():
        state[current_key(alias)] = state[current_key(target)]
    return state


def with_current_names(optimizer_state: dict[str, Any]) -> dict[str, Any]:
    """A full optimizer state dict (keyed by parameter names) with names of the 0.1 layout renamed."""
    return {
        "state": {current_key(name): value for name, value in optimizer_state["state"].items()},
        "param_groups": [
            {**group, "params": [current_key(name) for name in group["params"]]} for group in optimizer_state["param_groups"]
        ],
    }


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


def full_states(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The model's and the optimizer's full CPU state dicts. Collective under FSDP/DDP: call on every rank; rank 0
    receives them."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer, options=options)


def load_full_states(model: nn.Module, optimizer: torch.optim.Optimizer, weights: dict[str, torch.Tensor],
                     optimizer_state: dict[str, Any]) -> None:
    """Full state dicts into the model (strictly: every key) and the optimizer, whatever their wrapping."""
    set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=True))
    set_optimizer_state_dict(model, optimizer, optimizer_state, options=StateDictOptions(full_state_dict=True))


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
        extra_files: dict[str, str] | None = None, write_extra: Callable[[Path], None] | None = None,
    ) -> Path:
        """Write checkpoint `state.step` atomically and point `latest` at it. Returns its directory.

        `extra_files` maps file names to text; `write_extra(directory)` writes anything else (the
        tokenizer); both land in the manifest."""
        model_state, optim_state = full_states(model, optimizer)
        name = f"step_{state.step:08d}"
        tmp = self.root / f"{TMP_PREFIX}{name}"
        if self.env.is_main:
            self._begin(tmp)
            save_weights(model_state, tmp / MODEL_FILE)
            write_durable(tmp / OPTIM_FILE, lambda p: torch.save(
                {"optimizer": optim_state, "scheduler": scheduler.state_dict()}, p))
            write_durable(tmp / STATE_FILE, lambda p: p.write_text(json.dumps(asdict(state), indent=2)))
            for filename, text in (extra_files or {}).items():
                write_durable(tmp / filename, lambda p, text=text: p.write_text(text))
            if write_extra is not None:
                write_extra(tmp)
        barrier(self.env)  # the directory exists before any rank writes its RNG state
        rng_path = tmp / "rng" / f"rank_{self.env.rank:05d}.pt"
        write_durable(rng_path, lambda p: torch.save(capture_rng(), p))
        barrier(self.env)
        final = self.root / name
        if self.env.is_main:
            write_manifest(tmp)
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
        fsync_directory(tmp / "rng")
        fsync_directory(tmp)
        if final.exists():
            # The same step again: resume only goes back past a step whose checkpoint did not verify,
            # so the old copy is kept for inspection, not deleted.
            aside = self.root / f"{CORRUPT_PREFIX}{final.name}-{time.strftime('%Y%m%d-%H%M%S')}"
            os.replace(final, aside)
            log.warning("%s did not verify and is replaced; the old copy is kept as %s", final.name, aside.name)
        os.replace(tmp, final)
        fsync_directory(self.root)
        replace_text_atomic(self.root / LATEST, final.name + "\n")
        self._prune(final)

    def _prune(self, newest: Path) -> None:
        """Keep the newest `keep_last` checkpoints; an older one that does not verify is left in place."""
        if not self.keep_last:
            return
        steps = self.checkpoint_dirs()
        for old in steps[self.keep_last:]:
            if old == newest:
                continue
            if manifest_problems(old, checksums=False):
                log.warning("not pruning %s: it does not match its manifest (kept for inspection)", old.name)
                continue
            shutil.rmtree(old)

    # -----------------------------------------------------------------------------------------
    # Finding and loading

    def checkpoint_dirs(self) -> list[Path]:
        """Every `step_…` directory, newest first."""
        return sorted((p for p in self.root.glob("step_*") if p.is_dir()), key=lambda p: p.name, reverse=True)

    def latest(self) -> Path | None:
        """The newest checkpoint directory, verified or not (None when there is none yet)."""
        return next(iter(self.checkpoint_dirs()), None)

    def newest_verified(self) -> tuple[Path | None, list[str]]:
        """The newest checkpoint that matches its manifest (None if none does), and a line per newer one
        that was skipped. Checkpoints of older t2mlr versions have no manifest: they count as verified
        when their files load (`resume`)."""
        skipped = []
        for path in self.checkpoint_dirs():
            problems = manifest_problems(path)
            legacy = problems and problems[0].startswith(f"no {MANIFEST_FILE}") and (path / STATE_FILE).is_file()
            if not problems or legacy:
                return path, skipped
            skipped.append(f"{path.name}: {'; '.join(problems)}")
        return None, skipped

    def resume(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
    ) -> tuple[Path, TrainerState] | None:
        """Load the newest checkpoint that verifies and reads; None when the run has no checkpoint yet.

        Every skipped checkpoint is logged with its reason and left in place. Rank 0 chooses and every
        rank loads the same one."""
        tried: list[str] = []
        while True:
            choice = None
            if self.env.is_main:
                path, skipped = self.newest_verified()
                skipped = [line for line in skipped if line not in tried]
                choice = (None if path is None else str(path), skipped)
            path_text, skipped = broadcast_object(choice, self.env)
            for line in skipped:
                log.warning("resume: skipping checkpoint %s; it is kept in place", line)
                tried.append(line)
            if path_text is None:
                if tried:
                    raise CheckpointError(f"no checkpoint in {self.root} can be resumed:\n  " + "\n  ".join(tried))
                return None
            path = Path(path_text)
            try:
                return path, self.load(path, model, optimizer, scheduler)
            except UnreadableCheckpointError as err:
                log.warning("resume: skipping checkpoint %s: %s; it is kept in place", path.name, err)
                tried.append(f"{path.name}: {err}")
                self._set_aside_for_this_resume(path)

    def _set_aside_for_this_resume(self, path: Path) -> None:
        """A checkpoint without a manifest that failed to read: rename it so the search moves on."""
        barrier(self.env)
        if self.env.is_main:
            os.replace(path, self.root / f"{CORRUPT_PREFIX}{path.name}-{time.strftime('%Y%m%d-%H%M%S')}")
        barrier(self.env)

    def load(
        self, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
    ) -> TrainerState:
        """Restore everything `save` wrote; every rank calls it (it reads files and may run collectives).

        All files are read first, so a damaged file raises `UnreadableCheckpointError` before anything
        is changed."""
        state = TrainerState(**_read(path / STATE_FILE, lambda p: json.loads(p.read_text(encoding="utf-8"))))
        if state.world_size != self.env.world_size:
            raise CheckpointError(
                f"{path} was written by {state.world_size} rank(s), this job has {self.env.world_size}: the "
                "per-rank RNG streams would not continue exactly (resume with the same number of processes)"
            )
        weights = _read(path / MODEL_FILE, load_weights)
        bundle = _read(path / OPTIM_FILE, lambda p: torch.load(p, map_location="cpu", weights_only=True))
        rng = _read(path / "rng" / f"rank_{self.env.rank:05d}.pt", lambda p: torch.load(p, weights_only=True))
        load_full_states(model, optimizer, weights, with_current_names(bundle["optimizer"]))
        scheduler.load_state_dict(bundle["scheduler"])
        restore_rng(rng)
        return state


class UnreadableCheckpointError(CheckpointError):
    """A checkpoint file exists but cannot be read (truncated or damaged)."""


def _read(path: Path, reader: Callable[[Path], Any]) -> Any:
    """`reader(path)`, with a damaged or missing file reported as what it is, naming the file."""
    if not path.is_file():
        raise UnreadableCheckpointError(f"{path} is missing")
    try:
        return reader(path)
    except UNREADABLE as err:
        raise UnreadableCheckpointError(f"{path} cannot be read ({type(err).__name__}: {err})") from err
