"""Future-token probes: how well each block's hidden state at token t predicts a later token x_{t+k}
(the paper's appendix "Future Token Prediction", table future-token-prediction: lower probe loss for
T²MLR than for the matched Transformer at every probed block).

For each model and each block, a probe is trained on the frozen hidden states of a train split of the
rows and scored (mean cross-entropy, nats) on a held-out split. Hidden states come from the model's own
forward with `output_hidden_states=True` (T²MLR on the exact path by default): block b's output for
b < L, and for the last block the final norm's output (transformers' convention; it is what the LM
head reads). Every feature dimension is standardised with the train split's mean and spread, so blocks
whose residual stream has grown to different scales are probed on equal terms.

Offsets: `offset=1` probes the next token x_{t+1}, as the paper's text describes it; `offset=2` probes
the token after it, as the authors' released probing code does. Both are reported by default because
they answer different questions: at offset 1 the last blocks are trained to predict exactly that
token, so a probe there mostly re-reads the model's own prediction; offset 2 asks whether the state
already carries information about a token the model was never trained to predict at t, which is the
"anticipation" the recurrence is meant to encourage (the gradient of the loss at t+1 reaches token t's
state through R). The paper's probe losses (about 5.1 nats, against about 3.9 for its models'
next-token validation loss) fit the further offset better than the next token.

Offsets are spelt as a list (`1,2`), a range (`1..4`: x_{t+1} … x_{t+4}, the "future tokens t+1..t+K" of
the issue and of multi-token-prediction probes) or both (`1..3,6`); each must lie in 1..seq_len−1, which is
checked, with the number of probed tokens per split, before any forward pass.

Targets never cross a document boundary: position t is probed at offset k only when t+k lies in the
same document of the same row.

The probe is the paper's two-layer MLP by default (`kind="mlp"`: hidden -> 2 x hidden, GELU -> vocabulary);
`kind="linear"` gives a single linear layer, the standard probe of what is linearly readable.

Every trained head is saved (OUT/probe_heads/model.safetensors and baseline.safetensors, one tensor
per parameter named `offset{k}.block{b}.…`, beside a JSON naming each head's offset, block, layer and
held-out loss); `load_probe_heads` reads them back and `ProbeHead.score` reproduces the held-out loss
from the same features. With a baseline, probes.md adds the paper's comparison: per offset, each layer's
loss for the model and the baseline and their difference (model − baseline; negative: the model's state
carries more about x_{t+k}).

Layers are named as the paper's table names them, counted back from the LM head: l_-1 is the last
block (what the head reads), l_-k the block k - 1 below it, so a T²MLR model and a baseline of the same
depth line up column by column whatever their placement.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm.auto import tqdm

from t2mlr.analysis.common import (
    ModelInfo,
    data_config_for,
    describe_model,
    fixed_depth,
    load_analysis_model,
    model_batches,
    model_inputs,
)
from t2mlr.analysis.figures import plot_probes
from t2mlr.analysis.report import table, write_result
from t2mlr.training.data import build_dataset

__all__ = [
    "ProbeHead",
    "ProbeResult",
    "ProbeSettings",
    "block_hidden_states",
    "check_offsets",
    "check_probe_tokens",
    "compare_to_baseline",
    "fit_probe",
    "load_probe_heads",
    "parse_offsets",
    "probe_targets",
    "run_probes",
    "save_probe_heads",
    "train_probe",
]

STEM, FIGURE = "probes", "probes.png"
PROBE_KINDS = ("linear", "mlp")
PROBE_NAMES = {"linear": "Linear", "mlp": "Two-layer MLP"}


@dataclass(frozen=True)
class ProbeSettings:
    """How every probe is trained (the same for all models, blocks and offsets)."""

    kind: str = "mlp"
    steps: int = 400
    batch_size: int = 512
    lr: float = 3e-3
    weight_decay: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in PROBE_KINDS:
            raise ValueError(f"probe kind must be one of {PROBE_KINDS}, got {self.kind!r}")
        if self.steps < 1 or self.batch_size < 1 or not self.lr > 0:
            raise ValueError(f"probe steps and batch size must be >= 1 and lr > 0; got {self.steps}, "
                             f"{self.batch_size}, {self.lr}")


@dataclass
class ProbeResult:
    """One probe's held-out loss (nats per token) and top-1 accuracy, and its final training loss."""

    loss: float
    accuracy: float
    train_loss: float
    train_tokens: int
    eval_tokens: int


