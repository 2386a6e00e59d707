"""The run's report: report.json (per-stage loss curves, times, held-out tau per domain before and after each
stage, the memory plan), and report.png with the curves and the tau where matplotlib is installed (the `load`
extra; the run does not need it)."""

from __future__ import annotations

import json
from pathlib import Path


def write_report(report: dict, work: Path) -> list[Path]:
    """Write the report files into `work`; returns their paths."""
    path = work / "report.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    written = [path]
    plot = plot_report(report, work / "report.png")
    if plot is not None:
        written.append(plot)
    return written


def plot_report(report: dict, path: Path) -> Path | None:
    """One panel per stage's loss curve and one of tau per domain at each point; None without matplotlib."""
    try:
        import matplotlib  # noqa: PLC0415 (optional)
    except ModuleNotFoundError:
        return None
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt  # noqa: PLC0415

    curves = {name: s["losses"] for name, s in report["stages"].items() if s.get("losses")}
    fig, axes = plt.subplots(1, len(curves) + 1, figsize=(4 * (len(curves) + 1), 3.2), squeeze=False)
    for ax, (name, losses) in zip(axes[0], curves.items()):
        ax.plot(range(1, len(losses) + 1), losses, linewidth=0.8)
        ax.set(title=f"{name} loss", xlabel="step")
    _tau_panel(axes[0][-1], report["tau"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _tau_panel(ax, tau: dict[str, dict]) -> None:  # noqa: ANN001 (a matplotlib Axes)
    """Grouped bars: held-out tau per domain, one bar per point of the run."""
    domains = sorted({d for figures in tau.values() for d in figures})
    width = 0.8 / max(1, len(tau))
    for k, (point, figures) in enumerate(tau.items()):
        ax.bar([i + k * width for i in range(len(domains))], [figures.get(d) or 0 for d in domains], width,
               label=point)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(domains))], domains, rotation=30)
    ax.set(title="held-out tau (dflash, greedy)")
    ax.legend(fontsize=7)
