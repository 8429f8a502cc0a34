"""Figures of the analyses and the experiments, each in the layout of the paper's figure or table it reproduces.

* `plot_gradient_fidelity` (figure grad_analysis): cosine similarity and relative l2 distance to the
  anchor against d_forward, one line per d_backward, plus the seconds per forward+backward pass.
* `plot_jacobi_vs_exact` (table jacobi_vs_exact): the five validation losses side by side, and each
  arm's validation loss during training.
* `plot_probes` (table future-token-prediction): probe loss against block, one line per model and offset,
  the recurrent blocks shaded; with offsets t+1 … t+K, beside it the model − baseline difference per layer
  against the offset.
* `plot_jacobi_depths`: a trained model's Jacobi path against its exact path at each evaluation depth.
* `plot_gates` (figure gamma-step): γ_cur and γ_rec against training step, one line per run.
* `plot_placement` (figure loss_vs_lstart, table layer_location): validation loss against l_start, the
  plain Transformer as a horizontal line.
* S5-Retrieval: `plot_accuracy_vs_length` (figure s5_token_acc: exact match and per-token accuracy against N,
  the training range shaded), `plot_accuracy_over_seeds` (the same, mean and min–max band over seeds),
  `plot_cosine_grid` and `plot_accuracy_by_depth` (the evidence study's summaries).
* Finetunes: `plot_pass_at_1` (figure finetuning-multihop: one bar group per task, one bar per arm, the 95%
  interval as an error bar and each seed as a dot).
* `plot_loss_curves` (pretraining: training loss per token, the periodic validation loss per token and per second) and
  `plot_retrofit` (accuracy per model, finetuning loss per arm).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.ticker import MaxNLocator

from t2mlr.training.plot import pyplot, save_figure

plt = pyplot()  # files only (Agg): works on headless machines and in tests

__all__ = ["plot_accuracy_by_depth", "plot_accuracy_over_seeds", "plot_accuracy_vs_length", "plot_cosine_grid",
           "plot_gates", "plot_gradient_fidelity", "plot_jacobi_depths", "plot_jacobi_vs_exact", "plot_loss_curves",
           "plot_pass_at_1", "plot_placement", "plot_probes", "plot_retrofit"]


def plot_gradient_fidelity(rows: Sequence[Any], anchor: Any, path: str | Path, title: str = "") -> Path:
    """Three panels over d_forward (log2 axis): cosine, relative l2, seconds; one line per d_backward."""
    by_backward: dict[int, list[Any]] = {}
    for row in rows:
        by_backward.setdefault(row.d_backward, []).append(row)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    panels = (("cosine", "cosine similarity to the anchor"), ("relative_l2", "relative ℓ2 distance to the anchor"),
              ("seconds", "seconds per forward + backward"))
    for ax, (key, ylabel) in zip(axes, panels):
        for backward, group in sorted(by_backward.items()):
            group = sorted(group, key=lambda r: r.d_forward)
            ax.plot([r.d_forward for r in group], [getattr(r, key) for r in group], marker="o",
                    label=f"d_backward = {backward}")
        ax.plot([anchor.d_forward], [getattr(anchor, key)], marker="*", markersize=12, color="black", linestyle="none",
                label=f"anchor ({anchor.d_forward}, {anchor.d_backward})")
        ax.set_xscale("log", base=2)
        ax.set(xlabel="d_forward", ylabel=ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return save_figure(fig, path, title)


def plot_jacobi_vs_exact(losses: Mapping[str, float], curves: Mapping[str, Sequence[tuple[int, float]]],
                         path: str | Path) -> Path:
    """Left: the table's validation losses as bars in the given order (values printed; grey for the
    Transformer, one colour per training path); right: validation loss during training."""
    fig, (bars, lines) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [1.2, 1]})
    names = list(losses)
    values = [losses[n] for n in names]
    colours = ["C0" if "Jacobi train" in n else "C1" if "exact train" in n else "0.6" for n in names]
    drawn = bars.bar(range(len(names)), values, color=colours)  # grey: the Transformer; colour: training path
    bars.bar_label(drawn, labels=[f"{v:.4f}" for v in values], fontsize=8)
    bars.set_xticks(range(len(names)), [n.replace(": ", ":\n").replace(", ", ",\n") for n in names], fontsize=8)
    low, high = min(values), max(values)
    margin = max(high - low, 1e-3)
    bars.set_ylim(low - 2 * margin, high + margin)
    bars.set(ylabel="validation loss (nats/token)", title="final validation loss")
    drawn_curves = 0
    for label, points in curves.items():
        if points:
            lines.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=label)
            drawn_curves += 1
    lines.set(xlabel="training step", ylabel="validation loss (the run's eval path)", title="during training")
    lines.grid(alpha=0.3)
    if drawn_curves:
        lines.legend(fontsize=8)
    else:
        lines.text(0.5, 0.5, "no periodic evaluation logged\n(eval.every = 0)", ha="center", va="center",
                   transform=lines.transAxes)
    return save_figure(fig, path)


def plot_jacobi_depths(rows: Sequence[Any], path: str | Path, title: str = "") -> Path:
    """Three panels over d_forward (log2 axis): the loss gap to the exact path, the argmax agreement at the
    scored positions, and the relative distance of the last state from the exact one (log axis)."""
    depths = [r.d_forward for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    panels = (("loss_gap", "loss − exact loss (nats/token)", "linear"),
              ("argmax_agreement", "argmax = exact (share of scored positions)", "linear"),
              ("state_gap", "‖R_d − R_exact‖ / ‖R_exact‖ (last token, max over rows)", "log"))
    for ax, (key, ylabel, scale) in zip(axes, panels):
        values = [getattr(r, key) for r in rows]
        ax.plot(depths, [max(v, 1e-12) for v in values] if scale == "log" else values, marker="o")
        ax.set_xscale("log", base=2)
        ax.set(yscale=scale, xlabel="Jacobi d_forward")
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
    return save_figure(fig, path, title)


def plot_probes(curves: Mapping[tuple[str, int], Mapping[int, float]], path: str | Path, num_layers: int,
                placement: tuple[int, int] | None = None,
                differences: Mapping[int, Mapping[str, float]] | None = None) -> Path:
    """Probe loss against block: one colour per model, one line style and marker per offset; each tick
    also names the layer counted back from the LM head (ℓ−1 = the last block), as the paper's table does.
    With several offsets a second panel runs along the offset (t+1 … t+K): the model − baseline difference
    per layer when `differences` ({offset: {layer name: difference}}) is given, else each model's loss at ℓ−1."""
    models = list(dict.fromkeys(model for model, _ in curves))
    offsets = sorted({offset for _, offset in curves})
    fig, axes = plt.subplots(1, 2 if len(offsets) > 1 else 1, figsize=(13 if len(offsets) > 1 else 7.5, 4.5),
                             squeeze=False)
    ax = axes[0][0]
    styles, markers = ["-", "--", ":", "-."], ["o", "s", "^", "v", "D", "P", "X", "*"]
    if placement is not None:
        ax.axvspan(placement[0] - 0.5, placement[1] + 0.5, color="0.92", zorder=0, label="T²MLR recurrent blocks")
    for (model, offset), losses in curves.items():
        blocks = sorted(losses)
        index = offsets.index(offset)
        ax.plot(blocks, [losses[b] for b in blocks], marker=markers[index % len(markers)], markersize=3,
                color=f"C{models.index(model)}", linestyle=styles[index % len(styles)], label=f"{model}, x(t+{offset})")
    probed = sorted({b for losses in curves.values() for b in losses})
    ax.set_xticks(probed, [f"{b}\nℓ−{num_layers + 1 - b}" for b in probed])
    ax.set_xlim(probed[0] - 0.6, probed[-1] + 0.6)
    ax.set(xlabel="block (top) = layer counted back from the LM head (bottom; ℓ−1 after the final norm)",
           ylabel="held-out probe loss (nats/token)", title="future-token probes")
    if len(offsets) > 1:
        by_offset = axes[0][1]
        if differences is not None:
            layers = list(dict.fromkeys(layer for k in offsets for layer in differences[k]))
            by_offset.axhline(0.0, color="grey", linewidth=0.8)
            for index, layer in enumerate(layers):
                by_offset.plot(offsets, [differences[k][layer] for k in offsets], marker=markers[index % len(markers)],
                               color=f"C{index}", label=layer)
            by_offset.set(ylabel=f"{models[0]} − {models[1]} probe loss (nats/token)",
                          title="difference against offset (below 0: the model anticipates better)")
        else:
            for model in models:
                last = [curves[(model, k)][max(curves[(model, k)])] for k in offsets]
                by_offset.plot(offsets, last, marker="o", color=f"C{models.index(model)}", label=model)
            by_offset.set(ylabel="held-out probe loss at ℓ−1 (nats/token)", title="loss against offset (last block)")
        by_offset.set_xticks(offsets, [f"t+{k}" for k in offsets])
        by_offset.set_xlabel("probed token")
    for panel in axes[0]:
        panel.grid(alpha=0.3)
        panel.legend(fontsize=7, ncol=2 if len(curves) > 4 else 1)
    return save_figure(fig, path)


