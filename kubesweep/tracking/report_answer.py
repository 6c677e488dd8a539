"""The report's answer: per objective the best setting overall and per task and GPU type (mean ± its 95%
interval, n and flags), the settings tied with it, how the GPU types compare at their best settings, and the
settings whose samples/s is noisy. `kubesweep.tracking.report` puts it at the top of the page."""

from __future__ import annotations

from dataclasses import dataclass

from kubesweep.tracking.aggregate import (
    Cell,
    best_cell,
    tied_with,
)
from kubesweep.tracking.figures import gpu_label as _gpu_label
from kubesweep.tracking.report_page import Table
from kubesweep.wire.metrics import METRICS, fmt_number

# -- the answer ------------------------------------------------------------------------------------------------

# (metric, what it answers) per task: the objectives the headline picks a best setting for
OBJECTIVES: dict[str, list[tuple[str, str]]] = {
    "finetune": [("samples_per_s", "highest throughput"),
                 ("tta_train_s", "soonest to the target accuracy (training time, warm-up apart)"),
                 ("cost_per_epoch", "lowest $ per epoch"), ("kwh_per_epoch", "least energy per epoch")],
    "inference": [("samples_per_s", "highest throughput"), ("step_p50_ms", "lowest p50 latency"),
                  ("j_per_sample", "least energy per sample")],
}



@dataclass
class Best:
    task: str
    gpu: str
    metric: str
    objective: str
    cell: Cell | None
    why_none: str = ""
    measured: bool = True  # some trial of the group has the figure (else why_none says what the sweep lacks)

    def value_text(self) -> str:
        if self.cell is None:
            return self.why_none
        return value_text(self.cell, self.metric)


def value_text(cell: Cell, metric: str) -> str:
    """`5,120 samples/s ±1.2%`: the mean in its unit, ± its 95% interval's half-width (n >= 2)."""
    stat = cell.metrics[metric]
    rel = stat.relative_half_width
    spread = f" ±{rel * 100:.1f}%" if rel is not None else ""
    return METRICS[metric].say(fmt_number(stat.mean)) + spread


def setting_text(cell: Cell, with_gpu: bool = False) -> str:
    """`bs64 bf16 compile=default` (`h100-80gb x2 GPUs bs64 ...` with_gpu)."""
    parts = [_gpu_label(cell)] if with_gpu else []
    if cell.axes.gpus > 1:
        parts.append(f"x{cell.axes.gpus} GPUs")
    parts += [f"bs{cell.axes.batch_size}", str(cell.axes.precision)]
    parts.append("eager" if cell.axes.compile == "off" else f"compile={cell.axes.compile}")
    parts += [f"{k}={v}" for k, v in cell.extra.items()]
    return " ".join(parts)


def why_no_best(cells: list[Cell], metric: str, target: float) -> str:
    if not any("succeeded" in c.outcomes for c in cells):
        return "no trial succeeded"
    if any(c.value(metric) is not None for c in cells):  # measured, but best_cell left every such setting out
        learned = [c for c in cells if c.value(metric) is not None and not c.at_chance]
        if learned and all(c.physics for c in learned):
            return "every measured setting failed the physics check: a measurement error"
        return "no setting learned: each has a repeat at chance accuracy"
    if metric in METRICS and METRICS[metric].to_target:
        best = max((v for c in cells if (v := c.value("accuracy")) is not None), default=None)
        return f"no trial reached {target:g} dev accuracy" + (f" (best {best:.3f})" if best is not None else "")
    if metric == "cost_per_epoch":
        return "no price: CPU trials" if all(c.axes.gpu == "cpu" for c in cells) else "no price in the catalog"
    return "not measured"


def unmeasured(cells: list[Cell], metric: str) -> bool:
    """Trials succeeded, and none of them has this figure."""
    return any("succeeded" in c.outcomes for c in cells) and all(c.value(metric) is None for c in cells)


