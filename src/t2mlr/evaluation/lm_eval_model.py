"""lm-evaluation-harness model "t2mlr": lm-eval's own `HFLM` with the T²MLR path named and recorded.

A saved T²MLR directory is a transformers causal LM, so stock lm-eval scores it as it is
(`lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True`): on the path its config names
for evaluation (`eval_recurrence`, exact unless changed). This subclass adds only what HFLM cannot say:
the path, given explicitly and written into the results.

Model args: every `HFLM` argument (pretrained, tokenizer, dtype, device, batch_size including "auto",
max_length, add_bos_token, peft, trust_remote_code, ...), plus

* recurrence: "exact" (default; the definition, token by token) or "jacobi" (the temporal-parallel
  approximation), used on every scoring call and every generation, never taken from the saved config;
* d_forward: the Jacobi depth (recurrence=jacobi only; default: the saved config's d_forward);
* exact_solver: how the exact path is computed (recurrence=exact only): "sequential" (default, the token loop),
  "fixed_point" or "auto" (docs/model.md, "Solving the exact path"), with the saved config's fixed_point_*
  settings; the passes every scoring forward took are recorded as `t2mlr_exact_solve`;
* exit_layer: an early exit (`t2mlr.evaluation.early_exit`): blocks after this one (1-based) are skipped and
  the final norm and head read its output; plain models and T²MLR with exit_layer >= l_end only.

Only the two calls that run the model are overridden: `_model_call` passes `recurrence=...` (and the
depth) to the forward, `_model_generate` passes `prefill=...` (and `prefill_depth`) to `generate()`;
decode steps are one token, where both paths coincide. Batching, padding, automatic batch sizes,
tokenization and devices are HFLM's. The path is recorded in the results' config (`t2mlr_recurrence`,
`t2mlr_d_forward`, `t2mlr_exact_solver`, `t2mlr_placement`, `t2mlr_exit_layer`). A plain causal LM (the baselines of `t2mlr.baselines`) is
scored through the same entry as the plain model it is, so every arm of a comparison is evaluated alike.

lm-eval 0.4 finds models only in its in-process registry (it reads no entry points), so this module
must be imported before lm-eval looks "t2mlr" up: `t2mlr eval ...` and `python -m t2mlr.evaluation ...`
do that; in Python, `import t2mlr.evaluation.lm_eval_model` before `lm_eval.simple_evaluate(model="t2mlr")`.
"""

from __future__ import annotations

import logging
from typing import Any

import lm_eval.models  # noqa: F401  (registers lm-eval's own models: the registry loads them only when empty)
import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

import t2mlr.baselines  # noqa: F401  (registers the baselines' model types, so saved baselines load here too)
import t2mlr.model.modeling  # noqa: F401  (registers the "t2mlr" model type with the Auto classes)
from t2mlr.evaluation.early_exit import skip_blocks_after
from t2mlr.generation.text import underlying
from t2mlr.model import is_t2mlr
from t2mlr.settings import EXACT_SOLVERS, check_depths
from t2mlr.model.modeling import ExactSolveReport

__all__ = ["EVAL_PATHS", "PATH_ARGUMENTS", "T2MLRLM", "check_eval_path"]

EVAL_PATHS = ("exact", "jacobi")
# forward / generate() arguments that choose the path: fixed by the model args, so never taken from a task
PATH_ARGUMENTS = ("recurrence", "d_forward", "d_backward", "jacobi_tol", "prefill", "prefill_depth", "prefill_tol",
                  "exact_solver", "fixed_point_tol", "fixed_point_chunk")
log = logging.getLogger(__name__)


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


def check_eval_solver(recurrence: str, exact_solver: str) -> None:
    """The exact path's solver is a choice of the exact evaluation only."""
    if exact_solver not in EXACT_SOLVERS:
        raise ValueError(f"exact_solver must be one of {EXACT_SOLVERS}, got {exact_solver!r}")
    if recurrence != "exact" and exact_solver != "sequential":
        raise ValueError("exact_solver applies to recurrence=exact only (the Jacobi path has its own depth, d_forward)")


