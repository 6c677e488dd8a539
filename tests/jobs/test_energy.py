"""The energy figures (kubesweep/jobs/energy.py): arithmetic by hand, and which windows count. NVML's counter
cannot be read here (no GPU): the meter is a stand-in that returns set readings, in joules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kubesweep.jobs.energy import EnergyMeter, EnergyWindow, energy_metrics, energy_stats


class Readings(EnergyMeter):
    """A meter whose counter reads the given joules, one per read (None: the board has no counter)."""

    def __init__(self, *joules: float | None) -> None:
        super().__init__([])
        self._next: Iterator[float | None] = iter(joules)

    def read_j(self) -> float | None:
        return next(self._next)


def test_joules_per_sample_kwh_per_epoch_and_power_by_hand() -> None:
    stats = energy_stats(1000.0, 10.0, 20_000, 67_349)
    assert stats is not None
    assert stats["j_per_sample"] == 0.05 and stats["mean_power_w"] == 100.0
    assert stats["kwh_per_epoch"] == pytest.approx(0.05 * 67_349 / 3.6e6)  # 9.35e-4 kWh
    assert energy_stats(1000.0, 10.0, 800, None)["kwh_per_epoch"] is None  # type: ignore[index]  # inference
    assert energy_stats(0.0, 10.0, 800, 100) is None and energy_stats(5.0, 1.0, 0, 100) is None
    assert energy_metrics(stats) == {"result/j_per_sample": 0.05, "result/gpu_power_w": 100.0,
                                     "result/kwh_per_epoch": pytest.approx(9.3540e-4, rel=1e-4)}
    assert energy_metrics(None) == {}


def test_only_whole_measured_windows_count_and_pauses_do_not() -> None:
    # marks and closes as the training loop makes them: start, a warm-up window, a measured window, an
    # evaluation pause (close, then mark again after it), a measured window
    window = EnergyWindow(Readings(100.0, 400.0, 600.0, 900.0, 1000.0))
    window.mark()                                                # 100 J
    window.close(measured=False, samples=64, seconds=2.0)        # 400: warm-up, not counted
    window.close(measured=True, samples=640, seconds=1.0)        # 600: +200 J
    window.mark()                                                # 900: after the evaluation (300 J left out)
    window.close(measured=True, samples=640, seconds=1.0)        # 1000: +100 J
    assert (window.joules, window.samples, window.seconds) == (300.0, 1280, 2.0)


def test_a_counter_that_goes_backwards_or_cannot_be_read_counts_nothing() -> None:
    window = EnergyWindow(Readings(500.0, 100.0, None, 200.0))
    window.mark()
    window.close(measured=True, samples=64, seconds=1.0)  # reset (driver reload): 100 < 500
    window.close(measured=True, samples=64, seconds=1.0)  # unreadable
    window.close(measured=True, samples=64, seconds=1.0)  # no mark before it: the last read failed
    assert (window.joules, window.samples) == (0.0, 0)


def test_no_devices_no_meter() -> None:
    assert EnergyMeter.open([]) is None
