"""Every paper experiment and the analyses that train, at a tiny scale, with their machine-readable outputs
compared against files recorded from the code before the experiments' restructuring (issue 32).

Each entry of `RUNS` runs `t2mlr` commands exactly as a user types them (the command line is the interface
that must not change) into a fresh directory; `collect` reads back every JSON, JSON-lines and YAML file the
commands wrote (results, predictions, per-step metrics, the trainer config of every arm, the data's
metadata and held-out sets), and `compare` checks every value against the recorded one, ignoring only
wall-clock times, machine descriptions and paths. Every run and every evaluation computes on one torch
thread, so the numbers are the same bit for bit from run to run (test_golden_experiments.py reruns them).

The numbers depend on the CPU's kernel set as well (torch, MKL and oneDNN pick AVX2 or AVX512 code by the
CPU, and the float sums add up differently), so the fixtures are kept per kernel set, under
`fixtures/golden_experiments/<kernels>/`, and a machine is compared with its own set's
(`torch.backends.cpu.get_cpu_capability()`); a kernel set without recorded outputs skips, saying so. Both
sets were recorded by the code before the restructuring (e3d2898; s5-evidence by 2e8df43, which extended
it): avx512 on an AVX512 machine, avx2 on the same machine with AVX2 forced by `ATEN_CPU_CAPABILITY=avx2
MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2` (which reproduced an AVX2 machine's ProsQA-Hard run to
the last generated token: results/finetune_cpu/prosqa-hard_reproduction/).

The markdown reports (results.md, the analyses' .md, the study's README.md) are compared too, line by line,
against `<name>.reports.json` beside each run's fixture, with what is measured rather than computed masked
(`masked_report`: the cells of timed table columns, durations and ratios in the text, a choice made by
measured time). They were recorded later than the rest, by 256f06a (after the restructuring; its reports had
been checked by hand against the code before it, identical once times and paths were masked), for each kernel
set in the same way.

Recording (only when a change of the numbers is intended, and said so in the commit; for each kernel set):

    PYTHONPATH=src python tests/golden_experiments.py --write [NAME ...]           # json, jsonl and yaml
    PYTHONPATH=src python tests/golden_experiments.py --write-reports [NAME ...]   # the markdown reports
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import math
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "golden_experiments"
INPUTS = FIXTURES / "inputs"
LARGE_FILE = 20_000  # characters: larger outputs are recorded by their hash only

# keys whose values are wall-clock times, speeds, dates or descriptions of the machine
VOLATILE_KEY = re.compile(
    r"(^|_)(seconds|minutes|time|times|date|wall|tokens_per_s|tok_s|machine|median_seconds|median_ratio|"
    r"hostname|platform|cpu|load|version)($|_)|^cheapest_above_min_cosine$")  # chosen by measured time
# The experiments' restructuring (issue 32) moved their settings into YAML configs: results.json (and S5's
# data/meta.json) used to echo the whole preset dataclass under "preset", and now echo the preset's name, seed,
# steps and task section, while every trainer setting lives in each arm's config.yaml, which is compared in
# full. These are the keys of the old echo that are now only in config.yaml; every other key of the echo is
# compared, and keys the echo gained are accepted.
ECHO = "preset"
ECHO_MOVED = {"batch_size", "betas", "checkpoint_every", "d_backward", "d_forward", "eval_batch_size", "fusion_lr_mult",
              "head_dim", "hidden_size", "intermediate_size", "l_end", "l_start", "lr", "mask_prompt_recurrence",
              "micro_batch_size", "min_lr_ratio", "num_heads", "num_layers", "precision", "prompt_recurrence_mask",
              "shape", "train_recurrence", "warmup_steps", "weight_decay",
              # the pretraining preset's own spellings
              "batch", "eval_every", "heads", "hidden", "intermediate", "kv_heads", "layers", "middle", "seq_len", "vocab",
              "warmup"}
# Keys the outputs gained after recording, accepted where they are new (their values are checked by their own
# tests): the finetune's per-arm torch thread counts (test_experiment_finetune.py).
GAINED = {"train_threads", "eval_threads"}
SKIPPED_DIRS = {"checkpoints", "final", "base", "base.tmp", "tokenizer", "train_shards", "validation_shards", "english"}
# In a markdown report: a table column whose header says it holds measured times (or ratios of them, "× ..."),
# a duration or a ratio in the text, and a line whose content is chosen by measured time.
TIMED_COLUMN = re.compile(r"time|second|minute|\bmin\b|\(s\b|ms/|^×")
MEASURED = re.compile(r"\b\d[\d,]*(?:\.\d+)?(?: ?(?:ms|min|s|h)\b|×)")
CHOSEN_BY_TIME = re.compile(r"^Cheapest setting")
SKIPPED_FILES = {"train_time.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "generation_config.json"}


# ---------------------------------------------------------------------------------------------- the runs


def _cli(*argv: str) -> None:
    from t2mlr.cli import main

    code = main([str(a) for a in argv])
    if code != 0:
        raise RuntimeError(f"t2mlr {' '.join(map(str, argv))} exited {code}")


def _s5_retrieval(root: Path) -> Path:
    _cli("experiment", "s5-retrieval", "--preset", "tiny", "--out", root / "s5", "--workers", "1")
    return root / "s5"


def _s5_evidence(root: Path) -> Path:
    _cli("experiment", "s5-evidence", "--preset", "tiny", "--seeds", "0", "--out", root / "study", "--report",
         root / "study" / "report", "--workers", "1", "--steps", "2", "--checkpoint-every", "1", "--cost-rounds", "1",
         "--decode-rounds", "1")
    return root / "study"


def _finetune(task: str, data: str | None = None) -> Callable[[Path], Path]:
    def run(root: Path) -> Path:
        extra = ["--data", INPUTS / data] if data else []
        _cli("experiment", "finetune", task, "--preset", "tiny", "--out", root / task, "--threads", "1", "--workers",
             "1", *extra)
        return root / task

    return run


def _finetune_generated(root: Path) -> Path:
    for task in ("variable-assignment", "prosqa-hard"):
        _finetune(task)(root / "runs")
    _cli("experiment", "finetune-summary", root / "runs" / "variable-assignment", root / "runs" / "prosqa-hard",
         "--out", root / "runs" / "summary")
    return root / "runs"


def tiny_pretrained(directory: Path) -> Path:
    """A small Llama with a word-level tokenizer of the arithmetic problems, saved as a hub download looks:
    the retrofit experiment's `--source` (its own preset retrofits SmolLM2-135M, too slow for a test)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from t2mlr.tasks.arithmetic import ArithmeticSettings, arithmetic_cot_records
    from t2mlr.tasks.tokenizers import build_word_tokenizer, word_vocab_from_texts

    settings = ArithmeticSettings(min_steps=2, max_steps=3)
    records = arithmetic_cot_records(40, "train", 0, settings) + arithmetic_cot_records(8, "eval", 0, settings)
    words = word_vocab_from_texts(["Question: Answer:", *(r["prompt"] + r["target"] for r in records)])
    tokenizer = build_word_tokenizer(words)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=5,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0,
                         bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _retrofit(root: Path) -> Path:
    source = tiny_pretrained(root / "pretrained")
    _cli("experiment", "retrofit", "--preset", "tiny", "--source", source, "--out", root / "retrofit" / "seed0",
         "--threads", "1")
    _cli("experiment", "retrofit-summary", root / "retrofit" / "seed0", "--out", root / "retrofit")
    return root / "retrofit"


