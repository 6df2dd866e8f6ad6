"""A short text table of an evaluation summary (the JSON holds everything)."""

from __future__ import annotations

from typing import Any


def summary_table(task: str, summary: dict[str, Any]) -> str:
    """Rows `metric  value  [95% interval]` for the summary's numbers."""
    rows = [("task", task, "")]
    for key, value in summary.items():
        if key.endswith("_ci95") or isinstance(value, (list, dict)):
            continue
        ci = summary.get(f"{key}_ci95")
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        rows.append((key, shown, f"[{ci[0]:.4f}, {ci[1]:.4f}]" if ci else ""))
    width = max(len(r[0]) for r in rows)
    lines = [f"{name:<{width}}  {value:>10}  {ci}".rstrip() for name, value, ci in rows]
    return "\n".join(lines)