@register_model("t2mlr")
class T2MLRLM(HFLM):
    """lm-eval's HFLM on an explicitly chosen T²MLR path (see the module docstring)."""

    def __init__(
        self, pretrained: Any, recurrence: str = "exact", d_forward: int | None = None, device: str | None = "auto",
        exit_layer: int | None = None, exact_solver: str = "sequential", **kwargs: Any,
    ) -> None:
        """`device`: as HFLM's, except that the default is CUDA when available, else the CPU (HFLM's own
        default, "cuda", fails on a machine without CUDA). The backend is "causal" unless given: HFLM
        infers it from transformers' own model types and would warn that it does not know "t2mlr".
        `exit_layer`: the loaded model keeps only its blocks up to this one (the others skipped) for good."""
        check_eval_path(recurrence, d_forward)
        check_eval_solver(recurrence, exact_solver)
        kwargs.setdefault("backend", "causal")
        super().__init__(pretrained=pretrained, device=device or "auto", **kwargs)
        model = underlying(self.model)  # the transformers model, under a PEFT wrapper (`peft=...` in the model args)
        self.recurrent = is_t2mlr(model)
        if not self.recurrent and (recurrence != "exact" or d_forward is not None or exact_solver != "sequential"):
            raise ValueError(
                f"{type(model).__name__} has no recurrence: recurrence=jacobi, d_forward and exact_solver apply to "
                "T²MLR models only (a baseline is scored as the plain causal LM it is)"
            )
        if self.recurrent and model.config.recurrence_mask_policy != "all":
            raise ValueError(
                "this model was configured with recurrence_mask_policy='mask' (fusion only where a per-token mask "
                "says so); lm-eval requests carry no such mask. Save it with recurrence_mask_policy='all' to "
                "evaluate with recurrence on every token"
            )
        self.recurrence = recurrence if self.recurrent else "none"
        self.d_forward = model.config.d_forward if recurrence == "jacobi" and d_forward is None else d_forward
        self.exact_solver = exact_solver if self.recurrent and recurrence == "exact" else None
        self.solves: list[Any] = []  # every scoring forward's ExactSolveReport
        self.exit_layer = exit_layer
        if exit_layer is not None:
            skip_blocks_after(model, exit_layer)
        log.info("T²MLR evaluation path: %s", self.path_description)

    # ----------------------------------------------------------------------------- the path
    @property
    def path_description(self) -> str:
        exit_after = "" if self.exit_layer is None else f", early exit after block {self.exit_layer}"
        if not self.recurrent:
            return f"plain causal LM ({type(underlying(self.model)).__name__}, no recurrence{exit_after})"
        exact = "exact" if self.exact_solver == "sequential" else f"exact({self.exact_solver})"
        return (exact if self.recurrence == "exact" else f"jacobi(d_forward={self.d_forward})") + exit_after

    def forward_path_kwargs(self) -> dict[str, Any]:
        """Forward arguments that pin the path (no gradients here, so d_backward=1 is always valid)."""
        if not self.recurrent:
            return {}
        if self.recurrence == "exact":
            return {"recurrence": "exact", "exact_solver": self.exact_solver}
        return {"recurrence": "jacobi", "d_forward": self.d_forward, "d_backward": 1}

    def prefill_kwargs(self) -> dict[str, Any]:
        """`generate()` arguments for the prompt's forward."""
        if not self.recurrent:
            return {}
        if self.recurrence == "exact":
            return {"prefill": "exact", "exact_solver": self.exact_solver}
        return {"prefill": "jacobi", "prefill_depth": self.d_forward}

    # ----------------------------------------------------------------------------- the calls that run the model
    def _model_call(
        self, inps: torch.Tensor, attn_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None
    ) -> torch.Tensor:
        """HFLM's scoring forward (no gradients, its mixed-precision autocast) with the path's arguments.
        HFLM right-pads the rows without a mask: both paths are causal in time, so padding after a row's
        tokens changes none of its scores."""
        if attn_mask is not None or labels is not None:
            raise ValueError("--model t2mlr scores causal LMs only (HFLM passes a mask and labels to seq2seq models)")
        autocast = torch.autocast(
            device_type=self.device.type, dtype=self.mixed_precision_dtype, enabled=self.mixed_precision_dtype is not None
        )
        with torch.no_grad(), autocast:
            out = self.model(inps, **self.forward_path_kwargs())
        self.solves.append(getattr(out, "exact_solve", None))
        return out.logits

    def _model_generate(self, context: torch.Tensor, max_length: int, stop: list[str], **generation_kwargs: Any):
        """HFLM's generation with the prompt's prefill on the chosen path."""
        for name in PATH_ARGUMENTS:
            if name in generation_kwargs:
                raise ValueError(f"gen_kwargs may not set {name!r}: the T²MLR path is fixed by the model args")
        return super()._model_generate(context, max_length, stop, **generation_kwargs, **self.prefill_kwargs())

    # ----------------------------------------------------------------------------- reporting
    def get_model_info(self) -> dict[str, Any]:
        """HFLM's record (size, dtype, revision) plus the model type, placement and evaluation path."""
        config = underlying(self.model).config
        return {
            **super().get_model_info(),
            "model_type": config.model_type,
            "t2mlr_placement": [config.l_start, config.l_end] if self.recurrent else None,
            "t2mlr_recurrence": self.recurrence,
            "t2mlr_d_forward": self.d_forward,
            "t2mlr_exact_solver": self.exact_solver,
            "t2mlr_exact_solve": ExactSolveReport.combined(self.solves),
            "t2mlr_exit_layer": self.exit_layer,
        }
