"""Tiny random decoders shared by the tests (CPU, seconds)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import torch
from torch._inductor.runtime.cache_dir_utils import default_cache_dir
from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from t2mlr import T2MLRCache, T2MLRConfig, T2MLRForCausalLM

VOCAB = 61


def pytest_configure(config: pytest.Config) -> None:
    """One torch thread for the whole suite: the models here are tiny, so a second thread only adds
    synchronisation, and on a shared 2-core CI machine it spin-waits against other processes. Inductor's
    compiled code kept apart per CPU kernel set, before anything compiles (`keep_inductor_cache_per_kernel_set`)."""
    torch.set_num_threads(1)
    keep_inductor_cache_per_kernel_set()


def kernel_set_key() -> str:
    """This process's CPU kernel set (AVX2, AVX512, DEFAULT under ATEN_CPU_CAPABILITY=default, ...) and torch's
    version: what the code inductor generates for the CPU depends on."""
    return f"{torch.backends.cpu.get_cpu_capability()}-torch{torch.__version__}"


def keep_inductor_cache_per_kernel_set() -> None:
    """Point TORCHINDUCTOR_CACHE_DIR (inductor's default, or the one given) at a subfolder named by
    `kernel_set_key`, for this process and the commands it starts: a run forced to AVX2 was once served the
    AVX512 kernels an earlier run had compiled into the shared folder. A folder already keyed is kept."""
    root = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir())
    key = kernel_set_key()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root if root.name == key else root / key)


def tiny_base_config(family: str = "llama", layers: int = 5, hidden: int = 32, **overrides):
    common = dict(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    if family == "qwen3":  # Qwen3Config's head_dim does not follow hidden_size (its default is 128)
        common["head_dim"] = hidden // common["num_attention_heads"]
    common.update(overrides)
    cls = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}[family]
    return cls(**common)


def open_gates(model: T2MLRForCausalLM, cur: float = 0.6, rec: float = -0.9) -> T2MLRForCausalLM:
    """Non-zero γ's so that the recurrence changes the output (at init Φ is the identity)."""
    with torch.no_grad():
        model.fusion.gamma_cur.fill_(cur)
        model.fusion.gamma_rec.fill_(rec)
        model.fusion.w_rec.weight.mul_(20.0)  # make R's contribution large enough to see
    return model


def tiny_model(
    family: str = "llama",
    l_start: int = 2,
    l_end: int = 4,
    dtype: torch.dtype = torch.float64,
    gates: bool = True,
    seed: int = 0,
    base_overrides: dict | None = None,
    **config_kwargs,
) -> T2MLRForCausalLM:
    torch.manual_seed(seed)
    config = T2MLRConfig.from_base(
        tiny_base_config(family, **(base_overrides or {})), l_start=l_start, l_end=l_end, **config_kwargs
    )
    model = T2MLRForCausalLM(config).to(dtype).eval()
    return open_gates(model) if gates else model


@pytest.fixture
def model64() -> T2MLRForCausalLM:
    return tiny_model()


def random_ids(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=generator)


def exact_states(model: T2MLRForCausalLM, ids: torch.Tensor, **inputs) -> torch.Tensor:
    """R after every token of `ids` from the exact path (its values are checked against a hand loop elsewhere);
    `inputs`: further forward arguments (attention_mask, recurrence_mask, ...)."""
    cache = T2MLRCache(config=model.config)
    with torch.no_grad():
        model(ids, past_key_values=cache, use_cache=True, recurrence="exact", **inputs)
    return cache.recurrent_states


def left_padded(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of different lengths, left-padded with pad id 0, and their attention mask."""
    width = max(len(row) for row in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = row
        mask[i, width - len(row):] = 1
    return ids, mask


def torch_threads(count: int) -> AbstractContextManager[None]:
    """torch's CPU thread count set to `count` inside the block, restored after (the arms driver's own)."""
    from t2mlr.training.arms import fixed_threads

    return fixed_threads(count)


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread, and on a shared 2-core machine a second torch thread
    spin-waits against other processes (10x slower runs); restored afterwards for other test files.
    Use with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def one_torch_thread_per_module() -> Iterator[None]:
    """`one_torch_thread` for a whole module, so module-scoped fixtures (a loaded model, a trained run)
    are built on one thread too."""
    with torch_threads(1):
        yield
