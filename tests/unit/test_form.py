"""The spawn form's GPU lines: what each role holds and what is free now, escaped; a role
that can never start on this hub shown disabled with why, and never preselected."""

from __future__ import annotations

import html as markup
import logging
import re
from pathlib import Path

import pytest

from spawner.docker.choices import too_big_for_host
from spawner.gpu.inventory import declared_inventory
from spawner.gpu.pool import GpuPool
from spawner.host.admission import HostBook, HostCapacity
from spawner.quota.form import (
    describe_free,
    describe_gpus,
    describe_limits,
    render_form,
)
from spawner.quota.loader import load_quota_table
from spawner.quota.model import Choice, ImageSpec, Role
from spawner.quota.options import resolve_choice

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


# --- what can never start here --------------------------------------------------------

BIG = Role("big", 8, 32 * G, ("pytorch",), shm=8 * G)  # the old senior-engineer
MARK = ("can never start here: one server's 32 GiB of memory is more than the notebooks' "
        "21.2 GiB")


def states(html: str) -> dict[str, tuple[bool, bool, str]]:
    """choice key -> (checked, disabled, its line saying why it can never start here)."""
    found = {}
    for row in re.findall(r"<label .*?</label>", html):
        radio = re.search(r"<input [^>]*>", row).group(0)
        key = re.search(r'value="([^"]*)"', radio).group(1)
        why = re.search(r'<div class="quota-host small text-danger">([^<]*)</div>', row)
        found[key] = (" checked" in radio, " disabled" in radio,
                      markup.unescape(why.group(1)) if why else "")
    return found


def test_a_hub_with_fewer_gpus_than_the_role_says_so():
    assert describe_free(TWO, 1, 1) == "this hub has only 1 GPU"
    assert describe_free(TWO, 0, 3) == "0 of 3 GPUs free now"


def test_a_role_larger_than_the_host_is_disabled_and_never_preselected():
    choices = [Choice(BIG, IMAGE), Choice(CPU, IMAGE)]
    host = {"big": MARK}
    assert states(render_form(choices, host=host)) == {
        "big/pytorch": (False, True, MARK), "cpu/pytorch": (True, False, "")}
    # the saved choice, if it can start; else the first that can
    assert states(render_form(choices, "big/pytorch", host=host))["cpu/pytorch"][0]
    assert states(render_form(choices, "cpu/pytorch", host=host))["cpu/pytorch"][0]
    assert states(render_form(choices))["big/pytorch"] == (True, False, "")  # nothing known


def test_a_gpu_role_the_hub_cannot_serve_is_disabled_and_never_preselected():
    choices = [Choice(WHOLE, IMAGE), Choice(TWO, IMAGE), Choice(CPU, IMAGE)]
    none = states(render_form(choices, gpus=({}, 0)))
    assert none["gpu-training/pytorch"] == (False, True, "")  # "this hub has no GPUs"
    assert none["cpu/pytorch"] == (True, False, "")
    # one GPU, held: gpu-training can wait for it; gpu-two never gets its 2
    one = states(render_form(choices, "gpu-two/pytorch", gpus=({}, 1)))
    assert one["gpu-training/pytorch"] == (True, False, "")
    assert one["gpu-two/pytorch"] == (False, True, "")


def test_one_choice_that_can_never_start_shows_the_form_with_why_and_nothing_selected():
    html = render_form([Choice(BIG, IMAGE)], host={"big": MARK})
    assert states(html) == {"big/pytorch": (False, True, MARK)}
    assert render_form([Choice(CPU, IMAGE)], host={"big": MARK}) == ""  # one that can: none


def test_a_start_that_names_no_role_takes_the_first_that_can_start():
    choices = [Choice(BIG, IMAGE), Choice(CPU, IMAGE)]
    fits = lambda c: c.role is not BIG  # noqa: E731
    assert resolve_choice(choices, {}, fits).role is CPU
    assert resolve_choice(choices, {"image": "pytorch"}, fits).role is CPU
    assert resolve_choice(choices, {"profile": "big"}, fits).role is BIG  # asked for: refused later
    assert resolve_choice(choices[:1], {}, fits).role is BIG  # none can: the first, refused later


# The machine `make demo` runs on: 2 CPUs and 23.5 GiB, no GPUs; its notebooks may reserve
# 7.2 CPUs and 21.2 GiB (spawner/host/admission.py's defaults).
DEMO_HOST = HostCapacity(cpus=2, memory=int(23.5 * G))
SHIPPED = Path(__file__).resolve().parents[2] / "hub_config" / "quotas.yaml"
DEMO_USERS = {"alice": [], "bob": ["ml-platform"], "research-lead": [],
              "student1": ["cs101"], "prof-ada": ["cs101-staff"]}


def demo_pool() -> GpuPool:
    found = GpuPool(declared_inventory([]), "hub", log=logging.getLogger("test"))
    found.set_host(HostBook(DEMO_HOST))
    return found


@pytest.mark.parametrize("user, groups", DEMO_USERS.items())
def test_the_shipped_table_offers_every_demo_user_a_role_that_starts_on_the_demo_machine(
        user, groups):
    """The README's demo users, on the machine the demo runs on: the form preselects a
    choice that starts; the roles larger than the host are marked as such."""
    choices = load_quota_table(str(SHIPPED)).choices_for(user, groups)
    host = too_big_for_host(demo_pool(), choices)
    html = render_form(choices, gpus=({}, 0), host=host, always=True)
    found = states(html)
    [checked] = [key for key, (on, _, _) in found.items() if on]
    assert not found[checked][1]
    for key, (_, disabled, why) in found.items():
        role = key.split("/")[0]
        assert disabled == (role in host or role.startswith("gpu-")), key
        assert why == host.get(role, ""), key
    if user == "bob":  # the README's bob: the form as shipped starts senior-engineer
        assert checked == "senior-engineer/pytorch"
        assert host == {"gpu-training": (
            "can never start here: one server's 32 GiB of memory is more than the notebooks' "
            "21.2 GiB")}


def test_host_marks_follow_admission():
    """The rule validate --engine, the table editor and host admission go by (host/fit.py's
    never_fits), and no mark with admission off."""
    choices = [Choice(BIG, IMAGE), Choice(CPU, IMAGE)]
    assert too_big_for_host(demo_pool(), choices) == {"big": MARK}
    wide = demo_pool()
    wide.set_host(HostBook(HostCapacity(cpus=2, memory=64 * G)))  # 8 CPUs > 7.2
    assert too_big_for_host(wide, choices) == {
        "big": "can never start here: one server's 8 CPUs are more than the notebooks' 7.2"}
    off = demo_pool()
    off.set_host(None)
    assert too_big_for_host(off, choices) == {}
