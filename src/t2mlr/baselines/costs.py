"""The FLOP model of the comparisons: a decode step and a training step of T²MLR, the plain Transformer,
the looped and the pause-token models and the recurrent (LSTM, GRU, RNN) baselines, computed from their configs
alone.

Counted (2 FLOPs per multiply-add): the decoder blocks' projections and MLP, the attention scores and
weighted sums (2 · 2 · heads · head_dim per query–key pair, causal, so a token at context c attends over
c keys), the LM head at the positions that get logits, and T²MLR's fusion Φ (2 × its linears' weights per
fused token, `fusion_multiply_adds`: 10d² for the paper's Φ, where f_cur and f_rec map 2d → d and W_rec
d → d; each variant of `T2MLRConfig.fusion` its own). Not counted: norms, activations, rotary embeddings, softmax,
embedding lookups and the optimizer step (all linear in the width and small next to the matmuls).

* Decode: `generate()` from one BOS token, n new tokens: step k runs at context k (k = 1 .. n). A looped
  model runs its schedule of L + (K − 1)·D block applications per token, each with its own KV cache; a
  pause model ×P runs P tokens per step through every block, over a P× longer context (P² × the
  attention at equal real context); the LM head runs once per real token in every model.
* Recurrent baselines: every layer's gate blocks (4 LSTM, 3 GRU, 1 RNN) multiply the token's input and the
  previous hidden state by hidden × hidden matrices (2 · 2d² FLOPs per block), then the LM head; a decode step
  is one token, whatever the context.
* Training: forward + backward over a row of N tokens, the backward costing twice the forward of whatever
  carries gradients. T²MLR on the Jacobi path runs its middle block d_forward + 1 times forward but
  back-propagates through the last d_backward iterates and the final pass only (docs/semantics.md §5.2).
  Replay from exact states (and exact-path training with a BPTT window, which replays the states of a
  no-grad token loop) runs it once, plus one input-gradient product per iterate it stands for.

These are predictions of arithmetic, not of time: a CPU or GPU step also pays per-kernel and Python
overheads that grow with the number of block calls, which is what a measurement adds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from transformers import PretrainedConfig

from t2mlr.baselines.looped import LoopedConfig
from t2mlr.baselines.matching import head_dim_of
from t2mlr.baselines.pause import PauseConfig
from t2mlr.baselines.recurrent import RecurrentLMConfig
from t2mlr.model import T2MLRConfig
from t2mlr.model.fusion import fusion_multiply_adds

__all__ = [
    "DecoderShape", "causal_pairs", "decode_flops", "decode_step_flops", "full_pairs", "recurrent_token_flops",
    "replay_middle_flops", "train_step_flops",
]


@dataclass(frozen=True)
class DecoderShape:
    """The widths of a decoder that its FLOPs depend on."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    layers: int
    fusion_multiply_adds: int = 0  # Φ per fused token (a T²MLR config's; 0 for a plain decoder)

    @classmethod
    def of(cls, config: PretrainedConfig) -> DecoderShape:
        """The shape of a plain decoder config, or of the decoder a wrapper config wraps."""
        base = getattr(config, "base_config", None) or config
        return cls(
            hidden=int(base.hidden_size), heads=int(base.num_attention_heads),
            kv_heads=int(getattr(base, "num_key_value_heads", None) or base.num_attention_heads),
            head_dim=head_dim_of(base), intermediate=int(base.intermediate_size), vocab=int(base.vocab_size),
            layers=int(base.num_hidden_layers),
            fusion_multiply_adds=fusion_multiply_adds(config) if isinstance(config, T2MLRConfig) else 0,
        )

    def block_matmuls(self, tokens: float) -> float:
        """Projections (q, k, v, o) and the gated MLP of one block over `tokens` tokens."""
        attention = 2 * self.hidden * self.heads * self.head_dim + 2 * self.hidden * self.kv_heads * self.head_dim
        return 2 * tokens * (attention + 3 * self.hidden * self.intermediate)

    def attention(self, pairs: float) -> float:
        """Scores and weighted sums of one block over `pairs` query–key pairs."""
        return 4 * self.heads * self.head_dim * pairs

    def head(self, tokens: float) -> float:
        return 2 * tokens * self.hidden * self.vocab

    def fusion(self, tokens: float) -> float:
        return 2 * tokens * self.fusion_multiply_adds


def causal_pairs(length: float) -> float:
    """Query–key pairs of causal attention among `length` tokens (what the attention needs)."""
    return length * (length + 1) / 2


def full_pairs(length: float) -> float:
    """Query–key pairs of a full `length` × `length` score matrix (what eager attention computes, masked
    pairs included)."""
    return length * length


Pairs = Callable[[float], float]


