"""A real GPU node: a one-machine Kubernetes cluster whose node advertises its NVIDIA GPU through the device plugin.

It runs on a bare GPU machine from what `bench/gpu_node.py pack` brings to it (standard library only, Python ≥ 3.11):

- the control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) on 127.0.0.1, certificates
  made with openssl on the spot;
- containerd 2.x with its runc shim and a static runc, CDI enabled (the device plugin's spec in /var/run/cdi);
- the pod network: one bridge (``BRIDGE``) with ``POD_CIDR``; pods reach the node's processes at the bridge's
  address, ``NODE_GATEWAY``;
- Services: kube-proxy in nftables mode (the machine has nf_tables but no iptables binaries): the ``nft`` it runs
  is Debian's, unpacked from the packs' ``.deb`` files with ``dpkg-deb -x`` into ``nft/`` and run with its libraries
  on ``LD_LIBRARY_PATH``. Service traffic is masqueraded (``masqueradeAll``), so a pod reaching a Service whose
  endpoint is a pod on the same bridge gets its replies through the node. The API server listens on every address
  of the node (its certificate names the ``kubernetes`` Service's address, ``SERVICE_IP``), so pods reach it
  through that Service as in-cluster clients do (the chart's operator);
- the kubelet (cgroupfs driver; cgroup v2), with the cluster's DNS at the bridge's gateway: CoreDNS as a host process
  answers for ``cluster.local`` from the API (a multi-node trial's pods find pod 0 of their Indexed Job by name
  under its headless Service), and for nothing else;
- NVIDIA's k8s-device-plugin as a host process in CDI mode (``--device-list-strategy=cdi-cri``): it advertises
  ``nvidia.com/gpu`` to the kubelet and writes the CDI spec that gives a container the GPU's device nodes and the
  driver's libraries; its hooks are ``nvidia-cdi-hook``;
- GPU Feature Discovery run once (``--oneshot``): its label file, ``nvidia.com/gpu.product`` among them, is put on
  the node (GFD's own DaemonSet hands the file to Node Feature Discovery, which is not run here).

`image` assembles the job image from the machine's own PyTorch-CUDA userland (no registry is reachable): the base
(the system's /usr and Python, the PyTorch virtual environment's distributions that kubesweep's `job` and `tracking`
extras need), then the wheels brought along (kubesweep's other dependencies, then kubesweep itself), as
`images/job/Containerfile` layers them; written as an OCI archive, imported into containerd and referenced by
digest.

    python3 tests/cluster/gpu_node.py up --pack DIR ...   # node Ready, nvidia.com/gpu advertised
    python3 tests/cluster/gpu_node.py image --wheels DIR  # prints the image reference by digest
    python3 tests/cluster/gpu_node.py down
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata as metadata
import json
import lzma
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NODE_NAME = "gpu-node-0"
ROOT = Path(os.environ.get("KUBESWEEP_GPU_NODE_ROOT", "/opt/kubesweep-node"))
BRIDGE = "ksw0"
POD_CIDR = "10.89.0.0/24"
NODE_GATEWAY = "10.89.0.1"
SERVICE_CIDR = "10.89.128.0/24"
SERVICE_IP = "10.89.128.1"  # the `kubernetes` Service: the first address of SERVICE_CIDR
API_PORT = 6443
K8S_NAMESPACE = "k8s.io"
PAUSE_IMAGE = "localhost/kubesweep/pause:gpu-node"
JOB_IMAGE = "localhost/kubesweep/kubesweep-job"
CDI_DIR = Path("/var/run/cdi")
GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
NODE_LABEL = "kubesweep.io/gpu-node"
# The order they start in; `down` stops them in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "coredns", "containerd",
              "kubelet", "kube-proxy", "nvidia-device-plugin")
CLUSTER_DOMAIN = "cluster.local"
# What the driver puts on a CUDA image's library path (NVIDIA's own CUDA images set the same).
DRIVER_LIBRARY_PATH = "/usr/local/nvidia/lib64:/usr/local/nvidia/lib"
# The device plugin finds the driver's libraries through the linker cache (or the distributions' library
# directories); a driver installed under DRIVER_LIBRARY_PATH is registered there, as a driver installer does.
LD_SO_CONF = Path("/etc/ld.so.conf.d/kubesweep-nvidia-driver.conf")


# kubesweep's extras in the assembled image: the job's and tracking's, and k8s (kopf, the Kubernetes client) so that
# the same image serves the chart's operator and MLflow server on the node (`bench/gpu_cluster.py`).
IMAGE_EXTRAS = ("job", "tracking", "k8s")


class GpuNodeError(RuntimeError):
    pass


def log(msg: str) -> None:
    print(f"[gpu-node {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], *, check: bool = True, timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kw)
    if check and proc.returncode != 0:
        raise GpuNodeError(f"{' '.join(cmd[:3])} ... exited {proc.returncode}: {(proc.stderr or proc.stdout)[-2000:]}")
    return proc


# --------------------------------------------------------------------------------------------- labels
def gfd_product(nvml_name: str) -> str:
    """GPU Feature Discovery's `nvidia.com/gpu.product` value for an NVML device name: its words joined by '-'."""
    return "-".join(nvml_name.split())


def parse_gfd_labels(text: str) -> dict[str, str]:
    """GFD's output file (one `key=value` per line) as labels; only its `nvidia.com/` labels are kept."""
    labels: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key.startswith("nvidia.com/"):
            labels[key] = value
    return labels


# --------------------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class Layout:
    """Where the node keeps its files under one root."""

    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def config(self) -> Path:
        return self.root / "config"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def containerd_socket(self) -> Path:
        return self.run / "containerd.sock"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.config / "admin.kubeconfig"

    def server(self) -> str:
        return f"https://127.0.0.1:{API_PORT}"


