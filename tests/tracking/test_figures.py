"""The report's figures (kubesweep/tracking/figures.py) as matplotlib draws them: the text of every drawn artist
(cell labels, tick labels, annotations, titles) says which setting is at chance accuracy, ran out of memory or ran
on another GPU, beside its number; a CPU sweep's row is `CPU`; figures are drawn page-wide; and, however crowded
the cells (`crowded`), no drawn text covers another or leaves the figure, and the brightest heatmap cell is never a
flagged one. Records are the stand-in job's results edited as tests/tracking/test_report.py's `marked` says."""

from __future__ import annotations

import datetime as dt
import itertools
from pathlib import Path
from typing import Any

import pytest

from kubesweep.tracking import figures
from kubesweep.tracking.aggregate import Cell, aggregate, fmt_number
from tests.support.mlflow_fixtures import SWEEP_SPEC
from tests.tracking.test_report import CPU_SPEC, SWEEP_SPEC_ONE_GPU, marked, records

CHANCE = "chance accuracy (0.51)"


def texts(fig: Any) -> list[str]:
    """Every string drawn on the figure: titles, tick labels, annotations, cell texts."""
    out = [t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text"))]
    return [t for t in out if t]


def cells(spec: str = SWEEP_SPEC, edit: Any = marked) -> list[Cell]:
    return aggregate(records(spec, edit), target=0.85)


def cell(found: list[Cell], **axes: Any) -> Cell:
    (one,) = [c for c in found if all(c.axes.as_dict()[k] == v for k, v in axes.items())]
    return one


def test_the_heatmap_marks_each_number_with_its_flags() -> None:
    found = cells()
    fig = figures.heatmap(found)
    drawn = texts(fig)
    at_chance = cell(found, task="finetune", gpu="h100-80gb", gpus=1, batch_size=16, compile="off")
    ddp = cell(found, task="finetune", gpu="h100-80gb", gpus=2)
    for c in (at_chance, ddp):
        number = fmt_number(c.value("samples_per_s"))
        (text,) = [t for t in drawn if t.startswith(number)]
        assert text.replace("\n", " ").endswith(CHANCE), text  # beside the number, in the same cell
    assert "OOM" in drawn and "GPU mismatch" in drawn  # the cells without a number say why
    best = [c for c in found if c.best and c.task == "finetune"]
    assert len(best) == 2 and all(fmt_number(c.value("samples_per_s")) + " *" in drawn for c in best)
    assert {t.get_text() for t in fig.axes[0].get_yticklabels()} == {"h100-80gb", "h100-80gb x2", "l40s",
                                                                      "v100-32gb"}
    unmarked = cell(found, task="finetune", gpu="l40s", batch_size=16)
    assert fmt_number(unmarked.value("samples_per_s")) in drawn  # no mark where there is none
    # a setting that did not learn keeps its number but takes no colour: never the brightest cell
    coloured = fig.axes[0].images[0].get_array()
    values = {float(v) for v in coloured.compressed()}
    assert at_chance.value("samples_per_s") not in values and unmarked.value("samples_per_s") in values


def test_a_cpu_sweeps_heatmap_row_reads_cpu() -> None:
    fig = figures.heatmap(cells(CPU_SPEC, None))
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["CPU"]
    assert not any("x0" in t for t in texts(fig))


def test_the_line_plots_ring_and_label_the_flagged_settings() -> None:
    for metric in ("samples_per_s", "peak_mem_gib"):
        drawn = texts(figures.per_gpu_lines(cells(), metric, "y", "title"))
        # h100 bs16 fp16 eager (the DDP cell is not a line point); the h100 panel has two lines: the label names its
        # line, the V100's has one
        assert [t for t in drawn if CHANCE in t] == [f"fp16: {CHANCE}"], drawn
        assert [t for t in drawn if "OOM" in t] == ["fp16: OOM"] and drawn.count("GPU mismatch") == 1


def test_the_bars_and_the_speedup_carry_the_marks_in_their_labels() -> None:
    found = cells()
    for metric in ("cost_per_epoch", "tta_s"):
        fig = figures.bars(figures.finetune(found), metric, "x", "title")
        labels = {t.get_text(): t.get_color() for t in fig.axes[0].get_yticklabels()}
        flagged = [label for label in labels if label.endswith(f"[{CHANCE}]")]
        if metric == "cost_per_epoch":  # TTA: a setting at chance never reaches the target
            assert flagged == ["h100-80gb bs16 fp16 [chance accuracy (0.51)]",
                               "h100-80gb x2 bs16 fp16 [chance accuracy (0.51)]"], labels
        assert all(labels[label] == figures.FLAGGED for label in flagged)
        assert any(label.endswith("[*]") for label in labels)
    pairs = [t.get_text() for t in figures.speedup(found).axes[0].get_yticklabels()]
    assert pairs == [f"h100-80gb bs16 fp16 [eager: {CHANCE}]"]


def test_the_timeline_marks_the_trials_that_did_not_learn() -> None:
    count = [0]

    def timed(trial: Any, results: dict[str, Any]) -> None:
        start = 1_700_000_000.0 + 30 * count[0]
        count[0] += 1
        results["started_at"] = dt.datetime.fromtimestamp(start, dt.UTC).isoformat()
        results["finished_at"] = dt.datetime.fromtimestamp(start + 25, dt.UTC).isoformat()
        results["device"] = "cuda"
        results["gpu_lease"] = {"path": "/home/gpus/gpu-0.lock", "acquired_at": start + 5, "released_at": start + 24}
        if trial.config.job.batch_size == 32 and trial.config.job.precision == "bf16":
            results["final_accuracy"] = results["eval"][-1]["accuracy"] = 0.509

    fig = figures.timeline(cells(SWEEP_SPEC_ONE_GPU, timed))
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert len(labels) == 4 and [label for label in labels if label.endswith(f" [{CHANCE}]")] == [
        label for label in labels if "bs32-bf16" in label]


def test_figures_are_drawn_page_wide() -> None:
    found = cells()
    for fig in (figures.heatmap(found), figures.per_gpu_lines(found, "samples_per_s", "y", "t"),
                figures.bars(found, "samples_per_s", "x", "t"), figures.speedup(found)):
        assert fig.get_size_inches()[0] >= figures.WIDTH and fig.dpi == figures.DPI


# -- crowded labels ------------------------------------------------------------------------------------------------

CROWDED_SPEC = """\
apiVersion: kubesweep.io/v1alpha1
kind: Sweep
metadata: {name: crowded}
spec:
  job: {epochs: 1, train_samples: 4000}
  matrix: {gpu: [h100-80gb, l40s, a100-40gb], batch_size: [16, 32, 64, 128], precision: [fp16, bf16, fp32],
           compile: [false, true]}
  repeats: 2
  resources: {gpus_per_trial: 1, retries: 0}
"""
LONG_GPU = "nvidia-rtx-pro-6000-blackwell-server-edition-96gb"
HOST_BOUND = {"interval_s": 0.1, "devices": [{
    "index": 0, "samples": 50, "utilization_mean_pct": 30.0, "utilization_max_pct": 60.0, "power_mean_w": None,
    "power_max_w": None, "temperature_max_c": None, "memory_used_max_bytes": 1, "process_memory_max_bytes": None,
    "measured_samples": 40, "utilization_measured_pct": 37.0}]}


def crowded() -> list[Cell]:
    """On the H100 and on a GPU with a long name, at the smallest and the largest batch size (the panels' left and
    right edges), every precision flagged: at chance (fp16 eager), OOM (bf16 eager), GPU mismatch (fp32 eager),
    host-bound (fp16 compiled: the fastest setting of its GPU), one repeat OOM and the other at chance (bf16
    compiled), failed (fp32 compiled). Every trial has a span for the timeline."""
    start = itertools.count()

    def fail(results: dict[str, Any], outcome: str) -> None:
        results.update(outcome=outcome, exit_code=3, error={"type": "Error", "message": "stand-in"})
        for key in ("train", "eval", "final_accuracy", "memory", "data"):
            results.pop(key, None)

    def edit(trial: Any, results: dict[str, Any]) -> None:
        t0 = 1_700_000_000.0 + 20 * next(start)
        results.update(started_at=dt.datetime.fromtimestamp(t0, dt.UTC).isoformat(),
                       finished_at=dt.datetime.fromtimestamp(t0 + 25, dt.UTC).isoformat(),
                       gpu_lease={"path": "/home/gpus/gpu-0.lock", "acquired_at": t0 + 5, "released_at": t0 + 24})
        job = trial.config.job
        if job.batch_size not in (16, 128) or trial.gpu == "l40s":
            return
        setting = (job.precision, job.compile is not False)
        if setting == ("fp16", False) or (setting == ("bf16", True) and trial.repeat == 0):
            results["final_accuracy"] = results["eval"][-1]["accuracy"] = 0.509
        elif setting == ("fp16", True):
            results["gpu_monitor"] = HOST_BOUND
        else:
            fail(results, {("bf16", False): "oom", ("fp32", False): "gpu_mismatch", ("bf16", True): "oom"}.get(
                setting, "failed"))

    recs = records(CROWDED_SPEC, edit)
    for r in recs:
        r.gpu = LONG_GPU if r.gpu == "a100-40gb" else r.gpu
    return aggregate(recs, target=0.85)


def drawn_boxes(fig: Any, path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[Any, Any]], list[Any]]:
    """Every text the figure draws as `figures.save` writes it (titles, tick and axis labels, annotations, legend
    entries, cell texts) with its box in display pixels; and its legends."""
    from matplotlib.text import Text

    seen: dict[int, tuple[Any, Any]] = {}  # saving draws the figure twice: each text's last box
    draw = Text.draw

    def spy(self: Text, renderer: Any) -> None:
        draw(self, renderer)
        if self.get_visible() and self.get_text():
            seen[id(self)] = (self, self.get_window_extent(renderer))

    with monkeypatch.context() as patched:
        patched.setattr(Text, "draw", spy)
        figures.save(fig, path)
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    return list(seen.values()), legends