def best_settings(cells: list[Cell], target: float) -> list[Best]:
    """The best setting for each objective, per task and GPU type (`cpu` for CPU trials)."""
    groups: dict[tuple[str, str], list[Cell]] = {}
    for cell in cells:
        groups.setdefault((cell.task, str(cell.axes.gpu)), []).append(cell)
    out = []
    for (task, gpu), group in sorted(groups.items(), key=lambda kv: (kv[0][0] != "finetune", kv[0][1] == "cpu",
                                                                      kv[0][1])):
        for metric, objective in OBJECTIVES.get(task, OBJECTIVES["finetune"]):
            chosen = best_cell(group, metric)
            out.append(Best(task, gpu, metric, objective, chosen,
                            "" if chosen is not None else why_no_best(group, metric, target),
                            not unmeasured(group, metric)))
    return out


def _margin(best: Cell, cells: list[Cell], metric: str) -> str:
    """`; 1.75x the next best, cpu bs8 fp32 eager (226.8 ms ±10.2%)`: by how much the best beats the runner-up
    (whose interval it does not overlap), and `host-bound` beside a runner-up whose figure is its host's; empty
    where there is no runner-up."""
    runner_up = best_cell([c for c in cells if c is not best], metric)
    mine, theirs = best.value(metric), runner_up.value(metric) if runner_up is not None else None
    if runner_up is None or not mine or not theirs:
        return ""
    higher = METRICS[metric].higher
    ratio = mine / theirs if higher else theirs / mine
    how = "the next best" if higher else "lower than the next best"
    host = "; host-bound" if runner_up.host_bound and runner_up.axes.gpu != "cpu" else ""
    return f"; {ratio:.2f}x {how}, {setting_text(runner_up, with_gpu=True)} ({value_text(runner_up, metric)}{host})"


def _shown(cell: Cell, metric: str) -> str:
    """`h100-80gb bs64 bf16 eager: 5,120 samples/s ±1.2% (n=3; OOM)`."""
    shown = [f for f in cell.flags if f != "n=1"]  # n is given beside them
    flags = f"; {', '.join(shown)}" if shown else ""
    warm_up = f"; {warmup_text(cell)}" if metric == "tta_train_s" and warmup_text(cell) else ""
    return (f"{setting_text(cell, with_gpu=True)}: {value_text(cell, metric)} (n={cell.metrics[metric].n}{warm_up}"
            f"{flags})")


def warmup_text(cell: Cell) -> str:
    """`warm-up 41 s ±6.0% with a cold compile cache (n=2), 3.2 s ±2.1% warm (n=4)`: the warm-up apart from the
    training time, cold and warm compile caches apart (an eager setting: its warm-up steps); empty without one."""
    parts = []
    for metric, what in (("warmup_cold_s", "with a cold compile cache"), ("warmup_warm_s", "warm")):
        stat = cell.metrics[metric]
        if stat.mean is not None:
            spread = f" ±{rel * 100:.1f}%" if (rel := stat.relative_half_width) is not None else ""
            parts.append(f"{fmt_number(stat.mean)} s{spread} {what} (n={stat.n})")
    if not parts:
        stat = cell.metrics["warmup_s"]
        if stat.mean is None:
            return ""
        spread = f" ±{rel * 100:.1f}%" if (rel := stat.relative_half_width) is not None else ""
        parts.append(f"{fmt_number(stat.mean)} s{spread}")
    return "warm-up " + ", ".join(parts)


def answer_lines(cells: list[Cell], target: float, *, measured_only: bool = False) -> list[str]:
    """One sentence per objective across every GPU type: the sweep's answer. Where other settings' 95% intervals
    overlap the best one's, the sentence names them all as tied instead of naming a winner. `measured_only`: leave
    out the objectives the sweep has no figure for (no price, no energy meter, no trial at the target accuracy),
    keeping those its trials failed to answer (none succeeded, none learned)."""
    lines = []
    for task in ("finetune", "inference"):
        group = [c for c in cells if c.task == task]
        if not group:
            continue
        noun = "fine-tuning" if task == "finetune" else "inference"
        for metric, objective in OBJECTIVES[task]:
            cell = best_cell(group, metric)
            if cell is None:
                if not (measured_only and unmeasured(group, metric)):
                    lines.append(f"{noun}, {objective}: {why_no_best(group, metric, target)}.")
                continue
            tied = tied_with(cell, group, metric)
            if tied:
                shown = "; ".join(_shown(c, metric) for c in [cell, *tied][:TIED_SHOWN])
                more = f"; and {len(tied) + 1 - TIED_SHOWN} more" if len(tied) + 1 > TIED_SHOWN else ""
                lines.append(f"{noun}, {objective}: {len(tied) + 1} settings tied (95% intervals overlap): "
                             f"{shown}{more}.")
            else:
                lines.append(f"{noun}, {objective}: {_shown(cell, metric)}{_margin(cell, group, metric)}.")
        lines += gpu_lines(group, task)
        lines += precision_lines(group, task)
    return lines