def check_offsets(offsets: Sequence[int], seq_len: int | None = None) -> list[int]:
    """Offsets as a list of distinct ints >= 1 (1 = the next token), each below `seq_len` when it is given
    (a row of n tokens has no pair t, t+k for k >= n)."""
    if not offsets:
        raise ValueError("give at least one probe offset (1 = the next token)")
    for offset in offsets:
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 1:
            raise ValueError(f"probe offsets must be ints >= 1 (1 = the next token, 2 = the one after), got {offset!r}")
    if seq_len is not None:
        too_far = [offset for offset in offsets if offset >= seq_len]
        if too_far:
            raise ValueError(f"--offset {','.join(map(str, too_far))} cannot be probed in rows of {seq_len} tokens: "
                             f"offsets must lie in 1..{seq_len - 1} (or raise --seq-len)")
    return list(dict.fromkeys(offsets))


def parse_offsets(text: str) -> list[int]:
    """--offset as written: "1,2" → [1, 2]; "1..4" → [1, 2, 3, 4] (x_(t+1) … x_(t+4)); "1..3,6" → [1, 2, 3, 6]."""
    offsets: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        low, dots, high = part.partition("..")
        try:
            first, last = int(low), int(high if dots else low)
        except ValueError as err:
            raise ValueError(f"--offset: expected offsets k >= 1 or ranges A..B separated by commas "
                             f"(1,2 or 1..4), got {text!r}") from err
        if first < 1 or last < first:
            raise ValueError(f"--offset: {part!r} is not an offset >= 1 or a range A..B with 1 <= A <= B "
                             f"(1..4 = x(t+1) … x(t+4))")
        offsets.extend(range(first, last + 1))
    return check_offsets(offsets)


