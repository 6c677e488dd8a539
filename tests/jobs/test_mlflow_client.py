"""The trial logger's two clients (`kubesweep.jobs.mlflow_client`) against a real `mlflow server` (sqlite store,
served artifacts): a trial logged over the REST client reads back, through mlflow's own client, as the same trial
logged through mlflow's client does; logging to a server imports no mlflow; refusals carry MLflow's error codes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kubesweep.jobs.bounded_http import MAX_BODY_BYTES
from kubesweep.jobs.mlflow_client import PackageClient, RestClient, RestError, client_for
from kubesweep.jobs.mlflow_logger import MlflowTrialLogger
from tests.support.hostile_http import HUGE_BYTES, hostile_server
from tests.support.mlflow_fixtures import MlflowServer

mlflow = pytest.importorskip("mlflow")
ROOT = Path(__file__).resolve().parents[2]


def _log_one_trial(uri: str, trial_id: str, parent: str, client: Any, work: Path) -> str:
    """The requests a trial makes, in the order the job makes them; the run's id."""
    (work / "model" / "tokenizer").mkdir(parents=True)
    (work / "model" / "config.json").write_text('{"layers": 2}')
    (work / "model" / "tokenizer" / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    (work / "results.json").write_text('{"outcome": "succeeded"}')
    logger = MlflowTrialLogger(uri=uri, trial_id=trial_id, run_name=f"run {trial_id}", parent_run_id=parent,
                               tags={"kubesweep.sweep": "contract", "kubesweep.gpu": "l4"})
    logger._client = client
    logger.start()
    logger.log_params({"batch_size": 16, "precision": "bf16", "learning_rate": 2e-5})
    for step in range(1, 6):
        logger.log_metrics({"train/loss": 1.0 / step, "train/samples_per_s": 100.0 + step}, step,
                           timestamp_ms=1_700_000_000_000 + step)
    logger.log_metrics({"eval/accuracy": float("nan")}, 5, timestamp_ms=1_700_000_000_010)
    logger.set_tags({"kubesweep.outcome": "succeeded", "note": "text with 'quotes' and ünïcode"})
    logger.log_artifact(work / "results.json")
    logger.log_artifact(work / "model", "model")
    stats = logger.close("FINISHED")
    assert stats.dropped == 0 and stats.pending == 0 and stats.retries == 0, stats
    assert logger.run_id is not None
    return logger.run_id


def _read_back(uri: str, run_id: str) -> dict[str, Any]:
    c = mlflow.tracking.MlflowClient(tracking_uri=uri)
    run = c.get_run(run_id)

    def files(path: str | None = None) -> list[str]:
        out: list[str] = []
        for item in c.list_artifacts(run_id, path):
            out += files(item.path) if item.is_dir else [item.path]
        return out

    history = {key: [(m.step, m.timestamp, "nan" if math.isnan(m.value) else m.value)
                     for m in c.get_metric_history(run_id, key)] for key in run.data.metrics}
    return {"status": run.info.status, "ended": run.info.end_time is not None, "params": run.data.params,
            "tags": {k: v for k, v in run.data.tags.items() if k not in ("kubesweep.trial_id", "mlflow.runName",
                                                                         "mlflow.user")},
            "name": run.info.run_name.split(" ")[0], "metrics": history, "artifacts": sorted(files()),
            "experiment": run.info.experiment_id}


def test_a_trial_logged_over_rest_reads_back_as_one_logged_through_mlflows_client(
        mlflow_server: MlflowServer, tmp_path: Path) -> None:
    uri = mlflow_server.url
    c = mlflow.tracking.MlflowClient(tracking_uri=uri)
    experiment = c.create_experiment("client-contract")
    parent = c.create_run(experiment, run_name="sweep").info.run_id
    assert isinstance(client_for(uri), RestClient)
    assert isinstance(client_for(f"sqlite:///{tmp_path / 'x.db'}"), PackageClient)
    rest = _read_back(uri, _log_one_trial(uri, "t-rest", parent, RestClient(uri), tmp_path / "rest"))
    package = _read_back(uri, _log_one_trial(uri, "t-package", parent, PackageClient(uri), tmp_path / "package"))
    assert rest == package
    assert rest["tags"]["mlflow.parentRunId"] == parent and rest["experiment"] == experiment
    assert rest["artifacts"] == ["model/config.json", "model/tokenizer/vocab.txt", "results.json"]
    assert rest["metrics"]["eval/accuracy"] == [(5, 1_700_000_000_010, "nan")]
    assert rest["status"] == "FINISHED" and rest["ended"]


def test_a_trial_that_logs_to_a_tracking_server_imports_no_mlflow(mlflow_server: MlflowServer,
                                                                   tmp_path: Path) -> None:
    """The trial's process: tracking on, every kind of request sent, and mlflow never imported (it costs a trial
    seconds of CPU)."""
    code = (
        "import json, sys; from pathlib import Path\n"
        "from kubesweep.jobs.mlflow_logger import MlflowTrialLogger\n"
        "log = MlflowTrialLogger.from_env('t-light', 'light', {'kubesweep.sweep': 'light'}, None)\n"
        "log.log_params({'a': 1}); log.log_metrics({'m': 1.0}, 1); log.set_tags({'x': 'y'})\n"
        f"log.log_artifact(Path({str(tmp_path / 'f.txt')!r}))\n"
        "stats = log.close('FINISHED')\n"
        "print(json.dumps({'run': log.run_id, 'dropped': stats.dropped,\n"
        "                  'mlflow': sorted(m for m in sys.modules if m.split('.')[0] == 'mlflow')}))\n")
    (tmp_path / "f.txt").write_text("x")
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_server.url, "KUBESWEEP_EXPERIMENT": "light",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.splitlines()[-1])
    assert found["mlflow"] == [] and found["dropped"] == 0, found
    run = mlflow.tracking.MlflowClient(tracking_uri=mlflow_server.url).get_run(found["run"])
    assert run.data.params == {"a": "1"} and run.data.tags["x"] == "y" and run.info.status == "FINISHED"


