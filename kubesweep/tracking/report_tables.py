"""The report's comparison tables, built from whatever trials the sweep has (None where it has none for a table):
the GPU types at their best setting per model, time for the configured epochs at batch 16 per GPU, torch.compile's
break-even (`kubesweep.tracking.breakeven`), inference latency by device and precision, one GPU vs DDP, the queue
wait per GPU type, the trials measured alone or beside others and each GPU's busy fraction. Each has the flags
column: `*` for the best setting, then the cell's flags."""

from __future__ import annotations

import json
import statistics
from typing import Any

from kubesweep.tracking import intervals, sharing
from kubesweep.tracking.aggregate import Cell, best_cell
from kubesweep.tracking.breakeven import break_evens
from kubesweep.tracking.columns import metric_text
from kubesweep.tracking.figures import finetune as _finetune
from kubesweep.tracking.figures import gpu_label as _gpu_label
from kubesweep.tracking.figures import other_settings as _other_settings
from kubesweep.tracking.report_answer import setting_text
from kubesweep.tracking.report_page import Table
from kubesweep.wire.metrics import fmt_number, label
from kubesweep.wire.search import RepeatsCell, RepeatsSummary

SEED_BATCH = 16
# the figures of the GPU types' table, after the epoch time
GPU_TABLE_METRICS = ("warmup_s", "samples_per_s", "padded_tokens_per_sample", "tflops_per_s", "mfu_pct",
                     "mfu_probe_pct", "peak_mem_gib", "kwh_per_epoch", "cost_per_epoch", "accuracy", "tta_train_s")
INFERENCE_METRICS = ("step_p50_ms", "latency_p99_ms", "samples_per_s", "tflops_per_s", "mfu_pct")


# -- comparison tables ---------------------------------------------------------------------------------------


def _minutes(seconds: float | None) -> str:
    return "-" if seconds is None else fmt_number(seconds / 60)


def _flags(cell: Cell) -> str:
    """The flags column of every table: `*` first for the best setting, then the cell's flags."""
    return "; ".join((["*"] if cell.best else []) + cell.flags)


def epochs_table(cells: list[Cell]) -> Table | None:
    """Time for the configured number of epochs at batch 16 (or the smallest batch run) on each GPU type."""
    single = [c for c in _finetune(cells) if c.axes.gpus == 1 and c.axes.gpu != "cpu"]
    if not single:
        return None
    batches = sorted({int(c.axes.batch_size) for c in single if c.axes.batch_size is not None})
    batch = SEED_BATCH if SEED_BATCH in batches else batches[0]
    chosen = [c for c in single if c.axes.batch_size == batch]
    first_job = chosen[0].trials[0].job
    epochs = first_job.epochs
    epochs_text = f"{epochs:g} epoch" + ("" if epochs == 1 else "s")
    dataset = first_job.dataset
    rows_n = {str((t.results.data or {}).get("train_rows")) for c in chosen for t in c.trials if t.results}
    rows_n.discard("None")
    note = (f"epoch time = training-loop wall time less the warm-up / epochs completed (evaluation excluded), x "
            f"{epochs:g}; training rows per epoch: {', '.join(sorted(rows_n)) or 'unknown'}.")
    chosen.sort(key=lambda c: (str(c.axes.gpu), c.value("epoch_s") is None, c.value("epoch_s") or 0.0))
    rows = []
    for cell in chosen:
        epoch_s = cell.value("epoch_s")
        cost = cell.value("cost_per_epoch")
        rows.append([
            _gpu_label(cell), str(cell.axes.precision), str(cell.axes.compile), _other_settings(cell),
            _minutes(epoch_s * epochs) if epoch_s is not None else cell.status,
            metric_text(cell, "samples_per_s"),
            fmt_number(cost * epochs) if cost is not None else "-",
            metric_text(cell, "accuracy"), _flags(cell),
        ])
    return Table(f"Time for {epochs_text} of {dataset} at batch {batch} per GPU",
                 ["GPU", "precision", "compile", "other", f"min for {epochs_text}", label("samples_per_s"),
                  f"$ for {epochs_text}", label("accuracy"), "flags"], rows, note)