def plot_gates(runs: Mapping[str, tuple[Sequence[int], Sequence[float], Sequence[float]]], path: str | Path) -> Path:
    """γ_cur and γ_rec against step; one run: both gates on one panel, several runs: one panel per gate."""
    if len(runs) == 1:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        (name, (steps, cur, rec)), = runs.items()
        ax.plot(steps, cur, label="γ_cur")
        ax.plot(steps, rec, label="γ_rec")
        ax.set_title(f"fusion gates: {Path(name).name or name}")
        axes = [ax]
    else:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharex=True)
        for index, (name, (steps, cur, rec)) in enumerate(runs.items()):
            axes[0].plot(steps, cur, color=f"C{index}", label=name)
            axes[1].plot(steps, rec, color=f"C{index}", label=name)
        axes[0].set_title("γ_cur")
        axes[1].set_title("γ_rec")
    for ax in axes:
        ax.axhline(0.0, color="grey", linewidth=0.6)
        ax.set(xlabel="training step", ylabel="gate value (Φ uses tanh γ)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_placement(rows: Sequence[Mapping[str, Any]], baseline_loss: float | None, path: str | Path,
                   num_layers: int, width: int | None = None) -> Path:
    """Validation loss against l_start, each point labelled (l_start, l_end); the Transformer dashed."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ordered = sorted(rows, key=lambda r: r["l_start"])
    ax.plot([r["l_start"] for r in ordered], [r["loss"] for r in ordered], marker="o", label="T²MLR")
    for r in ordered:
        ax.annotate(f"({r['l_start']},{r['l_end']})", (r["l_start"], r["loss"]), textcoords="offset points",
                    xytext=(0, 6), ha="center", fontsize=8)
    if baseline_loss is not None:
        ax.axhline(baseline_loss, color="black", linestyle="--", linewidth=1, label="Transformer (matched)")
    ax.set_xlim(0.5, num_layers + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="l_start" + (f" (D = {width})" if width else " (l_end = L + 1 − l_start)"),
           ylabel="validation loss (nats/token)", title=f"recurrence placement, {num_layers} blocks")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


Curve = Mapping[int, tuple[float, float]]  # N -> (exact match, token accuracy)


ACCURACY_PANELS = ((0, "sequence exact match"), (1, "per-token accuracy"))  # (index of the metric, its label)


def _accuracy_panel(ax: plt.Axes, ylabel: str, train_range: tuple[int, int], legend: bool) -> None:
    """An accuracy-against-N panel: the training range shaded, its largest N dotted (both in the legend when
    `legend`), integer ticks, y in [0, 1]."""
    lo, hi = train_range
    ax.axvspan(lo - 0.5, hi + 0.5, color="0.92", zorder=0, label=f"training N {lo}–{hi}" if legend else None)
    ax.axvline(hi + 0.5, color="0.25", linestyle=":", linewidth=1.5, label="max N seen in training" if legend else None)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(ylabel=ylabel, ylim=(-0.03, 1.03))
    ax.grid(alpha=0.3)


def plot_accuracy_vs_length(
    curves: Mapping[str, Curve], train_range: tuple[int, int], path: str | Path, title: str = "S5-Retrieval"
) -> Path:
    """Write the two-panel PNG to `path` and return it."""
    if not curves:
        raise ValueError("no model curves to plot")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 6.5), sharex=True)
    for ax, (metric, ylabel) in zip((top, bottom), ACCURACY_PANELS):
        _accuracy_panel(ax, ylabel, train_range, legend=True)
        for name, curve in curves.items():
            ns = sorted(curve)
            ax.plot(ns, [curve[n][metric] for n in ns], marker="o", markersize=3, linewidth=1.5, label=name)
    bottom.set_xlabel("number of actions N")
    top.set_title(title)
    top.legend(loc="best", fontsize=8)
    return save_figure(fig, path)


SeedCurves = Mapping[int, Mapping[int, float]]  # seed -> N -> value


def _mean_min_max(values: Sequence[Sequence[float]]) -> tuple[list[float], list[float], list[float]]:
    """Per group of values (e.g. one per seed): the mean, the least and the greatest."""
    return [sum(v) / len(v) for v in values], [min(v) for v in values], [max(v) for v in values]


def _mean_and_error_bars(values: Sequence[Sequence[float]]) -> tuple[list[float], list[list[float]]]:
    """The means and matplotlib's `yerr` for min–max error bars around them."""
    mean, low, high = _mean_min_max(values)
    return mean, [[m - lo for m, lo in zip(mean, low)], [hi - m for m, hi in zip(mean, high)]]


