"""`python -m kubesweep.jobs [--config trial.json] [--output-dir DIR] [--FIELD VALUE ...]`.

`--config` takes a trial file (TrialConfig: sweep, trial_id, name, ..., job: {...}) or a bare job settings
file (JobConfig), JSON or YAML. Every JobConfig field is also a flag (`batch_size` → `--batch-size`;
booleans as `--random-init/--no-random-init`; `--export onnx,torchscript`;
`--model-overrides num_hidden_layers=2,...` or JSON; `none` clears an optional field); flags override the
file. Exit codes: kubesweep.wire.outcomes.ExitCode.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kubesweep.jobs.command import CHECKPOINT_DIR_ENV
from kubesweep.jobs.errors import UsageError
from kubesweep.jobs.model import resolve
from kubesweep.wire.config import JobConfig, TrialConfig
from kubesweep.wire.outcomes import ExitCode

# Set by the rendered Job when the sweep names a checkpoint claim: the trial's directory on it. The job keeps its
# checkpoints there (unless the settings name a checkpoint_dir), and with them the MLflow spool and step record, so
# a pod that replaces an evicted one resumes from the last checkpoint and logs every step once.

TRIAL_FLAGS = {
    "sweep": str,
    "trial_id": str,
    "name": str,
    "repeat": int,
    "gpu": str,
    "gpu_product": str,
    "gpus_per_trial": int,
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _kind(annotation: Any) -> str:
    """bool, list, dict or scalar: how a field's flag parses."""
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if annotation is bool:
        return "bool"
    if origin in (list, tuple):
        return "list"
    if origin is dict:
        return "dict"
    if origin in (typing.Union, types.UnionType) and bool in args and all(a in (bool, str) for a in args):
        return "scalar"  # compile: bool | str
    return "scalar"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kubesweep.jobs",
        description="Run one kubesweep trial: BERT fine-tuning or inference benchmark.",
    )
    parser.add_argument(
        "--config", type=Path, help="trial file (TrialConfig) or job settings file, JSON or YAML"
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=Path(os.environ.get("KUBESWEEP_OUTPUT_DIR", "kubesweep-output")),
        help="for results.json, environment.json, loss_curve.png, export/ (default $KUBESWEEP_OUTPUT_DIR)",
    )
    trial = parser.add_argument_group("trial identity (override the trial file)")
    for name in TRIAL_FLAGS:
        trial.add_argument(_flag(name), dest=f"trial__{name}", default=None)
    job = parser.add_argument_group("job settings (override the file; every one can be a sweep axis)")
    for name, info in JobConfig.model_fields.items():
        kind = _kind(info.annotation)
        help_text = info.description or ""
        if kind == "bool":
            job.add_argument(
                _flag(name),
                dest=f"job__{name}",
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_text,
            )
        else:
            job.add_argument(_flag(name), dest=f"job__{name}", default=None, metavar="VALUE", help=help_text)
    return parser


def _parse_value(name: str, raw: str) -> Any:
    info = JobConfig.model_fields[name]
    kind = _kind(info.annotation)
    if raw.strip().lower() in ("none", "null") and not info.is_required() and info.default is None:
        return None
    if kind == "list":
        return [x.strip() for x in raw.split(",") if x.strip()]
    if kind == "dict":
        if raw.strip().startswith("{"):
            return json.loads(raw)
        pairs = [p.split("=", 1) for p in raw.split(",") if p.strip()]
        if any(len(p) != 2 for p in pairs):
            raise ValueError(f"{_flag(name)} expects KEY=VALUE,... or a JSON object")
        return {k.strip(): yaml.safe_load(v) for k, v in pairs}
    return raw


def _read_file(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    loaded = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: expected a mapping")
    return loaded


def resolve_trial(args: argparse.Namespace) -> TrialConfig:
    """The trial described by --config and the flags; raises ValueError/ValidationError on bad input."""
    content: dict[str, Any] = _read_file(args.config) if args.config else {}
    is_trial = "job" in content or "trial_id" in content
    trial_fields: dict[str, Any] = {k: v for k, v in content.items() if k != "job"} if is_trial else {}
    job: dict[str, Any] = dict(content.get("job") or {}) if is_trial else content
    for name in JobConfig.model_fields:
        raw = getattr(args, f"job__{name}")
        if raw is not None:
            job[name] = raw if isinstance(raw, bool) else _parse_value(name, raw)
    for name, cast in TRIAL_FLAGS.items():
        raw = getattr(args, f"trial__{name}")
        if raw is not None:
            trial_fields[name] = cast(raw)
    if not job.get("checkpoint_dir") and os.environ.get(CHECKPOINT_DIR_ENV):
        job["checkpoint_dir"] = os.environ[CHECKPOINT_DIR_ENV]  # the Job's checkpoint claim
    job_config = JobConfig.model_validate(job)
    if "trial_id" not in trial_fields:
        digest = hashlib.sha256(job_config.model_dump_json().encode()).hexdigest()[:10]
        trial_fields["trial_id"] = f"adhoc-{digest}"
    trial_fields.setdefault("sweep", "adhoc")
    trial_fields.setdefault("name", trial_fields["trial_id"])
    return TrialConfig.model_validate({**trial_fields, "job": job_config})


def preflight(job: JobConfig) -> None:
    """Reject local references that cannot work before the heavy imports (UsageError, exit code 2)."""
    resolve(job.model)
    if job.tokenizer:
        resolve(job.tokenizer)
    dataset = Path(job.dataset).expanduser()
    if job.dataset.startswith(("/", ".", "~")) and not dataset.is_dir():
        raise UsageError(f"dataset directory {job.dataset!r} does not exist")


def _setup_logging() -> None:
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        stream=sys.stdout,
        format=f"%(asctime)s {'' if rank == 0 else f'[rank {rank}] '}%(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("httpx", "urllib3", "filelock", "torch._dynamo", "torch._inductor"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    except ImportError:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        trial = resolve_trial(args)
        preflight(trial.job)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return int(ExitCode.USAGE)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors())
        print(f"error: invalid settings: {problems}", file=sys.stderr)
        return int(ExitCode.USAGE)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return int(ExitCode.USAGE)
    _setup_logging()
    from kubesweep.jobs.runner import run_trial

    return run_trial(trial, args.output_dir)
