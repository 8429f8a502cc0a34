"""The representation fusion Φ and the recurrent-cache update (docs/semantics.md §2–3, paper eq. "gating").

The paper's Φ (`GatedFusion`, config `fusion="gated"`, the default):

    Φ(h, r) = h + tanh(γ_cur)·σ(f_cur([h; r]))⊙h + tanh(γ_rec)·σ(f_rec([h; r]))⊙(W_rec r)
    R_t     = RMSNorm(h_t + R_{t-1})        (temporal cache residual; R_t = h_t without it)

γ_cur and γ_rec start at 0, so a fresh model computes exactly what its base model computes; they stay
in float32 whatever dtype the rest of the model is cast to, because a bf16 γ near 0 has too little
resolution for the small updates that open the gates (a float64 model keeps float64 γ's).

The variants beside it (`FUSIONS`, one class each, chosen by `T2MLRConfig.fusion`; r below is R after the
optional `fusion_r_norm` RMSNorm, and every variant still writes R the same way):

    none                h
    constant            h + c·W_rec r                               (c = fusion_weight, fixed)
    concat              W [h; r]                                    (W starts as [I | 0])
    variance_normalized √(1−α)⊙h + √α⊙(W_rec r),   α = σ(f_alpha([h; r]))
    alpha_coupled       (1−α)⊙h + α⊙(W_rec r),     α = σ(f_alpha([h; r]))
    recurrent_only      W_rec r, or h where R is exactly 0 (the state before a document's first token)
    bottleneck          h + tanh(γ_rec)·LayerNorm(W_up GELU(W_down r))

`fusion_gate="mlp"` makes each gate projection (f_cur, f_rec, f_alpha) Linear(2d→d)·SiLU·Linear(d→d).
`starts_as_base_model` says whether a fresh fusion is the identity (a retrofit keeps its base model's
outputs); `from_base` refuses the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

LOW_PRECISION = (torch.float16, torch.bfloat16)
ALPHA_EPS = 1e-4  # α is kept in [ε, 1−ε] so that √α and √(1−α) have finite gradients


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


@dataclass(frozen=True)
class StateUpdate:
    """How a token writes R after block l_end (docs/semantics.md §3), from the config's cache fields:

        R_t = norm(h_t + w·R_{t-1})   with the temporal residual (`cache_residual`, the paper's: w = 1, norm
                                      the RMSNorm `cache_norm`; `cache_post_norm=False` drops the norm)
        R_t = h_t                     without it

    `cache_residual_weight` is w; `cache_residual_detach` stops the gradient through the residual's R_{t-1};
    `state_detach` writes R_t without gradient, so no gradient crosses from one token to the next through R
    (Φ still learns from the R it reads)."""

    residual: bool = True
    weight: float = 1.0
    detach_residual: bool = False
    detach: bool = False
    normed: bool = True  # the RMSNorm after the residual (a module of its own, `cache_norm`, which the model holds)

    @classmethod
    def of(cls, config: Any) -> "StateUpdate":
        return cls(
            residual=config.cache_residual, weight=float(getattr(config, "cache_residual_weight", 1.0)),
            detach_residual=getattr(config, "cache_residual_detach", False),
            detach=getattr(config, "state_detach", False),
            normed=config.cache_residual and getattr(config, "cache_post_norm", True),
        )

    def __call__(self, h_end: torch.Tensor, r_prev: torch.Tensor, norm: nn.Module | None) -> torch.Tensor:
        written = h_end
        if self.residual:
            prev = r_prev.detach() if self.detach_residual else r_prev
            written = h_end + prev if self.weight == 1.0 else h_end + self.weight * prev
        if norm is not None:
            written = norm(written)
        return written.detach() if self.detach else written


def gate_projection(hidden_size: int, kind: str) -> nn.Module:
    """The map [h; r] (2d) → gate logits (d): one linear, or a two-layer SiLU MLP of width d."""
    if kind == "linear":
        return nn.Linear(2 * hidden_size, hidden_size, bias=True)
    return nn.Sequential(
        nn.Linear(2 * hidden_size, hidden_size, bias=True), nn.SiLU(), nn.Linear(hidden_size, hidden_size, bias=True)
    )


class Fusion(nn.Module):
    """What every Φ shares: the optional RMSNorm of R before fusion, the scalar gates kept in float32 and the
    initialisation (linears ~ N(0, std) with zero bias, scalar gates 0)."""

    gate_names: tuple[str, ...] = ()  # scalar gates γ, applied as tanh(γ); logged, plotted, not weight-decayed
    starts_as_base_model = True  # a fresh Φ is the identity in h

    def __init__(self, hidden_size: int, r_norm_eps: float | None = None) -> None:
        super().__init__()
        self.r_norm = CacheNorm(hidden_size, r_norm_eps) if r_norm_eps is not None else None
        # transformers skips `_init_weights` of a custom-code model's module whose own parameters are all marked
        # initialised, which a Φ without parameters of its own (only submodules) always looks like: this empty,
        # unsaved buffer is never marked, so every Φ gets its own start. (`reset_parameters` uses only the
        # `nn.init` functions transformers guards, so it leaves loaded weights alone.)
        self.register_buffer("init_marker", torch.empty(0), persistent=False)

    def read(self, r: torch.Tensor) -> torch.Tensor:
        """R as the fusion sees it: normalised when the config asks for `fusion_r_norm`."""
        return r if self.r_norm is None else self.r_norm(r)

    def reset_parameters(self, std: float) -> None:
        """Normal(0, std) linears with zero bias, γ = 0, the R norm's gain 1."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        for name in self.gate_names:
            nn.init.zeros_(getattr(self, name))
        if self.r_norm is not None:
            nn.init.ones_(self.r_norm.weight)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> "Fusion":
        """Keep γ at least float32 when the module is cast down (`.to(bfloat16)`, `.half()`); a cast to
        float64 (`.double()`) widens it with everything else, so a float64 model is float64 end to end."""
        super()._apply(fn, recurse)
        for name in self.gate_names:
            gate = getattr(self, name)
            if gate.dtype in LOW_PRECISION:
                gate.data = gate.data.float()
        return self


