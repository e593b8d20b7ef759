"""Small line charts as inline SVG, one quantity a panel with its own axis: the Dashboard's and the round report's.

Pure functions from numbers to markup: no JavaScript, no request to anything, every label escaped. A panel holds one
or more series (a line with dots, and optionally a band: an interval at each point) and optional reference lines
(chance at 50%, the accuracy bar). Panels sit in a grid that wraps, so a phone shows them one under another.
"""

from __future__ import annotations

import html
from functools import partial
import math
from dataclasses import dataclass, field

WIDTH, HEIGHT = 340, 190
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 12, 34
"""The plot area's margins inside a panel, in px: room for the y ticks on the left and the x ticks below."""
text = partial(html.escape, quote=False)
"""Escapes what goes between tags (a label may carry any text; quotes need no escape there)."""
COLORS = ("#2563eb", "#d97706", "#059669", "#7c3aed")
GRID_CSS = (".plots{display:flex;flex-wrap:wrap;gap:12px}.plot{flex:1 1 320px;max-width:440px;margin:0}"
            ".plot figcaption{font-weight:600;font-size:14px;margin:0 0 2px}.plot svg{width:100%;height:auto}"
            ".plot .empty{color:#6b7280;font-size:13px}.plot .legend{font-size:12px;color:#374151}")


@dataclass(frozen=True)
class Series:
    """One line of a panel."""

    label: str
    points: list[tuple[float, float]]
    """(x, y), in the order drawn."""
    band: list[tuple[float, float, float]] = field(default_factory=list)
    """(x, low, high): an interval around the line, drawn as a shaded area."""


@dataclass(frozen=True)
class Panel:
    """One quantity: its title (with its unit), its lines, and how its axis reads."""

    title: str
    series: list[Series]
    x_label: str = "round"
    percent: bool = False
    """Values are shares: the axis reads 0%-100%."""
    references: list[tuple[float, str]] = field(default_factory=list)
    """(y, label): dashed horizontal lines, e.g. chance at 0.5."""
    empty_note: str = "No rounds yet."

    @property
    def empty(self) -> bool:
        return not any(series.points for series in self.series)


def nice_ticks(low: float, high: float, count: int = 4) -> list[float]:
    """About `count` round values from at or below `low` to at or above `high`: steps of 1, 2, 2.5 or 5 times a power
    of ten (0, 0.25, 0.5, 0.75, 1 for 0 to 1; 0, 20, 40, 60 for 3 to 57)."""
    if high <= low:
        low, high = low - 1, high + 1
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.floor(low / step + 1e-9) * step
    ticks = [first]
    while ticks[-1] < high - 1e-9 * step:
        ticks.append(ticks[-1] + step)
    return [round(tick, 10) for tick in ticks]


def tick_text(value: float, percent: bool) -> str:
    """An axis label: "25%", "0.003", "1.2k", "160"."""
    value = value + 0.0  # -0.0 reads 0
    if percent:
        return f"{value:.0%}" if abs(value * 100 - round(value * 100)) < 1e-9 else f"{value:.1%}"
    if abs(value) >= 1000:
        return f"{value / 1000:.3g}k"
    return f"{value:.3g}"


def _bounds(panel: Panel) -> tuple[float, float, float, float]:
    xs = [x for series in panel.series for x, _y in series.points]
    ys = [y for series in panel.series for _x, y in series.points]
    ys += [value for series in panel.series for _x, low, high in series.band for value in (low, high)]
    ys += [y for y, _label in panel.references]
    if panel.percent:
        ys += [0.0, 1.0]
    x_low, x_high = min(xs), max(xs)
    if x_low == x_high:
        x_low, x_high = x_low - 1, x_high + 1
    return x_low, x_high, min(ys), max(ys)


class _Frame:
    """Data to pixels for one panel."""

    def __init__(self, x_low: float, x_high: float, y_ticks: list[float]):
        self.x_low, self.x_high, self.y_low, self.y_high = x_low, x_high, y_ticks[0], y_ticks[-1]

    def x(self, value: float) -> float:
        return LEFT + (value - self.x_low) / (self.x_high - self.x_low) * (WIDTH - LEFT - RIGHT)

    def y(self, value: float) -> float:
        return HEIGHT - BOTTOM - (value - self.y_low) / (self.y_high - self.y_low) * (HEIGHT - TOP - BOTTOM)


