"""Prompt-to-text generation with a chosen prefill path, streaming tokens as they are produced.

Decoding is one token per step, where T²MLR's exact and Jacobi paths coincide; only the prompt's
forward (the prefill) differs: "exact" runs the recurrent middle block token by token (the model's
definition), "jacobi" runs it in parallel with `prefill_depth` cache iterations (faster, exact only
when the depth exceeds the prompt length). The choice is always passed to `generate()` explicitly, so
the path never depends on the config's defaults. `compile` decodes with a static cache (T²MLR:
`T2MLRStaticCache`) and a compiled step, traced once for every token; "reduce-overhead" also captures
it as a CUDA graph on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm
from transformers import CompileConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.generation.streamers import BaseStreamer

from t2mlr.model import is_t2mlr
from t2mlr.model.generation import PREFILL_PATHS, prefill_kwargs
from t2mlr.utils import off_main_rank, prompt_ids

__all__ = [
    "COMPILE_MODES",
    "PREFILL_PATHS",
    "GenerationSettings",
    "MapBatches",
    "compiled_decoding_kwargs",
    "encode_prompt",
    "generate_batched",
    "generate_kwargs",
    "generate_text",
]

COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")  # torch.compile modes, and off
# how generate_batched runs its batches: (batches, generate one batch) -> the replies of every batch, in order
MapBatches = Callable[[Sequence[list[str]], Callable[[list[str]], list[str]]], list[list[str]]]


@dataclass
class GenerationSettings:
    """What `t2mlr generate` lets the user choose."""

    max_new_tokens: int = 128
    prefill: str = "exact"
    prefill_depth: int | None = None
    prefill_tol: float | None = None
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    compile: str = "off"

    def validate(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"compile must be one of {', '.join(COMPILE_MODES)}, got {self.compile!r}")
        prefill_kwargs(self.prefill, self.prefill_depth, self.prefill_tol, default_depth=1)  # the model's own checks
        if not self.do_sample and (self.temperature != 1.0 or self.top_p != 1.0 or self.top_k != 0):
            raise ValueError("--temperature, --top-p and --top-k need --do-sample (greedy decoding ignores them)")
        if self.temperature <= 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError("need temperature > 0, 0 < top_p <= 1 and top_k >= 0")


def compiled_decoding_kwargs(mode: str) -> dict:
    """generate() arguments for a static cache and a decode step compiled in `mode` (fullgraph, fixed
    shapes); "off": the static cache alone (transformers would otherwise compile its step on a GPU)."""
    if mode == "off":
        return {"cache_implementation": "static", "disable_compile": True}
    config = CompileConfig(fullgraph=True, dynamic=False, mode=mode)
    config._compile_all_devices = True  # transformers compiles only on accelerators unless told
    return {"cache_implementation": "static", "compile_config": config}


def underlying(model: PreTrainedModel) -> PreTrainedModel:
    """The causal LM under a PEFT wrapper (which forwards `generate` and its keywords to it), else the model."""
    get_base_model = getattr(model, "get_base_model", None)
    return get_base_model() if callable(get_base_model) else model


def generate_kwargs(model: PreTrainedModel, settings: GenerationSettings) -> dict:
    """Keyword arguments for `model.generate`: decoding strategy plus, for T²MLR, the prefill path.

    A plain transformers model (e.g. the parameter-matched baseline) has no prefill choice; asking for
    Jacobi prefill on one is an error rather than being ignored.
    """
    settings.validate()
    kwargs: dict = {"max_new_tokens": settings.max_new_tokens, "do_sample": settings.do_sample}
    if settings.do_sample:
        kwargs.update(temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k)
    if is_t2mlr(underlying(model)):
        kwargs["prefill"] = settings.prefill
        if settings.prefill == "jacobi":
            kwargs["prefill_depth"] = settings.prefill_depth
        if settings.prefill in ("jacobi", "fixed_point"):
            kwargs["prefill_tol"] = settings.prefill_tol
    elif settings.prefill != "exact" or settings.prefill_depth is not None or settings.prefill_tol is not None:
        raise ValueError(f"{type(model).__name__} is not a T²MLR model: it has no Jacobi prefill")
    if settings.compile != "off":
        kwargs.update(compiled_decoding_kwargs(settings.compile))
    return kwargs


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str, device: torch.device) -> dict[str, torch.Tensor]:
    """Token ids and attention mask of one prompt; an empty encoding falls back to BOS alone."""
    encoded = tokenizer(prompt, return_tensors="pt")
    if encoded["input_ids"].shape[1] == 0:
        if tokenizer.bos_token_id is None:
            raise ValueError("the prompt encodes to no tokens and the tokenizer has no BOS token to start from")
        ids = torch.tensor([[tokenizer.bos_token_id]])
        encoded = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    return {name: encoded[name].to(device) for name in ("input_ids", "attention_mask")}


def generate_text(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt: str,
    settings: GenerationSettings,
    streamer: BaseStreamer | None = None,
) -> str:
    """The continuation of `prompt` (special tokens dropped); tokens also go to `streamer` as they come."""
    kwargs = generate_kwargs(model, settings)
    if settings.seed is not None:
        torch.manual_seed(settings.seed)
    inputs = encode_prompt(tokenizer, prompt, model.device)
    if is_t2mlr(model) and model.config.recurrence_mask_policy == "mask":
        # "response tokens only" models: the prompt does not fuse R, every generated token does
        inputs["recurrence_mask"] = torch.zeros_like(inputs["input_ids"], dtype=torch.bool)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.no_grad():
        output = model.generate(**inputs, **kwargs, pad_token_id=pad, streamer=streamer)
    continuation = output[0, inputs["input_ids"].shape[1] :]
    return tokenizer.decode(continuation, skip_special_tokens=True)


def left_padded(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], bos: bool | None,
                device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Prompts as one batch, padded on the left (so every row's next token is the last column's)."""
    if tokenizer.pad_token_id is None:
        raise ValueError("batched generation pads prompts: the tokenizer needs a pad token (e.g. its EOS)")
    rows = [prompt_ids(tokenizer, prompt, bos) for prompt in prompts]
    width = max(len(row) for row in rows)
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(row)) + row for row in rows], device=device)
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows], device=device)
    return {"input_ids": ids, "attention_mask": mask}


