"""Size a training run before it is bought: parameters, memory per device, FLOPs, time and the launch line.

`size_run(cfg, devices, gpu)` builds the configured model on the meta device (no weights are allocated),
reads its parameter layout and its training forward path, and puts the trainer's own choices beside them:
fp32 weights and AdamW state, bf16 autocast on a GPU (train.precision auto or bf16), one process, DDP
replicas or FSDP2 shards over `devices`, gradient accumulation over micro-batches. An experiment sizes each
of its arms by handing each arm's `TrainConfig` to `size_run` (or to `estimate_memory` for memory only).

Memory is counted for the peak of a step: the start of the backward pass of a micro-batch after the first,
when the gradients of the earlier micro-batches are held (one micro-batch: an upper bound by at most the
gradients, which then grow as the activations are freed). Per device:

* weights, gradients and AdamW's two moments, all float32 (4 + 4 + 8 bytes per parameter). DDP keeps a
  replica and a second copy of the gradients in its all-reduce buckets. FSDP2 shards weights and optimizer
  state over the devices but keeps *unsharded* gradients across accumulation micro-steps (the trainer turns
  gradient sync off until the last one; FSDP2 then accumulates unsharded gradients), and holds gathered: the
  root module's parameters (embeddings, head, fusion), the blocks that run several times per step (not
  resharded after forward: T²MLR's middle block, a looped model's loop), and two other blocks in flight
  (the one computing and the prefetched one).
* under bf16 autocast, a bf16 copy of every linear weight: autocast casts each weight once per forward and
  the linear layers keep the cast for their backward.
* activations: the tensors autograd saves, counted op by op for a Llama-family decoder layer (Llama,
  Mistral, Qwen2, Qwen3's q/k norms) with PyTorch's fused attention (sdpa: queries, keys, values, output
  and log-sum-exp are saved, never the score matrix). Packed rows (documents restarting inside a row, as the
  pretraining data are) give every attention call a 4D mask: transformers then expands the key/value heads to
  the query heads, and sdpa converts and saves the mask per call. Matmul inputs are saved in the compute
  dtype (bf16 under autocast, a separate cast per projection), the residual stream and the norms' internals
  in float32 (the weights are float32).
  - T²MLR on the Jacobi path: the detached iterates keep nothing; the last d_backward iterates and the final
    pass each keep a whole middle block, the fusion Φ and the cache norm. With activation checkpointing a
    middle block run keeps only its input, and backward recomputes one block at a time.
  - T²MLR on the exact path: the middle block runs token by token, and each step's attention saves the keys
    and values of every earlier token (the KV cache concatenated anew): quadratic in the sequence length.
    With a BPTT window the token loop runs without gradients and one replayed pass keeps a middle block.
  - the loss: logits and float32 log-probabilities are kept, and the loss's backward adds two more
    float32 logit-sized tensors (the largest transient of the backward pass).
* the optimizer step: AdamW's multi-tensor path on a GPU allocates one more float32 copy of the local state.

Left out (the GPU table's usable memory reserves room for them): the CUDA context and NCCL buffers, the
caching allocator's fragmentation, the data loader, evaluation and checkpoint writing. Measured against
torch's allocator on the CPU by benchmarks/memory_estimate.py and tests/test_sizing_memory.py (within 15% on
three shapes, both paths).

FLOPs come from the library's FLOP model (`t2mlr.baselines.costs.train_step_flops`); the step time divides
them by the GPU's dense bf16 peak times an assumed model-FLOP utilisation (MFU). Recomputation by
activation checkpointing is reported beside them: it is work the GPU does that MFU does not count.
"""

from __future__ import annotations

import math

import copy
import functools
import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig

from t2mlr.baselines.costs import DecoderShape, causal_pairs, train_step_flops
from t2mlr.baselines.looped import LoopedConfig
from t2mlr.baselines.matching import count_parameters
from t2mlr.baselines.pause import PauseConfig
from t2mlr.model import T2MLRConfig
from t2mlr.model.configuration import build_base_config
from t2mlr.model.fusion import built_on_meta
from t2mlr.model.pretrained import HubUnavailableError, load_pretrained_config
from t2mlr.training.architectures import checkpointing_refusal, get_architecture
from t2mlr.training.config import ConfigError, ModelConfig, TrainConfig
from t2mlr.training.model_factory import (
    base_config,
    decoder_layers,
    describe_path,
    repeated_block_indices,
)

__all__ = [
    "DEFAULT_MFU", "GPU_KINDS", "GpuKind", "MemoryEstimate", "ModelFacts", "Plan", "RunSize", "SizingError",
    "UnsupportedModelError",
    "build_on_meta", "command_line", "device_counts", "estimate_activations", "estimate_memory", "gpu_kind", "launch_line",
    "model_facts", "plan_for", "size_run", "sizing_base_config",
]

GIB = 1024**3
FP32 = 4  # bytes: weights, gradients, AdamW moments, the residual stream, norms' internals, log-probabilities
BF16 = 2
DEFAULT_MFU = 0.30  # an assumption, not a measurement: see docs/scale.md
CONTEXT_RESERVE = 1 * GIB  # CUDA context, cuBLAS workspaces, NCCL buffers
ALLOCATOR_HEADROOM = 0.90  # share of the rest the caching allocator can hand out before fragmentation bites
LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3", "t2mlr_matched_llama")
PARALLEL_LABELS = {"none": "one process", "ddp": "DDP", "fsdp": "FSDP2"}  # plan.parallel as the tables name it


