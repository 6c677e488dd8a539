"""Fitting the report figures' text (kubesweep/tracking/figures.py): labels that never overlap one another and
never leave the figure, whatever the cells.

matplotlib writes a text where it is told and moves none off another; constrained layout makes room for titles,
tick labels and legends, never for the labels written inside an axes. So each figure is drawn, its text measured
with the figure's renderer (display pixels) and then fitted, and drawn again until nothing moves:

- `stack_labels`: the labels written above points of an axes (a flagged point's marks, a failed setting's
  status) are stacked: a label that would cover another, or a marker, goes above it; one that would cross the
  axes' left or right edge moves inward; the y range grows to hold the stack, and past `MAX_GROWTH` the figure
  grows taller. A label moved off its point is tied to it by a thin red line.
- `fit_right`: labels written right of a bar's end (the speed-ups) get room inside the axes.
- `fit_cells`: the figure grows until every cell text and column label of a grid (the heatmap) fits its cell.
- `fit_titles`: titles wider than their room wrap onto more lines.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.backend_bases import RendererBase
    from matplotlib.figure import Figure
    from matplotlib.text import Annotation, Text

GAP = 2.0  # points between two labels
PAD = 3.0  # points between a label and its axes' frame, or a cell text and its cell's edges
MAX_GROWTH = 6.0  # how far a y range may grow (over the data's) to hold its labels before the figure grows instead
ROUNDS = 8  # draws a figure may take to settle
LABEL_COLOR = "tab:red"

Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in display pixels


@dataclass
class Label:
    """A text written above the point (x, y) of an axes' data: `offset` points above it, or higher where that
    spot is taken. `clear`: the radius in points of the marker drawn at the point, which no other label covers."""

    x: float
    y: float
    text: str
    offset: float
    clear: float = 4.0
    artist: Annotation | None = field(default=None, repr=False)
    leader: Annotation | None = field(default=None, repr=False)


def renderer(fig: Figure) -> RendererBase:
    """Lay the figure out and draw it: its text is then where it will be saved, and can be measured."""
    fig.canvas.draw()
    return fig.canvas.get_renderer()  # type: ignore[attr-defined,no-any-return]


def settle(fig: Figure, *steps: Callable[[RendererBase], bool]) -> None:
    """Draw `fig` and run each step (True: it changed something) until a draw changes nothing."""
    for _ in range(ROUNDS):
        r = renderer(fig)
        changed = [step(r) for step in steps]
        if not any(changed):
            return
    renderer(fig)


def _px(fig: Figure, points: float) -> float:
    return points * fig.dpi / 72.0


def _overlap(a: Box, b: Box, gap: float) -> bool:
    return a[0] < b[2] + gap and b[0] < a[2] + gap and a[1] < b[3] + gap and b[1] < a[3] + gap


def wrap(text: str, width: int) -> str:
    """`text`'s lines wrapped at `width` characters (at spaces and hyphens; a longer word is cut)."""
    return "\n".join(textwrap.fill(line, max(1, width)) or line for line in text.split("\n"))


def wrap_to(artist: Text, width_px: float, r: RendererBase) -> bool:
    """Wrap `artist`'s text until it is at most `width_px` wide; True if it changed."""
    text = original = artist.get_text()
    while artist.get_window_extent(r).width > width_px:
        longest = max(len(line) for line in text.split("\n"))
        if longest <= 1:
            break
        scale = width_px / artist.get_window_extent(r).width
        text = wrap(text, min(longest - 1, int(longest * scale)))
        artist.set_text(text)
    return text != original


def fit_titles(fig: Figure, titles: Sequence[Text], per_panel: bool = False) -> Callable[[RendererBase], bool]:
    """A `settle` step: wrap each title to its room, the figure's width about the title's centre (and, with
    `per_panel`, its axes' width, so panels side by side keep their titles apart)."""

    given = [title.get_text() for title in titles]

    def step(r: RendererBase) -> bool:
        changed = False
        pad = _px(fig, PAD)
        for title, text in zip(titles, given, strict=True):
            if not text:
                continue
            was = title.get_text()
            title.set_text(text)  # wrapped afresh each time: no short line left of an earlier wrap
            box = title.get_window_extent(r)
            centre = (box.x0 + box.x1) / 2
            room = 2 * min(centre, fig.bbox.width - centre) - 2 * pad
            axes = title.axes
            if per_panel and axes is not None:
                room = min(room, axes.bbox.width)
            wrap_to(title, room, r)
            changed |= title.get_text() != was
        return changed

    return step


