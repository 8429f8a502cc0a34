"""The benchmark scripts run end to end at toy sizes (their figures are produced on purpose-sized runs)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from conftest import open_gates, tiny_base_config
from transformers import LlamaForCausalLM

from t2mlr import T2MLRConfig, T2MLRForCausalLM

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def keep_thread_count():
    """The CPU benchmarks pin torch to one thread; the rest of the suite keeps its own setting."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def table_rows(text: str) -> list[list[str]]:
    """Body rows of the markdown table a script prints (its header starts with "| model")."""
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| model")]


def test_prefill_benchmark_runs_and_deep_jacobi_matches_exact(capsys: pytest.CaptureFixture[str]) -> None:
    load_script("prefill").main(["--hidden", "64", "--prompt-length", "8", "--depths", "2,9",
                                 "--placements", "2-3", "--repeats", "1"])
    rows = {row[1]: row for row in table_rows(capsys.readouterr().out)}
    assert set(rows) == {"exact", "off (no recurrence)", "jacobi d=2", "jacobi d=9"}
    assert rows["exact"][0] == "T²MLR(2, 3), hidden 64"
    assert float(rows["jacobi d=9"][5]) <= 1e-4 and float(rows["jacobi d=9"][6]) <= 1e-4  # depth > prompt: exact
    assert float(rows["off (no recurrence)"][5]) > 1e-3  # the recurrence matters, so the check above can fail


def test_decode_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    load_script("decode_overhead").main(["--hidden", "64", "--lengths", "4", "--placements", "2-3", "--repeats", "1"])
    out = capsys.readouterr().out
    (row,) = table_rows(out)
    assert row[:3] == ["T²MLR(2, 3)", "matched Transformer", "4"] and float(row[-1].rstrip("×")) > 0
    assert "proportions at hidden 64" in out


def test_decode_benchmark_times_t2mlr_against_its_own_base_too(capsys: pytest.CaptureFixture[str]) -> None:
    """--plain (issue 45's decode target is against the plain base): one row per reference and length,
    the plain base first; with a static cache every run is sized for the longest length (one compiled shape)."""
    script = load_script("decode_overhead")
    script.main(["--hidden", "64", "--lengths", "3,5", "--placements", "2-3", "--repeats", "1", "--plain",
                 "--cache", "static"])
    rows = table_rows(capsys.readouterr().out)
    assert [row[1:3] for row in rows] == [["plain base", "3"], ["plain base", "5"],
                                          ["matched Transformer", "3"], ["matched Transformer", "5"]]
    assert all(float(row[-1].rstrip("×")) > 0 for row in rows)
    settings = script.decoding_settings(script.parse_args(["--cache", "static", "--lengths", "3,5"]))
    assert settings["max_cache_len"] == 6


