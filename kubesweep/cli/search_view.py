"""What a search found, as lines of text: a tune search's best and Pareto front, the max-batch answers, and what
sequential repeats spent. `sweep submit`, `sweep results` and the tuner (`python -m kubesweep.tune`) print them.
Every value comes from a summary file (a search's storage or its MLflow artifact): shown as text, never markup.
"""

from __future__ import annotations

from typing import Any

from kubesweep.cli.terminal_text import clean
from kubesweep.cli.terminal_text import value_text as _value
from kubesweep.wire.search import MaxBatchSummary, RepeatsSummary, SearchSummary, TuneTrial


def repeats_lines(summary: RepeatsSummary) -> list[str]:
    """What sequential repeats spent: the rule, the repeats against a fixed min and max, and the cells that stopped
    without reaching the target (at max, with no value, or host-bound)."""
    rule, cells = summary.rule, summary.cells
    low, high = _value(rule.min), _value(rule.max)
    lines = [f"repeats until the 95% interval of {_value(rule.metric)} is within ±{_value(rule.target)}% "
             f"({low} to {high} per cell): {_value(summary.repeats)} repeats over {len(cells)} cells (a fixed "
             f"{low}: {_value(summary.fixed_min)}, a fixed {high}: {_value(summary.fixed_max)})"]
    for cell in cells:
        if cell.stopped not in ("max", "no value", "host-bound"):
            continue
        where = " ".join(f"{k}={_value(v)}" for k, v in cell.axes.items())
        n = _value(cell.repeats)
        width = cell.half_width_pct
        if cell.stopped == "no value":
            why = f"no value in {n} repeats"
        elif cell.stopped == "host-bound":
            spread = f" at ±{width:.1f}%" if width is not None else ""
            why = (f"stopped after {n} repeats{spread}: host-bound (its spread is the host's; more repeats "
                   "measure it again)")
        elif width is not None:
            why = f"stopped at the max of {n} repeats at ±{width:.1f}%"
        else:
            why = f"stopped at the max of {n} repeats without an interval"
        lines.append(f"  {clean(where, keep_lines=False)}: {why}")
    return [clean(line, keep_lines=False) for line in lines]


def search_lines(summary: SearchSummary) -> list[str]:
    """What a tune, max-batch or sequential repeats search found, as lines of text."""
    lines: list[str] = []
    if isinstance(summary, RepeatsSummary):
        return repeats_lines(summary)
    if isinstance(summary, MaxBatchSummary):
        for cell in summary.cells:
            found = cell.max_batch
            text = f"{found}" if found is not None else f"none fits (smallest tried: {cell.low})"
            lines.append(f"max batch size {cell.gpu or 'cpu'} {cell.precision}: {text} ({cell.probes} probes)")
        return [clean(line, keep_lines=False) for line in lines]
    outcomes: dict[str, int] = {}
    for t in summary.trials:
        outcomes[t.outcome] = outcomes.get(t.outcome, 0) + 1
    counts = ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items()))
    lines.append(f"tune: {len(summary.trials)} trials ({counts}); metric {', '.join(summary.metrics)} "
                 f"({', '.join(summary.modes)})" + ("; resumed" if summary.resumed else ""))
    if summary.best is not None:
        lines.append(f"best: {_row_text(summary.best)}")
    elif summary.trials:
        lines.append("best: none (no trial succeeded within the constraints)")
    for row in summary.pareto:
        lines.append(f"pareto: {_row_text(row)}")
    return [clean(line, keep_lines=False) for line in lines]


def _row_text(row: TuneTrial) -> str:
    """`t-7 (samples_per_s 1235) with batch_size=64`: a trial of a tune summary."""
    values = ", ".join(f"{k} {_fmt_num(v)}" for k, v in row.metrics.items())
    return f"{row.name} ({values}) with {_axes_text(row.axes)}"


def _fmt_num(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _axes_text(axes: dict[str, Any]) -> str:
    return " ".join(f"{k}={_fmt_num(v)}" for k, v in axes.items())
