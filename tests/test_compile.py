"""`torch.compile` captures a whole forward in one graph (`fullgraph=True` raises on any graph break) and
the compiled model computes what the eager one computes.

The aot_eager backend traces exactly what inductor would get (Dynamo's graph and AOTAutograd's joint
graph) without generating kernels, so these tests take seconds on a CPU. Float64 models: the compiled
and eager runs execute the same operations, so any difference beyond rounding means the traced graph
took another branch than eager did.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import kernel_set_key, random_ids, tiny_model

from t2mlr.model import T2MLRCache, T2MLRForCausalLM

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOL = 1e-10


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    """Each test starts and leaves with empty Dynamo caches (no recompile limit carried over)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def small_model(gates: bool = True, **config_kwargs) -> T2MLRForCausalLM:
    """Three blocks with T²MLR(2,2): a prefix, a middle and a suffix block, the least that exercises
    every part of a forward (and keeps compile times to seconds)."""
    return tiny_model(l_start=2, l_end=2, gates=gates, base_overrides=dict(num_hidden_layers=3), **config_kwargs)


def compiled(fn):
    return torch.compile(fn, backend="aot_eager", fullgraph=True)


def left_padded(ids: torch.Tensor, pads: int) -> torch.Tensor:
    mask = torch.ones_like(ids)
    mask[0, :pads] = 0
    return mask


@pytest.mark.slow
def test_jacobi_forward_is_one_graph_with_the_eager_outputs() -> None:
    model = small_model()
    ids = random_ids(2, 6)
    mask = left_padded(ids, 2)  # padding: R crosses it with a gather, and the packed-row mask is in play

    def forward(ids: torch.Tensor, mask: torch.Tensor):
        return model(ids, attention_mask=mask, recurrence="jacobi", d_forward=4, d_backward=1)

    with torch.no_grad():
        eager, graph = forward(ids, mask), compiled(forward)(ids, mask)
    torch.testing.assert_close(graph.logits, eager.logits, rtol=0, atol=TOL)
    torch.testing.assert_close(graph.recurrent_state, eager.recurrent_state, rtol=0, atol=TOL)
    assert eager.jacobi_iterations == graph.jacobi_iterations == 4


@pytest.mark.slow
def test_jacobi_early_stop_runs_on_the_device_with_the_eager_iterates() -> None:
    """With jacobi_tol the detached loop stops once R settles: eager reads the largest move back to the
    host, the compiled graph tests it inside a while_loop. Both must stop at the same iterate."""
    model = small_model(gates=False, cache_residual=False)  # R_t = h_t: R moves only through the gates,
    with torch.no_grad():  # which are opened gently, so the iterates settle geometrically
        model.fusion.gamma_cur.fill_(0.3)
        model.fusion.gamma_rec.fill_(0.5)
    ids = random_ids(2, 10)
    depth, tol = 12, 1e-5

    def forward(ids: torch.Tensor):
        return model(ids, recurrence="jacobi", d_forward=depth, d_backward=1, jacobi_tol=tol)

    with torch.no_grad():
        eager, graph = forward(ids), compiled(forward)(ids)
    assert 3 < eager.jacobi_iterations < depth  # the early stop fired, after the first two iterates
    assert int(graph.jacobi_iterations) == eager.jacobi_iterations
    torch.testing.assert_close(graph.logits, eager.logits, rtol=0, atol=TOL)


@pytest.mark.slow
def test_training_forward_is_one_graph_and_its_gradients_match() -> None:
    model = small_model().train()
    ids = random_ids(2, 6)

    def loss(ids: torch.Tensor) -> torch.Tensor:
        return model(ids, labels=ids, recurrence="jacobi", d_forward=3, d_backward=2).loss

    gradients = []
    for fn in (loss, compiled(loss)):
        model.zero_grad()
        value = fn(ids)
        value.backward()
        gradients.append((value.detach(), [p.grad.clone() for p in model.parameters()]))
    (eager_loss, eager_grads), (graph_loss, graph_grads) = gradients
    torch.testing.assert_close(graph_loss, eager_loss, rtol=0, atol=TOL)
    for eager_grad, graph_grad in zip(eager_grads, graph_grads):
        torch.testing.assert_close(graph_grad, eager_grad, rtol=0, atol=TOL)


def _prefilled_cache(model: T2MLRForCausalLM, ids: torch.Tensor, mask: torch.Tensor) -> T2MLRCache:
    cache = T2MLRCache(config=model.config)
    with torch.no_grad():
        model(ids, attention_mask=mask, past_key_values=cache, recurrence="exact")
    return cache


@pytest.mark.slow
def test_decode_steps_with_a_t2mlr_cache_are_one_graph_each() -> None:
    """One-token steps continue an eagerly prefilled cache; the compiled step appends keys, values and R
    to its cache exactly as the eager step does (recompiles for the growing cache are allowed)."""
    model = small_model()
    prompt = random_ids(2, 5)
    mask = left_padded(prompt, 2)
    eager_cache, graph_cache = _prefilled_cache(model, prompt, mask), _prefilled_cache(model, prompt, mask)

    def step(token: torch.Tensor, mask: torch.Tensor, cache: T2MLRCache):
        return model(token, attention_mask=mask, past_key_values=cache, use_cache=True).logits

    compiled_step = compiled(step)
    with torch.no_grad():
        for k in range(3):
            token = random_ids(2, 1, seed=10 + k)
            mask = torch.cat([mask, torch.ones_like(token)], dim=1)
            torch.testing.assert_close(compiled_step(token, mask, graph_cache), step(token, mask, eager_cache),
                                       rtol=0, atol=TOL)
    assert graph_cache.get_seq_length() == eager_cache.get_seq_length() == 8
    torch.testing.assert_close(graph_cache.recurrent_states, eager_cache.recurrent_states, rtol=0, atol=TOL)


