"""The spawn form's GPU lines: what each role holds and what is free now, escaped."""

from __future__ import annotations

import re

from spawner.quota.form import describe_free, describe_gpus, describe_limits, render_form
from spawner.quota.model import Choice, ImageSpec, Role

G = 2**30


IMAGE = ImageSpec("pytorch", "quota-spawner/pytorch:latest", "PyTorch")
WHOLE = Role("gpu-training", 8, 32 * G, ("pytorch",), gpus=1)
TWO = Role("gpu-two", 8, 32 * G, ("pytorch",), gpus=2)
LAB = Role("gpu-lab", 2, 4 * G, ("pytorch",), gpus=1, gpu_mode="shared", gpu_share=3,
           gpu_memory=16 * G)
CPU = Role("cpu", 2, 4 * G, ("pytorch",))


def test_describe_gpus_and_free():
    assert describe_gpus(CPU) == ""
    assert describe_gpus(WHOLE) == "1 GPU, exclusive"
    assert describe_gpus(TWO) == "2 GPUs, exclusive"
    assert describe_gpus(LAB) == "1 GPU, shared by up to 3 · 16 GiB GPU memory cap"
    assert describe_gpus(Role("s", 1, G, ("pytorch",), gpus=1, gpu_mode="shared",
                              gpu_share=2)) == "1 GPU, shared by up to 2"
    assert describe_limits(WHOLE) == "8 CPUs · 32 GiB memory · 1 GPU, exclusive"
    assert describe_limits(CPU) == "2 CPUs · 4 GiB memory"
    assert describe_free(WHOLE, 2, 4) == "2 of 4 GPUs free now"
    assert describe_free(LAB, 3, 4) == "room on 3 of 4 GPUs now"
    assert describe_free(LAB, 0, 0) == "this hub has no GPUs"


def gpu_rows(html: str) -> dict[str, str]:
    """role name -> its GPU line, as (data-available, class, text)."""
    rows = {}
    for row in re.findall(r'<label .*?</label>', html):
        role = re.search(r'data-role="([^"]*)"', row).group(1)
        state = re.search(r'<div class="quota-gpus small ([^"]*)" data-available="(\d+)">'
                          r'([^<]*)</div>', row)
        rows[role] = state.groups() if state else None
    return rows


def test_form_shows_gpu_roles_and_what_is_free():
    choices = [Choice(r, IMAGE) for r in (CPU, WHOLE, TWO, LAB)]
    html = render_form(choices, gpus=({"gpu-training": 2, "gpu-two": 1, "gpu-lab": 3}, 4))
    assert "1 GPU, exclusive" in html and "shared by up to 3" in html
    assert gpu_rows(html) == {
        "cpu": None,
        "gpu-training": ("text-success", "2", "2 of 4 GPUs free now"),
        "gpu-two": ("text-danger", "1", "1 of 4 GPUs free now"),  # needs 2
        "gpu-lab": ("text-success", "3", "room on 3 of 4 GPUs now"),
    }
    none = render_form(choices, gpus=({}, 0))
    assert gpu_rows(none)["gpu-training"] == ("text-danger", "0", "this hub has no GPUs")
    assert "quota-gpus" not in render_form(choices)  # no GPU figures given


def test_form_escapes_gpu_role_text():
    evil = Role("<script>alert(1)</script>", 1, G, ("pytorch",), gpus=1,
                display_name="<script>x</script>", description="<b>bold</b>")
    image = ImageSpec("pytorch", "img", "<img src=x onerror=alert(1)>")
    html = render_form([Choice(evil, image), Choice(WHOLE, IMAGE)],
                       gpus=({evil.name: 1}, 1))
    assert "<script" not in html and "<img" not in html and "<b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'data-available="1"' in html


def test_an_admin_template_replaces_the_form_and_keeps_escaping():
    evil = Role("<script>x</script>", 1, G, ("pytorch",), display_name="<b>Evil</b>")
    template = ('{% for c in choices %}<p data-key="{{ c.key }}">{{ c.role.title }} · '
                '{{ c.limits }}{% if c.checked %} (chosen){% endif %}</p>{% endfor %}'
                '<input name="{{ field }}">')
    html = render_form([Choice(evil, IMAGE), Choice(CPU, IMAGE)], "cpu/pytorch",
                       template=template)
    assert "<script>" not in html and "&lt;b&gt;Evil&lt;/b&gt;" in html
    assert "cpu · 2 CPUs · 4 GiB memory (chosen)" in html and '<input name="choice">' in html


def test_the_shipped_template_is_the_default():
    choices = [Choice(CPU, IMAGE), Choice(WHOLE, IMAGE)]
    assert render_form(choices) == render_form(choices, template="") != ""
    assert 'name="choice" value="cpu/pytorch" checked' in render_form(choices)