TIED_SHOWN = 3


NOISY = 0.03  # a samples/s interval wider than ±3% of the mean is named, with what may explain it


def _measured_s(cell: Cell) -> float | None:
    """The mean measured time of a repeat: training's measured steps, or inference's measured batches."""
    times = []
    for trial in cell.trials:
        res = trial.results
        if res is None:
            continue
        if res.train is not None:
            times.append(res.train.measured_time_s)
        elif res.inference is not None:
            times.append(res.inference.latency_s.mean * res.inference.latency_s.n)
    return sum(times) / len(times) if times else None


def noisy_lines(cells: list[Cell]) -> list[str]:
    """One sentence naming the settings whose samples/s is known to less than ±3% (95%), with each one's repeats
    and measured time per repeat: a short measured window or a shared CPU is the usual cause."""
    noisy = [c for c in cells if (rel := c.metrics["samples_per_s"].relative_half_width) is not None and rel > NOISY]
    if not noisy:
        return []
    parts = []
    for cell in noisy:
        stat = cell.metrics["samples_per_s"]
        measured = _measured_s(cell)
        window = f", {measured:.2g} s measured per repeat" if measured is not None else ""
        rel = (stat.relative_half_width or 0.0) * 100
        parts.append(f"{setting_text(cell, with_gpu=True)} ({cell.task}) ±{rel:.1f}%: repeats "
                     f"{', '.join(fmt_number(v) for v in stat.values)}{window}")
    return [f"Noisier than ±{NOISY:.0%} in samples/s (95% interval): " + "; ".join(parts) + "."]


HOST_BOUND_FIX = ("more DataLoader workers (num_workers), less padding (padding: bucketed), or step_graph: true "
                  "(one CUDA graph per step or batch)")


def gpu_lines(cells: list[Cell], task: str) -> list[str]:
    """Per objective, the GPU types compared at their best settings: which is best and by how much, or tied. Only
    settings that measured the GPU take part: a host-bound setting (`Cell.host_bound`) measured its host, and a
    GPU type whose every setting did is named as not compared, with what to change."""
    noun = "fine-tuning" if task == "finetune" else "inference"
    groups: dict[str, list[Cell]] = {}
    host_only: dict[str, int] = {}
    for cell in cells:
        if task == "inference" or cell.axes.gpu != "cpu":
            if cell.host_bound and cell.axes.gpu != "cpu":
                host_only[str(cell.axes.gpu)] = host_only.get(str(cell.axes.gpu), 0) + 1
                continue
            groups.setdefault(str(cell.axes.gpu), []).append(cell)
    lines = []
    left = sorted(g for g in host_only if g not in groups)
    if left and len(groups) + len(left) >= 2:
        lines.append(f"GPU types, {noun}: {', '.join(left)} not compared: every setting of "
                     f"{'it' if len(left) == 1 else 'them'} measured the host, not the GPU (host-bound); "
                     f"{HOST_BOUND_FIX} would let it measure the GPU.")
    elif host_only and len(groups) >= 2:
        n = sum(host_only.values())
        lines.append(f"GPU types, {noun}: compared on the settings that measured the GPU; {n} host-bound "
                     f"setting{'s' if n != 1 else ''} left out of the comparison.")
    if len(groups) < 2:
        return lines
    for metric, objective in OBJECTIVES[task]:
        bests = [found for g in groups.values() if (found := best_cell(g, metric)) is not None]
        if len(bests) < 2:
            continue
        higher = METRICS[metric].higher
        bests.sort(key=lambda c: c.value(metric) or 0.0, reverse=higher)
        first, second = bests[0], bests[1]
        a, b = first.value(metric) or 0.0, second.value(metric) or 0.0
        ia, ib = first.metrics[metric].interval, second.metrics[metric].interval
        versus = f"{_gpu_label(first)} {value_text(first, metric)} vs {_gpu_label(second)} {value_text(second, metric)}"
        if ia is not None and ib is not None and ia.overlaps(ib) and (first.metrics[metric].n > 1
                                                                      or second.metrics[metric].n > 1):
            lines.append(f"GPU types, {noun}, {objective}: tied at their best settings, 95% intervals overlap "
                         f"({versus}).")
            continue
        by = _by(a, b, higher)
        rest = f"; {len(bests) - 2} more GPU types behind" if len(bests) > 2 else ""
        lines.append(f"GPU types, {noun}, {objective}: {_gpu_label(first)} is {by} {_gpu_label(second)} at "
                     f"their best settings ({versus}){rest}.")
    return lines


