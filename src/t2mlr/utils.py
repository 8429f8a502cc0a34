"""Small helpers every layer of the package shares (the bottom layer: imports nothing from t2mlr).

* `IGNORE_INDEX`: the label value that causal-LM losses skip (transformers' convention).
* `resolve_device`: "auto" means CUDA when present, else CPU, everywhere a device is chosen.
* `check_known_names`: the one way unknown keyword arguments and config keys are refused, with the
  nearest valid spelling in the message.
* `signature_fields`: the typed keyword parameters of a callable, the schema that YAML sections and keyword
  arguments of a callable are checked against (`Field`: one of them).
* `load_tokenizer`: a Hugging Face tokenizer from a directory, a bare tokenizer.json or a hub id, with
  errors that say what is missing; `prompt_ids`: a prompt's token ids as training and generation read it.
* `launched_by_torchrun`: read from the environment, so a command refuses a launch before torch loads.
* `check_model_dir`: a saved model directory exists and holds a config (`ModelDirectoryError`), answered before
  torch loads.
* `fsync_directory`, `write_text_atomic`, `sha256_of_file`: the durable writes and checksums that checkpoints
  and tokenized corpora share; `exit_when_orphaned`: how their worker processes end with their parent.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import importlib
import inspect
import os
import sys
import time
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch and transformers load where they are used: the CLI starts without them
    import torch
    from transformers import PreTrainedTokenizerBase

IGNORE_INDEX = -100
DTYPES = ("float32", "bfloat16", "float16")  # the floating dtypes a user may name
PARENT_POLL_SECONDS = 0.5  # how often an orphaned worker looks for its parent (`exit_when_orphaned`)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "vocab.txt")


class TokenizerNotFoundError(ValueError):
    """A tokenizer was asked for where none can be loaded."""


class ModelDirectoryError(ValueError):
    """A model directory lacks something generation or evaluation needs (checked before torch loads)."""


def check_model_dir(model_dir: str | Path) -> Path:
    """The directory as a Path, after checking it holds a model config."""
    path = Path(model_dir)
    if not path.is_dir():
        raise ModelDirectoryError(f"model directory {str(path)!r} does not exist")
    if not (path / "config.json").is_file():
        raise ModelDirectoryError(f"{str(path)!r} has no config.json: not a saved model (use save_pretrained)")
    return path


def resolve_device(device: "str | torch.device") -> "torch.device":
    """"auto" picks CUDA when it is available, else the CPU; anything else is passed to torch as is."""
    import torch

    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for, but this machine has no CUDA device; use 'cpu' or 'auto'")
    return resolved


def resolve_dtype(dtype: str) -> "torch.dtype | str":
    """"auto" keeps the dtype a checkpoint was saved in; otherwise one of `DTYPES` as a torch dtype."""
    import torch

    if dtype == "auto":
        return "auto"
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {list(DTYPES)}, got {dtype!r}")
    return getattr(torch, dtype)


def load_tokenizer(source: str | Path) -> "PreTrainedTokenizerBase":
    """A Hugging Face tokenizer from a directory (a saved model's or tokenizer's), a bare `tokenizer.json`
    file, or a hub id (where the hub is reachable)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = Path(source)
    if path.is_file():
        if path.suffix != ".json":
            raise TokenizerNotFoundError(f"{str(path)!r} is a file but not a tokenizer.json; pass its directory")
        return PreTrainedTokenizerFast(tokenizer_file=str(path))
    if path.is_dir() and not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise TokenizerNotFoundError(
            f"{str(path)!r} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); save one with "
            "tokenizer.save_pretrained(DIR) next to the model weights"
        )
    try:
        return AutoTokenizer.from_pretrained(str(source))
    except (OSError, ValueError) as err:
        where = "saved in" if path.is_dir() else "from the path or hub id"
        raise TokenizerNotFoundError(f"could not load a tokenizer {where} {str(source)!r}: {err}") from err


def prompt_ids(tokenizer: Any, prompt: str, bos: bool | None = True) -> list[int]:
    """BOS (with `bos`, when the tokenizer has one) and the prompt's tokens: what a finetuned model reads before
    its reply, in training (`t2mlr.tasks.sft`) and in generation alike. `bos=None`: the tokenizer's own special
    tokens, as TRL's trainers encode prompts."""
    if bos is None:
        return list(tokenizer(prompt)["input_ids"])
    ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    return ([tokenizer.bos_token_id] if bos and tokenizer.bos_token_id is not None else []) + ids


def parse_int_list(text: str, what: str = "values", minimum: int = 1) -> list[int]:
    """"1,2" → [1, 2], each at least `minimum`; the error names the option (`what`)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as err:
        raise ValueError(f"{what}: expected comma-separated integers, got {text!r}") from err
    if not values:
        raise ValueError(f"{what}: expected at least one integer, got {text!r}")
    bad = [v for v in values if v < minimum]
    if bad:
        raise ValueError(f"{what}: every value must be >= {minimum}, got {bad}")
    return values


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def free_cores() -> int:
    """Cores not busy right now: available cores minus the 1-minute load average, at least 1.

    On a shared machine torch's default (one thread per core) makes every operator's threads wait for
    descheduled partners; measured on a busy 2-core machine, the debug preset took minutes instead of
    seconds (benchmarks/RESULTS.md)."""
    cores = available_cores()
    if not hasattr(os, "getloadavg"):
        return cores
    return max(1, min(cores, round(cores - os.getloadavg()[0])))


def fsync_directory(directory: Path) -> None:
    """Make renames and new files inside `directory` durable (POSIX: the directory entry itself must be synced);
    a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except (IsADirectoryError, PermissionError):
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str, temp: Path) -> None:
    """Replace a text file through `temp`: readers see the old or the new content, never a mix, and the new
    content survives a crash once this returns."""
    with open(temp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)
    fsync_directory(path.parent)


