"""How a served T²MLR model runs its prompts: the engine-wide prefill choice.

The choice rides on the model's config, set with vLLM's `--hf-overrides` (or `LLM(hf_overrides=...)`),
so `vllm serve`, `LLM(...)` and `t2mlr serve` share one spelling:

    --hf-overrides '{"t2mlr_prefill": "jacobi", "t2mlr_prefill_depth": 16, "t2mlr_prefill_tol": 1e-4}'

* "exact" (default): the middle block runs over a prompt chunk one position at a time, as
  `generate()`'s exact prefill does; the logits are the definition's (docs/semantics.md §5.1).
* "jacobi": `depth` fixed-point iterations of the middle block over the whole chunk (default: the
  config's `d_forward`), each request stopping early once none of its states moves by more than `tol`,
  as `generate(prefill="jacobi", prefill_depth=..., prefill_tol=...)` does (§5.2). Exact when depth is at
  least the chunk length; approximate below it.

The values are checked by the same code that checks `generate()`'s (`t2mlr.model.generation.prefill_kwargs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from t2mlr.model.generation import prefill_kwargs
from t2mlr.utils import check_known_names

OVERRIDE_KEYS = ("t2mlr_prefill", "t2mlr_prefill_depth", "t2mlr_prefill_tol")


@dataclass(frozen=True)
class PrefillChoice:
    """The prompt's path: exact, or Jacobi with `depth` iterations and an optional early-stop `tol`."""

    path: str = "exact"
    depth: int | None = None
    tol: float | None = None

    @classmethod
    def from_config(cls, config: Any) -> PrefillChoice:
        """Read and check the `t2mlr_prefill*` fields of a (possibly overridden) T²MLR config; a misspelt
        `t2mlr_*` override is an error naming the nearest key, not an ignored attribute."""
        given = [name for name in vars(config) if name.startswith("t2mlr_")]
        check_known_names(given, OVERRIDE_KEYS, "T²MLR serving override")
        path, depth, tol = (getattr(config, key, None) for key in OVERRIDE_KEYS)
        checked = prefill_kwargs(path, depth, tol, config.d_forward)
        if checked.get("recurrence", "exact") == "exact":
            return cls()
        return cls("jacobi", checked["d_forward"], checked["jacobi_tol"])

    def overrides(self) -> dict[str, Any]:
        """The `--hf-overrides` entries that select this choice (the path, and the depth and tol that are set)."""
        return {key: value for key, value in zip(OVERRIDE_KEYS, (self.path, self.depth, self.tol)) if value is not None}
