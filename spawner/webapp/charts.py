"""The usage page's charts: inline SVG drawn on the server, so the page loads nothing else.

Each function takes plain numbers and names and returns one ``<svg>`` element
as a string: bars with a ``<title>`` tooltip each, axes, labels and a legend.
Every name (user, role, group, image) is escaped where it lands, in text and
in attributes alike, and isolated in the text a reader sees (labels, legends, titles
and tooltips: ``isolate``), so its bidi controls cannot reorder the words around it; an
empty input gives a chart that says so in words.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone, tzinfo
from html import escape
from typing import Any

from spawner.webapp.formatting import FSI, PDI, duration, isolate, moment

# Tableau 10: tells ten series apart, also for most colour-blind readers.
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
           "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")
# How a session ended, in the ledger's words (ledger.REASONS), plus one still running.
REASON_COLOURS = {
    "stopped": "#4e79a7", "culled": "#76b7b2", "max-age": "#edc948", "preempted": "#f28e2b",
    "oom": "#e15759", "failed": "#b07aa1", "zombie": "#9c755f", "budget": "#ff9da7",
    "lost": "#bab0ac", "running": "#59a14f",
}
REASON_WORDS = {
    "stopped": "stopped", "culled": "culled as idle", "max-age": "reached max_age",
    "preempted": "preempted", "oom": "killed for memory", "failed": "failed to start",
    "zombie": "removed as a zombie", "budget": "budget ran out", "lost": "lost in a crash",
    "running": "still running",
}
RESERVED_FILL = "#c9d3df"
USED_FILL = "#2b4c7e"
FONT = "font-family:system-ui,-apple-system,'Segoe UI',sans-serif;font-size:12px"
WIDTH = 1040  # the wide charts: a day or a session along a whole row of the page
NARROW = 520  # bar charts, two to a row


def esc(value: Any) -> str:
    """Text or attribute value, escaped for XML and HTML alike."""
    return escape(str(value), quote=True)


def text_width(text: str) -> float:
    """An upper estimate of ``text``'s width in pixels in the charts' 12px sans-serif font
    (wide letters are about 7px, the common ones less), for room to leave beside it; the
    isolates around a name take none."""
    return 7.0 * (len(text) - text.count(FSI) - text.count(PDI))


def _value_text(value: float, share: float | None) -> str:
    used = "use not measured" if share is None else f"{share:.0%} used"
    return f"{hours(value)} · {used}"


def short(name: str, limit: int = 20) -> str:
    """The name, isolated, cut to ``limit`` characters with "…" after it (outside)."""
    return isolate(name) if len(name) <= limit else isolate(name[: limit - 1]) + "…"


def hours(value: float) -> str:
    """'12.5', '0.25', '1,234', '0.0025': hours for a label; a few minutes are not 0."""
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}".removesuffix(".0")
    if 0 < value < 0.1:  # two significant digits, never in exponent form
        return f"{value:.{1 - math.floor(math.log10(value))}f}".rstrip("0").rstrip(".")
    return f"{value:.2f}".rstrip("0").rstrip(".") if value else "0"


def colours_for(names: Sequence[str]) -> dict[str, str]:
    """A colour for each name, stable for the same set of names (sorted, then the palette)."""
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(sorted(set(names)))}


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """0 and round steps (1, 2, 2.5 or 5 times a power of ten) up to at least ``top``."""
    if top <= 0 or not math.isfinite(top):
        return [0.0, 1.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    ticks = [0.0]
    while ticks[-1] < top - 1e-9:
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def _svg(css_class: str, title: str, height: float, body: list[str], width: int = WIDTH) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart {esc(css_class)}" role="img" '
        f'aria-label="{esc(title)}" viewBox="0 0 {width} {height:.0f}" '
        f'width="100%" preserveAspectRatio="xMinYMin meet" style="{FONT};max-width:{width}px">'
        f"<title>{esc(title)}</title>" + "".join(body) + "</svg>"
    )


def empty_chart(css_class: str, title: str, sentence: str, width: int = WIDTH) -> str:
    """A chart with no data: its title and a sentence saying why it is empty."""
    return _svg(f"{css_class} empty", title, 60, [
        f'<text class="chart-title" x="0" y="16" font-weight="600">{esc(title)}</text>',
        f'<text class="empty-text" x="{width / 2:.0f}" y="44" text-anchor="middle" '
        f'fill="#555">{esc(sentence)}</text>'], width)


LEGEND_ROW = 18  # pixels between the rows of a legend that wraps


def _legend(items: Sequence[tuple[str, str, str]], x: float, y: float,
            width: float = WIDTH) -> tuple[list[str], float]:
    """(label, colour, kind) entries in rows, kind 'box' or 'line', wrapped before the
    chart's right edge; returns the elements and how much lower the last row is than ``y``."""
    out = ['<g class="legend">']
    left, below = x, 0.0
    for label, colour, kind in items:
        step = 16 + text_width(label) + 18
        if x > left and x + step - 18 > width:
            x, below = left, below + LEGEND_ROW
        row = y + below
        if kind == "line":
            out.append(f'<line x1="{x:.1f}" y1="{row - 4:.1f}" x2="{x + 12:.1f}" '
                       f'y2="{row - 4:.1f}" stroke="{colour}" stroke-width="2.5"/>')
        else:
            out.append(f'<rect x="{x:.1f}" y="{row - 10:.1f}" width="12" height="12" '
                       f'fill="{colour}"/>')
        out.append(f'<text x="{x + 16:.1f}" y="{row:.1f}">{esc(label)}</text>')
        x += step
    out.append("</g>")
    return out, below