def sha256_of_file(path: Path, chunk: int = 1 << 22) -> str:
    """The SHA-256 hex digest of a file, read `chunk` bytes at a time (shards and weights are large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def exit_when_orphaned(parent_pid: int) -> None:
    """Wait (on a daemon thread of a worker process) until the process `parent_pid` that started this one is gone,
    then end this process at once: a parent killed with kill -9 has no chance to stop its workers."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_SECONDS)
    os._exit(1)  # from any thread: no cleanup, like the signal


def launched_by_torchrun() -> bool:
    """Whether torchrun started this process (it sets RANK and WORLD_SIZE for every process it starts)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def cpu_arithmetic() -> dict[str, Any]:
    """How this process computes on the CPU: torch's thread count and kernel set (AVX2, AVX512, ...). Both set
    the float summation order, so a run repeats bit for bit only where both are the same (keys as the
    checkpoints' trainer state records them)."""
    import torch

    return {"torch_threads": torch.get_num_threads(), "cpu_kernels": torch.backends.cpu.get_cpu_capability()}


def off_main_rank() -> bool:
    """Whether this process is a torchrun rank other than 0: its progress bars would only repeat rank 0's."""
    return launched_by_torchrun() and int(os.environ["RANK"]) != 0


def lazy_names(package: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """A package's module-level `__getattr__` (PEP 562) that imports each public name from its submodule
    (`homes`: name → submodule, relative to `package`) on first access, so importing the package, and the
    command-line help that imports it, does not pay for torch and transformers."""

    def load(name: str) -> Any:
        if name in homes:
            return getattr(importlib.import_module(f"{package}.{homes[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return load


LIBRARY_PACKAGES = ("t2mlr", "torch", "transformers", "transformers_modules")  # frames a warning skips


def caller_stacklevel() -> int:
    """The `stacklevel` that makes a `warnings.warn` in the calling function name the first line outside t2mlr,
    torch and transformers (the user's call), however many wrappers (`nn.Module.__call__`, transformers'
    decorators, a remote-code copy) lie between."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").partition(".")[0] in LIBRARY_PACKAGES:
        frame, level = frame.f_back, level + 1
    return level


def nearest_name(name: str, valid: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The valid name closest to a misspelt one, or None when nothing is close (difflib's similarity `cutoff`)."""
    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=cutoff)
    return close[0] if close else None


def unknown_name_message(what: str, name: str, valid: Iterable[str]) -> str:
    """'unknown <what> 'x'. Did you mean 'y'? Valid: a, b, c' — the message of every such error."""
    valid = list(valid)
    guess = nearest_name(name, valid)
    hint = f" Did you mean {guess!r}?" if guess else ""
    return f"unknown {what} {name!r}.{hint} Valid: {', '.join(valid)}"


def check_known_names(given: Iterable[str], valid: Iterable[str], what: str) -> None:
    """Raise ValueError for the first name in `given` that is not in `valid` (see `unknown_name_message`)."""
    valid = list(valid)
    for name in given:
        if name not in valid:
            raise ValueError(unknown_name_message(what, name, valid))


@dataclass(frozen=True)
class Field:
    """One keyword parameter of a callable: its name, resolved type hint and default."""

    name: str
    type: Any
    default: Any


def signature_fields(function: Callable[..., Any], exclude: Iterable[str] = ()) -> dict[str, Field]:
    """The named keyword parameters of `function` (not *args/**kwargs, not `self`, not `exclude`),
    with their type hints resolved (string annotations included)."""
    try:
        hints = typing.get_type_hints(function)
    except NameError:  # an annotation names something imported only for type checkers: types unknown
        hints = {}
    return {
        parameter.name: Field(parameter.name, hints.get(parameter.name, Any), parameter.default)
        for parameter in keyword_parameters(function, exclude)
    }


def keyword_parameters(function: Callable[..., Any], exclude: Iterable[str] = ()) -> list[inspect.Parameter]:
    """The named parameters of `function`, without *args/**kwargs, `self`/`cls` and `exclude`."""
    skipped = {"self", "cls", *exclude}
    return [
        parameter for parameter in inspect.signature(function).parameters.values()
        if parameter.name not in skipped and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    ]


def run_registered(register: Callable[[Any], Any], argv: Sequence[str] | None = None, prog: str = "t2mlr") -> int:
    """Parse argv against one part's subcommands only and run the chosen one: the standalone entry
    (`python -m t2mlr.<part>.commands ...`) of a part that `register`s its commands into the main CLI."""
    parser = argparse.ArgumentParser(prog=prog)
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)
