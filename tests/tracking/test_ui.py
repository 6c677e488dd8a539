"""The default store: with no tracking URI anywhere, a local sweep logs to sqlite:///<home>/mlflow.db with
artifacts under <home>/mlartifacts, and `sweep ui` serves that store (a real `mlflow server` on 127.0.0.1) and owns
it: stopping `sweep ui`, or killing it, stops the server and its workers.
The workload is tests/support/tracked_job.py (the job's own MLflow logger, no training)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kubesweep.tracking import ui
from kubesweep.tracking.target import local_store_uri
from kubesweep.tracking.ui import answers, free_port
from kubesweep.tracking.view import AXES, KEY_METRICS, VIEW_TAG, experiment_tags, runs_url, view_state
from kubesweep.wire.trial_metrics import RANK_METRIC
from tests.support.mlflow_fixtures import (
    MARKS_NAME,
    MARKS_TRIALS,
    SERVER_START_TIMEOUT_S,
    TRACKED_JOB,
    MarkedSweep,
    make_runner,
    quiet_mlflow_env,
    wait_http,
)

SPEC = """\
apiVersion: kubesweep.io/v1alpha1
kind: Sweep
metadata: {name: local-one}
spec:
  job: {epochs: 1, train_samples: 320}
  matrix: {batch_size: [16]}
  resources: {gpus_per_trial: 0, retries: 0}
