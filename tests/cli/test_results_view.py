"""The results table a terminal shows (kubesweep/cli/results_view.py): the answer first, whole columns that fit the
width, what every row shares said once, what was left out named."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from kubesweep.cli import results_view, views
from kubesweep.gpus import load_catalog
from kubesweep.tracking.aggregate import aggregate
from kubesweep.tracking.records import TrialRecord
from kubesweep.wire.config import JobConfig
from tests.support.results_docs import make_results, trial_parts

CATALOG = load_catalog()
LONG_FLAG = "OOM"


def record(name: str, batch: int, precision: str, compile_: Any, rate: float, repeat: int = 0,
           outcome: str = "succeeded", gpu: str = "h100-80gb", **parts: Any) -> TrialRecord:
    job = JobConfig(batch_size=batch, precision=precision, compile=compile_, learning_rate=3e-5)  # type: ignore[arg-type]
    results = make_results(**{"config": job.model_dump(mode="json", exclude_unset=True),
                              **trial_parts(rate + repeat * 10, **parts)}) if outcome == "succeeded" else None
    return TrialRecord(name, name, repeat, gpu, 1, outcome, job, results)


def matrix() -> list[TrialRecord]:
    """Twelve settings on an H100, two repeats each, every figure measured: a table of 16 columns."""
    out = []
    for batch in (16, 64, 256):
        for precision in ("bf16", "fp16"):
            for compile_ in (False, "max-autotune"):
                for repeat in (0, 1):
                    name = f"bs{batch}-{precision}-{compile_}-r{repeat}"
                    out.append(record(name, batch, precision, compile_, 1000.0 + batch * 7.5, repeat))
    out.append(record("oom-r0", 512, "fp16", False, 0, outcome="oom"))
    return out


def shown(width: int | None, records: list[TrialRecord], *, wide: bool = False, partial: str = "") -> str:
    console = Console(file=io.StringIO(), width=width or 400, color_system=None, highlight=False, soft_wrap=True)
    results_view.print_cells(console, "m", aggregate(records, catalog=CATALOG), source="results files",
                             target=0.90, best_by="samples_per_s", width=width or 400, wide=wide, partial=partial,
                             more="`sweep results m --wide`")
    return console.file.getvalue()  # type: ignore[attr-defined,no-any-return]


@pytest.mark.parametrize("width", [80, 100, 140])
def test_the_table_fits_the_width_with_whole_cells_and_names_what_it_left_out(width: int) -> None:
    out = shown(width, matrix())
    assert max(len(line) for line in out.splitlines()) <= width
    assert "…" not in out  # no cell cut short
    table = out[out.index("sweep m:"):]
    assert "batch" in table and "precision" in table and "compile" in table and "samples/s" in table
    assert "2,925" in table and "±" in table  # the objective, whole, with its interval
    if width < 140:
        words = " ".join(out.split())
        assert f"left out to fit {width} columns:" in words and "`sweep results m --wide` shows every column" in words


def test_wide_shows_every_column_and_leaves_nothing_out() -> None:
    out = shown(100, matrix(), wide=True)
    assert "…" not in out and max(len(line) for line in out.splitlines()) > 100
    for header in ("task", "gpu", "samples/s", "step p50 ms", "peak GiB", "TTA s", "accuracy", "$/epoch",
                   "kWh/epoch", "best", "flags"):
        assert header in out
    assert "left out" not in out


def test_what_every_row_shares_is_said_once_in_the_title() -> None:
    out = shown(100, [record("a", 16, "bf16", False, 1000.0), record("b", 64, "bf16", False, 2000.0)])
    title = next(line for line in out.splitlines() if line.startswith("sweep m:"))
    assert title == "sweep m: 2 settings (task finetune, gpu h100-80gb, precision bf16, compile off, every trial ok)"
    header = out.splitlines()[out.splitlines().index(title) + 1]
    assert "precision" not in header and "status" not in header and "batch" in header


def test_the_answer_comes_first_without_the_objectives_nothing_answers() -> None:
    out = shown(100, [record("a", 16, "bf16", False, 1000.0), record("b", 64, "bf16", False, 2000.0),
                      record("b1", 64, "bf16", False, 2000.0, repeat=1)])
    first = out.splitlines()[0]
    assert first.startswith("fine-tuning, highest throughput: h100-80gb bs64 bf16")
    assert out.index("fine-tuning, highest throughput") < out.index("sweep m:")


def test_flags_wrap_inside_the_width() -> None:
    records = [record("a", 16, "bf16", False, 1000.0, accuracy=0.5),
               record("b", 64, "bf16", False, 2000.0, accuracy=0.5)]
    out = shown(80, records)
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "chance accuracy" in out and "n=1" in out


def test_a_sweep_with_trials_still_to_end_is_marked_partial() -> None:
    records = [record("a", 16, "bf16", False, 1000.0), record("b", 64, "bf16", False, 0, outcome="running"),
               record("c", 64, "bf16", False, 0, outcome="pending")]
    partial = views.partial_text(records)
    assert partial == "2 of 3 trials still to end"
    assert shown(100, records, partial=partial).startswith(
        "partial results: 2 of 3 trials still to end; the answer may change")
    assert views.partial_text(records[:1]) == ""


def test_markdown_carries_the_answer_the_table_and_how_to_read_it() -> None:
    cells = aggregate(matrix(), catalog=CATALOG)
    text = results_view.markdown(cells, "m", source="results files", target=0.9, best_by="samples_per_s")
    lines = text.splitlines()
    assert lines[0] == "## Sweep m: results" and "**The answer**" in lines
    answer = lines[lines.index("**The answer**") + 2]
    assert answer.startswith("- fine-tuning, highest throughput: ") and "h100-80gb bs256" in answer, answer
    assert text.index("**The answer**") < text.index("| ") < text.index("Mean ± the 95% interval")
    assert sum(1 for line in lines if line.startswith("| ")) == len(cells) + 1  # header and a row per setting
    assert "* best samples/s per GPU type" in text and "Marks beside a number" in text and "OOM" in text


def test_tflops_and_mfu_are_shown_and_a_cpu_sweep_says_why_it_has_no_mfu() -> None:
    """An H100 bf16 cell at 300 TFLOP/s reads 30.32 MFU % of the 989.4 dense peak; a CPU sweep shows its TFLOP/s and
    says it has no MFU because there is no peak, rather than a number."""
    def flops(name: str, gpu: str, tflops: float) -> TrialRecord:
        parts = trial_parts(100.0, device="cuda" if gpu != "cpu" else "cpu")
        parts["train"] |= {"tflops_per_s": tflops, "tokens_per_sample": 12.9, "padded_tokens_per_sample": 21.0}
        job = JobConfig(batch_size=256, precision="bf16")
        return TrialRecord(name, name, 0, None if gpu == "cpu" else gpu, 0 if gpu == "cpu" else 1, "succeeded", job,
                           make_results(**{"config": job.model_dump(mode="json", exclude_unset=True), **parts}))

    gpu = shown(None, [flops("h", "h100-80gb", 300.0)])
    assert "TFLOP/s" in gpu and "MFU %" in gpu and "30.32" in gpu and "300.0" in gpu and "21.00" in gpu
    cpu = shown(None, [flops("c", "cpu", 0.002)])
    assert "0.0020" in cpu and "no figures for: " in cpu and "MFU % (no peak on the CPU)" in cpu