def test_the_rest_client_says_what_the_server_refused_in_mlflows_words(mlflow_server: MlflowServer) -> None:
    """Refusals carry MLflow's error code (what the logger tells apart from an outage); an unreachable server is
    an OSError (an outage, retried)."""
    client = RestClient(mlflow_server.url)
    with pytest.raises(RestError) as missing:
        client.get_run("0" * 32)
    assert missing.value.error_code == "RESOURCE_DOES_NOT_EXIST"
    assert client.get_experiment_by_name("no-such-experiment") is None
    made = client.create_experiment("refusals")
    with pytest.raises(RestError) as twice:
        client.create_experiment("refusals")
    assert twice.value.error_code == "RESOURCE_ALREADY_EXISTS"
    assert client.get_experiment_by_name("refusals").experiment_id == made  # type: ignore[union-attr]
    with pytest.raises(OSError):
        RestClient("http://127.0.0.1:9").get_run("0" * 32)


def test_a_server_that_redirects_never_gets_the_credentials_sent_on(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """An attacker's answer (a tracking server, or whatever answers at its address) redirects a trial's request to
    a host of its choosing: the redirect is not followed, so the trial's MLflow password never reaches that host,
    and the logger takes it as a refusal (no retry storm), not an outage."""
    import http.server
    import threading

    seen: list[str | None] = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    collector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    elsewhere = f"http://127.0.0.1:{collector.server_address[1]}"

    class Redirector(Collector):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", f"{elsewhere}{self.path}")
            self.end_headers()

    redirector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirector)
    for server in (collector, redirector):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "team-a")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "s3cret")
        client = RestClient(f"http://127.0.0.1:{redirector.server_address[1]}")
        with pytest.raises(RestError) as refused:
            client.get_run("0" * 32)
        assert refused.value.error_code == "REDIRECT_NOT_FOLLOWED" and elsewhere in str(refused.value)
        assert seen == []  # urllib's default would have sent `Basic team-a:s3cret` on to `elsewhere`
        logger = MlflowTrialLogger(uri=client.uri, trial_id="t", run_name="t", parent_run_id="0" * 32)
        logger.start()
        logger.log_metrics({"m": 1.0}, 1)
        stats = logger.close()
        assert stats.retries == 0 and seen == [], stats
    finally:
        for server in (collector, redirector):
            server.shutdown()


