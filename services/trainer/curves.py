"""`curves.png` of a run: reward and accuracy, the cancellation residuals, entropy and step time, read
from the run's `metrics.jsonl` (written at the end of every run; `tgc plot RUN_DIR` for any run)."""

from __future__ import annotations

from pathlib import Path

from services.trainer.metrics import read_metrics

# (panel title, [(metric, label)]); a panel whose metrics never appear in the run is left out.
PANELS: list[tuple[str, list[tuple[str, str]]]] = [
    ("reward", [("reward/mean", "train reward"), ("reward/accuracy", "train accuracy"),
                ("eval/accuracy", "held-out accuracy")]),
    ("cancellation residual", [("diag/d1_gcpr", "D1 (group-common prefix)"), ("diag/d2_residual", "D2 (shared nodes)")]),
    ("token entropy", [("diag/d7_entropy_mean", "all tokens"), ("diag/d7_entropy_shared", "shared tokens"),
                       ("diag/d7_entropy_fork", "forks")]),
    ("seconds per step", [("timing/step_s", "step")]),
]  # fmt: skip


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    """Write the run's curves (default `RUN_DIR/curves.png`) and return the path."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display here or on a cluster
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = read_metrics(run_dir)
    panels = [
        (title, [(k, label) for k, label in series if any(k in r for r in rows)]) for title, series in PANELS
    ]
    panels = [(title, series) for title, series in panels if series]
    if not panels:
        raise ValueError(f"{run_dir}: no step metrics to plot yet")
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.2 * len(panels)), sharex=True, squeeze=False)
    for ax, (title, series) in zip(axes[:, 0], panels, strict=True):
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
    out = Path(out) if out is not None else Path(run_dir) / "curves.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
