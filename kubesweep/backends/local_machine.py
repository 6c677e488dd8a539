"""The local backend's machine: its NVIDIA GPUs (`nvidia-smi`, or `KUBESWEEP_LOCAL_GPUS`), its home and the
settings the environment gives the backend (`KUBESWEEP_*`)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kubesweep.backends.base import BackendError
from kubesweep.gpus import product_from_device_name

HOME_ENV = "KUBESWEEP_HOME"
JOB_COMMAND_ENV = "KUBESWEEP_JOB_COMMAND"
GPUS_ENV = "KUBESWEEP_LOCAL_GPUS"
PRESTART_ENV = "KUBESWEEP_LOCAL_PRESTART"
FORKSERVER_ENV = "KUBESWEEP_LOCAL_FORKSERVER"


def default_home() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".kubesweep").expanduser()


@dataclass(frozen=True)
class Device:
    index: int
    product: str


def detect_gpus() -> list[Device]:
    """This machine's NVIDIA GPUs, from nvidia-smi (no CUDA library is loaded here).

    `KUBESWEEP_LOCAL_GPUS` overrides detection with a JSON list of device names, e.g.
    `["NVIDIA H100 80GB HBM3"]`, or `[]` for none.
    """
    override = os.environ.get(GPUS_ENV)
    if override is not None:
        names = json.loads(override) if override.strip() else []
        return [Device(i, product_from_device_name(n)) for i, n in enumerate(names)]
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=index,name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    devices = []
    for line in out.strip().splitlines():
        index, _, name = line.partition(",")
        devices.append(Device(int(index), product_from_device_name(name.strip())))
    return devices


def forkserver_wanted() -> bool:
    text = os.environ.get(FORKSERVER_ENV, "1").strip().lower()
    if text in ("1", "true", "yes", "on", ""):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise BackendError(f"{FORKSERVER_ENV} must be 1 or 0, got {text!r}")


def prestart_depth() -> int:
    """`KUBESWEEP_LOCAL_PRESTART`: how many trials may start early behind each running GPU trial (default 2)."""
    text = os.environ.get(PRESTART_ENV, "").strip().lower()
    if not text:
        return 2
    if text in ("false", "no", "off"):
        return 0
    try:
        return max(0, int(text))
    except ValueError:
        raise BackendError(f"{PRESTART_ENV} must be a number of trials (0 turns prestart off), got {text!r}") from None


def parse_command(text: str) -> list[str]:
    """`KUBESWEEP_JOB_COMMAND`: a JSON list or a shell-like string replacing `python -m kubesweep.jobs`."""
    try:
        value = json.loads(text)
    except ValueError:
        value = shlex.split(text)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise BackendError(f"{JOB_COMMAND_ENV} must be a command line or a JSON list of strings, got {text!r}")
    return value