@pytest.mark.slow
def test_decode_benchmark_runs_both_models_on_static_caches(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 19's setting: both models decode with preallocated caches (here uncompiled; the compiled step is
    tested in test_compile.py); --compile without a static cache, or static with --models, is refused."""
    script = load_script("decode_overhead")
    script.main(["--hidden", "64", "--lengths", "4", "--placements", "2-3", "--repeats", "1", "--cache", "static",
                 "--profile"])
    out = capsys.readouterr().out
    row = table_rows(out)[0]
    assert row[:3] == ["T²MLR(2, 3)", "matched Transformer", "4"] and float(row[-1].rstrip("×")) > 0
    assert "static cache, compile off" in out
    for name in ("T²MLR(2, 3)", "Transformer (matched)"):  # where the time goes, per model
        profile = out.split(f"### Profile: {name}, 4 new tokens")[1]
        assert "Self CPU" in profile and "aten::" in profile
    for bad in (["--compile", "reduce-overhead"], ["--cache", "static", "--models", "t2mlr:2-3,transformer"]):
        with pytest.raises(SystemExit):
            script.main(bad)
    settings = script.decoding_settings(script.parse_args(["--cache", "static", "--compile", "reduce-overhead"]))
    assert settings["cache_implementation"] == "static" and settings["compile_config"].mode == "reduce-overhead"
    assert settings["compile_config"].fullgraph


@pytest.mark.slow
def test_decode_benchmark_compares_models_with_their_flop_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    load_script("decode_overhead").main(["--hidden", "64", "--lengths", "3", "--repeats", "1",
                                         "--models", "t2mlr:2-3,pause:2,looped:full:2,looped:2-3:3,transformer"])
    rows = {row[0]: row for row in table_rows(capsys.readouterr().out)}
    assert set(rows) == {"T²MLR(2,3)", "pause ×2", "looped full ×2", "looped 2-3 ×3"}  # each against the Transformer
    assert rows["T²MLR(2,3)"][1] == "64" and rows["pause ×2"][1] == rows["looped full ×2"][1] != "64"  # matched width
    for row in rows.values():
        assert row[3] == "3" and float(row[6].rstrip("×")) > 0 and float(row[7].rstrip("×")) > 0
    assert float(rows["looped full ×2"][7].rstrip("×")) > float(rows["looped 2-3 ×3"][7].rstrip("×")) > 1
    with pytest.raises(SystemExit):
        load_script("decode_overhead").main(["--models", "looped:9-22"])


def test_train_benchmark_compares_models_with_their_flop_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    load_script("train_overhead").main(["--hidden", "64", "--layers", "3", "--vocab", "64", "--seq", "8",
                                        "--batch", "1", "--repeats", "1", "--warmup", "0", "--d-forward", "3",
                                        "--d-backward", "2", "--models", "t2mlr:2-3,pause:2,looped:1-2:2"])
    rows = {row[0]: row for row in table_rows(capsys.readouterr().out)}
    assert set(rows) == {"T²MLR(2,3)", "pause ×2", "looped 1-2 ×2"}
    for row in rows.values():
        assert float(row[5].rstrip("×")) > 0 and float(row[6].rstrip("×")) > 1


@pytest.fixture(scope="module")
def corpus_and_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A corpus + BPE tokenizer from text_corpus.py, and a saved T²MLR of its vocabulary with opened gates."""
    root = tmp_path_factory.mktemp("bench")
    source = root / "src"
    source.mkdir()
    for i in range(3):
        (source / f"mod{i}.py").write_text("\n".join(f"def f{j}(x):\n    return x * {j} + {i}" for j in range(40)))
    corpus = root / "corpus"
    load_script("text_corpus").main(["--out", str(corpus), "--source", str(source), "--vocab", "300"])
    assert (corpus / "train.jsonl").read_text().count("\n") == 2 and (corpus / "eval.jsonl").is_file()
    torch.manual_seed(0)
    model = open_gates(T2MLRForCausalLM.from_base(LlamaForCausalLM(tiny_base_config(layers=4, vocab_size=300)), 2, 3))
    model.save_pretrained(root / "ckpt")
    return corpus, root / "ckpt"


def test_prefill_benchmark_on_a_trained_checkpoint(corpus_and_checkpoint, capsys: pytest.CaptureFixture[str]) -> None:
    corpus, checkpoint = corpus_and_checkpoint
    load_script("prefill").main(["--checkpoint", str(checkpoint), "--data", str(corpus / "eval.jsonl"),
                                 "--tokenizer", str(corpus / "tokenizer"), "--prompt-length", "12",
                                 "--depths", "2,20", "--tols", "1e-6", "--repeats", "1"])
    rows = {row[1]: row for row in table_rows(capsys.readouterr().out)}
    assert rows["exact"][0] == "trained T²MLR(2, 3), hidden 32"
    assert float(rows["jacobi d=20"][5]) <= 1e-4 < float(rows["off (no recurrence)"][5])  # depth > prompt: exact
    # position t is exact after t iterations: the cache stops moving after about 12, and the tolerance sees it
    assert rows["jacobi d=20"][4] == "20" and int(rows["jacobi d=20 tol 1e-06"][4]) < 20
    assert float(rows["jacobi d=20 tol 1e-06"][5]) <= 1e-4