def node_ip() -> str:
    """The first IPv4 address of a non-loopback interface (the API server advertises it), else 127.0.0.1."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            if name == "lo" or name.startswith(("veth", BRIDGE)):
                continue
            with contextlib.suppress(OSError):
                packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
                return socket.inet_ntoa(packed[20:24])
    return "127.0.0.1"


def kubeconfig(layout: Layout, user: str, cert: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "gpu-node",
        "clusters": [{"name": "gpu-node", "cluster": {"server": layout.server(),
                                                      "certificate-authority": str(layout.pki / "ca.crt")}}],
        "users": [{"name": user, "user": {"client-certificate": str(layout.pki / f"{cert}.crt"),
                                          "client-key": str(layout.pki / f"{cert}.key")}}],
        "contexts": [{"name": "gpu-node", "context": {"cluster": "gpu-node", "user": user}}],
    }


def cni_conflist(layout: Layout) -> dict[str, Any]:
    """One bridge, no masquerade: pods reach each other and the node (NODE_GATEWAY), nothing beyond."""
    return {"cniVersion": "1.0.0", "name": "kubesweep-gpu", "plugins": [
        {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
         "ipam": {"type": "host-local", "dataDir": str(layout.root / "cni-state"),
                  "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_GATEWAY}]],
                  # Services through the node (kube-proxy's rules), as the pod subnet; no default route
                  "routes": [{"dst": SERVICE_CIDR, "gw": NODE_GATEWAY}]}}]}


def containerd_config(layout: Layout) -> str:
    cri = 'plugins."io.containerd.cri.v1.runtime"'
    return f"""\
version = 3
root = "{layout.root / 'containerd'}"
state = "{layout.run / 'containerd-state'}"

[grpc]
  address = "{layout.containerd_socket}"

[ttrpc]
  address = "{layout.run / 'containerd.sock.ttrpc'}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"

[{cri}]
  enable_cdi = true
  restrict_oom_score_adj = {str(restrict_oom_score_adj()).lower()}
  cdi_spec_dirs = ["/etc/cdi", "{CDI_DIR}"]
  [{cri}.containerd]
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "{layout.bin / 'runc'}"
        SystemdCgroup = false
  [{cri}.cni]
    bin_dirs = ["{layout.bin / 'cni'}"]
    conf_dir = "{layout.config / 'cni'}"
