"""Word-level tokenizers: vocabulary, splitting, save/load round trip, S5 label alignment."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from t2mlr.tasks.s5 import ALL_TOKENS
from t2mlr.tasks.s5_retrieval import DEFAULT_ALPHABET, generate_s5_retrieval
from t2mlr.tasks.tokenizers import (
    IGNORE_INDEX,
    build_s5_tokenizer,
    build_word_tokenizer,
    encode_s5_sample,
    word_vocab_from_texts,
)


@pytest.fixture(scope="module")
def s5_tok() -> PreTrainedTokenizerFast:
    return build_s5_tokenizer(4)


def test_s5_vocabulary(s5_tok: PreTrainedTokenizerFast) -> None:
    vocab = s5_tok.get_vocab()
    assert len(vocab) == 4 + 2 + 62 + 120
    assert [vocab[t] for t in ("<pad>", "<bos>", "<eos>", "<unk>")] == [0, 1, 2, 3]
    assert (s5_tok.pad_token_id, s5_tok.bos_token_id, s5_tok.eos_token_id, s5_tok.unk_token_id) == (0, 1, 2, 3)
    for symbol in ["|", "_", *DEFAULT_ALPHABET, *ALL_TOKENS]:
        assert s5_tok.tokenize(symbol) == [symbol]


def test_s5_string_split_and_decode(s5_tok: PreTrainedTokenizerFast) -> None:
    text = "<A_32514>F4Nd|<A_54213>____"
    ids = s5_tok(text)["input_ids"]
    assert s5_tok.convert_ids_to_tokens(ids) == ["<A_32514>", "F", "4", "N", "d", "|", "<A_54213>", "_", "_", "_", "_"]
    assert s5_tok.decode(ids) == text
    assert s5_tok("<A_32514> F 4")["input_ids"] == s5_tok("<A_32514>F4")["input_ids"]  # spaces dropped
    assert s5_tok.convert_ids_to_tokens(s5_tok("#")["input_ids"]) == ["<unk>"]


def test_save_load_round_trip(tmp_path, s5_tok: PreTrainedTokenizerFast) -> None:
    sample = generate_s5_retrieval(1, n_range=(3, 3), dict_size=8, seed=0)[0]
    text = "".join(sample["input_tokens"])
    s5_tok.save_pretrained(str(tmp_path))
    loaders = (AutoTokenizer.from_pretrained, PreTrainedTokenizerFast.from_pretrained)
    for loaded in (load(str(tmp_path)) for load in loaders):
        assert loaded.get_vocab() == s5_tok.get_vocab()
        ids = loaded(text)["input_ids"]
        assert ids == s5_tok(text)["input_ids"]
        assert loaded.convert_ids_to_tokens(ids) == sample["input_tokens"]
        assert loaded.decode(ids) == text
        assert (loaded.pad_token_id, loaded.eos_token_id) == (0, 2)


def test_encode_s5_sample_alignment(s5_tok: PreTrainedTokenizerFast) -> None:
    sample = generate_s5_retrieval(1, n_range=(3, 3), dict_size=8, seed=4)[0]
    enc = encode_s5_sample(s5_tok, sample)
    vocab = s5_tok.get_vocab()
    start = sample["score_start"]
    assert enc["input_ids"] == [vocab[t] for t in sample["input_tokens"]]
    assert enc["labels"][:start] == [IGNORE_INDEX] * start
    assert enc["labels"][start:] == [vocab[t] for t in sample["target_tokens"][start:]]
    assert enc["attention_mask"] == [1] * len(enc["input_ids"])
    # Not shifted: at the 2nd action's position the label is the 2nd state, not what follows it.
    second = start + 5
    assert enc["input_ids"][second] == vocab[sample["input_tokens"][second]]
    assert enc["labels"][second] == vocab[sample["target_tokens"][second]]
    assert sample["target_tokens"][second].startswith("<A_")


def test_encode_rejects_unknown_symbols_and_bad_samples(s5_tok: PreTrainedTokenizerFast) -> None:
    sample = generate_s5_retrieval(1, n_range=(1, 1), dict_size=1, seed=0)[0]
    bad = dict(sample, input_tokens=["#"] + sample["input_tokens"][1:])
    with pytest.raises(ValueError, match="missing from the tokenizer"):
        encode_s5_sample(s5_tok, bad)
    with pytest.raises(ValueError, match="lengths differ"):
        encode_s5_sample(s5_tok, dict(sample, target_tokens=sample["target_tokens"][:-1]))


def test_generic_word_tokenizer_longest_match_and_round_trip(tmp_path) -> None:
    prompt = "Variable assignment. Follow the assignments.\na=5\nz=___\nAnswer: |"
    vocab = word_vocab_from_texts([prompt])
    assert "assignments" in vocab and "assignment" in vocab and "\n" in vocab and " " in vocab
    tok = build_word_tokenizer(vocab)
    pieces = tok.tokenize(prompt)
    assert "assignments" in pieces and "___" in pieces
    ids = tok(prompt)["input_ids"]
    assert tok.decode(ids) == prompt
    tok.save_pretrained(str(tmp_path))
    again = AutoTokenizer.from_pretrained(str(tmp_path))
    assert again(prompt)["input_ids"] == ids and again.decode(ids) == prompt
    assert tok.convert_ids_to_tokens(tok("a=Q")["input_ids"]) == ["a", "=", "<unk>"]
    with pytest.raises(ValueError):
        build_word_tokenizer(["<pad>", "x"])
    with pytest.raises(ValueError):
        build_word_tokenizer([])


def test_usable_with_generate(s5_tok: PreTrainedTokenizerFast) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(s5_tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, pad_token_id=s5_tok.pad_token_id,
                         bos_token_id=s5_tok.bos_token_id, eos_token_id=s5_tok.eos_token_id)
    model = LlamaForCausalLM(config).eval()
    batch = s5_tok(["<A_12345>ab|<A_21345>", "<A_12345>|"], padding=True, return_tensors="pt")
    out = model.generate(**batch, max_new_tokens=3, do_sample=False, pad_token_id=s5_tok.pad_token_id)
    assert out.shape == (2, batch["input_ids"].shape[1] + 3)
    assert isinstance(s5_tok.batch_decode(out, skip_special_tokens=True)[0], str)