# --- GPU-hours per day, by role ---------------------------------------------------


def gpu_hours_per_day(rows: Sequence[tuple[str, str, float, float]],
                      days: Sequence[str] = (), colours: Mapping[str, str] | None = None,
                      title: str = "GPU-hours per day by role, reserved against used") -> str:
    """Stacked bars of the GPU-hours reserved each day, one colour per role, and a line
    through what was used. ``rows``: (day, role, reserved, used); ``days``: every day
    of the period, so the days with nothing show as gaps."""
    reserved: dict[str, dict[str, float]] = {}
    used: dict[str, float] = {}
    for day, role, r, u in rows:
        reserved.setdefault(day, {})[role] = reserved.get(day, {}).get(role, 0.0) + (r or 0.0)
        used[day] = used.get(day, 0.0) + (u or 0.0)
    axis = sorted(set(days) | set(reserved))
    if not axis or not any(v > 0 for d in reserved.values() for v in d.values()):
        return empty_chart("gpu-days", title, "No GPU was reserved in this period.")
    roles = sorted({role for d in reserved.values() for role in d})
    colours = dict(colours or colours_for(roles))
    top = max(max(sum(d.values()) for d in reserved.values()), max(used.values(), default=0))
    ticks = nice_ticks(top)
    left, right, top_pad, plot_h = 56, 24, 34, 220
    plot_w = WIDTH - left - right
    scale = plot_h / ticks[-1]
    base = top_pad + plot_h
    slot = plot_w / len(axis)
    bar_w = max(1.0, slot * 0.72)
    out = [f'<text class="chart-title" x="{left}" y="16" font-weight="600">{esc(title)}</text>']
    out += _y_axis(ticks, left, base, scale, plot_w, "GPU-hours")
    every = max(1, math.ceil(len(axis) / 16))
    points = []
    for i, day in enumerate(axis):
        x = left + i * slot + (slot - bar_w) / 2
        y = base
        out.append(f'<g class="day" data-day="{esc(day)}">')
        for role in roles:
            value = reserved.get(day, {}).get(role, 0.0)
            if value <= 0:
                continue
            h = value * scale
            y -= h
            out.append(
                f'<rect class="bar" data-role="{esc(role)}" data-value="{value:.6g}" '
                f'x="{x:.2f}" y="{y:.2f}" width="{bar_w:.2f}" height="{h:.2f}" '
                f'fill="{colours.get(role, PALETTE[0])}"><title>{esc(day)} · {esc(isolate(role))}: '
                f"{hours(value)} GPU-hours reserved</title></rect>")
        day_used = used.get(day, 0.0)
        day_reserved = sum(reserved.get(day, {}).values())
        cy = base - day_used * scale
        points.append(f"{x + bar_w / 2:.2f},{cy:.2f}")
        share = f" ({day_used / day_reserved:.0%} of {hours(day_reserved)} reserved)" \
            if day_reserved else ""
        out.append(
            f'<circle class="used" data-value="{day_used:.6g}" cx="{x + bar_w / 2:.2f}" '
            f'cy="{cy:.2f}" r="3" fill="{USED_FILL}"><title>{esc(day)}: '
            f"{hours(day_used)} GPU-hours used{share}</title></circle>")
        out.append("</g>")
        if i % every == 0:
            out.append(f'<text class="tick" x="{x + bar_w / 2:.2f}" y="{base + 14}" '
                       f'text-anchor="middle" fill="#444">{esc(day[5:])}</text>')
    if len(points) > 1:
        out.append(f'<polyline class="used-line" points="{" ".join(points)}" fill="none" '
                   f'stroke="{USED_FILL}" stroke-width="1.5"/>')
    legend = [(isolate(role), colours.get(role, PALETTE[0]), "box") for role in roles]
    legend.append(("used", USED_FILL, "line"))
    items, below = _legend(legend, left, base + 34)
    out += items
    return _svg("gpu-days", title, base + 44 + below, out)


