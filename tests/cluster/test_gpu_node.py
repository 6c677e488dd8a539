"""The GPU node's parts that run without a GPU: GFD's label naming, the node's configuration, the job image's
assembly (an OCI archive checked member by member) and the distribution closure it is built from.

The node itself needs an NVIDIA GPU and runs on the GPU machine only (`bench/gpu_node.py`); its results are
committed under bench/results/ (gpu_node-*.json)."""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import json
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import gpu_node

from kubesweep.gpus import load_catalog, product_from_device_name


def test_gfd_product_names_every_catalog_gpu_as_its_label() -> None:
    """GFD's naming (NVML's name, words joined by '-') gives exactly the catalog's product labels."""
    nvml_names = {"h100-80gb": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200", "l40s": "NVIDIA L40S",
                  "a100-40gb": "NVIDIA A100-SXM4-40GB", "v100-32gb": "Tesla V100-SXM2-32GB",
                  "rtx-3090": "NVIDIA GeForce RTX 3090"}
    catalog = load_catalog()
    for key, nvml in nvml_names.items():
        assert gpu_node.gfd_product(nvml) == catalog[key].product == product_from_device_name(nvml)


def test_gfd_label_file_keeps_nvidia_labels_only() -> None:
    text = ("nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3\nnvidia.com/gpu.count=1\n"
            "nvidia.com/gpu.memory=81559\nfeature.node.kubernetes.io/x=1\n\ngarbage\n")
    assert gpu_node.parse_gfd_labels(text) == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                               "nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "81559"}


