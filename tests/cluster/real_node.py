"""A real worker node for the kubesweep test cluster, beside the kwok GPU nodes.

Modelled on Kubernetes' own ``hack/local-up-cluster.sh``: a kubelet and kube-proxy from the same
``k8s.io/kubernetes`` build as the control plane, containerd 2.x with its runc shim (runc from Debian), the CNI
plugins from Debian (bridge, host-local, loopback, portmap), CoreDNS as the cluster's DNS, and kube-router's network
policy controller enforcing NetworkPolicy (the bridge plugin has no policy of its own). All binaries come
from ``build-tools.sh``; pause and CoreDNS run from images written here (an OCI archive around the static binary)
and imported into containerd, as a node image preloads them; every other image is pulled from a registry.

The node is meant for this one machine and keeps its traffic on it:

- one bridge, ``kubesweep0``, carries the node address (``NODE_IP``) and the pods (``POD_CIDR``); Services live
  in ``SERVICE_CIDR``, routed onto the bridge too (kube-proxy's rules turn a Service address into a pod's). All
  three sit inside ``NETWORK`` (10.213.0.0/16), whose other addresses get an ``unreachable`` route, so a packet for
  an address nobody holds there is refused on the spot instead of following the default route;
- a filter chain (``KUBESWEEP-EGRESS``, first in FORWARD) rejects anything a pod sends outside ``NETWORK``, and
  the cluster DNS answers only for ``cluster.local`` (no upstream): pods reach the node, each other and Services,
  nothing else;
- NetworkPolicy is enforced by kube-router run as its firewall only (``--run-firewall``, no routing, no service
  proxy), a node process beside kube-proxy: per pod a chain in the filter table, fed from FORWARD (bridged traffic
  through br_netfilter's physdev match), INPUT and OUTPUT, with ipsets of the peers each policy admits; what no
  policy admits is rejected. Connections from the node itself to its pods pass (kubelet probes, a test on this host);
- the node is tainted ``kubesweep.io/real-node=true:NoSchedule``: only pods that tolerate it land here, so the
  kwok tests' pods keep landing on kwok nodes. A namespace made with :func:`real_node_namespace_annotations`
  gives each of its pods that toleration and a node selector for this node (the PodTolerationRestriction and
  PodNodeSelector admission plugins), as a cluster administrator dedicates a namespace to a node pool.

The host must mount cgroup v1 or v2 (this one: v1, with cgroup2 only at /sys/fs/cgroup/unified) and needs no
systemd: the kubelet and containerd use the cgroupfs driver, and the kubelet runs with ``failCgroupV1: false``.
Everything runs as root. Logs and pid files go to ``<cluster workdir>/real-node/``; containerd's image store is
kept under the build cache (``<cache>/containerd``), so images pulled once are there for the next cluster.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

NODE_NAME = "real-node-0"
BRIDGE = "kubesweep0"
NETWORK = "10.213.0.0/16"
NODE_IP = "10.213.0.1"
POD_CIDR = "10.213.0.0/24"
POD_RANGE = ("10.213.0.10", "10.213.0.250")
SERVICE_CIDR = "10.213.128.0/20"
KUBERNETES_SERVICE_IP = "10.213.128.1"
DNS_SERVICE_IP = "10.213.128.10"
CLUSTER_DOMAIN = "cluster.local"
EGRESS_CHAIN = "KUBESWEEP-EGRESS"
CNI_NETWORK = "kubesweep"
CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
TAINT = {"key": "kubesweep.io/real-node", "value": "true", "effect": "NoSchedule"}
NODE_LABEL = "kubesweep.io/real-node"
K8S_NAMESPACE = "k8s.io"  # containerd's namespace for CRI images and containers
PAUSE_IMAGE = "localhost/kubesweep-test/pause:{version}"
COREDNS_IMAGE = "localhost/kubesweep-test/coredns:{version}"
COMPONENTS = ("containerd", "kubelet", "kube-proxy", "kube-router")
# kube-router's filter chains and ipsets (its network policy controller), removed when the node goes
KUBE_ROUTER_CHAINS = ("KUBE-ROUTER-", "KUBE-POD-FW-", "KUBE-NWPLCY-")
KUBE_ROUTER_IPSETS = ("KUBE-SRC-", "KUBE-DST-", "kube-router-")
OWNER = Path("/run/kubesweep-node/owner")  # the workdir of the cluster whose real node holds this machine


class RealNodeError(RuntimeError):
    """The real node could not be prepared or started; the message names the step and carries the logs."""


def _log(msg: str) -> None:
    print(f"[kubesweep-real-node] {msg}", file=sys.stderr, flush=True)


def _run(cmd: Sequence[str], *, check: bool = True, timeout: float = 60, input: str | None = None
         ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, input=input, check=False)
    if check and proc.returncode != 0:
        raise RealNodeError(f"{' '.join(cmd)} exited {proc.returncode}: {(proc.stdout + proc.stderr).strip()[-2000:]}")
    return proc


# --------------------------------------------------------------------------------------------- requirements
def missing_requirements() -> list[str]:
    """What this host lacks for a real node, each with how to get it; empty when everything is there."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (the kubelet, containerd and the CNI plugins manage mounts, cgroups and networks)")
    for exe, pkg in (("runc", "runc"), ("iptables", "iptables"), ("ip", "iproute2"), ("openssl", "openssl"),
                     ("conntrack", "conntrack"), ("ipset", "ipset")):
        if shutil.which(exe) is None and not Path("/usr/sbin", exe).exists():
            missing.append(f"{exe} (Debian: apt-get install -y {pkg})")
    if cni_bin_dir() is None:
        missing.append("the CNI plugins bridge, host-local, loopback, portmap "
                       "(Debian: apt-get install -y containernetworking-plugins)")
    if not Path("/proc/sys/net/bridge/bridge-nf-call-iptables").exists():
        missing.append("br_netfilter (modprobe br_netfilter): Services between pods on one bridge need it")
    return missing


