"""Metric logs (CSV + JSON) and loss-curve PNGs of training runs."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence

from embedlib import storage


def write_history(history: Sequence[dict], output: str, title: str) -> None:
    """``metrics.csv``, ``metrics.json`` and ``loss.png`` beside the saved model."""
    if not history:
        return
    columns = sorted({key for row in history for key in row}, key=lambda k: (k != "step", k))
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows(history)
    storage.write_bytes_atomic(storage.join(output, "metrics.csv"), text.getvalue().encode())
    storage.write_bytes_atomic(
        storage.join(output, "metrics.json"), json.dumps(list(history), indent=1).encode()
    )
    storage.write_bytes_atomic(storage.join(output, "loss.png"), loss_curves_png({title: history}))


def loss_curves_png(curves: dict[str, Sequence[dict]], ylabel: str = "training loss") -> bytes:
    """One PNG with a loss-vs-step line per named history."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, history in curves.items():
        ax.plot([r["step"] for r in history], [r["loss"] for r in history], label=name)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    return finished_png(fig, ax)


def finished_png(fig, ax) -> bytes:
    """Legend, grid, tight layout: the figure as PNG bytes (and closed)."""
    from embedlib.eval.report import figure_png

    ax.legend()
    ax.grid(alpha=0.3)
    return figure_png(fig)


def merge_curve_png(curve: Sequence[dict], chosen: float, ylabel: str = "dev score (INT8)") -> bytes:
    """One PNG of a merge sweep: each dev set's score, their mean and any guard set's score against the weight ``t``
    (shaded: its t = 0 score plus the 95% interval of its change, where the points carry ``guard_change``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ts = [point["t"] for point in curve]
    for name in curve[0]["scores"]:
        ax.plot(ts, [point["scores"][name] for point in curve], marker="o", label=name)
    ax.plot(ts, [point["mean"] for point in curve], marker="s", color="black", label="mean")
    start = next((point for point in curve if point["t"] == 0.0), None)
    for name in curve[0].get("guard", {}):
        line, = ax.plot(ts, [point["guard"][name] for point in curve], marker="^", linestyle=":", label=f"{name} (guard)")
        if start is not None and all("guard_change" in point for point in curve):
            base = start["guard"][name]
            ax.fill_between(ts, [base + point["guard_change"][name]["low"] for point in curve],
                            [base + point["guard_change"][name]["high"] for point in curve], color=line.get_color(),
                            alpha=0.15, label=f"{name}: t = 0 score + 95% interval of the change")
    ax.axvline(chosen, color="grey", linestyle="--", label=f"chosen t={chosen:g}")
    ax.set_xlabel("t (0: first checkpoint, 1: second)")
    ax.set_ylabel(ylabel)
    return finished_png(fig, ax)