class SizingError(ConfigError):
    """A run that cannot be sized or cannot fit as asked (a bad-input error: exit code 2)."""


class UnsupportedModelError(SizingError):
    """A model the memory model does not cover (not a Llama-family decoder, or not sdpa attention): an
    experiment lists such an arm as not sized instead of failing."""


# ---------------------------------------------------------------------------------------------- GPU kinds


@dataclass(frozen=True)
class GpuKind:
    """One GPU: dense (no structured sparsity) peak throughput and memory, as its datasheet states them."""

    name: str
    label: str
    bf16_flops: float  # dense bf16 tensor-core FLOP/s (FP32 accumulate)
    fp32_flops: float  # FP32 FLOP/s without tensor cores (PyTorch's default for float32 matmuls)
    memory_gb: float  # datasheet capacity, GB = 10^9 bytes
    source: str

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9

    @property
    def usable_bytes(self) -> float:
        """What a training process can fill: capacity less the context reserve, times the allocator headroom."""
        return (self.memory_bytes - CONTEXT_RESERVE) * ALLOCATOR_HEADROOM

    def peak_flops(self, precision: str) -> float:
        return self.bf16_flops if precision == "bf16" else self.fp32_flops


# Datasheet figures; the sparse tensor-core figures the datasheets print first are twice these.
GPU_KINDS: dict[str, GpuKind] = {kind.name: kind for kind in (
    GpuKind("h100", "NVIDIA H100 SXM5 80GB", 989.4e12, 66.9e12, 80,
            "NVIDIA H100 Tensor Core GPU datasheet: BF16 1,979 TFLOPS with sparsity, FP32 67 TFLOPS, 80 GB HBM3"),
    GpuKind("h200", "NVIDIA H200 SXM 141GB", 989.4e12, 66.9e12, 141,
            "NVIDIA H200 Tensor Core GPU datasheet: BF16 1,979 TFLOPS with sparsity, FP32 67 TFLOPS, 141 GB HBM3e"),
    GpuKind("a100-80gb", "NVIDIA A100 SXM4 80GB", 312e12, 19.5e12, 80,
            "NVIDIA A100 Tensor Core GPU datasheet: BF16 312 TFLOPS (624 with sparsity), FP32 19.5 TFLOPS, "
            "80 GB HBM2e"),
    GpuKind("a100-40gb", "NVIDIA A100 SXM4 40GB", 312e12, 19.5e12, 40,
            "NVIDIA A100 Tensor Core GPU datasheet: BF16 312 TFLOPS (624 with sparsity), FP32 19.5 TFLOPS, "
            "40 GB HBM2"),
    GpuKind("l40s", "NVIDIA L40S 48GB", 362.05e12, 91.6e12, 48,
            "NVIDIA L40S datasheet: BF16 362.05 TFLOPS (733 with sparsity), FP32 91.6 TFLOPS, 48 GB GDDR6"),
    GpuKind("a10", "NVIDIA A10 24GB", 125e12, 31.2e12, 24,
            "NVIDIA A10 Tensor Core GPU datasheet: BF16 125 TFLOPS (250 with sparsity), FP32 31.2 TFLOPS, "
            "24 GB GDDR6"),
    GpuKind("a10g", "NVIDIA A10G 24GB (AWS G5)", 70e12, 31.2e12, 24,
            "no public NVIDIA datasheet (an AWS-only part): 24 GB GDDR6 per the AWS G5 instance page; BF16 70 "
            "TFLOPS dense as NVIDIA's A10G spec sheet is quoted by Baseten, 'NVIDIA A10 vs A10G for ML model "
            "inference' (2023); FP32 taken equal to the A10's"),
    GpuKind("rtx4090", "NVIDIA GeForce RTX 4090 24GB", 165.2e12, 82.6e12, 24,
            "NVIDIA Ada Lovelace GPU architecture whitepaper, RTX 4090: BF16 tensor with FP32 accumulate 165.2 "
            "TFLOPS (330.4 with sparsity), FP32 82.6 TFLOPS, 24 GB GDDR6X"),
)}


def gpu_kind(name: str) -> GpuKind:
    """The table's entry for `name` (case-insensitive); a SizingError lists the known kinds."""
    kind = GPU_KINDS.get(name.lower())
    if kind is None:
        known = ", ".join(f"{k.name} ({k.label})" for k in GPU_KINDS.values())
        raise SizingError(f"unknown GPU kind {name!r}; known kinds: {known}")
    return kind


# ---------------------------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class ModelFacts:
    """What sizing needs to know about a model, read from its meta-device build."""

    name: str
    config: PretrainedConfig
    parameters: int
    layer_parameters: tuple[int, ...]  # per decoder layer, in order
    repeated_blocks: tuple[int, ...]  # 0-based blocks that run several times per step
    linear_weights: int  # elements of every nn.Linear weight (a tied head counted: autocast casts it)
    scalar_parameters: int  # 0-dim parameters FSDP2 leaves replicated (the fusion gates)
    largest_parameter: int
    qk_norm: bool  # Qwen3-style RMSNorm on queries and keys
    attention: str  # the attention implementation the layers call
    training_path: str

    @property
    def shape(self) -> DecoderShape:
        return DecoderShape.of(self.config)

    @property
    def root_parameters(self) -> int:
        """Parameters outside the decoder layers: embeddings, final norm, head, fusion and cache norm."""
        return self.parameters - sum(self.layer_parameters)


