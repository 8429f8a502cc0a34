"""Two processes (torchrun, gloo on CPU) train `T2MLRGRPOTrainer` as one process does: the same losses, gradient
norms and final weights, to float32 rounding.

The comparison holds the global batch fixed (16 completions per step: one process scores all 16, each of two
scores 8, and DDP averages their gradients) and removes the one thing that legitimately differs between world
sizes: sampling (TRL seeds each process apart, and one process draws 16 rows from one generator where two draw 8
each). The completions are scripted instead (a logits processor keeps one token per step, drawn from the row's
global index), so both runs see the same rollouts; they still go through `generate()`, which returns their exact
states, and through TRL's rewards, group advantages (gathered over processes), loss normalisation and, with
`beta > 0`, the frozen reference. `num_iterations = 2` makes every second step reuse a rollout with a moved
policy (the iterated replay), so the losses are not the trivial −mean(A) of a first update. SGD, not Adam: Adam
divides each gradient by its own magnitude, so it would blow the rounding of near-zero gradients up to ±lr.

Run as a script (`torchrun --nproc_per_node 2 tests/test_rl_distributed.py POLICY OUT`) it is the worker.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

STEPS, COMPLETIONS, GROUP, LENGTH = 4, 16, 4, 3


def scripted_tokens(task_tokenizer, generation: int, row: int) -> list[int]:
    """The completion of global row `row` in the rollout `generation`: digits and an occasional end-of-text."""
    allowed = [task_tokenizer.convert_tokens_to_ids(symbol) for symbol in "0123456789"] + [task_tokenizer.eos_token_id]
    draw = torch.randint(len(allowed), (LENGTH,), generator=torch.Generator().manual_seed(1000 * generation + row))
    return [allowed[i] for i in draw.tolist()]


def train(policy_dir: str, out_dir: str) -> dict[str, object]:
    """A 4-step run on the scripted rollouts; the logged losses, gradient norms and the final weights."""
    from transformers import LogitsProcessor, LogitsProcessorList

    from t2mlr.rl.tasks import build_task, prompt_dataset
    from t2mlr.rl.trainer import T2MLRGRPOConfig, T2MLRGRPOTrainer

    task = build_task("variable_assignment", 0, depth=1, num_constants=3, num_distractors=1)
    tokenizer = task.tokenizer
    world = int(os.environ.get("WORLD_SIZE", "1"))

    class Scripted(LogitsProcessor):
        def __init__(self, generation: int, first_row: int, prompt_width: int) -> None:
            self.generation, self.first_row, self.prompt_width = generation, first_row, prompt_width

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            position = input_ids.shape[1] - self.prompt_width
            keep = [scripted_tokens(tokenizer, self.generation, self.first_row + b)[position] for b in range(len(scores))]
            forced = torch.full_like(scores, -float("inf"))
            forced[torch.arange(len(scores)), keep] = 0.0
            return forced

    class ScriptedTrainer(T2MLRGRPOTrainer):
        generations = 0

        def _generate_single_turn(self, prompt_ids, *args, **kwargs):
            policy = self.accelerator.unwrap_model(self.model_wrapped)
            first_row = self.accelerator.process_index * len(prompt_ids)  # TRL hands each process a contiguous slice
            original = policy.generate
            width = max(len(p) for p in prompt_ids)

            def generate(*a, **k):
                return original(*a, **k, logits_processor=LogitsProcessorList([Scripted(self.generations, first_row, width)]))

            policy.generate = generate  # the trainer wraps it in turn, keeping the states
            try:
                return super()._generate_single_turn(prompt_ids, *args, **kwargs)
            finally:
                del policy.generate
                self.generations += 1

    def share_of_low_digits(prompts, completions, **columns):
        return [sum(c in "01234" for c in text) / max(len(text), 1) for text in completions]

    args = T2MLRGRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=COMPLETIONS // world, num_generations=GROUP,
        max_completion_length=LENGTH, num_iterations=2, beta=0.1, loss_type="grpo", optim="sgd", learning_rate=0.5,
        max_steps=STEPS, replay_depth=2, bf16=False, use_cpu=True, report_to="none", save_strategy="no",
        logging_steps=1, gradient_checkpointing=False, disable_tqdm=True, shuffle_dataset=False, seed=0,
    )
    trainer = ScriptedTrainer(model=policy_dir, reward_funcs=share_of_low_digits, args=args,
                              train_dataset=prompt_dataset(task, 0, STEPS * COMPLETIONS // GROUP // 2),
                              processing_class=tokenizer)
    trainer.train()
    logged = [record for record in trainer.state.log_history if "loss" in record]  # one per step
    weights = {name: tensor.detach().clone() for name, tensor in trainer.accelerator.unwrap_model(trainer.model).state_dict().items()}
    return {"loss": [r["loss"] for r in logged], "grad_norm": [r["grad_norm"] for r in logged],
            "reward": [r.get("reward") for r in logged], "weights": weights}


def save_policy(directory: Path) -> None:
    """A 4-block T²MLR(2,3) with open gates, where both runs load it from (and TRL its frozen reference)."""
    from conftest import open_gates
    from transformers import LlamaConfig

    from t2mlr import T2MLRConfig, T2MLRForCausalLM

    torch.manual_seed(0)
    base = LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True)
    open_gates(T2MLRForCausalLM(T2MLRConfig.from_base(base, l_start=2, l_end=3)), cur=0.5, rec=-0.8).save_pretrained(directory)


@pytest.mark.slow
def test_two_processes_train_as_one(tmp_path, one_torch_thread) -> None:
    save_policy(tmp_path / "policy")
    single = train(str(tmp_path / "policy"), str(tmp_path / "one"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                                                                 os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__,
               str(tmp_path / "policy"), str(tmp_path / "two")]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    double = torch.load(tmp_path / "two" / "result.pt")

    assert len(single["loss"]) == STEPS and single["reward"] == double["reward"]  # the same scripted rollouts
    assert any(abs(loss) > 1e-3 for loss in single["loss"])  # the reused rollouts' losses are not −mean(A) ≈ 0
    torch.testing.assert_close(torch.tensor(double["loss"]), torch.tensor(single["loss"]), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(torch.tensor(double["grad_norm"]), torch.tensor(single["grad_norm"]), rtol=1e-5, atol=1e-7)
    initial = load_file(tmp_path / "policy" / "model.safetensors")
    assert any(not torch.equal(single["weights"][n], initial[n]) for n in initial)  # the runs trained
    for name, weight in single["weights"].items():
        torch.testing.assert_close(double["weights"][name], weight, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    result = train(sys.argv[1], sys.argv[2])
    if int(os.environ.get("RANK", "0")) == 0:
        Path(sys.argv[2]).mkdir(parents=True, exist_ok=True)
        torch.save(result, Path(sys.argv[2]) / "result.pt")