@pytest.mark.slow
def test_train_overhead_on_a_trained_checkpoint_with_corpus_data(corpus_and_checkpoint, tmp_path: Path) -> None:
    corpus, checkpoint = corpus_and_checkpoint
    report = tmp_path / "overhead.json"
    load_script("train_overhead").main([
        "--checkpoint", str(checkpoint), "--data", str(corpus / "eval.jsonl"), "--tokenizer", str(corpus / "tokenizer"),
        "--seq", "16", "--batch", "2", "--d-forward", "6", "--d-backward", "2", "--tol", "1e9",
        "--repeats", "1", "--warmup", "0", "--json", str(report),
    ])
    result = json.loads(report.read_text())
    assert result["args"]["hidden"] == "32" and result["args"]["l_start"] == "2"  # taken from the checkpoint
    timing = result["timing"]
    assert timing["t2mlr-fixed"]["jacobi_iterations"] == 6
    # a huge tolerance stops the detached iterations as early as allowed (2), the 2 with gradients still run
    assert timing["t2mlr-tol"]["jacobi_iterations"] == 2 + 2
    for name in ("transformer", "t2mlr-fixed", "t2mlr-tol"):
        assert result["memory_bytes"][name] > 0 and 0 < timing[name]["first_step_loss"] < 20


@pytest.mark.slow
def test_t2mlr_decode_step_traces_as_one_graph(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 19's compiled decode step: dynamo must trace T²MLR's step whole (no host sync, no branch on a
    computed value), as it does the Transformer's; a break reintroduced in the decode path fails here."""
    report = load_script("decode_graphs").main(["--hidden", "32", "--prompt", "5", "--layers", "3",
                                                "--placement", "2-3"])
    by_name = {r["name"]: r for r in report["explain"]}
    assert by_name["T²MLR(2,3), T2MLRCache"]["breaks"] == 0 and by_name["T²MLR(2,3), T2MLRCache"]["graphs"] == 1
    assert by_name["Transformer, StaticCache"]["breaks"] == 0
    static = by_name["T²MLR(2,3), T2MLRStaticCache"]
    assert static["breaks"] == 0 and static["graphs"] == 1
    assert "T²MLR(2,3), T2MLRCache: 1 graph(s), 0 break(s)" in capsys.readouterr().out


def test_explain_reports_a_graph_break() -> None:
    """The check above can fail: a step that reads a computed value into Python is reported as broken."""
    script = load_script("decode_graphs")

    def step() -> torch.Tensor:
        x = torch.randn(3)
        if float(x.sum()) > 0:  # a host sync: dynamo must split the graph here
            return x * 2
        return x - 1

    report = script.explain("branch on a value", step)
    assert report["breaks"] >= 1 and report["graphs"] >= 2


@pytest.mark.slow
def test_exact_solver_benchmark_runs_on_a_random_shape_and_a_checkpoint(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The random 12x256 model, then a saved model reading a task's packed rows: each solver's row with
    its passes, and the logits within the tolerance's order of the loop's."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    script = load_script("exact_solver")
    model = T2MLRForCausalLM(T2MLRConfig.from_base(tiny_base_config(vocab_size=16), l_start=2, l_end=3))
    words = [f"w{i}" for i in range(16)]
    backend = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    model.save_pretrained(tmp_path / "model")
    PreTrainedTokenizerFast(tokenizer_object=backend).save_pretrained(tmp_path / "model")
    rows = tmp_path / "eval.jsonl"
    rows.write_text("\n".join(json.dumps({"input_tokens": words[i: i + 9]}) for i in range(6)))
    out = tmp_path / "solver.json"
    script.main(["--shapes", "12x256", "--checkpoint", str(tmp_path / "model"), "--rows", str(rows), "--tokens", "24",
                 "--rounds", "1", "--chunk", "8", "--json", str(out)])
    table = table_rows(capsys.readouterr().out)
    assert [row[2] for row in table] == ["sequential", "fixed_point", "auto"] * 2
    assert all(float(row[-1]) < 1e-3 for row in table)
    cases = json.loads(out.read_text())["cases"]
    assert cases[str(tmp_path / "model")]["fixed_point"]["chunks"] == 3  # 24 tokens in spans of 8