# The published configs (config.json on the hub) of the pretrained models the presets name, for sizing a
# run offline when the hub id is not in the local cache: the shapes are public, the weights are not needed.
PUBLISHED_CONFIGS: dict[str, dict[str, Any]] = {
    # HuggingFaceTB/SmolLM2-1.7B(-Instruct) config.json: 24 blocks, hidden 2048, 32 heads (no grouping), MLP 8192;
    # 1.71B parameters with the tied 49152-token vocabulary
    **{f"HuggingFaceTB/SmolLM2-1.7B{tail}": {
        "model_type": "llama", "vocab_size": 49152, "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_act": "silu",
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 130000.0, "tie_word_embeddings": True,
        "initializer_range": 0.02, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2} for tail in ("", "-Instruct")},
}


def _published_shapes() -> dict[str, PretrainedConfig]:
    from t2mlr.model.shapes import smollm2_135m_base_config, smollm2_360m_base_config

    shapes = {f"HuggingFaceTB/SmolLM2-{size}{tail}": make() for size, make in
              (("135M", smollm2_135m_base_config), ("360M", smollm2_360m_base_config)) for tail in ("", "-Instruct")}
    shapes.update({name: build_base_config(dict(fields)) for name, fields in PUBLISHED_CONFIGS.items()})
    return shapes


@functools.lru_cache(maxsize=16)
def _offline_pretrained_config(source: str, gguf_file: str | None) -> tuple[PretrainedConfig, str | None]:
    """A pretrained model's config without a download: the local copy (directory, GGUF metadata, hub cache),
    else the published config of a model the presets name; a SizingError otherwise. Cached: a GGUF's
    metadata takes seconds to parse, and an experiment sizes several arms of one source."""
    try:
        return load_pretrained_config(source, gguf_file, local_files_only=True), None
    except HubUnavailableError as err:
        published = _published_shapes()
        if source not in published:
            raise SizingError(f"model.pretrained {source!r} is not available offline and its shape is not in the "
                              f"table of published configs ({', '.join(sorted(published))}): pass a local "
                              "directory or .gguf file (only its config is read)") from err
        return published[source], (f"model.pretrained {source} is not in the local hub cache: sized from its "
                                   "published config (no download)")


def sizing_base_config(model_cfg: ModelConfig) -> tuple[PretrainedConfig, str | None]:
    """The wrapped decoder's config as the trainer would build it, read offline, and a note when it comes from
    the table of published configs instead of the model itself."""
    if model_cfg.pretrained is None:
        return base_config(model_cfg), None
    config, note = _offline_pretrained_config(model_cfg.pretrained, model_cfg.gguf_file)
    return copy.deepcopy(config), note


def build_on_meta(model_cfg: ModelConfig) -> nn.Module:
    """The configured model with every tensor on the meta device: shapes, no storage. A pretrained model's
    config is read (a GGUF's metadata only, or its published config when it is not here), never its weights."""
    arch = get_architecture(model_cfg.arch)
    config, _ = sizing_base_config(model_cfg)
    with torch.device("meta"):
        return arch.build(config, None, model_cfg.sized_settings())


def model_facts(model_cfg: ModelConfig) -> ModelFacts:
    """Parameter layout and training path of the model `model_cfg` describes, without allocating weights."""
    model = build_on_meta(model_cfg)
    base = getattr(model.config, "base_config", None) or model.config
    model_type = getattr(base, "model_type", None)
    if model_type not in LLAMA_FAMILY:
        raise UnsupportedModelError(
            f"the memory model covers Llama-family decoder layers ({', '.join(LLAMA_FAMILY)}); this model's base "
            f"is {model_type!r}"
        )
    layers = decoder_layers(model)
    linears = {id(m.weight): m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear)}
    params = list(model.parameters())
    attention = getattr(layers[0].self_attn.config, "_attn_implementation", None) or "sdpa"
    return ModelFacts(
        name=type(model).__name__,
        config=model.config,
        parameters=count_parameters(model),
        layer_parameters=tuple(count_parameters(layer) for layer in layers),
        repeated_blocks=tuple(sorted(repeated_block_indices(model))),
        linear_weights=sum(linears.values()),
        scalar_parameters=sum(p.numel() for p in params if p.ndim == 0),
        largest_parameter=max(p.numel() for p in params),
        qk_norm=hasattr(layers[0].self_attn, "q_norm"),
        attention=attention,
        training_path=describe_path(model, True),
    )


# ---------------------------------------------------------------------------------------------- activations


@dataclass(frozen=True)
class Plan:
    """How a run is laid out: devices, data parallelism, micro-batch, precision and device type."""

    devices: int
    parallel: str  # "none", "ddp" or "fsdp"
    micro_batch: int
    accumulation: int
    precision: str  # "bf16" (autocast, fp32 weights) or "fp32"
    device_type: str = "cuda"
    packed: bool = True  # rows pack several documents (4D attention masks), as the pretraining data do


