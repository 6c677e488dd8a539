"""Kueue beside the kubesweep test control plane: the pinned release's manager, its CRDs and its webhooks.

The manager (``kueue``, built by ``build-tools.sh`` from ``sigs.k8s.io/kueue``) runs as a process on this host,
beside kube-apiserver (like kube-router beside the real node), talking to the API server with the cluster's
kubeconfig. What a cluster administrator installs from the release's manifests is installed from the same module's
``config/components``:

- the CRDs (``crd/bases``), with the conversion webhook the release's kustomization enables on localqueues,
  clusterqueues, cohorts, workloads and multikueueclusters;
- the mutating and validating webhooks (``webhook/manifests.yaml``) of Kueue's own kinds and of ``batch/v1`` Jobs,
  the one integration enabled here (``integrations.frameworks: [batch/job]``); the other frameworks' CRDs are not
  installed, so their webhooks are left out.

The API server reaches the webhooks at ``https://127.0.0.1:<port>`` (a URL client config instead of the
release's Service) with a CA made here (openssl; the manager's internal certificate management is off, since it
issues a certificate for the in-cluster Service name). Kueue manages the Jobs of namespaces labelled
``kubesweep.io/kueue=enabled`` only (``managedJobsNamespaceSelector``, and the same selector on its Job webhooks),
so the other tests' Jobs never pass through it. The manager reads its metrics certificate from a fixed path,
``/etc/kueue/metrics/certs`` (its Deployment mounts a Secret there): the test certificate is written there once.
Logs, certificates, config and pid file go to ``<cluster workdir>/kueue/``; ``stop`` (and the cluster's ``down``)
ends the manager and leaves the CRDs with the cluster.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

NAMESPACE = "kueue-system"
MANAGED_LABEL = "kubesweep.io/kueue"
MANAGED_VALUE = "enabled"
# The CRDs whose conversion webhook the release enables (config/components/crd/kustomization.yaml's patches).
CONVERTED = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")
# Webhooks kept from the release: Kueue's own kinds and batch/v1 Jobs (the one integration enabled).
KEPT_PATHS = ("-kueue-x-k8s-io-", "-batch-v1-job")
# Where the release's manager reads its metrics certificate when its internal certificate management is off (a
# fixed path: its Deployment mounts a Secret there). This host gets the test certificate there once.
METRICS_CERTS = Path("/etc/kueue/metrics/certs")


class KueueError(RuntimeError):
    """Kueue did not come up (its log is in the message)."""


def module_dir(version: str) -> Path:
    """The sigs.k8s.io/kueue module of `version` in Go's module cache (downloaded when missing)."""
    out = subprocess.run(["go", "mod", "download", "-json", f"sigs.k8s.io/kueue@{version}"], capture_output=True,
                         text=True, check=False, env={**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"})
    try:
        info = json.loads(out.stdout)
    except ValueError:
        raise KueueError(f"go mod download sigs.k8s.io/kueue@{version}: {out.stderr.strip()[-500:]}") from None
    if info.get("Error") or not info.get("Dir"):
        raise KueueError(f"go mod download sigs.k8s.io/kueue@{version}: {info.get('Error')}")
    return Path(info["Dir"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Kueue:
    """One Kueue manager for one cluster. `kubectl(*args, input=...)` runs kubectl against that cluster;
    `wait_established(*crds, timeout=...)` waits for CRDs (names, or ``-l SELECTOR``) to be Established."""

    def __init__(self, *, workdir: Path, bins: Path, kubeconfig: Path, version: str,
                 kubectl: Callable[..., subprocess.CompletedProcess[str]],
                 wait_established: Callable[..., None], components: Path | None = None):
        """`components`: the release's ``config/components`` where Go's module cache is not at hand (the GPU node
        brings them packed); by default, the module's."""
        self.components = components
        self.workdir = workdir
        self.bins = bins
        self.kubeconfig = kubeconfig
        self.version = version
        self.kubectl = kubectl
        self.wait_established = wait_established

    @property
    def log_path(self) -> Path:
        return self.workdir / "kueue.log"

    @property
    def pid_path(self) -> Path:
        return self.workdir / "kueue.pid"

    def running(self) -> bool:
        try:
            pid = int(self.pid_path.read_text())
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, ValueError, IndexError):
            return False

    def logs(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- start ---------------------------------------------------------------------------------------

    def start(self, timeout: float = 120) -> None:
        if self.running():
            return
        if not (self.bins / "kueue").is_file():
            raise KueueError(f"no kueue binary in {self.bins}: run tests/cluster/build-tools.sh")
        t0 = time.monotonic()
        source = self.components or module_dir(self.version) / "config" / "components"
        self.workdir.mkdir(parents=True, exist_ok=True)
        ca = self._certificates()
        self._metrics_certificate()
        ports = {"webhook": _free_port(), "health": _free_port(), "metrics": _free_port(),
                 "visibility": _free_port()}
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}))
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                     input=yaml.safe_dump_all(self._crds(source, ca, ports["webhook"])), timeout=120)
        self.wait_established("-l", "app.kubernetes.io/part-of=kubesweep-test-kueue", timeout=90)
        config = self.workdir / "config.yaml"
        config.write_text(yaml.safe_dump(self._config(ports)))
        with self.log_path.open("ab") as out:
            proc = subprocess.Popen(
                [str(self.bins / "kueue"), f"--config={config}", "--feature-gates=VisibilityOnDemand=false",
                 f"--visibility-server-port={ports['visibility']}", "--zap-log-level=info"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                env={**os.environ, "KUBECONFIG": str(self.kubeconfig)})
        self.pid_path.write_text(str(proc.pid))
        self._wait("the Kueue manager to be ready", lambda: self._ready(ports["health"]), timeout)
        # the webhooks go in once their server answers: with failurePolicy Fail, Kueue's own kinds could not be
        # written while it starts
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(self._webhooks(source, ca, ports["webhook"])))
        self._wait("Kueue's webhooks to answer", self._webhooks_answer, 60)
        print(f"[kueue] {self.version} ready in {time.monotonic() - t0:.1f}s (log: {self.log_path})", flush=True)

    def _certificates(self) -> str:
        """A CA and a serving certificate for 127.0.0.1 under workdir/certs; returns the CA (PEM)."""
        certs = self.workdir / "certs"
        if not (certs / "tls.crt").is_file():
            certs.mkdir(parents=True, exist_ok=True)

            def openssl(*args: str) -> None:
                subprocess.run(["openssl", *args], cwd=certs, check=True, capture_output=True, timeout=60)

            openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-subj",
                    "/CN=kubesweep-test-kueue-ca", "-keyout", "ca.key", "-out", "ca.crt")
            openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "tls.key",
                    "-out", "tls.csr")
            (certs / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
            openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                    "-days", "30", "-extfile", "ext.cnf", "-out", "tls.crt")
        return (certs / "ca.crt").read_text()

    def _metrics_certificate(self) -> None:
        if (METRICS_CERTS / "tls.crt").is_file() and (METRICS_CERTS / "tls.key").is_file():
            return
        try:
            METRICS_CERTS.mkdir(parents=True, exist_ok=True)
            for name in ("tls.crt", "tls.key"):
                (METRICS_CERTS / name).write_bytes((self.workdir / "certs" / name).read_bytes())
        except OSError as exc:
            raise KueueError(f"the Kueue manager reads its metrics certificate from {METRICS_CERTS}, which cannot "
                             f"be written here ({exc}); run as root, or put a certificate and key there") from None

    def _client_config(self, ca: str, port: int, path: str) -> dict[str, Any]:
        return {"url": f"https://127.0.0.1:{port}{path}", "caBundle": base64.b64encode(ca.encode()).decode()}

    def _crds(self, source: Path, ca: str, port: int) -> list[dict[str, Any]]:
        crds = []
        for path in sorted((source / "crd" / "bases").glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            crd["metadata"].setdefault("labels", {})["app.kubernetes.io/part-of"] = "kubesweep-test-kueue"
            if crd["spec"]["names"]["plural"] in CONVERTED:
                crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                    "clientConfig": self._client_config(ca, port, "/convert"), "conversionReviewVersions": ["v1"]}}
            crds.append(crd)
        return crds

    def _webhooks(self, source: Path, ca: str, port: int) -> list[dict[str, Any]]:
        configs = []
        for doc in yaml.safe_load_all((source / "webhook" / "manifests.yaml").read_text()):
            if not doc:
                continue
            kept = []
            for hook in doc.get("webhooks") or []:
                path = hook["clientConfig"]["service"]["path"]
                if not any(part in path for part in KEPT_PATHS):
                    continue
                hook["clientConfig"] = self._client_config(ca, port, path)
                if "-batch-v1-job" in path:
                    hook["namespaceSelector"] = {"matchLabels": {MANAGED_LABEL: MANAGED_VALUE}}
                kept.append(hook)
            doc["metadata"]["name"] = f"kueue-{doc['metadata']['name']}"
            doc["webhooks"] = kept
            configs.append(doc)
        return configs

    def _config(self, ports: dict[str, int]) -> dict[str, Any]:
        return {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration", "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['health']}"},
            "metrics": {"bindAddress": f"127.0.0.1:{ports['metrics']}"},
            "webhook": {"port": ports["webhook"], "host": "127.0.0.1", "certDir": str(self.workdir / "certs")},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "manageJobsWithoutQueueName": False,
            "managedJobsNamespaceSelector": {"matchLabels": {MANAGED_LABEL: MANAGED_VALUE}},
            "integrations": {"frameworks": ["batch/job"]},
            "clientConnection": {"qps": 50, "burst": 100},
        }

    def _ready(self, port: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def _webhooks_answer(self) -> bool:
        """A dry-run ResourceFlavor passes Kueue's defaulting webhook (so the API server reaches it)."""
        flavor = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                  "metadata": {"name": "kubesweep-webhook-probe"}}
        return self.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(flavor),
                            check=False).returncode == 0

    def _wait(self, what: str, fn: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                raise KueueError(f"the Kueue manager exited while waiting for {what}:\n{self.logs()}")
            if fn():
                return
            time.sleep(0.5)
        raise KueueError(f"timed out after {timeout:.0f}s waiting for {what}:\n{self.logs()}")

    # -- stop ----------------------------------------------------------------------------------------

    def stop(self) -> None:
        """End the manager; its API objects (CRDs, webhook configurations, queues) go with the cluster."""
        if self.running():
            pid = int(self.pid_path.read_text())
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 20
            while self.running() and time.monotonic() < deadline:
                time.sleep(0.2)
            if self.running():
                os.kill(pid, signal.SIGKILL)
        self.pid_path.unlink(missing_ok=True)