@pytest.mark.parametrize("where", ["http", "mlflow-artifacts", "file"])
def test_a_run_whose_artifacts_are_elsewhere_gets_no_credentials_and_writes_nothing(
        where: str, mlflow_server: MlflowServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The attack: the experiment a trial logs to was made (by any of the server's users) with an artifact location
    of its maker's choosing, so its runs' artifact URIs point there: another host or port (`http:`, or the artifact
    proxy's `mlflow-artifacts://host:port`), or a local path (`file:`). The REST client handed such a run to
    mlflow's client, which sent the trial's `Authorization: Basic` there, or wrote the path. Now the artifact is
    refused with a reason before any request (by mlflow's client too, where a trial uses it for a server): the
    other host hears nothing, no file is written, and the logger skips the artifact (a refusal, no retries) while
    the run's other records are logged."""
    (tmp_path / "results.json").write_text("{}")
    with hostile_server("collect") as elsewhere:
        port = elsewhere.url.rsplit(":", 1)[1]
        location = {"http": f"{elsewhere.url}/stolen", "mlflow-artifacts": f"mlflow-artifacts://127.0.0.1:{port}/stolen",
                    "file": (tmp_path / "written").as_uri()}[where]
        c = mlflow.tracking.MlflowClient(tracking_uri=mlflow_server.url)
        experiment = c.create_experiment(f"artifacts-elsewhere-{where}", artifact_location=location)
        parent = c.create_run(experiment, run_name="sweep").info.run_id
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "team-a")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "s3cret")
        client = RestClient(mlflow_server.url)
        run = client.create_run(experiment, {}, "direct").info.run_id
        with pytest.raises(RestError) as refused:
            client.log_artifact(run, str(tmp_path / "results.json"))
        assert refused.value.error_code == "ARTIFACTS_ELSEWHERE", refused.value
        assert "is not on the tracking server (http://127.0.0.1:" in str(refused.value)
        with pytest.raises(RestError) as refused_too:  # mlflow's client, as a trial with a client certificate uses
            PackageClient(mlflow_server.url).log_artifact(run, str(tmp_path / "results.json"))
        assert refused_too.value.error_code == "ARTIFACTS_ELSEWHERE", refused_too.value
        logger = MlflowTrialLogger(uri=mlflow_server.url, trial_id=f"t-{where}", run_name="t", parent_run_id=parent)
        logger.start()
        logger.log_params({"batch_size": 16})
        logger.log_artifact(tmp_path / "results.json")
        logger.log_artifact(tmp_path, "outputs")
        stats = logger.close("FINISHED")
        assert elsewhere.seen == [] and not (tmp_path / "written").exists()
    assert stats.retries == 0 and stats.dropped == 2 and stats.pending == 0, stats
    assert c.get_run(str(logger.run_id)).data.params == {"batch_size": "16"}


def test_artifacts_on_the_servers_own_origin_are_sent(mlflow_server: MlflowServer, tmp_path: Path) -> None:
    """An http artifact URI on the tracking server's own scheme, host and port is the server's: the artifact is
    PUT there (here: the server's own artifact proxy, named by its URL)."""
    c = mlflow.tracking.MlflowClient(tracking_uri=mlflow_server.url)
    experiment = c.create_experiment("artifacts-same-origin", artifact_location=(
        f"{mlflow_server.url}/api/2.0/mlflow-artifacts/artifacts/same-origin"))
    run = RestClient(mlflow_server.url).create_run(experiment, {}, "same-origin").info.run_id
    (tmp_path / "results.json").write_text("{}")
    RestClient(mlflow_server.url).log_artifact(run, str(tmp_path / "results.json"), "out")
    assert [a.path for a in c.list_artifacts(run, "out")] == ["out/results.json"]


@pytest.mark.parametrize("mode", ["huge", "drip", "drip-headers"])
def test_an_answer_too_large_or_too_slow_is_cut_off(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tracking server (or whatever answers at its address) answers 200 MB, or drips its answer (body, or
    headers) a byte every 0.2 s: each read is quick, so urllib's per-read timeout never fires and the trial waited
    as long as the server liked, or took the whole body into memory. The trial's client reads at most its cap
    (a refusal, RESPONSE_TOO_LARGE) and waits at most MLFLOW_HTTP_REQUEST_TIMEOUT for the whole request (an
    outage: the logger retries later)."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1.5")
    with hostile_server(mode) as server:
        began = time.monotonic()
        with pytest.raises((RestError, OSError)) as cut:
            RestClient(server.url).get_run("0" * 32)
        took = time.monotonic() - began
    if mode == "huge":
        assert isinstance(cut.value, RestError) and cut.value.error_code == "RESPONSE_TOO_LARGE", cut.value
        assert server.sent < MAX_BODY_BYTES + 32 * 1024 * 1024 < HUGE_BYTES, server.sent  # socket buffers aside
    else:
        assert isinstance(cut.value, TimeoutError) or isinstance(getattr(cut.value, "reason", None), TimeoutError)
        assert took < 1.5 + 2.5, took  # the deadline, and a loaded machine's slack; not the server's 12 s