def probe_targets(input_ids: torch.Tensor, position_ids: torch.Tensor | None, offset: int,
                  attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(valid, targets), both (batch, seq): token t is probed with target input_ids[t + offset] when that
    token exists, is real (not padding) and lies in t's document (positions t..t+offset consecutive)."""
    check_offsets([offset])
    batch, length = input_ids.shape
    valid = torch.zeros(batch, length, dtype=torch.bool)
    targets = torch.zeros(batch, length, dtype=torch.long)
    if offset >= length:
        return valid, targets
    positions = torch.arange(length).expand(batch, length) if position_ids is None else position_ids.cpu()
    same_document = positions[:, offset:] == positions[:, :-offset] + offset
    if attention_mask is not None:
        real = attention_mask.cpu().bool()
        same_document &= real[:, offset:] & real[:, :-offset]
    valid[:, :-offset] = same_document
    targets[:, :-offset] = input_ids[:, offset:].cpu()
    return valid, targets


@torch.no_grad()
def block_hidden_states(model: nn.Module, batch: dict[str, torch.Tensor], **path: Any) -> torch.Tensor:
    """Every block's output for one batch, (blocks, batch, seq, hidden) in float32 on the CPU (the last
    block's after the final norm, as transformers returns it)."""
    inputs = model_inputs(model, batch)
    inputs.pop("labels", None)
    with fixed_depth(model):
        out = model(**inputs, output_hidden_states=True, **path)
    states = out.hidden_states[1:]  # drop the embeddings: blocks 1..L
    return torch.stack([s.float().cpu() for s in states])


def collect_features(model: nn.Module, batches: Sequence[dict[str, torch.Tensor]], offsets: Sequence[int],
                     desc: str, **path: Any) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Per offset: (features (blocks, tokens, hidden), targets (tokens,)) of every probed token."""
    per_offset: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {k: ([], []) for k in offsets}
    for batch in tqdm(batches, desc=desc, unit="batch", dynamic_ncols=True, leave=False):
        states = block_hidden_states(model, batch, **path)
        for offset in offsets:
            valid, targets = probe_targets(batch["input_ids"], batch.get("position_ids"), offset,
                                           batch.get("attention_mask"))
            per_offset[offset][0].append(states[:, valid])
            per_offset[offset][1].append(targets[valid])
    return {k: (torch.cat(feats, dim=1), torch.cat(targs)) for k, (feats, targs) in per_offset.items()}


def _probe_module(kind: str, hidden: int, vocab: int) -> nn.Module:
    if kind == "linear":
        return nn.Linear(hidden, vocab)
    return nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.GELU(), nn.Linear(2 * hidden, vocab))


@dataclass
class ProbeHead:
    """A trained probe with the standardisation it was trained behind: logits = net((x − mean) / spread)."""

    kind: str
    net: nn.Module
    mean: torch.Tensor
    spread: torch.Tensor
    train_loss: float = math.nan

    @torch.no_grad()
    def score(self, x: torch.Tensor, y: torch.Tensor, chunk: int = 4096) -> tuple[float, float]:
        """(mean cross-entropy in nats, top-1 accuracy) of the probe on features x (tokens, hidden), targets y."""
        if x.ndim != 2 or x.shape[1] != self.mean.shape[0] or len(x) != len(y) or len(y) == 0:
            raise ValueError(f"probe features must be (tokens, {self.mean.shape[0]}) with one target each; got "
                             f"{tuple(x.shape)} and {len(y)} targets")
        total, correct = 0.0, 0
        for lo in range(0, len(y), chunk):
            logits = self.net((x[lo : lo + chunk] - self.mean) / self.spread)
            target = y[lo : lo + chunk]
            total += float(nn.functional.cross_entropy(logits, target, reduction="sum"))
            correct += int((logits.argmax(-1) == target).sum())
        return total / len(y), correct / len(y)


def fit_probe(train_x: torch.Tensor, train_y: torch.Tensor, vocab_size: int,
              settings: ProbeSettings = ProbeSettings()) -> ProbeHead:
    """Fit a probe on (train_x, train_y) with AdamW on random minibatches (cosine-decayed lr), features
    standardised with the train split's statistics (kept in the head, so it applies to any split)."""
    if train_x.ndim != 2 or len(train_x) != len(train_y):
        raise ValueError(f"features must be (tokens, hidden) with one target each; got {tuple(train_x.shape)} and "
                         f"{len(train_y)} targets")
    if len(train_y) == 0:
        raise ValueError("a probe needs at least one train token (rows too short for the offset?)")
    if int(train_y.max()) >= vocab_size:
        raise ValueError(f"probe targets reach id {int(train_y.max())}, outside the vocabulary of {vocab_size}")
    mean = train_x.mean(dim=0)
    spread = train_x.std(dim=0).clamp_min(1e-6)
    train_x = (train_x - mean) / spread
    generator = torch.Generator().manual_seed(settings.seed)
    torch.manual_seed(settings.seed)
    probe = _probe_module(settings.kind, train_x.shape[1], vocab_size)
    optimizer = torch.optim.AdamW(probe.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(step, settings.steps) / settings.steps)))
    recent: list[float] = []
    for _ in range(settings.steps):
        pick = torch.randint(0, len(train_y), (min(settings.batch_size, len(train_y)),), generator=generator)
        loss = nn.functional.cross_entropy(probe(train_x[pick]), train_y[pick])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        recent = (recent + [float(loss.detach())])[-20:]
    probe.eval().requires_grad_(False)
    return ProbeHead(settings.kind, probe, mean, spread, sum(recent) / len(recent))


def train_probe(train_x: torch.Tensor, train_y: torch.Tensor, eval_x: torch.Tensor, eval_y: torch.Tensor,
                vocab_size: int, settings: ProbeSettings = ProbeSettings()) -> ProbeResult:
    """Fit a probe on (train_x, train_y) and score it on the held-out (eval_x, eval_y)."""
    if len(eval_y) and int(eval_y.max()) >= vocab_size:
        raise ValueError(f"probe targets reach id {int(eval_y.max())}, outside the vocabulary of {vocab_size}")
    return _result(fit_probe(train_x, train_y, vocab_size, settings), len(train_y), eval_x, eval_y)


