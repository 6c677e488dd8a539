"""The sweep report as a person sees it: headless Chromium (Debian's `chromium`, driven by Playwright) opens
report.html for a GPU matrix and for a CPU sweep (the stand-in job's results, tests/tracking/test_report.py) and
finds the answer in the first screen, every figure whose data exist drawn, and the flags beside the numbers; for
the sweep with a setting at chance accuracy, an OOM and a GPU mismatch (MARKS_SPEC), the marks' legend before the
first number, the definitions one click away, flagged rows tinted and every figure as wide as the page.
Screenshots go to test-output/browser/ (tests/support/chromium.py); `report-marks.png` is docs/img/report-marks.png.
`python -m tests.tracking.test_report_browser REPORT.html PNG` takes the same full-page screenshot of any report.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubesweep.tracking.aggregate import aggregate
from kubesweep.tracking.report import build
from tests.support.chromium import SHOTS, launch
from tests.support.mlflow_fixtures import MARKS_NAME, MARKS_SPEC, SWEEP_SPEC
from tests.tracking.test_report import CPU_SPEC, records

pytestmark = pytest.mark.browser

@contextlib.contextmanager
def report_page(html_path: Path, profile: Path, width: int = 1400) -> Iterator[Any]:
    """The report open in Chromium (`width` x 900), closed after."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = launch(pw, profile, width=width, height=900)
        try:
            page = context.new_page()
            page.goto(html_path.resolve().as_uri())
            yield page
        finally:
            context.close()


def broken_images(page: Any) -> int:
    return int(page.evaluate("[...document.images].filter(i => !i.complete || i.naturalWidth === 0).length"))


@pytest.mark.parametrize(("spec", "figures"), [(SWEEP_SPEC, 6), (CPU_SPEC, 4)], ids=["gpu-matrix", "cpu"])
def test_the_answer_is_on_the_first_screen(tmp_path: Path, spec: str, figures: int) -> None:
    from playwright.sync_api import expect

    def on_cpu(trial: Any, results: dict[str, Any]) -> None:
        if not trial.gpu:
            results["memory"] = {"torch_peak_allocated_bytes": None, "host_peak_rss_bytes": 3 * 1024**3}

    built = build(aggregate(records(spec, on_cpu), target=0.85), tmp_path / "report", sweep="s", source="test",
                  target=0.85, best_by="samples_per_s")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with report_page(built.html_path, tmp_path / "profile") as page:
        answer = page.get_by_role("heading", name="The answer")
        best = page.get_by_role("heading", name="Best setting per GPU type")
        for heading in (answer, best):
            expect(heading).to_be_in_viewport()  # no scrolling to find the answer
        first = page.locator("ul.answer li").first
        expect(first).to_contain_text("fine-tuning, highest throughput: ")
        expect(first).to_be_in_viewport()
        assert page.locator("figure img").count() == figures == len(built.figures)
        assert broken_images(page) == 0
        assert page.get_by_role("heading", name="All results").count() == 1
        page.screenshot(path=str(SHOTS / f"report-{'cpu' if spec == CPU_SPEC else 'gpu'}.png"), full_page=True)


def test_marks_legend_definitions_and_page_wide_figures(tmp_path: Path) -> None:
    from playwright.sync_api import expect

    built = build(aggregate(records(MARKS_SPEC), target=0.9), tmp_path / "report", sweep=MARKS_NAME,
                  source="the stand-in job's results of tests/support/mlflow_fixtures.py MARKS_SPEC", target=0.9,
                  best_by="samples_per_s")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with report_page(built.html_path, tmp_path / "profile") as page:
        legend = page.locator("p.legend")
        expect(legend).to_contain_text("chance accuracy (0.51)")
        for seen in (legend, page.locator("ul.answer li").first):
            expect(seen).to_be_in_viewport()
        # each figure as wide as the page's text, drawn with at least as many pixels as it is shown with
        sizes = page.evaluate("""() => {
            const page = document.querySelector('h1').getBoundingClientRect().width;
            return [...document.querySelectorAll('figure img')].map(
                i => [i.getBoundingClientRect().width / page, i.naturalWidth / i.getBoundingClientRect().width]);
        }""")
        assert len(sizes) == len(built.figures) == 5, sizes
        assert all(abs(share - 1) < 0.01 and sharp >= 1.0 for share, sharp in sizes), sizes
        assert page.evaluate("document.querySelector('h1').getBoundingClientRect().width") > 1300
        # the setting at chance, the OOM and the mismatch: tinted in the full table, their flags in the row
        full = page.locator("table").last
        for flag in ("chance accuracy (0.51)", "OOM", "GPU mismatch"):
            expect(full.locator("tr.flagged").filter(has_text=flag)).to_have_count(1)
        expect(full.locator("tr.flagged")).to_have_count(3)
        page.screenshot(path=str(SHOTS / "report-marks.png"), full_page=True)
        page.get_by_role("link", name="every number").click()
        expect(page.get_by_role("heading", name="Definitions")).to_be_in_viewport()
        page.get_by_role("link", name="Legend").click()
        expect(page.locator("#mark-chance")).to_be_in_viewport()


def test_at_800_px_every_table_scrolls_in_its_own_box_and_the_page_does_not(tmp_path: Path) -> None:
    built = build(aggregate(records(SWEEP_SPEC), target=0.85), tmp_path / "report", sweep="s", source="test",
                  target=0.85, best_by="samples_per_s")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with report_page(built.html_path, tmp_path / "profile", width=800) as page:
        assert page.evaluate("document.documentElement.scrollWidth") <= 800  # nothing runs off the page
        boxes = page.evaluate("""() => [...document.querySelectorAll('table')].map(t => {
            const box = t.parentElement, r = box.getBoundingClientRect();
            return [box.className, r.right <= window.innerWidth, box.scrollWidth > box.clientWidth]; })""")
        assert boxes and all(cls == "scroll" and inside for cls, inside, _ in boxes), boxes
        assert boxes[-1][2], "the full results table is wider than 800 px: it scrolls inside its box"
        page.screenshot(path=str(SHOTS / "report-800.png"), full_page=False)


def shoot(html_path: Path, png: Path) -> None:
    """A full-page screenshot of a report as Chromium renders it."""
    with tempfile.TemporaryDirectory(prefix="kubesweep-chromium-") as profile, \
            report_page(html_path, Path(profile)) as page:
        assert broken_images(page) == 0, "a figure did not load"
        page.screenshot(path=str(png), full_page=True)


if __name__ == "__main__":
    shoot(Path(sys.argv[1]), Path(sys.argv[2]))
