"""An SVG chart kit: bar, line, small-multiples, scatter and heatmap charts as inline SVG, made on the
server: no JavaScript library, no CDN, and the same markup works inside the self-contained HTML export.
Every text is XML-escaped.

Each function returns one ``<svg>`` element (a string) with a ``<title>`` and an ``aria-label``, and
axis labels; values that are None or not finite are left out. What a report plots with it is in
webui/plots.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, TypeGuard
from xml.sax.saxutils import escape

PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#393b79",
    "#637939",
    "#8c6d31",
    "#843c39",
)
WIDTH, HEIGHT = 640, 300
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 30, 70


def _ok(value: object) -> TypeGuard[float]:
    return value is not None and isinstance(value, (int, float)) and math.isfinite(value)


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    exponent = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * exponent:
            return step * exponent
    return 10 * exponent


def _open(title: str, css_class: str, width: int = WIDTH, height: int = HEIGHT) -> list[str]:
    t = escape(title)
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="plot {css_class}" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{t}">',
        f"<title>{t}</title>",
        f'<text x="{width / 2}" y="18" text-anchor="middle" class="plot-title" font-size="14">{t}</text>',
    ]


def _axes(
    lines: list[str],
    y_min: float,
    y_max: float,
    y_label: str,
    x_label: str,
    ticks: int = 5,
    width: int = WIDTH,
    height: int = HEIGHT,
) -> None:
    plot_h = height - TOP - BOTTOM
    for i in range(ticks + 1):
        value = y_min + (y_max - y_min) * i / ticks
        y = TOP + plot_h * (1 - i / ticks)
        lines.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{width - RIGHT}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        lines.append(
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{value:.3g}</text>'
        )
    lines.append(f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{height - BOTTOM}" stroke="#333"/>')
    lines.append(
        f'<line x1="{LEFT}" y1="{height - BOTTOM}" x2="{width - RIGHT}" y2="{height - BOTTOM}" stroke="#333"/>'
    )
    lines.append(
        f'<text x="14" y="{TOP + plot_h / 2:.1f}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 14 {TOP + plot_h / 2:.1f})">{escape(y_label)}</text>'
    )
    lines.append(
        f'<text x="{(LEFT + width - RIGHT) / 2:.1f}" y="{height - 6}" font-size="12" '
        f'text-anchor="middle">{escape(x_label)}</text>'
    )


def bar_chart(
    title: str,
    labels: Sequence[str],
    values: Sequence[float | None],
    *,
    errors: Sequence[float | None] | None = None,
    y_label: str = "",
    x_label: str = "",
    y_max: float | None = None,
    css_class: str = "bars",
) -> str:
    """Vertical bars, one per label, with optional ± error bars."""
    errors = errors or [None] * len(values)
    tops = [v + (e if _ok(e) else 0.0) for v, e in zip(values, errors) if _ok(v)]
    top = y_max if y_max is not None else _nice_max(max(tops, default=1.0))
    lines = _open(title, css_class)
    _axes(lines, 0.0, top, y_label, x_label)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(len(labels), 1)
    for i, (label, value, error) in enumerate(zip(labels, values, errors)):
        x = LEFT + slot * i
        if _ok(value):
            h = plot_h * min(max(value, 0.0), top) / top
            lines.append(
                f'<rect class="bar" x="{x + slot * 0.15:.1f}" y="{TOP + plot_h - h:.1f}" width="{slot * 0.7:.1f}" '
                f'height="{h:.1f}" fill="{PALETTE[i % len(PALETTE)]}"><title>{escape(label)}: {value:.3g}'
                f"{f' ± {error:.3g}' if _ok(error) else ''}</title></rect>"
            )
            if _ok(error):
                cx = x + slot / 2
                low, high = max(value - error, 0.0), min(value + error, top)
                y_low, y_high = TOP + plot_h * (1 - low / top), TOP + plot_h * (1 - high / top)
                lines.append(
                    f'<path class="error-bar" d="M{cx:.1f},{y_low:.1f}V{y_high:.1f}M{cx - 5:.1f},{y_low:.1f}'
                    f'h10M{cx - 5:.1f},{y_high:.1f}h10" stroke="#222" fill="none"/>'
                )
        lines.append(
            f'<text x="{x + slot / 2:.1f}" y="{HEIGHT - BOTTOM + 12}" font-size="10" text-anchor="end" '
            f'transform="rotate(-35 {x + slot / 2:.1f} {HEIGHT - BOTTOM + 12})">{escape(label)}</text>'
        )
    lines.append("</svg>")
    return "\n".join(lines)


def _series(
    lines: list[str],
    name: str,
    values: Sequence[float | None],
    x_values: list[int],
    color: str,
    sx,
    sy,
    mark: int | None,
    radius: int,
) -> None:
    """One series as a polyline (finite values only), with ``mark`` (an x) circled as the best gamma."""
    points = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(x_values, values) if _ok(y))
    if points:
        lines.append(
            f'<polyline class="series" points="{points}" fill="none" stroke="{color}" stroke-width="2">'
            f"<title>{escape(name)}</title></polyline>"
        )
    if mark in x_values and _ok(values[x_values.index(mark)]):
        y = values[x_values.index(mark)]
        lines.append(
            f'<circle class="best" cx="{sx(mark):.1f}" cy="{sy(y):.1f}" r="{radius}" fill="{color}" stroke="#000">'
            f"<title>{escape(name)}: best gamma {mark}, {y:.3g}</title></circle>"
        )


def _y_range(finite: list[float]) -> tuple[float, float]:
    """The (y_min, y_max) of a chart of the finite values: from 0 unless the values sit well above it,
    up to a round number."""
    low, high = min(finite, default=0.0), max(finite, default=1.0)
    y_min = 0.0 if low >= 0 and low < 0.5 * high else math.floor(low * 10) / 10
    return y_min, _nice_max(high)


def line_chart(
    title: str,
    x_values: Sequence[int],
    series: dict[str, Sequence[float | None]],
    *,
    marks: dict[str, int] | None = None,
    reference: float | None = None,
    y_label: str = "",
    x_label: str = "",
    css_class: str = "lines",
) -> str:
    """One polyline per series over ``x_values``; ``marks[name]`` = the x to circle on that series;
    ``reference`` draws a dashed horizontal line (e.g. speedup 1). The legend is below the x axis."""
    x_values = list(x_values)
    finite = [v for values in series.values() for v in values if _ok(v)] + (
        [reference] if _ok(reference) else []
    )
    y_min, y_max = _y_range(finite)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    rows = (len(series) + 4) // 5
    lines = _open(title, css_class, height=TOP + plot_h + 48 + rows * 14)
    _axes(lines, y_min, y_max, y_label, "")
    x0, x1 = min(x_values, default=0), max(x_values, default=1)

    def sx(x):
        return LEFT + plot_w * ((x - x0) / (x1 - x0) if x1 > x0 else 0.5)

    def sy(y):
        return TOP + plot_h * (1 - (y - y_min) / (y_max - y_min if y_max > y_min else 1.0))

    for x in x_values:
        lines.append(
            f'<text x="{sx(x):.1f}" y="{TOP + plot_h + 14:.1f}" font-size="10" text-anchor="middle">{x}</text>'
        )
    lines.append(
        f'<text x="{(LEFT + WIDTH - RIGHT) / 2:.1f}" y="{TOP + plot_h + 30:.1f}" font-size="12" '
        f'text-anchor="middle">{escape(x_label)}</text>'
    )
    if _ok(reference) and y_min <= reference <= y_max:
        lines.append(
            f'<line class="reference" x1="{LEFT}" y1="{sy(reference):.1f}" x2="{WIDTH - RIGHT}" '
            f'y2="{sy(reference):.1f}" stroke="#555" stroke-dasharray="4 3"/>'
        )
    for i, (name, values) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        _series(lines, name, values, x_values, color, sx, sy, (marks or {}).get(name), 5)
        lx, ly = LEFT + (i % 5) * 118, TOP + plot_h + 46 + (i // 5) * 14
        lines.append(
            f'<rect x="{lx}" y="{ly - 8}" width="10" height="10" fill="{color}"/>'
            f'<text x="{lx + 14}" y="{ly + 1}" font-size="10">{escape(name)}</text>'
        )
    lines.append("</svg>")
    return "\n".join(lines)


MULTIPLES_FROM = 5  # more series than this in one chart overlap: draw one small panel per series instead


@dataclass(frozen=True)
class Background:
    """A series drawn in grey behind every panel of :func:`small_multiples` for comparison (e.g. the
    whole workload), with the label its title and the legend give it; ``values`` None draws nothing."""

    values: Sequence[float | None] | None
    label: str = ""


# a small-multiples panel: its height, and the room its plot area leaves for labels on three sides
PANEL_HEIGHT, PANEL_PAD_LEFT, PANEL_PAD_TOP, PANEL_PAD_BOTTOM = 118, 34, 18, 22


@dataclass(frozen=True)
class _Panel:
    """One panel of :func:`small_multiples`: its top-left corner, its plot area and the shared ranges."""

    left: float
    top: float
    inner_w: float
    inner_h: float
    x0: int
    x1: int
    y_min: float
    y_max: float

    def sx(self, x):
        """The panel's x coordinate of the value x."""
        return (
            self.left
            + PANEL_PAD_LEFT
            + self.inner_w * ((x - self.x0) / (self.x1 - self.x0) if self.x1 > self.x0 else 0.5)
        )

    def sy(self, y):
        """The panel's y coordinate of the value y."""
        y_span = self.y_max - self.y_min if self.y_max > self.y_min else 1.0
        return self.top + PANEL_PAD_TOP + self.inner_h * (1 - (y - self.y_min) / y_span)


