"""Retrofitting pretrained models through the trainer, `t2mlr retrofit` and `t2mlr experiment retrofit`,
on a tiny saved Llama with its own tokenizer (seconds; the real SmolLM2 is in test_retrofit_real_model.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_base_config
from rounding import forward_tolerance
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaForCausalLM,
)

from t2mlr import T2MLRForCausalLM
from t2mlr.cli import main as cli_main
from t2mlr.experiments import retrofit
from t2mlr.experiments.retrofit import RetrofitTask
from t2mlr.experiments.sections import preset_config
from t2mlr.model.pretrained import IncompatibleBaseError, PretrainedSourceError
from t2mlr.tasks.arithmetic import ArithmeticSettings
from t2mlr.tasks.arithmetic import arithmetic_retrofit_records as arithmetic_records
from t2mlr.tasks.loaders import gsm8k_records
from t2mlr.tasks.sft import SFTDataset
from t2mlr.tasks.tokenizers import build_word_tokenizer, word_vocab_from_texts
from t2mlr.training import model_factory
from t2mlr.training.config import ConfigError, config_from_tree, load_config, load_sections
from t2mlr.training.trainer import Trainer

SETTINGS = ArithmeticSettings(min_steps=2, max_steps=3)


def load_retrofit(preset: str, overrides: tuple[str, ...] = ()) -> tuple[RetrofitTask, dict]:
    tree, sections = load_sections(preset_config("retrofit", preset), overrides, {"task": RetrofitTask})
    return sections["task"], tree


def arms(preset: str, overrides: tuple[str, ...] = (), base: Path = Path("/tmp/base")) -> dict:
    task, tree = load_retrofit(preset, overrides)
    return {arm.name: arm.config for arm in retrofit.build_arms(task, tree, base, base / "train.jsonl", 2)}


pytestmark = pytest.mark.usefixtures("one_torch_thread_per_module")


def arithmetic_tokenizer():
    """A word-level tokenizer covering the generated problems (numbers outside it become <unk>)."""
    records = arithmetic_records(40, "train", 0, SETTINGS) + arithmetic_records(8, "eval", 0, SETTINGS)
    return build_word_tokenizer(word_vocab_from_texts(r["prompt"] + r["target"] for r in records))


def save_pretrained_dir(directory: Path, tokenizer=None, vocab_extra: int = 0, layers: int = 5) -> LlamaForCausalLM:
    """A tiny Llama and its tokenizer, saved the way a hub download looks."""
    tokenizer = tokenizer or arithmetic_tokenizer()
    torch.manual_seed(0)
    config = tiny_base_config("llama", layers=layers, vocab_size=len(tokenizer) + vocab_extra,
                              max_position_embeddings=512)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model


@pytest.fixture(scope="module")
def pretrained_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pretrained")
    save_pretrained_dir(directory)
    return directory


def write_ids(path: Path, rows: int = 16, length: int = 12, vocab: int = 40) -> Path:
    generator = torch.Generator().manual_seed(0)
    lines = [json.dumps({"input_ids": torch.randint(3, vocab, (length,), generator=generator).tolist()})
             for _ in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def train_tree(pretrained: Path, data: Path, arch: str = "t2mlr", **model: object) -> dict:
    settings = {"t2mlr": {"l_start": 2, "l_end": 4, "d_forward": 2, "d_backward": 1},
                "looped": {"loop_blocks": "2-3", "loops": 2}, "pause": {"pauses": 1}, "transformer": {}}[arch]
    return {
        "model": {"arch": arch, "pretrained": str(pretrained), **settings, **model},
        "data": {"source": "jsonl", "path": str(data), "seq_len": 12},
        "train": {"max_steps": 2, "global_batch_size": 2, "micro_batch_size": 2, "device": "cpu"},
        "logging": {"progress_bar": False},
    }


# ------------------------------------------------------------------------------------------ trainer
@pytest.mark.parametrize("arch", ["t2mlr", "transformer", "looped", "pause"])
def test_trainer_finetunes_a_pretrained_model_and_saves_its_tokenizer(
    pretrained_dir: Path, tmp_path: Path, arch: str
) -> None:
    cfg = config_from_tree(train_tree(pretrained_dir, write_ids(tmp_path / "d.jsonl"), arch))
    trainer = Trainer(cfg, tmp_path / "run")
    first = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    reference = AutoModelForCausalLM.from_pretrained(pretrained_dir)
    for name, value in reference.state_dict().items():  # the pretrained weights, loaded not re-initialised
        assert torch.equal(first[name], value), name  # every arch keeps the base decoder's tensor names
    trainer.train()
    final = tmp_path / "run" / "final"
    saved_tokenizer = AutoTokenizer.from_pretrained(final)
    original = AutoTokenizer.from_pretrained(pretrained_dir)
    text = "Mia has 12 apples ."
    assert saved_tokenizer(text)["input_ids"] == original(text)["input_ids"]
    reloaded = AutoModelForCausalLM.from_pretrained(final)
    assert reloaded.config.vocab_size == len(original)


def test_gguf_file_needs_pretrained_and_a_gguf_name(pretrained_dir: Path, tmp_path: Path) -> None:
    data = write_ids(tmp_path / "d.jsonl")
    tree = train_tree(pretrained_dir, data, gguf_file="model.gguf")
    del tree["model"]["pretrained"]
    tree["model"]["base"] = tiny_base_config().to_dict()
    with pytest.raises(ConfigError, match="model.gguf_file='model.gguf' needs model.pretrained"):
        config_from_tree(tree)
    with pytest.raises(ConfigError, match="bare file name ending in .gguf"):
        config_from_tree(train_tree(pretrained_dir, data, gguf_file="sub/model.gguf"))
    with pytest.raises(ConfigError, match="Did you mean 'gguf_file'"):
        config_from_tree(train_tree(pretrained_dir, data, gguf_fil="model.gguf"))


def test_readme_train_overrides(pretrained_dir: Path, tmp_path: Path) -> None:
    """The README's finetuning line: a from-scratch preset turned into a retrofit by overrides."""
    overrides = ["model.base=null", "model.pretrained=models/smollm2", "model.gguf_file=SmolLM2-135M-Instruct.Q4_1.gguf"]
    cfg = load_config("smollm2_135m_5_26", overrides)
    assert (cfg.model.base, cfg.model.pretrained, cfg.model.gguf_file) == (
        None, "models/smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert (cfg.model.l_start, cfg.model.l_end) == (5, 26)
    # the same overrides at a tiny scale: a local directory instead of the GGUF, two steps
    tree = train_tree(pretrained_dir, write_ids(tmp_path / "d.jsonl"))
    Trainer(config_from_tree(tree), tmp_path / "run").train()
    assert (tmp_path / "run" / "final" / "tokenizer.json").is_file()


@pytest.fixture
def no_model_building(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bad input must be refused before the weights are read or a model is built."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was built before the bad input was refused")

    monkeypatch.setattr(model_factory, "load_pretrained_base", refuse)


def test_l_end_beyond_the_layers_fails_before_loading(pretrained_dir: Path, tmp_path: Path, no_model_building) -> None:
    cfg = config_from_tree(train_tree(pretrained_dir, write_ids(tmp_path / "d.jsonl"), l_end=9))
    with pytest.raises(ConfigError, match="l_end"):
        Trainer(cfg, tmp_path / "run")


def test_a_retrofit_to_a_directory_refuses_a_fusion_that_is_not_the_identity_before_loading(
    pretrained_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from t2mlr.model import pretrained
    from t2mlr.training.retrofit_command import retrofit_to_directory

    monkeypatch.setattr(pretrained, "load_pretrained_base", lambda *a, **k: pytest.fail("the weights were loaded"))
    with pytest.raises(ValueError, match="not the identity when fresh"):
        retrofit_to_directory(str(pretrained_dir), 2, 4, tmp_path / "out", fusion="alpha_coupled")
    assert not (tmp_path / "out").exists()


def test_missing_gguf_file_fails_before_loading(pretrained_dir: Path, tmp_path: Path, no_model_building) -> None:
    cfg = config_from_tree(train_tree(tmp_path, write_ids(tmp_path / "d.jsonl"), gguf_file="absent.gguf"))
    with pytest.raises(PretrainedSourceError, match="GGUF file not found: .*absent.gguf"):
        Trainer(cfg, tmp_path / "run")


def test_unwrappable_architecture_fails_before_loading(tmp_path: Path, no_model_building) -> None:
    gpt2 = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64)).save_pretrained(gpt2)
    cfg = config_from_tree(train_tree(gpt2, write_ids(tmp_path / "d.jsonl")))
    with pytest.raises(IncompatibleBaseError, match="'gpt2' model; T²MLR wraps only"):
        Trainer(cfg, tmp_path / "run")