def _y_axis(ticks: Sequence[float], left: float, base: float, scale: float, plot_w: float,
            unit: str) -> list[str]:
    out = ['<g class="axis y">']
    for t in ticks:
        y = base - t * scale
        out.append(f'<line x1="{left}" y1="{y:.2f}" x2="{left + plot_w:.2f}" y2="{y:.2f}" '
                   f'stroke="#e3e3e3"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.2f}" text-anchor="end" '
                   f'fill="#444">{hours(t)}</text>')
    out.append(f'<text x="12" y="{base - (ticks[-1] * scale) / 2:.1f}" fill="#444" '
               f'text-anchor="middle" transform="rotate(-90 12 '
               f'{base - (ticks[-1] * scale) / 2:.1f})">{esc(unit)}</text>')
    out.append(f'<line x1="{left}" y1="{base:.2f}" x2="{left + plot_w:.2f}" y2="{base:.2f}" '
               'stroke="#888"/></g>')
    return out


# --- horizontal bars: reserved against used, top users --------------------------------


def reserved_vs_used(rows: Sequence[tuple[str, float, float | None]], *, unit: str = "GPU-hours",
                     title: str = "Reserved against used", limit: int = 12,
                     css_class: str = "reserved-used", empty: str = "",
                     width: int = NARROW) -> str:
    """One bar per name: what was reserved (light), what of it was used (dark).

    ``rows``: (name, reserved, used share 0..1 or None when not measured), drawn
    in the order given, at most ``limit`` of them.
    """
    drawn = [(name, r or 0.0, share) for name, r, share in rows if (r or 0) > 0][:limit]
    left_out = sum(1 for _, r, _ in rows if (r or 0) > 0) - len(drawn)
    if not drawn:
        return empty_chart(css_class, title, empty or f"No {unit} were reserved in this period.",
                           width)
    ticks = nice_ticks(max(r for _, r, _ in drawn), 4)
    label_w, row_h, top_pad = 150, 22, 30
    # room right of the longest bar for its value ("12.5 · use not measured"), so that
    # no label is cut at the chart's edge
    right = max(60, max(text_width(_value_text(v, s)) for _, v, s in drawn) + 12)
    plot_w = width - label_w - right
    scale = plot_w / ticks[-1]
    out = [f'<text class="chart-title" x="0" y="16" font-weight="600">{esc(title)}</text>']
    base = top_pad + row_h * len(drawn)
    out.append('<g class="axis x">')
    for t in ticks:
        x = label_w + t * scale
        out.append(f'<line x1="{x:.2f}" y1="{top_pad - 4}" x2="{x:.2f}" y2="{base:.1f}" '
                   f'stroke="#e3e3e3"/><text x="{x:.2f}" y="{base + 14:.1f}" '
                   f'text-anchor="middle" fill="#444">{hours(t)}</text>')
    out.append(f'<text x="{label_w + plot_w / 2:.1f}" y="{base + 30:.1f}" text-anchor="middle" '
               f'fill="#444">{esc(unit)}</text></g>')
    for i, (name, value, share) in enumerate(drawn):
        y = top_pad + i * row_h
        w = value * scale
        tip = f"{isolate(name)}: {hours(value)} {unit} reserved, " + (
            "use not measured" if share is None
            else f"{hours(value * share)} used ({share:.0%})")
        out.append(f'<g class="row" data-name="{esc(name)}">')
        out.append(f'<text class="label" x="{label_w - 8}" y="{y + 14:.1f}" text-anchor="end">'
                   f"{esc(short(name))}<title>{esc(isolate(name))}</title></text>")
        out.append(f'<rect class="bar reserved" data-value="{value:.6g}" x="{label_w}" '
                   f'y="{y + 3:.1f}" width="{w:.2f}" height="{row_h - 6}" '
                   f'fill="{RESERVED_FILL}"><title>{esc(tip)}</title></rect>')
        if share is not None:
            u = value * max(0.0, min(1.0, share))
            out.append(f'<rect class="bar used" data-value="{u:.6g}" x="{label_w}" '
                       f'y="{y + 7:.1f}" width="{u * scale:.2f}" height="{row_h - 14}" '
                       f'fill="{USED_FILL}"><title>{esc(tip)}</title></rect>')
        out.append(f'<text class="value" x="{label_w + w + 6:.2f}" y="{y + 14:.1f}" '
                   f'fill="#333">{esc(_value_text(value, share))}</text></g>')
    height = base + 52
    out += _legend([("reserved", RESERVED_FILL, "box"), ("used", USED_FILL, "box")],
                   label_w, height, width)[0]
    if left_out > 0:
        out.append(f'<text class="more" x="{label_w + 140}" y="{height:.1f}" fill="#555">'
                   f"and {left_out} more, in the table</text>")
    return _svg(css_class, title, height + 8, out, width)