def _mean_band(curves: SeedCurves) -> tuple[list[int], list[float], list[float], list[float]]:
    ns = sorted({n for curve in curves.values() for n in curve})
    return ns, *_mean_min_max([[curve[n] for curve in curves.values() if n in curve] for n in ns])


def plot_accuracy_over_seeds(arms: Mapping[str, tuple[SeedCurves, SeedCurves]], train_range: tuple[int, int],
                             path: str | Path, title: str = "S5-Retrieval") -> Path:
    """The two-panel accuracy-vs-N figure over several seeds: per arm the mean over seeds as a line and the
    range (min to max) as a band; `arms`: label -> (exact-match curves, token-accuracy curves) by seed."""
    if not arms:
        raise ValueError("no arm curves to plot")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8.5, 7.5), sharex=True)
    for ax, (index, ylabel) in zip((top, bottom), ACCURACY_PANELS):
        _accuracy_panel(ax, ylabel, train_range, legend=False)
        for colour, (label, curves) in enumerate(arms.items()):
            ns, mean, low, high = _mean_band(curves[index])
            seeds = len(curves[index])
            ax.plot(ns, mean, marker="o", markersize=3, linewidth=1.5, color=f"C{colour % 10}",
                    label=f"{label} ({seeds} seed{'s' if seeds != 1 else ''})")
            ax.fill_between(ns, low, high, color=f"C{colour % 10}", alpha=0.15, linewidth=0)
    lo, hi = train_range
    bottom.set_xlabel(f"number of actions N (shaded: training N {lo}–{hi}; lines: mean over seeds, bands: min–max)")
    top.set_title(title)
    top.legend(loc="best", fontsize=7)
    return save_figure(fig, path)


