"""The report's answer, figures and flags, built from trial records in process (no MLflow): the stand-in job's
results (tests/support/tracked_job.py) for a GPU matrix and for a CPU sweep like `sweeps/smoke.yaml`. What the
page looks like in a browser is tests/tracking/test_report_browser.py."""

from __future__ import annotations

import datetime as dt
import html
import json
import re
import struct
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from kubesweep.gpus import load_catalog
from kubesweep.plan import plan
from kubesweep.sweep_spec import parse_sweep_text
from kubesweep.tracking import figures as figs
from kubesweep.tracking.aggregate import aggregate
from kubesweep.tracking.records import TrialRecord
from kubesweep.tracking.report import build
from kubesweep.tracking.report_answer import gpu_lines, precision_lines
from kubesweep.tracking.report_page import ANCHORS
from kubesweep.wire.results import Results
from tests.support.mlflow_fixtures import SWEEP_SPEC
from tests.support.results_docs import monitor
from tests.support.tracked_job import build as stand_in
from tests.tracking.test_aggregate import record

CPU_SPEC = """\
apiVersion: kubesweep.io/v1alpha1
kind: Sweep
metadata: {name: cpu}
spec:
  job: {epochs: 1, train_samples: 384}
  matrix: {batch_size: [16, 32], precision: [fp32, bf16]}
  resources: {gpus_per_trial: 0}
"""


def records(spec: str, edit: Any = None) -> list[TrialRecord]:
    """A record per planned trial with the stand-in's results (`edit(trial, results)` may change them)."""
    out = []
    for trial in plan(parse_sweep_text(spec)).trials:
        results, _ = stand_in(trial.config, "2026-01-01T00:00:00+00:00")
        if edit is not None:
            edit(trial, results)
        read = Results.model_validate(results)
        out.append(TrialRecord(trial.id, trial.name, trial.repeat, trial.gpu, trial.gpus_per_trial,
                               results["outcome"], read.config, read))
    return out


def report(tmp_path: Path, recs: list[TrialRecord], target: float = 0.90) -> tuple[Any, str, dict[str, Any]]:
    built = build(aggregate(recs, target=target), tmp_path / "report", sweep="s", source="test", target=target,
                  best_by="samples_per_s")
    summary = json.loads((built.directory / "summary.json").read_text())
    return built, built.html_path.read_text(), summary


def test_the_report_opens_with_the_best_setting_per_gpu_type(tmp_path: Path) -> None:
    recs = records(SWEEP_SPEC)
    built, page, summary = report(tmp_path, recs, target=0.85)
    headings = re.findall(r"<h2[^>]*>(.*?)</h2>", page)
    assert headings == ["The answer", "Comparison tables", "Figures", "All results", "Definitions"]
    assert page.count("All results") == 1
    # best throughput per GPU type for fine-tuning: the highest mean samples/s among its single-node cells,
    # computed here from the records
    rates: dict[tuple[str, str], list[float]] = {}
    for r in recs:
        if r.outcome == "succeeded" and r.job.task == "finetune":
            setting = (r.gpu or "cpu", f"{'x2 GPUs ' if r.gpus > 1 else ''}bs{r.job.batch_size}")
            assert r.results is not None and r.results.train is not None
            rates.setdefault(setting, []).append(r.results.train.samples_per_s)
    best = {b["gpu"]: b for b in summary["best"] if b["task"] == "finetune" and b["metric"] == "samples_per_s"}
    for gpu in ("h100-80gb", "l40s"):
        mine = {s: sum(v) / len(v) for (g, s), v in rates.items() if g == gpu}
        top = max(mine, key=lambda s: mine[s])
        assert best[gpu]["setting"].startswith(top + " "), (best[gpu], top)
        assert best[gpu]["stat"]["mean"] == mine[top]
        assert best[gpu]["stat"]["n"] == 2
    # the V100 cells all ran on another GPU: no best, and the reason
    assert best["v100-32gb"]["setting"] is None and best["v100-32gb"]["none"] == "no trial succeeded"
    # the answer across GPU types names the fastest setting with its spread and n
    fastest = max(((g, s) for g, s in rates), key=lambda k: sum(rates[k]) / len(rates[k]))
    line = next(a for a in summary["answer"] if a.startswith("fine-tuning, highest throughput"))
    assert f": {fastest[0]} {fastest[1]} " in line and "(n=2" in line and "±" in line
    assert len(built.figures) == 6 and built.skipped == [  # the stand-in's trials take no time, meter no energy
        "energy_per_epoch.png: not drawn: " + NO_ENERGY,
        "gpu_timeline.png: not drawn: the sweep has no GPU trials with results"]