def cni_bin_dir() -> Path | None:
    for d in CNI_BIN_DIRS:
        if all((Path(d) / p).exists() for p in ("bridge", "host-local", "loopback", "portmap")):
            return Path(d)
    return None


CAP_SYS_RESOURCE = 24


def _has_capability(cap: int) -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> cap & 1)
    return False


def runc_path() -> str:
    return shutil.which("runc") or "/usr/sbin/runc"


# --------------------------------------------------------------------------------------------- host network
def prepare_host_network() -> None:
    """The node bridge with the node address, the safety route and the egress chain; idempotent.

    Runs before the control plane starts, so the API server's certificate (kwokctl lists every local address)
    covers NODE_IP.
    """
    for key, value in (("net/ipv4/ip_forward", "1"), ("net/bridge/bridge-nf-call-iptables", "1"),
                       ("net/bridge/bridge-nf-call-ip6tables", "1")):
        Path("/proc/sys", key).write_text(value)
    if _run(["ip", "link", "show", BRIDGE], check=False).returncode != 0:
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    addrs = _run(["ip", "-o", "-4", "addr", "show", "dev", BRIDGE]).stdout
    if f" {NODE_IP}/" not in addrs:
        _run(["ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE])
    _run(["ip", "link", "set", BRIDGE, "up"])
    _run(["ip", "route", "replace", "unreachable", NETWORK])
    # Service addresses are routed onto the bridge: the host's own connections to them need a route before
    # kube-proxy's OUTPUT rules rewrite them to a pod, and an address no Service has goes nowhere else.
    _run(["ip", "route", "replace", SERVICE_CIDR, "dev", BRIDGE, "src", NODE_IP])
    # Pods may talk to NETWORK (each other, Services, the node) and to nothing else.
    if _run(["iptables", "-w", "-n", "-L", EGRESS_CHAIN], check=False).returncode != 0:
        _run(["iptables", "-w", "-N", EGRESS_CHAIN])
    _run(["iptables", "-w", "-F", EGRESS_CHAIN])
    _run(["iptables", "-w", "-A", EGRESS_CHAIN, "-s", POD_CIDR, "-d", NETWORK, "-j", "RETURN"])
    _run(["iptables", "-w", "-A", EGRESS_CHAIN, "-s", POD_CIDR, "-j", "REJECT"])
    if _run(["iptables", "-w", "-C", "FORWARD", "-j", EGRESS_CHAIN], check=False).returncode != 0:
        _run(["iptables", "-w", "-I", "FORWARD", "1", "-j", EGRESS_CHAIN])


def remove_host_network() -> None:
    """Undo prepare_host_network (and what kube-proxy and kube-router left in iptables)."""
    remove_kube_router_rules()
    _run(["iptables", "-w", "-D", "FORWARD", "-j", EGRESS_CHAIN], check=False)
    _run(["iptables", "-w", "-F", EGRESS_CHAIN], check=False)
    _run(["iptables", "-w", "-X", EGRESS_CHAIN], check=False)
    _run(["ip", "route", "del", "unreachable", NETWORK], check=False)
    _run(["ip", "link", "del", BRIDGE], check=False)


def remove_kube_router_rules() -> None:
    """Remove what kube-router's network policy controller wrote: the jumps into its chains, its chains and its
    ipsets. (Its own ``--cleanup-config`` also cleans up the service proxy this node does not run, and fails
    where the kernel has no IPVS.)"""
    rules = _run(["iptables", "-w", "-t", "filter", "-S"], check=False).stdout.splitlines()
    ours = [line.split()[1] for line in rules
            if line.startswith("-N ") and line.split()[1].startswith(KUBE_ROUTER_CHAINS)]
    for line in rules:  # rules of other chains that jump into ours
        parts = shlex.split(line)
        target = parts[parts.index("-j") + 1] if "-j" in parts[:-1] else None
        if parts[:1] == ["-A"] and parts[1] not in ours and target in ours:
            _run(["iptables", "-w", "-t", "filter", "-D", *parts[1:]], check=False)
    for chain in ours:
        _run(["iptables", "-w", "-t", "filter", "-F", chain], check=False)
    for chain in ours:
        _run(["iptables", "-w", "-t", "filter", "-X", chain], check=False)
    for name in _run(["ipset", "list", "-n"], check=False).stdout.split():
        if name.startswith(KUBE_ROUTER_IPSETS):
            _run(["ipset", "destroy", name], check=False)


# --------------------------------------------------------------------------------------------- kwokctl
def kwokctl_patches(pki: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """What the control plane needs for a real node: (KwokctlConfiguration options, componentsPatches).

    The API server listens on every local address (kwokctl binds it to 127.0.0.1, which pods cannot reach),
    advertises NODE_IP as the endpoint of the `kubernetes` Service, gives Services addresses in SERVICE_CIDR,
    talks to kubelets at their InternalIP with the admin certificate (the real kubelet checks it), and adds the
    admission plugins NodeRestriction (what a kubelet may write), PodNodeSelector and PodTolerationRestriction
    (namespace defaults) to the default ones.
    """
    args = [
        {"key": "bind-address", "value": "0.0.0.0", "override": True},
        {"key": "advertise-address", "value": NODE_IP},
        {"key": "service-cluster-ip-range", "value": SERVICE_CIDR},
        {"key": "kubelet-client-certificate", "value": str(pki / "admin.crt")},
        {"key": "kubelet-client-key", "value": str(pki / "admin.key")},
        {"key": "kubelet-preferred-address-types", "value": "InternalIP,Hostname"},  # node names are not in DNS
        {"key": "enable-admission-plugins", "value": "NodeRestriction,PodNodeSelector,PodTolerationRestriction"},
    ]
    options = {"kubeApiserverCertSANs": [KUBERNETES_SERVICE_IP, NODE_IP]}
    patches = [{"name": "kube-apiserver", "extraArgs": args},
               {"name": "kube-controller-manager",
                "extraArgs": [{"key": "service-cluster-ip-range", "value": SERVICE_CIDR}]},
               # kwok plays the fake nodes only (their annotation); the real node has a kubelet of its own
               {"name": "kwok-controller",
                "extraArgs": [{"key": "manage-all-nodes", "value": "false", "override": True},
                              {"key": "manage-nodes-with-annotation-selector", "value": "kwok.x-k8s.io/node=fake"}]}]
    return options, patches


def real_node_namespace_annotations() -> dict[str, str]:
    """Namespace annotations that put every pod of the namespace on the real node (PodNodeSelector) and let it
    tolerate the node's taint (PodTolerationRestriction)."""
    toleration = {"key": TAINT["key"], "operator": "Equal", "value": TAINT["value"], "effect": TAINT["effect"]}
    return {"scheduler.alpha.kubernetes.io/node-selector": f"{NODE_LABEL}=true",
            "scheduler.alpha.kubernetes.io/defaultTolerations": json.dumps([toleration])}


# --------------------------------------------------------------------------------------------- images
def oci_archive(path: Path, name: str, files: dict[str, tuple[bytes, int]], config: dict[str, Any]) -> str:
    """Write a one-layer OCI image archive (what `ctr images import` reads) and return the manifest digest.

    `files` maps a path in the image to (content, mode); `config` is the image config's `config` part
    (Entrypoint, User, ...). Timestamps are fixed, so the same inputs give the same digest.
    """
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for member, (content, mode) in sorted(files.items()):
            info = tarfile.TarInfo(member.lstrip("/"))
            info.size, info.mode, info.mtime = len(content), mode, 0
            tar.addfile(info, io.BytesIO(content))
    blobs: dict[str, bytes] = {}

    def blob(data: bytes, media_type: str) -> dict[str, Any]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    layer = layer_buf.getvalue()
    image_config = {"architecture": "amd64", "os": "linux", "config": config,
                    "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]}}
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": blob(json.dumps(image_config).encode(), "application/vnd.oci.image.config.v1+json"),
                "layers": [blob(layer, "application/vnd.oci.image.layer.v1.tar")]}
    manifest_desc = blob(json.dumps(manifest).encode(), manifest["mediaType"])
    index = {"schemaVersion": 2, "manifests": [{**manifest_desc, "annotations": {
        "io.containerd.image.name": name, "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}}]}
    with tarfile.open(path, "w") as tar:
        for member, data in [("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
                             ("index.json", json.dumps(index).encode()),
                             *((f"blobs/sha256/{d.split(':', 1)[1]}", b) for d, b in blobs.items())]:
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(manifest_desc["digest"])


# --------------------------------------------------------------------------------------------- the node
@dataclass
class RealNode:
    """The real node of one test cluster: its files, processes and configuration."""

    cluster_name: str
    workdir: Path        # <cluster workdir>/real-node
    bins: Path           # build-tools.sh's bin directory
    pki: Path            # the cluster's pki (kwokctl): ca.crt, ca.key, admin.crt, admin.key
    kubeconfig: Path     # the cluster's admin kubeconfig
    kubectl_path: Path
    k8s_version: str
    coredns_version: str
    image_store: Path    # containerd's root, kept between clusters

    # ---- paths
    @property
    def run_dir(self) -> Path:
        # sockets want short paths; /run is a tmpfs, gone after a reboot as the node's runtime state should be
        return Path("/run/kubesweep-node") / hashlib.sha1(str(self.workdir).encode()).hexdigest()[:8]

    @property
    def containerd_socket(self) -> Path:
        return self.run_dir / "containerd.sock"

    def log_path(self, component: str) -> Path:
        return self.workdir / "logs" / f"{component}.log"

    def pid_path(self, component: str) -> Path:
        return self.workdir / "pids" / f"{component}.pid"

    @property
    def pause_image(self) -> str:
        return PAUSE_IMAGE.format(version=self.k8s_version)

    @property
    def coredns_image(self) -> str:
        return COREDNS_IMAGE.format(version=self.coredns_version)

    def running(self) -> bool:
        return all(self._alive(c) for c in COMPONENTS)

    # ---- start
    def start(self, timeout: float = 180) -> None:
        t0 = time.monotonic()
        missing = missing_requirements()
        if missing:
            raise RealNodeError("this host cannot run the real node; missing:\n  " + "\n  ".join(missing))
        other = self._other_owner()
        if other is not None:
            raise RealNodeError(f"the real node of another cluster runs on this machine ({other}); stop it "
                                f"first: tests/cluster/down --name {other.parent.name}")
        self.stop(quiet=True)  # a node left behind by an interrupted run of the same cluster
        OWNER.parent.mkdir(parents=True, exist_ok=True)
        OWNER.write_text(str(self.workdir))
        for d in ("logs", "pids", "config", "kubelet", "pod-logs", "cni-state"):
            (self.workdir / d).mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        prepare_host_network()
        self._write_certificates()
        self._write_configs()
        self._spawn("containerd", [str(self.bins / "containerd"), "--config", str(self._cfg("containerd.toml"))],
                    env={"PATH": f"{self.bins}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"})
        self._wait("containerd to answer", lambda: self._ctr("version", check=False).returncode == 0, 30)
        self._import_images()
        self.start_kubelet()
        self._spawn("kube-proxy", [str(self.bins / "kube-proxy"), f"--config={self._cfg('kube-proxy.yaml')}",
                                   "--v=1"])
        self._wait(f"node {NODE_NAME} to be Ready", self._node_ready, timeout)
        self._deploy_addons()
        self._spawn("kube-router", [str(self.bins / "kube-router"), "--run-firewall=true", "--run-router=false",
                                    "--run-service-proxy=false", "--enable-cni=false",
                                    f"--kubeconfig={self._cfg('kube-router.kubeconfig')}",
                                    f"--hostname-override={NODE_NAME}", f"--service-cluster-ip-range={SERVICE_CIDR}",
                                    "--health-port=0", "--metrics-port=0", "--v=1"])
        self._wait("CoreDNS to be ready", self._dns_ready, timeout)
        self._wait("kube-router to enforce NetworkPolicy", self._network_policy_ready, timeout)
        _log(f"node {NODE_NAME} Ready with cluster DNS and NetworkPolicy in {time.monotonic() - t0:.1f}s")

    def _other_owner(self) -> Path | None:
        """The workdir of another cluster whose real node runs on this machine (one bridge, one node address:
        one real node per machine), or None."""
        try:
            other = Path(OWNER.read_text().strip())
            alive = Path(f"/proc/{int((other / 'pids' / 'kubelet.pid').read_text())}").exists()
        except (OSError, ValueError):
            return None
        return other if other != self.workdir and alive else None

    def _cfg(self, name: str) -> Path:
        return self.workdir / "config" / name

    def _spawn(self, component: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        log = self.log_path(component)
        with log.open("ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, **(env or {})}, start_new_session=True)
        self.pid_path(component).write_text(str(proc.pid))

    def _alive(self, component: str) -> bool:
        try:
            pid = int(self.pid_path(component).read_text())
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, ValueError, IndexError):
            return False

    def _check_alive(self) -> None:
        for component in COMPONENTS:
            if self.pid_path(component).exists() and not self._alive(component):
                raise RealNodeError(f"{component} exited:\n{self.logs(component)}")

    def _wait(self, what: str, fn: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                if fn():
                    return
            except (subprocess.SubprocessError, RealNodeError, KeyError, ValueError) as exc:
                last = str(exc)[-500:]
            time.sleep(1)
        raise RealNodeError(f"timed out after {timeout:.0f}s waiting for {what}{f' ({last})' if last else ''}\n"
                            + self.logs())

    def logs(self, component: str | None = None, lines: int = 30) -> str:
        parts = []
        for c in [component] if component else COMPONENTS:
            path = self.log_path(c)
            text = path.read_text(errors="replace") if path.exists() else "(no log)"
            parts.append(f"--- {c}.log (last {lines} lines) ---\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(parts)

    # ---- kubectl / ctr
    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
                ) -> subprocess.CompletedProcess[str]:
        return _run([str(self.kubectl_path), "--kubeconfig", str(self.kubeconfig), *args], input=input, check=check,
                    timeout=timeout)

    def _ctr(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return _run([str(self.bins / "ctr"), "--address", str(self.containerd_socket), "--namespace",
                     K8S_NAMESPACE, *args], check=check, timeout=timeout)

    # ---- certificates
    def _write_certificates(self) -> None:
        """Client certificates signed by the cluster CA, as a node's bootstrap would give them: the kubelet as
        system:node:<name> (group system:nodes, checked by the Node authorizer), kube-proxy as
        system:kube-proxy and kube-router as system:kube-router; and the kubelet's serving certificate for
        NODE_IP."""
        ca, ca_key = self.pki / "ca.crt", self.pki / "ca.key"
        for name, subject, ext in (
            ("kubelet-client", f"/O=system:nodes/CN=system:node:{NODE_NAME}", "extendedKeyUsage=clientAuth"),
            ("kube-proxy", "/CN=system:kube-proxy", "extendedKeyUsage=clientAuth"),
            ("kube-router", "/CN=system:kube-router", "extendedKeyUsage=clientAuth"),
            ("kubelet-serving", f"/O=system:nodes/CN=system:node:{NODE_NAME}",
             f"extendedKeyUsage=serverAuth\nsubjectAltName=IP:{NODE_IP},DNS:{NODE_NAME}"),
        ):
            key, csr, crt = (self._cfg(f"{name}.{s}") for s in ("key", "csr", "crt"))
            extfile = self._cfg(f"{name}.ext")
            extfile.write_text(ext + "\n")
            _run(["openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
                  "-subj", subject])
            _run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
                  "-CAcreateserial", "-out", str(crt), "-days", "30", "-extfile", str(extfile)])

    def _client_kubeconfig(self, user: str, cert: str) -> str:
        server = yaml.safe_load(self.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        return yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "node",
            "clusters": [{"name": "cluster", "cluster": {"server": server,
                                                         "certificate-authority": str(self.pki / "ca.crt")}}],
            "users": [{"name": user, "user": {"client-certificate": str(self._cfg(f"{cert}.crt")),
                                              "client-key": str(self._cfg(f"{cert}.key"))}}],
            "contexts": [{"name": "node", "context": {"cluster": "cluster", "user": user}}]})

    # ---- configuration files
    def _write_configs(self) -> None:
        cni_conf = self.workdir / "config" / "cni"
        cni_conf.mkdir(exist_ok=True)
        (cni_conf / "10-kubesweep.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": CNI_NETWORK, "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
                 "ipam": {"type": "host-local", "dataDir": str(self.workdir / "cni-state"),
                          "ranges": [[{"subnet": POD_CIDR, "rangeStart": POD_RANGE[0], "rangeEnd": POD_RANGE[1],
                                       "gateway": NODE_IP}]],
                          "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ]}, indent=2))
        certs_d = self.workdir / "config" / "certs.d"
        certs_d.mkdir(exist_ok=True)
        self.image_store.mkdir(parents=True, exist_ok=True)
        cri = 'plugins."io.containerd.cri.v1.runtime"'
        self._cfg("containerd.toml").write_text(f"""\
version = 3
root = "{self.image_store}"
state = "{self.run_dir}/state"

[grpc]
  address = "{self.containerd_socket}"

[ttrpc]
  address = "{self.run_dir}/containerd.sock.ttrpc"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{self.pause_image}"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{certs_d}"

[{cri}]
  # oom_score_adj may not go below this process's own where CAP_SYS_RESOURCE is missing (a sandboxed host):
  # containerd then clamps the kubelet's values (-998 for sandboxes, -997 for Guaranteed pods) to its own
  restrict_oom_score_adj = {str(not _has_capability(CAP_SYS_RESOURCE)).lower()}
  [{cri}.containerd]
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "{runc_path()}"
        SystemdCgroup = false
  [{cri}.cni]
    bin_dirs = ["{cni_bin_dir()}"]
    conf_dir = "{cni_conf}"
""")
        self._cfg("kubelet.kubeconfig").write_text(self._client_kubeconfig(f"system:node:{NODE_NAME}",
                                                                           "kubelet-client"))
        self._cfg("kube-proxy.kubeconfig").write_text(self._client_kubeconfig("system:kube-proxy", "kube-proxy"))
        self._cfg("kube-router.kubeconfig").write_text(self._client_kubeconfig("system:kube-router", "kube-router"))
        resolv = self._cfg("resolv.conf")
        resolv.write_text("# no upstream nameserver: pods resolve cluster names only\n")
        self._cfg("kubelet.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": NODE_IP, "port": 10250, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": 0,
            "tlsCertFile": str(self._cfg("kubelet-serving.crt")),
            "tlsPrivateKeyFile": str(self._cfg("kubelet-serving.key")),
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.pki / "ca.crt")}},
            "authorization": {"mode": "Webhook"},
            "cgroupDriver": "cgroupfs", "failCgroupV1": False, "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "clusterDNS": [DNS_SERVICE_IP], "clusterDomain": CLUSTER_DOMAIN, "resolvConf": str(resolv),
            "podCIDR": POD_CIDR, "podLogsDir": str(self.workdir / "pod-logs"), "maxPods": 40,
            "registerWithTaints": [TAINT],
            "serializeImagePulls": False,
            "evictionHard": {"memory.available": "200Mi", "nodefs.available": "2%", "imagefs.available": "2%",
                             "nodefs.inodesFree": "2%"},
            "imageGCHighThresholdPercent": 99, "imageGCLowThresholdPercent": 98,
            "nodeStatusReportFrequency": "10s", "nodeStatusUpdateFrequency": "5s",
            "shutdownGracePeriod": "0s", "rotateCertificates": False, "serverTLSBootstrap": False,
        }, sort_keys=False))
        self._cfg("kube-proxy.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "mode": "iptables", "clusterCIDR": POD_CIDR, "hostnameOverride": NODE_NAME,
            "bindAddress": NODE_IP, "healthzBindAddress": "127.0.0.1:10256", "metricsBindAddress": "127.0.0.1:10249",
            "clientConnection": {"kubeconfig": str(self._cfg("kube-proxy.kubeconfig"))},
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        }, sort_keys=False))

    # ---- images
    def _import_images(self) -> None:
        """pause and CoreDNS: one-layer images around the static binaries, imported into containerd."""
        images = {
            self.pause_image: ({"/pause": ((self.bins / "pause").read_bytes(), 0o755)},
                               {"Entrypoint": ["/pause"], "User": "65535:65535"}),
            self.coredns_image: ({"/coredns": ((self.bins / "coredns").read_bytes(), 0o755)},
                                 {"Entrypoint": ["/coredns"], "User": "65532:65532",
                                  "ExposedPorts": {"53/udp": {}, "53/tcp": {}}}),
        }
        present = self._ctr("images", "list", "-q").stdout.split()
        for name, (files, config) in images.items():
            archive = self.workdir / "config" / (name.rsplit("/", 1)[1].replace(":", "-") + ".oci.tar")
            digest = oci_archive(archive, name, files, config)
            listed = self._ctr("images", "list", f"name=={name}").stdout
            if name in present and digest in listed:
                continue
            self._ctr("images", "import", "--no-unpack=false", "--snapshotter", "overlayfs", str(archive))
            _log(f"imported {name} ({digest[:19]})")

    # ---- readiness
    def _node_ready(self) -> bool:
        proc = self.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
        if proc.returncode != 0:
            return False
        conds = {c["type"]: c["status"] for c in json.loads(proc.stdout)["status"].get("conditions", [])}
        return conds.get("Ready") == "True"

    def _deploy_addons(self) -> None:
        manifests = coredns_manifests(self.coredns_image) + kube_router_rbac()
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(manifests))

    def _dns_ready(self) -> bool:
        proc = self.kubectl("get", "deployment", "coredns", "-n", "kube-system", "-o", "json", check=False)
        return proc.returncode == 0 and json.loads(proc.stdout).get("status", {}).get("readyReplicas", 0) >= 1

    def _network_policy_ready(self) -> bool:
        """kube-router has synced: its chain for the CoreDNS pod is in FORWARD's path (it writes one per pod of
        this node once its informers have listed them)."""
        rules = _run(["iptables", "-w", "-t", "filter", "-S", "KUBE-ROUTER-FORWARD"], check=False).stdout
        return "KUBE-POD-FW-" in rules

    # ---- stop
    def stop(self, *, quiet: bool = False) -> None:
        """Stop the node's processes and every container they started; remove the node's mounts and networks.

        Pods are stopped through containerd (each task killed, its container removed) so nothing of a pod
        outlives the node; then the kubelet's mounts under its root, the CNI network state and the host network
        setup go. Safe to call on a node that is not running.
        """
        for component in ("kube-router", "kube-proxy", "kubelet"):
            self._terminate(component)
        if self._alive("containerd"):
            self._remove_containers()
        self._terminate("containerd")
        _kill_stray_shims(self.run_dir)
        _unmount_under(self.workdir / "kubelet")
        _unmount_under(self.run_dir)
        shutil.rmtree(self.workdir / "cni-state", ignore_errors=True)
        if self._other_owner() is None:  # the host's network is this node's to take down
            for netns in Path("/run/netns").glob("cni-*") if Path("/run/netns").is_dir() else []:
                _run(["ip", "netns", "delete", netns.name], check=False)
            if (self.bins / "kube-proxy").exists():
                _run([str(self.bins / "kube-proxy"), "--cleanup"], check=False)  # its iptables rules
            remove_host_network()
            OWNER.unlink(missing_ok=True)
        if not quiet:
            _log(f"node {NODE_NAME} stopped")

    def _terminate(self, component: str, timeout: float = 20) -> None:
        pid_file = self.pid_path(component)
        if not pid_file.exists():
            return
        try:
            pid = int(pid_file.read_text())
        except ValueError:
            pid_file.unlink()
            return
        if self._alive(component):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self._alive(component) and time.monotonic() < deadline:
                time.sleep(0.2)
            if self._alive(component):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
        pid_file.unlink(missing_ok=True)

    def _remove_containers(self) -> None:
        tasks = self._ctr("tasks", "list", "-q", check=False).stdout.split()
        for task in tasks:
            self._ctr("tasks", "kill", "--all", "--signal", "SIGKILL", task, check=False)
        for task in tasks:
            self._ctr("tasks", "delete", "--force", task, check=False)
        containers = self._ctr("containers", "list", "-q", check=False).stdout.split()
        if containers:
            self._ctr("containers", "delete", *containers, check=False)

    # ---- kubelet outage (tests)
    def stop_kubelet(self) -> None:
        """Stop the kubelet only (its pods keep running under containerd), as when a node's agent dies."""
        self._terminate("kubelet")

    def start_kubelet(self) -> None:
        self._spawn("kubelet", [str(self.bins / "kubelet"), f"--config={self._cfg('kubelet.yaml')}",
                                f"--kubeconfig={self._cfg('kubelet.kubeconfig')}",
                                f"--root-dir={self.workdir / 'kubelet'}", f"--hostname-override={NODE_NAME}",
                                f"--node-ip={NODE_IP}", f"--node-labels={NODE_LABEL}=true", "--v=1"])

    # ---- a pod held still (tests)
    @contextlib.contextmanager
    def frozen_pod(self, uid: str, timeout: float = 30) -> Iterator[None]:
        """Freeze every process of the pod `uid` (the cgroup freezer: it runs no instruction, and a signal sent to
        it meanwhile, as the kubelet's SIGTERM, waits until it thaws) for the `with` block; thawed on leaving it.
        A test uses it to act on a pod at a point of its own choosing, not at whatever point a race leaves it."""
        path, frozen, thawed = _pod_freezer(uid)
        path.write_text(frozen)
        try:
            self._wait(f"pod {uid} frozen", lambda: _settled_frozen(path), timeout)
            yield
        finally:
            with contextlib.suppress(FileNotFoundError):  # the pod was removed meanwhile
                path.write_text(thawed)


def _pod_freezer(uid: str) -> tuple[Path, str, str]:
    """The freezer file of the pod `uid` under the kubelet's cgroupfs driver, with what freezes and what thaws it:
    cgroup v1's freezer.state, or v2's cgroup.freeze."""
    root = Path("/sys/fs/cgroup")
    for path in sorted((root / "freezer" / "kubepods").glob(f"**/pod{uid}/freezer.state")):
        return path, "FROZEN", "THAWED"
    for path in sorted((root / "kubepods").glob(f"**/pod{uid}/cgroup.freeze")):
        return path, "1", "0"
    raise RealNodeError(f"no freezer cgroup for pod {uid} under {root}")


def _settled_frozen(path: Path) -> bool:
    """v1 reads FREEZING until every task is frozen; v2's cgroup.events says `frozen 1` once it is."""
    if path.name == "freezer.state":
        return path.read_text().strip() == "FROZEN"
    return "frozen 1" in (path.parent / "cgroup.events").read_text().splitlines()


def _kill_stray_shims(run_dir: Path) -> None:
    """containerd-shim-runc-v2 processes of this node's containerd (their command line names its socket)."""
    marker = str(run_dir).encode()
    for proc_dir in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc_dir / "cmdline").read_bytes()
        except OSError:
            continue
        if b"containerd-shim-runc-v2" in cmdline and marker in cmdline:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(proc_dir.name), signal.SIGKILL)