def _pretrain(root: Path) -> Path:
    _cli("experiment", "pretrain", "--preset", "tiny", "--corpus", INPUTS / "corpus", "--out", root / "pretrain",
         "--workers", "1", "--threads", "1")
    return root / "pretrain"


TINY_DEBUG = ["train.max_steps=4", "eval.every=2", "checkpoint.every=2", "logging.progress_bar=false",
              "model.d_forward=4", "model.d_backward=2", "data.kwargs.num_samples=64", "eval.max_batches=1"]


def _jacobi_vs_exact(root: Path) -> Path:
    _cli("analyze", "jacobi-vs-exact", "debug", *TINY_DEBUG, "--d-forward", "4", "--d-backward", "2", "--out",
         root / "jve", "--threads", "1")
    return root / "jve"


def _placement(root: Path) -> Path:
    _cli("analyze", "placement", "debug", *TINY_DEBUG, "--starts", "1,2", "--out", root / "placement", "--threads", "1")
    return root / "placement"


@dataclass(frozen=True)
class GoldenRun:
    name: str
    run: Callable[[Path], Path]


RUNS = (
    GoldenRun("s5-retrieval", _s5_retrieval),
    GoldenRun("s5-evidence", _s5_evidence),
    GoldenRun("finetune-generated", _finetune_generated),
    GoldenRun("finetune-gsm-aug", _finetune("gsm-aug", "gsm_aug.jsonl")),
    GoldenRun("finetune-hotpotqa", _finetune("hotpotqa", "hotpotqa_cot.jsonl")),
    GoldenRun("retrofit", _retrofit),
    GoldenRun("pretrain", _pretrain),
    GoldenRun("analyze-jacobi-vs-exact", _jacobi_vs_exact),
    GoldenRun("analyze-placement", _placement),
)