def test_containerd_runs_runc_from_the_pack_with_cdi_on(tmp_path: Path) -> None:
    layout = gpu_node.Layout(tmp_path)
    cfg = tomllib.loads(gpu_node.containerd_config(layout))
    runtime = cfg["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["enable_cdi"] is True and str(gpu_node.CDI_DIR) in runtime["cdi_spec_dirs"]
    runc = runtime["containerd"]["runtimes"]["runc"]["options"]
    assert runc == {"BinaryName": str(tmp_path / "bin" / "runc"), "SystemdCgroup": False}
    assert runtime["cni"]["bin_dirs"] == [str(tmp_path / "bin" / "cni")]
    assert cfg["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == gpu_node.PAUSE_IMAGE


def test_pod_network_needs_no_iptables(tmp_path: Path) -> None:
    bridge = gpu_node.cni_conflist(gpu_node.Layout(tmp_path))["plugins"][0]
    assert bridge["type"] == "bridge" and bridge["ipMasq"] is False and bridge["isGateway"] is True
    assert bridge["ipam"]["ranges"][0][0] == {"subnet": gpu_node.POD_CIDR, "gateway": gpu_node.NODE_GATEWAY}


def test_services_go_through_kube_proxy_in_nftables_mode_with_debians_nft(tmp_path: Path) -> None:
    """The machine has nf_tables and no iptables binaries (bench/results/gpu_vm_probe-h100): kube-proxy's
    nftables mode, running the nft unpacked under the node's root; pods' Service traffic masqueraded."""
    layout = gpu_node.Layout(tmp_path)
    cfg = gpu_node.kube_proxy_config(layout)
    assert cfg["mode"] == "nftables" and cfg["nftables"]["masqueradeAll"] is True
    assert cfg["clusterCIDR"] == gpu_node.POD_CIDR and cfg["hostnameOverride"] == gpu_node.NODE_NAME
    assert cfg["healthzBindAddress"].startswith("127.0.0.1:")
    env = gpu_node.nft_env(layout, {"PATH": "/usr/bin"})
    assert env["PATH"].split(":")[0] == str(tmp_path / "nft/usr/sbin") and env["PATH"].endswith(":/usr/bin")
    (tmp_path / "nft/usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    assert gpu_node.nft_env(layout, {})["LD_LIBRARY_PATH"] == str(tmp_path / "nft/usr/lib/x86_64-linux-gnu")
    assert "kube-proxy" in gpu_node.COMPONENTS
    # the `kubernetes` Service's address is the first of the Service range, which the API server's certificate names
    import ipaddress

    assert ipaddress.ip_address(gpu_node.SERVICE_IP) == next(ipaddress.ip_network(gpu_node.SERVICE_CIDR).hosts())


def test_kube_proxy_configuration_is_written_only_when_it_changes(tmp_path: Path) -> None:
    """kube-proxy exits when its configuration file is written to: a second `up` must leave it alone."""
    node = gpu_node.GpuNode(gpu_node.Layout(tmp_path))
    (tmp_path / "config").mkdir()
    node.write_configs()
    path = tmp_path / "config" / "kube-proxy.json"
    before = path.stat().st_mtime_ns
    import os

    os.utime(path, ns=(before - 10**9, before - 10**9))
    node.write_configs()
    assert path.stat().st_mtime_ns == before - 10**9
    assert json.loads(path.read_text())["mode"] == "nftables"


def test_objects_applied_by_the_node_find_their_paths() -> None:
    assert gpu_node.object_path({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml-team"}}) == \
        "/api/v1/namespaces/ml-team"
    assert gpu_node.object_path({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                                 "metadata": {"name": "gpus", "namespace": "ml-team"}}) == \
        "/apis/kueue.x-k8s.io/v1beta2/namespaces/ml-team/localqueues/gpus"
    assert gpu_node.object_path({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                                 "metadata": {"name": "gpus"}}) == "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/gpus"


def test_kubelet_and_device_plugin_commands(tmp_path: Path) -> None:
    layout = gpu_node.Layout(tmp_path)
    kubelet = gpu_node.kubelet_config(layout)
    assert kubelet["cgroupDriver"] == "cgroupfs" and kubelet["authentication"]["anonymous"]["enabled"] is False
    assert kubelet["containerRuntimeEndpoint"] == f"unix://{layout.containerd_socket}"
    cmds = gpu_node.component_commands(layout)
    assert set(cmds) == set(gpu_node.COMPONENTS)
    plugin = cmds["nvidia-device-plugin"]
    assert plugin[plugin.index("--device-list-strategy") + 1] == "cdi-cri"
    assert plugin[plugin.index("--nvidia-cdi-hook-path") + 1] == str(layout.bin / "nvidia-cdi-hook")
    # a host process: the driver is found at the host's root, not at the container's /driver-root
    assert plugin[plugin.index("--driver-root") + 1] == plugin[plugin.index("--container-driver-root") + 1] == "/"
    api = cmds["kube-apiserver"]
    # every address: pods reach it through the `kubernetes` Service (kube-proxy turns it into the node's address)
    assert api[api.index("--bind-address") + 1] == "0.0.0.0"
    assert "Node,RBAC" in api
    # the node's name resolves nowhere: the API server reaches the kubelet (logs) at the address it reports
    assert api[api.index("--kubelet-preferred-address-types") + 1] == "InternalIP"
    kubelet_cmd = cmds["kubelet"]
    assert kubelet_cmd[kubelet_cmd.index("--node-ip") + 1] == gpu_node.node_ip()


def test_pods_ask_the_clusters_dns_at_the_one_address_they_can_route_to(tmp_path: Path) -> None:
    """The pod network has the bridge's subnet and no default route (no masquerade, nothing beyond the node): the
    cluster's DNS must be the bridge's gateway address, not the node's own (on the GPU machine a pod's query to
    the node's address was `Network is unreachable`, bench/results/gpu_node-4gpu-h100/dnsprobe-before-fix.txt)."""
    import ipaddress

    layout = gpu_node.Layout(tmp_path)
    kubelet = gpu_node.kubelet_config(layout)
    [dns] = kubelet["clusterDNS"]
    assert ipaddress.ip_address(dns) in ipaddress.ip_network(gpu_node.POD_CIDR)
    assert dns == gpu_node.cni_conflist(layout)["plugins"][0]["ipam"]["ranges"][0][0]["gateway"]
    assert kubelet["clusterDomain"] == gpu_node.CLUSTER_DOMAIN
    corefile = gpu_node.corefile(layout)
    # the cluster's names alone, from the API with the admin's credentials; nothing forwarded anywhere
    assert corefile.startswith(f"{gpu_node.CLUSTER_DOMAIN}:53 {{") and "forward" not in corefile
    assert f"kubeconfig {layout.admin_kubeconfig}" in corefile


def _layer(path: Path, files: dict[str, bytes]) -> Path:
    import io

    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_oci_archive_is_content_addressed_and_names_the_image(tmp_path: Path) -> None:
    layers = [_layer(tmp_path / "a.tar", {"usr/bin/x": b"x" * 1000}), _layer(tmp_path / "b.tar", {"etc/y": b"y"})]
    archive = tmp_path / "img.tar"
    config = gpu_node.image_config(Path("/opt/torch/.venv"))
    digest = gpu_node.write_oci_archive(archive, "localhost/kubesweep/kubesweep-job:t", layers, config,
                                        labels={"org.opencontainers.image.title": "kubesweep-job"})
    with tarfile.open(archive) as tar:
        blobs = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    for name, data in blobs.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(blobs["index.json"])
    # named by tag and by digest (the name the kubelet asks containerd's CRI for), one manifest
    assert {d["digest"] for d in index["manifests"]} == {digest}
    assert [d["annotations"]["io.containerd.image.name"] for d in index["manifests"]] == [
        "localhost/kubesweep/kubesweep-job:t", f"localhost/kubesweep/kubesweep-job@{digest}"]
    manifest = json.loads(blobs[f"blobs/sha256/{digest.split(':')[1]}"])
    assert [layer["digest"] for layer in manifest["layers"]] == [
        "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest() for p in layers]
    image = json.loads(blobs[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"])
    assert image["rootfs"]["diff_ids"] == [layer["digest"] for layer in manifest["layers"]]
    assert image["config"]["User"] == "1000:1000"
    assert image["config"]["Entrypoint"] == ["python", "-m", "kubesweep.jobs"]
    assert image["config"]["Labels"]["org.opencontainers.image.title"] == "kubesweep-job"
    # the same inputs give the same digest
    assert gpu_node.write_oci_archive(tmp_path / "again.tar", "localhost/kubesweep/kubesweep-job:t", layers,
                                      config, labels={"org.opencontainers.image.title": "kubesweep-job"}) == digest


def test_image_config_matches_the_containerfile() -> None:
    """The job image assembled on the node sets what images/job/Containerfile sets."""
    containerfile = (Path(__file__).parents[2] / "images/job/Containerfile").read_text()
    config = gpu_node.image_config(Path("/opt/torch/.venv"))
    env = dict(e.split("=", 1) for e in config["Env"])
    for key in ("HF_HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "KUBESWEEP_CACHE_DIR", "HOME"):
        assert f"{key}={env[key]}" in containerfile.replace(" \\\n", "\n").replace("ENV ", "")
    assert config["WorkingDir"] == "/workspace" and 'USER 1000:1000' in containerfile
    assert env["PATH"].startswith("/opt/torch/.venv/bin:")


def test_skeleton_layer_gives_the_job_user_its_directories(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "bin" / "python").symlink_to("/usr/bin/python3.12")
    layer = tmp_path / "skel.tar"
    gpu_node.write_skeleton_layer(layer, venv)
    with tarfile.open(layer) as tar:
        members = {m.name: m for m in tar.getmembers()}
    for d in ("cache", "cache/inductor", "workspace/output", "home/kubesweep"):
        assert members[d].isdir() and members[d].uid == 1000, d
    assert members["tmp"].mode == 0o1777
    assert "kubesweep:x:1000:1000" in tar_text(layer, "etc/passwd")
    link = members[str(venv / "bin" / "python").lstrip("/")]
    assert link.issym() and link.linkname == "/usr/bin/python3.12"


def tar_text(path: Path, member: str) -> str:
    with tarfile.open(path) as tar:
        f = tar.extractfile(member)
        assert f is not None
        return f.read().decode()


def test_requirement_closure_follows_extras_and_names_what_is_missing() -> None:
    """Walks the real installed distributions of this environment: pydantic needs pydantic-core,
    annotated-types and typing-inspection; a name not installed is reported, never followed."""
    def installed(key: str) -> metadata.Distribution | None:
        try:
            return metadata.distribution(key)
        except metadata.PackageNotFoundError:
            return None

    found, missing = gpu_node.requirement_closure(["pydantic", "no-such-dist-here"], {}, installed)
    assert {"pydantic", "pydantic-core", "annotated-types", "typing-extensions"} <= set(found)
    assert missing == ["no-such-dist-here"]
    # an extra pulls in its requirements only when asked for
    plain, _ = gpu_node.requirement_closure(["mlflow"], {}, installed)
    with_auth, _ = gpu_node.requirement_closure(["mlflow"], {"mlflow": {"auth"}}, installed)
    assert "flask-wtf" in with_auth and "flask-wtf" not in plain


@pytest.mark.parametrize("name", ["kubesweep_job", "Flask.WTF", "typing_extensions"])
def test_names_are_normalised(name: str) -> None:
    assert gpu_node._norm(name) == name.lower().replace("_", "-").replace(".", "-")


def test_driver_library_dirs_are_those_holding_libcuda(tmp_path: Path) -> None:
    with_driver, without = tmp_path / "lib64", tmp_path / "lib"
    with_driver.mkdir()
    without.mkdir()
    (with_driver / "libcuda.so.1").touch()
    assert gpu_node.driver_library_dirs(f"{with_driver}:{without}:{tmp_path / 'absent'}") == [str(with_driver)]


@pytest.mark.parametrize(("cap_eff", "restrict"), [("000001ffffffffff", False), ("000001fffeffffff", True)])
def test_oom_score_adj_is_restricted_without_cap_sys_resource(tmp_path: Path, cap_eff: str, restrict: bool) -> None:
    status = tmp_path / "status"
    status.write_text(f"Name:\tpython3\nCapPrm:\t{cap_eff}\nCapEff:\t{cap_eff}\n")
    assert gpu_node.restrict_oom_score_adj(status) is restrict


def _wheel(path: Path, name: str, requires: list[str]) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}-1.0.dist-info/METADATA", "Metadata-Version: 2.1\n" f"Name: {name}\nVersion: 1.0\n"
                    + "".join(f"Requires-Dist: {r}\n" for r in requires))
    return path


def test_a_carried_wheels_requirements_join_the_closure(tmp_path: Path) -> None:
    """mlflow is carried as a wheel; its protobuf is the venv's and must go into the image's base layer."""
    carried = gpu_node.WheelDistribution(_wheel(tmp_path / "mlflow_skinny-1.0-py3-none-any.whl", "mlflow-skinny",
                                                ["protobuf<7"]))
    assert carried.metadata["Name"] == "mlflow-skinny" and carried.requires == ["protobuf<7"]
    venv_protobuf = gpu_node.WheelDistribution(_wheel(tmp_path / "protobuf-1.0-py3-none-any.whl", "protobuf", []))
    found, missing = gpu_node.requirement_closure(
        ["mlflow-skinny", "absent"], {}, {"mlflow-skinny": carried, "protobuf": venv_protobuf}.get)
    assert found == ["mlflow-skinny", "protobuf"] and missing == ["absent"]


def test_console_scripts_of_carried_wheels_land_on_the_venvs_path(tmp_path: Path) -> None:
    """`pip install --target` leaves `mlflow` in target/bin, off the image's PATH: the chart runs `mlflow server`
    from this image, so the scripts move to the venv's bin/ and run with the venv's Python."""
    target, venv = tmp_path / "stage/site", Path("/opt/torch/.venv")
    (target / "bin").mkdir(parents=True)
    (target / "bin" / "mlflow").write_text("#!/usr/bin/python3\nimport sys\nfrom mlflow.cli import cli\n")
    bin_dir = tmp_path / "stage" / str(venv / "bin").lstrip("/")
    moved = gpu_node.venv_scripts(target, bin_dir, venv)
    assert moved == ["opt/torch/.venv/bin/mlflow"]
    script = (bin_dir / "mlflow").read_text()
    assert script.splitlines()[0] == "#!/opt/torch/.venv/bin/python" and "from mlflow.cli import cli" in script
    assert (bin_dir / "mlflow").stat().st_mode & 0o111 and not (target / "bin").exists()
    assert gpu_node.venv_scripts(target, bin_dir, venv) == []  # nothing left to move
