"""`curves.png` of a run: the headline metrics (tgc_rl/run_layout.py) and token entropy, read
from the run's `metrics.jsonl` (written at the end of every run; `tgc plot RUN_DIR` for any run)."""

from __future__ import annotations

from pathlib import Path

from tgc_rl.run_layout import CURVE_PANELS, CURVES_FILE
from tgc_rl.trainer.metrics import read_metrics


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    """Write the run's curves (default `RUN_DIR/curves.png`) and return the path."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display here or on a cluster
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = read_metrics(run_dir)
    drawn = [
        (title, [(k, label) for k, label in series if any(k in r for r in rows)])
        for title, series in CURVE_PANELS
    ]
    drawn = [(title, series) for title, series in drawn if series]  # a metric the run never had is left out
    if not drawn:
        raise ValueError(f"{run_dir}: no step metrics to plot yet")
    fig, axes = plt.subplots(len(drawn), 1, figsize=(7, 2.2 * len(drawn)), sharex=True, squeeze=False)
    for ax, (title, series) in zip(axes[:, 0], drawn, strict=True):
        for key, label in series:
            points = [(r["step"], r[key]) for r in rows if key in r]
            ax.plot(*zip(*points, strict=True), marker="o", markersize=3, label=label)
        ax.set_title(title, fontsize=9, loc="left")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
        if title == "cancellation residual":
            ax.set_yscale("symlog", linthresh=1e-6)  # cancelling objectives sit near 1e-9, GRPO near 0.1
    axes[-1, 0].set_xlabel("step")
    axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(Path(run_dir).name, fontsize=10)
    fig.tight_layout()
    out = Path(out) if out is not None else Path(run_dir) / CURVES_FILE
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
