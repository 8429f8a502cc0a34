"""lm-evaluation-harness model "t2mlr": every score and generation on an explicitly chosen T²MLR path.

Model args (`--model_args` on the command line, `model_args=` in `simple_evaluate`): the parameters of
`T2MLRLM.__init__`, described one by one in `t2mlr.evaluation.harness.MODEL_ARGS` (what
`t2mlr eval --help` prints): pretrained, recurrence (exact or jacobi), d_forward, tokenizer, dtype,
device, batch_size, max_length, max_gen_toks, add_bos_token.

Why not HFLM: HFLM calls `model(inps)` and `model.generate(...)` without a path argument, so the path
would silently follow the config's `eval_recurrence`; it also needs `accelerate`, which this project
does not depend on. Here loglikelihoods (plain and rolling) call
`model(input_ids, attention_mask, recurrence=..., d_forward=...)` and generations call
`generate(..., prefill=..., prefill_depth=...)`; decode steps are one token, where both paths
coincide. The path is recorded in the results' config (`t2mlr_recurrence`, `t2mlr_d_forward`).

Batches: loglikelihood inputs are right-padded with an attention mask (T²MLR is causal in time in
both paths, and padding never writes the recurrent state), generation prompts are left-padded with an
attention mask; either way every request gets the scores it gets alone.

lm-eval 0.4.x finds models only in its registry, not through the `lm_eval` entry-point group declared
in pyproject, so this module must be imported before lm-eval looks "t2mlr" up:
`python -m t2mlr.evaluation ...` / `t2mlr eval ...` do that, and in Python
`import t2mlr.evaluation.lm_eval_model` before `lm_eval.simple_evaluate(model="t2mlr", ...)`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import lm_eval.models  # noqa: F401  (registers lm-eval's own models: the registry loads them only when empty)
import torch
import torch.nn.functional as F
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tqdm import tqdm
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
)

import t2mlr.baselines  # noqa: F401  (registers the baselines' model types, so saved baselines load here too)
from t2mlr.generation.loading import load_model
from t2mlr.model import T2MLRForCausalLM, is_t2mlr
from t2mlr.model.configuration import check_depths
from t2mlr.utils import load_tokenizer

__all__ = ["EVAL_PATHS", "T2MLRLM", "check_eval_path"]

EVAL_PATHS = ("exact", "jacobi")
DEFAULT_MAX_GEN_TOKS = 256
log = logging.getLogger(__name__)

Request = tuple[tuple[str, str] | None, list[int], list[int]]  # (strings or None, context ids, continuation ids)


def check_eval_path(recurrence: str, d_forward: int | None) -> None:
    """Only exact and Jacobi are T²MLR evaluations ("off" is the base model: evaluate that with --model hf)."""
    if recurrence not in EVAL_PATHS:
        raise ValueError(
            f"recurrence must be one of {EVAL_PATHS}, got {recurrence!r} (to evaluate without recurrence, "
            "evaluate the base checkpoint with --model hf)"
        )
    if d_forward is None:
        return
    if recurrence != "jacobi":
        raise ValueError("d_forward applies to recurrence=jacobi only")
    if isinstance(d_forward, bool) or not isinstance(d_forward, int):
        raise ValueError(f"d_forward must be an int, got {d_forward!r}")
    check_depths(d_forward, 1)


class StopOnStrings(StoppingCriteria):
    """Stops a row once its generated text contains a stop string. Works on decoded text, so it holds
    for any tokenizer (transformers' `stop_strings` needs tokenizers whose pieces decode with a known
    prefix)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stops: Sequence[str], prompt_length: int) -> None:
        self.tokenizer = tokenizer
        self.stops = list(stops)
        self.prompt_length = prompt_length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.prompt_length :], skip_special_tokens=True)
        done = [any(stop in text for stop in self.stops) for text in texts]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def _batches(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


@register_model("t2mlr")
class T2MLRLM(TemplateLM):
    """lm-eval model for T²MLR checkpoints (see the module docstring for the arguments)."""

    def __init__(
        self,
        pretrained: str | T2MLRForCausalLM,
        recurrence: str = "exact",
        d_forward: int | None = None,
        tokenizer: str | PreTrainedTokenizerBase | None = None,
        device: str | None = "auto",
        dtype: str = "auto",
        batch_size: int | str = 1,
        max_batch_size: int | None = None,
        max_length: int | None = None,
        max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
        add_bos_token: bool | None = None,
    ) -> None:
        super().__init__()
        check_eval_path(recurrence, d_forward)
        self.batch_size = self._check_batch_size(batch_size)
        del max_batch_size  # passed by simple_evaluate; only meaningful with batch_size=auto, which is refused
        self.model = self._load_model(pretrained, device or "auto", dtype)
        self.recurrent = is_t2mlr(self.model)
        if not self.recurrent and (recurrence != "exact" or d_forward is not None):
            raise ValueError(
                f"{type(self.model).__name__} has no recurrence: recurrence=jacobi and d_forward apply to T²MLR "
                "models only (a baseline is scored as the plain causal LM it is)"
            )
        self.tokenizer = self._load_tokenizer(tokenizer if tokenizer is not None else pretrained)
        self._device = self.model.device
        self.recurrence = recurrence if self.recurrent else "none"
        self.d_forward = self.model.config.d_forward if recurrence == "jacobi" and d_forward is None else d_forward
        self.pretrained = pretrained if isinstance(pretrained, str) else type(pretrained).__name__
        self._max_length = max_length
        self._max_gen_toks = int(max_gen_toks)
        self.add_bos_token = add_bos_token
        log.info("T²MLR evaluation path: %s", self.path_description)

    # ----------------------------------------------------------------------------- setup
    @staticmethod
    def _check_batch_size(batch_size: int | str) -> int:
        if isinstance(batch_size, str) and batch_size.isdigit():
            batch_size = int(batch_size)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int for --model t2mlr (no 'auto'), got {batch_size!r}")
        return batch_size

    @staticmethod
    def _load_model(pretrained: str | PreTrainedModel, device: str, dtype: str) -> PreTrainedModel:
        """A T²MLR model, or a plain causal LM (the baselines: matched Transformer, looped, pause tokens,
        LSTM) scored through the same entry so every arm of a comparison is evaluated the same way."""
        model = load_model(pretrained, device=device, dtype=dtype) if isinstance(pretrained, str) else pretrained
        if is_t2mlr(model) and model.config.recurrence_mask_policy != "all":
            raise ValueError(
                "this model was configured with recurrence_mask_policy='mask' (fusion only where a per-token mask "
                "says so); lm-eval requests carry no such mask. Save it with recurrence_mask_policy='all' to "
                "evaluate with recurrence on every token"
            )
        return model.eval()

    @staticmethod
    def _load_tokenizer(source: Any) -> PreTrainedTokenizerBase:
        if isinstance(source, PreTrainedTokenizerBase):
            tokenizer = source
        elif isinstance(source, str):  # a directory, a tokenizer.json or a hub id (tokenizer=HuggingFaceTB/SmolLM2-135M)
            tokenizer = load_tokenizer(source)
        else:
            raise ValueError("pass tokenizer=... (a path or a tokenizer) when pretrained is a model object")
        if tokenizer.pad_token_id is None:
            if tokenizer.eos_token_id is None:
                raise ValueError("the tokenizer has neither a pad nor an EOS token to pad batches with")
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer

    # ----------------------------------------------------------------------------- the path
    @property
    def path_description(self) -> str:
        if not self.recurrent:
            return f"plain causal LM ({type(self.model).__name__}, no recurrence)"
        return "exact" if self.recurrence == "exact" else f"jacobi(d_forward={self.d_forward})"

    def forward_path_kwargs(self) -> dict[str, Any]:
        """Forward arguments that pin the path (no gradients here, so d_backward=1 is always valid)."""
        if not self.recurrent:
            return {}
        if self.recurrence == "exact":
            return {"recurrence": "exact"}
        return {"recurrence": "jacobi", "d_forward": self.d_forward, "d_backward": 1}

    def prefill_kwargs(self) -> dict[str, Any]:
        """`generate()` arguments for the prompt's forward."""
        if not self.recurrent:
            return {}
        if self.recurrence == "exact":
            return {"prefill": "exact"}
        return {"prefill": "jacobi", "prefill_depth": self.d_forward}

    # ----------------------------------------------------------------------------- lm-eval interface
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        """Context token for an empty context (and for rolling windows): BOS, else EOS."""
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        if self._max_length:
            return int(self._max_length)
        config = self.model.config
        return int(getattr(getattr(config, "base_config", None) or config, "max_position_embeddings", 2048))

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def tokenizer_name(self) -> str:
        return getattr(self.tokenizer, "name_or_path", "").replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        if add_special_tokens is None:
            add_special_tokens = self.add_bos_token
        if add_special_tokens is None:
            return self.tokenizer.encode(string)
        return self.tokenizer.encode(string, add_special_tokens=add_special_tokens)

    def tok_decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    # ----------------------------------------------------------------------------- loglikelihood
    def forward_logprobs(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """Log-probabilities (float32) of a right-padded batch of token rows: (batch, longest, vocab)."""
        longest = max(len(row) for row in rows)
        ids = torch.full((len(rows), longest), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), longest), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, : len(row)] = 1
        with torch.no_grad():
            logits = self.model(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                use_cache=False,
                **self.forward_path_kwargs(),
            ).logits
        return F.log_softmax(logits.float(), dim=-1)

    def _score(self, context: list[int], continuation: list[int]) -> tuple[list[int], int]:
        """Model input (context + continuation minus the last token, left-truncated to max_length) and
        the number of continuation tokens it predicts."""
        if not context or not continuation:
            raise ValueError("loglikelihood requests need a non-empty context and continuation")
        if len(continuation) > self.max_length:
            raise ValueError(f"continuation of {len(continuation)} tokens exceeds max_length={self.max_length}")
        return (context + continuation)[-(self.max_length + 1) :][:-1], len(continuation)

    def _loglikelihood_tokens(
        self, requests: list[Request], disable_tqdm: bool = False, **_: Any
    ) -> list[tuple[float, bool]]:
        """Sum of continuation log-probabilities and whether greedy decoding would produce it, per request;
        longest first so that batches hold similar lengths."""
        order = sorted(range(len(requests)), key=lambda i: -(len(requests[i][1]) + len(requests[i][2])))
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        progress = tqdm(total=len(requests), disable=disable_tqdm, desc="t2mlr loglikelihood")
        for batch in _batches(order, self.batch_size):
            inputs = [self._score(requests[i][1], requests[i][2]) for i in batch]
            logprobs = self.forward_logprobs([row for row, _ in inputs])
            for j, i in enumerate(batch):
                row, count = inputs[j]
                target = torch.tensor(requests[i][2], device=logprobs.device)
                scored = logprobs[j, len(row) - count : len(row)]
                total = float(scored.gather(-1, target[:, None]).sum())
                greedy = bool((scored.argmax(-1) == target).all())
                results[i] = (total, greedy)
                if requests[i][0] is not None:
                    self.cache_hook.add_partial("loglikelihood", requests[i][0], results[i])
            progress.update(len(batch))
        progress.close()
        return results  # type: ignore[return-value]

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Whole-text loglikelihood in max_length windows (each window a fresh sequence, as lm-eval defines)."""
        windows: list[Request] = []
        owners: list[int] = []
        for index, (text,) in enumerate(req.args for req in requests):
            rolling = lm_utils.get_rolling_token_windows(
                token_list=self.tok_encode(text),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
            for context, continuation in map(lm_utils.make_disjoint_window, rolling):
                windows.append((None, list(context), list(continuation)))
                owners.append(index)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
        totals = [0.0] * len(requests)
        for owner, (score, _) in zip(owners, scores):
            totals[owner] += score
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # ----------------------------------------------------------------------------- generation
    def _generation_settings(self, gen_kwargs: dict[str, Any]) -> tuple[list[str], int, dict[str, Any]]:
        """Stop strings, token budget and `generate()` sampling arguments of one request's gen_kwargs."""
        kwargs = dict(gen_kwargs)
        for name in ("prefill", "prefill_depth", "recurrence", "d_forward", "d_backward"):
            if name in kwargs:
                raise ValueError(f"gen_kwargs may not set {name!r}: the T²MLR path is fixed by the model args")
        until = kwargs.pop("until", None)
        until = [stop for stop in ([until] if isinstance(until, str) else list(until or [])) if stop]
        budget = kwargs.pop("max_gen_toks", None) or kwargs.pop("max_new_tokens", None) or self.max_gen_toks
        temperature = float(kwargs.pop("temperature", 0.0))
        do_sample = kwargs.pop("do_sample", None)
        do_sample = temperature > 0.0 if do_sample is None else bool(do_sample)
        kwargs["do_sample"] = do_sample
        if do_sample:
            kwargs["temperature"] = temperature if temperature > 0.0 else 1.0
        return until, int(budget), kwargs

    def _generate_batch(self, contexts: Sequence[str], until: list[str], budget: int, kwargs: dict) -> list[str]:
        """Left-padded batch generation; each text is cut at the first stop string."""
        encoded = [self.tok_encode(text) or [self.prefix_token_id] for text in contexts]
        limit = self.max_length - budget
        if limit < 1:
            raise ValueError(f"max_gen_toks={budget} leaves no room for the prompt within max_length={self.max_length}")
        encoded = [row[-limit:] for row in encoded]
        longest = max(len(row) for row in encoded)
        ids = torch.full((len(encoded), longest), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(encoded), longest), dtype=torch.long)
        for i, row in enumerate(encoded):
            ids[i, longest - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, longest - len(row) :] = 1
        stopping = StoppingCriteriaList([StopOnStrings(self.tokenizer, until, longest)] if until else [])
        with torch.no_grad():
            output = self.model.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                max_new_tokens=budget,
                pad_token_id=self.tokenizer.pad_token_id,
                eos_token_id=self.eot_token_id,
                stopping_criteria=stopping,
                **kwargs,
                **self.prefill_kwargs(),
            )
        texts = []
        for row in output[:, longest:].tolist():
            text = self.tok_decode(row)
            for stop in until:
                text = text.split(stop)[0]
            texts.append(text)
        return texts

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Requests grouped by identical gen_kwargs, longest prompts first, `batch_size` at a time."""
        groups: dict[str, list[int]] = {}
        for index, req in enumerate(requests):
            groups.setdefault(json.dumps(req.args[1], sort_keys=True, default=str), []).append(index)
        results: list[str | None] = [None] * len(requests)
        progress = tqdm(total=len(requests), disable=disable_tqdm, desc="t2mlr generate_until")
        for indices in groups.values():
            until, budget, kwargs = self._generation_settings(requests[indices[0]].args[1])
            indices = sorted(indices, key=lambda i: -len(self.tok_encode(requests[i].args[0])))
            for batch in _batches(indices, self.batch_size):
                texts = self._generate_batch([requests[i].args[0] for i in batch], until, budget, kwargs)
                for i, text in zip(batch, texts):
                    results[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
                progress.update(len(batch))
        progress.close()
        return results  # type: ignore[return-value]

    # ----------------------------------------------------------------------------- reporting
    def get_model_info(self) -> dict[str, Any]:
        """Recorded in the results' config: size, dtype, placement and the evaluation path."""
        config = self.model.config
        return {
            "model_num_parameters": sum(p.numel() for p in self.model.parameters()),
            "model_dtype": str(self.model.dtype),
            "model_type": config.model_type,
            "t2mlr_placement": [config.l_start, config.l_end] if self.recurrent else None,
            "t2mlr_recurrence": self.recurrence,
            "t2mlr_d_forward": self.d_forward,
        }
