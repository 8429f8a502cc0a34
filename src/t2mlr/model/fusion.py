"""The representation fusion Φ and the recurrent-cache update (docs/semantics.md §2–3, paper eq. "gating").

    Φ(h, r) = h + tanh(γ_cur)·σ(f_cur([h; r]))⊙h + tanh(γ_rec)·σ(f_rec([h; r]))⊙(W_rec r)
    R_t     = RMSNorm(h_t + R_{t-1})        (temporal cache residual; R_t = h_t without it)

γ_cur and γ_rec start at 0, so a fresh model computes exactly what its base model computes; they stay
in float32 whatever dtype the rest of the model is cast to, because a bf16 γ near 0 has too little
resolution for the small updates that open the gates (a float64 model keeps float64 γ's).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

LOW_PRECISION = (torch.float16, torch.bfloat16)


class GatedFusion(nn.Module):
    """Φ: mixes the previous token's recurrent cache r into the current token's stream h."""

    gate_names = ("gamma_cur", "gamma_rec")

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.f_cur = nn.Linear(2 * hidden_size, hidden_size, bias=True)
        self.f_rec = nn.Linear(2 * hidden_size, hidden_size, bias=True)
        self.w_rec = nn.Linear(hidden_size, hidden_size, bias=False)
        self.gamma_cur = nn.Parameter(torch.zeros((), dtype=torch.float32))
        self.gamma_rec = nn.Parameter(torch.zeros((), dtype=torch.float32))

    def reset_parameters(self, std: float) -> None:
        """Normal(0, std) linears with zero bias, γ = 0: Φ is the identity until the gates open."""
        for linear in (self.f_cur, self.f_rec, self.w_rec):
            nn.init.normal_(linear.weight, mean=0.0, std=std)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)
        nn.init.zeros_(self.gamma_cur)
        nn.init.zeros_(self.gamma_rec)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> "GatedFusion":
        """Keep γ at least float32 when the module is cast down (`.to(bfloat16)`, `.half()`); a cast to
        float64 (`.double()`) widens it with everything else, so a float64 model is float64 end to end."""
        super()._apply(fn, recurse)
        for name in self.gate_names:
            gate = getattr(self, name)
            if gate.dtype in LOW_PRECISION:
                gate.data = gate.data.float()
        return self

    def forward(self, h: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        hr = torch.cat([h, r], dim=-1)
        g_cur = torch.tanh(self.gamma_cur).to(h.dtype)
        g_rec = torch.tanh(self.gamma_rec).to(h.dtype)
        cur = torch.sigmoid(self.f_cur(hr)) * h
        rec = torch.sigmoid(self.f_rec(hr)) * self.w_rec(r)
        return torch.addcmul(torch.addcmul(h, g_cur, cur), g_rec, rec)  # h + g_cur·cur + g_rec·rec, 2 kernels


class CacheNorm(nn.Module):
    """RMSNorm with a learnable gain (init 1) and the base model's epsilon, computed in at least float32."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * wide.to(x.dtype)
