"""A real local sweep tracked in a real `mlflow server` (fixtures in tests/support/mlflow_fixtures.py).

The workload is tests/support/tracked_job.py, which logs through the job's own MLflow logger
(`kubesweep.jobs.mlflow_logger`) and writes schema-valid results files without training; the real job is
run once in test_sweep_real_job.py. Every number `sweep results` and `sweep report` show is checked here against the
trials' results files, computed independently.
"""

from __future__ import annotations

import csv
import io
import json
import re
import socket
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from kubesweep.backends.base import Backend, Phase, SweepStatus, TrialStatus
from kubesweep.gpus import load_catalog
from kubesweep.tracking.aggregate import aggregate
from kubesweep.tracking.records import TrialRecord
from kubesweep.tracking.runs import ServerAway
from kubesweep.tracking.sweep import answer_tags, load_records
from kubesweep.tracking.target import TrackingTarget
from kubesweep.wire.config import JobConfig
from tests.support.mlflow_fixtures import SWEEP_CELLS, SWEEP_TRIALS, TrackedSweep
from tests.support.results_docs import make_results, trial_parts

EXPERIMENT = "kubesweep-tracked"


def client(ts: TrackedSweep) -> MlflowClient:
    return MlflowClient(tracking_uri=ts.server.url)


def parents(ts: TrackedSweep) -> list[Any]:
    c = client(ts)
    experiment = c.get_experiment_by_name(EXPERIMENT)
    assert experiment is not None, "the sweep's experiment was not created"
    return list(c.search_runs([experiment.experiment_id],
                              "tags.`kubesweep.sweep` = 'tracked' and tags.`kubesweep.role` = 'parent'"))


def children(ts: TrackedSweep, parent_id: str) -> list[Any]:
    c = client(ts)
    experiment = c.get_experiment_by_name(EXPERIMENT)
    return list(c.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'",
                              max_results=1000))


def cell_key(results: dict[str, Any]) -> tuple[Any, ...]:
    job, trial = results["config"], results["trial"]
    return (job["task"], trial["gpu"] or "cpu", trial["gpus_per_trial"], job["batch_size"], job["precision"],
            "off" if not job["compile"] else str(job["compile"]))


def json_key(cell: dict[str, Any]) -> tuple[Any, ...]:
    return (cell["task"], cell["gpu"], cell["gpus"], cell["batch_size"], cell["precision"], cell["compile"])


