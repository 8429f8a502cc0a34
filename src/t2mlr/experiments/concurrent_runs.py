"""Train an experiment's independent runs one after another, or side by side in worker processes.

Why side by side: the `cpu` S5 preset's models are so small that a second torch thread does not speed
one run up (measured on 2 cores: T²MLR trains at 3.4 steps/s with 2 threads and 3.5 steps/s with one
thread while a second run shares the machine), so two single-thread processes finish the three trainings
in about half the wall-clock time of one two-thread process. On a GPU the runs go one after another.

Each worker is a fresh (spawned) process that runs the project trainer on one config; what comes back is
the run's final checkpoint and the seconds it trained. A run that fails lets the runs already under way
finish (their checkpoints stay resumable), the runs not yet started are cancelled, and the error is
raised in the caller. `train_runs_keep_going` instead trains every run and reports the runs that stopped
on a non-finite loss beside the finished ones (a long study records a failed seed and goes on).

Reproducibility: every run trains on its job's fixed number of torch threads (`RunJob.threads`), in a
worker process or in this one, and `fixed_threads` gives the evaluation the same. The thread count sets
the float summation order of the CPU kernels, so it is part of a run's arithmetic; fixed, a seed's numbers
do not depend on how many runs share the machine, on the machine's load, or on the number of workers
(a test trains the same runs side by side and one after another and compares them bit for bit).

Workers die with the parent. A killed parent (`kill -9`, an OOM kill, a closed terminal) would otherwise
leave its workers training on, unseen, holding the CPU and writing into the run directories while a
`--resume` trains the same runs again. On Linux each worker asks the kernel for SIGKILL when its parent
goes (`prctl(PR_SET_PDEATHSIG)`): immediate, and it works even while the worker sits in a long torch
call. Elsewhere a daemon thread polls the parent's pid twice a second. SIGKILL loses nothing that
matters: checkpoints are written into a temporary directory and renamed into place, and a resumed run
cuts its metrics back to its checkpoint's step.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from t2mlr.training.config import TrainConfig
from t2mlr.training.trainer import NonFiniteLossError, train

__all__ = ["RunJob", "TrainedRun", "die_with_parent", "fixed_threads", "resolve_workers", "train_runs",
           "train_runs_keep_going"]


@dataclass(frozen=True)
class RunJob:
    """One training run: its config, its run directory, the label on its progress bar and the torch CPU
    threads it trains on (part of its arithmetic, see the module docstring). `threads=None` leaves the
    count to the schedule: this process's own in turn, the parent's split evenly between the workers
    side by side (so the numbers then depend on the schedule)."""

    name: str
    cfg: TrainConfig
    run_dir: Path
    threads: int | None = None


@dataclass(frozen=True)
class TrainedRun:
    checkpoint: Path
    seconds: float  # spent training in this call (a resumed run adds to earlier calls)


def resolve_workers(requested: int | None, runs: int, device: torch.device) -> int:
    """Worker processes to use: `requested`, or by default one per run up to torch's CPU threads (1 on a GPU)."""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"workers must be >= 1, got {requested}")
        return min(requested, max(1, runs))
    if device.type != "cpu":
        return 1
    return max(1, min(runs, torch.get_num_threads()))


@contextlib.contextmanager
def fixed_threads(threads: int | None) -> Iterator[None]:
    """torch's CPU thread count set to `threads` for the duration, then restored (None: left as it is)."""
    if threads is None:
        yield
        return
    if threads < 1:
        raise ValueError(f"torch threads must be >= 1, got {threads}")
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def train_one(job: RunJob, resume: bool) -> TrainedRun:
    """Run the trainer on one job in this process, on the job's torch threads."""
    started = time.perf_counter()
    with fixed_threads(job.threads):
        result = train(job.cfg, job.run_dir, resume=resume)
    seconds = time.perf_counter() - started
    if result.last_checkpoint is None:
        raise RuntimeError(f"training in {job.run_dir} ended without a checkpoint to evaluate")
    return TrainedRun(Path(result.last_checkpoint), seconds)


def _labelled(job: RunJob, line: int | None) -> RunJob:
    logging = replace(job.cfg.logging, progress_label=job.name, progress_line=line)
    return replace(job, cfg=replace(job.cfg, logging=logging))


PR_SET_PDEATHSIG = 1  # linux/prctl.h
PARENT_POLL_SECONDS = 0.5


def die_with_parent(parent_pid: int) -> None:
    """End this process at once when the process `parent_pid` that started it is gone.

    Linux: the kernel sends SIGKILL (parent-death signal). Other systems: a daemon thread polls
    `os.getppid()` and calls `os._exit`. Either way, a parent that died before this call took effect
    is caught by the pid check at the end.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}")
    else:
        threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), daemon=True, name="die-with-parent").start()
    if os.getppid() != parent_pid:
        os._exit(1)


def _exit_when_orphaned(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_SECONDS)
    os._exit(1)  # from any thread: no cleanup, like the signal


def _init_worker(threads: int, bar_lock: Any, parent_pid: int) -> None:
    die_with_parent(parent_pid)
    torch.set_num_threads(threads)  # for jobs without their own thread count
    tqdm.set_lock(bar_lock)  # the bars of all workers share one terminal


def train_runs(jobs: list[RunJob], resume: bool = False, workers: int = 1) -> dict[str, TrainedRun]:
    """Train every job, `workers` at a time; returns each job's checkpoint and training seconds by name. A
    job trains on its own `threads`, or without them on the parent's threads split evenly between the
    workers (at least one each). The first failure is raised once the runs under way have finished."""
    if workers <= 1 or len(jobs) <= 1:
        return {job.name: train_one(_labelled(job, None), resume) for job in jobs}
    with _worker_pool(workers) as pool:
        futures: dict[str, Future[TrainedRun]] = {
            job.name: pool.submit(train_one, _labelled(job, line), resume) for line, job in enumerate(jobs)
        }
        return {name: future.result() for name, future in futures.items()}


def train_runs_keep_going(jobs: list[RunJob], resume: bool = False,
                          workers: int = 1) -> tuple[dict[str, TrainedRun], dict[str, str]]:
    """Like `train_runs`, but a run that stops on a non-finite loss does not stop the others: returns the
    finished runs and, by name, the message of each run that stopped (any other error is raised)."""
    trained: dict[str, TrainedRun] = {}
    failed: dict[str, str] = {}
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            try:
                trained[job.name] = train_one(_labelled(job, None), resume)
            except NonFiniteLossError as err:
                failed[job.name] = str(err)
        return trained, failed
    with _worker_pool(workers) as pool:
        futures = {job.name: pool.submit(train_one, _labelled(job, line), resume) for line, job in enumerate(jobs)}
        for name, future in futures.items():
            try:
                trained[name] = future.result()
            except NonFiniteLossError as err:
                failed[name] = str(err)
    return trained, failed


@contextlib.contextmanager
def _worker_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    context = multiprocessing.get_context("spawn")  # no forked copies of the parent's torch threads or state
    # The pool starts its workers from this thread (on submit) and this thread waits for them, which is what
    # the parent-death signal follows: it fires when the thread that started the process ends.
    threads = max(1, torch.get_num_threads() // workers)
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_init_worker,
                               initargs=(threads, context.RLock(), os.getpid()))
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