def recurrent_token_flops(config: RecurrentLMConfig) -> float:
    """One token through every layer of a recurrent baseline, without the LM head (see the module docstring)."""
    return config.num_layers * config.cell_gates * 4 * config.hidden_size**2


def _recurrent_head(config: RecurrentLMConfig, tokens: float) -> float:
    return 2 * tokens * config.hidden_size * config.vocab_size


def decode_step_flops(config: PretrainedConfig, context: int, pairs: Pairs = causal_pairs) -> float:
    """FLOPs of the decode step that reads the `context`-th real token; `pairs(n)` counts the attention
    pairs among the n tokens a step adds (1, or P for a pause model)."""
    if isinstance(config, RecurrentLMConfig):
        return recurrent_token_flops(config) + _recurrent_head(config, 1)
    shape = DecoderShape.of(config)
    if isinstance(config, PauseConfig):
        period = config.period
        attended = period * (context - 1) * period + pairs(period)  # P queries over the interleaved keys
        return shape.layers * (shape.block_matmuls(period) + shape.attention(attended)) + shape.head(1)
    applications = len(config.block_schedule()) if isinstance(config, LoopedConfig) else shape.layers
    step = applications * (shape.block_matmuls(1) + shape.attention(context)) + shape.head(1)
    if isinstance(config, T2MLRConfig):
        step += shape.fusion(1)
    return step


def decode_flops(config: PretrainedConfig, new_tokens: int, pairs: Pairs = causal_pairs) -> float:
    """FLOPs of generating `new_tokens` tokens from one BOS token (the steps at contexts 1 .. new_tokens)."""
    return sum(decode_step_flops(config, context, pairs) for context in range(1, new_tokens + 1))


def replay_middle_flops(shape: DecoderShape, seq_len: int, middle: int, depth: int,
                        pairs: Pairs = causal_pairs) -> float:
    """Forward + backward of `middle` blocks replayed from exact states (`exact_states=True`): one fused pass,
    one ordinary backward, and `depth` vector-Jacobian products with respect to R. Those products need input
    gradients only: each block's matmuls once, its attention's two products twice, the fusion once."""
    block = shape.block_matmuls(seq_len) + shape.attention(pairs(seq_len))
    state_product = middle * (shape.block_matmuls(seq_len) + 2 * shape.attention(pairs(seq_len))) + shape.fusion(seq_len)
    return 3 * (middle * block + shape.fusion(seq_len)) + depth * state_product


def train_step_flops(config: PretrainedConfig, seq_len: int, pairs: Pairs = causal_pairs) -> float:
    """FLOPs of forward + backward over one row of `seq_len` tokens (T²MLR: on its training path)."""
    if isinstance(config, RecurrentLMConfig):
        return 3 * (seq_len * recurrent_token_flops(config) + _recurrent_head(config, seq_len))
    shape = DecoderShape.of(config)
    if isinstance(config, PauseConfig):
        extended = config.period * seq_len
        blocks = shape.layers * (shape.block_matmuls(extended) + shape.attention(pairs(extended)))
        return 3 * (blocks + shape.head(seq_len))
    block = shape.block_matmuls(seq_len) + shape.attention(pairs(seq_len))
    if isinstance(config, LoopedConfig):
        return 3 * (len(config.block_schedule()) * block + shape.head(seq_len))
    if not isinstance(config, T2MLRConfig) or config.train_recurrence == "off":
        return 3 * (shape.layers * block + shape.head(seq_len))
    middle = config.l_end - config.l_start + 1
    outside = (shape.layers - middle) * block + shape.head(seq_len)
    if config.train_recurrence == "exact" and config.bptt_window is not None:
        # the exact states from a no-grad token-by-token loop (each token attends to the keys before it),
        # then their replay in one pass whose backward is that of `bptt_window` iterates
        loop = middle * (shape.block_matmuls(seq_len) + shape.attention(causal_pairs(seq_len))) + shape.fusion(seq_len)
        return 3 * outside + loop + replay_middle_flops(shape, seq_len, middle, config.bptt_window, pairs)
    if config.train_recurrence == "exact":  # one pass of every block, fused once per token
        return 3 * (outside + middle * block + shape.fusion(seq_len))
    forward_passes, gradient_passes = config.d_forward + 1, config.d_backward + 1
    # the seed pass is the one middle pass without fusion; it carries gradients only when d_backward = d_forward
    seed_has_gradients = config.d_backward == config.d_forward
    gradient_fusions = gradient_passes - (1 if seed_has_gradients else 0)
    forward = outside + forward_passes * middle * block + config.d_forward * shape.fusion(seq_len)
    backward = 2 * (outside + gradient_passes * middle * block + gradient_fusions * shape.fusion(seq_len))
    if not seed_has_gradients:  # the first gradient pass reads a detached R: no input gradient of W_rec r
        backward -= 2 * seq_len * shape.hidden**2
    return forward + backward