def test_a_cpu_sweep_draws_every_figure_it_has_data_for(tmp_path: Path) -> None:
    def on_cpu(trial: Any, results: dict[str, Any]) -> None:  # what the job records without a GPU
        results["memory"] = {"torch_peak_allocated_bytes": None, "host_peak_rss_bytes": 3 * 1024**3}

    built, page, summary = report(tmp_path, records(CPU_SPEC, on_cpu))
    assert [name for name, _ in built.figures] == ["throughput.png", "peak_memory.png", "heatmap.png"]
    assert built.skipped == [
        "compile_speedup.png: not drawn: every trial ran eager (add a compile axis to compare)",
        "time_to_accuracy.png: not drawn: no trial reached 0.9 dev accuracy (best 0.860)",
        "cost_per_epoch.png: not drawn: no price: CPU trials",
        "energy_per_epoch.png: not drawn: " + NO_ENERGY,
        "gpu_timeline.png: not drawn: the sweep has no GPU trials with results"]
    cpu = {b["metric"]: b for b in summary["best"] if b["gpu"] == "cpu"}
    assert cpu["samples_per_s"]["setting"] == "bs32 bf16 eager"
    assert cpu["tta_train_s"]["none"] == "no trial reached 0.9 dev accuracy (best 0.860)"
    peaks = {c["batch_size"]: c["metrics"]["peak_mem_gib"]["mean"] for c in summary["cells"]}
    assert set(peaks.values()) == {3.0}  # the process's peak RSS stands in for the allocator's
    assert "n=1" in page  # one repeat: flagged
    # what the sweep has nothing for is left out of the page's flow, said once, folded, at its end
    main, left_out = page.split("<details", 1)
    assert "not drawn" not in main and "skipped" not in main.split("<h2>All results</h2>")[0]
    assert "no trial reached 0.9" not in main.split("<h2>All results</h2>")[0]  # not measured: not an answer line
    assert "<h2>Comparison tables</h2>" not in main  # none drawn: no heading for them
    for gap in (*built.skipped, *built.table_notes, *built.unanswered):
        assert html.escape(gap) in left_out
    assert ("fine-tuning, soonest to the target accuracy (training time, warm-up apart): no trial reached 0.9"
            in " ".join(summary["unanswered"]))


def test_the_epochs_table_counts_its_epochs_in_words(tmp_path: Path) -> None:
    _, page, _ = report(tmp_path / "two", records(SWEEP_SPEC))
    assert "<h3>Time for 2 epochs of glue/sst2 at batch 16 per GPU</h3>" in page and "<th>min for 2 epochs</th>" in page
    _, page, _ = report(tmp_path / "one", records(SWEEP_SPEC.replace("epochs: 2", "epochs: 1")))
    assert "<h3>Time for 1 epoch of glue/sst2 at batch 16 per GPU</h3>" in page and "<th>$ for 1 epoch</th>" in page


def test_flags_sit_beside_the_numbers(tmp_path: Path) -> None:
    def chance(trial: Any, results: dict[str, Any]) -> None:
        if trial.gpu == "l40s" and trial.config.job.batch_size == 64 and trial.repeat == 1:
            results["final_accuracy"] = 0.5
            results["eval"][-1]["accuracy"] = 0.5

    _, page, summary = report(tmp_path, records(SWEEP_SPEC, chance))
    flags = {(c["gpu"], c["batch_size"], c["gpus"], c["compile"], c["task"]): c["flags"] for c in summary["cells"]}
    assert flags[("l40s", 64, 1, "off", "finetune")] == ["1/2 chance accuracy (0.50)"]
    assert flags[("h100-80gb", 256, 1, "off", "finetune")] == ["OOM"]
    assert flags[("v100-32gb", 16, 1, "off", "finetune")] == ["GPU mismatch"]
    assert flags[("l40s", 16, 1, "off", "finetune")] == []
    assert "1/2 chance accuracy (0.50)" in page and "GPU mismatch" in page