def top_users(rows: Sequence[tuple[str, float, float | None]], *, unit: str = "GPU-hours",
              limit: int = 10, title: str = "") -> str:
    """The ``limit`` users who reserved most, largest first; rows as for reserved_vs_used."""
    ranked = sorted(rows, key=lambda r: (-(r[1] or 0), r[0]))
    return reserved_vs_used(ranked, unit=unit, limit=limit, css_class="top-users",
                            title=title or f"Top users by {unit} reserved",
                            empty=f"Nobody reserved any {unit} in this period.")


# --- one user's sessions over time ------------------------------------------------------


def _time_ticks(since: float, until: float, tz: tzinfo) -> list[tuple[float, str]]:
    """Round times across [since, until] with their labels; hours carry their date at
    the first tick and at midnight."""
    span = until - since
    if span <= 3 * 86400:
        hours_apart = next(h for h in (1, 2, 3, 6, 12, 24) if span / 3600 / h <= 10)
        step = timedelta(hours=hours_apart)
        start = datetime.fromtimestamp(since, tz).replace(minute=0, second=0, microsecond=0)
        start = start.replace(hour=start.hour - start.hour % hours_apart)
    else:
        days = span / 86400
        step = timedelta(days=next(d for d in (1, 2, 5, 7, 14, 30, 61, 91, 182, 365)
                                   if days / d <= 12))
        start = datetime.fromtimestamp(since, tz).replace(hour=0, minute=0, second=0,
                                                          microsecond=0)
    ticks: list[tuple[float, str]] = []
    t = start
    while t.timestamp() <= until:
        if t.timestamp() >= since:
            if step >= timedelta(days=1):
                label = t.strftime("%m-%d" if span < 300 * 86400 else "%Y-%m")
            elif not ticks or (t.hour == 0 and t.minute == 0):
                label = t.strftime("%m-%d %H:%M")
            else:
                label = t.strftime("%H:%M")
            ticks.append((t.timestamp(), label))
        t = (t + step).astimezone(tz)
        if step >= timedelta(days=1):  # stay on midnight across a daylight-saving change
            t = t.replace(hour=0, minute=0)
    return ticks


def _lanes(spans: Sequence[tuple[float, float]]) -> list[int]:
    """A lane for each span (sorted by start) so that spans in one lane never overlap."""
    ends: list[float] = []
    lanes = []
    for start, end in spans:
        for i, last in enumerate(ends):
            if last <= start:
                ends[i] = end
                lanes.append(i)
                break
        else:
            ends.append(end)
            lanes.append(len(ends) - 1)
    return lanes


