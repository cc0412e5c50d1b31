"""What every section of the report is made of: a record's lookup, numbers and
parameters as the tables show them, a table of records, a section's frame and
a plot saved as PNG (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: no display on CI machines or servers
import matplotlib.pyplot as plt

Record = dict[str, Any]


def find(records: list[Record], name: str, **params: Any) -> list[Record]:
    return [
        r
        for r in records
        if r["name"] == name and all(r["params"].get(k) == v for k, v in params.items())
    ]


def num(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "<0.001"  # the results keep 3 decimals
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:,}" if isinstance(v, int) else f"{k}={v}" for k, v in params.items())


def table(records: Iterable[Record]) -> list[str]:
    lines = [
        "| measurement | work | value (median) | min-max | n | peer | peer value | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| `{r['name']}` | {_params(r['params'])} | {num(r['value'])} {r['unit']} "
            f"| {num(r['min'])}-{num(r['max'])} | {r['repeats']} | {r['peer'] or '-'} "
            f"| {num(r['peer_value'])} | {num(r['ratio'])} |"
        )
    return lines


def section(title: str, intro: str, image: str, records: Iterable[Record]) -> list[str]:
    """A report section: heading, what was measured, its plot, its table."""
    return [f"## {title}", "", intro, "", image, "", *table(records), ""]


def plot(path: Path, draw: Callable[[Any], None]) -> None:
    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=110)
    draw(axes)
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
