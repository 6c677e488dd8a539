"""What the CLI prints: plan and status tables, the progress lines written to a pipe, the per-trial results in every
format, and the summary of a search. Printed through a real rich Console into a buffer."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from kubesweep.backends.base import Phase, SweepStatus, TrialStatus
from kubesweep.cli import views
from kubesweep.plan import plan
from kubesweep.results import ResultRow, row_of
from kubesweep.sweep_spec import parse_sweep
from kubesweep.tracking import columns
from kubesweep.tracking.records import record_from_status
from kubesweep.wire import metrics as wm
from kubesweep.wire.outcomes import Outcome
from kubesweep.wire.search import MaxBatchCell, MaxBatchSummary
from tests.support.results_docs import make_results


def console() -> Console:
    return Console(file=io.StringIO(), width=250, color_system=None)


def printed(c: Console) -> str:
    return c.file.getvalue()  # type: ignore[attr-defined, no-any-return]


def sweep_doc(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "views"},
            "spec": {"matrix": {"gpu": ["h100-80gb", "v100-32gb"], "precision": ["fp16", "bf16"]}, **spec}}


def trial(name: str, phase: Phase, outcome: Outcome | None = None, *, reason: str = "", **kw: Any) -> TrialStatus:
    return TrialStatus(f"id-{name}", name, f"cell {name}", None, phase, outcome, reason, **kw)


def status(*trials: TrialStatus, message: str = "") -> SweepStatus:
    return SweepStatus("s", "local", list(trials), message=message)


# -- plan ------------------------------------------------------------------------------------------------------


def test_plan_json_lists_the_trials_in_order_and_the_dropped_cells_with_their_reason() -> None:
    p = plan(parse_sweep(sweep_doc()))
    out = views.plan_json(p)
    assert out["sweep"] == "views"
    assert [t["id"] for t in out["trials"]] == [t.id for t in p.trials]
    assert len(out["trials"]) == 3  # bf16 on the V100 is dropped
    assert out["trials"][0]["job"]["precision"] == out["trials"][0]["axes"]["precision"]
    [dropped] = out["dropped"]
    assert dropped["axes"] == {"gpu": "v100-32gb", "precision": "bf16"}
    assert "bf16 is not supported" in dropped["reason"]
    json.dumps(out)  # JSON-ready as it is


def test_print_plan_shows_the_axes_the_first_rows_and_says_how_many_it_left_out() -> None:
    p = plan(parse_sweep(sweep_doc(repeats=2)))
    c = console()
    views.print_plan(c, p, limit=4)
    text = printed(c)
    assert "sweep views: 6 trials" in text
    header = next(line for line in text.splitlines() if "trial" in line and "gpu" in line)
    assert "precision" in header and "repeat" in header  # an axis column each, and the repeat with repeats > 1
    assert sum(p.trials[i].name in text for i in range(6)) == 4
    assert "... 2 more trials not shown (--all prints every row)" in text
    assert "1 cells dropped" in text and "gpu=v100-32gb precision=bf16" in text

    c = console()
    views.print_plan(c, p, limit=None)
    assert all(t.name in printed(c) for t in p.trials) and "not shown" not in printed(c)


# -- status ----------------------------------------------------------------------------------------------------


def test_counts_text_gives_outcomes_of_finished_trials_and_phases_of_the_others() -> None:
    s = status(trial("a", Phase.SUCCEEDED, Outcome.SUCCEEDED), trial("b", Phase.FAILED, Outcome.OOM),
               trial("c", Phase.FAILED, Outcome.OOM), trial("d", Phase.CANCELLED),
               trial("e", Phase.RUNNING), trial("f", Phase.PENDING), trial("g", Phase.RUNNING))
    assert views.counts_text(s) == "4/7 done, 1 succeeded, 2 oom, 1 cancelled, 2 running, 1 pending"
    assert views.counts_text(status()) == "0/0 done"
    # every trial succeeded: nothing to add
    assert views.counts_text(status(trial("a", Phase.SUCCEEDED, Outcome.SUCCEEDED))) == "1/1 done"


def test_status_json_carries_every_trial_with_its_phase_outcome_and_results_file() -> None:
    s = status(trial("a", Phase.SUCCEEDED, Outcome.SUCCEEDED, attempts=1, results_path="/r/a.json"),
               trial("b", Phase.UNSCHEDULABLE, reason="0/3 nodes are available"))
    out = views.status_json(s)
    assert out["phase"] == "Pending" and out["counts"] == {"Succeeded": 1, "Unschedulable": 1}
    assert out["trials"] == [
        {"id": "id-a", "name": "a", "label": "cell a", "phase": "Succeeded", "outcome": "succeeded", "reason": "",
         "attempts": 1, "results": "/r/a.json"},
        {"id": "id-b", "name": "b", "label": "cell b", "phase": "Unschedulable", "outcome": None,
         "reason": "0/3 nodes are available", "attempts": 0, "results": None}]


def test_a_limited_status_table_puts_running_unschedulable_and_failed_trials_first() -> None:
    trials = [trial(f"done{i}", Phase.SUCCEEDED, Outcome.SUCCEEDED) for i in range(5)]
    trials += [trial("crashed", Phase.FAILED, Outcome.FAILED, reason="exit 1"), trial("busy", Phase.RUNNING),
               trial("stuck", Phase.UNSCHEDULABLE, reason="no node")]
    table = views.status_table(status(*trials), limit=4)
    names = [str(c) for c in table.columns[0].cells]
    assert names[:3] == ["crashed", "busy", "stuck"] and names[3].startswith("done")
    live = views.live_table(status(*trials), {"id-busy": "step 3/9"})
    assert [str(c) for c in live.columns[0].cells] == ["busy", "stuck"]  # the live view: active trials only
    assert [c.header for c in live.columns] == ["trial", "cell", "phase", "time", "progress", "reason"]
    assert [c.header for c in views.live_table(status(trials[6]), {}).columns] == ["trial", "cell", "phase", "time"]
    assert len(list(views.status_table(status(*trials)).columns[0].cells)) == 8  # no limit: every trial, in order


def test_print_status_says_how_many_rows_it_left_out_and_prints_the_backends_message() -> None:
    s = status(*(trial(f"t{i}", Phase.PENDING) for i in range(5)), message="namespace ns; waiting for the operator")
    c = console()
    views.print_status(c, s, limit=3)
    assert "... 2 more trials not shown" in printed(c)
    assert "waiting for the operator" in printed(c)
    c = console()
    views.print_status(c, s, limit=None)
    assert "not shown" not in printed(c)


def test_progress_on_a_pipe_prints_one_line_per_transition() -> None:
    c = console()
    view = views.ProgressView(c)
    assert not view.interactive
    running = trial("a", Phase.RUNNING, started_at=100.0)
    oom = trial("a", Phase.FAILED, Outcome.OOM, reason="CUDA out of memory", started_at=100.0, finished_at=142.0)
    view.update(status(trial("a", Phase.PENDING), trial("b", Phase.PENDING)))
    assert printed(c) == ""  # pending at first sight is not news
    view.update(status(running, trial("b", Phase.UNSCHEDULABLE, reason="no GPU node")))
    view.update(status(running, trial("b", Phase.UNSCHEDULABLE, reason="no GPU node")))  # nothing changed
    view.update(status(oom, trial("b", Phase.UNSCHEDULABLE, reason="node tainted")))
    view.update(status(oom, trial("b", Phase.SUCCEEDED, Outcome.SUCCEEDED, reason="ignored", started_at=150.0,
                                  finished_at=160.0)))
    view.stop()
    assert printed(c).splitlines() == [
        "[0/2] a: Running",
        "[0/2] b: Unschedulable (no GPU node)",
        "[1/2] a: Failed oom in 42s (CUDA out of memory)",
        "[1/2] b: Unschedulable (node tainted)",  # a new reason for the same phase is news
        "[2/2] b: Succeeded in 10s",  # no reason on success, and no outcome that repeats the phase
    ]


# -- results ---------------------------------------------------------------------------------------------------


ROWS = [
    ResultRow("t1", "h100-80gb", 32, "bf16", "default", 0, "succeeded", {"samples_per_s": 1234.5678,
              "step_p50_ms": 25.9, "peak_mem_gib": 7.25, "accuracy": 0.91, "warmup_s": 12.0}, train_s=60.0),
    ResultRow("t2", None, 256, "fp32", False, 1, "oom", reason="CUDA out of memory"),
]


def test_results_as_json_keep_every_field() -> None:
    out = json.loads(views.format_rows(ROWS, "json"))
    assert out[0]["samples_per_s"] == 1234.5678 and out[1]["reason"] == "CUDA out of memory"
    assert out[1]["compile"] is False and out[1]["samples_per_s"] is None


def test_results_as_csv_have_the_table_columns_and_the_reason() -> None:
    rows = list(csv.DictReader(io.StringIO(views.format_rows(ROWS, "csv"))))
    assert list(rows[0]) == ["trial", "gpu", "batch_size", "precision", "compile", "repeat", "outcome",
                             "samples_per_s", "step_p50_ms", "peak_mem_gib", "accuracy", "train_s", "warmup_s",
                             "tflops_per_s", "mfu_pct", "mfu_probe_pct", "reason"]
    assert rows[0]["samples_per_s"] == "1234.5678" and rows[1]["samples_per_s"] == ""
    assert rows[1]["reason"] == "CUDA out of memory"


def test_results_as_markdown_use_the_table_headers_and_show_missing_values_as_a_dash() -> None:
    lines = views.format_rows(ROWS, "markdown").splitlines()
    assert lines[0] == ("| trial | gpu | batch | precision | compile | rep | outcome | samples/s | step p50 ms | "
                        "peak GiB | accuracy | train s | warm-up s | TFLOP/s | MFU % | MFU probe % | reason |")
    assert lines[1] == "|" + "---|" * 17
    assert lines[2].startswith("| t1 | h100-80gb | 32 | bf16 | default | 0 | succeeded | 1235 | 25.9 | 7.25 | 0.91 |")
    assert lines[3] == ("| t2 | - | 256 | fp32 | off | 1 | oom | - | - | - | - | - | - | - | - | - | "
                        "CUDA out of memory |")


def test_print_results_prints_a_row_per_trial() -> None:
    c = console()
    views.print_results(c, "s", ROWS)
    text = printed(c)
    assert "sweep s: results" in text and "1235" in text and "oom" in text


def test_a_narrow_per_trial_table_keeps_which_trial_how_it_ended_and_its_headline_figures(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    c = Console(file=io.StringIO(), width=60, color_system=None)
    views.print_results(c, "s", ROWS)
    lines = printed(c).splitlines()
    assert lines[1].split() == ["trial", "rep", "outcome", "samples/s", "step", "p50", "ms", "accuracy"]
    assert ("left out to fit 60 columns: batch, precision, compile, gpu, peak GiB, train s, warm-up s, TFLOP/s, "
            "MFU %, MFU probe %;") in " ".join(" ".join(lines).split())


def test_a_metric_the_catalogue_shows_per_trial_is_in_every_per_trial_view_with_no_edit_there(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding a metric to the catalogue with `per_trial` adds it to `sweep results --per-trial`'s row, table, JSON,
    CSV and markdown: its value read by its own definition, its header its label."""
    new = wm.Metric("tokens_per_s_x", "tokens/s x", "tokens/s", True, lambda t: 7.0, per_trial="detail")
    monkeypatch.setattr(wm, "CATALOGUE", (*wm.CATALOGUE, new))
    monkeypatch.setattr(columns, "CATALOGUE", wm.CATALOGUE)
    monkeypatch.setitem(wm.METRICS, new.name, new)
    record = record_from_status(TrialStatus("id", "t-1", "cell", "h100-80gb", Phase.SUCCEEDED, Outcome.SUCCEEDED),
                                make_results(train={"samples_per_s": 10.0}), None)
    row = row_of(record)
    assert row.metrics["tokens_per_s_x"] == 7.0
    assert list(json.loads(views.format_rows([row], "json"))[0])[-2:] == ["tokens_per_s_x", "reason"]
    assert next(csv.DictReader(io.StringIO(views.format_rows([row], "csv"))))["tokens_per_s_x"] == "7.0"
    assert "| MFU % | MFU probe % | tokens/s x | reason |" in views.format_rows([row], "markdown")
    monkeypatch.setenv("COLUMNS", "250")
    c = console()
    views.print_results(c, "s", [row])
    assert printed(c).splitlines()[1].split()[-2:] == ["tokens/s", "x"]