def gpu_table(cells: list[Cell], target: float) -> Table | None:
    """The GPU types side by side, per model, each at its best fine-tuning setting by samples/s (among settings
    that learned): time per epoch, samples/s, peak memory, energy and $ per epoch, accuracy and time to it."""
    groups: dict[tuple[str, str], list[Cell]] = {}
    for cell in _finetune(cells):
        if cell.axes.gpu != "cpu":
            model = cell.trials[0].job.model
            groups.setdefault((model, str(cell.axes.gpu)), []).append(cell)
    rows = []
    for (model, _gpu), group in sorted(groups.items()):
        chosen = best_cell(group, "samples_per_s")
        if chosen is None:
            continue
        cell = chosen
        epoch = cell.metrics["epoch_s"]
        minutes = fmt_number(epoch.mean / 60) if epoch.mean is not None else "-"
        if (rel := epoch.relative_half_width) is not None:
            minutes += f" ±{rel * 100:.1f}%"
        rows.append([model, _gpu_label(cell), setting_text(cell), minutes,
                     *(metric_text(cell, m) for m in GPU_TABLE_METRICS), str(len(cell.trials)), _flags(cell)])
    if len(rows) < 1:
        return None
    note = ("Per model and GPU type, the fine-tuning setting with the most samples/s among those that learned (a "
            "random-init speed run counts: its accuracy is not meaningful): mean ± the 95% interval's half-width "
            "over the repeats. min/epoch: training-loop wall time per epoch, the warm-up apart (warm-up s: "
            f"compilation and each shape's first steps, once per run); TTA train s: to {target:g} dev accuracy, the "
            "steps to it at the steady step time (the warm-up apart, so a compile cache that one repeat fills and "
            "the next reads does not set them apart). TFLOP/s: model FLOPs of the measured steps' padded shapes per "
            "second; MFU %: against the GPU type's dense peak at the precision, MFU probe %: against the GEMM probe "
            "of the machine that ran it (none on the CPU, no peak invented).")
    return Table("GPU types at their best setting", ["model", "GPU", "setting", "min/epoch",
                                                    *map(label, GPU_TABLE_METRICS), "n", "flags"], rows, note)


def queue_table(cells: list[Cell]) -> Table | None:
    """Per GPU type, how long its queued trials (spec.queue) waited from their Job's creation to their start: which
    GPU type is fast to get, beside which is fast to run."""
    waits: dict[str, list[float]] = {}
    for cell in cells:
        if cell.axes.gpu in (None, "cpu"):
            continue
        for trial in cell.trials:
            wait = trial.results.timings.queue_wait_s if trial.results is not None else None
            if wait is not None:
                waits.setdefault(_gpu_label(cell), []).append(wait)
    if not waits:
        return None
    rows = []
    for gpu, values in sorted(waits.items()):
        mean = statistics.fmean(values)
        half = intervals.half_width(values)
        spread = f" ±{half / mean * 100:.0f}%" if half is not None and mean > 0 else ""
        rows.append([gpu, fmt_number(mean) + spread, fmt_number(statistics.median(values)), fmt_number(max(values)),
                     str(len(values))])
    return Table("time to get a GPU (queue wait)", ["GPU", "mean s", "median s", "max s", "trials"], rows,
                 "Queued trials (spec.queue): from their Job's creation to their process's start, the wait for "
                 "Kueue's admission, scheduling and image pull; mean ± the 95% interval's half-width over the "
                 "trials of that GPU type.")


def breakeven_table(cells: list[Cell]) -> Table | None:
    """When compiling pays off, per compiled fine-tuning setting against the same setting run eager."""
    found = break_evens(cells)
    if not found:
        return None
    rows = []
    for be in found:
        rows.append([_gpu_label(be.compiled), setting_text(be.compiled), fmt_number(be.eager.value("warmup_s")),
                     fmt_number(be.compiled.value("warmup_s")), fmt_number(be.extra_warmup_s),
                     fmt_number(be.saved_per_step_s * 1000), be.text, _flags(be.compiled)])
    note = ("extra warm-up = compiled - eager warm-up (means); saved per step = global batch / eager samples/s - "
            "global batch / compiled samples/s; break-even = extra warm-up / saved per step, in steps and epochs "
            "of the training rows. A compile cache that already holds the graphs shortens the compiled warm-up.")
    return Table("torch.compile break-even", ["GPU", "setting", "eager warm-up s", "compiled warm-up s",
                                              "extra s", "saved ms/step", "pays off", "flags"], rows, note)