def layer_token_bytes(shape: DecoderShape, compute: int, qk_norm: bool) -> float:
    """Bytes one decoder layer saves per token, apart from keys, values and the mask (those depend on what a
    token attends to). fp32 weights keep the residual stream and the norms in float32."""
    d, m, q = shape.hidden, shape.intermediate, shape.heads * shape.head_dim
    stream = 2 * FP32 * d  # the layer's input and its mid-layer residual, each saved by a norm
    norms = 2 * (FP32 * d + FP32)  # each norm's normalised hidden and 1/rms
    if compute == FP32:
        projection_inputs = 2 * FP32 * d  # one tensor feeds q, k, v; one feeds gate and up
    else:
        projection_inputs = 5 * compute * d  # autocast casts the input once per projection (q, k, v, gate, up)
    attention = 2 * compute * q + FP32 * shape.heads  # the query and the output, the log-sum-exp
    mlp = 4 * compute * m  # gate, up, activation(gate), their product
    qk = (FP32 + compute) * (q + shape.kv_heads * shape.head_dim) + FP32 * (shape.heads + shape.kv_heads) if qk_norm else 0
    return stream + norms + projection_inputs + attention + mlp + qk


def key_value_bytes(shape: DecoderShape, compute: int, packed: bool) -> float:
    """Bytes sdpa saves per attended key (its key and value rows). With a mask, transformers expands grouped
    key/value heads to the query heads: a copy when there are several groups, a view of one head otherwise;
    autocast's cast of the float32 (rotated) keys materialises the expanded view."""
    heads, groups = shape.heads, shape.kv_heads
    expanded = packed and groups < heads
    value_heads = heads if expanded and groups > 1 else groups
    key_heads = heads if expanded and (groups > 1 or compute != FP32) else groups
    return compute * (key_heads + value_heads) * shape.head_dim


def parallel_layer_bytes(shape: DecoderShape, rows: int, length: int, compute: int, qk_norm: bool, packed: bool) -> float:
    """Bytes one run of a decoder layer over `rows` × `length` tokens (in parallel) keeps for backward."""
    keys = key_value_bytes(shape, compute, packed)
    mask = compute * length if packed else 0  # sdpa converts the boolean mask to the query dtype per call
    return rows * length * (layer_token_bytes(shape, compute, qk_norm) + keys + mask)


def token_loop_layer_bytes(shape: DecoderShape, rows: int, length: int, compute: int, qk_norm: bool, packed: bool) -> float:
    """Bytes one decoder layer keeps when it runs token by token with a KV cache (T²MLR's exact path): step t
    saves the t keys and values it attends to (the cache concatenated anew) and its mask row."""
    keys = key_value_bytes(shape, compute, packed)
    mask = compute if packed else 0
    attended = causal_pairs(length)
    return rows * (length * layer_token_bytes(shape, compute, qk_norm) + attended * (keys + mask))


def fusion_token_bytes(config: Any, compute: int) -> float:
    """Φ per fused token. The paper's Φ (`fusion="gated"` with linear gates): [h; r] for f_cur and f_rec, both
    sigmoid gates, W_rec's input and output, and the two gated terms the additions keep (h itself is counted
    once, as the prefix output). Any other variant: an upper bound, every linear's input and output and
    four more d-wide terms (gates, products, norms), all float32."""
    d = config.hidden_size
    if getattr(config, "fusion", "gated") != "gated" or getattr(config, "fusion_gate", "linear") != "linear" \
            or getattr(config, "fusion_r_norm", False):
        linears = [m for m in built_on_meta(config).modules() if isinstance(m, nn.Linear)]
        return FP32 * (sum(m.in_features + m.out_features for m in linears) + 4 * d)
    if compute == FP32:
        return FP32 * 8 * d  # [h; r] (2d, one tensor), σ_cur, σ_cur·h, σ_rec, W_rec r, σ_rec·W_rec r, r
    concatenated = 2 * compute * 2 * d  # autocast casts [h; r] once per linear
    gated_current = FP32 * d  # σ_cur (bf16) times h (float32) is float32
    return concatenated + gated_current + 5 * compute * d  # σ_cur, σ_rec, W_rec's cast input and output, σ_rec·W_rec r


def cache_norm_token_bytes(d: int) -> float:
    """R's update per token: h + R, its 1/rms and normalised value (float32), and the gather index."""
    return FP32 * (2 * d + 1) + 8 + 1


def head_token_bytes(shape: DecoderShape, compute: int) -> float:
    """The final norm, the head's input, the logits (kept by the output) and the float32 log-probabilities."""
    d, v = shape.hidden, shape.vocab
    return FP32 * (2 * d + 1) + compute * d + compute * v + FP32 * v


def loss_backward_token_bytes(shape: DecoderShape) -> float:
    """The loss's backward holds the gradients of the log-probabilities and of the logits at once (float32)."""
    return 2 * FP32 * shape.vocab


@dataclass(frozen=True)
class Activations:
    """Saved bytes of one micro-batch by part, and the largest transient of its backward pass."""

    parts: dict[str, float]
    transient: float
    transient_reason: str


