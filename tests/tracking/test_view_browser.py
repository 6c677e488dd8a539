"""The MLflow UI as a person sees it: headless Chromium (Debian's `chromium`, driven by Playwright) opens the
real `mlflow server` of tests/support/mlflow_fixtures.py after the tracked sweep ran and its report was logged,
finds the experiment, lands on the sweep's runs view that kubesweep links to (training runs, every child run
listed, best samples/s first, the comparison metrics as columns), and the report among the parent's artifacts.
Then the sweep with a setting at chance accuracy (the fastest), an OOM and a GPU mismatch, on the link `sweep ui`
prints, in a laptop's 1,400 x 900 window: runs that learned first, and without scrolling sideways each run's
setting, its key metrics and a flagged run's flags in its row.
Screenshots go to test-output/browser/ (tests/support/chromium.py); `mlflow-runs-view-marks.png` is
docs/img/mlflow-runs-view-marks.png.
"""

from __future__ import annotations

import base64
import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from kubesweep.tracking.view import AXES, DESCRIPTION, FIRST_SCREEN, KEY_METRICS, OUTCOME, TASK, runs_url
from kubesweep.wire import tags
from kubesweep.wire.config import JobConfig, TrialConfig
from kubesweep.wire.trial_metrics import RANK_METRIC
from kubesweep.wire.trial_run import run_name, run_params, run_tags
from tests.support.chromium import SHOTS, launch
from tests.support.mlflow_auth import PASSWORDS, PREFIX, AuthServer
from tests.support.mlflow_fixtures import (
    MARKS_NAME,
    MARKS_TRIALS,
    SWEEP_TRIALS,
    TASKS_NAME,
    TASKS_TRIALS,
    MarkedSweep,
    TrackedSweep,
)

pytestmark = pytest.mark.browser

TIMEOUT_MS = 120_000
EXPERIMENT = "kubesweep-tracked"


def test_experiment_parent_children_and_report_in_the_ui(tracked_sweep: TrackedSweep, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    ts = tracked_sweep
    ts.sweep("report", ts.name, "--output", str(tmp_path / "report"))  # logs report/ to the parent run
    client = MlflowClient(tracking_uri=ts.server.url)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert experiment is not None
    parent = client.search_runs([experiment.experiment_id], "tags.`kubesweep.role` = 'parent'")[0]
    parent_id = parent.info.run_id
    names = [d.name for d in ts.trial_dirs()]
    SHOTS.mkdir(parents=True, exist_ok=True)
    for old in SHOTS.glob("[0-9]-*.png"):
        old.unlink()

    with sync_playwright() as pw:
        context = launch(pw, tmp_path / "chromium-profile")
        try:
            page = context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            expect.set_options(timeout=TIMEOUT_MS)

            # the experiments list shows the sweep's experiment
            page.goto(f"{ts.server.url}/#/experiments")
            link = page.get_by_role("link", name=EXPERIMENT, exact=True)
            expect(link).to_be_visible()
            page.screenshot(path=str(SHOTS / "1-experiments.png"))

            # what kubesweep links to (`sweep ui` prints it): the training side of the UI, not the GenAI overview,
            # every run listed (no child folded under a collapsed parent), best samples/s first, the comparison
            # metrics, outcome and cell settings as columns
            page.goto(runs_url(ts.server.url, experiment.experiment_id))
            expect(page.get_by_text(f"{SWEEP_TRIALS + 1} matching runs")).to_be_visible()
            assert "/runs" in page.url and "overview" not in page.url and "genai" not in page.url, page.url
            expect(page.get_by_role("heading", name="Overview")).to_have_count(0)
            runs = client.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'",
                                      max_results=100)
            assert len(runs) == SWEEP_TRIALS and {r.data.tags[tags.TRIAL] for r in runs} == set(names)
            for run in (runs[0], runs[-1]):
                expect(page.get_by_role("link", name=run.info.run_name, exact=True)).to_be_visible()
            for column in ("task", "samples_per_s", "step_p50_ms", "accuracy", "kubesweep.outcome"):
                expect(page.get_by_role("columnheader", name=re.compile(re.escape(column))).first).to_be_visible()
            best = max((r for r in runs if "samples_per_s" in r.data.metrics),
                       key=lambda r: r.data.metrics["samples_per_s"])
            first = page.locator(".ag-row[row-index='1'] a[href*='/runs/']").first  # under the first task's row
            expect(first).to_have_text(best.info.run_name)
            page.screenshot(path=str(SHOTS / "2-sweep-runs-view.png"))
            parent_link = page.locator(f"a[href$='/runs/{parent_id}']").first
            expect(parent_link).to_have_text("tracked")

            # the parent run's artifacts hold the report; the HTML page renders in the artifact viewer
            parent_link.click()
            page.get_by_role("tab", name="Artifacts").click()
            page.get_by_text("report", exact=True).first.click()
            for name in ("report.html", "throughput.png", "heatmap.png", "summary.json"):
                expect(page.get_by_text(name, exact=True).first).to_be_visible()
            page.get_by_text("report.html", exact=True).first.click()
            frame = page.frame_locator("iframe").first
            expect(frame.get_by_role("heading", name="Sweep tracked: report")).to_be_visible()
            expect(frame.get_by_role("heading", name="Time for 2 epochs of glue/sst2 at batch 16 per GPU"))\
                .to_be_visible()
            expect(frame.get_by_text("GPU mismatch").first).to_be_visible()
            page.screenshot(path=str(SHOTS / "3-report-artifact.png"))
            page.get_by_text("heatmap.png", exact=True).first.click()
            expect(page.locator("img[src*='heatmap.png'], img[src^='blob:'], img[src^='data:']").first)\
                .to_be_visible()
            page.screenshot(path=str(SHOTS / "4-heatmap-artifact.png"))
        finally:
            context.close()
    assert len(list(SHOTS.glob("[0-9]-*.png"))) == 4


