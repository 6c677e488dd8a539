"""The report's page: its HTML around the answer, tables and figures, and the definitions and marks it ends with
(the notes and column headers link to them). `kubesweep.tracking.report` builds what the page shows."""

from __future__ import annotations

import base64
import datetime as dt
import html
from dataclasses import dataclass, field
from pathlib import Path

from kubesweep.wire.flags import CHANCE_ACCURACY, CHANCE_MARGIN, RANDOM_INIT
from kubesweep.wire.metrics import CATALOGUE, label

# -- definitions and the marks' legend, at the end of the page; notes and column headers link to them -----------

CHANCE_LIMIT = CHANCE_ACCURACY + CHANCE_MARGIN
DEFINITIONS: list[tuple[str, str, str]] = [  # (anchor, term, definition), as docs/tracking.md gives them
    ("def-samples-per-s", label("samples_per_s"),
     "train.samples_per_s: samples per second over the measured training steps "
     "(warm-up excluded), all ranks; inference: inference.samples_per_s."),
    ("def-step-p50", f"{label('step_p50_ms')}, p50 ms", "the median training step time (train.step_time_s.p50) in ms; "
     "inference: the median latency of one batch."),
    ("def-p99", label("latency_p99_ms"), "inference: the 99th-percentile latency of one batch."),
    ("def-peak", label("peak_mem_gib"),
     "memory.torch_peak_allocated_bytes / 2^30, the CUDA caching allocator's peak; CPU "
     "trials: the process's peak resident set."),
    ("def-tta", label("tta_s"), "time-to-accuracy: training wall time from the first optimizer step until the first "
     "evaluation at or above the target accuracy, evaluation excluded; `mean (k/n)` where k of n repeats reached "
     "it."),
    ("def-accuracy", "accuracy", "final_accuracy: the dev accuracy of the last evaluation."),
    ("def-epoch", f"{label('epoch_s')}, epoch time",
     "(timings.train_s - train.warmup_time_s) / train.epochs_completed: the "
     "training loop's wall time per epoch with the warm-up apart (warm-up s), checkpoints included, evaluation "
     "excluded."),
    ("def-cost", label("cost_per_epoch"),
     "the catalog's price_per_hour x GPUs of the trial x epoch time / 3600; none for CPU "
     "trials."),
    ("def-kwh", f"{label('kwh_per_epoch')}, {label('j_per_sample')}",
     "energy.j_per_sample: GPU joules per sample over the measured steps, "
     "from NVML's energy counter (the board's, all ranks); kWh/epoch = J/sample x training rows / 3.6e6."),
    ("def-ci", "mean ±h%, value", "the mean over the repeats that produced the number, ± the half-width of its "
     "95% confidence interval (Student's t, n - 1 degrees of freedom) in percent of the mean; one repeat: no "
     "interval. Settings whose intervals overlap are tied: the answer names them all instead of a winner."),
    ("def-breakeven", "pays off", "torch.compile's extra warm-up over eager / the time it saves per step: the "
     "steps (and epochs) after which the compiled run has caught up."),
    ("def-n", "n", "repeats of the setting (the same settings, another repeat index)."),
    ("def-status", "status", "ok, or what happened: OOM, GPU mismatch, failed, skipped, ..., or a mix such as "
     "`1 ok, 1 OOM`."),
    ("def-scaling", "scaling", "samples/s on N GPUs / (N x samples/s on one GPU)."),
    ("def-speedup", "speed-up vs CPU", "the CPU's p50 latency / this setting's p50 latency."),
    ("def-tflops", label("tflops_per_s"),
     "train.tflops_per_s (inference: inference.tflops_per_s): model FLOPs of the measured "
     "steps over their time, all ranks, counted from the model's shapes and each batch's padded shape: matmuls (2N "
     "per token) and attention (4 x layers x width x padded width per token), forward + backward = 3x forward "
     "(Kaplan et al. 2020; PaLM, appendix B)."),
    ("def-mfu", f"{label('mfu_pct')}, {label('mfu_probe_pct')}",
     "TFLOP/s / (the catalog's dense peak of the GPU type at the trial's precision "
     "x its GPUs): model FLOPs utilization; MFU probe %: against the GEMM probe the trial ran on its GPU at its "
     "precision (what that machine delivered). None on the CPU or where the catalog has no peak: none is invented."),
    ("def-tokens", label("padded_tokens_per_sample"),
     "train.padded_tokens_per_sample: the padded width the model computed on, "
     "per sample of samples/s (tokens/sample: the real tokens)."),
]
MARKS: list[tuple[str, str, str]] = [  # (anchor, mark, meaning)
    ("mark-best", "*", "the best setting per task and GPU type on the chosen metric, among those that learned."),
    ("mark-oom", "OOM", "a repeat ran out of GPU memory: the setting does not fit; a result, not a failure."),
    ("mark-mismatch", "GPU mismatch", "a repeat ran on another GPU than the one asked for: its numbers are not "
     "that GPU's."),
    ("mark-failed", "failed", "a repeat failed for another reason."),
    ("mark-chance", "chance accuracy (0.51)", f"a repeat's final accuracy is at chance (at most {CHANCE_LIMIT:g} "
     "on SST-2's two balanced classes; the lowest is shown): the setting did not learn, and is never the best, "
     "however fast."),
    ("mark-random", "random init: accuracy not meaningful", "the model was built from its config, untrained: a "
     "speed run. Its accuracy (marked `(random init)`) says nothing about the recipe; it is never the best on "
     "accuracy or time to accuracy, and may be on speed, cost and energy."),
    ("mark-share", "k/n", "before a mark: k of the setting's n repeats have it."),
    ("mark-n1", "n=1", "one measured repeat: no spread (tables only)."),
    ("mark-physics", "measurement error", "the physics check: a repeat's TFLOP/s are above the GEMM probe of its GPU "
     "or above 95% of the dense peak, which no model's steps reach: the figure is wrong (a clock or a count), and "
     "the setting is never the best nor tied with it."),
]
# a column header -> the anchor it links to: a metric's label to its definition (`Metric.glossary`), and the rest
ANCHORS = {**{m.label: m.glossary for m in CATALOGUE if m.glossary}, "p50 ms": "def-step-p50", "value": "def-ci",
           "pays off": "def-breakeven", "min/epoch": "def-epoch", "n": "def-n", "status": "def-status",
           "scaling": "def-scaling", "speed-up vs CPU": "def-speedup", "best": "mark-best", "flags": "marks"}