def scalar_gate() -> nn.Parameter:
    return nn.Parameter(torch.zeros((), dtype=torch.float32))


class GatedFusion(Fusion):
    """Φ: mixes the previous token's recurrent cache r into the current token's stream h (the paper's)."""

    gate_names = ("gamma_cur", "gamma_rec")

    def __init__(self, hidden_size: int, gate: str = "linear", r_norm_eps: float | None = None) -> None:
        super().__init__(hidden_size, r_norm_eps)
        self.f_cur = gate_projection(hidden_size, gate)
        self.f_rec = gate_projection(hidden_size, gate)
        self.w_rec = nn.Linear(hidden_size, hidden_size, bias=False)
        self.gamma_cur = scalar_gate()
        self.gamma_rec = scalar_gate()

    def forward(self, h: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        r = self.read(r)
        hr = torch.cat([h, r], dim=-1)
        g_cur = torch.tanh(self.gamma_cur).to(h.dtype)
        g_rec = torch.tanh(self.gamma_rec).to(h.dtype)
        cur = torch.sigmoid(self.f_cur(hr)) * h
        rec = torch.sigmoid(self.f_rec(hr)) * self.w_rec(r)
        return torch.addcmul(torch.addcmul(h, g_cur, cur), g_rec, rec)  # h + g_cur·cur + g_rec·rec, 2 kernels


class NoFusion(Fusion):
    """The stream passes unchanged (R is still written and carried): the recurrence without its read."""

    def forward(self, h: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return h


class ConstantFusion(Fusion):
    """h + c·W_rec r with a fixed scalar c (`fusion_weight`); not the identity at init unless c = 0."""

    starts_as_base_model = False  # unless c = 0 (`starts_as_base_model`)

    def __init__(self, hidden_size: int, weight: float, r_norm_eps: float | None = None) -> None:
        super().__init__(hidden_size, r_norm_eps)
        self.w_rec = nn.Linear(hidden_size, hidden_size, bias=False)
        self.scale = float(weight)

    def forward(self, h: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return h + self.scale * self.w_rec(self.read(r))


class ConcatFusion(Fusion):
    """W [h; r] with W (d × 2d, no bias) initialised to [I | 0], so a fresh one passes h unchanged."""

    def __init__(self, hidden_size: int, r_norm_eps: float | None = None) -> None:
        super().__init__(hidden_size, r_norm_eps)
        self.proj = nn.Linear(2 * hidden_size, hidden_size, bias=False)

    def reset_parameters(self, std: float) -> None:
        super().reset_parameters(std)
        nn.init.eye_(self.proj.weight)  # a (d, 2d) "identity": [I | 0]

    def forward(self, h: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.cat([h, self.read(r)], dim=-1))


class AlphaFusion(Fusion):
    """w_in(α)⊙h + w_rec(α)⊙(W_rec r) with a learned per-channel α = σ(f_alpha([h; r])) (computed in at
    least float32 and kept in [ε, 1−ε]); subclasses say how α weighs the two branches."""

    starts_as_base_model = False  # α ≈ ½ at init

    def __init__(self, hidden_size: int, gate: str = "linear", r_norm_eps: float | None = None) -> None:
        super().__init__(hidden_size, r_norm_eps)
        self.f_alpha = gate_projection(hidden_size, gate)
        self.w_rec = nn.Linear(hidden_size, hidden_size, bias=False)

    def weights(self, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight of h, weight of W_rec r)."""
        raise NotImplementedError

    def forward(self, h: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        r = self.read(r)
        logits = self.f_alpha(torch.cat([h, r], dim=-1))
        alpha = torch.sigmoid(logits.to(torch.promote_types(logits.dtype, torch.float32)))
        w_in, w_rec = self.weights(alpha.clamp(ALPHA_EPS, 1.0 - ALPHA_EPS))
        return w_in.to(h.dtype) * h + w_rec.to(h.dtype) * self.w_rec(r)


class VarianceNormalizedFusion(AlphaFusion):
    """w_in = √(1−α), w_rec = √α: for unit-variance independent branches the output keeps unit variance."""

    def weights(self, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.sqrt(1.0 - alpha), torch.sqrt(alpha)


class AlphaCoupledFusion(AlphaFusion):
    """w_in = 1−α, w_rec = α: a convex combination of the two branches."""

    def weights(self, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return 1.0 - alpha, alpha


class RecurrentOnlyFusion(Fusion):
    """Coconut-like: the stream at l_start is W_rec r and the token's own h is dropped, except where R is
    exactly 0 (the state a document starts from, and padding before it), where nothing recurs yet and the
    token keeps h. Not the identity at init."""

    starts_as_base_model = False

    def __init__(self, hidden_size: int, r_norm_eps: float | None = None) -> None:
        super().__init__(hidden_size, r_norm_eps)
        self.w_rec = nn.Linear(hidden_size, hidden_size, bias=False)

    def forward(self, h: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        empty = (r == 0).all(dim=-1, keepdim=True)
        return torch.where(empty, h, self.w_rec(self.read(r)))


class BottleneckFusion(Fusion):
    """CODI-like: h + tanh(γ_rec)·LayerNorm(W_up GELU(W_down r)), a width-b bottleneck MLP of R and a
    LayerNorm, added to the stream behind a scalar gate that starts at 0 (the identity at init)."""

    gate_names = ("gamma_rec",)

    def __init__(self, hidden_size: int, bottleneck: int, eps: float, r_norm_eps: float | None = None) -> None:
        super().__init__(hidden_size, r_norm_eps)
        self.w_down = nn.Linear(hidden_size, bottleneck, bias=False)
        self.w_up = nn.Linear(bottleneck, hidden_size, bias=False)
        self.norm = nn.LayerNorm(hidden_size, eps=eps)
        self.gamma_rec = scalar_gate()

    def forward(self, h: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        lifted = self.norm(self.w_up(nn.functional.gelu(self.w_down(self.read(r)))))
        return h + torch.tanh(self.gamma_rec).to(h.dtype) * lifted


FUSIONS: dict[str, type[Fusion]] = {
    "gated": GatedFusion,
    "none": NoFusion,
    "constant": ConstantFusion,
    "concat": ConcatFusion,
    "variance_normalized": VarianceNormalizedFusion,
    "alpha_coupled": AlphaCoupledFusion,
    "recurrent_only": RecurrentOnlyFusion,
    "bottleneck": BottleneckFusion,
}

GATE_PROJECTED = (GatedFusion, AlphaFusion)  # the variants whose gate projection `fusion_gate` shapes


def build_fusion(config: Any) -> Fusion:
    """The Φ a T²MLR config names (`fusion`, `fusion_gate`, `fusion_r_norm`, `fusion_weight`,
    `fusion_bottleneck`), for the library's model and the vLLM plugin alike."""
    d = config.hidden_size
    eps = getattr(config.base_config, "rms_norm_eps", 1e-6)
    r_norm_eps = eps if getattr(config, "fusion_r_norm", False) else None
    kind = getattr(config, "fusion", "gated")
    gate = getattr(config, "fusion_gate", "linear")
    if issubclass(FUSIONS[kind], GATE_PROJECTED):
        return FUSIONS[kind](d, gate=gate, r_norm_eps=r_norm_eps)
    if kind == "constant":
        return ConstantFusion(d, config.fusion_weight, r_norm_eps=r_norm_eps)
    if kind == "bottleneck":
        return BottleneckFusion(d, bottleneck_width(config), eps, r_norm_eps=r_norm_eps)
    return FUSIONS[kind](d, r_norm_eps=r_norm_eps)


def bottleneck_width(config: Any) -> int:
    """The `bottleneck` variant's width: `fusion_bottleneck`, or a quarter of the hidden size."""
    width = getattr(config, "fusion_bottleneck", None)
    return max(1, config.hidden_size // 4) if width is None else int(width)


def fusion_multiply_adds(config: Any) -> int:
    """Multiply-adds Φ does per fused token: every linear of the config's Φ runs once per token, so this is
    the number of their weights (5d² for the paper's Φ)."""
    return sum(m.weight.numel() for m in built_on_meta(config).modules() if isinstance(m, nn.Linear))


def built_on_meta(config: Any) -> Fusion:
    """The config's Φ on the meta device (nothing allocated): to read its shape and traits."""
    with torch.device("meta"):
        return build_fusion(config)


def starts_as_base_model(fusion: str, weight: float) -> bool:
    """Whether a fresh Φ of this variant (and `fusion_weight`) is the identity in h."""
    return FUSIONS[fusion].starts_as_base_model or (fusion == "constant" and weight == 0)


def check_retrofit_fusion(fusion: str, weight: float = 0.0) -> None:
    """A retrofit promises the base model's outputs until training opens the fusion; a Φ that is not the
    identity when fresh would break that promise from step 0, so it is refused before anything is built."""
    if fusion in FUSIONS and not starts_as_base_model(fusion, weight):
        starts = [name for name, kind in FUSIONS.items() if kind.starts_as_base_model]
        starts.append("constant with fusion_weight=0")
        raise ValueError(
            f"fusion={fusion!r} is not the identity when fresh, so a retrofit would not start as its base model: "
            f"retrofit with one that is ({', '.join(starts)}), or train the variant from scratch (model.base, or "
            "T2MLRForCausalLM(T2MLRConfig.from_base(...)))"
        )