def annotate(ax: Axes, labels: Sequence[Label], fontsize: float = 7.0) -> None:
    """Write each label (at its point for now: `stack_labels` moves it), and a leader line, hidden until
    its label moves off its point."""
    for label in labels:
        label.artist = ax.annotate(
            label.text, (label.x, label.y), textcoords="offset points", xytext=(0, label.offset), ha="left",
            va="bottom", fontsize=fontsize, color=LABEL_COLOR, zorder=6, annotation_clip=False,
            bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.8})
        label.artist.set_in_layout(False)  # kept inside its axes here: no margin for it
        label.leader = ax.annotate(
            "", (label.x, label.y), textcoords="offset points", xytext=(0, label.offset), zorder=5,
            annotation_clip=False,
            arrowprops={"arrowstyle": "-", "color": LABEL_COLOR, "linewidth": 0.6, "shrinkA": 0,
                        "shrinkB": label.clear})
        label.leader.set_in_layout(False)
        label.leader.set_visible(False)


def stack_labels(fig: Figure, panels: Sequence[tuple[Axes, Sequence[Label]]]) -> Callable[[RendererBase], bool]:
    """A `settle` step: place each panel's labels (written by `annotate`) inside its axes, none over another."""
    tops: dict[int, float] = {}

    def step(r: RendererBase) -> bool:
        changed = False
        short = 0.0  # pixels the most crowded axes lacks
        for ax, labels in panels:
            if not labels:
                continue
            bottom, top = ax.get_ylim()
            tops.setdefault(id(ax), top)  # the data's top, as autoscaling set it
            for label in labels:
                assert label.artist is not None
                label.artist.set_text(label.text)  # wrapped afresh to the axes' width as it is now
                wrap_to(label.artist, ax.bbox.width - 2 * _px(fig, PAD), r)
            found, lacking = _stack_top(fig, ax, labels, r, bottom, tops[id(ax)])
            if found is None:
                short = max(short, lacking)
                found = bottom + (tops[id(ax)] - bottom) * MAX_GROWTH
            if abs(found - top) > 1e-9 * max(1.0, abs(top)):
                ax.set_ylim(bottom, found)
                changed = True
            _place(fig, ax, labels, r, bottom, found)
        if short > 0:
            rows = max(1, len({round(ax.bbox.y0) for ax, labels in panels if labels}))
            fig.set_figheight(fig.get_figheight() + (short * rows * 1.1) / fig.dpi)
            changed = True
        return changed

    return step


def _boxes(fig: Figure, ax: Axes, labels: Sequence[Label], r: RendererBase, bottom: float,
           top: float) -> tuple[list[Box], float]:
    """Where the labels go with the y range (bottom, top): their boxes, in `labels`' order, and how far the
    highest sticks out above the axes (pixels; 0 or less: they fit)."""
    box = ax.bbox
    pad, gap = _px(fig, PAD), _px(fig, GAP)
    to_x = ax.transData.transform
    anchors = []
    for label in labels:
        x = float(to_x((label.x, max(label.y, bottom)))[0])
        y = box.y0 + (label.y - bottom) / (top - bottom) * box.height
        anchors.append((x, y))
    taken: list[Box] = []
    for label, (x, y) in zip(labels, anchors, strict=True):
        c = _px(fig, label.clear)
        taken.append((x - c, y - c, x + c, y + c))  # the label's marker
    out: list[Box | None] = [None] * len(labels)
    for i in sorted(range(len(labels)), key=lambda k: (anchors[k][1], anchors[k][0])):
        artist = labels[i].artist
        assert artist is not None
        extent = artist.get_window_extent(r)
        w, h = extent.width, extent.height
        x, y = anchors[i]
        left = min(max(x - w / 2, box.x0 + pad), box.x1 - pad - w)
        low = max(y + _px(fig, labels[i].offset), box.y0 + pad)
        mine = taken[i]
        while True:
            spot = (left, low, left + w, low + h)
            hit = [t for t in taken if t is not mine and _overlap(spot, t, gap)]
            if not hit:
                break
            low = max(t[3] for t in hit) + gap
        taken.append(spot)
        out[i] = spot
    placed = [b for b in out if b is not None]
    return placed, max(b[3] for b in placed) - (box.y1 - pad)