def small_multiples(
    title: str,
    x_values: Sequence[int],
    series: dict[str, Sequence[float | None]],
    *,
    marks: dict[str, int] | None = None,
    reference: float | None = None,
    background: Background | None = None,
    y_label: str = "",
    x_label: str = "",
    css_class: str = "lines",
    columns: int = 4,
) -> str:
    """One small panel per series, on a shared y range, in a grid of ``columns``: the series in its
    colour with ``marks[name]`` circled, ``background`` (e.g. the whole workload) in grey behind it for
    comparison, and ``reference`` dashed. Readable with 13 task types where one chart is a tangle."""
    x_values = list(x_values)
    grey, grey_label = (background.values, background.label) if background else (None, "")
    finite = [v for values in list(series.values()) + [grey or []] for v in values if _ok(v)]
    finite += [reference] if _ok(reference) else []
    y_min, y_max = _y_range(finite)
    panel_w = WIDTH / columns
    rows = (len(series) + columns - 1) // columns
    height = TOP + rows * PANEL_HEIGHT + 34
    lines = _open(title, css_class, height=height)
    x0, x1 = min(x_values, default=0), max(x_values, default=1)
    inner_w, inner_h = panel_w - PANEL_PAD_LEFT - 8, PANEL_HEIGHT - PANEL_PAD_TOP - PANEL_PAD_BOTTOM
    for i, (name, values) in enumerate(series.items()):
        left, top = (i % columns) * panel_w, TOP + (i // columns) * PANEL_HEIGHT
        panel = _Panel(left, top, inner_w, inner_h, x0, x1, y_min, y_max)
        lines.append(
            f'<g class="panel"><text x="{left + PANEL_PAD_LEFT}" y="{top + 12}" font-size="11" font-weight="bold">'
            f"{escape(name)}</text>"
        )
        _panel_frame(lines, panel, reference)
        if grey:
            points = " ".join(
                f"{panel.sx(x):.1f},{panel.sy(y):.1f}" for x, y in zip(x_values, grey) if _ok(y)
            )
            if points:
                lines.append(
                    f'<polyline class="background" points="{points}" fill="none" stroke="#bbb" stroke-width="1.5">'
                    f"<title>{escape(grey_label)}</title></polyline>"
                )
        color = PALETTE[i % len(PALETTE)]
        _series(lines, name, values, x_values, color, panel.sx, panel.sy, (marks or {}).get(name), 4)
        lines.append("</g>")
    legend = f"{y_label} against {x_label}" + (f"; grey: {grey_label}" if grey else "")
    lines.append(
        f'<text x="{WIDTH / 2}" y="{height - 10}" font-size="11" text-anchor="middle">{escape(legend)}</text>'
    )
    lines.append("</svg>")
    return "\n".join(lines)


def _panel_frame(lines: list[str], panel: _Panel, reference: float | None) -> None:
    """A panel's box, its y range and x range written at the ends, and ``reference`` dashed."""
    left, top = panel.left + PANEL_PAD_LEFT, panel.top + PANEL_PAD_TOP
    lines.append(
        f'<rect x="{left:.1f}" y="{top:.1f}" width="{panel.inner_w:.1f}" height="{panel.inner_h:.1f}" '
        f'fill="none" stroke="#ccc"/>'
    )
    for value in (panel.y_min, panel.y_max):
        lines.append(
            f'<text x="{left - 3:.1f}" y="{panel.sy(value) + 4:.1f}" font-size="9" text-anchor="end">'
            f"{value:.3g}</text>"
        )
    for x in (panel.x0, panel.x1):
        lines.append(
            f'<text x="{panel.sx(x):.1f}" y="{top + panel.inner_h + 11:.1f}" font-size="9" '
            f'text-anchor="middle">{x}</text>'
        )
    if _ok(reference) and panel.y_min <= reference <= panel.y_max:
        lines.append(
            f'<line class="reference" x1="{panel.sx(panel.x0):.1f}" y1="{panel.sy(reference):.1f}" '
            f'x2="{panel.sx(panel.x1):.1f}" y2="{panel.sy(reference):.1f}" stroke="#555" stroke-dasharray="3 3"/>'
        )


def per_series_chart(
    title: str, x_values: Sequence[int], series: dict[str, Sequence[float | None]], **options
) -> str:
    """A line chart, or small multiples once there are more than MULTIPLES_FROM series."""
    if len(series) > MULTIPLES_FROM:
        return small_multiples(title, x_values, series, **options)
    options.pop("background", None)
    return line_chart(title, x_values, series, **options)


SCATTER_SIDE = 320  # the scatter's plot area is square, so the y = x line is its diagonal


def _square_range(values: Sequence[float], intervals: int = 5) -> tuple[float, float]:
    """One (low, high) for both axes of a scatter: the values' min to max with a margin of 8% of their
    span (5% of the value, at least 0.01, for a single value or equal ones), widened to ``intervals``
    round steps (1, 2, 2.5 or 5 times a power of ten); (0, 1) without values. Never below 0 for
    values that are not."""
    if not values:
        return 0.0, 1.0
    low, high = min(values), max(values)
    pad = (high - low) * 0.08 if high > low else max(0.05 * abs(high), 0.01)
    low, high = low - pad, high + pad
    step = _nice_max((high - low) / intervals)
    while True:
        start = math.floor(low / step) * step
        if min(values) >= 0 > start:
            start = 0.0
        if start + intervals * step >= high:
            return start, start + intervals * step
        step = _nice_max(step * 1.0001)  # the next round step


def scatter(
    title: str,
    points: Sequence[tuple[float, float, str]],
    *,
    x_label: str = "",
    y_label: str = "",
    diagonal: bool = True,
    note: str = "",
    css_class: str = "scatter",
) -> str:
    """Points (x, y, label) on a square plot with the dashed y = x line corner to corner: both axes
    share one range chosen from the data (:func:`_square_range`), so points near each other are not
    crowded into a corner of a 0-based range. ``note`` is a line under the x axis's label."""
    good = [(x, y, label) for x, y, label in points if _ok(x) and _ok(y)]
    low, high = _square_range([v for x, y, _ in good for v in (x, y)])
    side, width = SCATTER_SIDE, LEFT + SCATTER_SIDE + RIGHT
    axes_height = TOP + side + BOTTOM
    lines = _open(title, css_class, width=width, height=axes_height + (18 if note else 0))
    _axes(lines, low, high, y_label, x_label, width=width, height=axes_height)

    def sx(x):
        return LEFT + side * (x - low) / (high - low)

    def sy(y):
        return TOP + side * (1 - (y - low) / (high - low))

    for i in range(6):
        value = low + (high - low) * i / 5
        lines.append(
            f'<text x="{sx(value):.1f}" y="{TOP + side + 14}" font-size="10" text-anchor="middle">{value:.3g}</text>'
        )
    if diagonal:
        lines.append(
            f'<line class="diagonal" x1="{sx(low):.1f}" y1="{sy(low):.1f}" x2="{sx(high):.1f}" y2="{sy(high):.1f}" '
            'stroke="#888" stroke-dasharray="4 3"/>'
        )
    for x, y, label in good:
        lines.append(
            f'<circle class="point" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="#1f77b4">'
            f"<title>{escape(label)}: predicted {x:.3g}, measured {y:.3g}</title></circle>"
        )
    if note:
        lines.append(
            f'<text class="plot-note" x="{(LEFT + width - RIGHT) / 2:.1f}" y="{axes_height + 10}" font-size="11" '
            f'text-anchor="middle">{escape(note)}</text>'
        )
    lines.append("</svg>")
    return "\n".join(lines)


def heatmap(
    title: str, labels: Sequence[str], matrix: Sequence[Sequence[int]], *, css_class: str = "heatmap"
) -> str:
    """A confusion matrix: rows are true labels, columns predicted; darker = more prompts."""
    n = len(labels)
    cell = min(32, 420 // max(n, 1))
    left, top = 130, 40
    width, height = left + cell * n + 20, top + cell * n + 110
    biggest = max((v for row in matrix for v in row), default=1) or 1
    lines = _open(title, css_class, width=width, height=height)
    for i, row in enumerate(matrix):
        lines.append(
            f'<text x="{left - 4}" y="{top + cell * i + cell / 2 + 4:.1f}" font-size="10" '
            f'text-anchor="end">{escape(labels[i])}</text>'
        )
        for j, value in enumerate(row):
            shade = 1 - 0.85 * value / biggest
            color = f"rgb({int(255 * shade)},{int(255 * shade)},255)"
            lines.append(
                f'<rect class="cell" x="{left + cell * j}" y="{top + cell * i}" width="{cell}" height="{cell}" '
                f'fill="{color}" stroke="#fff"><title>true {escape(labels[i])}, predicted '
                f"{escape(labels[j])}: {value}</title></rect>"
            )
            if value:
                lines.append(
                    f'<text x="{left + cell * j + cell / 2}" y="{top + cell * i + cell / 2 + 4}" font-size="9" '
                    f'text-anchor="middle">{value}</text>'
                )
    for j, label in enumerate(labels):
        x = left + cell * j + cell / 2
        y = top + cell * n + 8
        lines.append(
            f'<text x="{x}" y="{y}" font-size="10" text-anchor="end" transform="rotate(-55 {x} '
            f'{y})">{escape(label)}</text>'
        )
    lines.append(
        f'<text x="{left + cell * n / 2}" y="{height - 4}" font-size="12" text-anchor="middle">predicted</text>'
    )
    lines.append("</svg>")
    return "\n".join(lines)
