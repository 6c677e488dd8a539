"""Several machines of one GPU type in one setting: compared with each other before they are averaged.

The same GPU model has read 30% apart on two machines (another host CPU, other clocks, another driver): a mean
over both would describe neither. So where a setting's repeats ran on several machines (`environment.node_name`,
the hostname outside Kubernetes), each machine's repeats get their own 95% interval of the setting's metric first
(`kubesweep.tracking.intervals`; a single repeat is a point), and

- with three machines or more, a machine whose interval overlaps no other machine's, while at least two of the
  others agree, is left out of the setting's numbers and named beside them (`machine h100-b left out: 7,686
  ±2.1% vs 5,420 samples/s on 2 others`);
- with two machines whose intervals do not overlap, neither can be told to be the odd one: the setting keeps both
  and is flagged (`2 machines disagree on samples/s: h100-a 7,686 ±2.1%, h100-b 5,420 ±1.0%`), so its figure is
  read as what it is.

Machines whose intervals overlap are averaged together as one machine's repeats are. Each machine named in a flag
carries what the caller knows of it (`note`): its GPU's GEMM probe (`h100-b 5,420 ±1.0% (GEMM probe 548 TFLOP/s)`),
which says whether the machine itself delivered less or the setting ran differently on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from kubesweep.tracking import intervals

T = TypeVar("T")


@dataclass(frozen=True)
class Machine:
    name: str
    values: list[float]

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)

    @property
    def interval(self) -> intervals.Interval:
        found = intervals.interval(self.values)
        assert found is not None
        return found

    def text(self, fmt: Callable[[float], str]) -> str:
        """`7,686 ±2.1%`: the mean, ± its 95% half-width in percent (none for one repeat)."""
        hw = intervals.half_width(self.values)
        spread = f" ±{100 * hw / abs(self.mean):.1f}%" if hw is not None and self.mean else ""
        return f"{fmt(self.mean)}{spread}"


@dataclass
class Verdict:
    """What the rule found in one setting: the machines left out (their repeats not averaged in) and the flag."""

    left_out: list[Machine]
    flag: str = ""


def compare(items: Sequence[T], machine: Callable[[T], str | None], value: Callable[[T], float | None], *,
            unit: str, fmt: Callable[[float], str], note: Callable[[str], str] = lambda name: "") -> Verdict:
    """Compare the machines that `items` (a setting's repeats) ran on by `value` (see the module docstring);
    `note(machine)` follows each machine's figure in the flag."""
    by_machine: dict[str, list[float]] = {}
    for item in items:
        name, v = machine(item), value(item)
        if name and v is not None:
            by_machine.setdefault(name, []).append(v)
    machines = [Machine(name, values) for name, values in by_machine.items()]
    if len(machines) < 2:
        return Verdict([])
    if len(machines) == 2:
        a, b = machines
        if a.interval.overlaps(b.interval):
            return Verdict([])
        return Verdict([], f"2 machines disagree on {unit}: {a.name} {a.text(fmt)}{note(a.name)}, "
                           f"{b.name} {b.text(fmt)}{note(b.name)}")
    left_out = []
    kept = list(machines)
    for m in machines:
        others = [o for o in kept if o is not m]
        agreeing = any(x.interval.overlaps(y.interval) for i, x in enumerate(others) for y in others[i + 1:])
        if agreeing and not any(m.interval.overlaps(o.interval) for o in others):
            left_out.append(m)
            kept.remove(m)
    if not left_out:
        return Verdict([])
    rest = [v for m in kept for v in m.values]
    flag = "; ".join(f"machine {m.name} left out: {m.text(fmt)}{note(m.name)} vs {fmt(sum(rest) / len(rest))} "
                     f"{unit} on {len(kept)} others" for m in left_out)
    return Verdict(left_out, flag)