NO_ENERGY = "no trial measured its GPU energy (no NVML energy counter: CPU trials, or GPUs before Volta)"


def marked(trial: Any, results: dict[str, Any]) -> None:
    """SWEEP_SPEC's cells as they come (an OOM at h100 bs256, a GPU mismatch on the V100), and: h100 bs16 eager
    fine-tuning stays at chance on one GPU and on two; one of the two repeats of h100 fp16 inference runs out of
    memory."""
    job = trial.config.job
    if trial.gpu == "h100-80gb" and job.task == "finetune" and job.batch_size == 16 and not job.compile:
        results["final_accuracy"] = results["eval"][-1]["accuracy"] = 0.509
    if trial.gpu == "h100-80gb" and job.task == "inference" and job.precision == "fp16" and trial.repeat == 1:
        results.update(outcome="oom", exit_code=3, error={"type": "OutOfMemoryError", "message": "stand-in"})
        del results["inference"], results["memory"]


class Tables(HTMLParser):
    """Every <table> of a page: its headers and rows, and whether each row is tinted as flagged."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tables: list[dict[str, Any]] = []
        self.cell: list[str] | None = None
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append({"headers": [], "rows": [], "flagged": []})
        elif tag == "tr" and self.tables and self.tables[-1]["headers"]:
            self.tables[-1]["rows"].append([])
            self.tables[-1]["flagged"].append(("class", "flagged") in attrs)
        elif tag in ("th", "td"):
            self.cell = []

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("th", "td") and self.cell is not None:
            table = self.tables[-1]
            (table["headers"] if tag == "th" else table["rows"][-1]).append("".join(self.cell))
            self.cell = None


def test_every_table_row_marks_chance_accuracy_oom_and_gpu_mismatch(tmp_path: Path) -> None:
    _, page, _ = report(tmp_path, records(SWEEP_SPEC, marked))
    tables = Tables(page).tables
    # best per GPU type, GPU types, epochs at batch 16, compile break-even, inference latency, DDP, all results
    assert len(tables) == 7
    chance, oom, half_oom, mismatch = "chance accuracy (0.51)", "OOM", "1/2 OOM", "GPU mismatch"
    seen: dict[str, int] = {}
    for table in tables:
        head = table["headers"]
        assert "flags" in head, head
        for row, flagged in zip(table["rows"], table["flagged"], strict=True):
            values = dict(zip(head, row, strict=True))
            gpu = values.get("GPU", values.get("gpu", values.get("device")))
            setting = values.get("setting", "")  # the best table: `bs64 fp16 eager`
            if setting and setting != "-":
                values.update(batch=setting.split()[0][2:], precision=setting.split()[1],
                              compile="off" if " eager" in setting else "on")
            batch = values.get("batch", "16")
            compiled = values.get("compile", "off")
            task = values.get("task", "inference" if "p50 ms" in head else "finetune")
            want: list[str] = []
            if setting == "-":
                want = []  # the best table's rows without a setting
            elif gpu == "h100-80gb" and task == "finetune" and batch == "16" and compiled == "off":
                want = [chance]
            elif gpu == "h100-80gb" and batch == "256":
                want = [oom]
            elif gpu == "v100-32gb":
                want = [mismatch]
            elif gpu == "h100-80gb" and task == "inference" and values.get("precision") == "fp16":
                want = [half_oom]
            flags = values["flags"].split("; ")
            marks = [f for f in flags if f in (chance, oom, half_oom, mismatch)]
            assert marks == want, (head, row)
            assert flagged == bool(want), row  # the row is tinted
            for mark in marks:
                seen[mark] = seen.get(mark, 0) + 1
            if marks == [chance] and "accuracy" in values:
                assert values["accuracy"].startswith("0.5090")  # beside the number
    # the chance cells: in the epochs table (one GPU), the DDP table (two rows) and the full table (two rows);
    # the half-OOM inference cell, the fastest and quickest: twice in the best table, then the inference and full
    assert seen == {chance: 5, oom: 1, mismatch: 2, half_oom: 4}, seen


def test_the_figures_fill_the_page_and_are_drawn_sharp(tmp_path: Path) -> None:
    built, page, _ = report(tmp_path, records(CPU_SPEC))
    css = page[page.index("<style>"):page.index("</style>")]
    assert re.search(r"figure img\{[^}]*width:100%", css) and re.search(r"figure img\{[^}]*max-width:1400px", css)
    assert re.search(r"figure img\{[^}]*height:auto", css)
    for name, _ in built.figures:  # drawn at least as wide as the page shows them: sharp at full width
        width = struct.unpack(">I", (built.directory / name).read_bytes()[16:20])[0]
        assert width >= 1800, (name, width)


def test_definitions_are_links_and_the_marks_have_a_legend(tmp_path: Path) -> None:
    _, page, _ = report(tmp_path, records(SWEEP_SPEC, marked))
    assert "Definitions: docs/tracking.md" not in page
    assert "<a href='#definitions'>every number</a>" in page and "<a href='#marks'>the marks</a>" in page
    ids = set(re.findall(r" id='([^']+)'", page))
    assert {"definitions", "marks"} <= ids
    links = set(re.findall(r"<a href='#([^']+)'>", page))
    assert links <= ids and set(ANCHORS.values()) <= ids  # every link lands
    assert "<th><a href='#def-samples-per-s'>samples/s</a></th>" in page
    assert "<th><a href='#marks'>flags</a></th>" in page
    legend = dict(re.findall(r"<dt id='mark-[^']+'>(.*?)</dt><dd>(.*?)</dd>", page))
    assert {"*", "OOM", "GPU mismatch", "chance accuracy (0.51)"} <= set(legend)
    assert "at most 0.55" in legend["chance accuracy (0.51)"]
    top = page[:page.index("<h2>The answer</h2>")]
    assert "class='legend'" in top and "chance accuracy (0.51)" in top  # the legend before the first number


def test_the_answer_passes_over_settings_whose_training_stayed_at_chance(tmp_path: Path) -> None:
    def bs32_at_chance(trial: Any, results: dict[str, Any]) -> None:  # the fastest settings did not learn
        if trial.config.job.batch_size == 32:
            results["final_accuracy"] = results["eval"][-1]["accuracy"] = 0.509

    _, page, summary = report(tmp_path, records(CPU_SPEC, bs32_at_chance))
    best = {b["metric"]: b for b in summary["best"]}
    assert best["samples_per_s"]["setting"] == "bs16 bf16 eager"  # bs32 bf16 is faster, and at chance
    assert [c["batch_size"] for c in summary["cells"] if c["best"]] == [16]
    assert "chance accuracy (0.51)" in page

    def all_at_chance(trial: Any, results: dict[str, Any]) -> None:
        results["final_accuracy"] = results["eval"][-1]["accuracy"] = 0.509

    _, page, summary = report(tmp_path / "all", records(CPU_SPEC, all_at_chance))
    best = {b["metric"]: b for b in summary["best"]}
    assert best["samples_per_s"]["setting"] is None
    assert best["samples_per_s"]["none"] == "no setting learned: each has a repeat at chance accuracy"
    assert "fine-tuning, highest throughput: no setting learned: each has a repeat at chance accuracy." in (
        summary["answer"])
    assert not any(c["best"] for c in summary["cells"])


def test_the_report_says_how_busy_the_gpu_was_and_draws_where_the_time_went(tmp_path: Path) -> None:
    """Four one-GPU trials started early, one behind the other: their GPU spans, measured training and the
    fraction `sweep results` and the report print (measured training over the sweep's wall time)."""
    spans = {0: (0.0, 10.0, 40.0), 1: (5.0, 40.0, 70.0), 2: (30.0, 70.0, 95.0), 3: (60.0, 95.0, 120.0)}
    seen: list[Any] = []

    def timed(trial: Any, results: dict[str, Any]) -> None:
        i = len(seen)
        seen.append(trial)
        start, acquired, released = (1_700_000_000.0 + t for t in spans[i])
        results["started_at"] = dt.datetime.fromtimestamp(start + 2.0, dt.UTC).isoformat()
        results["finished_at"] = dt.datetime.fromtimestamp(released + 1.0, dt.UTC).isoformat()
        results["device"] = "cuda"
        results["timings"]["startup_s"] = 2.0
        results["train"]["measured_time_s"] = 20.0
        results["gpu_lease"] = {"path": "/home/gpus/gpu-0.lock", "acquired_at": acquired, "released_at": released}
        results["environment"] = {"node_name": "n1", "gpus": [{"uuid": "GPU-1", "product": "NVIDIA-H100-80GB-HBM3"}]}

    spec = SWEEP_SPEC_ONE_GPU
    built, page, summary = report(tmp_path, records(spec, timed))
    busy = summary["gpu_busy"]
    assert busy["trials"] == 4 and busy["gpus"] == 1
    assert busy["wall_s"] == 121.0 and busy["measured_train_s"] == 80.0  # first start to last results file
    assert busy["fraction"] == 80.0 / 121.0
    assert "GPU busy 66.1%: 80.0 s of measured training in 121.0 s of sweep wall" in page
    assert "gpu_timeline.png" in [name for name, _ in built.figures]
    assert {c["gpu"] for c in summary["cells"]} == {"h100-80gb"}  # the GPU it ran on, though it asked for any


SWEEP_SPEC_ONE_GPU = """\
apiVersion: kubesweep.io/v1alpha1
kind: Sweep
metadata: {name: busy}
spec:
  job: {epochs: 1}
  matrix: {batch_size: [16, 32], precision: [fp32, bf16]}
  resources: {gpus_per_trial: 1}
"""


# -- ties and GPU types compared ----------------------------------------------------------------------------------

GPU_SPEC = """\
apiVersion: kubesweep.io/v1alpha1
kind: Sweep
metadata: {name: two-gpus}
spec:
  job: {epochs: 1}
  matrix: {gpu: [h100-80gb, l40s], batch_size: [16, 32], precision: [bf16]}
  repeats: 3
"""


def test_the_answer_compares_gpu_types_at_their_best_settings_and_names_ties(tmp_path: Path) -> None:
    _, _, summary = report(tmp_path, records(GPU_SPEC))
    answer = summary["answer"]
    # the stand-in's H100 runs at 1,000 samples/s x (batch/16)^0.3 x 1.8, the L40S at 600 x the same: 1.67x
    line = next(a for a in answer if a.startswith("GPU types, fine-tuning, highest throughput"))
    assert "h100-80gb is 1.67x l40s at their best settings" in line, line
    # batch 16 and 32 on one GPU differ by 23%, their repeats by 4%: not tied; the best is named alone
    [best] = [a for a in answer if a.startswith("fine-tuning, highest throughput: h100-80gb bs32 bf16 eager: ")]
    assert "; 1.23x the next best, h100-80gb bs16 bf16 eager (" in best, best  # by how much, over whom

    def close(trial: Any, results: dict[str, Any]) -> None:  # batch 16 within a hair of batch 32 on the H100
        if trial.gpu == "h100-80gb" and trial.config.job.batch_size == 16:
            results["train"]["samples_per_s"] *= 2 ** 0.3 * 0.995

    _, _, summary = report(tmp_path, records(GPU_SPEC, close))
    line = next(a for a in summary["answer"] if a.startswith("fine-tuning, highest throughput"))
    assert line.startswith("fine-tuning, highest throughput: 2 settings tied (95% intervals overlap): "), line
    assert "h100-80gb bs32 bf16 eager" in line and "h100-80gb bs16 bf16 eager" in line


def test_gpu_types_are_compared_only_on_settings_that_measured_the_gpu(tmp_path: Path) -> None:
    def idle(gpu: str, batches: tuple[int, ...]) -> Any:
        def hook(trial: Any, results: dict[str, Any]) -> None:  # the GPU ran kernels 30% of its measured steps
            if trial.gpu == gpu and trial.config.job.batch_size in batches:
                results["gpu_monitor"] = monitor(30.0)
        return hook

    _, _, summary = report(tmp_path, records(GPU_SPEC, idle("l40s", (16, 32))))
    answer = summary["answer"]
    assert not any(a.startswith("GPU types, fine-tuning, highest throughput") for a in answer), answer
    (line,) = [a for a in answer if a.startswith("GPU types, fine-tuning: ")]
    assert "l40s not compared: every setting of it measured the host, not the GPU (host-bound)" in line, line
    assert "num_workers" in line and "step_graph" in line  # what to change

    _, _, summary = report(tmp_path, records(GPU_SPEC, idle("h100-80gb", (32,))))
    answer = summary["answer"]
    assert "GPU types, fine-tuning: compared on the settings that measured the GPU; 1 host-bound setting left out " \
           "of the comparison." in answer
    line = next(a for a in answer if a.startswith("GPU types, fine-tuning, highest throughput"))
    # the H100's bs32 (1.67x the L40S's best) measured its host: the H100 is compared at bs16
    assert "h100-80gb is 1.35x l40s at their best settings" in line, line


def test_a_host_bound_runner_up_is_named_so_beside_the_best(tmp_path: Path) -> None:
    """The best setting's margin over a runner-up that measured its host says so: the ratio is to the host's
    figure, not the GPU's."""
    def idle(trial: Any, results: dict[str, Any]) -> None:  # the H100's bs16 kept its GPU busy 30% of its steps
        if trial.gpu == "h100-80gb" and trial.config.job.batch_size == 16:
            results["gpu_monitor"] = monitor(30.0)

    _, _, summary = report(tmp_path, records(GPU_SPEC, idle))
    [best] = [a for a in summary["answer"] if a.startswith("fine-tuning, highest throughput: h100-80gb bs32")]
    assert re.search(r"; 1\.23x the next best, h100-80gb bs16 bf16 eager \([0-9,]+ samples/s ±[0-9.]+%; host-bound\)",
                     best), best
    _, _, summary = report(tmp_path, records(GPU_SPEC))
    [best] = [a for a in summary["answer"] if a.startswith("fine-tuning, highest throughput: h100-80gb bs32")]
    assert "host-bound" not in best, best


def test_the_gpu_table_and_the_compile_break_even_table(tmp_path: Path) -> None:
    spec = GPU_SPEC.replace("precision: [bf16]}", "precision: [bf16], compile: [false, true]}")
    _, page, summary = report(tmp_path, records(spec))
    tables = {t["title"]: t for t in summary["tables"]}
    gpus = tables["GPU types at their best setting"]
    assert [row[1] for row in gpus["rows"]] == ["h100-80gb", "l40s"]
    assert all(row[2] == "bs32 bf16 compile=default" for row in gpus["rows"])  # compiled: 1.25x in the stand-in
    breakeven = tables["torch.compile break-even"]
    assert len(breakeven["rows"]) == 4  # 2 GPU types x 2 batches, each compiled against its eager twin
    assert "torch.compile break-even" in page


def test_the_answer_names_settings_noisier_than_three_percent(tmp_path: Path) -> None:
    def steady(trial: Any, results: dict[str, Any]) -> None:  # the stand-in's repeats differ by 4%: not here
        results["train"]["samples_per_s"] /= 1.0 + 0.04 * (trial.repeat - 0.5)

    def noisy(trial: Any, results: dict[str, Any]) -> None:  # the L40S batch 16's repeats 20% apart
        steady(trial, results)
        if trial.gpu == "l40s" and trial.config.job.batch_size == 16:
            results["train"]["samples_per_s"] *= 1.0 + 0.2 * trial.repeat

    _, _, summary = report(tmp_path, records(GPU_SPEC, noisy))
    [line] = [a for a in summary["answer"] if a.startswith("Noisier than ±3%")]
    assert "l40s bs16 bf16 eager (finetune) ±" in line and "repeats " in line and "h100" not in line, line
    _, _, quiet = report(tmp_path, records(GPU_SPEC, steady))
    assert not any(a.startswith("Noisier") for a in quiet["answer"])


def test_queued_trials_show_their_wait_per_gpu_type(tmp_path: Path) -> None:
    def queued(trial: Any, results: dict[str, Any]) -> None:  # H100s wait 100-300 s for admission, L40S 10 s
        results["timings"]["queue_wait_s"] = 100.0 * (trial.repeat + 1) if trial.gpu == "h100-80gb" else 10.0

    _, page, summary = report(tmp_path, records(GPU_SPEC, queued))
    assert "time to get a GPU (queue wait)" in page
    [table] = [t for t in summary["tables"] if t["title"] == "time to get a GPU (queue wait)"]
    rows = {row[0]: row for row in table["rows"]}
    # 100, 200 and 300 s, twice: mean 200, 2.571 (t, 5 df) x sd 89.4 / sqrt(6) = 93.9: ±47%
    assert rows["h100-80gb"][1:] == ["200.0 ±47%", "200.0", "300.0", "6"]
    assert rows["l40s"][1:] == ["10.00 ±0%", "10.00", "10.00", "6"]
    _, _, unqueued = report(tmp_path, records(GPU_SPEC))
    assert "time to get a GPU (queue wait)" not in {t["title"] for t in unqueued["tables"]}


def test_names_with_mathtext_are_drawn_as_literal_text(tmp_path: Path) -> None:
    """A GPU name from a results file with `$...$` in it is text in the figures, not mathtext (a bad expression
    would stop the report; a good one would show something other than the name)."""
    recs = records(CPU_SPEC)
    for r in recs:
        r.gpu = r"$\notacommand{x^2}$"
        r.gpus = 1
    built, page, _ = report(tmp_path, recs)
    assert "throughput.png" in [name for name, _ in built.figures]
    assert r"$\notacommand{x^2}$" in html.unescape(page)
    cells = aggregate(recs, target=0.9)
    fig = figs.per_gpu_lines(cells, "samples_per_s", "samples/s", "t")
    texts = [t.get_text() for ax in fig.axes for t in ax.findobj(lambda o: hasattr(o, "get_text"))]
    assert any(r"$\notacommand{x^2}$" in t for t in texts), texts
    figs.save(fig, tmp_path / "f.png")


def test_the_precisions_of_one_gpu_type_are_compared_tied_or_by_how_much() -> None:
    """Inference at batch 8: the answer's throughput sentence names bf16 and fp16 tied and says nothing of fp32; the
    precisions sentence says fp32 stands 6.10x behind. A host-bound setting (it measured the host) and the CPU take
    no part, and where the throughput sentence already says by how much, there is no precisions sentence."""
    def inference(name: str, precision: str, rate: float, repeat: int, gpu: str | None = "h200",
                  host_share: float = 0.1) -> Any:
        res = {"outcome": "succeeded", "device": "cuda" if gpu else "cpu",
               "inference": {"samples_per_s": rate, "latency_s": {"p50": 8 / rate}, "host_share": host_share}}
        return record(name, gpu=gpu, repeat=repeat, gpus=1 if gpu else 0, task="inference", batch_size=8,
                      precision=precision, step_graph=host_share < 0.5, res=res)

    spread = (-100.0, 100.0, 0.0)
    recs = [inference(f"{p}{r}", p, rate + spread[r], r) for p, rate in (("bf16", 7316.0), ("fp16", 7239.0))
            for r in range(3)]
    recs += [inference(f"fp32{r}", "fp32", 1199.0 + r, r) for r in range(3)]
    recs += [inference(f"e{r}", "fp32", 800.0 + 50 * r, r, host_share=0.99) for r in range(3)]  # eager: host-bound
    recs += [inference(f"c{r}", "fp32", 30.0 + r, r, gpu=None) for r in range(3)]
    (line,) = precision_lines(aggregate(recs, catalog=load_catalog()), "inference")
    assert line == ("Precisions, inference, highest throughput, at their best settings: on h200, bf16 7,316 "
                    "samples/s ±3.4%, fp16 7,239 samples/s ±3.4% (tied with bf16), fp32 1,200 samples/s ±0.2% "
                    "(bf16 is 6.10x it)."), line
    # bf16 ahead of fp16, intervals apart: the throughput sentence says "1.01x the next best" itself
    apart = [inference(f"{p}{r}", p, rate + r, r) for p, rate in (("bf16", 7316.0), ("fp16", 7239.0))
             for r in range(3)]
    assert precision_lines(aggregate(apart, catalog=load_catalog()), "inference") == []


def test_a_latency_under_half_the_others_is_said_as_a_fraction() -> None:
    """`100% below` says nothing of a GPU at 1/260 of the CPU's latency; `12% below` stays as it was."""
    def inference(name: str, gpu: str | None, p50: float, repeat: int) -> Any:
        res = {"outcome": "succeeded", "device": "cuda" if gpu else "cpu",
               "inference": {"samples_per_s": 8 / p50, "latency_s": {"p50": p50}}}
        return record(name, gpu=gpu, repeat=repeat, gpus=1 if gpu else 0, task="inference", batch_size=8, res=res)

    far = [inference("g0", "h100-80gb", 0.00113, 0), inference("g1", "h100-80gb", 0.00114, 1),
           inference("c0", None, 0.2945, 0), inference("c1", None, 0.2946, 1)]
    line = next(x for x in gpu_lines(aggregate(far, catalog=load_catalog()), "inference") if "p50" in x)
    assert "h100-80gb is at 1/260 of CPU at their best settings" in line, line
    near = [inference("g0", "h100-80gb", 0.0088, 0), inference("g1", "h100-80gb", 0.00881, 1),
            inference("c0", None, 0.0100, 0), inference("c1", None, 0.01001, 1)]
    line = next(x for x in gpu_lines(aggregate(near, catalog=load_catalog()), "inference") if "p50" in x)
    assert "h100-80gb is 12% below CPU at their best settings" in line, line


SMOKE_LIKE_SPEC = """\
apiVersion: kubesweep.io/v1alpha1
kind: Sweep
metadata: {name: smoke}
spec:
  job: {epochs: 1, train_samples: 384, batch_size: 16}
  matrix: {precision: [fp32, bf16]}
  include:
    - {task: inference, batch_size: 8, precision: fp32}
    - {task: inference, batch_size: 8, precision: bf16}
  resources: {gpus_per_trial: 0}
"""


def test_a_cpu_sweep_speaks_of_the_cpu_alone_and_draws_one_batch_size_as_bars(tmp_path: Path) -> None:
    """`sweeps/smoke.yaml`'s shape: fine-tuning at one batch size and inference, all on the CPU. No GPU wording,
    no speed-up of the CPU against itself, and no line through one x value."""
    def on_cpu(trial: Any, results: dict[str, Any]) -> None:
        results["memory"] = {"torch_peak_allocated_bytes": None, "host_peak_rss_bytes": 3 * 1024**3}

    built, page, _ = report(tmp_path, records(SMOKE_LIKE_SPEC, on_cpu))
    (inference,) = [t for t in built.tables if t.title.startswith("Inference latency")]
    assert inference.title == "Inference latency on CPU, bf16 vs fp32"
    assert "speed-up vs CPU" not in inference.headers and "speed-up" not in inference.note
    assert "GPU" not in inference.title + inference.note and "FP16" not in page
    captions = dict(built.figures)
    assert captions["throughput.png"].startswith("Throughput per setting and precision (error bars: the 95% "
                                                 "interval over repeats)")
    assert "GPU" not in captions["throughput.png"] + captions["peak_memory.png"]
    assert "std" not in " ".join(captions.values())
    fig = figs.per_gpu_lines(aggregate(records(SMOKE_LIKE_SPEC, on_cpu), target=0.9), "samples_per_s",
                             "samples/s", "Fine-tuning throughput")
    assert fig is not None and len(fig.axes[0].patches) == 2  # a bar per setting ...
    assert fig.axes[0].get_xlabel() == "samples/s" and fig.axes[0].get_xscale() == "linear"  # ... not batch size


def test_a_speed_up_is_the_cpu_against_another_device_never_against_itself(tmp_path: Path) -> None:
    def inference(name: str, gpu: str | None, p50: float, repeat: int) -> Any:
        res = {"outcome": "succeeded", "device": "cuda" if gpu else "cpu",
               "inference": {"samples_per_s": 8 / p50, "latency_s": {"p50": p50}}}
        return record(name, gpu=gpu, repeat=repeat, gpus=1 if gpu else 0, task="inference", batch_size=8, res=res)

    recs = [inference(f"c{r}", None, 0.040, r) for r in range(2)] + [inference(f"g{r}", "h200", 0.004, r)
                                                                     for r in range(2)]
    built, _, _ = report(tmp_path, recs)
    (table,) = [t for t in built.tables if t.title.startswith("Inference latency")]
    assert table.title == "Inference latency: CPU vs GPU, bf16"
    at = table.headers.index("speed-up vs CPU")
    assert {row[0]: row[at] for row in table.rows} == {"CPU": "-", "h200": "10.0x"}