def estimate_activations(facts: ModelFacts, rows: int, length: int, precision: str, checkpointing: bool,
                         packed: bool = True) -> Activations:
    """Activations of one micro-batch of `rows` × `length` tokens on the model's training path."""
    if facts.attention != "sdpa":
        raise UnsupportedModelError(f"the memory model assumes PyTorch's fused attention (sdpa); this model uses "
                          f"{facts.attention!r}: set attn_implementation to sdpa or size it by measurement")
    shape, compute, config = facts.shape, BF16 if precision == "bf16" else FP32, facts.config
    block_tokens = length * (config.period if isinstance(config, PauseConfig) else 1)
    layer = parallel_layer_bytes(shape, rows, block_tokens, compute, facts.qk_norm, packed)
    layer_input = rows * block_tokens * FP32 * shape.hidden  # what a checkpointed run keeps
    runs, checkpointed = _layer_runs(facts, checkpointing)
    parts = {
        f"decoder layers ({runs} layer runs)": runs * layer,
        "rotary tables and mask": rows * block_tokens * 2 * FP32 * shape.head_dim + (rows * block_tokens**2 if packed else 0),
        "final norm, logits and log-probabilities": rows * length * head_token_bytes(shape, compute),
    }
    if checkpointed:
        parts[f"checkpointed layer inputs ({checkpointed} runs)"] = checkpointed * layer_input
    if isinstance(config, T2MLRConfig):
        parts.update(_recurrence_parts(facts, rows, length, compute, packed))
    transient, reason = rows * length * loss_backward_token_bytes(shape), "the loss's backward"
    recompute = layer - parts["final norm, logits and log-probabilities"]  # the head's tensors are freed by then
    if checkpointed and recompute > transient:
        transient, reason = recompute, "recomputing one checkpointed layer"
    return Activations({k: v for k, v in parts.items() if v}, transient, reason)


def _layer_runs(facts: ModelFacts, checkpointing: bool) -> tuple[int, int]:
    """(decoder layer runs that keep their activations, checkpointed runs that keep only their input) per
    forward with gradients; T²MLR's middle block outside the parallel runs is counted by `_recurrence_parts`."""
    config, layers = facts.config, len(facts.layer_parameters)
    if isinstance(config, LoopedConfig):
        looped = len(config.looped_indices()) * config.loops
        runs = len(config.block_schedule())
        return (runs - looped, looped) if checkpointing and config.loops > 1 else (runs, 0)
    if isinstance(config, T2MLRConfig) and config.train_recurrence != "off":
        middle = config.l_end - config.l_start + 1
        if config.train_recurrence == "exact":
            return layers - middle, 0
        passes = config.d_backward + 1  # the gradient-carrying iterates and the final pass
        return (layers - middle, middle * passes) if checkpointing else (layers - middle + middle * passes, 0)
    return layers, 0


def _recurrence_parts(facts: ModelFacts, rows: int, length: int, compute: int, packed: bool) -> dict[str, float]:
    """T²MLR's own saved tensors on its training path: Φ, the cache norm, the prefix output Φ reads, and the
    exact path's token loop (or the replayed pass of a BPTT window)."""
    config, shape = facts.config, facts.shape
    if config.train_recurrence == "off":
        return {}
    d, tokens = shape.hidden, rows * length
    middle = config.l_end - config.l_start + 1
    fusion, norm = fusion_token_bytes(config, compute) * tokens, cache_norm_token_bytes(d) * tokens
    prefix_output = FP32 * d * tokens
    if config.train_recurrence == "jacobi":
        passes = config.d_backward + 1
        fused = passes - (1 if config.d_backward == config.d_forward else 0)  # the seed pass has no Φ
        return {"fusion Φ and cache norm (gradient passes)": fused * fusion + passes * norm + prefix_output}
    if config.bptt_window is not None:  # no-grad token loop, then one replayed pass with gradients
        replay = parallel_layer_bytes(shape, rows, length, compute, facts.qk_norm, packed)
        fixed_point = 2 * FP32 * d * tokens  # the written and the given states, kept by the replay's backward
        return {"replayed middle block (BPTT window)": middle * replay + fusion + norm + prefix_output + fixed_point}
    loop = token_loop_layer_bytes(shape, rows, length, compute, facts.qk_norm, packed)
    return {"middle block token by token (exact path)": middle * loop + fusion + norm + prefix_output}


# ---------------------------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device at the peak of a training step, by what holds them."""

    weights: float
    gradients: float
    optimizer: float
    gathered_parameters: float  # FSDP2: unsharded parameters held during forward and backward
    gradient_buckets: float  # DDP: the all-reduce buckets, a second copy of the gradients
    autocast_copies: float  # bf16 casts of the linear weights, held from forward to backward
    activations: dict[str, float]
    backward_transient: float
    transient_reason: str
    optimizer_step_transient: float
    notes: tuple[str, ...] = ()

    @property
    def activations_total(self) -> float:
        return sum(self.activations.values())

    @property
    def states(self) -> float:
        return self.weights + self.gradients + self.optimizer

    @property
    def during_backward(self) -> float:
        return (self.states + self.gathered_parameters + self.gradient_buckets + self.autocast_copies
                + self.activations_total + self.backward_transient)

    @property
    def during_optimizer_step(self) -> float:
        return self.states + self.gradient_buckets + self.optimizer_step_transient

    @property
    def peak(self) -> float:
        return max(self.during_backward, self.during_optimizer_step)


