"""`T2MLRGRPOTrainer`: TRL's `GRPOTrainer` whose log-probabilities replay the rollout's exact recurrent states.

During a rollout `generate()` runs the recurrence token by token, so it has already computed the exact R
after every token (`output_recurrent_states=True`). Every per-token log-probability TRL then asks for (the
one carrying gradients, π_old when a rollout is reused, π_ref for the KL term) is a Jacobi forward started
from those states (`initial_states=`) instead of a fresh Jacobi refinement from the seed pass:

* while the policy is the one that sampled the rollout (no optimizer step since; its adapters, under PEFT,
  as trained), the states are its fixed point: `exact_states=True`, one middle-block pass whose backward is
  that of `replay_depth` gradient-carrying iterates (docs/semantics.md §5.2). The values are the exact path's.
* once the policy has moved (a later step on the same rollout: `num_iterations > 1`, or buffered steps when
  `steps_per_generation` exceeds `gradient_accumulation_steps`) and for the reference model, the states are
  stale: the iterated replay, d_forward = d_backward = `replay_depth`, moves them toward the scoring model's
  own fixed point (exact once `replay_depth` reaches the sequence length).

Everything else is TRL's: sampling, rewards, group advantages, the loss types, logging, checkpoints,
multi-process training and PEFT. The states ride in TRL's rollout dictionary (`recurrent_states`, aligned with
the prompt and completion ids it pads: prompts left-padded, completions right-padded; padded positions pass R
through in the model, so the states there are never read), so TRL's shuffling and splitting across
gradient-accumulation steps keeps them with their rows.

A plain `GRPOTrainer` also runs on a T²MLR model; it scores tokens on the model's training path (Jacobi from the
seed pass, `train_recurrence` / `d_forward` / `d_backward` of the config), which is approximate.

Rollouts come from transformers' `generate()`; vLLM rollouts, transformers' continuous batching, tool calls,
environments and custom `rollout_func`s do not return states and are refused.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import is_peft_model
from trl import GRPOConfig, GRPOTrainer

from t2mlr.model import is_t2mlr
from t2mlr.generation.text import underlying

__all__ = ["RolloutStates", "T2MLRGRPOConfig", "T2MLRGRPOTrainer"]


@dataclass
class T2MLRGRPOConfig(GRPOConfig):
    """`trl.GRPOConfig` plus the depth of the replayed update."""

    replay_depth: int = field(
        default=4,
        metadata={"help": "d_backward of the replayed forward (the BPTT window of its gradient), and d_forward = "
                          "d_backward of the iterated replay used once the policy has moved since the rollout"},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.replay_depth < 1:
            raise ValueError(f"replay_depth must be >= 1, got {self.replay_depth}")


@dataclass
class RolloutStates:
    """Per completion, R after every real prompt token and every kept completion token (exact, from generate())."""

    rows: list[torch.Tensor]  # (prompt length + completion length, hidden) each
    prompt_lengths: list[int]

    @classmethod
    def of_generation(cls, states: torch.Tensor, prompt_width: int, prompt_ids: list[list[int]],
                      completion_ids: list[list[int]]) -> RolloutStates:
        """Cut each row's states out of generate()'s (rows, left-padded prompt + generated, hidden) tensor;
        `completion_ids` are the completions as TRL keeps them (cut after the first end-of-text token)."""
        if states.shape[0] != len(prompt_ids) or len(prompt_ids) != len(completion_ids):
            raise ValueError(f"generate() returned states for {states.shape[0]} rows, but there are "
                             f"{len(prompt_ids)} prompts and {len(completion_ids)} completions")
        rows = []
        for i, (prompt, completion) in enumerate(zip(prompt_ids, completion_ids)):
            end = prompt_width + len(completion)
            if len(prompt) > prompt_width or end > states.shape[1]:
                raise ValueError(f"row {i}: {len(prompt)} prompt and {len(completion)} completion tokens do not fit "
                                 f"the generated {states.shape[1]} positions (prompt width {prompt_width})")
            rows.append(states[i, prompt_width - len(prompt) : end])
        return cls(rows, [len(prompt) for prompt in prompt_ids])

    def padded(self, prompt_width: int, completion_width: int) -> torch.Tensor:
        """(rows, prompt_width + completion_width, hidden), laid out as TRL pads the ids: each prompt ends at
        `prompt_width`, each completion starts there; zeros at padded positions (never read)."""
        hidden = self.rows[0].shape[-1]
        out = self.rows[0].new_zeros(len(self.rows), prompt_width + completion_width, hidden)
        for i, (row, prompt_length) in enumerate(zip(self.rows, self.prompt_lengths)):
            completion_length = row.shape[0] - prompt_length
            if prompt_length > prompt_width or completion_length > completion_width:
                raise ValueError(f"row {i} ({prompt_length} + {completion_length} tokens) does not fit the padded "
                                 f"width {prompt_width} + {completion_width}")
            out[i, prompt_width - prompt_length : prompt_width + completion_length] = row
        return out


@dataclass
class _KeptStates:
    states: torch.Tensor | None = None
    prompt_width: int = 0


@contextmanager
def generate_keeping_states(model: torch.nn.Module) -> Iterator[_KeptStates]:
    """Within the block, `model.generate(...)` returns its sequences as usual (what TRL expects) and keeps the
    exact recurrent states of the call (`output_recurrent_states=True`) in the yielded record."""
    kept = _KeptStates()
    shadowed = model.__dict__.get("generate")  # an instance attribute already in place (restored afterwards)
    original = model.generate

    def generate(*args: Any, **kwargs: Any) -> torch.Tensor:
        prompt = args[0] if args else kwargs["input_ids"]
        if kwargs.get("generation_config") is not None:  # TRL's: asked for a dictionary there, not beside it
            kwargs["generation_config"] = copy.deepcopy(kwargs["generation_config"])
            kwargs["generation_config"].return_dict_in_generate = True
        else:
            kwargs["return_dict_in_generate"] = True
        out = original(*args, **kwargs, output_recurrent_states=True)
        kept.states, kept.prompt_width = out.recurrent_states, prompt.shape[1]
        return out.sequences

    model.generate = generate
    try:
        yield kept
    finally:
        if shadowed is None:
            del model.generate
        else:
            model.generate = shadowed


class T2MLRGRPOTrainer(GRPOTrainer):
    """`trl.GRPOTrainer` for T²MLR models: rollouts keep their exact recurrent states and every per-token
    log-probability is replayed from them (see the module docstring). Takes `GRPOTrainer`'s arguments; `args`
    may be a `T2MLRGRPOConfig` (for `replay_depth`; a plain `GRPOConfig` gets the default depth, 4)."""

    _tag_names = ["trl", "grpo", "t2mlr"]

    def __init__(self, model: Any, reward_funcs: Any = None, args: GRPOConfig | None = None, **kwargs: Any) -> None:
        refused = [name for name in ("tools", "rollout_func", "environment_factory") if kwargs.get(name)]
        refused += [name for name in ("use_vllm", "use_transformers_continuous_batching") if getattr(args, name, False)]
        if refused:
            raise ValueError(f"T2MLRGRPOTrainer does not support {', '.join(refused)}: its update replays the recurrent "
                             "states that transformers' generate() returns with each rollout, and rollouts made that "
                             "way carry none (trl.GRPOTrainer supports them, scoring on the Jacobi path)")
        super().__init__(model, reward_funcs, args, **kwargs)
        policy = self.accelerator.unwrap_model(self.model)
        if not is_t2mlr(underlying(policy)):
            raise ValueError(f"T2MLRGRPOTrainer trains T²MLR models (it replays their recurrent states), got "
                             f"{type(policy).__name__}; use trl.GRPOTrainer for other models")
        self.replay_depth = int(getattr(self.args, "replay_depth", T2MLRGRPOConfig.replay_depth))
        self._trained_adapter = policy.active_adapter if is_peft_model(policy) else None
        self._rollout: RolloutStates | None = None
        self._rollout_step: int | None = None  # global_step when the rollout was sampled
        self._scoring_states: torch.Tensor | None = None

    # ------------------------------------------------------------------------------------ rollouts
    def _generate_single_turn(self, prompt_ids: list[list[int]], *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """TRL's generation, keeping each completion's exact recurrent states."""
        policy = self.accelerator.unwrap_model(self.model_wrapped)
        with generate_keeping_states(policy) as kept:
            completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *args, **kwargs)
        if kept.states is None:
            raise RuntimeError("the rollout did not go through the policy's generate(), so it has no recurrent states")
        self._rollout = RolloutStates.of_generation(kept.states, kept.prompt_width, prompt_ids, completion_ids)
        return completion_ids, logprobs

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """TRL's rollout dictionary plus `recurrent_states`, aligned with its padded prompt and completion ids;
        the rollout's wall time is logged as `rollout_s`."""
        started = time.perf_counter()
        self._rollout_step = self.state.global_step
        output = super()._generate_and_score_completions(inputs)
        output["recurrent_states"] = self._rollout.padded(output["prompt_ids"].shape[1], output["completion_ids"].shape[1])
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["rollout_s"].append(time.perf_counter() - started)
        return output

    # ------------------------------------------------------------------------------------ scoring
    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        """TRL's loss, its log-probabilities replayed from this batch's states."""
        self._scoring_states = inputs["recurrent_states"]
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._scoring_states = None

    def _get_per_token_logps_and_entropies(
        self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
        batch_size: int | None = None, compute_entropy: bool = False, compute_aux_loss: bool = False,
        **multimodal: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, None]:
        """Per-token log-probabilities (and entropies) of the completion tokens, replayed from the rollout's states
        (`replay_path`), in chunks of `batch_size` rows through TRL's fused LM head."""
        given = sorted(name for name, value in multimodal.items() if value is not None)
        if given:
            raise ValueError(f"T²MLR models are text-only; got {given}")
        states = self._states_for(input_ids, logits_to_keep)
        path = self.replay_path(model)
        batch_size = batch_size or input_ids.shape[0]
        log_probs, entropies = [], []
        for start in range(0, input_ids.shape[0], batch_size):
            rows = slice(start, start + batch_size)
            ids, mask = input_ids[rows], attention_mask[rows]
            labels = ids.masked_fill(mask == 0, -100)
            labels[:, :-logits_to_keep] = -100  # only the completion tokens are scored
            with self.accelerator.autocast():
                out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True,
                            initial_states=states[rows], **path)
            log_probs.append(out.log_probs[:, -logits_to_keep:])
            if compute_entropy:
                entropies.append(out.entropy[:, -logits_to_keep:])
        return torch.cat(log_probs), torch.cat(entropies) if compute_entropy else None, None

    def replay_path(self, model: Any) -> dict[str, Any]:
        """The forward arguments that replay the rollout's states for `model`: the one-pass exact replay when
        they are `model`'s own fixed point, else the iterated replay."""
        depth = self.replay_depth
        own = (model is not self.ref_model and self.state.global_step == self._rollout_step
               and self._adapters_as_trained(model))
        return {"recurrence": "jacobi", "exact_states": own, "d_forward": depth, "d_backward": depth}

    def _states_for(self, input_ids: torch.Tensor, logits_to_keep: int) -> torch.Tensor:
        """The states of the batch being scored: the loss's batch (set by `_compute_loss`), else the latest
        rollout laid out like `input_ids` (π_old and π_ref, scored while TRL builds the rollout dictionary)."""
        if self._scoring_states is not None:
            states = self._scoring_states
        elif self._rollout is not None:
            states = self._rollout.padded(input_ids.shape[1] - logits_to_keep, logits_to_keep)
        else:
            raise RuntimeError("no rollout states to replay: score a batch from this trainer's own rollouts")
        if tuple(states.shape[:2]) != tuple(input_ids.shape):
            raise ValueError(f"recurrent states {tuple(states.shape[:2])} do not match the ids {tuple(input_ids.shape)}")
        return states

    def _adapters_as_trained(self, model: Any) -> bool:
        """False while TRL scores the PEFT reference (adapters disabled, or the frozen "ref" adapter active)."""
        unwrapped = self.accelerator.unwrap_model(model)
        if not is_peft_model(unwrapped):
            return True
        from peft.tuners.tuners_utils import BaseTunerLayer

        disabled = any(layer.disable_adapters for layer in unwrapped.modules() if isinstance(layer, BaseTunerLayer))
        return unwrapped.active_adapter == self._trained_adapter and not disabled
