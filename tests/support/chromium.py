"""Headless Chromium for the browser tests: Debian's `chromium`, driven by Playwright. CI installs it
(`apt-get install chromium`); a missing browser fails the test that asks for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.mlflow_fixtures import ROOT

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
SHOTS = ROOT / "test-output" / "browser"  # screenshots (gitignored)


def launch(pw: Any, profile: Path, width: int = 1600, height: int = 1100) -> Any:
    """A persistent Chromium context with its profile in `profile` (a sync Playwright instance `pw`)."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} not found: this test needs Debian's chromium (apt-get install chromium)")
    return pw.chromium.launch_persistent_context(str(profile), executable_path=str(CHROMIUM), headless=True,
                                                 args=FLAGS, viewport={"width": width, "height": height})
