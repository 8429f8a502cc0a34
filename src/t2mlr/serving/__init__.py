"""Serving T²MLR with vLLM (docs/serving.md).

`plugin.register` is vLLM's entry point (`vllm.general_plugins`): it makes `vllm serve DIR` and
`LLM(DIR)` run a saved T²MLR model with `vllm_model.T2MLRVllmForCausalLM`, which is built from vLLM's own
decoder layers and attention and holds R as vLLM per-request state (`state`). `options` is the prefill
choice (exact or Jacobi), `jacobi` the Jacobi prefill's per-request iterates, `substeps` runs the middle
block on part of a step's batch, `checks` holds what is refused, and `commands` is `t2mlr serve`. Nothing
here is imported by the rest of the library, and vLLM is imported only by the modules that need it.
"""
