"""Whether a faster setting learns what the current one learns: trials' loss curves compared, setting against
setting, with the noise across seeds as the yardstick.

    python bench/loss_curves.py DIR [DIR ...] [--baseline KEY=VALUE ...] [--window 0.2] [--below 0.6]
                                [--markdown OUT.md] [--json OUT.json]

DIR: trial folders (a `results.json` beside its `trial.json`), or folders holding them at any depth (a sweep's
local home; a trial found twice, as in the MLflow store's copy of its files, counts once). A setting is a trial's
job settings less its seed; runs of one setting and one seed are repeats of one training (the same data order and
initial weights, apart only by nondeterministic kernels), so they count as one sample, their mean. Each seed's
figures:

- the window loss: the mean logged training loss over the last `--window` of the steps (default the last 20%);
- the escape step: the first logged step whose loss is below `--below` (a random-init BERT sits near ln 2 = 0.693
  on SST-2 before it learns anything; when it leaves that plateau varies from seed to seed).

Per setting, the window loss's mean over seeds with its 95% interval (`kubesweep.tracking.intervals`). A setting
learns as the baseline does ("equal within noise") when its interval overlaps the baseline's: the answer's own tie
rule. With one seed there is no interval and the verdict says the noise is unknown: two settings' single runs can
differ by where each left the plateau rather than by the setting. The baseline is the setting matching every
`--baseline KEY=VALUE` (job settings, as in trial.json), else the first setting in sorted order.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubesweep.tracking import intervals

PER_RUN = ("seed",)  # job settings that tell runs of one setting apart


@dataclass
class Run:
    setting: tuple[tuple[str, str], ...]
    seed: int
    curve: list[tuple[int, float]]  # (step, loss) as logged


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable JSON file ({exc})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return doc


def find_runs(folders: list[Path]) -> list[Run]:
    """Every succeeded trial with a loss curve under `folders`; ValueError names a file that cannot be read."""
    runs, seen = [], set()
    for folder in folders:
        found = sorted({p.parent for p in [folder / "results.json", *folder.rglob("results.json")]
                        if p.is_file() and (p.parent / "trial.json").is_file()})
        for trial_dir in found:
            trial = _read(trial_dir / "trial.json")
            if trial.get("trial_id") in seen:  # the same trial again (an MLflow store's copy of its files)
                continue
            seen.add(trial.get("trial_id"))
            results, job = _read(trial_dir / "results.json"), trial.get("job") or {}
            try:
                curve = [(int(p["step"]), float(p["loss"])) for p in results.get("loss_curve") or []
                         if p.get("loss") is not None and math.isfinite(float(p["loss"]))]
                seed = int(job.get("seed", 0))
            except (TypeError, ValueError, KeyError, AttributeError) as exc:
                raise ValueError(f"{trial_dir}: a loss curve or seed not as a trial writes it ({exc!r})") from None
            if results.get("outcome") != "succeeded" or not curve:
                continue
            setting = tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in job.items() if k not in PER_RUN))
            runs.append(Run(setting, seed, curve))
    return runs


def window_loss(curve: list[tuple[int, float]], window: float) -> float:
    """The mean loss over the last `window` share of the run's steps (at least its last logged point)."""
    last = curve[-1][0]
    kept = [loss for step, loss in curve if step >= last * (1 - window)] or [curve[-1][1]]
    return statistics.fmean(kept)


def escape_step(curve: list[tuple[int, float]], below: float) -> int | None:
    """The first logged step whose loss is under `below`; None if none is."""
    return next((step for step, loss in curve if loss < below), None)


def per_seed(runs: list[Run], window: float, below: float) -> dict[int, dict[str, Any]]:
    """A setting's figures per seed: its repeats' mean window loss and their escape steps."""
    seeds: dict[int, list[Run]] = {}
    for run in runs:
        seeds.setdefault(run.seed, []).append(run)
    return {seed: {"window_loss": statistics.fmean(window_loss(r.curve, window) for r in rs),
                   "repeats": len(rs), "escape_steps": [escape_step(r.curve, below) for r in rs]}
            for seed, rs in sorted(seeds.items())}


def label(key: tuple[tuple[str, str], ...], varying: set[str]) -> str:
    """A setting by the job settings that vary between the settings compared."""
    return ", ".join(f"{k}={json.loads(v)}" for k, v in key if k in varying) or "(one setting)"