def _result(head: ProbeHead, train_tokens: int, eval_x: torch.Tensor, eval_y: torch.Tensor) -> ProbeResult:
    loss, accuracy = head.score(eval_x, eval_y)
    return ProbeResult(loss, accuracy, head.train_loss, train_tokens, len(eval_y))


# ---------------------------------------------------------------------------------------------- saved heads

HEADS_DIR = "probe_heads"


def _head_prefix(offset: int, block: int) -> str:
    return f"offset{offset}.block{block}."


def save_probe_heads(heads: dict[int, dict[int, ProbeHead]], path: str | Path, description: dict[str, Any],
                     results: dict[int, dict[int, ProbeResult]], num_layers: int) -> tuple[Path, Path]:
    """PATH.safetensors (every head's mean, spread and net parameters, named `offset{k}.block{b}.…`) and
    PATH.json (`description` plus, per head, its offset, block, layer name, tensor prefix and held-out loss)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    listed = []
    for offset, per_block in heads.items():
        for block, head in sorted(per_block.items()):
            prefix = _head_prefix(offset, block)
            tensors[prefix + "mean"] = head.mean
            tensors[prefix + "spread"] = head.spread
            tensors.update({f"{prefix}net.{name}": value for name, value in head.net.state_dict().items()})
            result = results[offset][block]
            listed.append({"offset": offset, "block": block, "layer": layer_name(num_layers + 1 - block),
                           "prefix": prefix, "loss": result.loss, "accuracy": result.accuracy})
    first = next(iter(next(iter(heads.values())).values()))
    weights, index = path.with_suffix(".safetensors"), path.with_suffix(".json")
    save_file({name: t.detach().contiguous().cpu() for name, t in tensors.items()}, str(weights))
    index.write_text(json.dumps({**description, "kind": first.kind, "hidden": int(first.mean.shape[0]),
                                 "vocab_size": _vocab_of(first.net), "weights": weights.name, "heads": listed},
                                indent=2) + "\n", encoding="utf-8")
    return weights, index


def load_probe_heads(path: str | Path) -> dict[int, dict[int, ProbeHead]]:
    """The heads `save_probe_heads` wrote (PATH.json or PATH.safetensors), per offset and block, ready to score."""
    index = Path(path).with_suffix(".json")
    if not index.is_file():
        raise FileNotFoundError(f"{index}: no probe-head index here (t2mlr analyze probes writes OUT/{HEADS_DIR}/"
                                "model.json and baseline.json)")
    meta = json.loads(index.read_text(encoding="utf-8"))
    tensors = load_file(str(index.with_name(meta["weights"])))
    heads: dict[int, dict[int, ProbeHead]] = {}
    for entry in meta["heads"]:
        prefix = entry["prefix"]
        net = _probe_module(meta["kind"], meta["hidden"], meta["vocab_size"])
        net.load_state_dict({name[len(prefix) + 4 :]: t for name, t in tensors.items()
                             if name.startswith(prefix + "net.")})
        heads.setdefault(entry["offset"], {})[entry["block"]] = ProbeHead(
            meta["kind"], net.eval().requires_grad_(False), tensors[prefix + "mean"], tensors[prefix + "spread"])
    return heads


def _vocab_of(net: nn.Module) -> int:
    last = net if isinstance(net, nn.Linear) else net[-1]
    return int(last.out_features)


def _split_rows(count: int, rows: int | None, heldout_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Random rows (by `seed`), cut into a train split and a held-out split (whole rows on either side)."""
    if not 0 < heldout_fraction < 1:
        raise ValueError(f"--heldout-fraction must lie in (0, 1), got {heldout_fraction}")
    take = count if rows is None else rows
    if not 2 <= take <= count:
        raise ValueError(f"--rows must lie in [2, {count}] (rows in the data), got {take}")
    picked = np.random.default_rng(seed).permutation(count)[:take].tolist()
    held = max(1, round(take * heldout_fraction))
    return sorted(picked[held:]), sorted(picked[:held])


