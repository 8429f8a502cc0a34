"""The exit codes every command that trains shares, in one place.

0: done. 1: training stopped on a non-finite loss. 2: bad input, found before or during the run: a
config, data, checkpoint or model source that cannot be used (all `ValueError`s here), an existing run
directory without --resume/--overwrite, a missing file, an unreadable checkpoint.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

__all__ = ["BAD_INPUT", "DONE", "TRAINING_STOPPED", "run_with_exit_codes"]

DONE, TRAINING_STOPPED, BAD_INPUT = 0, 1, 2
T = TypeVar("T")


def run_with_exit_codes(command: str, work: Callable[[], T]) -> tuple[int, T | None]:
    """Run `work()` and map its failures to the shared exit codes, the message on stderr after `command`.

    Returns (exit code, what `work` returned, or None when it failed)."""
    try:
        return DONE, work()
    except (ValueError, FileExistsError, FileNotFoundError) as err:
        print(f"{command}: {err}", file=sys.stderr)
        return BAD_INPUT, None
    except RuntimeError as err:
        if _raised_by(err, "t2mlr.training.trainer", "NonFiniteLossError"):
            print(f"{command}: training stopped: {err}", file=sys.stderr)
            return TRAINING_STOPPED, None
        if _raised_by(err, "t2mlr.training.checkpoint", "CheckpointError"):
            print(f"{command}: {err}", file=sys.stderr)
            return BAD_INPUT, None
        raise


def _raised_by(err: BaseException, module: str, name: str) -> bool:
    """Whether `err` is `module.name`, without importing the module (it imports torch): an error of a module that
    has not been imported cannot have been raised, so a config error is reported before torch loads."""
    return module in sys.modules and isinstance(err, getattr(sys.modules[module], name))
