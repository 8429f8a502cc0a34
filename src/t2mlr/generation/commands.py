"""Generate a continuation of a prompt with a saved model, printing tokens as they are decoded.

MODEL_DIR is a model directory: a training run's final/ or one of its checkpoints/step_N, or any
directory written by save_pretrained with its tokenizer (a plain transformers model works too). The
prompt itself is not echoed; without --prompt it is read from stdin.

examples:
  t2mlr generate runs/debug/final --prompt "t3 t17 t5" --max-new-tokens 16
  t2mlr generate runs/135m/final --prompt "The capital of France is" --prefill jacobi --prefill-depth 8
  t2mlr generate runs/135m/final --prompt "..." --do-sample --top-p 0.9 --temperature 0.8 --seed 0
  t2mlr generate runs/135m/final --prompt "..." --max-new-tokens 512 --compile reduce-overhead   # GPU: CUDA graphs

--prefill picks the prompt's forward path: exact (token by token, the definition) or jacobi (the
whole prompt in parallel, --prefill-depth iterations, exact once the depth exceeds the prompt's
length; --prefill-tol stops the iterations once the state settles). Every generated token is one exact
step either way. --compile decodes with a static cache and a compiled step (one graph for every token;
compiling takes a while, so it pays off on long outputs). Exit codes: 0 done, 2 bad input (a missing
directory or tokenizer, a bad setting).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields

from t2mlr.utils import DTYPES, ModelDirectoryError, check_model_dir

PREFILL_CHOICES = ("exact", "jacobi", "fixed_point")  # t2mlr.model.generation.PREFILL_PATHS; checked again when the model runs
COMPILE_CHOICES = ("off", "default", "reduce-overhead", "max-autotune")  # t2mlr.generation.text.COMPILE_MODES

__all__ = ["add_arguments", "register", "run_generate"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", metavar="MODEL_DIR", help="directory written by save_pretrained (model + tokenizer)")
    parser.add_argument("--prompt", default=None, help="prompt text (default: read from stdin)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--prefill",
        choices=PREFILL_CHOICES,
        default="exact",
        help="forward path over the prompt: exact (token by token, the definition), jacobi (parallel, approximate) "
        "or fixed_point (the exact values by Jacobi passes settled to --prefill-tol; docs/model.md)",
    )
    parser.add_argument(
        "--prefill-depth", type=int, default=None, help="Jacobi cache iterations (default: the model's d_forward)"
    )
    parser.add_argument(
        "--prefill-tol", type=float, default=None,
        help="stop the Jacobi iterations (jacobi, fixed_point) once the cache moves by at most this much (max |ΔR|)",
    )
    parser.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0, help="0 = no top-k filtering")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--compile", choices=COMPILE_CHOICES, default="off",
        help="torch.compile mode of the decode step, with a static cache (reduce-overhead: CUDA graphs on a GPU)",
    )
    parser.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda, cuda:1, ...")
    parser.add_argument("--dtype", default="auto", choices=("auto", *DTYPES), help="auto = as saved")


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "generate",
        help="generate text from a saved model, streaming tokens",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(func=run_generate)
    return parser


def run_generate(args: argparse.Namespace) -> int:
    """Load, generate with streaming, end with a newline. Setup problems exit with code 2 and one line."""
    try:  # a missing or empty directory is reported before torch and transformers load
        check_model_dir(args.model_dir)
    except ModelDirectoryError as err:
        print(f"t2mlr generate: error: {err}", file=sys.stderr)
        return 2
    getattr(args, "load_model_types", lambda: None)()  # `t2mlr generate`: every model type the library defines
    from transformers import TextStreamer

    from t2mlr.generation.loading import load_model
    from t2mlr.generation.text import GenerationSettings, generate_text
    from t2mlr.utils import load_tokenizer

    try:  # every GenerationSettings field is the command-line option of its name
        settings = GenerationSettings(**{field.name: getattr(args, field.name) for field in fields(GenerationSettings)})
        settings.validate()
        tokenizer = load_tokenizer(check_model_dir(args.model_dir))
        model = load_model(args.model_dir, device=args.device, dtype=args.dtype)
    except (ModelDirectoryError, ValueError) as err:
        print(f"t2mlr generate: error: {err}", file=sys.stderr)
        return 2
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    try:
        generate_text(model, tokenizer, prompt, settings, streamer=streamer)
    except ValueError as err:  # e.g. a prompt longer than the model's position limit
        print(f"\nt2mlr generate: error: {err}", file=sys.stderr)
        return 2
    print(flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run `generate` on its own: `python -m t2mlr.generation.commands MODEL_DIR --prompt ...`."""
    parser = argparse.ArgumentParser(prog="t2mlr generate", description=__doc__)
    add_arguments(parser)
    return run_generate(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