def generate_batched(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str],
                     settings: GenerationSettings, batch_size: int, bos: bool | None = True, desc: str = "generate",
                     map_batches: MapBatches | None = None) -> list[str]:
    """The continuation of every prompt (up to its first EOS, special tokens dropped), `batch_size` prompts at
    a time, left-padded; `bos` starts each prompt with the tokenizer's BOS, as the model was trained (None: the
    tokenizer's own special tokens, as TRL encodes prompts; `t2mlr.utils.prompt_ids`). The model is left in the
    mode it was in. A T²MLR
    model with recurrence_mask_policy="mask" gets its prompts masked from the fusion, as in training.

    `map_batches(batches, generate)` runs `generate` on every batch and returns the results in order (default:
    here, one after another); under torchrun the experiments pass one that shares the batches out over the
    ranks (`t2mlr.training.distributed.shard_and_gather`), so each rank generates a part and all get every reply."""
    kwargs = generate_kwargs(model, settings)
    masked = is_t2mlr(underlying(model)) and model.config.recurrence_mask_policy == "mask"
    device = next(model.parameters()).device
    batches = [list(prompts[lo : lo + batch_size]) for lo in range(0, len(prompts), batch_size)]
    was_training = model.training
    model.eval()
    with tqdm(total=len(batches), desc=desc, unit="batch", dynamic_ncols=True, leave=False,
              disable=off_main_rank()) as bar:

        def generate(batch: list[str]) -> list[str]:
            inputs = left_padded(tokenizer, batch, bos, device)
            if masked:
                inputs["recurrence_mask"] = torch.zeros_like(inputs["input_ids"], dtype=torch.bool)
            with torch.no_grad():
                out = model.generate(**inputs, **kwargs, pad_token_id=tokenizer.pad_token_id,
                                     eos_token_id=tokenizer.eos_token_id)
            bar.update(1)
            return [_reply(tokenizer, row) for row in out[:, inputs["input_ids"].shape[1] :].tolist()]

        try:
            replies = map_batches(batches, generate) if map_batches else [generate(batch) for batch in batches]
        finally:
            model.train(was_training)
    return [text for batch in replies for text in batch]


def _reply(tokenizer: PreTrainedTokenizerBase, row: list[int]) -> str:
    """A generated row's text up to its first EOS, special tokens dropped."""
    if tokenizer.eos_token_id in row:
        row = row[: row.index(tokenizer.eos_token_id)]
    return tokenizer.decode(row, skip_special_tokens=True)