def expected_cells(ts: TrackedSweep, target: float = 0.90) -> dict[tuple[Any, ...], dict[str, list[float]]]:
    """Per cell, each metric's values over the repeats that succeeded, straight from the results files."""
    catalog = load_catalog()
    cells: dict[tuple[Any, ...], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in ts.results_files().values():
        values = cells[cell_key(r)]
        values["outcomes"].append(r["outcome"])  # type: ignore[arg-type]
        if r["outcome"] != "succeeded":
            continue
        if r.get("inference"):
            values["samples_per_s"].append(r["inference"]["samples_per_s"])
            values["step_p50_ms"].append(r["inference"]["latency_s"]["p50"] * 1000)
        else:
            train, t = r["train"], r["timings"]
            values["samples_per_s"].append(train["samples_per_s"])
            values["step_p50_ms"].append(train["step_time_s"]["p50"] * 1000)
            values["accuracy"].append(r["final_accuracy"])
            epoch_s = (t["train_s"] - train["warmup_time_s"]) / train["epochs_completed"]
            values["epoch_s"].append(epoch_s)
            values["cost_per_epoch"].append(
                catalog[r["trial"]["gpu"]].price_per_hour * r["world_size"] * epoch_s / 3600)
            reached = [p for p in r["eval"] if p["accuracy"] >= target]
            if reached:
                s, w, ws = reached[0]["step"], train["warmup_steps"], train["warmup_time_s"]
                tta = t["train_s"] if s >= train["steps"] else ws + (s - w) * (t["train_s"] - ws) / (train["steps"] - w)
                values["tta_s"].append(tta)
        values["peak_mem_gib"].append(r["memory"]["torch_peak_allocated_bytes"] / 1024**3)
    return cells


def test_one_parent_run_and_a_child_run_per_trial(tracked_sweep: TrackedSweep) -> None:
    ts = tracked_sweep
    assert "parent run" in ts.submit_output and "(created)" in ts.submit_output
    found = parents(ts)
    assert len(found) == 1
    parent = found[0]
    assert parent.data.tags["kubesweep.role"] == "parent" and parent.info.run_name == "tracked"
    assert parent.info.status == "FINISHED"
    # the answer on the parent run: a tag per task, GPU type and objective, the sentences as its description
    best = {k: v for k, v in parent.data.tags.items() if k.startswith("kubesweep.best.")}
    assert best["kubesweep.best.finetune.h100-80gb.samples_per_s"].split(":")[1].endswith(
        ")") and "samples/s" in best["kubesweep.best.finetune.h100-80gb.samples_per_s"], best
    assert parent.data.tags["mlflow.note.content"].startswith("fine-tuning, highest throughput: ")
    answer = client(ts).download_artifacts(parent.info.run_id, "answer.txt")
    assert Path(answer).read_text() == parent.data.tags["mlflow.note.content"]
    kids = children(ts, parent.info.run_id)
    assert len(kids) == SWEEP_TRIALS
    ids = {k.data.tags["kubesweep.trial_id"] for k in kids}
    assert ids == set(ts.results_files())  # every trial, once
    for kid in kids:
        tags = kid.data.tags
        assert tags["kubesweep.sweep"] == "tracked"
        for key in ("kubesweep.gpu", "kubesweep.batch_size", "kubesweep.precision", "kubesweep.compile",
                    "kubesweep.repeat", "kubesweep.outcome"):
            assert key in tags, key
        artifacts = [a.path for a in client(ts).list_artifacts(kid.info.run_id)]
        assert "results.json" in artifacts
        if tags["kubesweep.outcome"] == "succeeded":  # the runs view's columns, as `sweep results` has them
            assert {"samples_per_s", "peak_mem_gib", "step_p50_ms"} <= set(kid.data.metrics), kid.data.metrics
    experiment = client(ts).get_experiment_by_name(EXPERIMENT)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert json.loads(experiment.tags["mlflow.sharedViewState.kubesweep"])["orderByKey"] == (
        "metrics.`ranked_samples_per_s`")


def test_results_from_mlflow_match_the_results_files(tracked_sweep: TrackedSweep) -> None:
    ts = tracked_sweep
    proc = ts.sweep("results", ts.name, "--format", "json", "--from", "mlflow")
    out = json.loads(proc.stdout)
    assert out["source"].startswith(f"MLflow {ts.server.url}")
    assert "Downloading artifacts" not in proc.stderr
    expected = expected_cells(ts)
    assert len(out["cells"]) == SWEEP_CELLS == len(expected)
    for cell in out["cells"]:
        want = expected[json_key(cell)]
        assert cell["n"] == len(want["outcomes"]) == 2
        for metric in ("samples_per_s", "step_p50_ms", "peak_mem_gib", "accuracy", "cost_per_epoch", "tta_s",
                       "epoch_s"):
            got, values = cell["metrics"][metric], want.get(metric, [])
            assert got["n"] == len(values), (cell, metric)
            if values:
                assert got["mean"] == pytest.approx(statistics.fmean(values), rel=1e-9), (cell, metric)
                assert got["cv"] == pytest.approx(statistics.stdev(values) / statistics.fmean(values), rel=1e-6)
            else:
                assert got["mean"] is None
    by_key = {json_key(c): c for c in out["cells"]}
    assert by_key[("finetune", "h100-80gb", 1, 256, "fp16", "off")]["status"] == "OOM"
    assert by_key[("finetune", "v100-32gb", 1, 16, "fp16", "off")]["status"] == "GPU mismatch"
    # best per (task, GPU type): the highest mean samples/s (no stand-in trial is at chance accuracy)
    for (task, gpu) in {(c["task"], c["gpu"]) for c in out["cells"]}:
        group = [c for c in out["cells"] if (c["task"], c["gpu"]) == (task, gpu)]
        rated = [c for c in group if c["metrics"]["samples_per_s"]["mean"] is not None]
        best = [c for c in group if c["best"]]
        if rated:
            assert best == [max(rated, key=lambda c: c["metrics"]["samples_per_s"]["mean"])]
        else:
            assert best == []
    # the same numbers from this machine's results files: what `sweep results` reads first (no MLflow round
    # trip, nothing on stderr), and what it reads with tracking off
    for args in ((), ("--no-tracking",)):
        proc = ts.sweep("results", ts.name, "--format", "json", *args)
        files = json.loads(proc.stdout)
        assert files["source"].startswith("results files (local backend)")
        assert [c["metrics"] for c in files["cells"]] == [c["metrics"] for c in out["cells"]]
        if not args:
            assert proc.stderr == ""


def test_time_to_accuracy_target(tracked_sweep: TrackedSweep) -> None:
    ts = tracked_sweep
    out = json.loads(ts.sweep("results", ts.name, "--format", "json", "--target-accuracy", "0.85").stdout)
    expected = expected_cells(ts, target=0.85)
    for cell in out["cells"]:
        values = expected[json_key(cell)].get("tta_s", [])
        got = cell["metrics"]["tta_s"]
        assert got["n"] == len(values)
        if values:  # reached at the first epoch's evaluation: strictly less than the whole training time
            assert got["mean"] == pytest.approx(statistics.fmean(values), rel=1e-9)
            assert got["mean"] < cell["metrics"]["epoch_s"]["mean"] * 2


def test_table_formats_sort_and_filter(tracked_sweep: TrackedSweep) -> None:
    ts = tracked_sweep
    table = ts.sweep("results", ts.name, "--wide").stdout
    assert "OOM" in table and "GPU mismatch" in table and "±" in table and "$/epoch" in table
    rows = list(csv.DictReader(io.StringIO(ts.sweep(
        "results", ts.name, "--format", "csv", "--filter", "gpu=h100-80gb", "--filter", "task=finetune",
        "--sort", "samples_per_s").stdout)))
    assert {r["gpu"] for r in rows} == {"h100-80gb"} and {r["task"] for r in rows} == {"finetune"}
    rates = [float(r["samples_per_s_mean"]) for r in rows if r["samples_per_s_mean"]]
    assert rates == sorted(rates, reverse=True) and len(rates) == 4
    assert rows[-1]["status"] == "OOM"  # cells without the number sort last
    md = ts.sweep("results", ts.name, "--format", "markdown", "--filter", "outcome=oom").stdout
    table = [line for line in md.splitlines() if line.startswith("|")]
    assert table[0].startswith("| task | gpu | batch |") and len(table) == 3  # header, rule, the OOM cell
    assert md.startswith("## Sweep ") and "Marks beside a number" in md  # the answer's heading, the legend
    bad = ts.sweep("results", ts.name, "--filter", "colour=red", check=2)
    assert "unknown key 'colour'" in bad.stderr


def test_report_written_and_logged_to_the_parent_run(tracked_sweep: TrackedSweep, tmp_path: Path) -> None:
    ts = tracked_sweep
    out = tmp_path / "report"
    proc = ts.sweep("report", ts.name, "--output", str(out))
    assert "logged as artifacts report/" in proc.stdout
    figures = ["throughput.png", "compile_speedup.png", "peak_memory.png", "time_to_accuracy.png",
               "cost_per_epoch.png", "heatmap.png"]
    for name in figures:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    html = (out / "report.html").read_text()
    assert "Time for 2 epochs of glue/sst2 at batch 16 per GPU" in html
    assert "Inference latency: CPU vs GPU, fp16 vs fp32" in html and "One GPU vs DDP" in html
    summary = json.loads((out / "summary.json").read_text())
    tables = {t["title"]: t for t in summary["tables"]}
    files = ts.results_files().values()

    # time for 2 epochs at batch 16, per GPU: epoch time x 2 from the results files
    epochs = tables["Time for 2 epochs of glue/sst2 at batch 16 per GPU"]
    rows = {(r[0], r[2]): r for r in epochs["rows"]}
    assert {gpu for gpu, _ in rows} == {"h100-80gb", "l40s", "v100-32gb"}
    for (gpu, compiled), row in rows.items():
        runs = [r for r in files if r["trial"]["gpu"] == gpu and r["config"]["batch_size"] == 16
                and r["trial"]["gpus_per_trial"] == 1 and r["config"]["task"] == "finetune"
                and ("off" if not r["config"]["compile"] else r["config"]["compile"]) == compiled]
        if gpu == "v100-32gb":
            assert row[4] == "GPU mismatch"
            continue
        minutes = statistics.fmean((r["timings"]["train_s"] - r["train"]["warmup_time_s"])  # the warm-up apart
                                   / r["train"]["epochs_completed"] for r in runs) * 2 / 60
        assert float(row[4].replace(",", "")) == pytest.approx(minutes, rel=5e-3)

    # inference: CPU first, speed-up = CPU p50 / p50 on the GPU's rows (none of the CPU against itself)
    inference = tables["Inference latency: CPU vs GPU, fp16 vs fp32"]["rows"]
    assert [(r[0], r[1]) for r in inference] == [("CPU", "fp32"), ("h100-80gb", "fp16"), ("h100-80gb", "fp32")]
    p50 = {(r["trial"]["gpu"] or "CPU", r["config"]["precision"]): [] for r in files if r.get("inference")}
    for r in files:
        if r.get("inference"):
            p50[(r["trial"]["gpu"] or "CPU", r["config"]["precision"])].append(r["inference"]["latency_s"]["p50"])
    cpu = statistics.fmean(p50[("CPU", "fp32")])
    speedup = tables["Inference latency: CPU vs GPU, fp16 vs fp32"]["headers"].index("speed-up vs CPU")
    assert inference[0][speedup] == "-"
    for row in inference[1:]:
        assert row[speedup] == f"{cpu / statistics.fmean(p50[(row[0], row[1])]):.1f}x"

    # DDP: two rows for h100 bs16, scaling efficiency from the files
    ddp = tables["One GPU vs DDP"]["rows"]
    assert [(r[1], r[2]) for r in ddp] == [("1", "single GPU"), ("2", "DDP x2")]
    rate = {n: statistics.fmean(r["train"]["samples_per_s"] for r in files if r.get("train")
                                and r["trial"]["gpu"] == "h100-80gb" and r["config"]["batch_size"] == 16
                                and not r["config"]["compile"] and r["trial"]["gpus_per_trial"] == n) for n in (1, 2)}
    assert ddp[1][7] == f"{rate[2] / (2 * rate[1]) * 100:.0f}%"

    # the same files are artifacts of the parent run
    parent = parents(ts)[0].info.run_id
    logged = {Path(a.path).name for a in client(ts).list_artifacts(parent, "report")}
    assert {"report.html", "summary.json", *figures} <= logged


def test_resubmit_and_resume_make_no_duplicate_runs(tracked_sweep: TrackedSweep) -> None:
    ts = tracked_sweep
    parent = parents(ts)[0].info.run_id
    before = {k.data.tags["kubesweep.trial_id"]: k.info.run_id for k in children(ts, parent)}
    again = ts.sweep("submit", str(ts.spec))
    assert f"parent run {parent} (found)" in again.stdout
    # a trial whose results file went missing is run again by resume: into the same child run
    victim = next(d for d in ts.trial_dirs() if "bs64" in d.name)
    (victim / "results.json").unlink()
    starts = (ts.home / "sweeps" / ts.name / "starts.log").read_text().count("\n")
    ts.sweep("resume", ts.name)
    assert (ts.home / "sweeps" / ts.name / "starts.log").read_text().count("\n") == starts + 1
    assert (victim / "results.json").exists()
    assert [p.info.run_id for p in parents(ts)] == [parent]
    after = {k.data.tags["kubesweep.trial_id"]: k.info.run_id for k in children(ts, parent)}
    assert after == before


def test_results_from_mlflow_through_the_backends_record_of_the_parent_run(tracked_sweep: TrackedSweep) -> None:
    """Where the sweep's experiment is not the name `sweep results` asks for (the operator's, on a server with a
    user per namespace, is `<namespace>/<experiment>`), the backend's record of the sweep's parent run finds its
    runs in MLflow all the same."""
    ts = tracked_sweep
    proc = ts.sweep("results", ts.name, "--format", "json", "--from", "mlflow", "--experiment", "team-a/elsewhere")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    parent = parents(ts)[0].info.run_id
    assert out["source"] == f"MLflow {ts.server.url}, parent run {parent} (the local backend's record)", out["source"]
    assert len(out["cells"]) == SWEEP_CELLS


class _OperatorRecord:
    """Stands for the operator's Sweep client (`kubesweep.operator.client.SweepClient`; its cluster tests run the
    real one): the operator opens the sweep's parent run and keeps its record. Only what `load_records` reads."""

    name = "kubernetes"
    opens_parent_run = True
    keeps_results = False
    results = Backend.results  # the contract's defaults: each trial without a file, none on this machine
    trial_dir = Backend.trial_dir

    def __init__(self, parent: str | None) -> None:
        self.parent = parent

    def parent_run_id(self, sweep: str) -> str | None:
        return self.parent

    def status(self, sweep: str) -> Any:
        return SweepStatus(sweep, self.name, [])


def test_the_operators_record_of_the_parent_run_decides_and_an_older_run_made_with_its_tags_never_does(
        tracked_sweep: TrackedSweep) -> None:
    """Where the operator owns a sweep's parent run, `sweep results` reads the runs under the run it recorded, never
    a run found by its tags: an older run with the sweep's name and the parent's role in the same experiment (a
    second parent opened by a client, or one made by anyone who may write to the experiment) takes nothing over."""
    ts = tracked_sweep
    (parent,) = [p.info.run_id for p in parents(ts)]
    c = client(ts)
    experiment = c.get_experiment_by_name(EXPERIMENT)
    decoy = c.create_run(experiment.experiment_id, start_time=1, run_name=ts.name,
                         tags={"kubesweep.sweep": ts.name, "kubesweep.role": "parent"}).info.run_id
    try:
        target = TrackingTarget(ts.server.url, EXPERIMENT, "flag")
        assert load_records(target, ts.name, None).parent_run_id == decoy  # found by its tags: the oldest
        loaded = load_records(target, ts.name, _OperatorRecord(parent))  # type: ignore[arg-type]
        assert loaded.parent_run_id == parent, loaded.source
        assert loaded.source == f"MLflow {ts.server.url}, parent run {parent} (the kubernetes backend's record)"
        assert len(loaded.records) == SWEEP_TRIALS
        assert len(aggregate(loaded.records, target=0.9)) == SWEEP_CELLS
        # no record yet (or one this server does not hold): the run found by its tags is still not the sweep's
        unrecorded = load_records(target, ts.name, _OperatorRecord(None))  # type: ignore[arg-type]
        assert unrecorded.parent_run_id is None and unrecorded.records == []
        assert "the kubernetes backend records no MLflow parent run for sweep 'tracked'" in unrecorded.note
        # a record this server does not give: the note says which run and the server's own words, and that the
        # backend's files hold outcomes, not figures (a table of dashes is explained)
        elsewhere = load_records(target, ts.name, _OperatorRecord("0" * 32))  # type: ignore[arg-type]
        assert elsewhere.records == [] and f"parent run {'0' * 32} for sweep 'tracked'" in elsewhere.note
        assert f"which {ts.server.url} does not give (MLflow at {ts.server.url}: cannot read the parent run:" \
            in elsewhere.note
        assert "keeps trials' outcomes, not their figures" in elsewhere.note
    finally:
        c.delete_run(decoy)


def test_a_server_that_does_not_answer_is_said_so_not_read_as_a_sweep_without_figures() -> None:
    """The operator's record names the parent run; the server is away (restarting, a port-forward gone): no table
    of dashes from the backend's outcomes, but what happened and what to do, in one line."""
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    target = TrackingTarget(url, EXPERIMENT, "flag")
    with pytest.raises(ServerAway) as info:
        load_records(target, "tracked", _OperatorRecord("a" * 32))  # type: ignore[arg-type]
    message = str(info.value)
    assert message.startswith(f"MLflow at {url}: cannot read the parent run: the server did not answer: "), message
    assert (f"the figures of sweep 'tracked' are in its MLflow runs (parent run {'a' * 32}): run this again once "
            "the server answers (`sweep status tracked` shows the trials' outcomes meanwhile)") in message
    assert "\n" not in message


class _NoFilesBackend:
    """Stands for a backend that keeps no results files on this machine (the Kubernetes ones: their cluster tests
    run the real thing); only what `load_records` reads of it."""

    name = "kubernetes"
    opens_parent_run = False
    keeps_results = False

    def status(self, sweep: str) -> Any:
        return SweepStatus(sweep, self.name, [TrialStatus("t1", f"{sweep}-t1", "cell", None, Phase.SUCCEEDED)])

    results = Backend.results  # the contract's defaults: each trial without a file, no parent run recorded
    parent_run_id = Backend.parent_run_id

    def trial_dir(self, sweep: str, trial: str) -> None:
        return None


def test_a_backend_without_results_files_and_tracking_off_says_it_has_no_figures() -> None:
    off = TrackingTarget(None, "s", "off", off_reason="tracking is off (--no-tracking)")
    loaded = load_records(off, "s", _NoFilesBackend(), source="auto")  # type: ignore[arg-type]
    assert [r.name for r in loaded.records] == ["s-t1"] and loaded.records[0].results is None
    assert "the kubernetes backend keeps no results files on this machine: trials' outcomes only, no figures" in (
        loaded.note)
    assert "--tracking-uri URI" in loaded.note


def test_a_gpu_name_a_trial_reports_cannot_shape_the_answers_tag_keys() -> None:
    """The GPU type of a trial that took any GPU is what its own results say NVML reported: a trial's code can
    write anything there. It reaches the parent run's tag keys only as letters, digits, `_` and `-`."""
    evil = "../../x\nkubesweep.role=parent; " + "A" * 300
    records = [TrialRecord(f"t{i}", f"t{i}", i, None, 1, "succeeded", JobConfig(batch_size=16),
                           make_results(**trial_parts(1000.0 + i), environment={"gpus": [{"product": evil}]}))
               for i in range(2)]
    keys = list(answer_tags(aggregate(records), 0.9))
    assert keys and all(re.fullmatch(r"kubesweep\.best\.finetune\.[A-Za-z0-9_-]{1,64}\.[a-z_0-9]+", k) for k in keys)


def test_the_table_after_a_cluster_sweep_ends_holds_its_figures_from_mlflow(tracked_sweep: TrackedSweep) -> None:
    """A Kubernetes backend keeps no results files here: the table `sweep submit` prints once the sweep has ended
    reads the trials' MLflow runs, as `sweep results` does, rather than showing every figure as `-`."""
    from rich.console import Console

    from kubesweep.cli import views
    from kubesweep.session import Options, Session

    ts = tracked_sweep
    s = Session(Options(backend="kubernetes", tracking_uri=ts.server.url))
    s._backend = _NoFilesBackend()  # type: ignore[assignment]
    s.target = TrackingTarget(ts.server.url, EXPERIMENT, "flag")
    loaded = s.ended_records(ts.name)
    assert loaded.source.startswith(f"MLflow {ts.server.url}, experiment {EXPERIMENT!r}"), loaded.source
    console = Console(record=True, width=200)
    views.print_ended(console, s.backend, ts.name, 0.9, loaded)
    text = console.export_text()
    assert f"from MLflow {ts.server.url}" in " ".join(text.split()) and "no figures for" not in text, text
    expected = expected_cells(ts)
    for cell in aggregate(loaded.records, target=0.9):
        a = cell.axes
        want = expected[(cell.task, a.gpu, a.gpus, a.batch_size, a.precision, a.compile)]
        got = cell.metrics["samples_per_s"]
        assert got.n == len(want.get("samples_per_s", [])) and (
            got.mean == pytest.approx(statistics.fmean(want["samples_per_s"])) if got.n else got.mean is None)
    # tracking off: outcomes only, and the note says why
    s.target = TrackingTarget(None, EXPERIMENT, "off", off_reason="tracking is off")
    off = s.ended_records(ts.name)
    assert off.records[0].results is None and "keeps no results files on this machine" in off.note