def test_tokenizer_larger_than_the_vocabulary_fails_before_loading(tmp_path: Path, no_model_building) -> None:
    directory = tmp_path / "small_vocab"
    tokenizer = arithmetic_tokenizer()
    save_pretrained_dir(directory, tokenizer, vocab_extra=-5)
    cfg = config_from_tree(train_tree(directory, write_ids(tmp_path / "d.jsonl")))
    with pytest.raises(ConfigError, match=f"tokenizer has {len(tokenizer)} tokens but the model's vocabulary has"):
        Trainer(cfg, tmp_path / "run")


# ------------------------------------------------------------------------------------------ t2mlr retrofit
def test_retrofit_command_writes_a_checkpoint_that_reloads_alone(pretrained_dir: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "retrofit"
    assert cli_main(["retrofit", str(pretrained_dir), "--l-start", "2", "--l-end", "4", "--out", str(out)]) == 0
    assert "wrote T²MLR(2,4)" in capsys.readouterr().out
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    base = AutoModelForCausalLM.from_pretrained(pretrained_dir).eval()
    assert isinstance(model, T2MLRForCausalLM) and (model.config.l_start, model.config.l_end) == (2, 4)
    ids = torch.tensor([[5, 9, 14, 3, 22, 7]])
    with torch.no_grad():  # gates closed: the base model's logits on the exact path, another float32 computation
        torch.testing.assert_close(model(ids, recurrence="exact").logits, base(ids).logits, rtol=0,
                                   atol=forward_tolerance(base, ids))
    assert AutoTokenizer.from_pretrained(out)("Mia has 12")["input_ids"] == \
        AutoTokenizer.from_pretrained(pretrained_dir)("Mia has 12")["input_ids"]
    assert cli_main(["generate", str(out), "--prompt", "Mia has 12", "--max-new-tokens", "4"]) == 0
    # a non-empty --out is refused, and --overwrite replaces it
    assert cli_main(["retrofit", str(pretrained_dir), "--l-start", "2", "--l-end", "4", "--out", str(out)]) == 2
    assert cli_main(["retrofit", str(pretrained_dir), "--l-start", "1", "--l-end", "5", "--out", str(out),
                     "--overwrite"]) == 0
    assert AutoModelForCausalLM.from_pretrained(out).config.l_end == 5


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--l-start", "2", "--l-end", "9"], "l_end"), (["--l-start", "3", "--l-end", "2"], "l_start"),
     (["--l-start", "2", "--l-end", "4", "--gguf-file", "absent.gguf"], "GGUF file not found")],
)
def test_retrofit_command_refuses_bad_input(pretrained_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                            args: list[str], message: str) -> None:
    assert cli_main(["retrofit", str(pretrained_dir), *args, "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------ data and presets
def test_prompts_are_masked_from_the_loss_and_optionally_the_recurrence() -> None:
    tokenizer = arithmetic_tokenizer()
    records = arithmetic_records(3, "train", 0, SETTINGS)
    plain = SFTDataset(records, tokenizer, bos=False, max_length=512)
    masked = SFTDataset(records, tokenizer, bos=False, prompt_recurrence_mask=True, max_length=512)
    for record, row, masked_row in zip(records, plain, masked):
        prompt = tokenizer(record["prompt"], add_special_tokens=False)["input_ids"]
        target = tokenizer(record["target"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        assert row["input_ids"].tolist() == prompt + target
        assert row["labels"].tolist() == [-100] * len(prompt) + target
        assert "recurrence_mask" not in row
        assert masked_row["recurrence_mask"].tolist() == [False] * len(prompt) + [True] * len(target)
    with pytest.raises(ValueError, match="more than max_length=5"):
        SFTDataset(records, tokenizer, bos=False, max_length=5)


def test_gsm8k_rows_take_the_number_after_the_marks(tmp_path: Path) -> None:
    path = tmp_path / "gsm8k.jsonl"
    path.write_text(json.dumps({"question": "Q?", "answer": "2+2=<<2+2=4>>4\n#### 1,004"}) + "\n")
    [record] = gsm8k_records(path)
    assert record["answer"] == "1004" and record["prompt"] == "Question: Q?\nAnswer:\n"


def test_paper_preset_is_the_papers_recipe_and_builds_valid_configs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="OpenMathReasoning"):
        load_retrofit("paper")
    task, tree = load_retrofit("paper", ("task.train_path=omr.parquet", "task.eval_path=gsm8k.jsonl"))
    assert (tree["model"]["pretrained"], tree["model"]["l_start"], tree["model"]["l_end"]) == (
        "HuggingFaceTB/SmolLM2-1.7B-Instruct", 5, 28)
    configs = arms("paper", ("task.train_path=omr.parquet", "task.eval_path=gsm8k.jsonl"), tmp_path / "base")
    for cfg in configs.values():
        assert (cfg.optim.lr, cfg.optim.betas, cfg.optim.weight_decay, cfg.train.global_batch_size) == (
            5e-5, (0.9, 0.999), 0.01, 64)
        assert cfg.model.pretrained == str(tmp_path / "base")
    assert (configs["t2mlr"].model.l_start, configs["t2mlr"].model.l_end) == (5, 28)


def test_arms_differ_only_in_the_model(tmp_path: Path) -> None:
    task, tree = load_retrofit("cpu")
    assert (tree["model"]["l_start"], tree["model"]["l_end"], tree["model"]["pretrained"]) == (5, 26,
                                                                                                "smollm2-135m-instruct")
    configs = arms("cpu", base=tmp_path)
    base, t2mlr = (configs[arm].to_dict() for arm in ("transformer", "t2mlr"))
    assert base["model"]["arch"] == "transformer" and t2mlr["model"]["arch"] == "t2mlr"
    for section in ("data", "optim", "schedule", "train"):
        assert base[section] == t2mlr[section]


def run_experiment(out: Path, *overrides: str, overwrite: bool = False) -> dict:
    task, tree = load_retrofit("tiny", ("train.device=cpu", *overrides))
    return retrofit.run("tiny", task, tree, out, overwrite=overwrite)


# ------------------------------------------------------------------------------------------ the experiment
def test_tiny_experiment_writes_every_result(pretrained_dir: Path, tmp_path: Path) -> None:
    overrides = (f"model.pretrained={pretrained_dir}", "task.max_length=512", "model.recurrence_mask_policy=mask")
    results = run_experiment(tmp_path / "exp", *overrides)
    out = tmp_path / "exp"
    assert set(results["models"]) == {"base", "transformer", "t2mlr"}
    for arm in ("transformer", "t2mlr"):
        info = results["models"][arm]
        assert info["steps"] == 2 and len(info["losses"]) == 2 and info["tokens_seen"] > 0
        predictions = [json.loads(line) for line in (out / "predictions" / f"{arm}.jsonl").read_text().splitlines()]
        assert len(predictions) == 4
        assert sum(p["correct"] for p in predictions) == info["solved"]
        for metric in ("strict_match", "flexible_extract"):  # every metric, counted from the replies
            assert sum(p["scores"][metric]["correct"] for p in predictions) == info["metrics"][metric]["solved"]
        assert info["solved"] == info["metrics"]["strict_match"]["solved"]  # the headline
    assert results["models"]["transformer"]["tokens_seen"] == results["models"]["t2mlr"]["tokens_seen"]
    assert (out / "retrofit.png").stat().st_size > 0
    assert "finetuned T²MLR retrofit" in (out / "results.md").read_text()
    with pytest.raises(FileExistsError):
        run_experiment(out, *overrides)


def test_seeds_summary_reports_means_spreads_and_gaps() -> None:
    from t2mlr.experiments.retrofit import seeds_summary

    def result(seed: int, base: float, transformer: float, t2mlr: float) -> dict:
        models = {name: {"metrics": {"strict_match": {"accuracy": value}}}
                  for name, value in (("base", base), ("transformer", transformer), ("t2mlr", t2mlr))}
        return {"preset": {"seed": seed}, "models": models}

    table = seeds_summary([result(0, 0.0, 0.2, 0.3), result(1, 0.1, 0.4, 0.3)], "strict_match")
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()}
    assert rows["finetuned base (baseline)"].endswith("| 0.200 | 0.400 | 0.300 | 0.200 |")
    assert rows["T²MLR − baseline"].startswith("| T²MLR − baseline | +0.100 | -0.100 | +0.000 |")