# ---------------------------------------------------------------------------------------------- reading back


def _files(out: Path, suffixes: tuple[str, ...] = (".json", ".jsonl", ".yaml")) -> Iterator[Path]:
    for path in sorted(out.rglob("*")):
        relative = path.relative_to(out)
        if any(part in SKIPPED_DIRS for part in relative.parts[:-1]) or not path.is_file():
            continue
        if path.name in SKIPPED_FILES or path.suffix not in suffixes:
            continue
        yield path


def _read(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if path.suffix == ".yaml":
        return yaml.safe_load(text)
    return json.loads(text)


def normalise(value: Any, root: str) -> Any:
    """Drop volatile keys, replace paths under the run's root by their relative form, keep everything else."""
    if isinstance(value, dict):
        return {str(k): normalise(v, root) for k, v in value.items() if not VOLATILE_KEY.search(str(k))}
    if isinstance(value, list):
        return [normalise(v, root) for v in value]
    if isinstance(value, str) and (root in value or value.startswith("/")):
        return "<path>"
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


def collect(out: Path, root: Path) -> dict[str, Any]:
    """Relative path → the file's normalised content (its hash when the file is large)."""
    found: dict[str, Any] = {}
    for path in _files(out):
        content = normalise(_read(path), str(root))
        text = json.dumps(content, sort_keys=True)
        relative = str(path.relative_to(out))
        found[relative] = content if len(text) <= LARGE_FILE else {"sha256": hashlib.sha256(text.encode()).hexdigest()}
    return found


def masked_report(text: str, root: str) -> list[str]:
    """A markdown report's lines with what is measured, not computed, replaced by `<measured>`: every cell of a
    table column whose header names a time (`TIMED_COLUMN`), durations and ratios elsewhere (`MEASURED`), and
    lines chosen by measured time (`CHOSEN_BY_TIME`); the run's root and the inputs' folder become placeholders.
    Table rows are rejoined from their stripped cells, so only the cells are compared, not their padding."""
    lines: list[str] = []
    timed: set[int] = set()
    in_table = False
    for line in text.replace(root, "<root>").replace(str(INPUTS), "<inputs>").splitlines():
        if not line.startswith("|"):
            in_table = False
            lines.append("<measured>" if CHOSEN_BY_TIME.match(line) else MEASURED.sub("<measured>", line))
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if not in_table:  # the header row, kept: it names the columns
            timed = {i for i, cell in enumerate(cells) if TIMED_COLUMN.search(cell)}
            in_table = True
            lines.append(" | ".join(cells))
            continue
        lines.append(" | ".join("<measured>" if i in timed else cell for i, cell in enumerate(cells)))
    return lines


def collect_reports(out: Path, root: Path) -> dict[str, list[str]]:
    """Relative path → the markdown report's masked lines."""
    return {str(path.relative_to(out)): masked_report(path.read_text(encoding="utf-8"), str(root))
            for path in _files(out, (".md",))}


def as_recorded_today(recorded: dict[str, Any], found: dict[str, Any] | None = None) -> dict[str, Any]:
    """The recorded files with the library's own renames applied: a config.yaml's moved data factories
    (`t2mlr.training.config.MOVED_FACTORIES`, the same renaming a resumed run gets). With `found`, also the one
    result-neutral setting the restructuring moved into the trainer config: an experiment's evaluation batch
    size is now its config's eval.batch_size (the retrofit's generation batches), where the recorded config
    held the trainer's default, unused because the trainer's periodic evaluation is off (eval.every 0)."""
    from t2mlr.training.config import EvalConfig, with_current_factories

    today = {}
    for path, content in recorded.items():
        if path.endswith("config.yaml") and isinstance(content, dict):
            content = with_current_factories(content)
            now = (found or {}).get(path)
            if (now is not None and content["eval"]["every"] == 0 and now["eval"]["every"] == 0
                    and content["eval"]["batch_size"] == EvalConfig.batch_size):
                content["eval"]["batch_size"] = now["eval"]["batch_size"]
        today[path] = content
    return today


def differences(recorded: Any, current: Any, where: str = "") -> list[str]:
    """Every place the two trees differ (values compared exactly: the runs are deterministic), but for the
    preset echo's moved and added keys (`ECHO_MOVED`) and the keys gained since recording (`GAINED`)."""
    if isinstance(recorded, dict) and isinstance(current, dict):
        echo = where.endswith(f"/{ECHO}") and ("results.json/" in where or "meta.json/" in where)
        out = []
        for key in sorted(set(recorded) | set(current)):
            if key not in current:
                if not (echo and key in ECHO_MOVED):
                    out.append(f"{where}/{key}: missing now")
            elif key not in recorded:
                if not echo and key not in GAINED:
                    out.append(f"{where}/{key}: new (not recorded)")
            else:
                out += differences(recorded[key], current[key], f"{where}/{key}")
        return out
    if isinstance(recorded, list) and isinstance(current, list):
        if len(recorded) != len(current):
            return [f"{where}: {len(recorded)} items recorded, {len(current)} now"]
        return [d for i, (a, b) in enumerate(zip(recorded, current)) for d in differences(a, b, f"{where}[{i}]")]
    if recorded != current or type(recorded) is not type(current):
        return [f"{where}: recorded {recorded!r}, now {current!r}"]
    return []


def report_differences(recorded: dict[str, list[str]], current: dict[str, list[str]]) -> list[str]:
    """Reports missing or new, and each changed report's differing lines (a unified diff)."""
    out = [f"{path}: {'missing now' if path not in current else 'new (not recorded)'}"
           for path in sorted(set(recorded) ^ set(current))]
    for path in sorted(set(recorded) & set(current)):
        diff = difflib.unified_diff(recorded[path], current[path], f"recorded {path}", f"now {path}", lineterm="", n=0)
        out += list(diff)
    return out


def run_golden(run: GoldenRun, workdir: Path) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Run it into `workdir`: its machine-readable outputs (`collect`) and its reports (`collect_reports`)."""
    out = run.run(workdir)
    return collect(out, workdir), collect_reports(out, workdir)


def cpu_kernels() -> str:
    """The kernel set torch computes with on this machine's CPU (AVX2, AVX512, ...)."""
    import torch

    return torch.backends.cpu.get_cpu_capability()


def fixture_path(name: str, kernels: str | None = None, reports: bool = False) -> Path:
    """Where one run's outputs (or, with `reports`, its masked reports) on a kernel set (default: this
    machine's) are recorded."""
    return FIXTURES / (kernels or cpu_kernels()).lower() / f"{name}{'.reports' if reports else ''}.json"


def recorded_kernels() -> list[str]:
    return sorted(path.name.upper() for path in FIXTURES.iterdir() if path.is_dir() and path.name != "inputs")


def read_fixture(name: str, kernels: str | None = None, reports: bool = False) -> dict[str, Any]:
    """The recorded outputs (or reports) of one run (a list of one-entry objects, one line per file, for
    readable diffs)."""
    text = fixture_path(name, kernels, reports).read_text(encoding="utf-8")
    return {path: content for entry in json.loads(text) for path, content in entry.items()}


def write_fixture(name: str, found: dict[str, Any], reports: bool = False) -> None:
    lines = [json.dumps({path: content}, sort_keys=True) for path, content in sorted(found.items())]
    fixture_path(name, reports=reports).parent.mkdir(parents=True, exist_ok=True)
    fixture_path(name, reports=reports).write_text("[\n" + ",\n".join(lines) + "\n]\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="record the golden outputs of the tiny experiments")
    parser.add_argument("names", nargs="*", help="runs to record (default: all)")
    parser.add_argument("--write", action="store_true", help="write the fixtures (otherwise compare with them)")
    parser.add_argument("--write-reports", action="store_true", help="write the markdown reports' fixtures")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    chosen = [r for r in RUNS if not args.names or r.name in args.names]
    failed = 0
    for run in chosen:
        workdir = Path(tempfile.mkdtemp(prefix=f"golden_{run.name}_"))
        try:
            found, reports = run_golden(run, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        if args.write or args.write_reports:
            if args.write:
                write_fixture(run.name, found)
            if args.write_reports:
                write_fixture(run.name, reports, reports=True)
            print(f"recorded {run.name} on {cpu_kernels()} kernels: {len(found)} files, {len(reports)} reports")
            continue
        diffs = differences(as_recorded_today(read_fixture(run.name), found), found)
        diffs += report_differences(read_fixture(run.name, reports=True), reports)
        failed += bool(diffs)
        print(f"{run.name}: {'same' if not diffs else f'{len(diffs)} differences'}")
        for line in diffs[:40]:
            print("  " + line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