def compare(runs: list[Run], baseline: dict[str, str], window: float, below: float) -> dict[str, Any]:
    """Each setting's window loss over seeds against the baseline's; ValueError when no setting is the baseline."""
    settings: dict[tuple[tuple[str, str], ...], list[Run]] = {}
    for run in runs:
        settings.setdefault(run.setting, []).append(run)
    keys = sorted(settings)
    values: dict[str, set[str]] = {}
    for key in keys:
        for k, v in key:
            values.setdefault(k, set()).add(v)
    varying = {k for k, vs in values.items() if len(vs) > 1 or sum(k in dict(key) for key in keys) < len(keys)}
    wanted = {k: json.dumps(_scalar(v), sort_keys=True) for k, v in baseline.items()}
    base_key = next((key for key in keys if all(dict(key).get(k) == v for k, v in wanted.items())), None)
    if baseline and base_key is None:
        raise ValueError(f"no setting matches --baseline {baseline}; the settings: "
                         + "; ".join(label(k, varying) for k in keys))
    base_key = base_key or keys[0]
    rows = []
    base_interval = None
    for key in [base_key, *(k for k in keys if k != base_key)]:
        seeds = per_seed(settings[key], window, below)
        losses = [s["window_loss"] for s in seeds.values()]
        interval = intervals.interval(losses) if len(losses) > 1 else None
        if key == base_key:
            base_interval = interval
            verdict = "baseline"
        elif interval is None or base_interval is None:
            verdict = "noise unknown: one seed" + ("" if len(losses) < 2 else " in the baseline")
        elif interval.overlaps(base_interval):
            verdict = "equal within noise"
        else:
            verdict = "lower" if interval.high < base_interval.low else "higher"
        rows.append({"setting": label(key, varying), "settings": {k: json.loads(v) for k, v in key},
                     "seeds": seeds, "window_loss": statistics.fmean(losses),
                     "interval": [interval.low, interval.high] if interval else None, "verdict": verdict})
    return {"window": window, "below": below, "settings": rows}


def _scalar(text: str) -> Any:
    """A --baseline value as the job settings hold it: a number, true/false, or the text itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def markdown(report: dict[str, Any]) -> str:
    lines = [f"Loss over the last {report['window']:.0%} of the steps, the mean over seeds (a seed's repeats "
             f"averaged), with its 95% interval; escape: the first logged step under {report['below']}.", "",
             "| setting | seeds | runs | window loss | 95% interval | escape step by seed | against the baseline |",
             "|---|---|---|---|---|---|---|"]
    for row in report["settings"]:
        seeds = row["seeds"]
        interval = "—" if row["interval"] is None else f"{row['interval'][0]:.3f} to {row['interval'][1]:.3f}"
        escapes = "; ".join(f"{seed}: " + ", ".join("never" if s is None else str(s) for s in f["escape_steps"])
                            for seed, f in seeds.items())
        lines.append(f"| {row['setting']} | {len(seeds)} | {sum(f['repeats'] for f in seeds.values())} | "
                     f"{row['window_loss']:.3f} | {interval} | {escapes} | {row['verdict']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="trial folders, or folders holding them")
    parser.add_argument("--baseline", action="append", default=[], metavar="KEY=VALUE",
                        help="the baseline setting's job settings (repeatable); default: the first setting")
    parser.add_argument("--window", type=float, default=0.2, help="share of the last steps averaged (0-1]")
    parser.add_argument("--below", type=float, default=0.6, help="the loss that ends the plateau")
    parser.add_argument("--markdown", type=Path, help="write the table here")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    if not 0 < args.window <= 1:
        parser.error(f"--window {args.window}: expected a share of the steps in (0, 1]")
    baseline = {}
    for item in args.baseline:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--baseline {item!r}: expected KEY=VALUE")
        baseline[key] = value
    missing = [str(f) for f in args.folders if not f.is_dir()]
    if missing:
        parser.error(f"not a folder: {', '.join(missing)}")
    try:
        runs = find_runs(args.folders)
    except ValueError as exc:
        parser.error(str(exc))
    if not runs:
        parser.error("no succeeded trial with a loss curve under " + ", ".join(map(str, args.folders)))
    try:
        report = compare(runs, baseline, args.window, args.below)
    except ValueError as exc:
        parser.error(str(exc))
    text = markdown(report)
    sys.stdout.write(text)
    if args.markdown:
        args.markdown.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