@pytest.mark.slow
def test_exact_chunk_continuing_a_cache_compiles() -> None:
    """A multi-token chunk after a cache (chunked prefill, assisted decoding's verification chunk) is
    never a packed row; under compile it must not be taken for one (which raised before)."""
    model = small_model()
    ids = random_ids(2, 7)
    full_mask = torch.ones_like(ids)

    def chunk(ids: torch.Tensor, mask: torch.Tensor, cache: T2MLRCache):
        return model(ids, attention_mask=mask, past_key_values=cache, recurrence="exact").logits

    results = []
    for fn in (chunk, compiled(chunk)):
        cache = _prefilled_cache(model, ids[:, :4], full_mask[:, :4])
        with torch.no_grad():
            results.append(fn(ids[:, 4:], full_mask, cache))
    torch.testing.assert_close(results[1], results[0], rtol=0, atol=TOL)
    with torch.no_grad():  # and the chunk continues the prefix exactly as one exact pass would
        whole = model(ids, recurrence="exact").logits[:, 4:]
    torch.testing.assert_close(results[1], whole, rtol=0, atol=1e-9)


def test_static_cache_decoding_compiles_once_for_every_step() -> None:
    """`generate(cache_implementation="static")` with a compile config (issue 19's CUDA-graph decoding, here
    on the CPU): every decode step, of this call and of the next with the same shapes, runs one graph
    traced once, and the tokens and logits are those of eager decoding with the growing T2MLRCache."""
    from torch._dynamo.utils import counters
    from transformers import CompileConfig

    model = small_model()
    prompt = random_ids(2, 5)
    mask = left_padded(prompt, 2)
    settings = {"attention_mask": mask, "max_new_tokens": 5, "do_sample": False, "pad_token_id": 0,
                "eos_token_id": None, "return_dict_in_generate": True, "output_logits": True}
    eager = model.generate(prompt, **settings)
    config = CompileConfig(backend="aot_eager", fullgraph=True, dynamic=False)
    config._compile_all_devices = True  # transformers compiles generate()'s step on accelerators only otherwise
    counters.clear()
    for _ in range(2):
        out = model.generate(prompt, cache_implementation="static", compile_config=config, **settings)
        assert torch.equal(out.sequences, eager.sequences)
        torch.testing.assert_close(torch.stack(out.logits), torch.stack(eager.logits), rtol=0, atol=TOL)
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graph_decoding_with_a_static_cache_matches_eager() -> None:
    """On a GPU, generate() captures the static-cache decode step as a CUDA graph (reduce-overhead); the
    tokens are those of eager decoding with T2MLRCache and the logits agree to float32 rounding."""
    from transformers import CompileConfig

    model = small_model().to(device="cuda", dtype=torch.float32)
    prompt = random_ids(2, 5).cuda()
    mask = left_padded(prompt, 2)
    settings = {"attention_mask": mask, "max_new_tokens": 8, "do_sample": False, "pad_token_id": 0,
                "eos_token_id": None, "return_dict_in_generate": True, "output_logits": True}
    eager = model.generate(prompt, **settings)
    config = CompileConfig(fullgraph=True, dynamic=False, mode="reduce-overhead")
    for _ in range(2):  # the second call replays the captured graph
        out = model.generate(prompt, cache_implementation="static", compile_config=config, **settings)
        assert torch.equal(out.sequences, eager.sequences)
        torch.testing.assert_close(torch.stack(out.logits), torch.stack(eager.logits), rtol=0, atol=1e-4)


# A fresh process that keys inductor's cache the way conftest does, compiles a small function with inductor
# (C++ kernels for this CPU) and prints its kernel set and the folder inductor used.
COMPILE_ONCE = """
import sys, torch
sys.path.insert(0, sys.argv[1])
import conftest
conftest.keep_inductor_cache_per_kernel_set()
from torch._inductor.runtime.cache_dir_utils import cache_dir
torch.compile(lambda x: torch.sin(x) * 2 + 1)(torch.randn(64))
print(torch.backends.cpu.get_cpu_capability(), cache_dir())
"""


def compile_in_a_fresh_process(root: Path, capability: str | None) -> tuple[str, Path]:
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(root)
    if capability is not None:
        env["ATEN_CPU_CAPABILITY"] = capability
    done = subprocess.run([sys.executable, "-c", COMPILE_ONCE, str(Path(__file__).parent)], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    kernels, folder = done.stdout.split()
    return kernels, Path(folder)


@pytest.mark.slow
def test_inductor_keeps_compiled_code_apart_per_cpu_kernel_set(tmp_path: Path) -> None:
    """The test session's inductor cache is a folder of its own kernel set and torch version (conftest), so a
    run forced onto other kernels (ATEN_CPU_CAPABILITY) never loads code compiled for these: two processes
    sharing one cache root, one on the CPU's own kernels and one on the plain default ones, each compile into
    their own folder."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    assert Path(cache_dir()).name == kernel_set_key()
    assert kernel_set_key() == f"{torch.backends.cpu.get_cpu_capability()}-torch{torch.__version__}"
    native, native_folder = compile_in_a_fresh_process(tmp_path, None)
    default, default_folder = compile_in_a_fresh_process(tmp_path, "default")
    if native == default:
        pytest.skip(f"this CPU has only the {default} kernels: there is no other set to keep apart")
    assert native_folder == tmp_path / f"{native}-torch{torch.__version__}"
    assert default_folder == tmp_path / f"DEFAULT-torch{torch.__version__}"
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([native_folder.name, default_folder.name])
    for folder in (native_folder, default_folder):
        assert any(path.suffix == ".so" for path in folder.rglob("*")), f"nothing compiled into {folder}"