def plot_cosine_grid(panels: Mapping[str, Mapping[tuple[int, int], list[float]]], path: str | Path,
                     anchor: str) -> Path:
    """Cosine to the anchor against d_forward (log2), one line per d_backward, one panel per model/checkpoint;
    `panels`: title -> (d_forward, d_backward) -> cosine per seed (mean drawn, min–max as error bars)."""
    if not panels:
        raise ValueError("no gradient-fidelity results to plot")
    columns = min(2, len(panels))
    rows = (len(panels) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(6.5 * columns, 3.8 * rows), squeeze=False, sharey=True)
    for ax, (title, cells) in zip(axes.flat, panels.items()):
        for colour, backward in enumerate(sorted({b for _, b in cells})):
            forwards = sorted(f for f, b in cells if b == backward)
            mean, errors = _mean_and_error_bars([cells[(f, backward)] for f in forwards])
            ax.errorbar(forwards, mean, yerr=errors, marker="o", markersize=4, capsize=3, color=f"C{colour}",
                        label=f"d_backward = {backward}")
        ax.set_xscale("log", base=2)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("d_forward")
        ax.set_ylabel(f"cosine to {anchor} gradient", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    return save_figure(fig, path)


def plot_accuracy_by_depth(arms: Mapping[str, Mapping[str, list[float]]], path: str | Path, ylabel: str) -> Path:
    """A trained model's accuracy on each evaluation path: `arms`: label -> path name ("exact", "Jacobi 2", ...)
    -> value per seed; points are the mean, error bars min–max, paths in the given order."""
    if not arms:
        raise ValueError("no depth results to plot")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for colour, (label, by_path) in enumerate(arms.items()):
        names = list(by_path)
        mean, errors = _mean_and_error_bars(list(by_path.values()))
        ax.errorbar(range(len(names)), mean, yerr=errors, marker="o", capsize=3, color=f"C{colour % 10}", label=label)
        ax.set_xticks(range(len(names)), names)
    ax.set(xlabel="evaluation path (J: Jacobi at d_forward; R off: the recurrence ablated)", ylabel=ylabel,
           ylim=(-0.03, 1.03))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


# task label -> arm label -> one (pass@1, low, high) per seed
Bars = Mapping[str, Mapping[str, Sequence[tuple[float, float, float]]]]


def plot_pass_at_1(bars: Bars, path: str | Path, title: str = "Reasoning finetunes") -> Path:
    """Write the grouped bar chart to `path` (PNG) and return it."""
    tasks = list(bars)
    arms = list(dict.fromkeys(arm for task in tasks for arm in bars[task]))
    width = 0.8 / max(1, len(arms))
    fig, ax = plt.subplots(figsize=(3.4 + 1.6 * len(tasks) + 0.3 * len(arms), 3.6))
    for j, arm in enumerate(arms):
        xs, heights, lows, highs = [], [], [], []
        for i, task in enumerate(tasks):
            seeds = bars[task].get(arm)
            if not seeds:
                continue
            x = i - 0.4 + width * (j + 0.5)
            mean = sum(s[0] for s in seeds) / len(seeds)
            xs.append(x)
            heights.append(mean)
            lows.append(max(0.0, mean - min(s[1] for s in seeds)))  # float noise must not make a bar negative
            highs.append(max(0.0, max(s[2] for s in seeds) - mean))
            if len(seeds) > 1:
                ax.scatter([x] * len(seeds), [s[0] for s in seeds], color="black", s=8, zorder=3)
        ax.bar(xs, heights, width=width * 0.95, yerr=[lows, highs], capsize=3, label=arm, zorder=2)
    ax.set_xticks(range(len(tasks)), tasks)
    ax.set(ylabel="pass@1", ylim=(0, 1.05))
    ax.grid(axis="y", alpha=0.3, zorder=0)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return save_figure(fig, path)


def _smooth(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over `window` points (the first points average what there is)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def plot_loss_curves(curves: Mapping[str, Mapping[str, Sequence[tuple[int, float]]]], labels: Mapping[str, str],
                     path: str | Path) -> Path:
    """Each run's training loss per token (mean of 10 steps), and its periodic validation loss per token and per
    second of training steps (curves from `t2mlr.experiments.pretrain.loss_curves`): arms that differ in speed
    compare at equal data on the first two panels and at equal time on the third."""
    from t2mlr.training.metrics import values_at_steps

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(16, 4.2))
    for name, curve in curves.items():
        steps, losses = zip(*curve["train"], strict=True) if curve["train"] else ((), ())
        left.plot(values_at_steps(curve["tokens"], steps), _smooth(list(losses), 10), label=labels[name])
        if curve["eval"]:
            eval_steps, eval_losses = zip(*curve["eval"], strict=True)
            for axis, x in ((middle, "tokens"), (right, "step_seconds")):
                axis.plot(values_at_steps(curve[x], eval_steps), eval_losses, marker="o", markersize=3,
                          label=labels[name])
    left.set(xlabel="training tokens", ylabel="training loss (nats/token, mean of 10 steps)", title="training")
    middle.set(xlabel="training tokens", ylabel="validation loss (Jacobi path for T²MLR)", title="held-out text, per token")
    right.set(xlabel="seconds of training steps", ylabel="validation loss (Jacobi path for T²MLR)",
              title="held-out text, per second")
    for axis in (left, middle, right):
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=8)
    return save_figure(fig, path)


def plot_retrofit(accuracy: Mapping[str, float], losses: Mapping[str, Sequence[float]], ylabel: str,
                  path: str | Path) -> Path:
    """Accuracy per model as bars (left) and the training loss per finetuned arm (right)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.bar([name.replace(" ", "\n", 1) for name in accuracy], list(accuracy.values()),
             color=["grey", "tab:blue", "tab:orange"][: len(accuracy)])
    left.set(ylabel=ylabel, title="held-out accuracy")
    for (name, values), colour in zip(losses.items(), ("tab:blue", "tab:orange")):
        right.plot(range(1, len(values) + 1), values, label=name, color=colour)
    right.set(xlabel="step", ylabel="training loss (reply tokens)", title="finetuning loss")
    right.legend()
    return save_figure(fig, path)