def estimate_memory(facts: ModelFacts, plan: Plan, seq_len: int, checkpointing: bool) -> MemoryEstimate:
    """Per-device bytes of training the model under `plan` (see the module docstring for what is counted)."""
    total, n = facts.parameters, plan.devices
    sharded = plan.parallel == "fsdp" and n > 1
    local = (total - facts.scalar_parameters) / n + facts.scalar_parameters if sharded else total
    notes = []
    if sharded and plan.accumulation > 1:
        gradients = FP32 * total
        notes.append(f"FSDP2 keeps unsharded gradients across the {plan.accumulation} accumulation micro-steps "
                     "(sync is off until the last one): fewer micro-steps shard them")
    else:
        gradients = FP32 * local
    gathered = 0.0
    if sharded:
        repeated = sum(facts.layer_parameters[i] for i in facts.repeated_blocks)
        others = [p for i, p in enumerate(facts.layer_parameters) if i not in facts.repeated_blocks]
        gathered = FP32 * (facts.root_parameters + repeated + 2 * max(others, default=0))
    activations = estimate_activations(facts, plan.micro_batch, seq_len, plan.precision, checkpointing, plan.packed)
    foreach = plan.device_type == "cuda"  # AdamW's default multi-tensor path: one more copy of the state
    return MemoryEstimate(
        weights=FP32 * local,
        gradients=gradients,
        optimizer=2 * FP32 * local,
        gathered_parameters=gathered,
        gradient_buckets=FP32 * total if plan.parallel == "ddp" and n > 1 else 0.0,
        autocast_copies=BF16 * facts.linear_weights if plan.precision == "bf16" else 0.0,
        activations=activations.parts,
        backward_transient=activations.transient,
        transient_reason=activations.transient_reason,
        optimizer_step_transient=FP32 * (local if foreach else facts.largest_parameter),
        notes=tuple(notes),
    )


# ---------------------------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class RunSize:
    """Everything a dry run reports; `table()` prints it, `to_dict()` is the --json form."""

    config: str
    model: str
    parameters: int
    training_path: str
    gpu: GpuKind
    plan: Plan
    global_batch: int
    seq_len: int
    max_steps: int
    tokens_per_step: int
    flops_per_step: float
    recomputed_flops_per_step: float
    mfu: float
    memory: MemoryEstimate
    launch: str
    fits: bool
    notes: tuple[str, ...] = field(default_factory=tuple)  # what would fit, and where the estimate is weak
    max_seconds: float | None = None  # train.max_seconds, the run's time budget

    @property
    def step_seconds(self) -> float:
        return self.flops_per_step / (self.plan.devices * self.gpu.peak_flops(self.plan.precision) * self.mfu)

    @property
    def steps(self) -> int:
        """The steps the run will take: max_steps, or fewer where its time budget ends it first (at this MFU)."""
        if self.max_seconds is None:
            return self.max_steps
        return min(self.max_steps, math.ceil(self.max_seconds / self.step_seconds))

    @property
    def gpu_hours(self) -> float:
        return self.step_seconds * self.steps * self.plan.devices / 3600

    def to_dict(self) -> dict[str, Any]:
        memory = asdict(self.memory)
        memory.update(peak=self.memory.peak, activations_total=self.memory.activations_total,
                      usable=self.gpu.usable_bytes)
        return {
            **{k: v for k, v in asdict(self).items() if k not in ("memory", "gpu", "plan")},
            "gpu": asdict(self.gpu), "plan": asdict(self.plan), "memory_bytes": memory,
            "step_seconds": self.step_seconds, "steps": self.steps, "gpu_hours": self.gpu_hours,
        }

    def table(self) -> str:
        return "\n".join(_table_lines(self))


def gib(value: float) -> str:
    return f"{value / GIB:,.2f} GiB"