def probe_model(model: nn.Module, info: ModelInfo, train_batches: Sequence[dict[str, torch.Tensor]],
                eval_batches: Sequence[dict[str, torch.Tensor]], offsets: Sequence[int], settings: ProbeSettings,
                path: dict[str, Any], layers: int | None = None, keep_heads: bool = True,
                ) -> tuple[dict[int, dict[int, ProbeResult]], dict[int, dict[int, ProbeHead]]]:
    """Per offset, {block: probe result} and {block: trained head} for the `layers` blocks nearest the
    head (all L by default); without `keep_heads` each head is dropped once scored (they hold
    2·hidden·vocab weights each), and the second dict stays empty."""
    call = path if info.recurrent else {}
    train = collect_features(model, train_batches, offsets, f"{info.label}: hidden states (train)", **call)
    held = collect_features(model, eval_batches, offsets, f"{info.label}: hidden states (held-out)", **call)
    vocab = int(model.config.get_text_config().vocab_size)
    blocks = probed_blocks(info.num_layers, layers)
    results: dict[int, dict[int, ProbeResult]] = {}
    heads: dict[int, dict[int, ProbeHead]] = {}
    with tqdm(total=len(offsets) * len(blocks), desc=f"{info.label}: probes", unit="probe", dynamic_ncols=True) as bar:
        for offset in offsets:
            (train_x, train_y), (eval_x, eval_y) = train[offset], held[offset]
            results[offset] = {}
            for block in blocks:
                bar.set_postfix(offset=offset, block=block)
                head = fit_probe(train_x[block - 1], train_y, vocab, settings)
                if keep_heads:
                    heads.setdefault(offset, {})[block] = head
                results[offset][block] = _result(head, len(train_y), eval_x[block - 1], eval_y)
                bar.update(1)
    return results, heads


def check_probe_tokens(train_batches: Sequence[dict[str, torch.Tensor]],
                       eval_batches: Sequence[dict[str, torch.Tensor]], offsets: Sequence[int]) -> None:
    """Refuse, before any forward pass, an offset that leaves either split without a token to probe
    (documents shorter than the offset)."""
    for offset in offsets:
        for split, batches in (("train", train_batches), ("held-out", eval_batches)):
            count = sum(int(probe_targets(b["input_ids"], b.get("position_ids"), offset, b.get("attention_mask"))[0]
                            .sum()) for b in batches)
            if count == 0:
                raise ValueError(f"--offset {offset}: no {split} token has a target {offset} tokens ahead in its "
                                 "document; use smaller offsets or more --rows")


def probed_blocks(num_layers: int, layers: int | None) -> list[int]:
    """The blocks (1-based) of the `layers` layers nearest the LM head, ℓ−layers … ℓ−1; all by default."""
    if layers is None:
        return list(range(1, num_layers + 1))
    if not 1 <= layers <= num_layers:
        raise ValueError(f"--layers must lie in [1, {num_layers}] (the model has {num_layers} blocks), got {layers}")
    return list(range(num_layers - layers + 1, num_layers + 1))


def layer_name(from_head: int) -> str:
    """The paper's name of the layer `from_head` blocks back from the LM head: 1 → "ℓ−1" (the last block)."""
    return f"ℓ−{from_head}"


def compare_to_baseline(model: dict[int, dict[int, ProbeResult]], model_layers: int,
                        baseline: dict[int, dict[int, ProbeResult]], baseline_layers: int,
                        offsets: Sequence[int]) -> dict[int, list[dict[str, Any]]]:
    """Per offset, every layer probed in both models (matched by name, ℓ−1 first): both held-out losses
    and their difference model − baseline (negative: the model's state carries more about x_(t+k))."""
    compared: dict[int, list[dict[str, Any]]] = {}
    for offset in offsets:
        ours = {model_layers + 1 - b: r.loss for b, r in model[offset].items()}
        theirs = {baseline_layers + 1 - b: r.loss for b, r in baseline[offset].items()}
        compared[offset] = [{"layer": layer_name(k), "model": ours[k], "baseline": theirs[k],
                             "difference": ours[k] - theirs[k]} for k in sorted(set(ours) & set(theirs))]
    return compared