def _by(a: float, b: float, higher: bool) -> str:
    """How `a` stands to `b`: `1.12x` where higher is better, `11% below` or `at 1/260 of` where lower is."""
    if not b:
        return "ahead of"
    if higher:
        return f"{a / b:.2f}x"
    # "100% below" says nothing of a GPU at 1/260 of the CPU's latency: a ratio from 2x on
    return f"{(1 - a / b) * 100:.0f}% below" if a / b > 0.5 else f"at 1/{b / a:.3g} of"


def precision_lines(cells: list[Cell], task: str) -> list[str]:
    """Where the answer's throughput sentence names a tie (it then says nothing of how far the rest stand behind),
    one sentence for the GPU types that ran several precisions: per GPU type, its precisions at their best settings
    by throughput, best first, each after the first tied with it (95% intervals overlap) or how far behind.
    Host-bound settings take no part: they measured the host, whatever the precision."""
    noun = "fine-tuning" if task == "finetune" else "inference"
    metric, objective = OBJECTIVES[task][0]
    higher = METRICS[metric].higher
    top = best_cell(cells, metric)
    if top is None or not tied_with(top, cells, metric):
        return []
    by_gpu: dict[str, dict[str, list[Cell]]] = {}
    for cell in cells:
        if cell.axes.gpu != "cpu" and not cell.host_bound:
            by_gpu.setdefault(str(cell.axes.gpu), {}).setdefault(str(cell.axes.precision), []).append(cell)
    said = []
    for gpu, precisions in by_gpu.items():
        bests = [found for group in precisions.values() if (found := best_cell(group, metric)) is not None]
        if len(bests) < 2:
            continue
        bests.sort(key=lambda c: c.value(metric) or 0.0, reverse=higher)
        first = bests[0]
        parts = [f"{first.axes.precision} {value_text(first, metric)}"]
        for other in bests[1:]:
            i1, i2 = first.metrics[metric].interval, other.metrics[metric].interval
            if i1 is not None and i2 is not None and i1.overlaps(i2):
                how = f"tied with {first.axes.precision}"
            else:
                ratio = _by(first.value(metric) or 0.0, other.value(metric) or 0.0, higher)
                how = f"{first.axes.precision} is {ratio} it"
            parts.append(f"{other.axes.precision} {value_text(other, metric)} ({how})")
        said.append(f"on {gpu}, " + ", ".join(parts))
    if not said:
        return []
    return [f"Precisions, {noun}, {objective}, at their best settings: {'; '.join(said)}."]


def answer_table(cells: list[Cell], target: float) -> Table:
    rows = []
    for b in best_settings(cells, target):
        if not b.measured:  # nothing to pick from: said among what the report leaves out
            continue
        c = b.cell
        rows.append([b.task, "CPU" if b.gpu == "cpu" else b.gpu, b.objective,
                     setting_text(c) if c is not None else "-", b.value_text(),
                     str(c.metrics[b.metric].n) if c is not None else "-", "; ".join(c.flags) if c else ""])
    note = (f"Per task and GPU type, the setting that does best on each objective: mean over the repeats that "
            f"succeeded ± the 95% interval's half-width, n repeats; the target accuracy is {target:g}. Flags: OOM, "
            "GPU mismatch and failed "
            "repeats, chance accuracy (<= 0.55 on SST-2's two classes; such a setting is never the best), n=1 "
            "(no spread).")
    return Table("Best setting per GPU type", ["task", "GPU", "objective", "setting", "value", "n", "flags"], rows,
                 note)