def _table_lines(run: RunSize) -> list[str]:
    plan, memory, gpu = run.plan, run.memory, run.gpu
    mode = PARALLEL_LABELS[plan.parallel]  # plan_for: "none" on one device
    precision = "bf16 autocast, fp32 weights and AdamW state" if plan.precision == "bf16" else "fp32 throughout"
    lines = [
        f"t2mlr train {run.config} --dry-run: {plan.devices} × {gpu.label}, {mode}",
        f"  model             {run.model}, {run.parameters:,} parameters",
        f"  training path     {run.training_path}",
        (f"  batch             {run.global_batch} rows × {run.seq_len} tokens = {run.tokens_per_step:,} tokens/step "
         f"(micro-batch {plan.micro_batch} × {plan.devices} device(s) × accumulation {plan.accumulation})"),
        f"  precision         {precision}",
        "memory per device",
        f"  weights           {gib(memory.weights)}",
        f"  gradients         {gib(memory.gradients)}",
        f"  optimizer state   {gib(memory.optimizer)}   (AdamW: two fp32 moments)",
    ]
    optional = (("gathered params", memory.gathered_parameters, "FSDP2: root, repeated blocks, two in flight"),
                ("DDP buckets", memory.gradient_buckets, "a second copy of the gradients"),
                ("autocast copies", memory.autocast_copies, "bf16 casts of the linear weights"))
    lines += [f"  {name:<17} {gib(value)}   ({why})" for name, value, why in optional if value]
    lines.append(f"  activations       {gib(memory.activations_total)}   (micro-batch {plan.micro_batch})")
    lines += [f"    {name:<40} {gib(value)}" for name, value in memory.activations.items()]
    lines.append(f"  backward peak     {gib(memory.backward_transient)}   ({memory.transient_reason})")
    share = memory.peak / gpu.usable_bytes
    verdict = "fits" if run.fits else "DOES NOT FIT"
    lines.append(f"  total             {gib(memory.peak)} of {gib(gpu.usable_bytes)} usable "
                 f"({gpu.memory_gb:g} GB less context reserve and allocator headroom): {verdict} ({share:.0%})")
    lines += [f"  note: {note}" for note in memory.notes]
    lines += [
        "compute",
        f"  FLOPs per step    {run.flops_per_step:.3e}   (t2mlr.baselines.costs.train_step_flops × {run.global_batch} rows)",
    ]
    if run.recomputed_flops_per_step:
        lines.append(f"  recomputed        {run.recomputed_flops_per_step:.3e}   (activation checkpointing; not in MFU)")
    peak = gpu.peak_flops(plan.precision)
    lines += [
        (f"  step time         {run.step_seconds:.3f} s at MFU {run.mfu:.0%} of {peak / 1e12:,.1f} TFLOP/s "
         f"({plan.precision} dense peak) per device"),
        (f"  run               {run.steps:,} steps: {run.step_seconds * run.steps / 3600:,.2f} h wall, "
         f"{run.gpu_hours:,.1f} GPU-hours"),
        "launch",
        f"  {run.launch}",
    ]
    lines += [f"note: {line}" for line in run.notes]
    return lines


def choose_parallel(cfg: TrainConfig, devices: int) -> str:
    """The data parallelism of the run: the config's, else FSDP2 on several devices."""
    if devices == 1:
        return "none"
    return cfg.train.parallel if cfg.train.parallel != "none" else "fsdp"