def _comparison_markdown(compared: dict[int, list[dict[str, Any]]], model: str, baseline: str) -> list[str]:
    """The paper's table per offset: rows model, baseline and difference; columns the layers, ℓ−1 first."""
    lines = [f"## {model} against {baseline}, per offset", "",
             f"Held-out probe loss (nats per token) at each layer; difference = {model} − {baseline} (negative: "
             f"{model}'s state carries more about the token k ahead).", ""]
    for offset, rows in compared.items():
        headers = [f"x(t+{offset})", *[row["layer"] for row in rows]]
        lines += [*table(headers, [[model, *[f"{r['model']:.3f}" for r in rows]],
                                   [baseline, *[f"{r['baseline']:.3f}" for r in rows]],
                                   ["difference", *[f"{r['difference']:+.3f}" for r in rows]]]), ""]
    return lines


def _markdown(models: Sequence[tuple[str, ModelInfo]], results: Sequence[dict[int, dict[int, ProbeResult]]],
              offsets: Sequence[int], settings: ProbeSettings, data: str, split: tuple[int, int], seq_len: int,
              path: dict[str, Any], figure: str, compared: dict[int, list[dict[str, Any]]] | None,
              heads: Sequence[str]) -> list[str]:
    layers = max(len(per_offset[offsets[0]]) for per_offset in results)
    headers = ["model", "offset", *[layer_name(k) for k in range(1, layers + 1)], "best"]
    rows = []
    for (_, info), per_offset in zip(models, results):
        for offset in offsets:
            from_head = [per_offset[offset][b].loss for b in sorted(per_offset[offset], reverse=True)]  # ℓ−1 first
            cells = [f"{loss:.3f}" for loss in from_head] + ["–"] * (layers - len(from_head))
            rows.append([info.label, f"+{offset}", *cells, f"{min(from_head):.3f}"])
    recurrent = [info for _, info in models if info.placement is not None]
    marks = "; ".join(f"{info.label} recurs over blocks {info.placement[0]}–{info.placement[1]}" for info in recurrent)
    tokens = {offset: next(iter(results[0][offset].values())).eval_tokens for offset in offsets}
    comparison = [] if compared is None else _comparison_markdown(compared, models[0][1].label, models[1][1].label)
    return [
        "# Future-token probes",
        "",
        f"{PROBE_NAMES[settings.kind]} probes on frozen hidden states (standardised), one per block, model and offset; "
        f"held-out cross-entropy in nats per token (lower: the state carries more about x_(t+offset)). Data "
        f"`{data}`: {split[0]} rows of {seq_len} tokens to train the probes, {split[1]} held-out rows to score them "
        f"({', '.join(f'{n:,} tokens at +{k}' for k, n in tokens.items())}). Probes: {settings.steps} AdamW steps of "
        f"{settings.batch_size} tokens, lr {settings.lr:g}. T²MLR path: {path.get('recurrence', 'exact')}. "
        f"Columns count layers back from the LM head as the paper does: ℓ−1 is the last block (the final "
        f"norm's output, what the head reads), ℓ−k is block L + 1 − k. {marks}.",
        "",
        *table(headers, rows),
        "",
        *comparison,
        "Models: " + "; ".join(f"{info.label} = `{name}` ({info.parameters:,} parameters)" for name, info in models),
        "",
        ("Trained heads (load with `t2mlr.analysis.probes.load_probe_heads`): " + ", ".join(f"`{h}`" for h in heads)
         if heads else "Trained heads: not saved (--no-save-heads)."),
        "",
        f"![probe loss per block]({figure})",
    ]


