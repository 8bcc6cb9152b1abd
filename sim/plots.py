"""The pictures of a run, as PNG files (matplotlib's Agg backend: no display).

- ``utilization.png``: per kind (cpus, mem), the fraction of the cell allocated
  to tasks, actually used, and held in outstanding offers; the gap between
  allocated and used (the slack) is shaded.
- ``shares.png``: each role's dominant share over time.
- ``pending.png``: the distribution (CDF) of pending time by priority band.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)


def write_plots(out: Path, report: Mapping[str, Any], pending: Mapping[str, list[float]]
                ) -> list[Path]:
    series = report["series"]
    hours = [t / 3600 for t in series["t"]]
    written = [_utilization(out / "utilization.png", hours, series["fractions"]),
               _shares(out / "shares.png", hours, series["dominant_shares"]),
               _pending(out / "pending.png", pending)]
    return written


def _utilization(path: Path, hours: list[float], fractions: Mapping[str, Any]) -> Path:
    fig, axes = plt.subplots(len(fractions), 1, figsize=(10, 3.2 * len(fractions)), sharex=True)
    for ax, (kind, lines) in zip(axes, sorted(fractions.items())):
        ax.plot(hours, lines["allocated"], label="allocated", color="tab:blue")
        ax.plot(hours, lines["used"], label="used", color="tab:green")
        ax.plot(hours, lines["offered"], label="offered", color="tab:orange", linewidth=0.8)
        ax.fill_between(hours, lines["used"], lines["allocated"], color="tab:blue", alpha=0.15,
                        label="slack")
        if any(lines.get("revocable_used", ())):  # oversubscription: what borrowers use
            ax.plot(hours, lines["revocable_used"], label="used on revocable",
                    color="tab:purple", linewidth=0.8)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel(f"{kind} (fraction of cell)")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize="small")
    axes[-1].set_xlabel("simulated hours")
    fig.suptitle("Utilization and slack")
    return _save(fig, path)


def _shares(path: Path, hours: list[float], shares: Mapping[str, list[float]]) -> Path:
    fig, ax = plt.subplots(figsize=(10, 4))
    for role, values in sorted(shares.items()):
        ax.plot(hours, values, label=role)
    ax.set_xlabel("simulated hours")
    ax.set_ylabel("dominant share (weighted)")
    ax.grid(alpha=0.3)
    if shares:
        ax.legend(loc="upper right", fontsize="small")
    ax.set_title("Dominant share by role")
    return _save(fig, path)


def _pending(path: Path, pending: Mapping[str, list[float]]) -> Path:
    fig, ax = plt.subplots(figsize=(10, 4))
    for band, values in pending.items():
        if not values:
            continue
        ordered = sorted(values)
        ys = [(i + 1) / len(ordered) for i in range(len(ordered))]
        ax.step(ordered, ys, where="post", label=f"{band} ({len(ordered)})")
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlabel("pending seconds (wanted -> launched)")
    ax.set_ylabel("fraction of tasks")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    if any(pending.values()):
        ax.legend(loc="lower right", fontsize="small")
    ax.set_title("Pending time by priority band")
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