"""


CAP_SYS_RESOURCE = 24


def restrict_oom_score_adj(status: Path = Path("/proc/self/status")) -> bool:
    """Whether containerd must keep pods' OOM score adjustments at or above its own: without CAP_SYS_RESOURCE
    (a VM's root may lack it) lowering one is refused, and the kubelet asks -998 for every pod sandbox."""
    for line in status.read_text().splitlines():
        if line.startswith("CapEff:"):
            return not int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1
    return False


def kubelet_config(layout: Layout) -> dict[str, Any]:
    """The kubelet: cgroupfs (no systemd on the machine), client certificates checked against the node's CA; the
    kubelet's API authorizes every authenticated caller (only the API server holds a client certificate)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "readOnlyPort": 0, "healthzBindAddress": "127.0.0.1",
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(layout.pki / "ca.crt")}},
        "authorization": {"mode": "AlwaysAllow"},
        "cgroupDriver": "cgroupfs", "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "resolvConf": str(layout.config / "resolv.conf"),
        "podCIDR": POD_CIDR, "maxPods": 30, "serializeImagePulls": False,
        "clusterDNS": [NODE_GATEWAY], "clusterDomain": CLUSTER_DOMAIN,  # pods route to the bridge alone
        # the job image is imported, not pulled (no registry is reachable), and may come after the kubelet
        # started: no pull may be asked of it to verify credentials that no image here has
        "imagePullCredentialsVerificationPolicy": "NeverVerify",
        "evictionHard": {"memory.available": "500Mi", "nodefs.available": "2%", "imagefs.available": "2%"},
        "imageGCHighThresholdPercent": 99, "imageGCLowThresholdPercent": 98,
        "nodeStatusReportFrequency": "10s", "nodeStatusUpdateFrequency": "5s",
        "rotateCertificates": False, "serverTLSBootstrap": False,
    }


def corefile(layout: Layout) -> str:
    """CoreDNS for the cluster's names alone, read from the API with the admin's kubeconfig; no forwarding."""
    return f"""\
{CLUSTER_DOMAIN}:53 {{
    errors
    kubernetes {CLUSTER_DOMAIN} {{
        kubeconfig {layout.admin_kubeconfig}
        pods insecure
        ttl 5
    }}
    cache 5
}}
"""


def kube_proxy_config(layout: Layout) -> dict[str, Any]:
    """kube-proxy in nftables mode; every Service connection masqueraded (pods on one bridge, no hairpin trouble);
    conntrack's sysctls left as the machine has them."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "mode": "nftables", "clusterCIDR": POD_CIDR, "hostnameOverride": NODE_NAME,
        "healthzBindAddress": "127.0.0.1:10256", "metricsBindAddress": "127.0.0.1:10249",
        "clientConnection": {"kubeconfig": str(layout.admin_kubeconfig)},
        "nftables": {"masqueradeAll": True}, "oomScoreAdj": 0,
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


def nft_env(layout: Layout, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that finds Debian's `nft` (unpacked under nft/) and its libraries."""
    env = dict(os.environ if base is None else base)
    root = layout.root / "nft"
    env["PATH"] = f"{root / 'usr/sbin'}:{root / 'usr/bin'}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
    libs = [str(p) for p in (root / "usr/lib/x86_64-linux-gnu", root / "lib/x86_64-linux-gnu") if p.is_dir()]
    env["LD_LIBRARY_PATH"] = ":".join([*libs, *filter(None, [env.get("LD_LIBRARY_PATH")])])
    return env


def component_commands(layout: Layout) -> dict[str, list[str]]:
    b, pki, cfg = layout.bin, layout.pki, layout.config
    admin = str(layout.admin_kubeconfig)
    return {
        "etcd": [str(b / "etcd"), "--data-dir", str(layout.root / "etcd"), "--name", NODE_NAME,
                 "--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
                 "--listen-peer-urls", "http://127.0.0.1:2380",
                 "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
                 "--initial-cluster", f"{NODE_NAME}=http://127.0.0.1:2380", "--log-level", "warn"],
        "kube-apiserver": [
            str(b / "kube-apiserver"), "--etcd-servers", "http://127.0.0.1:2379",
            "--bind-address", "0.0.0.0", "--advertise-address", node_ip(), "--secure-port", str(API_PORT),
            "--tls-cert-file", str(pki / "apiserver.crt"), "--tls-private-key-file", str(pki / "apiserver.key"),
            "--client-ca-file", str(pki / "ca.crt"),
            "--kubelet-client-certificate", str(pki / "admin.crt"), "--kubelet-client-key", str(pki / "admin.key"),
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-account-key-file", str(pki / "sa.pub"),
            "--service-account-signing-key-file", str(pki / "sa.key"),
            "--service-cluster-ip-range", SERVICE_CIDR, "--authorization-mode", "Node,RBAC",
            "--enable-admission-plugins", "NodeRestriction",
            # logs and exec reach the kubelet at the node's address: its name resolves nowhere (no DNS here)
            "--kubelet-preferred-address-types", "InternalIP"],
        "kube-controller-manager": [
            str(b / "kube-controller-manager"), "--kubeconfig", admin, "--leader-elect=false",
            "--service-account-private-key-file", str(pki / "sa.key"), "--root-ca-file", str(pki / "ca.crt"),
            "--use-service-account-credentials=false", "--bind-address", "127.0.0.1",
            "--kube-api-qps", "200", "--kube-api-burst", "400"],
        "kube-scheduler": [str(b / "kube-scheduler"), "--kubeconfig", admin, "--leader-elect=false",
                           "--bind-address", "127.0.0.1"],
        "coredns": [str(b / "coredns"), "-conf", str(cfg / "Corefile")],
        "containerd": [str(b / "containerd"), "--config", str(cfg / "containerd.toml")],
        "kubelet": [str(b / "kubelet"), "--config", str(cfg / "kubelet.json"),
                    "--kubeconfig", str(cfg / "kubelet.kubeconfig"), "--hostname-override", NODE_NAME,
                    "--node-ip", node_ip(),
                    "--node-labels", f"{NODE_LABEL}=true"],
        "kube-proxy": [str(b / "kube-proxy"), f"--config={cfg / 'kube-proxy.json'}"],
        "nvidia-device-plugin": [str(b / "nvidia-device-plugin"), "--device-list-strategy", "cdi-cri",
                                 "--nvidia-cdi-hook-path", str(b / "nvidia-cdi-hook"), "--driver-root", "/",
                                 # a host process: it sees the driver where it is, not under /driver-root
                                 "--container-driver-root", "/", "--fail-on-init-error=true"],
    }


# --------------------------------------------------------------------------------------------- API client
class Api:
    """The API server over HTTPS with the admin's client certificate (standard library only)."""

    def __init__(self, layout: Layout) -> None:
        self.base = layout.server()
        self.ctx = ssl.create_default_context(cafile=str(layout.pki / "ca.crt"))
        self.ctx.load_cert_chain(str(layout.pki / "admin.crt"), str(layout.pki / "admin.key"))

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": content_type, "Accept": "application/json"})
        with urllib.request.urlopen(req, context=self.ctx, timeout=15) as resp:
            return json.loads(resp.read() or b"null")

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def text(self, path: str) -> str:
        """A GET whose answer is text (a pod's log)."""
        req = urllib.request.Request(self.base + path, method="GET")
        with urllib.request.urlopen(req, context=self.ctx, timeout=30) as resp:
            return str(resp.read().decode("utf-8", errors="replace"))

    def apply(self, obj: dict[str, Any], *, dry_run: bool = False) -> Any:
        """Server-side apply of one object (as `kubectl apply --server-side --force-conflicts`)."""
        query = "fieldManager=kubesweep-gpu-node&force=true" + ("&dryRun=All" if dry_run else "")
        return self.call("PATCH", f"{object_path(obj)}?{query}", obj, "application/apply-patch+yaml")

    def node(self) -> dict[str, Any] | None:
        try:
            return dict(self.get(f"/api/v1/nodes/{NODE_NAME}"))
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def label_node(self, labels: dict[str, str]) -> None:
        self.call("PATCH", f"/api/v1/nodes/{NODE_NAME}", {"metadata": {"labels": labels}},
                  "application/merge-patch+json")


# The plural of each kind `Api.apply` writes (what discovery would say), and whether it is namespaced.
KINDS = {"Namespace": ("namespaces", False), "PersistentVolume": ("persistentvolumes", False),
         "PersistentVolumeClaim": ("persistentvolumeclaims", True), "Secret": ("secrets", True),
         "CustomResourceDefinition": ("customresourcedefinitions", False),
         "MutatingWebhookConfiguration": ("mutatingwebhookconfigurations", False),
         "ValidatingWebhookConfiguration": ("validatingwebhookconfigurations", False),
         "ResourceFlavor": ("resourceflavors", False), "ClusterQueue": ("clusterqueues", False),
         "LocalQueue": ("localqueues", True), "WorkloadPriorityClass": ("workloadpriorityclasses", False)}


def object_path(obj: dict[str, Any]) -> str:
    plural, namespaced = KINDS[obj["kind"]]
    api_version = obj["apiVersion"]
    prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    ns = f"/namespaces/{obj['metadata']['namespace']}" if namespaced else ""
    return f"{prefix}{ns}/{plural}/{obj['metadata']['name']}"


def node_ready(node: dict[str, Any] | None) -> bool:
    conds = {c["type"]: c["status"] for c in (node or {}).get("status", {}).get("conditions", [])}
    return conds.get("Ready") == "True"


def gpus_allocatable(node: dict[str, Any] | None) -> int:
    return int((node or {}).get("status", {}).get("allocatable", {}).get(GPU_RESOURCE, "0"))


# --------------------------------------------------------------------------------------------- the node
class GpuNode:
    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    # ---- processes
    def pid_path(self, component: str) -> Path:
        return self.layout.run / f"{component}.pid"

    def alive(self, component: str) -> bool:
        try:
            pid = int(self.pid_path(component).read_text())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return False
        return True

    def spawn(self, component: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        if self.alive(component):
            return
        log_file = (self.layout.logs / f"{component}.log").open("ab")
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
        self.pid_path(component).write_text(str(proc.pid))

    def wait(self, what: str, fn: Callable[[], bool], timeout: float, component: str | None = None) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if fn():
                took = time.monotonic() - t0
                log(f"{what} ({took:.1f}s)")
                return took
            if component and not self.alive(component):
                raise GpuNodeError(f"{component} exited; its log ends:\n{self.tail(component)}")
            time.sleep(0.25)
        raise GpuNodeError(f"timed out after {timeout:.0f}s waiting for {what}\n{self.tail(component or 'kubelet')}")

    def tail(self, component: str, lines: int = 30) -> str:
        path = self.layout.logs / f"{component}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"

    # ---- set-up
    def unpack(self, packs: list[Path]) -> None:
        """The binaries `bench/gpu_node.py pack` compressed (`*.xz`), into bin/ (CNI plugins into bin/cni)."""
        self.layout.bin.mkdir(parents=True, exist_ok=True)
        (self.layout.bin / "cni").mkdir(exist_ok=True)
        for pack in packs:
            self._unpack(pack)

    def _unpack(self, pack: Path) -> None:
        for deb in sorted(pack.glob("*.deb")):  # Debian's nft and its libraries (kube-proxy's nftables mode)
            run(["dpkg-deb", "-x", str(deb), str(self.layout.root / "nft")])
        for archive in pack.glob("kueue-components.tar.xz"):  # Kueue's release manifests (`bench/gpu_cluster.py`)
            (self.layout.root / "kueue").mkdir(exist_ok=True)
            run(["tar", "-C", str(self.layout.root / "kueue"), "-xJf", str(archive)])
        manifest = json.loads((pack / "manifest.json").read_text())
        for name, where in manifest["binaries"].items():
            dest = self.layout.bin / where / name if where else self.layout.bin / name
            if dest.exists():
                continue
            with lzma.open(pack / f"{name}.xz") as src, dest.open("wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            dest.chmod(0o755)

    def certificates(self) -> None:
        pki = self.layout.pki
        if (pki / "admin.crt").exists():
            return
        pki.mkdir(parents=True, exist_ok=True)
        run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(pki / "ca.key"),
             "-out", str(pki / "ca.crt"), "-days", "7", "-subj", "/CN=kubesweep-gpu-node-ca"])
        for name, subject, ext in (
            ("apiserver", "/CN=kube-apiserver",
             "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,"
             f"DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.{CLUSTER_DOMAIN},"
             f"IP:{SERVICE_IP},IP:{node_ip()}"),
            ("admin", "/O=system:masters/CN=kubesweep-admin", "extendedKeyUsage=clientAuth"),
            ("kubelet", f"/O=system:nodes/CN=system:node:{NODE_NAME}", "extendedKeyUsage=clientAuth"),
        ):
            (pki / f"{name}.ext").write_text(ext + "\n")
            run(["openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", str(pki / f"{name}.key"),
                 "-out", str(pki / f"{name}.csr"), "-subj", subject])
            run(["openssl", "x509", "-req", "-in", str(pki / f"{name}.csr"), "-CA", str(pki / "ca.crt"),
                 "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-out", str(pki / f"{name}.crt"), "-days", "7",
                 "-extfile", str(pki / f"{name}.ext")])
        run(["openssl", "genrsa", "-out", str(pki / "sa.key"), "2048"])
        run(["openssl", "rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub")])

    def write_configs(self) -> None:
        cfg = self.layout.config
        (cfg / "cni").mkdir(parents=True, exist_ok=True)
        (cfg / "cni" / "10-kubesweep-gpu.conflist").write_text(json.dumps(cni_conflist(self.layout), indent=2))
        (cfg / "containerd.toml").write_text(containerd_config(self.layout))
        (cfg / "kubelet.json").write_text(json.dumps(kubelet_config(self.layout), indent=2))
        (cfg / "resolv.conf").write_text("# no upstream nameserver: pods ask the cluster's DNS (clusterDNS) alone\n")
        (cfg / "Corefile").write_text(corefile(self.layout))
        proxy = cfg / "kube-proxy.json"  # kube-proxy exits when its configuration file is written to
        text = json.dumps(kube_proxy_config(self.layout), indent=2)
        if not proxy.exists() or proxy.read_text() != text:
            proxy.write_text(text)
        self.layout.admin_kubeconfig.write_text(json.dumps(kubeconfig(self.layout, "kubesweep-admin", "admin")))
        (cfg / "kubelet.kubeconfig").write_text(json.dumps(kubeconfig(self.layout, f"system:node:{NODE_NAME}",
                                                                      "kubelet")))

    def ctr(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return run([str(self.layout.bin / "ctr"), "--address", str(self.layout.containerd_socket),
                    "--namespace", K8S_NAMESPACE, *args], timeout=timeout)

    def import_pause(self) -> None:
        archive = self.layout.config / "pause.oci.tar"
        layer = self.layout.config / "pause.layer.tar"
        with tarfile.open(layer, "w", format=tarfile.PAX_FORMAT) as tar:
            info = tar.gettarinfo(str(self.layout.bin / "pause"), arcname="pause")
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            with (self.layout.bin / "pause").open("rb") as f:
                tar.addfile(info, f)
        write_oci_archive(archive, PAUSE_IMAGE, [layer], {"Entrypoint": ["/pause"], "User": "65535:65535"})
        self.ctr("images", "import", "--snapshotter", "overlayfs", str(archive))

    def up(self, packs: list[Path], timeout: float = 240, gpu: bool = True) -> dict[str, float]:
        """Bring the node up from `packs`; returns seconds per phase. Idempotent: what runs is left running.
        `gpu=False` stops before the device plugin (the node without its GPU, for a machine that has none)."""
        t0 = time.monotonic()
        times: dict[str, float] = {}
        for d in (self.layout.logs, self.layout.run, self.layout.config):
            d.mkdir(parents=True, exist_ok=True)
        self.unpack(packs)
        times["unpack"] = time.monotonic() - t0
        self.certificates()
        self.write_configs()
        with contextlib.suppress(OSError):
            Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
        cmds = component_commands(self.layout)
        api = Api(self.layout)
        self.spawn("etcd", cmds["etcd"])
        self.spawn("containerd", cmds["containerd"])
        self.spawn("kube-apiserver", cmds["kube-apiserver"])
        self.wait("API server ready", lambda: _healthy(api), timeout, "kube-apiserver")
        for c in ("kube-controller-manager", "kube-scheduler", "coredns"):
            self.spawn(c, cmds[c])
        self.wait("containerd ready", self.layout.containerd_socket.exists, timeout, "containerd")
        self.import_pause()
        self.spawn("kubelet", cmds["kubelet"])
        self.wait("node Ready", lambda: node_ready(api.node()), timeout, "kubelet")
        times["node_ready"] = time.monotonic() - t0  # seconds from the start, as every phase here
        self.spawn("kube-proxy", cmds["kube-proxy"], env=nft_env(self.layout))
        self.wait("kube-proxy's nftables rules", self._proxy_synced, timeout, "kube-proxy")
        times["service_proxy"] = time.monotonic() - t0
        if not gpu:
            return times
        register_driver_libraries()
        self.spawn("nvidia-device-plugin", cmds["nvidia-device-plugin"])
        self.wait("nvidia.com/gpu advertised by the device plugin", lambda: self._plugin_started(api), timeout,
                  "nvidia-device-plugin")
        labels = self.feature_discovery()
        api.label_node(labels)
        log(f"labels from GPU Feature Discovery: {PRODUCT_LABEL}={labels.get(PRODUCT_LABEL)}")
        times["gpu_advertised"] = time.monotonic() - t0
        return times

    def _proxy_synced(self) -> bool:
        """kube-proxy has written its rules: its healthz says `healthy` (the status code also weighs whether the
        node is eligible for load balancers' health checks, which does not matter here)."""
        try:
            with urllib.request.urlopen("http://127.0.0.1:10256/healthz", timeout=2) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:
            body = exc.read()
        except OSError:
            return False
        try:
            return json.loads(body).get("healthy") is True
        except ValueError:
            return False

    def _plugin_started(self, api: Api) -> bool:
        """The GPU is advertised; a plugin that logged it cannot start (it retries forever) is an error now."""
        if gpus_allocatable(api.node()) > 0:
            return True
        log_text = self.tail("nvidia-device-plugin", 200)
        if PLUGIN_FAILED in log_text:
            raise GpuNodeError(f"the device plugin cannot start; its log ends:\n{log_text[-3000:]}")
        return False

    def feature_discovery(self) -> dict[str, str]:
        out = self.layout.run / "gfd-labels"
        proc = run([str(self.layout.bin / "gpu-feature-discovery"), "--oneshot", "--no-timestamp",
                    "--output-file", str(out), "--mig-strategy", "none",
                    "--use-node-feature-api=false"],  # the label file alone: no NodeFeature object, no API client
                   check=False, timeout=120)
        (self.layout.logs / "gpu-feature-discovery.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0 or not out.exists():
            raise GpuNodeError(f"gpu-feature-discovery exited {proc.returncode}: {proc.stderr[-2000:]}")
        labels = parse_gfd_labels(out.read_text())
        if PRODUCT_LABEL not in labels:
            raise GpuNodeError(f"gpu-feature-discovery wrote no {PRODUCT_LABEL}: {out.read_text()[:2000]}")
        return labels

    def down(self) -> None:
        for component in reversed(COMPONENTS):
            with contextlib.suppress(OSError, ValueError):
                pid = int(self.pid_path(component).read_text())
                os.killpg(pid, signal.SIGTERM)
        time.sleep(2)
        for component in reversed(COMPONENTS):
            with contextlib.suppress(OSError, ValueError):
                os.killpg(int(self.pid_path(component).read_text()), signal.SIGKILL)


PLUGIN_FAILED = "error starting plugins"  # what the device plugin logs before it waits to retry


def driver_library_dirs(paths: str = DRIVER_LIBRARY_PATH) -> list[str]:
    """The directories of `paths` that hold the driver's libcuda.so.1."""
    return [d for d in paths.split(":") if d and (Path(d) / "libcuda.so.1").exists()]


def register_driver_libraries(conf: Path = LD_SO_CONF) -> list[str]:
    """Register the driver's library directories in the linker cache (`ldconfig`, links left as they are: the
    driver's directory may be read-only) unless the cache already lists libcuda.so.1; returns what was added."""
    if "libcuda.so.1 " in run(["ldconfig", "-p"], check=False).stdout:
        return []
    dirs = driver_library_dirs()
    if not dirs:
        raise GpuNodeError(f"no libcuda.so.1 in the linker cache or in {DRIVER_LIBRARY_PATH}: is the driver there?")
    conf.write_text("".join(f"{d}\n" for d in dirs))
    run(["ldconfig", "-X"])
    log(f"driver libraries registered with the linker cache: {', '.join(dirs)}")
    return dirs


def _healthy(api: Api) -> bool:
    try:
        req = urllib.request.Request(api.base + "/readyz")
        with urllib.request.urlopen(req, context=api.ctx, timeout=5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


# --------------------------------------------------------------------------------------------- the job image
def write_oci_archive(path: Path, name: str, layers: list[Path], config: dict[str, Any],
                      labels: dict[str, str] | None = None) -> str:
    """An OCI image archive (what `ctr images import` reads) of uncompressed layer tars; the manifest digest.

    Layers are hashed once as they are copied into the archive, so a layer of gigabytes is read twice at most."""
    diff_ids: list[str] = []
    layer_descs: list[dict[str, Any]] = []
    with tarfile.open(path, "w") as out:
        for layer in layers:
            digest = _sha256_file(layer)
            diff_ids.append(digest)
            layer_descs.append({"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest,
                                "size": layer.stat().st_size})
            out.add(str(layer), arcname=f"blobs/sha256/{digest.split(':', 1)[1]}")
        image_config = {"architecture": "amd64", "os": "linux",
                        "config": {**config, **({"Labels": labels} if labels else {})},
                        "rootfs": {"type": "layers", "diff_ids": diff_ids}}
        config_blob = json.dumps(image_config, sort_keys=True).encode()
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": _add_blob(out, config_blob, "application/vnd.oci.image.config.v1+json"),
                    "layers": layer_descs}
        manifest_desc = _add_blob(out, json.dumps(manifest, sort_keys=True).encode(), manifest["mediaType"])
        tagged = ":" in name.rsplit("/", 1)[-1]
        repository, ref = name.rsplit(":", 1) if tagged else (name, "latest")
        # Named by tag and by digest: the kubelet asks the runtime for `repository@digest`, and containerd's CRI
        # finds an image by one of its names only (a pull by digest names it so; an import must too).
        index = {"schemaVersion": 2, "manifests": [
            {**manifest_desc, "annotations": {"io.containerd.image.name": name,
                                              "org.opencontainers.image.ref.name": ref}},
            {**manifest_desc, "annotations": {"io.containerd.image.name": f"{repository}@{manifest_desc['digest']}"}}]}
        for member, data in (("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
                             ("index.json", json.dumps(index).encode())):
            _add_bytes(out, member, data)
    return str(manifest_desc["digest"])


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _add_bytes(out: tarfile.TarFile, member: str, data: bytes) -> None:
    import io

    info = tarfile.TarInfo(member)
    info.size = len(data)
    out.addfile(info, io.BytesIO(data))


def _add_blob(out: tarfile.TarFile, data: bytes, media_type: str) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    _add_bytes(out, f"blobs/sha256/{digest.split(':', 1)[1]}", data)
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def requirement_closure(roots: Iterable[str], extras: dict[str, set[str]],
                        installed: Callable[[str], metadata.Distribution | None]) -> tuple[list[str], list[str]]:
    """The installed distributions `roots` need (with `extras[name]` for a root), transitively; and the
    requirements that are not installed. Names are normalised (PEP 503)."""
    from packaging.requirements import Requirement

    found: dict[str, metadata.Distribution] = {}
    missing: list[str] = []
    todo: list[tuple[str, set[str]]] = [(r, extras.get(r, set())) for r in roots]
    while todo:
        name, want = todo.pop()
        key = _norm(name)
        dist = installed(key)
        if dist is None:
            missing.append(key)
            continue
        if key in found:
            continue
        found[key] = dist
        for spec in dist.requires or []:
            req = Requirement(spec)
            env_ok = req.marker is None or any(req.marker.evaluate({"extra": e}) for e in (want or {""}))
            if env_ok:
                todo.append((req.name, set(req.extras)))
    return sorted(found), sorted(set(missing) - set(found))


class WheelDistribution(metadata.Distribution):
    """A wheel file's metadata, read from the wheel (nothing installed)."""

    def __init__(self, wheel: Path) -> None:
        self.wheel = wheel

    def read_text(self, filename: str) -> str | None:
        import zipfile

        with zipfile.ZipFile(self.wheel) as zf:
            name = next((n for n in zf.namelist() if n.endswith(f".dist-info/{filename}")), None)
            return None if name is None else zf.read(name).decode()

    def locate_file(self, path: str | os.PathLike[str]) -> Path:
        return self.wheel.parent / path


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dist_files(dist: metadata.Distribution) -> list[Path]:
    """The files a distribution installed (its RECORD), as absolute paths that exist."""
    base = Path(str(dist.locate_file("")))
    out = []
    for f in dist.files or []:
        p = (base / f).resolve() if ".." in f.parts else base / f
        if p.exists() or p.is_symlink():
            out.append(p)
    return out


# What of the machine's / goes into the job image's base layer: the system and its Python, the C compiler and
# headers Triton compiles its launchers with. The driver (/usr/local/nvidia) is never in the image: CDI mounts it.
BASE_PATHS = ("usr", "bin", "sbin", "lib", "lib64", "etc/ssl", "etc/ld.so.conf", "etc/ld.so.conf.d", "etc/ld.so.cache",
              "etc/alternatives", "etc/nsswitch.conf", "opt/gcc")
BASE_EXCLUDES = ("usr/local/cuda*", "usr/local/nvidia", "usr/share/doc", "usr/share/man", "usr/share/locale",
                 "usr/share/info", "usr/lib/python3/dist-packages", "usr/src", "usr/lib/firmware")


def image_config(venv: Path) -> dict[str, Any]:
    """The job image's config: what `images/job/Containerfile` sets, with the venv first on PATH."""
    return {
        "Env": [f"PATH={venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/gcc/bin",
                f"LD_LIBRARY_PATH={DRIVER_LIBRARY_PATH}", "PYTHONUNBUFFERED=1", "HF_HOME=/cache/huggingface",
                "TORCHINDUCTOR_CACHE_DIR=/cache/inductor", "TRITON_CACHE_DIR=/cache/triton",
                "KUBESWEEP_CACHE_DIR=/cache/kubesweep", "HOME=/home/kubesweep"],
        "User": "1000:1000", "WorkingDir": "/workspace",
        "Entrypoint": ["python", "-m", "kubesweep.jobs"],
        "Cmd": ["--config", "/etc/kubesweep/trial.json", "--output-dir", "/workspace/output"],
    }


def skeleton_files(venv: Path) -> dict[str, tuple[bytes | None, int, int]]:
    """The image's own files and directories: the job user, its writable directories (uid 1000), the venv's
    launcher. Value: (content or None for a directory, mode, uid)."""
    passwd = b"root:x:0:0:root:/root:/bin/sh\nkubesweep:x:1000:1000::/home/kubesweep:/bin/sh\n"
    group = b"root:x:0:\nkubesweep:x:1000:\n"
    files: dict[str, tuple[bytes | None, int, int]] = {
        "etc/passwd": (passwd, 0o644, 0), "etc/group": (group, 0o644, 0),
        "etc/hosts": (b"127.0.0.1 localhost\n", 0o644, 0),
        "etc/kubesweep": (None, 0o755, 0), "tmp": (None, 0o1777, 0), "home/kubesweep": (None, 0o755, 1000),
        "workspace": (None, 0o755, 0), "workspace/output": (None, 0o775, 1000),
    }
    for sub in ("cache", "cache/huggingface", "cache/inductor", "cache/triton"):
        files[sub] = (None, 0o775, 1000)
    cfg = (venv / "pyvenv.cfg").read_bytes() if (venv / "pyvenv.cfg").exists() else b""
    files[str(venv / "pyvenv.cfg").lstrip("/")] = (cfg, 0o644, 0)
    return files


def write_skeleton_layer(path: Path, venv: Path) -> None:
    import io

    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for member, (content, mode, uid) in sorted(skeleton_files(venv).items()):
            info = tarfile.TarInfo(member)
            info.mode, info.uid, info.gid, info.mtime = mode, uid, uid, 0
            if content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
        for name in ("python", "python3", "python3.12"):
            link = venv / "bin" / name
            if link.is_symlink():
                info = tarfile.TarInfo(str(link).lstrip("/"))
                info.type, info.linkname, info.mtime = tarfile.SYMTYPE, os.readlink(link), 0
                tar.addfile(info)


def tar_paths(out: Path, paths: Iterable[str], excludes: Iterable[str] = (), root: str = "/") -> None:
    """GNU tar of `paths` (relative to `root`) into `out`, owner root, numeric ids, no atime changes."""
    listing = out.with_suffix(".list")
    present = [p for p in paths if os.path.lexists(os.path.join(root, p))]
    listing.write_text("\n".join(present) + "\n")
    cmd = ["tar", "-C", root, "-cf", str(out), "--numeric-owner", "--owner=0", "--group=0",
           *[f"--exclude={e}" for e in excludes], "-T", str(listing)]
    proc = run(cmd, timeout=900, check=False)
    if proc.returncode not in (0, 1):  # 1: a file changed while it was read (logs, caches): not fatal here
        raise GpuNodeError(f"tar exited {proc.returncode}: {proc.stderr[-2000:]}")


def assemble_job_image(root: Path, wheels: Path, venv: Path = Path("/opt/torch/.venv"),
                       tag: str = "gpu-node") -> dict[str, Any]:
    """Assemble the job image as an OCI archive under `root`/image (no containerd needed); returns what
    `import_job_image` takes: the archive, the reference by digest, sizes and seconds per step."""
    work = root / "image"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    times: dict[str, float] = {}
    t = time.monotonic()
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    by_name = {_norm(d.metadata["Name"]): d for d in metadata.distributions(path=[str(site)])}

    kubesweep_wheel = next(wheels.glob("kubesweep-*.whl"))
    with zipfile_open(kubesweep_wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [line.split(":", 1)[1].strip() for line in zf.read(meta).decode().splitlines()
                    if line.startswith("Requires-Dist:")]
    from packaging.requirements import Requirement

    roots: list[str] = []
    extras: dict[str, set[str]] = {}
    for spec in requires:
        req = Requirement(spec)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in IMAGE_EXTRAS):
            roots.append(req.name)
            extras.setdefault(_norm(req.name), set()).update(req.extras)
    # The carried wheels' own requirements count too (mlflow's protobuf is the venv's, not a carried wheel's).
    carried_meta = {_norm(w.name.split("-")[0]): WheelDistribution(w) for w in wheels.glob("*.whl")}
    closure, missing = requirement_closure(roots, extras, lambda key: by_name.get(key) or carried_meta.get(key))
    base_dists = [key for key in closure if key in by_name]
    # Base layer: the system, and the venv's distributions the job needs (the base image's torch and friends).
    files: list[str] = []
    for key in base_dists:
        files += [str(p).lstrip("/") for p in dist_files(by_name[key])]
    base_layer = work / "base.tar"
    tar_paths(base_layer, [*BASE_PATHS, *sorted(set(files))], BASE_EXCLUDES)
    times["base_layer"] = time.monotonic() - t
    # Then the wheels the venv lacks (kubesweep's other dependencies), then kubesweep, as the Containerfile layers.
    t = time.monotonic()
    layers = [base_layer]
    carried = [w for w in sorted(wheels.glob("*.whl")) if _norm(w.name.split("-")[0]) not in by_name]
    for label, chosen in (("deps", [w for w in carried if not w.name.startswith("kubesweep-")]),
                          ("kubesweep", [kubesweep_wheel])):
        stage = work / f"stage-{label}"
        target = stage / str(site).lstrip("/")
        run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
             "--target", str(target), *map(str, chosen)], timeout=600)
        scripts = venv_scripts(target, stage / str(venv / "bin").lstrip("/"), venv)
        layer = work / f"{label}.tar"
        tar_paths(layer, [str(target.relative_to(stage)), *scripts], root=str(stage))
        shutil.rmtree(stage)
        layers.append(layer)
    skeleton = work / "skeleton.tar"
    write_skeleton_layer(skeleton, venv)
    layers.append(skeleton)
    times["other_layers"] = time.monotonic() - t
    t = time.monotonic()
    name = f"{JOB_IMAGE}:{tag}"
    archive = work / "job.oci.tar"
    digest = write_oci_archive(archive, name, layers, image_config(venv), labels={
        "org.opencontainers.image.title": "kubesweep-job",
        "org.opencontainers.image.description": "kubesweep BERT benchmark job, assembled on the GPU node from "
                                                "its own PyTorch-CUDA userland"})
    times["archive"] = time.monotonic() - t
    layer_bytes = {layer.name: layer.stat().st_size for layer in layers}
    for layer in layers:
        layer.unlink()
    result = {"image": f"{JOB_IMAGE}@{digest}", "digest": digest, "archive": str(archive),
              "layer_bytes": layer_bytes, "base_distributions": base_dists, "not_in_venv": missing,
              "carried_wheels": [w.name for w in carried], "seconds": times}
    (work / "assembled.json").write_text(json.dumps(result, indent=1))
    return result


def venv_scripts(target: Path, bin_dir: Path, venv: Path) -> list[str]:
    """The console scripts `pip install --target` left in target/bin (`mlflow`, `kopf`, ...), moved to the venv's
    bin/ (on the image's PATH, as a plain install puts them) with the venv's Python as their interpreter; their
    paths relative to the stage, for the layer."""
    source = target / "bin"
    if not source.is_dir():
        return []
    bin_dir.mkdir(parents=True, exist_ok=True)
    moved = []
    for script in sorted(source.iterdir()):
        data = script.read_bytes()
        if data.startswith(b"#!"):
            data = f"#!{venv}/bin/python".encode() + data[data.index(b"\n"):]
        dest = bin_dir / script.name
        dest.write_bytes(data)
        dest.chmod(0o755)
        moved.append(str(venv / "bin" / script.name).lstrip("/"))
    shutil.rmtree(source)
    return moved


def import_job_image(node: GpuNode, assembled: dict[str, Any]) -> dict[str, Any]:
    """Import the assembled archive into containerd (unpacked for overlayfs); the archive is removed after."""
    t = time.monotonic()
    archive = Path(assembled["archive"])
    node.ctr("images", "import", "--snapshotter", "overlayfs", str(archive), timeout=1200)
    archive.unlink()
    return {**assembled, "seconds": {**assembled["seconds"], "import": time.monotonic() - t}}


@contextlib.contextmanager
def zipfile_open(path: Path) -> Iterator[Any]:
    import zipfile

    with zipfile.ZipFile(path) as zf:
        yield zf


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="bring the node up; prints seconds per phase as JSON")
    up.add_argument("--pack", type=Path, action="append", required=True, help="a pack directory (repeatable)")
    up.add_argument("--no-gpu", action="store_true", help="stop before the device plugin (a machine without a GPU)")
    img = sub.add_parser("image", help="assemble the job image (and import it unless --assemble-only); prints its "
                                       "reference as JSON")
    img.add_argument("--wheels", type=Path, required=True)
    img.add_argument("--venv", type=Path, default=Path("/opt/torch/.venv"))
    img.add_argument("--assemble-only", action="store_true", help="write the OCI archive; containerd not needed")
    sub.add_parser("down", help="stop every component")
    args = p.parse_args(argv)
    node = GpuNode(Layout(ROOT))
    try:
        if args.cmd == "up":
            print(json.dumps(node.up(args.pack, gpu=not args.no_gpu)))
        elif args.cmd == "image":
            assembled = assemble_job_image(node.layout.root, args.wheels, args.venv)
            print(json.dumps(assembled if args.assemble_only else import_job_image(node, assembled), indent=1))
        else:
            node.down()
    except GpuNodeError as exc:
        log(f"ERROR: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