def inference_table(cells: list[Cell]) -> Table | None:
    """Inference latency, titled by what the sweep measured: the devices (CPU, GPU types) and precisions. A speed-up
    column only where a CPU trial and another device both ran: the CPU's p50 against each other device's, never a
    device against itself."""
    inf = [c for c in cells if c.task == "inference"]
    if not inf:
        return None
    cpu = [v for c in inf if c.axes.gpu == "cpu" and (v := c.value("step_p50_ms")) is not None]
    on_gpu = any(c.axes.gpu != "cpu" for c in inf)
    cpu_p50 = min(cpu) if cpu and on_gpu else None
    inf.sort(key=lambda c: (c.axes.gpu != "cpu", str(c.axes.gpu), int(c.axes.batch_size or 0),
                            str(c.axes.precision), str(c.axes.compile), _other_settings(c)))
    # the settings beyond the axes that set cells apart (a CUDA graph or eager, the batches measured): without
    # them two rows of one device, precision and batch would read as one setting twice
    other = any(_other_settings(c) for c in inf)
    rows = []
    for cell in inf:
        p50 = cell.value("step_p50_ms")
        speedup = f"{cpu_p50 / p50:.1f}x" if cpu_p50 and p50 and cell.axes.gpu != "cpu" else "-"
        rows.append([_gpu_label(cell), str(cell.axes.precision), str(cell.axes.compile),
                     *([_other_settings(cell)] if other else []),
                     str(cell.axes.batch_size), *(metric_text(cell, m) for m in INFERENCE_METRICS),
                     *([speedup] if cpu_p50 else []), _flags(cell)])
    note = "latency = wall time of one batch (p50, p99 over the measured batches)"
    note += "; speed-up = CPU p50 / p50." if cpu_p50 else "."
    return Table(inference_title(inf), ["device", "precision", "compile", *(["other"] if other else []),
                                        label("batch_size"), "p50 ms", *map(label, INFERENCE_METRICS[1:]),
                                        *(["speed-up vs CPU"] if cpu_p50 else []),
                                        "flags"], rows, note)


def inference_title(inf: list[Cell]) -> str:
    """`Inference latency: CPU vs GPU, fp32 vs bf16`, naming only what the inference cells measured."""
    devices = sorted({c.axes.gpu == "cpu" for c in inf}, reverse=True)
    where = " vs ".join("CPU" if is_cpu else "GPU" for is_cpu in devices)
    precisions = list(dict.fromkeys(str(c.axes.precision) for c in sorted(inf, key=lambda c: str(c.axes.precision))))
    what = " vs ".join(precisions) if len(precisions) > 1 else precisions[0]
    return f"Inference latency on {where}, {what}" if len(devices) == 1 else f"Inference latency: {where}, {what}"


def ddp_table(cells: list[Cell]) -> Table | None:
    """One GPU vs DDP over N GPUs, for the same GPU type and settings."""
    ft = [c for c in _finetune(cells) if c.axes.gpu != "cpu"]
    if not any(c.axes.gpus > 1 for c in ft):
        return None

    def setting(c: Cell) -> tuple[Any, ...]:
        return (c.axes.gpu, c.axes.batch_size, c.axes.precision, c.axes.compile,
                json.dumps(c.extra, sort_keys=True, default=str))

    groups: dict[tuple[Any, ...], list[Cell]] = {}
    for cell in ft:
        groups.setdefault(setting(cell), []).append(cell)
    rows = []
    for key in sorted(k for k, g in groups.items() if any(c.axes.gpus > 1 for c in g)):
        group = sorted(groups[key], key=lambda c: c.axes.gpus)
        base = next((c.value("samples_per_s") for c in group if c.axes.gpus == 1), None)
        for cell in group:
            n = int(cell.axes.gpus)
            rate = cell.value("samples_per_s")
            eff = f"{rate / (n * base) * 100:.0f}%" if rate and base and n > 1 else ("100%" if n == 1 and rate else "-")
            rows.append([str(key[0]), str(n), "single GPU" if n == 1 else f"DDP x{n}", str(key[1]), str(key[2]),
                         str(key[3]), metric_text(cell, "samples_per_s"), eff, metric_text(cell, "epoch_s"),
                         metric_text(cell, "cost_per_epoch"), _flags(cell)])
    note = ("batch is per GPU; scaling efficiency = samples/s with N GPUs / (N x samples/s on one GPU). The job "
            "runs multi-GPU trials as DistributedDataParallel (one process per GPU).")
    return Table("One GPU vs DDP", ["GPU", "GPUs", "strategy", label("batch_size"), "precision", "compile",
                                    label("samples_per_s"), "scaling", label("epoch_s"), label("cost_per_epoch"),
                                    "flags"], rows, note)