def session_timeline(sessions: Sequence[Mapping[str, Any]], *, since: float, until: float,
                     now: float | None = None, tz: tzinfo = timezone.utc,
                     title: str = "Sessions over time", max_lanes: int = 30) -> str:
    """Each session a bar from its start to its stop (or now), coloured by how it ended;
    sessions that overlap take separate lanes. A start that failed is a thin mark."""
    now = until if now is None else now
    until = max(until, since + 1)
    spans = []
    for s in sessions:
        begin = s.get("started") or s.get("requested")
        if begin is None:
            continue
        end = s.get("stopped") or (now if s.get("started") else begin)
        if end < since or begin > until:
            continue
        spans.append((max(begin, since), min(max(end, begin), until), s))
    if not spans:
        return empty_chart("timeline", title, "No sessions in this period.")
    spans.sort(key=lambda item: (item[0], item[1]))
    # the axis spans the sessions, not the whole period: a month with two evenings of
    # work would otherwise draw them as slivers
    first, last = spans[0][0], max(b for _, b, _ in spans)
    pad = max((last - first) * 0.04, 1800)
    since, until = max(since, first - pad), min(until, last + pad)
    lanes = _lanes([(a, b) for a, b, _ in spans])
    lane_count = min(max(lanes) + 1, max_lanes)
    hidden = sum(1 for lane in lanes if lane >= max_lanes)
    # a tick label ("12-05 00:00") is centred on its tick: half of it must fit at each end
    left, right, top_pad, lane_h = 48, 48, 30, 22
    plot_w = WIDTH - left - right
    scale = plot_w / max(1.0, until - since)
    base = top_pad + lane_h * lane_count
    out = [f'<text class="chart-title" x="{left}" y="16" font-weight="600">{esc(title)}</text>',
           '<g class="axis x">']
    for t, label in _time_ticks(since, until, tz):
        x = left + (t - since) * scale
        out.append(f'<line x1="{x:.2f}" y1="{top_pad - 4}" x2="{x:.2f}" y2="{base:.1f}" '
                   f'stroke="#e3e3e3"/><text x="{x:.2f}" y="{base + 14:.1f}" '
                   f'text-anchor="middle" fill="#444">{esc(label)}</text>')
    out.append("</g>")
    seen: list[str] = []
    for (start, end, s), lane in zip(spans, lanes, strict=True):
        if lane >= max_lanes:
            continue
        reason = s.get("reason") or ("running" if not s.get("stopped") else "stopped")
        if reason not in seen:
            seen.append(reason)
        x = left + (start - since) * scale
        w = max(2.0, (end - start) * scale)
        y = top_pad + lane * lane_h
        ran = (s.get("stopped") or now) - s["started"] if s.get("started") else 0
        began = moment(s.get("started") or s.get("requested"), tz, zone=False)
        ended = f" to {moment(s['stopped'], tz, zone=False)}" if s.get("stopped") \
            else ", still running"
        tip = [f"{isolate(s.get('role', ''))} · {isolate(s.get('image', ''))}",
               f"from {began}{ended}",
               f"{duration(ran)}, {REASON_WORDS.get(reason, reason)}"]
        out.append(
            f'<rect class="bar session" data-reason="{esc(reason)}" '
            f'data-session="{esc(s.get("id", ""))}" x="{x:.2f}" y="{y + 2:.1f}" '
            f'width="{w:.2f}" height="{lane_h - 4}" rx="2" '
            f'fill="{REASON_COLOURS.get(reason, "#888")}"><title>'
            f"{esc(chr(10).join(tip))}</title></rect>")
    height = base + 44
    if hidden:
        out.append(f'<text class="more" x="{left}" y="{base + 28:.1f}" fill="#555">'
                   f"{hidden} overlapping sessions not drawn; all are in the table</text>")
        height += 16
    order = [r for r in REASON_COLOURS if r in seen] + [r for r in seen if r not in REASON_COLOURS]
    items, below = _legend([(REASON_WORDS.get(r, r), REASON_COLOURS.get(r, "#888"), "box")
                            for r in order], left, height - 8)
    out += items
    return _svg("timeline", title, height + below, out)
