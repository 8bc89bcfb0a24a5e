"""The usage page's charts: well-formed SVG, bars in proportion, names escaped, empty states."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET

import pytest

from spawner.webapp import charts

SVG = "{http://www.w3.org/2000/svg}"
HOSTILE = ["<script>alert(1)</script>", 'a"b&c', "</svg><img src=x onerror=alert(1)>"]


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    assert root.find(f"{SVG}title") is not None  # a name for screen readers and tooltips
    return root


def bars(root: ET.Element, css: str = "bar") -> list[ET.Element]:
    return [e for e in root.iter(f"{SVG}rect") if css in e.get("class", "").split()]


def texts(root: ET.Element) -> list[str]:
    return ["".join(e.itertext()) for e in root.iter() if e.tag in (f"{SVG}text",
                                                                    f"{SVG}title")]


def assert_no_markup(root: ET.Element) -> None:
    tags = {e.tag.removeprefix(SVG) for e in root.iter()}
    assert tags <= {"svg", "title", "g", "rect", "text", "line", "circle", "polyline"}, tags


def test_gpu_hours_per_day_stacks_roles_in_proportion():
    rows = [("2025-03-01", "gpu-lab", 4.0, 1.0), ("2025-03-01", "gpu-training", 8.0, 6.0),
            ("2025-03-03", "gpu-training", 2.0, 0.5)]
    days = ["2025-03-01", "2025-03-02", "2025-03-03"]
    root = parse(charts.gpu_hours_per_day(rows, days))
    assert_no_markup(root)
    drawn = bars(root)
    assert [(b.get("data-role"), float(b.get("data-value"))) for b in drawn] == [
        ("gpu-lab", 4.0), ("gpu-training", 8.0), ("gpu-training", 2.0)]
    per_hour = {float(b.get("height")) / float(b.get("data-value")) for b in drawn}
    assert max(per_hour) - min(per_hour) < 0.01  # one scale for every bar
    # stacked: the second role sits on the first
    lab, training = drawn[0], drawn[1]
    assert float(training.get("y")) + float(training.get("height")) == pytest.approx(
        float(lab.get("y")), abs=0.02)
    # the same colour for a role on every day
    assert drawn[1].get("fill") == drawn[2].get("fill") != drawn[0].get("fill")
    # used: a point a day, on the same scale
    used = [float(c.get("data-value")) for c in root.iter(f"{SVG}circle")]
    assert used == [7.0, 0.0, 0.5]
    # a role's name is isolated (FSI … PDI): its bidi controls stay inside it
    assert any("2025-03-01 · \u2068gpu-training\u2069: 8 GPU-hours reserved" in t
               for t in texts(root))
    assert any("7 GPU-hours used (58% of 12 reserved)" in t for t in texts(root))
    assert {"\u2068gpu-lab\u2069", "\u2068gpu-training\u2069", "used"} <= set(texts(root))


def test_reserved_against_used_bars_in_proportion():
    rows = [("bob", 40.0, 0.25), ("alice", 10.0, 0.9), ("carol", 5.0, None), ("zed", 0.0, 0.1)]
    root = parse(charts.reserved_vs_used(rows, unit="GPU-hours"))
    reserved = bars(root, "reserved")
    used = bars(root, "used")
    assert [float(b.get("data-value")) for b in reserved] == [40.0, 10.0, 5.0]  # zed: none
    widths = [float(b.get("width")) / float(b.get("data-value")) for b in reserved + used]
    assert max(widths) - min(widths) < 0.01
    assert [float(b.get("data-value")) for b in used] == [10.0, 9.0]  # carol: not measured
    assert "use not measured" in " ".join(texts(root))
    assert "\u2068bob\u2069: 40 GPU-hours reserved, 10 used (25%)" in texts(root)


def test_top_users_largest_first_and_limited():
    rows = [(f"user{i:02d}", float(i), 0.5) for i in range(1, 16)]
    root = parse(charts.top_users(rows, limit=10))
    names = [g.get("data-name") for g in root.iter(f"{SVG}g") if g.get("class") == "row"]
    assert names == [f"user{i:02d}" for i in range(15, 5, -1)]
    assert "and 5 more, in the table" in texts(root)


def test_a_users_sessions_over_time():
    now = 1_741_900_000.0
    sessions = [
        {"id": 1, "role": "gpu-lab", "image": "pytorch", "requested": now - 7200,
         "started": now - 7200, "stopped": now - 3600, "reason": "culled"},
        {"id": 2, "role": "gpu-lab", "image": "pytorch", "requested": now - 5400,
         "started": now - 5400, "stopped": None, "reason": None},  # overlaps: a lane of its own
        {"id": 3, "role": "student", "image": "pytorch", "requested": now - 1800,
         "started": now - 1800, "stopped": now - 600, "reason": "oom"},
        {"id": 4, "role": "student", "image": "pytorch", "requested": now - 300,
         "started": None, "stopped": now - 240, "reason": "failed"},
    ]
    root = parse(charts.session_timeline(sessions, since=now - 86400, until=now, now=now))
    assert_no_markup(root)
    drawn = {b.get("data-session"): b for b in bars(root, "session")}
    assert {k: b.get("data-reason") for k, b in drawn.items()} == {
        "1": "culled", "2": "running", "3": "oom", "4": "failed"}
    assert drawn["1"].get("fill") != drawn["3"].get("fill")
    assert drawn["1"].get("y") != drawn["2"].get("y")  # they overlap in time
    assert drawn["1"].get("y") == drawn["3"].get("y")  # they do not
    scale = float(drawn["1"].get("width")) / 3600
    assert float(drawn["3"].get("width")) == pytest.approx(1200 * scale, abs=0.02)
    assert float(drawn["2"].get("width")) == pytest.approx(5400 * scale, abs=0.02)
    assert float(drawn["4"].get("width")) >= 2  # a failed start still shows
    words = " ".join(texts(root))
    assert "culled as idle" in words and "killed for memory" in words and "still running" in words


@pytest.mark.parametrize("name", HOSTILE)
def test_names_are_escaped_everywhere(name):
    now = time.time()
    svgs = [
        charts.gpu_hours_per_day([("2025-03-01", name, 2.0, 1.0)], ["2025-03-01"]),
        charts.reserved_vs_used([(name, 3.0, 0.5)]),
        charts.top_users([(name, 3.0, None)]),
        charts.session_timeline([{"id": name, "role": name, "image": name,
                                  "started": now - 60, "stopped": now, "reason": name}],
                                since=now - 3600, until=now, title=f"Sessions of {name}"),
    ]
    for svg in svgs:
        root = parse(svg)  # would not parse if a name broke out of its text or attribute
        assert_no_markup(root)
        assert "<script" not in svg and "<img" not in svg
        assert any(name in t for t in texts(root))  # shown as the text it is
        attributes = [v for e in root.iter() for v in e.attrib.values()]
        assert name in attributes or name[:21] in " ".join(texts(root))


def test_long_names_are_shortened_with_the_whole_name_in_the_tooltip():
    name = "a-very-long-user-name-from-the-directory@example.org"
    root = parse(charts.reserved_vs_used([(name, 1.0, 0.5)]))
    label = next(e for e in root.iter(f"{SVG}text") if e.get("class") == "label")
    # the name cut and isolated, the "…" after it; the whole name, isolated, in the tooltip
    assert label.text == f"\u2068{name[:19]}\u2069…"
    assert label.find(f"{SVG}title").text == f"\u2068{name}\u2069"


@pytest.mark.parametrize("svg, sentence", [
    (charts.gpu_hours_per_day([], ["2025-03-01"]), "No GPU was reserved in this period."),
    (charts.gpu_hours_per_day([("2025-03-01", "cpu", 0.0, 0.0)]),
     "No GPU was reserved in this period."),
    (charts.reserved_vs_used([], unit="CPU-hours"), "No CPU-hours were reserved in this period."),
    (charts.top_users([("x", 0.0, None)]), "Nobody reserved any GPU-hours in this period."),
    (charts.session_timeline([], since=0, until=3600), "No sessions in this period."),
])
def test_empty_data_says_so(svg, sentence):
    root = parse(svg)
    assert "empty" in root.get("class").split()
    assert bars(root) == []
    assert sentence in texts(root)


def test_ticks_are_round():
    assert charts.nice_ticks(7.3) == [0, 2, 4, 6, 8]
    assert charts.nice_ticks(100) == [0, 20, 40, 60, 80, 100]
    assert charts.nice_ticks(0.12)[-1] >= 0.12
    assert charts.nice_ticks(0) == [0.0, 1.0]


@pytest.mark.parametrize("value, text", [
    (0, "0"), (0.0025, "0.0025"), (0.0123, "0.012"), (0.25, "0.25"), (1.5, "1.5"),
    (12.5, "12.5"), (1234, "1,234"),
])
def test_hour_labels_never_round_a_few_minutes_to_zero(value, text):
    assert charts.hours(value) == text


# --- nothing is cut at the chart's edge ---------------------------------------------------


def assert_every_text_inside(svg: str) -> None:
    """Each label's extent, by the charts' own width estimate and its anchor, lies in the
    viewBox: a label past the edge is cut ("use not meas…")."""
    root = parse(svg)
    width = float(root.get("viewBox").split()[2])
    for e in root.iter(f"{SVG}text"):
        if e.get("transform"):  # the y axis's unit, turned along the axis
            continue
        label = e.text or ""  # its own text, not its <title>
        w = charts.text_width(label)
        x = float(e.get("x"))
        start = {"middle": x - w / 2, "end": x - w}.get(e.get("text-anchor", "start"), x)
        assert 0 <= start and start + w <= width + 0.5, (label, start, start + w, width)


def test_value_labels_fit_beside_the_longest_bar():
    rows = [("a-user-with-a-long-name", 1234.5, None), ("bob", 12.5, 0.31), ("c", 0.2, None)]
    assert_every_text_inside(charts.reserved_vs_used(rows, unit="GPU-hours"))
    assert_every_text_inside(charts.top_users(rows))


def test_a_legend_of_many_roles_wraps_before_the_edge():
    roles = [f"role-with-a-longer-name-{i}" for i in range(12)]
    rows = [("2025-03-01", r, 1.0 + i, 0.5) for i, r in enumerate(roles)]
    svg = charts.gpu_hours_per_day(rows, [f"2025-03-{d:02d}" for d in range(1, 32)])
    assert_every_text_inside(svg)
    root = parse(svg)
    legend_rows = {e.get("y") for g in root.iter(f"{SVG}g") if g.get("class") == "legend"
                   for e in g.iter(f"{SVG}text")}
    assert len(legend_rows) > 1


def test_the_timeline_keeps_its_tick_labels_and_legend_inside():
    now = 1_740_000_000.0
    reasons = list(charts.REASON_WORDS)
    found = [{"id": i, "role": "r", "image": "pytorch", "requested": now + i * 3600,
              "started": now + i * 3600, "stopped": now + i * 3600 + 1800,
              "reason": reason} for i, reason in enumerate(reasons[:-1])]
    svg = charts.session_timeline(found, since=now - 86400, until=now + 86400, now=now)
    assert_every_text_inside(svg)