def _axes(frame: _Frame, y_ticks: list[float], x_ticks: list[float], panel: Panel) -> list[str]:
    parts = []
    for tick in y_ticks:
        y = frame.y(tick)
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e7eb"/>'
                     f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11" fill="#374151">'
                     f'{text(tick_text(tick, panel.percent))}</text>')
    for tick in x_ticks:
        x = frame.x(tick)
        parts.append(f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 15}" text-anchor="middle" font-size="11" '
                     f'fill="#374151">{text(tick_text(tick, False))}</text>')
    parts.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2:.1f}" y="{HEIGHT - 4}" text-anchor="middle" font-size="11" '
                 f'fill="#6b7280">{text(panel.x_label)}</text>')
    for value, label in panel.references:
        y = frame.y(value)
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#9ca3af" '
                     f'stroke-dasharray="4 3"/><text x="{WIDTH - RIGHT - 2}" y="{y - 3:.1f}" text-anchor="end" '
                     f'font-size="10" fill="#6b7280">{text(label)}</text>')
    return parts


def _series_marks(frame: _Frame, series: Series, color: str) -> list[str]:
    parts = []
    if series.band:
        upper = " ".join(f"{frame.x(x):.1f},{frame.y(high):.1f}" for x, _low, high in series.band)
        lower = " ".join(f"{frame.x(x):.1f},{frame.y(low):.1f}" for x, low, _high in reversed(series.band))
        parts.append(f'<polygon points="{upper} {lower}" fill="{color}" fill-opacity="0.15" stroke="none"/>')
        # and a whisker at each point, so one round's interval shows too
        parts += [f'<line x1="{frame.x(x):.1f}" x2="{frame.x(x):.1f}" y1="{frame.y(low):.1f}" y2="{frame.y(high):.1f}" '
                  f'stroke="{color}" stroke-opacity="0.6" stroke-width="2"/>' for x, low, high in series.band]
    line = " ".join(f"{frame.x(x):.1f},{frame.y(y):.1f}" for x, y in series.points)
    parts.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="2"/>')
    parts += [f'<circle cx="{frame.x(x):.1f}" cy="{frame.y(y):.1f}" r="3" fill="{color}"/>' for x, y in series.points]
    return parts


def panel_svg(panel: Panel) -> str:
    """The panel as one <figure>: its title, its chart (or its empty note), and a legend when it has several lines."""
    title = f"<figcaption>{text(panel.title)}</figcaption>"
    if panel.empty:
        return f'<figure class="plot">{title}<div class="empty">{text(panel.empty_note)}</div></figure>'
    x_low, x_high, y_low, y_high = _bounds(panel)
    y_ticks = [0.0, 0.25, 0.5, 0.75, 1.0] if panel.percent and 0 <= y_low and y_high <= 1 else \
        nice_ticks(y_low, y_high)
    xs = sorted({x for series in panel.series for x, _y in series.points})
    x_ticks = xs if len(xs) <= 8 else nice_ticks(x_low, x_high, 6)
    frame = _Frame(x_low, x_high, y_ticks)
    marks = _axes(frame, y_ticks, [x for x in x_ticks if x_low <= x <= x_high], panel)
    for index, series in enumerate(panel.series):
        marks += _series_marks(frame, series, COLORS[index % len(COLORS)])
    legend = "" if len(panel.series) < 2 else '<div class="legend">' + " · ".join(
        f'<span style="color:{COLORS[i % len(COLORS)]}">&#9632;</span> {text(series.label)}'
        for i, series in enumerate(panel.series)) + "</div>"
    svg = (f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{html.escape(panel.title)}">'
           f'{"".join(marks)}</svg>')  # inline in HTML: no namespace, so no URL in the page
    return f'<figure class="plot">{title}{svg}{legend}</figure>'


def panels_html(panels: list[Panel]) -> str:
    """Every panel in a grid that wraps (its CSS inline, so the markup stands alone)."""
    return f'<style>{GRID_CSS}</style><div class="plots">{"".join(panel_svg(panel) for panel in panels)}</div>'
