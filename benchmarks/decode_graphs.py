"""Does one decode step compile as a single graph? T²MLR against the plain Transformer (prep for issue 19).

A compiled (CUDA-graph) decode step needs dynamo to trace the step whole: a host sync or a Python branch on
a computed value splits it. This script times nothing, so it runs on a CPU and tells the GPU session what is
left to do before it starts:

1. `torch._dynamo.explain` of one decode step after an eager prefill, with each cache `generate()` uses
   (T²MLR: `T2MLRCache`, and `T2MLRStaticCache` for `cache_implementation="static"`; the Transformer:
   `DynamicCache` and `StaticCache`): graphs, breaks and the reasons of each break;
2. with `--compile N`: N greedy decode steps of T²MLR through `torch.compile(forward, fullgraph=True)`
   against the eager steps, once with each T²MLR cache: whether the tokens agree, the largest logit
   difference, and how many graphs were compiled (the growing `T2MLRCache` changes shapes, so expect the
   first step's graph and one dynamic-shape graph; the static cache: one graph for every step, which is
   what CUDA-graph capture needs).

    python benchmarks/decode_graphs.py                        # explain only: seconds
    python benchmarks/decode_graphs.py --compile 6            # plus the compiled loop: about a minute on a CPU
    python benchmarks/decode_graphs.py --placement 1-4 --prompt 32
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, StaticCache

from t2mlr import T2MLRConfig, T2MLRForCausalLM
from t2mlr.analysis.benchmarking import open_gates, parse_placements
from t2mlr.model.cache import T2MLRCache, T2MLRStaticCache


def base_config(layers: int, hidden: int) -> LlamaConfig:
    return LlamaConfig(vocab_size=128, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=4, head_dim=hidden // 4,
                       max_position_embeddings=512, tie_word_embeddings=True)


def t2mlr_model(base: LlamaConfig, start: int, end: int) -> T2MLRForCausalLM:
    """Random weights with the gates open (γ_cur = -0.5, γ_rec = 0.5), so R changes the output."""
    return open_gates(T2MLRForCausalLM(T2MLRConfig(base_config=base.to_dict(), l_start=start, l_end=end)).eval())


def prefilled_step(model: torch.nn.Module, cache: Any, prompt: torch.Tensor) -> Callable[[], Any]:
    """Prefill `prompt` eagerly into `cache`; return the next step's call (one token, the filled cache)."""
    length = prompt.shape[1]
    with torch.no_grad():
        model(prompt, past_key_values=cache, use_cache=True, cache_position=torch.arange(length))
    token, position = prompt[:, -1:], torch.tensor([length])

    def step() -> Any:
        with torch.no_grad():
            return model(token, past_key_values=cache, use_cache=True, cache_position=position,
                         position_ids=position[None].expand(prompt.shape[0], 1))
    return step


def explain(name: str, step: Callable[[], Any]) -> dict[str, Any]:
    """Graphs and breaks of one call of `step`, printed and returned."""
    torch._dynamo.reset()
    report = torch._dynamo.explain(step)()
    reasons = [str(b.reason).splitlines()[0][:160] for b in report.break_reasons]
    print(f"\n== {name}: {report.graph_count} graph(s), {report.graph_break_count} break(s)")
    for i, reason in enumerate(dict.fromkeys(reasons), 1):
        print(f"  {i}. {reason}  (×{reasons.count(reason)})")
    return {"name": name, "graphs": report.graph_count, "breaks": report.graph_break_count, "reasons": reasons}


def t2mlr_cache(model: T2MLRForCausalLM, static: bool, length: int) -> T2MLRCache | T2MLRStaticCache:
    """The cache generate() would give T²MLR: growing, or preallocated for `length` tokens."""
    return T2MLRStaticCache(model.config, max_cache_len=length) if static else T2MLRCache(config=model.config)


def greedy_steps(model: T2MLRForCausalLM, forward: Callable[..., Any], prompt: torch.Tensor,
                 steps: int, static: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager exact prefill, then `steps` greedy decode steps through `forward`: tokens and their logits."""
    cache = t2mlr_cache(model, static, prompt.shape[1] + steps)
    with torch.no_grad():
        token = model(prompt, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
        tokens, logits = [token], []
        for _ in range(steps):
            out = forward(token, past_key_values=cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
            tokens.append(token)
            logits.append(out.logits)
    return torch.cat(tokens, dim=1), torch.cat(logits, dim=1)


def compiled_against_eager(model: T2MLRForCausalLM, prompt: torch.Tensor, steps: int,
                           static: bool = False) -> dict[str, Any]:
    """Compiled greedy steps on one cache kind against eager steps on the growing T2MLRCache."""
    from torch._dynamo.utils import counters

    eager_tokens, eager_logits = greedy_steps(model, model.forward, prompt, steps)
    torch._dynamo.reset()
    counters.clear()
    tokens, logits = greedy_steps(model, torch.compile(model.forward, fullgraph=True), prompt, steps, static)
    result = {"cache": type(t2mlr_cache(model, static, 1)).__name__, "steps": steps,
              "tokens_equal": bool(torch.equal(tokens, eager_tokens)),
              "max_abs_logit_diff": float((logits - eager_logits).abs().max()),
              "graphs": int(counters["stats"]["unique_graphs"])}
    print(f"\n== compiled decode (fullgraph), {result['cache']}, {steps} steps: tokens equal {result['tokens_equal']}, "
          f"max |Δlogit| {result['max_abs_logit_diff']:.2e}, {result['graphs']} graph(s) compiled")
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--placement", default="2-3", help="l_start-l_end of the T²MLR model (1-based)")
    parser.add_argument("--prompt", type=int, default=12, help="prompt tokens prefilled before the step")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--compile", type=int, default=0, metavar="N",
                        help="also compare N compiled decode steps with eager ones (0: skip)")
    args = parser.parse_args(argv)
    ((start, end),) = parse_placements(args.placement)
    torch.manual_seed(0)
    base = base_config(args.layers, args.hidden)
    plain, t2mlr = LlamaForCausalLM(base).eval(), t2mlr_model(base, start, end)
    prompt = torch.randint(0, base.vocab_size, (args.batch, args.prompt))
    static = StaticCache(config=base, max_cache_len=args.prompt + 8)
    report = {"explain": [
        explain("Transformer, StaticCache", prefilled_step(plain, static, prompt)),
        explain("Transformer, DynamicCache", prefilled_step(plain, DynamicCache(config=base), prompt)),
        explain(f"T²MLR({start},{end}), T2MLRCache", prefilled_step(t2mlr, T2MLRCache(config=base), prompt)),
        explain(f"T²MLR({start},{end}), T2MLRStaticCache",
                prefilled_step(t2mlr, T2MLRStaticCache(base, max_cache_len=args.prompt + 8), prompt)),
    ]}
    if args.compile:
        report["compiled"] = [compiled_against_eager(t2mlr, prompt, args.compile, static) for static in (False, True)]
    return report


if __name__ == "__main__":
    main()
