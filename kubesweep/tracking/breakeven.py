"""When torch.compile pays off: per compiled setting, against the same setting run eager.

For a compiled cell and its eager twin (same task, GPU type, GPUs, batch, precision and other settings):
- extra warm-up = compiled warm-up s - eager warm-up s (means over repeats; `timings.compile_warmup_s`, the
  steps reported apart, compilation included);
- saved per step = global batch / eager samples/s - global batch / compiled samples/s (the measured steps);
- break-even steps = extra warm-up / saved per step, rounded up; break-even epochs = break-even steps / steps
  per epoch (training rows / global batch).
A compiled setting that is not faster per step never pays off; one that warms up no slower pays off from its first
step. Fine-tuning cells only: inference has no epochs, and its warm-up is reported with its latency.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from kubesweep.tracking.aggregate import Cell


@dataclass(frozen=True)
class BreakEven:
    compiled: Cell
    eager: Cell
    extra_warmup_s: float
    saved_per_step_s: float
    steps: int | None  # None: never (not faster per step)
    epochs: float | None

    @property
    def text(self) -> str:
        if self.steps is None:
            return "never: not faster per step"
        if self.steps == 0:
            return "from the first step"
        epochs = f" ({self.epochs:.2g} epochs)" if self.epochs is not None else ""
        return f"after {self.steps:,} steps{epochs}"


def _twin_key(cell: Cell) -> str:
    axes = {k: v for k, v in cell.axes.as_dict().items() if k != "compile"}
    return json.dumps({"axes": axes, "extra": cell.extra}, sort_keys=True, default=str)


def _rows_per_epoch(cell: Cell) -> int | None:
    for trial in cell.trials:
        rows = (trial.results.data or {}).get("train_rows") if trial.results is not None else None
        if isinstance(rows, int) and rows > 0:
            return rows
    return None


def break_even(compiled: Cell, eager: Cell) -> BreakEven | None:
    """The break-even of `compiled` against `eager` (None where either lacks the numbers)."""
    rate_c, rate_e = compiled.value("samples_per_s"), eager.value("samples_per_s")
    warm_c, warm_e = compiled.value("warmup_s"), eager.value("warmup_s")
    batch = compiled.axes.batch_size
    if not (rate_c and rate_e and warm_c is not None and warm_e is not None and isinstance(batch, int)):
        return None
    global_batch = batch * max(1, int(compiled.axes.gpus or 1))
    extra = warm_c - warm_e
    saved = global_batch / rate_e - global_batch / rate_c
    if saved <= 0:
        steps: int | None = None
    else:
        steps = 0 if extra <= 0 else math.ceil(extra / saved)
    rows = _rows_per_epoch(compiled)
    epochs = steps / (rows / global_batch) if steps is not None and rows else None
    return BreakEven(compiled, eager, extra, saved, steps, epochs)


def break_evens(cells: list[Cell]) -> list[BreakEven]:
    """Every compiled fine-tuning cell that has an eager twin with numbers, in the cells' order."""
    eager = {_twin_key(c): c for c in cells if c.task == "finetune" and c.axes.compile == "off"}
    out = []
    for cell in cells:
        if cell.task != "finetune" or cell.axes.compile == "off":
            continue
        twin = eager.get(_twin_key(cell))
        if twin is not None and (found := break_even(cell, twin)) is not None:
            out.append(found)
    return out
