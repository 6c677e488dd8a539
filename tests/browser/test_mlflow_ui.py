"""The MLflow UI as a person sees it: headless Chromium (Debian's `chromium`, driven by Playwright) opens the
real `mlflow server` of tests/support/mlflow_fixtures.py after the tracked sweep ran and its report was logged,
finds the experiment, the sweep's parent run with its child runs, and the report among the parent's artifacts.
Screenshots go to test-output/browser/ (gitignored).

Chromium is required: CI installs it (`apt-get install chromium`); a missing browser fails the test.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.support.mlflow_fixtures import ROOT, SWEEP_TRIALS, TrackedSweep

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
SHOTS = ROOT / "test-output" / "browser"
TIMEOUT_MS = 120_000
EXPERIMENT = "kubesweep-tracked"


def test_experiment_parent_children_and_report_in_the_ui(tracked_sweep: TrackedSweep, tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} not found: this test needs Debian's chromium (apt-get install chromium)")
    from playwright.sync_api import expect, sync_playwright

    ts = tracked_sweep
    ts.sweep("report", ts.name, "--output", str(tmp_path / "report"))  # logs report/ to the parent run
    client = MlflowClient(tracking_uri=ts.server.url)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert experiment is not None
    parent = client.search_runs([experiment.experiment_id], "tags.`kubesweep.role` = 'parent'")[0]
    parent_id = parent.info.run_id
    names = [d.name for d in ts.trial_dirs()]
    shutil.rmtree(SHOTS, ignore_errors=True)
    SHOTS.mkdir(parents=True)

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=str(CHROMIUM), headless=True, args=FLAGS,
            viewport={"width": 1600, "height": 1100})
        try:
            page = context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            expect.set_options(timeout=TIMEOUT_MS)

            # the experiments list shows the sweep's experiment
            page.goto(f"{ts.server.url}/#/experiments")
            link = page.get_by_role("link", name=EXPERIMENT, exact=True)
            expect(link).to_be_visible()
            page.screenshot(path=str(SHOTS / "1-experiments.png"))

            # its runs, on the model-training view: one top-level run (the sweep) and the children under it
            page.get_by_text("Model training", exact=True).first.click()
            link.click()
            expect(page.get_by_text(f"{SWEEP_TRIALS + 1} matching runs")).to_be_visible()
            parent_link = page.locator(f"a[href$='/runs/{parent_id}']").first
            expect(parent_link).to_have_text("tracked")
            children = page.get_by_role("link", name=re.compile(r"^tracked-"))
            expect(children).to_have_count(0)  # collapsed under the parent
            page.screenshot(path=str(SHOTS / "2-parent-run.png"))
            page.locator("[role=gridcell]").filter(has=parent_link).locator("button").first.click()
            expect(children.first).to_be_visible()
            for name in (names[0], names[-1]):
                expect(page.get_by_role("link", name=name, exact=True)).to_be_visible()
            assert children.count() == SWEEP_TRIALS
            page.screenshot(path=str(SHOTS / "3-child-runs.png"))

            # the parent run's artifacts hold the report; the HTML page renders in the artifact viewer
            parent_link.click()
            page.get_by_role("tab", name="Artifacts").click()
            page.get_by_text("report", exact=True).first.click()
            for name in ("report.html", "throughput.png", "heatmap.png", "summary.json"):
                expect(page.get_by_text(name, exact=True).first).to_be_visible()
            page.get_by_text("report.html", exact=True).first.click()
            frame = page.frame_locator("iframe").first
            expect(frame.get_by_role("heading", name="Sweep tracked: report")).to_be_visible()
            expect(frame.get_by_role("heading", name="Time for 2 epochs of glue/sst2 at batch 16 per GPU"))\
                .to_be_visible()
            expect(frame.get_by_text("GPU mismatch").first).to_be_visible()
            page.screenshot(path=str(SHOTS / "4-report-artifact.png"))
            page.get_by_text("heatmap.png", exact=True).first.click()
            expect(page.locator("img[src*='heatmap.png'], img[src^='blob:'], img[src^='data:']").first)\
                .to_be_visible()
            page.screenshot(path=str(SHOTS / "5-heatmap-artifact.png"))
        finally:
            context.close()
    assert len(list(SHOTS.glob("*.png"))) == 5
