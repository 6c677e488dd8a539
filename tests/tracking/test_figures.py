"""The report's figures (kubesweep/tracking/figures.py) as matplotlib draws them: the text of every drawn artist
(cell labels, tick labels, annotations, titles) says which setting is at chance accuracy, ran out of memory or ran
on another GPU, beside its number; a CPU sweep's row is `CPU`; figures are drawn page-wide. Records are the
stand-in job's results edited as tests/tracking/test_report.py's `marked` says."""

from __future__ import annotations

import datetime as dt
from typing import Any

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
        assert drawn.count(CHANCE) == 1, drawn  # h100 bs16 fp16 eager (the DDP cell is not a line point)
        assert drawn.count("OOM") == 1 and drawn.count("GPU mismatch") == 1


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
