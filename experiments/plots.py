"""Figures (matplotlib, Agg backend) from a study's compact results: bars of final values with standard
errors, mean ± s.e. training curves, and ablation panels. Hatched bars: objectives whose rlcore verdict
is "preserves cancellation"."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments.stats import summarize  # noqa: E402

DPI = 72
# One fixed colour per objective in every figure (tab10, then the light tab20 shades).
_PALETTE = list(plt.get_cmap("tab10").colors) + list(plt.get_cmap("tab20").colors[1::2])
_FIXED = (
    "grpo",
    "dr_grpo",
    "dapo",
    "gspo",
    "cispo",
    "dfpo_min",
    "dfpo_orth",
    "cp_grpo",
    "grpo_ar",
    "grpo_lopti",
    "dfpo_min_seqlen",
    "dr_grpo_symgate",
)


def colour(objective: str, order: Sequence[str]) -> Any:
    if objective in _FIXED:
        return _PALETTE[_FIXED.index(objective)]
    return _PALETTE[(len(_FIXED) + order.index(objective)) % len(_PALETTE)] if objective in order else "grey"


def _preserves(cond: dict[str, Any]) -> bool:
    if "preserves" in cond:  # a verdict the condition carries (IBPO: the objective's and its mask's)
        return bool(cond["preserves"])
    import rlcore

    return rlcore.preserves_cancellation(cond["preset"], cond.get("overrides") or {})


def conditions(results: dict[str, Any], group: str) -> list[dict[str, Any]]:
    return [c for c in results["conditions"] if c["group"] == group]


def objective_order(results: dict[str, Any]) -> list[str]:
    seen: list[str] = []
    for c in results["conditions"]:
        if c["objective"] not in seen:
            seen.append(c["objective"])
    return seen


def _name(cond: dict[str, Any], results: dict[str, Any]) -> str:
    """The objective, with its number of seeds when the study has not run all of them for every condition."""
    full = len(results.get("seeds", []))
    partial = any(len(c["seeds"]) < full for c in results["conditions"])
    return f"{cond['objective']} (n={len(cond['seeds'])})" if partial else cond["objective"]


def bar_figure(
    results: dict[str, Any],
    panels: Sequence[tuple[str, str, float | None]],
    path: Path,
    group: str = "main",
    title: str = "",
    cols: int = 4,
) -> Path:
    """One bar panel per (metric, title, reference line) over the objectives of `group`."""
    conds = conditions(results, group)
    order = objective_order(results)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.9 * rows), squeeze=False)
    for ax, (key, label, ref) in zip(axes.flat, panels, strict=False):
        stats = [summarize(c["final"].get(key, [])) for c in conds]
        xs = range(len(conds))
        bars = ax.bar(
            xs,
            [s.mean for s in stats],
            yerr=[s.se if s.n > 1 else 0 for s in stats],
            capsize=2,
            color=[colour(c["objective"], order) for c in conds],
            edgecolor="black",
            linewidth=0.5,
        )
        for bar, c in zip(bars, conds, strict=True):
            if _preserves(c):
                bar.set_hatch("///")
        if ref is not None:
            ax.axhline(ref, color="black", linestyle="--", linewidth=0.8)
        ax.set_xticks(list(xs), [_name(c, results) for c in conds], rotation=60, ha="right", fontsize=7)
        ax.set_title(label, fontsize=9)
        ax.tick_params(axis="y", labelsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def curve_figure(
    results: dict[str, Any],
    panels: Sequence[tuple[str, str, float | None]],
    path: Path,
    group: str = "main",
    objectives: Sequence[str] | None = None,
    title: str = "",
    cols: int = 4,
) -> Path:
    """Mean ± s.e. curves over training, one line per objective."""
    conds = [c for c in conditions(results, group) if objectives is None or c["objective"] in objectives]
    order = objective_order(results)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.8 * rows), squeeze=False)
    for ax, (key, label, ref) in zip(axes.flat, panels, strict=False):
        for c in conds:
            curve = c["curves"].get(key)
            if not curve:
                continue
            x = curve["x"]
            m = [float("nan") if v is None else v for v in curve["mean"]]
            se = [0.0 if v is None else v for v in curve["se"]]
            col = colour(c["objective"], order)
            style = "-" if _preserves(c) else "--"
            ax.plot(x, m, style, color=col, linewidth=1.1, label=_name(c, results))
            ax.fill_between(
                x,
                [a - b for a, b in zip(m, se, strict=True)],
                [a + b for a, b in zip(m, se, strict=True)],
                color=col,
                alpha=0.15,
                linewidth=0,
            )
        if ref is not None:
            ax.axhline(ref, color="black", linestyle=":", linewidth=0.8)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("step", fontsize=7)
        ax.tick_params(labelsize=7)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=7, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.04 + 0.03 * (len(labels) > 6), 1, 1))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def ablation_figure(
    results: dict[str, Any],
    panels: Sequence[tuple[str, str, str, float | None]],
    path: Path,
    title: str = "",
    cols: int = 3,
) -> Path:
    """Panels (ablation group, metric, title, reference): grouped bars per objective, one bar per setting
    of the group plus the main setting for comparison (epochs, group size; split has its own baseline)."""
    order = objective_order(results)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, (group, key, label, ref) in zip(axes.flat, panels, strict=False):
        conds = conditions(results, group)
        objs = [o for o in order if any(c["objective"] == o for c in conds)]
        if group in ("epochs", "group_size"):
            conds = conds + [c for c in conditions(results, "main") if c["objective"] in objs]
        settings = _settings_order(conds, group, results["base"])
        width = 0.8 / max(len(settings), 1)
        shades = plt.get_cmap("viridis")
        for j, setting in enumerate(settings):
            ys, es, xs = [], [], []
            for i, obj in enumerate(objs):
                match = [
                    c
                    for c in conds
                    if c["objective"] == obj and _setting_label(c, group, results["base"]) == setting
                ]
                if not match:
                    continue
                s = summarize(match[0]["final"].get(key, []))
                xs.append(i + (j - (len(settings) - 1) / 2) * width)
                ys.append(s.mean)
                es.append(s.se if s.n > 1 else 0)
            ax.bar(
                xs,
                ys,
                width,
                yerr=es,
                capsize=1.5,
                label=setting,
                color=shades(j / max(len(settings) - 1, 1)),
                edgecolor="black",
                linewidth=0.4,
            )
        if ref is not None:
            ax.axhline(ref, color="black", linestyle="--", linewidth=0.8)
        ax.set_xticks(range(len(objs)), objs, rotation=45, ha="right", fontsize=7)
        ax.set_title(label, fontsize=9)
        ax.tick_params(axis="y", labelsize=7)
        ax.legend(fontsize=6, frameon=False)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _setting_label(cond: dict[str, Any], group: str, base: dict[str, Any]) -> str:
    if cond["group"] == "main":
        if group == "epochs":
            return f"{base['epochs']} epochs"
        if group == "group_size":
            return f"G={base['group_size']}"
    return cond["label"]


def _settings_order(conds: list[dict[str, Any]], group: str, base: dict[str, Any]) -> list[str]:
    labels: list[str] = []
    for c in conds:
        lab = _setting_label(c, group, base)
        if lab not in labels:
            labels.append(lab)
    if group == "group_size":
        labels.sort(key=lambda lab: int(lab.split("=")[1]))
    elif group == "epochs":
        labels.sort(key=lambda lab: int(lab.split()[0]))
    return labels