def sharing_table(cells: list[Cell]) -> Table | None:
    """Every GPU trial: its node and GPU (PCI bus id), and whether it was measured alone or beside other trials."""
    trials = [t for c in cells for t in c.trials if t.results is not None and t.results.device == "cuda"]
    rows = sharing.sharing_rows(trials)
    if not rows:
        return None
    return Table("Measured alone or beside other trials", ["trial", "node", "GPU (PCI bus id)", "measured",
                                                           label("samples_per_s")], rows,
                 "a neighbour is another trial whose process ran on the same node during this trial's measured "
                 "steps; a cell whose shared repeats differ from its lone ones beyond their 95% intervals is "
                 "flagged")


def device_table(cells: list[Cell]) -> Table | None:
    """The busy fraction of each GPU the sweep's trials ran on (only where they ran on more than one)."""
    devices = sharing.device_busy([t for c in cells for t in c.trials])
    if len(devices) < 2:
        return None
    return Table("GPU busy per device", ["node", "PCI bus id", "UUID", "trials", "measured training s", "busy"],
                 sharing.busy_rows(devices), "measured training steps on that GPU over the sweep's wall time "
                                             "(first trial's start to last results file)")


def _entry_matches(cell: Cell, entry: RepeatsCell) -> bool:
    """A `repeats.json` cell (its task, the GPU type its repeats ran on and its plan's axes) names this aggregated
    cell; merged with another GPU type's sweep, only that GPU type's cell."""
    if entry.task != cell.task:
        return False
    if entry.gpu and entry.gpu != str(cell.axes.gpu):
        return False
    return _matches(cell, entry.axes)


def _matches(cell: Cell, axes: dict[str, Any]) -> bool:
    """The summary cell's axes (a plan's: `gpu`, `gpus_per_trial` and job settings) name this aggregated cell."""
    if not cell.trials:
        return False
    job = cell.trials[0].job
    for key, value in axes.items():
        have = cell.axes.gpu if key == "gpu" else cell.axes.gpus if key == "gpus_per_trial" else getattr(job, key, None)
        if key == "compile":
            have, value = cell.axes.compile, ("off" if value in (False, None) else "on" if value is True else value)
        if have != value:
            return False
    return True


def repeats_table(cells: list[Cell], summaries: list[tuple[str, RepeatsSummary]], metric: str) -> Table | None:
    """Sequential repeats (`repeat_until`): per setting, the repeats it got and the half-width its
    interval reached, and which settings stopped short of the target (`max`, `no value`, `host-bound`), from each
    sweep's `repeats.json` (`summaries`: (where it was read, the summary)). None when no sweep ran under the rule."""
    if not summaries:
        return None
    stopped: dict[int, list[str]] = {}
    rules = []
    for where, summary in summaries:
        rule = summary.rule
        rules.append(f"{where}: {rule.min} to {rule.max} repeats a setting until the 95% interval of "
                     f"{rule.metric} is within ±{rule.target}%, {summary.repeats} repeats in all "
                     f"(a fixed {rule.min}: {summary.fixed_min}, a fixed {rule.max}: {summary.fixed_max})")
        for entry in summary.cells:
            for i, cell in enumerate(cells):
                if _entry_matches(cell, entry):
                    how = entry.stopped
                    stopped.setdefault(i, []).append("" if how == "reached" else f"{where}: {how or 'cut short'}")
    rows = []
    for i, cell in enumerate(cells):
        stat = cell.metrics[metric]
        rel = stat.relative_half_width
        said = stopped.get(i)
        rows.append([cell.task, _gpu_label(cell), setting_text(cell), str(len(cell.trials)),
                     f"±{rel * 100:.1f}%" if rel is not None else "-",
                     "-" if said is None else "; ".join(s for s in said if s) or "target"])
    note = ("Repeats under the rule: " + "; ".join(rules) + f". ± is the 95% interval's half-width of {metric} "
            "over every repeat of the setting (all machines); 'max': stopped at the most repeats without reaching "
            "the target, 'no value': no repeat measured it, 'host-bound': every repeat measured its host, not its GPU "
            "(more repeats would measure the host again), 'cut short': the sweep ended before the rule did; '-': "
            "no sweep that ran it under the rule left its repeats.json (it ran without the rule, or was cut short "
            "before it wrote one).")
    return Table("repeats per setting", ["task", "GPU", "setting", "repeats", "±", "stopped"], rows, note)
