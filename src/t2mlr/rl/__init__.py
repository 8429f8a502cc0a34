"""Reinforcement learning for T²MLR models, on TRL.

`T2MLRGRPOTrainer` is `trl.GRPOTrainer` with the per-token log-probabilities replayed from the recurrent states
each rollout's `generate()` computed (`t2mlr.rl.trainer`); `t2mlr.rl.tasks` holds the verifiable tasks and
their rewards as TRL reward functions; `t2mlr rl grpo CONFIG --out DIR` runs it from a YAML config
(`t2mlr.rl.grpo`). See docs/rl.md.
"""

from t2mlr.utils import lazy_names

# Public name -> the submodule that defines it, loaded on first access (PEP 562): `t2mlr rl grpo --help` and
# `import t2mlr.rl.tasks` do not pay for TRL.
_HOMES = {
    "T2MLRGRPOConfig": "trainer", "T2MLRGRPOTrainer": "trainer", "RolloutStates": "trainer",
    "TASKS": "tasks", "TaskReward": "tasks", "build_task": "tasks", "prompt_dataset": "tasks",
    "GrpoConfig": "config", "load_grpo_config": "grpo", "run_grpo": "grpo",
}

__all__ = sorted(_HOMES)


__getattr__ = lazy_names(__name__, _HOMES)