def test_the_runs_view_marks_runs_at_chance_oom_and_mismatch(marked_sweep: MarkedSweep, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    ms = marked_sweep
    client = MlflowClient(tracking_uri=ms.base)
    experiment = client.get_experiment_by_name(MARKS_NAME)
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == MARKS_TRIALS
    learned = [r for r in children if RANK_METRIC in r.data.metrics]
    flagged = {r.info.run_id: r.data.tags[tags.FLAGS] for r in children if r.data.tags[tags.FLAGS]}
    assert sorted(set(flagged.values())) == ["GPU mismatch", "OOM", "chance accuracy (0.51)"]
    fastest = max(children, key=lambda r: r.data.metrics.get("samples_per_s", 0.0))
    assert flagged[fastest.info.run_id] == "chance accuracy (0.51)"  # what the view must not put first
    best = max(learned, key=lambda r: r.data.metrics["samples_per_s"])
    SHOTS.mkdir(parents=True, exist_ok=True)

    with sync_playwright() as pw:
        context = launch(pw, tmp_path / "chromium-profile", width=1400, height=900)  # a laptop's window
        try:
            page = context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            expect.set_options(timeout=TIMEOUT_MS)
            page.goto(ms.runs_view)  # the link `sweep ui` printed
            expect(page.get_by_text(f"{MARKS_TRIALS + 1} matching runs")).to_be_visible()
            close = page.locator("[data-component-id='mlflow.assistant.chat_panel.close']")
            if close.count():  # MLflow's assistant panel, open on a first visit: closed, as a reader would
                close.first.click()
            expect(close).to_have_count(0)

            def whole(text: Any) -> None:
                """The element holding a text shows it whole: no part beyond the table's edge (what a scrolled
                box hides is out of the viewport) and none cut off with an ellipsis."""
                expect(text).to_be_in_viewport(ratio=1)
                assert text.evaluate("e => e.scrollWidth <= e.clientWidth"), text

            # the runs table's own headers (the UI draws others, of the same names, elsewhere)
            for column in FIRST_SCREEN:
                header = page.locator(f".ag-header-cell[col-id='{column}']")
                expect(header).to_have_count(1)
                whole(header.get_by_text(column.split("`")[1], exact=True))  # `gpu`, not `kubesweep.gpu`

            def row(run_id: str) -> Any:  # grouped by task, a run's row id is `param.task.<task>.<run id>`
                return page.locator(f".ag-row[row-id$='.{run_id}']")

            def cell(run_id: str, column: str) -> Any:
                return row(run_id).locator(f".ag-cell[col-id='{column}']")

            for run_id, flags in flagged.items():  # in the run's row, its outcome whole, its flags beside it
                run = next(r for r in children if r.info.run_id == run_id)
                whole(cell(run_id, OUTCOME).get_by_text(run.data.tags[tags.OUTCOME], exact=True))
                expect(cell(run_id, DESCRIPTION).get_by_text(flags, exact=True)).to_have_count(1)
            # the best run's setting (the params the job logs, `gpu` as the tag) and its numbers, whole in its row
            setting = {a: best.data.params[a.split("`")[1]] for a in AXES}
            assert setting["params.`gpu`"] == best.data.tags[tags.GPU], setting
            for column, value in setting.items():
                whole(cell(best.info.run_id, column).get_by_text(value, exact=True))
            for column in KEY_METRICS:
                value = f"{best.data.metrics[column.split('`')[1]]:g}"
                whole(cell(best.info.run_id, column).get_by_text(value, exact=True))
            for run in learned:
                expect(row(run.info.run_id).get_by_text(re.compile("chance|OOM|mismatch"))).to_have_count(0)
            index = {r.info.run_id: int(row(r.info.run_id).first.get_attribute("row-index") or -1) for r in children}
            assert index[best.info.run_id] == min(index.values()), index
            at_chance = [i for run_id, i in index.items() if flagged.get(run_id) == "chance accuracy (0.51)"]
            assert max(index[r.info.run_id] for r in learned) < min(at_chance), index
            page.screenshot(path=str(SHOTS / "mlflow-runs-view-marks.png"))
        finally:
            context.close()


def test_the_runs_view_ranks_each_task_apart_and_fits_1400_px(marked_sweep: MarkedSweep, tmp_path: Path) -> None:
    """A sweep of fine-tuning and inference runs on `sweep ui`'s link, 1,400 x 900: the runs grouped by task, each
    group best samples/s first (ranked by samples/s alone, an inference run would sit between two fine-tuning
    runs), every row's task, GPU, batch size, precision, compile as the CLI words it, samples/s, step p50 (an
    inference run's latency), accuracy and outcome whole without scrolling sideways, and run names that do not
    all start with the sweep's."""
    from playwright.sync_api import expect, sync_playwright

    ms = marked_sweep
    client = MlflowClient(tracking_uri=ms.base)
    experiment = client.get_experiment_by_name(TASKS_NAME)
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    children = [r for r in runs if tags.PARENT_RUN in r.data.tags]
    assert len(children) == TASKS_TRIALS
    by_task: dict[str, list[Any]] = {}
    for run in sorted(children, key=lambda r: -r.data.metrics["samples_per_s"]):
        by_task.setdefault(run.data.params["task"], []).append(run)
    assert sorted(by_task) == ["finetune", "inference"]
    ranked = [r.data.params["task"] for r in sorted(children, key=lambda r: -r.data.metrics[RANK_METRIC])]
    assert ranked == ["finetune", "inference", "finetune", "inference"]  # what a ranking across tasks would show
    names = [r.info.run_name for r in children]
    assert len(set(names)) == len(names) and not any(n.startswith(TASKS_NAME) for n in names), names
    SHOTS.mkdir(parents=True, exist_ok=True)

    with sync_playwright() as pw:
        context = launch(pw, tmp_path / "chromium-profile", width=1400, height=900)
        try:
            page = context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            expect.set_options(timeout=TIMEOUT_MS)
            page.goto(ms.tasks_view)
            expect(page.get_by_text(f"{TASKS_TRIALS + 1} matching runs")).to_be_visible()
            page.wait_for_timeout(1000)
            close = page.locator("[data-component-id='mlflow.assistant.chat_panel.close']")
            if close.count():
                close.first.click()

            def whole(text: Any) -> None:
                expect(text).to_be_in_viewport(ratio=1)
                assert text.evaluate("e => e.scrollWidth <= e.clientWidth"), text

            for column in FIRST_SCREEN:
                header = page.locator(f".ag-header-cell[col-id='{column}']")
                expect(header).to_have_count(1)
                whole(header.get_by_text(column.split("`")[1], exact=True))

            def row(run_id: str) -> Any:
                return page.locator(f".ag-row[row-id$='.{run_id}']")

            def cell(run_id: str, column: str) -> Any:
                return row(run_id).locator(f".ag-cell[col-id='{column}']")

            for run in children:
                run_id, params, metrics = run.info.run_id, run.data.params, run.data.metrics
                assert params["compile"] == "off", params
                for column in AXES:
                    whole(cell(run_id, column).get_by_text(params[column.split("`")[1]], exact=True))
                for column in KEY_METRICS:
                    key = column.split("`")[1]
                    if key in metrics:
                        whole(cell(run_id, column).get_by_text(f"{metrics[key]:g}", exact=True))
                whole(cell(run_id, OUTCOME).get_by_text(run.data.tags[tags.OUTCOME], exact=True))
                expect(row(run_id).get_by_role("link", name=run.info.run_name, exact=True)).to_be_visible()
            index = {r.info.run_id: int(row(r.info.run_id).first.get_attribute("row-index") or -1) for r in children}
            # each task's runs together, best samples/s first: no run of one task between two of the other
            for task, group in by_task.items():
                rows = [index[r.info.run_id] for r in group]
                assert rows == sorted(rows), (task, rows)
                assert rows[-1] - rows[0] == len(rows) - 1, (task, index)
            page.screenshot(path=str(SHOTS / "mlflow-runs-view-tasks-1400.png"))
        finally:
            context.close()


def test_the_chart_servers_view_for_a_namespaces_user_groups_tasks(mlflow_auth_server: AuthServer,
                                                                   tmp_path: Path) -> None:
    """The chart's MLflow (basic auth): the operator makes a namespace's experiment with the view's tags, that
    namespace's user logs trials of two tasks into it (the job's tags and params), and opens the link the report
    and `sweep results` give for a server (`runs_url`, the shared view) at 1,400 x 900 with its credentials: the
    same view, grouped by task, every column up to the outcome whole."""
    from playwright.sync_api import expect, sync_playwright

    server = mlflow_auth_server
    operator = server.as_user("kubesweep-operator")
    parent = operator.parent_run("sweeps-view", "view", "uid-view", namespace="team-a", grant_to=PREFIX + "team-a")
    experiment = operator.experiment_id("sweeps-view", "team-a")
    user, password = PREFIX + "team-a", PASSWORDS["team-a"]
    auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def call(path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(f"{server.url}/api/2.0/mlflow/{path}", data=json.dumps(body).encode(),
                                         method="POST", headers={"Content-Type": "application/json",
                                                                 "Authorization": auth})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"{}")

    cells = [("finetune", 64, 2729.0, 23.9, 0.91), ("inference", 32, 2216.0, 14.7, None),
             ("finetune", 16, 1800.0, 9.07, 0.92), ("inference", 8, 31.8, 251.0, None)]  # by samples/s
    rows: dict[str, str] = {}
    for n, (task, batch, rate, p50, accuracy) in enumerate(cells):
        trial = TrialConfig(sweep="view", trial_id=f"{n:016x}", name=f"view-{task[:3]}-bs{batch}-{n:08x}",
                            gpu="h100-80gb", job=JobConfig(task=task, batch_size=batch, precision="bf16"))
        run_tags_ = {**run_tags(trial), tags.PARENT_RUN: parent}
        created = call("runs/create", {"experiment_id": experiment, "run_name": run_name(trial),
                                       "tags": [{"key": k, "value": v} for k, v in run_tags_.items()]})
        run_id = created["run"]["info"]["run_id"]
        metrics = {"samples_per_s": rate, RANK_METRIC: rate, "step_p50_ms": p50,
                   **({"accuracy": accuracy} if accuracy is not None else {})}
        call("runs/log-batch", {"run_id": run_id,
                                "params": [{"key": k, "value": str(v)} for k, v in run_params(trial).items()],
                                "metrics": [{"key": k, "value": v, "timestamp": 0, "step": 0}
                                            for k, v in metrics.items()],
                                "tags": [{"key": tags.OUTCOME, "value": "succeeded"}]})
        rows[run_id] = task

    with sync_playwright() as pw:
        context = launch(pw, tmp_path / "chromium-profile", width=1400, height=900)
        try:
            context.set_extra_http_headers({"Authorization": auth})  # the namespace user's credentials
            page = context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            expect.set_options(timeout=TIMEOUT_MS)
            page.goto(runs_url(server.url, experiment))
            expect(page.get_by_text(f"{len(cells) + 1} matching runs")).to_be_visible()
            page.wait_for_timeout(1000)
            close = page.locator("[data-component-id='mlflow.assistant.chat_panel.close']")
            if close.count():
                close.first.click()
            for column in FIRST_SCREEN:
                header = page.locator(f".ag-header-cell[col-id='{column}']")
                expect(header).to_have_count(1)
                expect(header.get_by_text(column.split("`")[1], exact=True)).to_be_in_viewport(ratio=1)
            index = {}
            for run_id, task in rows.items():
                row = page.locator(f".ag-row[row-id$='.{run_id}']")  # its parts: the pinned name, the cells
                expect(row.locator(f".ag-cell[col-id='{TASK}']").get_by_text(task, exact=True)).to_be_in_viewport(
                    ratio=1)
                index[run_id] = int(row.first.get_attribute("row-index") or -1)
            for task in ("finetune", "inference"):  # each task's runs together, faster first
                at = [index[r] for r, t in rows.items() if t == task]
                assert at == sorted(at) and at[-1] - at[0] == len(at) - 1, index
            page.screenshot(path=str(SHOTS / "mlflow-runs-view-auth-1400.png"))
        finally:
            context.close()
