"""Truncated backpropagation through Jacobi iterates that all sit at the fixed point, for one forward pass.

Replay (`initial_states=` with `exact_states=True`) starts the Jacobi path from the exact states, e.g. those a
rollout's `generate()` computed. Then every iterate reads the same R and computes the same values: the
forward is one pass of the middle block. Its gradient through d iterates is still well defined: with G the
map R -> R' of one iterate and M the middle block's output at that point, the iterated path's loss gradient is

    dL/dθ = (∂(M, G)/∂θ)ᵀ (g_M, g_R + c_d + ... + c_1),   c_d = (∂(M, G)/∂R)ᵀ (g_M, g_R),   c_(k-1) = (∂G/∂R)ᵀ c_k

because all d iterates (and the final pass) are the same function evaluated at the same point. So one graph,
d vector-Jacobian products with respect to R alone (no weight gradients), and one ordinary backward give
exactly the gradient of d gradient-carrying iterates, which would otherwise need d + 1 forward passes with
their graphs and d + 1 full backward passes.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["FixedPointBackward"]


class FixedPointBackward(torch.autograd.Function):
    """Identity on the middle block's output and written states; its backward adds the cotangent that
    `depth` Jacobi iterates at the fixed point pass back into the states (module docstring).

    `h_end` and `r_written` must be computed, with gradients, from `r_given` (the exact states, a leaf that
    requires grad) by one pass of the middle block."""

    @staticmethod
    def forward(ctx: Any, h_end: torch.Tensor, r_written: torch.Tensor, r_given: torch.Tensor,
                depth: int) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(h_end, r_written, r_given)
        ctx.depth = depth
        return h_end.view_as(h_end), r_written.view_as(r_written)

    @staticmethod
    def backward(ctx: Any, g_h: torch.Tensor | None, g_r: torch.Tensor | None) -> tuple[Any, ...]:
        h_end, r_written, r_given = ctx.saved_tensors
        g_h = torch.zeros_like(h_end) if g_h is None else g_h
        g_r = torch.zeros_like(r_written) if g_r is None else g_r
        carried = _states_vjp((h_end, r_written), r_given, (g_h, g_r))  # c_d: from the final pass
        total = g_r
        for _ in range(ctx.depth - 1):
            total = total + carried
            carried = _states_vjp((r_written,), r_given, (carried,))  # c_(k-1) from c_k: one more iterate back
        return g_h, total + carried, None, None


def _states_vjp(outputs: tuple[torch.Tensor, ...], r_given: torch.Tensor,
                cotangents: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """(∂ outputs / ∂ r_given)ᵀ cotangents, keeping the graph for the next product and the final backward."""
    (grad,) = torch.autograd.grad(outputs, r_given, cotangents, retain_graph=True, allow_unused=True)
    return torch.zeros_like(r_given) if grad is None else grad