def overlap(a: Any, b: Any) -> bool:
    """The boxes share an area (touching edges do not count)."""
    return min(a.x1, b.x1) - max(a.x0, b.x0) > 0.5 and min(a.y1, b.y1) - max(a.y0, b.y0) > 0.5


def assert_fitted(fig: Any, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen, legends = drawn_boxes(fig, path, monkeypatch)
    assert seen
    frame = fig.bbox
    for text, box in seen:
        inside = box.x0 >= frame.x0 - 0.5 and box.y0 >= frame.y0 - 0.5 and box.x1 <= frame.x1 + 0.5 \
            and box.y1 <= frame.y1 + 0.5
        assert inside, f"{path.name}: {text.get_text()!r} at {box.bounds} leaves the figure {frame.bounds}"
    for (a, box_a), (b, box_b) in itertools.combinations(seen, 2):
        assert not overlap(box_a, box_b), f"{path.name}: {a.get_text()!r} overlaps {b.get_text()!r}"
    for legend in legends:
        own = {id(t) for t in (*legend.get_texts(), legend.get_title())}
        box = legend.get_window_extent()
        for text, text_box in seen:
            assert id(text) in own or not overlap(box, text_box), f"{path.name}: the legend covers {text.get_text()!r}"


def every_figure(found: list[Cell]) -> dict[str, Any]:
    return {"throughput": figures.per_gpu_lines(found, "samples_per_s", "samples/s", "Fine-tuning throughput"),
            "peak_memory": figures.per_gpu_lines(found, "peak_mem_gib", "peak GiB", "Peak memory", lambda gpu: 80.0),
            "cost": figures.bars(figures.finetune(found), "cost_per_epoch", "USD", "$ per epoch"),
            "samples": figures.bars(found, "samples_per_s", "samples/s", "samples/s"),
            "speedup": figures.speedup(found), "heatmap": figures.heatmap(found), "timeline": figures.timeline(found)}


@pytest.mark.parametrize("case", ["crowded", "marked"])
def test_no_label_overlaps_another_or_leaves_the_figure(case: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    found = crowded() if case == "crowded" else cells()
    for name, fig in every_figure(found).items():
        if fig is not None:
            assert_fitted(fig, tmp_path / f"{case}-{name}.png", monkeypatch)


def test_the_crowded_labels_keep_their_marks_and_the_brightest_cell_is_never_flagged() -> None:
    found = crowded()
    drawn = texts(figures.per_gpu_lines(found, "samples_per_s", "samples/s", "t"))
    for gpu in ("h100-80gb", LONG_GPU):
        for batch in (16, 128):
            for c in (c for c in found if c.axes.gpu == gpu and c.axes.batch_size == batch):
                assert any(t.replace("\n", " ").endswith("; ".join(c.marks) if c.value("samples_per_s")
                                                          else c.status) for t in drawn), (c.marks, drawn)
    fig = figures.heatmap(found)
    coloured = {float(v) for v in fig.axes[0].images[0].get_array().compressed()}
    fastest = max((c for c in found if c.axes.gpu == "h100-80gb"), key=lambda c: c.value("samples_per_s") or 0.0)
    assert fastest.marks == ["host-bound (GPU busy 37% of measured steps)"]  # and the best: only chance is never
    assert fastest.value("samples_per_s") not in coloured
    assert max(coloured) == max(c.value("samples_per_s") or 0.0 for c in found if not c.marks)
    assert not any(c.value("samples_per_s") in coloured for c in found if c.marks)


def test_error_bars_are_the_95_percent_interval_the_text_gives() -> None:
    """Every text of the report gives mean ± the 95% interval's half-width; the bars and lines draw the same."""
    from matplotlib.container import ErrorbarContainer

    found = [c for c in cells(edit=None) if c.task == "finetune" and c.value("samples_per_s") is not None]
    spread = [c for c in found if (c.metrics["samples_per_s"].half_width or 0.0) > 0]
    assert spread, "the stand-in's repeats must differ for this test to mean something"
    for fig in (figures.bars(found, "samples_per_s", "samples/s", "t"),
                figures.per_gpu_lines(found, "samples_per_s", "samples/s", "t")):
        drawn = sorted(round(abs(seg[1][i] - seg[0][i]) / 2, 6)
                       for ax in fig.axes for c in ax.containers if isinstance(c, ErrorbarContainer)
                       for coll in c.lines[2] for seg in coll.get_segments()
                       for i in (0 if fig.axes[0].get_xlabel() == "samples/s" else 1,))
        expected = sorted(round(c.metrics["samples_per_s"].half_width or 0.0, 6) for c in found
                          if c.axes.gpus <= 1 or fig.axes[0].get_xlabel() == "samples/s")
        assert drawn == expected
