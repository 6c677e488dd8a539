"""Where the report's files go: a staging directory inside the report's directory, then each file moved into place
(a rename), so that a build that fails leaves the report that was there as it was, never half of a new one."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path


class ReportPathError(ValueError):
    """The report's directory cannot be made or written: not a directory, no permission, no space."""


def _cannot(directory: Path, exc: OSError) -> ReportPathError:
    return ReportPathError(f"{directory}: cannot write the report there: {exc.strerror or exc}")


@contextmanager
def staged(directory: Path) -> Iterator[Path]:
    """A fresh staging directory inside `directory` (made if missing), removed when the block ends; an OSError
    in the block is a `ReportPathError` naming `directory`."""
    if directory.exists() and not directory.is_dir():
        raise ReportPathError(f"{directory}: exists and is not a directory (--output names the report's directory)")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".report-", dir=directory))
    except OSError as exc:
        raise _cannot(directory, exc) from None
    try:
        yield staging
    except OSError as exc:
        raise _cannot(directory, exc) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def publish(staging: Path, directory: Path, names: Sequence[str]) -> None:
    """Move each of `names` from `staging` into `directory`, in order (the page last); one the build did not write
    is removed from `directory` (a figure of the last build would mislead). Other files are left alone."""
    for name in names:
        if (staging / name).exists():
            os.replace(staging / name, directory / name)
        else:
            (directory / name).unlink(missing_ok=True)