def _unmount_under(root: Path) -> None:
    """Unmount everything mounted at or below `root`, deepest first."""
    prefix = str(root.resolve()) if root.exists() else str(root)
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for target in sorted((m for m in mounts if m == prefix or m.startswith(prefix + "/")), key=len, reverse=True):
        _run(["umount", "-l", target], check=False)


# --------------------------------------------------------------------------------------------- CoreDNS
COREFILE = f"""\
.:53 {{
    errors
    health :8080
    ready :8181
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        pods insecure
        ttl 5
    }}
    cache 5
    loop
    loadbalance
}}
"""


def coredns_manifests(image: str) -> list[dict[str, Any]]:
    """CoreDNS as a cluster's DNS add-on: kube-system/coredns on the real node behind Service kube-dns."""
    labels = {"k8s-app": "kube-dns"}
    meta = {"namespace": "kube-system", "labels": labels}
    toleration = {"key": TAINT["key"], "operator": "Exists", "effect": TAINT["effect"]}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "coredns", **meta}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "system:coredns"},
         "rules": [{"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"]},
                   {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "system:coredns"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
         "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "coredns", **meta},
         "data": {"Corefile": COREFILE}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "coredns", **meta},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
             "metadata": {"labels": labels},
             "spec": {"serviceAccountName": "coredns", "dnsPolicy": "Default", "priorityClassName":
                      "system-cluster-critical", "nodeSelector": {NODE_LABEL: "true"}, "tolerations": [toleration],
                      "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile":
                                          {"type": "RuntimeDefault"}},
                      "containers": [{
                          "name": "coredns", "image": image, "imagePullPolicy": "Never",
                          "args": ["-conf", "/etc/coredns/Corefile"],
                          "ports": [{"name": "dns", "containerPort": 53, "protocol": "UDP"},
                                    {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"}],
                          "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                                        "limits": {"memory": "170Mi"}},
                          "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                              "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}},
                          "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 2},
                          "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}},
                          "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}]}],
                      "volumes": [{"name": "config", "configMap": {"name": "coredns"}}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "kube-dns", **meta},
         "spec": {"selector": labels, "clusterIP": DNS_SERVICE_IP,
                  "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                            {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53}]}},
    ]


def kube_router_rbac() -> list[dict[str, Any]]:
    """What kube-router's network policy controller reads (its upstream ClusterRole, less what only its router
    and service proxy write), bound to the user of its client certificate."""
    name = "system:kube-router"
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
         "rules": [{"apiGroups": [""], "resources": ["namespaces", "pods", "services", "nodes", "endpoints"],
                    "verbs": ["list", "get", "watch"]},
                   {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
                    "verbs": ["list", "get", "watch"]},
                   {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                    "verbs": ["list", "get", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}]},
    ]
