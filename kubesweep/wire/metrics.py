"""The metric catalogue: one definition per metric of a trial, from which everything that names a metric follows.

Each `Metric` says what it is called (`name`: the key of a summary's `metrics`, the MLflow metric its trial's run logs,
`--sort`/`--best-by`, `repeat_until.metric`), how one trial's value is read from its typed results (`read`), its
unit, whether higher or lower is better, how repeats of a setting meet (`aggregate`), and how it is shown (`label`:
the column header; `column`, `priority`: whether and how early `sweep results` and the report's table show it;
`per_trial`: whether and how early `sweep results --per-trial` shows it; `say`: how the answer states a value;
`glossary`: where the report's page defines it). What follows from `CATALOGUE`:

- `kubesweep.wire.trial_metrics.trial_metrics`: one trial's values of every metric; `comparison_metrics`: those
  `logged` on the trial's MLflow run (the runs view's columns);
- `kubesweep.tracking.aggregate`: the mean and 95% interval per setting of every metric, best first by `higher`;
- `kubesweep.tracking.columns`: the results table's columns (for `sweep results` and the report) and their text,
  and the per-trial table's (`sweep results --per-trial`, `per_trial`; its rows: `kubesweep.results`);
- `kubesweep.spec_model.REPEAT_METRICS` (`repeatable`), and the tune metric names (`TUNE_SOURCES`).

Adding a metric that is read from numbers results.json already holds touches this file alone (its entry, and its
reader where a lambda does not do); one the job must first measure adds the measurement (`kubesweep/jobs`) and its
field in `kubesweep/wire/results.py`. `tests/wire/test_metrics.py` holds the rule.

The definitions (docs/tracking.md gives them with examples):

- samples/s: `train.samples_per_s` (measured steps only, all ranks) or, for inference, `inference.samples_per_s`;
- step p50: `train.step_time_s.p50` (inference: `inference.latency_s.p50`, one batch), in milliseconds;
- peak memory: `memory.torch_peak_allocated_bytes` in GiB (the CUDA caching allocator's peak); on a CPU trial
  `memory.host_peak_rss_bytes` (the process's peak resident set);
- accuracy: `final_accuracy`, the dev accuracy of the last evaluation;
- epoch time: `(timings.train_s - train.warmup_time_s) / train.epochs_completed`, the training loop's wall time
  per epoch with the warm-up apart (compilation and each new shape's first steps: `warm-up s`, reported beside it;
  a compile cache that one repeat fills and the next reads would otherwise set repeats of one setting apart by
  the compilation), checkpoints included, evaluation excluded;
- $/epoch: the GPU type's price per hour x GPUs of the trial x epoch time / 3600 (none for CPU trials);
- time-to-accuracy (TTA): training wall time from the first optimizer step until the first evaluation whose
  accuracy is at or above the target (default 0.90). Evaluation time is not counted. Results files record
  evaluations by step, so the time at step s is `warmup_time_s + (s - warmup_steps) x (train_s -
  warmup_time_s) / (steps - warmup_steps)`: warm-up (compilation included) is charged in full to the first
  steps, the rest of the training loop is spread evenly over the remaining steps; an evaluation at the last step
  gives exactly `train_s`. Not reached: no TTA.
- TTA train s: the same target reached, warm-up apart: the steps until that evaluation x the steady step time
  (`(train_s - warmup_time_s) / (steps - warmup_steps)`), so the warm-up steps count at the speed of every other
  step and their compilation not at all. It measures the setting's training, whatever the compile cache held;
  the answer ranks time to accuracy by it, with the warm-up beside it.
- warm-up cold s / warm-up warm s: `warm-up s` of a compiled trial whose compile cache held nothing of its graphs
  (`compile_cache.hit` false, or no cache record) / held every one of them (`hit` true): one interval each, so
  repeats that compiled and repeats that read the cache are never averaged together. Eager trials have neither.
- energy: `energy.j_per_sample` (joules per sample over the measured window, NVML's energy counter) and
  `energy.kwh_per_epoch` (J/sample x training rows / 3.6e6);
- warm-up s: `timings.compile_warmup_s`, the steps reported apart from the measured ones (compilation included);
- queue wait s: `timings.queue_wait_s`, a queued trial's (spec.queue) Job creation to its process's start: the wait
  for Kueue's admission, scheduling and image pull.
- TFLOP/s: `train.tflops_per_s` (inference: `inference.tflops_per_s`), the model FLOPs of the measured steps (padded
  batch shapes, matmuls and attention, forward + backward = 3x forward; kubesweep/jobs/flops.py) over their time,
  all ranks; CPU trials too.
- MFU %: TFLOP/s / (the GPU type's dense peak at the trial's precision x its GPUs) x 100 (PaLM's model FLOPs
  utilization); none on the CPU and for a GPU type or precision the catalog gives no peak: no peak is invented.
- MFU probe %: TFLOP/s / (the trial's GEMM probe x its GPUs) x 100: against what that machine's GPU delivered on
  square matmuls at that precision (`probe.tflops_per_s`), not the data sheet.
- tokens/sample, padded tokens/sample: `tokens_per_sample` and `padded_tokens_per_sample` of the measured steps:
  what one of the samples of samples/s carried (SST-2 bucketed: about 21 padded tokens, not 128).

Pure functions: the GPU type's price and peak come from the caller (the GPU catalog is not part of the contract).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from kubesweep.wire.flags import finite
from kubesweep.wire.results import MeasuredWindow, Results

GIB = 1024**3


@dataclass(frozen=True)
class Trial:
    """What one trial's metrics are read from: its typed results, the GPUs it asked for, and what the GPU catalog
    says of its GPU type: the price per hour (None: no cost), one GPU's dense peak at its precision (None: no MFU),
    and the accuracy its time to accuracy is measured to."""

    results: Results
    gpus: int
    price_per_hour: float | None
    peak_tflops: float | None
    target: float

    @property
    def world(self) -> int:
        """The GPUs it ran on: its world size where the results have one, else those it asked for (at least 1)."""
        return max(1, self.results.world_size or self.gpus or 1)

    @property
    def on_gpu(self) -> bool:
        return self.results.device != "cpu"

    @property
    def measured(self) -> MeasuredWindow | None:
        """The stats of its measured window: inference's, else training's."""
        return self.results.inference or self.results.train


Aggregate = Literal["mean", "mean of those that reached it"]
PerTrial = Literal["headline", "detail"]


@dataclass(frozen=True)
class Metric:
    """One metric: its name, how a trial's value is read, its unit and direction, how repeats meet, how it is shown.

    `aggregate`: `mean` over the repeats that measured it, with its 95% interval; `mean of those that reached it`:
    the same, and the cell says how many of its successful repeats reached it (`110.0 (1/2)`: a target not every
    repeat reached). `column`: a column of the results table (`sweep results`, the report's whole table);
    `priority`: how early `sweep results` keeps it when the table must fit the terminal (1 first; None: only as the
    objective); `per_trial`: a column of `sweep results --per-trial` (in the catalogue's order), a `headline`
    figure kept before the trial's settings when that table must fit the terminal, a `detail` after them (None:
    not in that table); `logged`: logged on the trial's MLflow run; `repeatable`: `repeat_until` may measure it;
    `of_accuracy`: it answers a question about accuracy (a random-init speed run's value is not meaningful)."""

    name: str
    label: str
    unit: str
    higher: bool
    read: Callable[[Trial], float | None]
    aggregate: Aggregate = "mean"
    column: bool = False
    priority: int | None = None
    per_trial: PerTrial | None = None
    logged: bool = False
    repeatable: bool = False
    of_accuracy: bool = False
    said: str = ""  # how the answer states a value ("{}" the number); default: the number and the unit
    glossary: str = ""  # the anchor of its definition on the report's page, which its column header links to

    @property
    def to_target(self) -> bool:
        """A time to the target accuracy: a trial that never reached the target has none (its repeats meet as
        the mean of those that reached it)."""
        return self.aggregate == "mean of those that reached it"

    def say(self, number: str) -> str:
        """`5,120 samples/s`, `$0.0123 per epoch`: a value (already formatted) in its unit."""
        return (self.said or "{} " + self.unit).format(number)

    def text(self, value: float | None) -> str:
        """The value as the tables show it (`fmt_number`)."""
        return fmt_number(value)


def fmt_number(value: float | None) -> str:
    """A number as the tables show it: `-` for none, thousands separated from 1,000, 4 significant-ish digits."""
    if value is None:
        return "-"
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.4f}" if magnitude >= 0.001 else f"{value:.3g}"


# -- how a trial's values are read (see the module docstring) ---------------------------------------------------


def time_to_accuracy(results: Results, target: float) -> float | None:
    """Seconds of training until the first evaluation at or above `target` (see the module docstring)."""
    train = results.train
    train_s = finite(results.timings.train_s)
    steps = finite(train.steps) if train is not None else None
    warm_steps = (finite(train.warmup_steps) if train is not None else None) or 0.0
    warm_s = (finite(train.warmup_time_s) if train is not None else None) or 0.0
    for point in results.eval:
        accuracy = finite(point.accuracy)
        if accuracy is None or accuracy < target:
            continue
        step = float(point.step)
        if train_s is None or not steps:
            return None
        if step >= steps:
            return train_s
        if step <= warm_steps:
            return warm_s * step / warm_steps if warm_steps else 0.0
        return warm_s + (step - warm_steps) * (train_s - warm_s) / (steps - warm_steps)
    return None


def train_time_to_accuracy(results: Results, target: float) -> float | None:
    """Seconds of steady training until the first evaluation at or above `target`: its step x the steady step
    time, warm-up apart (see the module docstring)."""
    train = results.train
    train_s = finite(results.timings.train_s)
    if train is None or train_s is None:
        return None
    steps = finite(train.steps)
    warm_steps = finite(train.warmup_steps) or 0.0
    warm_s = min(train_s, finite(train.warmup_time_s) or 0.0)
    if not steps or steps <= warm_steps:
        return None
    per_step = (train_s - warm_s) / (steps - warm_steps)
    for point in results.eval:
        accuracy = finite(point.accuracy)
        if accuracy is not None and accuracy >= target:
            return min(float(point.step), steps) * per_step
    return None


def warmup_by_cache(results: Results) -> tuple[float | None, float | None]:
    """(cold, warm): a compiled trial's warm-up seconds as the one its compile cache state says; eager: neither."""
    if not results.config.compile:
        return None, None
    warm_up = finite(results.timings.compile_warmup_s)
    hit = results.compile_cache is not None and results.compile_cache.hit
    return (None, warm_up) if hit else (warm_up, None)


def peak_memory(results: Results) -> float | None:
    """Bytes: the CUDA caching allocator's peak on a GPU; on a CPU, the process's peak RSS."""
    peak = results.memory.torch_peak_allocated_bytes
    if peak is None and results.device == "cpu":
        peak = results.memory.host_peak_rss_bytes
    return float(peak) if peak is not None else None


def _ms(seconds: float | None) -> float | None:
    return seconds * 1000 if seconds is not None else None


def _samples_per_s(t: Trial) -> float | None:
    r = t.results
    if r.inference is not None:
        return finite(r.inference.samples_per_s)
    return finite(r.train.samples_per_s) if r.train is not None else None


def _step_p50_ms(t: Trial) -> float | None:
    r = t.results
    if r.inference is not None:
        return _ms(finite(r.inference.latency_s.p50))
    step = r.train.step_time_s if r.train is not None else None
    return _ms(finite(step.p50)) if step is not None else None


def _peak_mem_gib(t: Trial) -> float | None:
    peak = finite(peak_memory(t.results))
    return peak / GIB if peak is not None else None


def _epoch_s(t: Trial) -> float | None:
    train = t.results.train
    train_s = finite(t.results.timings.train_s)
    epochs = finite(train.epochs_completed) if train is not None else None
    if train is None or train_s is None or not epochs:
        return None
    return (train_s - min(train_s, finite(train.warmup_time_s) or 0.0)) / epochs


def _cost_per_epoch(t: Trial) -> float | None:
    epoch_s = _epoch_s(t)
    if epoch_s is None or t.price_per_hour is None or not t.on_gpu:
        return None
    return t.price_per_hour * t.world * epoch_s / 3600


def _tflops(t: Trial) -> float | None:
    return finite(t.measured.tflops_per_s) if t.measured is not None else None


def _mfu(t: Trial) -> float | None:
    tflops, peak = _tflops(t), t.peak_tflops
    return 100 * tflops / (peak * t.world) if tflops is not None and peak and t.on_gpu else None


def _mfu_probe(t: Trial) -> float | None:
    tflops = _tflops(t)
    probe = finite(t.results.probe.tflops_per_s) if t.results.probe is not None else None
    return 100 * tflops / (probe * t.world) if tflops is not None and probe and t.on_gpu else None


def _training(read: Callable[[Results, float], float | None]) -> Callable[[Trial], float | None]:
    """A time to accuracy: of a training trial only (inference measures no accuracy)."""
    return lambda t: read(t.results, t.target) if t.results.inference is None else None


# -- the catalogue ----------------------------------------------------------------------------------------------

CATALOGUE: tuple[Metric, ...] = (
    Metric("samples_per_s", "samples/s", "samples/s", True, _samples_per_s, column=True, per_trial="headline",
           logged=True, repeatable=True, glossary="def-samples-per-s"),
    Metric("step_p50_ms", "step p50 ms", "ms", False, _step_p50_ms, column=True, priority=3, per_trial="headline",
           logged=True, repeatable=True, glossary="def-step-p50"),
    Metric("peak_mem_gib", "peak GiB", "GiB", False, _peak_mem_gib, column=True, priority=4, per_trial="detail",
           logged=True, repeatable=True, glossary="def-peak"),
    Metric("tta_s", "TTA s", "s", False, _training(time_to_accuracy), aggregate="mean of those that reached it",
           column=True, priority=2, repeatable=True, of_accuracy=True, glossary="def-tta"),
    Metric("accuracy", "accuracy", "accuracy", True, lambda t: finite(t.results.final_accuracy), column=True,
           priority=1, per_trial="headline", logged=True, of_accuracy=True, glossary="def-accuracy"),
    Metric("cost_per_epoch", "$/epoch", "$ per epoch", False, _cost_per_epoch, column=True, priority=5, logged=True,
           repeatable=True, said="${} per epoch", glossary="def-cost"),
    Metric("epoch_s", "epoch s", "s", False, _epoch_s, logged=True, repeatable=True, glossary="def-epoch"),
    Metric("latency_p99_ms", "p99 ms", "ms", False,
           lambda t: _ms(finite(t.results.inference.latency_s.p99)) if t.results.inference is not None else None,
           repeatable=True, glossary="def-p99"),
    Metric("j_per_sample", "J/sample", "J per sample", False,
           lambda t: finite(t.results.energy.j_per_sample) if t.results.energy is not None else None, logged=True,
           repeatable=True, glossary="def-kwh"),
    Metric("kwh_per_epoch", "kWh/epoch", "kWh per epoch", False,
           lambda t: finite(t.results.energy.kwh_per_epoch) if t.results.energy is not None else None, column=True,
           priority=6, logged=True, glossary="def-kwh"),
    Metric("warmup_s", "warm-up s", "s", False, lambda t: finite(t.results.timings.compile_warmup_s),
           per_trial="detail"),
    Metric("tta_train_s", "TTA train s", "s", False, _training(train_time_to_accuracy),
           aggregate="mean of those that reached it", of_accuracy=True),
    Metric("warmup_cold_s", "warm-up cold s", "s", False, lambda t: warmup_by_cache(t.results)[0]),
    Metric("warmup_warm_s", "warm-up warm s", "s", False, lambda t: warmup_by_cache(t.results)[1]),
    Metric("queue_wait_s", "queue wait s", "s", False, lambda t: finite(t.results.timings.queue_wait_s),
           logged=True),
    Metric("tflops_per_s", "TFLOP/s", "TFLOP/s", True, _tflops, column=True, priority=8, per_trial="detail",
           logged=True,
           glossary="def-tflops"),
    Metric("mfu_pct", "MFU %", "%", True, _mfu, column=True, priority=7, per_trial="detail", logged=True,
           glossary="def-mfu"),
    Metric("mfu_probe_pct", "MFU probe %", "%", True, _mfu_probe, column=True, priority=10, per_trial="detail",
           logged=True, glossary="def-mfu"),
    Metric("tokens_per_sample", "tokens/sample", "tokens", False,
           lambda t: finite(t.measured.tokens_per_sample) if t.measured is not None else None, glossary="def-tokens"),
    Metric("padded_tokens_per_sample", "padded tokens/sample", "tokens", False,
           lambda t: finite(t.measured.padded_tokens_per_sample) if t.measured is not None else None, column=True,
           priority=9, logged=True, glossary="def-tokens"),
)
METRICS: dict[str, Metric] = {m.name: m for m in CATALOGUE}
TABLE_METRICS = tuple(m.name for m in CATALOGUE if m.column)  # the results table's figures, in this order
# how early the table keeps each figure when it must fit a terminal, most telling first
FIT_ORDER = tuple(m.name for m in sorted((m for m in CATALOGUE if m.priority is not None),
                                         key=lambda m: m.priority or 0))
LOGGED_METRICS = tuple(m.name for m in CATALOGUE if m.logged)
REPEAT_METRICS = tuple(m.name for m in CATALOGUE if m.repeatable)
ACCURACY_METRICS = frozenset(m.name for m in CATALOGUE if m.of_accuracy)
# a setting's label where a table names it by another word than its job setting's name
SETTING_LABELS = {"batch_size": "batch"}


def label(name: str) -> str:
    """The header of a setting's or a metric's column (`batch`, `samples/s`); a name the catalogue does not know
    is its own label."""
    return METRICS[name].label if name in METRICS else SETTING_LABELS.get(name, name)


def read_all(trial: Trial) -> dict[str, float | None]:
    """Every metric of the catalogue, read from one trial (None where its results do not give it)."""
    return {m.name: m.read(trial) for m in CATALOGUE}


# -- the job's own MLflow keys -------------------------------------------------------------------------------------

# What the job logs of a trial's measured work when it ends (kubesweep/jobs/runner.py; its energy: jobs/energy.py),
# each key with the results.json field it carries: a fine-tuning trial's, then an inference trial's
TRAINING_KEYS: dict[str, tuple[str, ...]] = {
    "result/samples_per_s": ("train", "samples_per_s"),
    "result/tokens_per_s": ("train", "tokens_per_s"),
    "result/tflops_per_s": ("train", "tflops_per_s"),
    "result/final_accuracy": ("final_accuracy",),
    "result/train_s": ("timings", "train_s"),
    "result/compile_warmup_s": ("timings", "compile_warmup_s"),
    "result/step_time_p50_s": ("train", "step_time_s", "p50"),
    "result/step_time_p99_s": ("train", "step_time_s", "p99"),
}
INFERENCE_KEYS: dict[str, tuple[str, ...]] = {
    "inference/samples_per_s": ("inference", "samples_per_s"),
    "inference/latency_p50_s": ("inference", "latency_s", "p50"),
    "inference/latency_p99_s": ("inference", "latency_s", "p99"),
    "inference/tflops_per_s": ("inference", "tflops_per_s"),
}


def job_summary(keys: dict[str, tuple[str, ...]], parts: dict[str, Any]) -> dict[str, float | None]:
    """The job's summary `keys` read from its results' parts as it holds them (dicts, before results.json is
    written): each key's field, None where a part or field is missing."""
    out: dict[str, float | None] = {}
    for key, path in keys.items():
        value: Any = parts
        for name in path:
            value = value.get(name) if isinstance(value, dict) else None
        out[key] = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return out


# -- what a tune search may optimise -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TuneSource:
    """Where a tune metric's value comes from: the MLflow key the job logs while the trial runs (what schedulers
    judge; None: none), the key it logs at the end, and the value's path in results.json (empty: none)."""

    intermediate: str | None
    final: str | None
    results: tuple[str, ...] = ()


def _job_key(intermediate: str | None, final: str) -> TuneSource:
    """A tune metric the job logs under `final` at its end: the results field that key carries."""
    return TuneSource(intermediate, final, {**TRAINING_KEYS, **INFERENCE_KEYS}.get(final, ()))


# the job's own MLflow keys a tune search may name (docs/tune.md)
TUNE_SOURCES: dict[str, TuneSource] = {
    "samples_per_second": _job_key("train/samples_per_s", "result/samples_per_s"),
    "samples_per_s": _job_key("train/samples_per_s", "result/samples_per_s"),
    "tokens_per_s": _job_key(None, "result/tokens_per_s"),
    "accuracy": _job_key("eval/accuracy", "result/final_accuracy"),
    "eval_loss": TuneSource("eval/loss", "eval/loss", ()),
    "train_loss": TuneSource("train/loss", "train/loss", ()),
    "step_time_p50_s": _job_key(None, "result/step_time_p50_s"),
    "train_s": _job_key(None, "result/train_s"),
    "inference_samples_per_s": _job_key(None, "inference/samples_per_s"),
    "latency_p99_s": _job_key(None, "inference/latency_p99_s"),
}
# the tune metric names: the job's keys above, then every metric of the catalogue its trial's run logs at its end;
# besides these, a search may name any MLflow key with "/"
TUNE_METRICS = (*TUNE_SOURCES, *(m.name for m in CATALOGUE if m.logged and m.name not in TUNE_SOURCES))


def tune_source(name: str) -> TuneSource:
    """Where a tune metric's value comes from: its `TUNE_SOURCES` entry; a logged metric of the catalogue: the key
    of its name, logged once at the trial's end (and read from results.json by its definition,
    `kubesweep.tune.metrics.from_results`); else (an MLflow key) that key, while the trial runs and at its end."""
    if name in TUNE_SOURCES:
        return TUNE_SOURCES[name]
    if name in METRICS and METRICS[name].logged:
        return TuneSource(None, name, ())
    return TuneSource(name, name, ())