def run_probes(
    model_dir: str | Path, data: str | Path, out: str | Path, baseline_dir: str | Path | None = None,
    offsets: Sequence[int] = (1, 2), rows: int | None = 64, heldout_fraction: float = 0.25, batch_size: int = 8,
    seq_len: int | None = None, settings: ProbeSettings = ProbeSettings(), recurrence: str = "exact",
    d_forward: int | None = None, device: str = "auto", seed: int = 0, tokenizer: str | None = None,
    eos_token_id: int | None = None, layers: int | None = None, save_heads: bool = True,
) -> dict[str, Any]:
    """Probe the `layers` blocks nearest the head (every block by default) of the model (and of the
    baseline) at every offset; write probes.md/.json/.png and, unless `save_heads` is off, the trained
    heads under OUT/probe_heads/."""
    offsets = check_offsets(offsets)
    if recurrence not in ("exact", "jacobi"):
        raise ValueError(f"--recurrence must be exact or jacobi, got {recurrence!r}")
    path: dict[str, Any] = {"recurrence": recurrence}
    if recurrence == "jacobi" and d_forward is not None:
        path.update(d_forward=d_forward, d_backward=1)
    dirs = [Path(model_dir)] + ([Path(baseline_dir)] if baseline_dir is not None else [])
    loaded = [(str(d), load_analysis_model(d, device)) for d in dirs]
    infos = [(name, describe_model(model)) for name, model in loaded]
    vocab_sizes = {int(model.config.get_text_config().vocab_size) for _, model in loaded}
    if len(vocab_sizes) > 1:
        raise ValueError(f"the models have different vocabularies {sorted(vocab_sizes)}: probes compare models on "
                         "the same tokens")
    cfg = data_config_for(data, dirs[0], seq_len, tokenizer, eos_token_id)
    dataset = build_dataset(cfg, vocab_sizes.pop(), name="--data")
    train_rows, held_rows = _split_rows(len(dataset), rows, heldout_fraction, seed)
    train_batches = model_batches(dataset, train_rows, batch_size)
    eval_batches = model_batches(dataset, held_rows, batch_size)
    length = int(train_batches[0]["input_ids"].shape[1])
    # refuse bad offsets and a bad --layers before any forward pass
    check_offsets(offsets, length)
    check_probe_tokens(train_batches, eval_batches, offsets)
    for _, info in infos:
        probed_blocks(info.num_layers, layers)
    out = Path(out)
    results, head_files = [], []
    for role, (name, model), (_, info) in zip(("model", "baseline"), loaded, infos):
        per_offset, heads = probe_model(model, info, train_batches, eval_batches, offsets, settings, path, layers,
                                        keep_heads=save_heads)
        results.append(per_offset)
        if save_heads:
            description = {"model_dir": name, "label": info.label, "num_layers": info.num_layers,
                           "settings": asdict(settings), "path": path, "data": str(data), "seq_len": length}
            weights, _ = save_probe_heads(heads, out / HEADS_DIR / role, description, per_offset, info.num_layers)
            head_files.append(str(weights.relative_to(out)))
        del heads
    curves = {(info.label, offset): {b: r.loss for b, r in per_offset[offset].items()}
              for (_, info), per_offset in zip(infos, results) for offset in offsets}
    compared = (compare_to_baseline(results[0], infos[0][1].num_layers, results[1], infos[1][1].num_layers, offsets)
                if len(results) == 2 else None)
    recurrent = [info.placement for _, info in infos if info.placement is not None]
    figure = plot_probes(curves, out / FIGURE, max(info.num_layers for _, info in infos),
                         recurrent[0] if recurrent else None,
                         None if compared is None else {k: {r["layer"]: r["difference"] for r in rows}
                                                        for k, rows in compared.items()})
    payload = {
        "data": str(data), "seq_len": length, "train_rows": train_rows, "heldout_rows": held_rows,
        "offsets": offsets, "layers": layers, "settings": asdict(settings), "path": path,
        "models": [{"model_dir": name, **asdict(info), "heads": head_files[i] if save_heads else None,
                    "probes": {str(k): [{"block": b, "layer": layer_name(info.num_layers + 1 - b), **asdict(r)}
                                        for b, r in sorted(per_offset[k].items())] for k in offsets}}
                   for i, ((name, info), per_offset) in enumerate(zip(infos, results))],
        "comparison": None if compared is None else {str(k): rows for k, rows in compared.items()},
    }
    md, js = write_result(out, STEM, _markdown(infos, results, offsets, settings, str(data),
                                               (len(train_rows), len(held_rows)), length, path, figure.name,
                                               compared, head_files), payload)
    return {"markdown": md, "json": js, "figure": figure, **payload}
