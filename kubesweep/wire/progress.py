"""A trial's progress as its log says it, spelled once for the job that prints it and the views that read it.

The job prints `step 120/400 epoch 0.30 loss 0.6931 lr 2e-05 812 samples/s` at most every 5 s and at its last step
(`warm-up` in place of the rate before the first measured window); the live view reads the last such line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_STEP = re.compile(r"(?:^|\s)step (\d+)/(\d+)\b(?:.*?\s([\d,]+(?:\.\d+)?) samples/s)?")


@dataclass(frozen=True)
class StepProgress:
    step: int
    total: int
    samples_per_s: float | None = None  # the last logged window's rate; None during warm-up

    @property
    def fraction(self) -> float:
        return min(1.0, self.step / self.total) if self.total > 0 else 0.0


def step_line(step: int, total: int, epoch: float, loss: float, lr: float, samples_per_s: float | None) -> str:
    """The job's progress line."""
    rate = f"{samples_per_s:,.0f} samples/s" if samples_per_s is not None else "warm-up"
    return f"step {step}/{total} epoch {epoch:.2f} loss {loss:.4f} lr {lr:.3g} {rate}"


ATTEMPT_HEADER = "# attempt "  # a local trial's log: each attempt's output follows such a line


def attempt_header(attempt: int, argv: list[str]) -> str:
    """The line a local trial's log gets before an attempt's output: `# attempt 2: python -m kubesweep.jobs ...`."""
    return f"{ATTEMPT_HEADER}{attempt}: {' '.join(argv)}\n"


def last_progress(lines: Iterable[str]) -> StepProgress | None:
    """The progress the last step line among `lines` gives, within the last attempt whose header they hold (None
    if there is none: a rerun starts from nothing, never from the step an earlier attempt reached)."""
    found = None
    for line in lines:
        if line.startswith(ATTEMPT_HEADER):
            found = None
            continue
        match = _STEP.search(line)
        if match is not None:
            found = match
    if found is None:
        return None
    rate = float(found[3].replace(",", "")) if found[3] else None
    return StepProgress(int(found[1]), int(found[2]), rate)