LEGEND = ("Marks beside a number, in every table (flags) and figure: * best per GPU type; OOM; GPU mismatch; "
          f"failed; chance accuracy (0.51): did not learn (a final accuracy at most {CHANCE_LIMIT:g}, the lowest "
          "shown); k/n: k of n repeats. In figures a flagged setting is framed, ringed or hatched in red, its marks "
          "beside its number.")


def _definitions() -> list[str]:
    parts = ["<h2 id='definitions'>Definitions</h2>", "<dl class='defs'>"]
    parts += [f"<dt id='{a}'>{html.escape(t)}</dt><dd>{html.escape(d)}</dd>" for a, t, d in DEFINITIONS]
    parts += ["</dl>", "<h3 id='marks'>Marks</h3>", "<dl class='defs'>"]
    parts += [f"<dt id='{a}'>{html.escape(m)}</dt><dd>{html.escape(d)}</dd>" for a, m, d in MARKS]
    parts.append("</dl>")
    return parts


CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}
div.scroll{max-width:100%;overflow-x:auto;margin:0.5em 0 1.5em}
table{border-collapse:collapse;margin:0;font-size:13px}th,td{border:1px solid #ccc;padding:3px 8px;
text-align:right}th{background:#f0f0f0}td:first-child,th:first-child{text-align:left}.note{color:#555;font-size:13px}
th a{color:inherit}tr.flagged td{background:#fdecec}.legend{font-size:13px;background:#f7f7f7;padding:4px 8px}
figure{margin:1em 0 2em;max-width:1400px}figcaption{color:#555;font-size:13px}
figure img{display:block;width:100%;max-width:1400px;height:auto;border:1px solid #eee}
ul.answer{font-size:16px;line-height:1.5}dl.defs{font-size:13px}dl.defs dt{font-weight:bold;margin-top:0.4em}
dl.defs dd{margin-left:2em}"""


# -- what the page shows ------------------------------------------------------------------------------------


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    note: str = ""

    def markdown(self) -> str:
        lines = [f"### {self.title}", ""]
        if self.note:
            lines += [self.note, ""]
        lines.append("| " + " | ".join(self.headers) + " |")
        lines.append("|" + "|".join("---" for _ in self.headers) + "|")
        lines += ["| " + " | ".join(r) + " |" for r in self.rows]
        return "\n".join(lines) + "\n"

    def html(self) -> str:
        """The table; a header with a definition links to it, a row with flags other than `n=1` is tinted."""
        head = "".join(f"<th><a href='#{ANCHORS[h]}'>{html.escape(h)}</a></th>" if h in ANCHORS
                       else f"<th>{html.escape(h)}</th>" for h in self.headers)
        at = self.headers.index("flags") if "flags" in self.headers else None

        def flagged(row: list[str]) -> bool:
            return at is not None and any(f not in ("", "*", "n=1", RANDOM_INIT) for f in row[at].split("; "))

        body = "".join(("<tr class='flagged'>" if flagged(row) else "<tr>")
                       + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in self.rows)
        note = f"<p class='note'>{html.escape(self.note)}</p>" if self.note else ""
        title = f"<h3>{html.escape(self.title)}</h3>" if self.title else ""
        return (f"{title}{note}<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody>"
                "</table></div>")


@dataclass
class Report:
    sweep: str
    directory: Path
    figures: list[tuple[str, str]] = field(default_factory=list)  # (file, caption)
    skipped: list[str] = field(default_factory=list)
    unanswered: list[str] = field(default_factory=list)  # objectives no setting answers, and why
    tables: list[Table] = field(default_factory=list)
    table_notes: list[str] = field(default_factory=list)
    answer: list[str] = field(default_factory=list)
    best: Table | None = None

    @property
    def html_path(self) -> Path:
        return self.directory / "report.html"



def html_page(report: Report, full: Table, source: str, target: float) -> str:
    """The whole page: the answer, the tables, the figures embedded, all results, the definitions."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>Sweep {html.escape(report.sweep)} report"
             f"</title><style>{CSS}</style></head><body>",
             f"<h1>Sweep {html.escape(report.sweep)}: report</h1>",
             f"<p class='note'>Generated {now} from {html.escape(source)}. Numbers are means over repeats ± the "
             f"half-width of their 95% interval; time-to-accuracy target {target:g}. Definitions: "
             "<a href='#definitions'>every number</a> and <a href='#marks'>the marks</a>, at the end of the "
             "page.</p>",
             f"<p class='legend'>{html.escape(LEGEND)} <a href='#marks'>Legend</a>.</p>",
             "<h2>The answer</h2>", "<ul class='answer'>"]
    parts += [f"<li>{html.escape(line)}</li>" for line in report.answer]
    parts.append("</ul>")
    if report.best is not None:
        parts.append(report.best.html())
    if report.tables:
        parts.append("<h2>Comparison tables</h2>")
    parts += [t.html() for t in report.tables]
    if report.figures:
        parts.append("<h2>Figures</h2>")
    for name, caption in report.figures:
        # embedded, so the page is whole wherever it is opened (a browser, the MLflow artifact viewer)
        data = base64.b64encode((report.directory / name).read_bytes()).decode()
        parts.append(f"<figure><img src='data:image/png;base64,{data}' alt='{html.escape(caption)}' "
                     f"title='{name}'>"
                     f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    parts.append("<h2>All results</h2>")
    parts.append(full.html())
    left_out = [*report.unanswered, *report.table_notes, *report.skipped]
    if left_out:  # what the sweep has nothing for: said once, folded, after what it has
        parts.append(f"<details class='note'><summary>Left out: {len(left_out)} answers, tables and figures this "
                     "sweep has nothing for, and why</summary><ul>")
        parts += [f"<li>{html.escape(s)}</li>" for s in left_out]
        parts.append("</ul></details>")
    parts += _definitions()
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
