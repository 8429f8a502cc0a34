"""The Jacobi prefill's iterates per request, with `generate()`'s schedule and early stop (docs/semantics.md
§5.2), for the prompt chunks of one vLLM step laid end to end (no vLLM needed here)."""

from __future__ import annotations

import torch


class JacobiIterates:
    """The iterates R⟨k⟩ that the prefill tokens read, per request, with `generate()`'s schedule: the seed,
    refinements up to `depth` iterates in all; from the second iterate on, a request whose states moved by
    no more than `tol` takes one more iterate and stops. A request stops on its own states, never on
    another request's, so its prompt's result does not depend on the batch it shares."""

    def __init__(self, lens: torch.Tensor, r_in: torch.Tensor, device: torch.device) -> None:
        """`lens`: each request's prompt tokens in this chunk (host); `r_in`: each request's R before it."""
        starts = torch.cumsum(lens, 0) - lens
        self.row_of_token = torch.repeat_interleave(torch.arange(len(lens)), lens).to(device)
        self.first = starts.to(device)
        self.previous = (torch.arange(int(lens.sum())) - 1).clamp(min=0).to(device)
        self.r_in = r_in
        self.stop_after = None  # per request: how many iterates it runs (set from the early stop)

    def start(self) -> torch.Tensor:
        """What the seed reads: R before the chunk at each chunk's first token, zero elsewhere."""
        r_read = self.r_in.new_zeros(len(self.previous), self.r_in.shape[-1])
        r_read[self.first] = self.r_in
        return r_read

    def shifted(self, r_out: torch.Tensor) -> torch.Tensor:
        """What each token reads next: its predecessor's R, or the R before the chunk at its first token."""
        r_read = r_out.index_select(0, self.previous)
        r_read[self.first] = self.r_in
        return r_read

    def advance(self, k: int, r_read: torch.Tensor, r_next: torch.Tensor, depth: int,
                tol: float | None) -> torch.Tensor:
        """Take iterate k for the requests still iterating; apply the early stop of iterates 2..depth-1."""
        if self.stop_after is None:
            self.stop_after = torch.full((len(self.first),), depth, device=r_read.device)
        if tol is not None and 2 <= k <= depth - 1:
            moved = (r_next - r_read).abs().amax(dim=-1).double()
            largest = torch.zeros(len(self.first), dtype=torch.float64, device=r_read.device)
            largest.scatter_reduce_(0, self.row_of_token, moved, reduce="amax")
            settled = (largest <= tol) & (self.stop_after == depth)
            self.stop_after = torch.where(settled, torch.full_like(self.stop_after, k + 1), self.stop_after)
        taking = (self.stop_after >= k)[self.row_of_token]
        return torch.where(taking[:, None], r_next, r_read)

    def finished(self, k: int) -> bool:
        return bool((self.stop_after <= k).all())