def device_counts(cfg: TrainConfig, micro_batch: int) -> list[int]:
    """Device counts the batches split over: micro-batch × devices divides the global batch, and the devices
    divide eval.batch_size when the run evaluates."""
    t, evaluates = cfg.train, cfg.eval.every > 0
    return [n for n in range(1, t.global_batch_size // micro_batch + 1)
            if t.global_batch_size % (micro_batch * n) == 0 and not (evaluates and cfg.eval.batch_size % n)]


def plan_for(cfg: TrainConfig, devices: int, parallel: str, micro_batch: int | None = None,
             device_type: str = "cuda") -> Plan:
    """The plan of `cfg` on `devices` devices; the micro-batch must split the global batch evenly."""
    t = cfg.train
    micro = t.micro_batch_size if micro_batch is None else micro_batch
    if devices < 1:
        raise SizingError(f"--devices must be >= 1, got {devices}")
    counts = ", ".join(map(str, device_counts(cfg, micro)))
    if t.global_batch_size % (micro * devices):
        raise SizingError(
            f"{devices} devices do not divide the batch: train.global_batch_size {t.global_batch_size} is not a "
            f"multiple of train.micro_batch_size {micro} × {devices} devices = {micro * devices}; device counts "
            f"that do: {counts}"
        )
    if cfg.eval.every > 0 and cfg.eval.batch_size % devices:
        raise SizingError(f"{devices} devices do not divide eval.batch_size {cfg.eval.batch_size} (it is split evenly "
                          f"across ranks); device counts that divide both batches: {counts}")
    accumulation = t.global_batch_size // (micro * devices)
    precision = "fp32" if t.precision == "fp32" else "bf16"  # the trainer's on a GPU: bf16 autocast unless asked
    return Plan(devices, parallel if devices > 1 else "none", micro, accumulation, precision, device_type)


def recomputed_flops(facts: ModelFacts, rows: int, seq_len: int, checkpointing: bool) -> float:
    """Forward FLOPs that activation checkpointing repeats in backward: every checkpointed layer run once more."""
    _, checkpointed = _layer_runs(facts, checkpointing)
    shape = facts.shape
    return rows * checkpointed * (shape.block_matmuls(seq_len) + shape.attention(causal_pairs(seq_len)))


def launch_line(config: str, devices: int, parallel: str, out: str, extra: Sequence[str] = ()) -> str:
    """The command that runs this plan: `t2mlr train` on one device, torchrun on several (8 per node beyond 8)."""
    words = ["train", config, "--out", out]
    if devices > 1:
        words += ["--parallel", parallel]
    return command_line([*words, *extra], devices)


def command_line(words: Sequence[str], devices: int) -> str:
    """`t2mlr WORDS...` on one device, under torchrun on several (8 per node beyond 8), shell-quoted."""
    command = " ".join(shlex.quote(word) for word in ["-m", "t2mlr", *words])
    if devices == 1:
        return "t2mlr" + command.removeprefix("-m t2mlr")
    if devices <= 8 or devices % 8:
        return f"torchrun --nproc_per_node {devices} {command}"
    return (f"torchrun --nnodes {devices // 8} --nproc_per_node 8 --rdzv_backend c10d "
            f"--rdzv_endpoint $MASTER_ADDR:29500 {command}   # on each of the {devices // 8} nodes")


def size_run(cfg: TrainConfig, devices: int, gpu: str, mfu: float = DEFAULT_MFU, config_name: str = "CONFIG",
             out: str | None = None, extra_args: Sequence[str] = ()) -> RunSize:
    """Size `cfg` on `devices` GPUs of kind `gpu` (no weights allocated). Raises SizingError for input that
    cannot be sized, and for a run that does not fit even sharded over as many devices as the batch allows."""
    kind = gpu_kind(gpu)
    if not 0 < mfu <= 1:
        raise SizingError(f"the model-FLOP utilisation must be in (0, 1], got {mfu}")
    parallel = choose_parallel(cfg, devices)
    plan = plan_for(cfg, devices, parallel)
    facts = model_facts(cfg.model)
    seq_len, checkpointing = cfg.data.seq_len, cfg.model.activation_checkpointing
    memory = estimate_memory(facts, plan, seq_len, checkpointing)
    fits = memory.peak <= kind.usable_bytes
    notes = (() if fits else _advice(cfg, facts, plan, kind)) + _caveats(cfg, facts)
    rows = cfg.train.global_batch_size
    return RunSize(
        config=config_name, model=facts.name, parameters=facts.parameters, training_path=facts.training_path,
        gpu=kind, plan=plan, global_batch=rows, seq_len=seq_len, max_steps=cfg.train.max_steps,
        max_seconds=cfg.train.max_seconds, tokens_per_step=rows * seq_len, flops_per_step=rows * train_step_flops(facts.config, seq_len),
        recomputed_flops_per_step=recomputed_flops(facts, rows, seq_len, checkpointing), mfu=mfu, memory=memory,
        launch=launch_line(config_name, devices, parallel, out or f"runs/{_stem(config_name)}", extra_args),
        fits=fits, notes=notes,
    )


def _caveats(cfg: TrainConfig, facts: ModelFacts) -> tuple[str, ...]:
    """Where the printed figures say less than they seem to."""
    caveats = []
    if facts.training_path.startswith("exact"):
        caveats.append(f"the exact path runs the middle block as {cfg.data.seq_len} dependent one-token steps per "
                       "micro-batch: such a step is bound by kernel latency, not FLOPs, so the step time at this MFU "
                       "is far too short: time a few steps on one GPU")
    if cfg.model.d_forward_sampling is not None:
        caveats.append(f"model.d_forward_sampling draws each step's Jacobi depth: sized at the largest, "
                       f"{cfg.model.sized_settings()['d_forward']}; the average step runs fewer iterations")
    published = sizing_base_config(cfg.model)[1]
    if published is not None:
        caveats.append(published)
    if cfg.train.device == "cpu":
        caveats.append("train.device is cpu: this config trains on the CPU whatever GPUs there are; set "
                       "train.device=auto (or cuda) for the run sized here")
    return tuple(caveats)


def _stem(config_name: str) -> str:
    return config_name.rstrip("/").rsplit("/", 1)[-1].removesuffix(".yaml")


def _advice(cfg: TrainConfig, facts: ModelFacts, plan: Plan, kind: GpuKind) -> tuple[str, ...]:
    """What would fit: more FSDP2 devices, or a smaller micro-batch; a SizingError when even the widest
    sharding the batch allows does not fit."""
    seq_len, checkpointing = cfg.data.seq_len, cfg.model.activation_checkpointing

    def fits(candidate: Plan, checkpointed: bool = checkpointing) -> bool:
        return estimate_memory(facts, candidate, seq_len, checkpointed).peak <= kind.usable_bytes

    counts = device_counts(cfg, plan.micro_batch)
    widest = max(counts)
    n = next((n for n in counts if n > plan.devices and fits(plan_for(cfg, n, "fsdp"))), None)
    micro = next((m for m in range(plan.micro_batch - 1, 0, -1) if plan.devices in device_counts(cfg, m)
                  and fits(plan_for(cfg, plan.devices, plan.parallel, m))), None)
    checkpointable = not checkpointing and facts.repeated_blocks and checkpointing_refusal(
        cfg.model.arch, cfg.model.settings) is None
    rescued = checkpointable and fits(plan, True)
    if n is None and micro is None and not rescued:
        best = estimate_memory(facts, plan_for(cfg, widest, "fsdp"), seq_len, checkpointing)
        hint = "; model.activation_checkpointing=true may help" if checkpointable else ""
        raise SizingError(
            f"does not fit on {kind.label}: even with FSDP2 over {widest} devices (the most the batches allow: "
            f"global {cfg.train.global_batch_size} / micro {plan.micro_batch}, eval {cfg.eval.batch_size}) it needs {gib(best.peak)} per device "
            f"(activations {gib(best.activations_total)}), and {gib(kind.usable_bytes)} is usable of "
            f"{kind.memory_gb:g} GB; lower train.micro_batch_size or data.seq_len{hint}"
        )
    advice = []
    if n is not None:
        advice.append(f"fits with FSDP2 over {n} devices (--devices {n})")
    if micro is not None:
        advice.append(f"fits on {plan.devices} device(s) with train.micro_batch_size={micro}")
    if rescued:
        advice.append(f"fits on {plan.devices} device(s) with model.activation_checkpointing=true")
    return tuple(advice)
