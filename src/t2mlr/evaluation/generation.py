"""k samples per problem and pass@k, for the experiments that score generated replies (`t2mlr experiment
finetune`).

`SamplingPlan` says how many replies each problem gets and which pass@k to report: one sample is greedy (pass@1
is then the greedy accuracy), more are drawn at `temperature` and `top_p`, seeded. `replies_per_prompt` generates
them through `t2mlr.generation.text.generate_batched` (the experiments' own batched generation, T²MLR's prefill
path included) and `pass_at_k_table` averages the unbiased estimator over problems
(`t2mlr.tasks.scoring.pass_at_k`: 1 − C(n − c, k) / C(n, k) for c right of n samples). A k above the number of
samples is refused when the plan is made, before any training.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from t2mlr.tasks.scoring import mean_pass_at_k

if TYPE_CHECKING:  # torch and transformers load when replies are generated, not when a config is checked
    from t2mlr.generation.text import GenerationSettings

__all__ = ["SamplingPlan", "pass_at_k_table", "replies_per_prompt"]


@dataclass(frozen=True)
class SamplingPlan:
    """Replies per problem (`samples`), the pass@k values reported (`pass_k`) and, for more than one sample, the
    sampling temperature and nucleus (top-p) mass."""

    samples: int = 1
    pass_k: tuple[int, ...] = (1,)
    temperature: float = 1.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 1:
            raise ValueError(f"samples must be an int >= 1 (replies per problem), got {self.samples!r}")
        if not self.pass_k:
            raise ValueError("pass_k must name at least one k (e.g. [1])")
        too_many = [k for k in self.pass_k if k > self.samples]
        if too_many or any(k < 1 for k in self.pass_k):
            raise ValueError(f"pass_k {list(self.pass_k)}: every k must be in 1..samples ({self.samples}); pass@k "
                             f"needs at least k samples per problem, so raise samples to {max(self.pass_k)} or drop "
                             f"{too_many or [k for k in self.pass_k if k < 1]}")
        if len(set(self.pass_k)) != len(self.pass_k):
            raise ValueError(f"pass_k {list(self.pass_k)} names a k twice")
        if not self.sampled and (self.temperature != 1.0 or self.top_p != 1.0):
            raise ValueError("temperature and top_p apply to sampling (samples > 1); one sample per problem is greedy")
        if self.temperature <= 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"need temperature > 0 and 0 < top_p <= 1, got {self.temperature} and {self.top_p}")

    @property
    def sampled(self) -> bool:
        return self.samples > 1

    def generation_settings(self, **settings: Any) -> GenerationSettings:
        """`GenerationSettings(**settings)` decoding as this plan says: greedy, or sampling."""
        from t2mlr.generation.text import GenerationSettings

        if not self.sampled:
            return GenerationSettings(**settings)
        return GenerationSettings(do_sample=True, temperature=self.temperature, top_p=self.top_p, **settings)

    def describe(self) -> str:
        """How the replies were made, for reports."""
        if not self.sampled:
            return "greedy"
        return (f"{self.samples} replies per problem sampled at temperature {self.temperature:g}, top-p "
                f"{self.top_p:g}")


def replies_per_prompt(model: Any, tokenizer: Any, prompts: Sequence[str], plan: SamplingPlan,
                       settings: GenerationSettings, batch_size: int, seed: int, **options: Any) -> list[list[str]]:
    """`plan.samples` replies to every prompt, in order (`options`: `generate_batched`'s). Sampling draws from a
    generator seeded with `seed` and leaves the global one as it was."""
    import torch

    from t2mlr.generation.text import generate_batched

    repeated = [prompt for prompt in prompts for _ in range(plan.samples)]
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        replies = generate_batched(model, tokenizer, repeated, settings, batch_size, **options)
    return [replies[index : index + plan.samples] for index in range(0, len(replies), plan.samples)]


def pass_at_k_table(correct_counts: Sequence[int], samples: int, pass_k: Sequence[int]) -> dict[int, float]:
    """{k: pass@k averaged over problems}, each problem with `samples` replies of which `correct_counts[i]` right."""
    return {k: mean_pass_at_k(correct_counts, samples, k) for k in pass_k}
