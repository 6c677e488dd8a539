"""What a search found, as lines of text: a tune search's best and Pareto front, the max-batch answers, and what
sequential repeats spent. `sweep submit`, `sweep results` and the tuner (`python -m kubesweep.tune`) print them.
Every value comes from a summary file (a search's storage or its MLflow artifact): shown as text, never markup.
"""

from __future__ import annotations

from typing import Any

from kubesweep.terminal_text import clean
from kubesweep.terminal_text import value_text as _value


def repeats_lines(summary: dict[str, Any]) -> list[str]:
    """What sequential repeats spent: the rule, the repeats against a fixed min and max, and the cells that stopped
    without reaching the target (at max, with no value, or host-bound)."""
    rule = summary.get("rule") or {}
    cells = summary.get("cells") or []
    low, high = _value(rule.get("min")), _value(rule.get("max"))
    lines = [f"repeats until the 95% interval of {_value(rule.get('metric'))} is within ±{_value(rule.get('target'))}% "
             f"({low} to {high} per cell): {_value(summary.get('repeats'))} repeats over {len(cells)} cells (a fixed "
             f"{low}: {_value(summary.get('fixed_min'))}, a fixed {high}: {_value(summary.get('fixed_max'))})"]
    for cell in cells:
        if not isinstance(cell, dict) or cell.get("stopped") not in ("max", "no value", "host-bound"):
            continue
        axes = cell.get("axes")
        axes = axes if isinstance(axes, dict) else {}
        where = " ".join(f"{k}={_value(v)}" for k, v in axes.items())
        n = _value(cell.get("repeats"))
        width = cell.get("half_width_pct")
        if cell["stopped"] == "no value":
            why = f"no value in {n} repeats"
        elif cell["stopped"] == "host-bound":
            spread = f" at ±{width:.1f}%" if isinstance(width, int | float) else ""
            why = (f"stopped after {n} repeats{spread}: host-bound (its spread is the host's; more repeats "
                   "measure it again)")
        elif isinstance(width, int | float):
            why = f"stopped at the max of {n} repeats at ±{width:.1f}%"
        else:
            why = f"stopped at the max of {n} repeats without an interval"
        lines.append(f"  {clean(where, keep_lines=False)}: {why}")
    return [clean(line, keep_lines=False) for line in lines]


def search_lines(summary: dict[str, Any]) -> list[str]:
    """What a tune or max-batch search found, as lines of text."""
    lines: list[str] = []
    if summary.get("strategy") == "repeats":
        return repeats_lines(summary)
    if "cells" in summary:  # max-batch
        for cell in _dicts(summary.get("cells")):
            found = cell.get("max_batch")
            text = f"{found}" if found is not None else f"none fits (smallest tried: {cell.get('low')})"
            lines.append(f"max batch size {cell.get('gpu') or 'cpu'} {cell.get('precision')}: {text} "
                         f"({cell.get('probes')} probes)")
        return [clean(line, keep_lines=False) for line in lines]
    trials = _dicts(summary.get("trials"))
    outcomes: dict[str, int] = {}
    for t in trials:
        outcome = str(t.get("outcome"))
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    counts = ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items()))
    metrics = [str(m) for m in _list(summary.get("metrics"))]
    modes = [str(m) for m in _list(summary.get("modes"))]
    lines.append(f"tune: {len(trials)} trials ({counts}); metric {', '.join(metrics)} "
                 f"({', '.join(modes)})" + ("; resumed" if summary.get("resumed") else ""))
    best = summary.get("best")
    if isinstance(best, dict) and best:
        lines.append(f"best: {_row_text(best)}")
    elif trials:
        lines.append("best: none (no trial succeeded within the constraints)")
    for row in _dicts(summary.get("pareto")):
        lines.append(f"pareto: {_row_text(row)}")
    return [clean(line, keep_lines=False) for line in lines]


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dicts(value: Any) -> list[dict[str, Any]]:
    """The mappings of a summary's list (a summary file is data: anything else in it is passed over)."""
    return [item for item in _list(value) if isinstance(item, dict)]


def _row_text(row: dict[str, Any]) -> str:
    """`t-7 (samples_per_s 1235) with batch_size=64`: a trial of a tune summary."""
    metrics = row.get("metrics") if isinstance(row.get("metrics"), dict) else {}
    axes = row.get("axes") if isinstance(row.get("axes"), dict) else {}
    values = ", ".join(f"{k} {_fmt_num(v)}" for k, v in (metrics or {}).items())
    return f"{row.get('name')} ({values}) with {_axes_text(axes or {})}"


def _fmt_num(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _axes_text(axes: dict[str, Any]) -> str:
    return " ".join(f"{k}={_fmt_num(v)}" for k, v in axes.items())
