"""The chart's MLflow UI as a namespace's user sees it, from a copy of the server's store (a GPU machine has no
browser): the store `bench/gpu_cluster.py matrix` packs (`mlflow-store.tgz`: the runs' sqlite, their artifacts and
the auth database) served here by `mlflow server --app-name basic-auth` with the chart's auth settings (every
authenticated user reads, `default_permission = READ`), then the sweep's runs view (the link `sweep ui` and the
report give for a server) opened in headless Chromium at 1,400 px with that user's credentials.

    python bench/mlflow_view_shot.py --store OUT/mlflow-store.tgz --experiment ml-team/bert-gpu-matrix \\
        --user kubesweep-ns-ml-team --out bench/results/gpu_cluster-h100-b/mlflow-runs-view-1400.png

The user's password lives as a hash in the copied auth database and the chart's Secret stays on the cluster: the
copy's hash of that user (and the admin's) is replaced with one of a password made here, so the same user, with
the same permissions, signs in. Nothing else of the store changes.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import secrets
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from werkzeug.security import generate_password_hash

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubesweep.tracking.view import runs_url  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
AUTH_INI = """[mlflow]
default_permission = READ
database_uri = sqlite:///{db}
admin_username = admin
admin_password = {admin}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
"""


def serve(store: Path, port: int, admin: str) -> subprocess.Popen[bytes]:
    ini = store / "basic_auth.ini"
    ini.write_text(AUTH_INI.format(db=store / "basic_auth.db", admin=admin))
    env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(ini), "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16)}
    mlflow = Path(sys.executable).with_name("mlflow")
    return subprocess.Popen([str(mlflow), "server", "--app-name", "basic-auth", "--host", "127.0.0.1", "--port",
                             str(port), "--workers", "1", "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
                             "--artifacts-destination", str(store / "artifacts")],
                            env=env, stdout=(store / "server.log").open("wb"), stderr=subprocess.STDOUT)


def experiment_id(url: str, name: str, auth: str) -> str:
    request = urllib.request.Request(f"{url}/api/2.0/mlflow/experiments/get-by-name?"
                                     f"{urllib.parse.urlencode({'experiment_name': name})}",
                                     headers={"Authorization": auth})
    with urllib.request.urlopen(request, timeout=30) as response:
        return str(json.loads(response.read())["experiment"]["experiment_id"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", type=Path, required=True, help="the server's store as `matrix` packs it (.tgz)")
    p.add_argument("--experiment", required=True, help="the sweep's experiment (<namespace>/<experiment>)")
    p.add_argument("--user", required=True, help="the namespace's MLflow user")
    p.add_argument("--out", type=Path, required=True, help="the screenshot (.png)")
    p.add_argument("--width", type=int, default=1400)
    p.add_argument("--height", type=int, default=900)
    p.add_argument("--port", type=int, default=5097)
    args = p.parse_args(argv)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="mlflow-shot-") as tmp:
        store = Path(tmp)
        with tarfile.open(args.store) as tar:
            tar.extractall(store, filter="data")
        password, admin = secrets.token_urlsafe(12), secrets.token_urlsafe(12)
        with sqlite3.connect(store / "basic_auth.db") as db:
            for name, secret in ((args.user, password), ("admin", admin)):
                if not db.execute("UPDATE users SET password_hash = ? WHERE username = ?",
                                  (generate_password_hash(secret), name)).rowcount:
                    sys.exit(f"error: the store's auth database has no user {name!r}")
        server = serve(store, args.port, admin)
        url = f"http://127.0.0.1:{args.port}"
        auth = "Basic " + base64.b64encode(f"{args.user}:{password}".encode()).decode()
        try:
            deadline = time.monotonic() + 90
            while True:
                try:
                    exp = experiment_id(url, args.experiment, auth)
                    break
                except OSError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        sys.exit(f"error: the server did not answer: {(store / 'server.log').read_text()[-2000:]}")
                    time.sleep(1)
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=["--no-sandbox", "--disable-gpu"])
                context = browser.new_context(viewport={"width": args.width, "height": args.height},
                                              extra_http_headers={"Authorization": auth})
                page = context.new_page()
                page.set_default_timeout(60_000)
                page.goto(runs_url(url, exp))
                page.get_by_text(re.compile(r"^[1-9][0-9]* matching runs")).first.wait_for()
                page.locator(".ag-row").first.wait_for()
                page.wait_for_timeout(2000)
                close = page.locator("[data-component-id='mlflow.assistant.chat_panel.close']")
                if close.count():
                    close.first.click()
                    page.wait_for_timeout(500)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(args.out))
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=30)
    print(f"wrote {args.out} ({args.experiment} as {args.user}, {args.width} x {args.height})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