# -- text from outside: a trial, a results file, Kubernetes, MLflow ---------------------------------------------

HOSTILE = "[/pytorch/aten/src/ATen/native/cuda/Loss.cu:12] \x1b[31mAssertion failed\x1b[0m\x1b]0;title\x07 [bold]"
SHOWN = "[/pytorch/aten/src/ATen/native/cuda/Loss.cu:12] Assertion failed [bold]"


def _shows_it_as_text(out: str) -> None:
    assert SHOWN in out and "\x1b" not in out and "\x07" not in out and "title" not in out, out


def test_a_reason_with_markup_and_escape_sequences_is_printed_as_text_in_every_view() -> None:
    s = status(trial("crashed", Phase.FAILED, Outcome.FAILED, reason=HOSTILE), message=HOSTILE)
    c = console()
    views.print_status(c, s)
    views.print_trial_list(c, s)
    views.print_sweeps(c, [s])
    views.print_cancelled(c, "s", False, s)
    _shows_it_as_text(printed(c))
    pipe = console()
    views.ProgressView(pipe).update(s)  # the line `sweep submit` prints on a pipe
    _shows_it_as_text(printed(pipe))
    assert f"crashed: Failed ({SHOWN})" in printed(pipe)
    done = console()
    p = plan(parse_sweep(sweep_doc()))
    views.print_submitted(done, Path("s.yaml"), p, "local", HOSTILE)
    views.print_warnings(done, [HOSTILE])
    _shows_it_as_text(printed(done))