"""


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        body = response.read()
    return json.loads(body) if body.startswith(b"{") else body


def search(base: str, experiment: str, filter_string: str) -> list[Any]:
    request = urllib.request.Request(f"{base}/api/2.0/mlflow/runs/search", method="POST",
                                     headers={"Content-Type": "application/json"},
                                     data=json.dumps({"experiment_ids": [experiment],
                                                      "filter": filter_string}).encode())
    with urllib.request.urlopen(request, timeout=30) as response:
        return list(json.loads(response.read()).get("runs", []))


def test_default_local_store_and_sweep_ui(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "KUBESWEEP_NO_TRACKING")}
    env.update({**quiet_mlflow_env(), "KUBESWEEP_HOME": str(home), "KUBESWEEP_LOCAL_GPUS": "[]",
                "KUBESWEEP_JOB_COMMAND": json.dumps([sys.executable, str(TRACKED_JOB)])})
    env.pop("MLFLOW_SERVER_ENABLE_JOB_EXECUTION")  # `sweep ui` turns it off by itself
    (tmp_path / "local-one.yaml").write_text(SPEC)
    run = make_runner(env, tmp_path)
    out = run("submit", "local-one.yaml").stdout
    assert f"tracking: MLflow at sqlite:///{home.resolve()}/mlflow.db (from local store)" in out
    assert (home / "mlflow.db").exists()
    results = json.loads(next((home / "sweeps/local-one/trials").glob("*/results.json")).read_text())

    ui, base, log = start_ui(env, tmp_path)
    try:
        experiment = get(f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name=local-one")["experiment"]
        assert experiment["artifact_location"] == (home / "mlartifacts" / "local-one").resolve().as_uri()
        parent = search(base, experiment["experiment_id"], "tags.`kubesweep.role` = 'parent'")
        assert len(parent) == 1
        parent_id = parent[0]["info"]["run_id"]
        child = search(base, experiment["experiment_id"], f"tags.`mlflow.parentRunId` = '{parent_id}'")
        assert len(child) == 1
        run_id = child[0]["info"]["run_id"]
        # the UI server reads the artifacts the trial wrote straight into <home>/mlartifacts
        served = get(f"{base}/get-artifact?path=results.json&run_uuid={run_id}")
        assert served == results
        assert "MLflow UI: http://127.0.0.1:" in log.read_text()
        # the runs view, through kubesweep's page on the server `sweep ui` started
        assert f"  local-one: {runs_url(base, experiment['experiment_id'], served=True)}" in log.read_text()
        server = descendants(ui.pid)
        assert server, "no mlflow server process under `sweep ui`"
        # SIGTERM to `sweep ui` alone (not its group: the server runs in a group of its own) stops the server
        # and every worker it started, and the port stops answering
        ui.send_signal(signal.SIGTERM)
        assert ui.wait(timeout=60) == 0, log.read_text()[-2000:]
        assert "stopped the MLflow UI" in log.read_text()
        assert_gone(server, base)
    finally:
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGKILL)


def test_sweep_ui_killed_outright_takes_its_server_along(tmp_path: Path) -> None:
    env = {**os.environ, **quiet_mlflow_env(), "KUBESWEEP_HOME": str(tmp_path / "home")}
    env.pop("MLFLOW_TRACKING_URI", None)
    ui, base, _ = start_ui(env, tmp_path)
    try:
        server = descendants(ui.pid)
        ui.kill()  # no handler runs: the server learns of it from the kernel (parent-death signal)
        ui.wait(timeout=30)
        assert_gone(server, base)
    finally:
        if ui.poll() is None:
            ui.kill()


def test_sweep_ui_names_its_sweeps_runs_view_once_the_server_answers(tmp_path: Path) -> None:
    """`sweep ui NAME`: the server's output (its start-up, warnings, request log) goes to <home>/ui.log, which
    the terminal is told; the URL comes only once the server answers HTTP, and it opens the sweep's runs view.
    A sweep the store does not know is exit 3 with no server started."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "KUBESWEEP_NO_TRACKING")}
    env.update({**quiet_mlflow_env(), "KUBESWEEP_HOME": str(home), "KUBESWEEP_LOCAL_GPUS": "[]",
                "KUBESWEEP_JOB_COMMAND": json.dumps([sys.executable, str(TRACKED_JOB)]), "COLUMNS": "300"})
    (tmp_path / "local-one.yaml").write_text(SPEC)
    run = make_runner(env, tmp_path)
    run("submit", "local-one.yaml")
    unknown = run("ui", "no-such-sweep", check=3)
    assert "sweep 'no-such-sweep': no MLflow experiment 'no-such-sweep'" in unknown.stderr
    assert "local-one" in unknown.stderr and "Traceback" not in unknown.stderr

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    terminal = tmp_path / "terminal.txt"
    with terminal.open("wb") as sink:
        ui = subprocess.Popen([sys.executable, "-m", "kubesweep", "ui", "local-one", "--port", str(port)], env=env,
                              stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while "MLflow UI" not in terminal.read_text():
            assert ui.poll() is None and time.monotonic() < deadline, terminal.read_text()
            time.sleep(0.05)
        assert answers(f"{base}/health"), "the URL was printed before the server answered"
        said = terminal.read_text()
        log = home / "ui.log"
        assert f"starting the MLflow server on {base} (store sqlite:///{home.resolve()}/mlflow.db); its output " \
               f"goes to {log}" in said
        experiment = get(f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name=local-one")["experiment"]
        url = runs_url(base, experiment["experiment_id"], served=True)
        assert f"MLflow UI, the runs of sweep 'local-one' (best samples/s first): {url}" in said
        assert search(base, experiment["experiment_id"], "tags.`kubesweep.role` = 'parent'")
        page = get(url)  # the server runs kubesweep's app: its page for the sweep's runs view
        assert b"ReactComponentState" in page and b"location.replace(" in page, page[:500]
        ui.send_signal(signal.SIGTERM)
        assert ui.wait(timeout=60) == 0
    finally:
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGKILL)
    # the request log and MLflow's start-up chatter are in the file, not on the terminal
    served = log.read_text()
    assert '"GET /health HTTP/1.1" 200' in served and "Uvicorn running" in served
    said = terminal.read_text()
    assert "HTTP/1.1" not in said and "Uvicorn" not in said and "Warning" not in said, said


def test_sweep_ui_says_why_when_the_server_dies_before_answering(tmp_path: Path) -> None:
    """A server that cannot serve (its port is taken) is an error naming its log and its last lines, exit 4;
    no URL is printed."""
    env = {**os.environ, **quiet_mlflow_env(), "KUBESWEEP_HOME": str(tmp_path / "home")}
    env.pop("MLFLOW_TRACKING_URI", None)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = make_runner(env, tmp_path)("ui", "--port", str(port), check=4)
    log = tmp_path / "home" / "ui.log"
    # uvicorn ends with code 0 or 1 on a port it cannot bind, by version: the code is reported as it is
    assert re.search(rf"error: the MLflow server exited with code \d+ before it served the UI; its log, "
                     rf"{re.escape(str(log))}, ends:", proc.stderr), proc.stderr
    assert "address already in use" in proc.stderr.lower() and "address already in use" in log.read_text().lower()
    assert "MLflow UI" not in proc.stdout


def start_ui(env: dict[str, str], tmp_path: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    """`sweep ui` on a free port, in a session of its own, once its server answers: (process, base URL, log)."""
    port = free_port()
    log = tmp_path / "ui.log"
    with log.open("wb") as sink:
        ui = subprocess.Popen([sys.executable, "-m", "kubesweep", "ui", "--port", str(port)], env=env,
                              stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/health", ui, log)
    except BaseException:
        ui.kill()
        raise
    return ui, base, log


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def assert_gone(pids: list[int], base: str, timeout: float = 30) -> None:
    """Each of `pids` has exited (or is a zombie) and nothing answers at `base` any more."""
    def alive(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in pids if alive(p)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"server processes outlived `sweep ui`: {left}"
    try:
        urllib.request.urlopen(f"{base}/health", timeout=5)
    except OSError:
        return
    raise AssertionError(f"{base} still answers after `sweep ui` stopped")


class FakeStore:
    """The tracking store as kubesweep's page asks it: experiment id -> its tags (no entry: no such experiment)."""

    def __init__(self, experiments: dict[str, dict[str, str]]) -> None:
        self.experiments = experiments
        self.asked: list[str] = []

    def get_experiment(self, experiment_id: str) -> Any:
        from mlflow.exceptions import MlflowException

        self.asked.append(experiment_id)
        if experiment_id not in self.experiments:
            raise MlflowException(f"no experiment {experiment_id}")
        return SimpleNamespace(experiment_id=experiment_id, tags=self.experiments[experiment_id])


def test_the_runs_page_writes_the_view_only_for_kubesweeps_experiments(monkeypatch: pytest.MonkeyPatch) -> None:
    """kubesweep's page on `sweep ui`'s server (kubesweep/tracking/ui_app.py): only digits reach it (anything else is
    a 404 that does not echo it, and the store is not asked); an experiment without kubesweep's view tag, or none at
    all, is a plain redirect to its runs page; a sweep's experiment gets the page that saves the view and goes on to
    the runs URL with the sort in it, every value in its script JSON with no way out of the script element."""
    import mlflow.server.handlers
    from flask import Flask

    from kubesweep.tracking import ui_app
    from kubesweep.tracking.view import ASSISTANT_FLAG, SERVED_PATH, plain_runs_fragment, saved_state, storage_key

    store = FakeStore({"7": {"mlflow.experimentKind": "custom_model_development"}, "12": experiment_tags()})
    monkeypatch.setattr(mlflow.server.handlers, "_get_tracking_store", lambda *a, **k: store)
    monkeypatch.delenv("_MLFLOW_STATIC_PREFIX", raising=False)
    app = Flask("kubesweep-test")
    ui_app.add_routes(app)
    client = app.test_client()

    for bad in ("abc", "1%3Cscript%3Ealert(1)%3C%2Fscript%3E", "-1", "1.0", "%D9%A1", "1%20", "12abc",
                "1" * 21, "12/extra"):
        response = client.get(f"{SERVED_PATH}{bad}")
        assert response.status_code == 404, bad
        body = response.get_data(as_text=True)
        assert "script" not in body.lower() and "alert" not in body and "abc" not in body, body
    assert store.asked == []

    for plain in ("7", "404"):  # not kubesweep's, or no such experiment: MLflow's runs page, nothing saved
        response = client.get(f"{SERVED_PATH}{plain}")
        assert response.status_code == 302
        assert response.headers["Location"] == f"/#/experiments/{plain}/runs"
        assert "localStorage" not in response.get_data(as_text=True)

    response = client.get(f"{SERVED_PATH}12")
    assert response.status_code == 200 and response.mimetype == "text/html"
    page = response.get_data(as_text=True)
    script = page.split("<script>", 1)[1].split("</script>", 1)[0]
    assert "</" not in script and "<!--" not in script
    # the script's values, read back as the browser would (JSON is JavaScript)
    values = dict(re.findall(r"(key|state|flag|target) = (.+?)(?:, (?=\w+ = )|;\n)", script))
    assert json.loads(values["key"]) == storage_key("12") == 'MLflowLocalStorage-1.1-ExperimentPage-["12"]-' \
                                                            "ReactComponentState"
    assert json.loads(values["state"]) == saved_state() == json.loads(view_state())
    assert json.loads(values["flag"]) == ASSISTANT_FLAG == "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1"
    target = json.loads(values["target"])
    assert target == "/" + plain_runs_fragment("12") == ("/#/experiments/12/runs?workflowType=machine_learning"
                                                         "&orderByKey=metrics.%60ranked_samples_per_s%60"
                                                         "&orderByAsc=false")
    assert "viewStateShareKey" not in target and "location.replace(target)" in script
    # only that script runs: the page's policy names its hash
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in response.headers["Content-Security-Policy"]
    assert "default-src 'none'" in response.headers["Content-Security-Policy"]
    assert ui_app._js("</script><!--&\u2028") == '"\\u003c/script\\u003e\\u003c!--\\u0026\\u2028"'


@pytest.mark.browser
def test_sweep_ui_name_opens_the_runs_view_without_banner_or_assistant(marked_sweep: MarkedSweep,
                                                                       tmp_path: Path) -> None:
    """`sweep ui NAME` on the marked sweep's store; its link in a fresh browser profile, in a laptop's 1,400 x 900
    window: the sweep's runs view as the browser's own (no "shared view" banner), MLflow's assistant panel shut,
    the setting's params and the key metrics as the table's headers in the viewport, the best run that learned
    first. The screenshot goes to test-output/browser/mlflow-sweep-ui-1400.png (docs/img/mlflow-runs-view-marks.png
    is a copy of it, taken by hand: a test run leaves the checkout's tracked files as they were)."""
    from playwright.sync_api import expect, sync_playwright

    from tests.support.chromium import SHOTS, launch

    ms = marked_sweep
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "KUBESWEEP_NO_TRACKING")}
    env.update({**quiet_mlflow_env(), "KUBESWEEP_HOME": str(ms.home), "COLUMNS": "300"})
    port = free_port()
    terminal = tmp_path / "terminal.txt"
    with terminal.open("wb") as sink:
        ui = subprocess.Popen([sys.executable, "-m", "kubesweep", "ui", MARKS_NAME, "--port", str(port)], env=env,
                              stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while not (link := re.search(r"best samples/s first\): (\S+)", terminal.read_text())):
            assert ui.poll() is None and time.monotonic() < deadline, terminal.read_text()
            time.sleep(0.1)
        url = link[1]
        while not (said := re.search(r"its answer in full \(the parent run's description\): (\S+)",
                                     terminal.read_text())):
            assert ui.poll() is None and time.monotonic() < deadline, terminal.read_text()
            time.sleep(0.1)
        answer = said[1]
        base = f"http://127.0.0.1:{port}"
        assert re.fullmatch(rf"{re.escape(base)}/kubesweep/runs/\d+", url), url

        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=base)
        experiment = client.get_experiment_by_name(MARKS_NAME)
        assert experiment is not None and url == runs_url(base, experiment.experiment_id, served=True)
        runs = client.search_runs([experiment.experiment_id], max_results=100)
        learned = [r for r in runs if RANK_METRIC in r.data.metrics]
        best = max(learned, key=lambda r: r.data.metrics["samples_per_s"])
        SHOTS.mkdir(parents=True, exist_ok=True)
        shot = SHOTS / "mlflow-sweep-ui-1400.png"
        with sync_playwright() as pw:
            context = launch(pw, tmp_path / "chromium-profile", width=1400, height=900)  # fresh profile
            try:
                page = context.new_page()
                page.set_default_timeout(120_000)
                expect.set_options(timeout=120_000)
                page.goto(url)
                expect(page.get_by_text(f"{MARKS_TRIALS + 1} matching runs")).to_be_visible()
                assert "/#/experiments/" in page.url and "viewStateShareKey" not in page.url, page.url
                page.wait_for_timeout(2000)  # what opens by itself on a first visit has opened by now
                expect(page.get_by_text("You're viewing a shared view")).to_have_count(0)
                expect(page.locator("[data-component-id='mlflow.assistant.chat_panel.close']")).to_have_count(0)
                for column in (*AXES, *KEY_METRICS):
                    header = page.locator(f".ag-header-cell[col-id='{column}']")
                    expect(header).to_have_count(1)
                    expect(header.get_by_text(column.split("`")[1], exact=True)).to_be_in_viewport(ratio=1)
                expect(page.locator(".ag-row[row-index='1'] a[href*='/runs/']").first)\
                    .to_have_text(best.info.run_name)  # first under its task's row
                page.screenshot(path=str(shot))
                # the sweep's answer, whole on its parent run's page (the view's Description column shows its
                # first words)
                (parent,) = [r for r in runs if r.data.tags.get("kubesweep.role") == "parent"]
                assert answer == (f"{base}/#/experiments/{experiment.experiment_id}/runs/{parent.info.run_id}"
                                  "?workflowType=machine_learning")
                page.goto(answer)
                note = parent.data.tags["mlflow.note.content"]
                first, *rest = note.splitlines()
                assert rest, note
                expect(page.get_by_text(first[:60]).first).to_be_visible()
                more = page.get_by_text("Show more", exact=True)
                if more.count():
                    more.first.click()
                expect(page.get_by_text(rest[-1][:60]).first).to_be_visible()
            finally:
                context.close()
        ui.send_signal(signal.SIGTERM)
        assert ui.wait(timeout=60) == 0
    finally:
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGKILL)


def test_the_links_come_from_the_local_store_without_importing_mlflow(marked_sweep: MarkedSweep) -> None:
    """`sweep ui`'s links to a local store's sweeps are read from its sqlite file as it is, the same experiments
    and ids MLflow's client finds, and without importing MLflow: that import took seconds before `sweep ui`
    printed anything."""
    from mlflow.tracking import MlflowClient

    store = local_store_uri(marked_sweep.home)
    base = "http://127.0.0.1:1"
    script = ("import json, sys\nfrom kubesweep.tracking.ui import experiment_view, sweep_views\n"
              f"print(json.dumps([sweep_views({store!r}, {base!r}), experiment_view({store!r}, 'tasks', {base!r}),"
              f" experiment_view({store!r}, 'nosuch', {base!r})]))\n"
              "assert not [m for m in sys.modules if m.split('.')[0] == 'mlflow'], 'mlflow imported'\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    views, tasks, missing = json.loads(done.stdout)
    experiments = MlflowClient(tracking_uri=store).search_experiments(max_results=1000)
    assert views == [[e.name, runs_url(base, e.experiment_id, served=True)] for e in experiments
                     if VIEW_TAG in e.tags]
    assert len(views) == 2 and missing is None
    assert tasks == runs_url(base, next(e.experiment_id for e in experiments if e.name == "tasks"), served=True)


def test_the_server_is_started_as_mlflow_server_starts_it(tmp_path: Path) -> None:
    """`sweep ui` starts uvicorn on kubesweep's app itself, with what `mlflow server --serve-artifacts --app-name
    kubesweep` hands its server process: the names are MLflow's own (an MLflow that renames one fails here, not
    in a browser), the app is the `mlflow.app` entry point's, and the command is uvicorn's, not MLflow's command
    line, whose import took most of the time before the link was printed."""
    from importlib.metadata import entry_points

    from mlflow import environment_variables as mlflow_env
    from mlflow.server import constants

    from kubesweep.tracking import ui

    assert (ui.STORE_ENV, ui.ARTIFACT_ROOT_ENV, ui.ARTIFACTS_DESTINATION_ENV, ui.SERVE_ARTIFACTS_ENV) == (
        constants.BACKEND_STORE_URI_ENV_VAR, constants.ARTIFACT_ROOT_ENV_VAR,
        constants.ARTIFACTS_DESTINATION_ENV_VAR, constants.SERVE_ARTIFACTS_ENV_VAR)
    names = [ui.SGI_ENV, ui.BOOT_ID_ENV, ui.IN_JOB_EXECUTOR_ENV, ui.JOB_EXECUTION_ENV]
    assert names == [mlflow_env._MLFLOW_SGI_NAME.name, mlflow_env._MLFLOW_SERVER_BOOT_ID.name,
                     mlflow_env._MLFLOW_IN_JOB_EXECUTOR.name, mlflow_env.MLFLOW_SERVER_ENABLE_JOB_EXECUTION.name]
    (app,) = [e for e in entry_points(group="mlflow.app") if e.name == ui.APP_NAME]
    assert app.value == ui.APP
    command, env = ui.server_command(tmp_path, 5123)
    assert command == [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port", "5123", "--workers", "1",
                       "--factory", ui.APP]
    assert env[ui.STORE_ENV] == local_store_uri(tmp_path) and env[ui.SGI_ENV] == "uvicorn"
    assert env[ui.ARTIFACTS_DESTINATION_ENV] == str((tmp_path / "mlartifacts").resolve())
    assert env[ui.ARTIFACT_ROOT_ENV] == "mlflow-artifacts:/" and env[ui.SERVE_ARTIFACTS_ENV] == "true"


def test_the_clusters_directions_name_the_charts_namespace_not_the_sweeps() -> None:
    """The chart's MLflow Service lives in the namespace the chart was installed in; a sweep's namespace (`-n
    ml-team`) is another one, and naming it sent a user's port-forward to a Service that is not there."""
    text = ui.cluster_directions("http://127.0.0.1:5000")
    assert text.splitlines()[0] == "tracking URI in use: http://127.0.0.1:5000"
    assert "kubectl -n kubesweep port-forward svc/kubesweep-mlflow 5000:5000" in text
    assert "the namespace the chart was installed in" in text and "ml-team" not in text
    assert "`sweep ui NAME`" in text