def _stack_top(fig: Figure, ax: Axes, labels: Sequence[Label], r: RendererBase, bottom: float,
               data_top: float) -> tuple[float | None, float]:
    """The lowest y top (the data's, or a range up to MAX_GROWTH times the data's) at which the labels fit; else
    None and the pixels they lack at the highest top."""
    span = max(data_top - bottom, 1e-12)
    growth, lacking = 1.0, 0.0
    while growth <= MAX_GROWTH:
        top = bottom + span * growth
        _, lacking = _boxes(fig, ax, labels, r, bottom, top)
        if lacking <= 0:
            return top, 0.0
        growth *= 1.05
    return None, lacking


def _place(fig: Figure, ax: Axes, labels: Sequence[Label], r: RendererBase, bottom: float, top: float) -> None:
    boxes, _ = _boxes(fig, ax, labels, r, bottom, top)
    per_point = 72.0 / fig.dpi
    for label, (x0, y0, x1, _) in zip(labels, boxes, strict=True):
        assert label.artist is not None and label.leader is not None
        x = float(ax.transData.transform((label.x, max(label.y, bottom)))[0])
        y = ax.bbox.y0 + (label.y - bottom) / (top - bottom) * ax.bbox.height
        label.artist.xyann = ((x0 - x) * per_point, (y0 - y) * per_point)
        moved = y0 - y > _px(fig, label.offset + GAP) or not x0 <= x <= x1
        label.leader.set_visible(moved)
        label.leader.xyann = ((min(max(x, x0), x1) - x) * per_point, (y0 - y) * per_point)


def fit_right(fig: Figure, ax: Axes, texts: Sequence[Annotation]) -> Callable[[RendererBase], bool]:
    """A `settle` step: widen the x range until every text of `texts`, written right of its point (`xy`, data),
    ends inside the axes."""

    def step(r: RendererBase) -> bool:
        left, right = ax.get_xlim()
        box, pad = ax.bbox, _px(fig, PAD)
        need = right
        for text in texts:
            x = float(ax.transData.transform((float(text.xy[0]), 0.0))[0])
            reach = text.get_window_extent(r).x1 - x  # how far right of its point the text ends
            room = box.width - pad - reach
            if x + reach > box.x1 - pad and room > 0:  # its point at `room` pixels from the left edge
                need = max(need, left + (float(text.xy[0]) - left) * box.width / room * 1.01)
        if need > right:
            ax.set_xlim(left, need)
            return True
        return False

    return step


def fit_cells(fig: Figure, ax: Axes, columns: int, rows: int, texts: Sequence[Text],
              max_width: float = 200.0) -> Callable[[RendererBase], bool]:
    """A `settle` step: grow the figure (up to `max_width` inches wide) until each of `texts` (one per cell of
    a `rows` x `columns` grid filling `ax`) and each column's tick label fits inside a cell."""

    def step(r: RendererBase) -> bool:
        pad = _px(fig, PAD)
        cells = [t.get_window_extent(r) for t in texts if t.get_text()]
        ticks = [t.get_window_extent(r) for t in ax.get_xticklabels() if t.get_text()]
        rows_ = [t.get_window_extent(r) for t in ax.get_yticklabels() if t.get_text()]
        wide = max([b.width + 2 * pad for b in cells] + [b.width + pad for b in ticks], default=0.0)
        tall = max([b.height + 2 * pad for b in cells] + [b.height + pad for b in rows_], default=0.0)
        grow_w = max(0.0, wide - ax.bbox.width / columns) * columns / fig.dpi
        grow_h = max(0.0, tall - ax.bbox.height / rows) * rows / fig.dpi
        width, height = fig.get_size_inches()
        grow_w = min(grow_w, max(0.0, max_width - width))
        if grow_w <= 0.01 and grow_h <= 0.01:
            return False
        fig.set_size_inches(width + grow_w * 1.05, height + grow_h * 1.05)
        return True

    return step