def test_results_fields_with_markup_and_escape_sequences_are_printed_as_text_in_every_format() -> None:
    row = ResultRow(trial="t", gpu=HOSTILE, batch_size=8, precision=HOSTILE, compile=False, repeat=0,
                    outcome="failed", reason=HOSTILE)
    c = console()
    views.print_results(c, "s", [row])
    views.print_search(c, MaxBatchSummary(sweep="s", cells=[MaxBatchCell(
        gpu=HOSTILE, precision="fp16", axes={}, max_batch=8, smallest_oom=None, low=8, high=8, probes=3, history=[],
        error="")]))
    _shows_it_as_text(printed(c))
    for fmt in ("csv", "markdown"):
        out = views.format_rows([row], fmt)
        assert "\x1b" not in out and "\x07" not in out and "Assertion failed" in out
    assert json.loads(views.format_rows([row], "json"))[0]["reason"] == HOSTILE  # JSON escapes it, keeps it whole


def test_at_80_columns_trial_names_that_share_a_long_prefix_stay_whole_and_apart() -> None:
    """Sixteen trials of one sweep share a long prefix: the status table and the live view fold a name rather than
    cut it, so every name can be read (and typed into `sweep logs`) whole."""
    names = [f"bert-gpu-matrix-h100-80gb-bs{b}-{p}-{c}" for b in (16, 32) for p in ("fp32", "bf16", "fp16", "tf32")
             for c in ("eager", "compiled")]
    s = status(*(trial(n, Phase.RUNNING, reason="waiting for a GPU slot on the node") for n in names))
    for table in (views.status_table(s), views.live_table(s, {f"id-{n}": "step 3/90 12 s left" for n in names})):
        c = Console(file=io.StringIO(), width=80, color_system=None)
        c.print(table)
        text = printed(c)
        assert max(len(line) for line in text.splitlines()) <= 80
        lines = text.splitlines()
        if "│" in text:  # the status table's box: the first column between the first two bars
            first = [line.split("│")[1] for line in lines if line.count("│") > 1]
        else:  # the live view: the first column is as wide as the header's `trial` up to `cell`
            header = next(line for line in lines if line.lstrip().startswith("trial"))
            first = [line[:header.index("cell")] for line in lines[lines.index(header) + 2:]]
        joined = "".join(part.strip() for part in first)
        assert "…" not in joined and all(n in joined for n in names), text
