"""The spawn form: one radio button per (role, image) choice a user holds.

A Jinja2 template (templates/form.html, or the admin's
``QuotaSpawner.form_template``) with autoescape on: everything a user or
admin can name is escaped before it lands in HTML.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jinja2

from spawner.quota.model import Choice, Role
from spawner.quota.units import format_human

FIELD = "choice"
TEMPLATE = "form.html"  # in spawner/quota/templates


def describe_gpus(role: Role) -> str:
    """'1 GPU, exclusive' or '1 GPU, shared by up to 3 · 20 GiB GPU memory cap'; '' for none."""
    if not role.gpus:
        return ""
    text = f"{role.gpus} GPU{'' if role.gpus == 1 else 's'}, "
    if role.gpu_mode != "shared":
        return text + "exclusive"
    text += f"shared by up to {role.gpu_share}"
    if role.gpu_memory:
        text += f" · {format_human(role.gpu_memory)} GPU memory cap"
    return text


def describe_limits(role: Role) -> str:
    """'2 CPUs · 4 GiB memory · 8 GiB shared memory · 20 GiB home · 1 GPU, exclusive'."""
    cpus = f"{role.cpus:g} CPU" + ("" if role.cpus == 1 else "s")
    parts = [cpus, f"{format_human(role.memory)} memory"]
    if role.shm:
        parts.append(f"{format_human(role.shm)} shared memory")
    if role.disk:
        parts.append(f"{format_human(role.disk)} home")
    if role.gpus:
        parts.append(describe_gpus(role))
    return " · ".join(parts)


def describe_free(role: Role, available: int, total: int) -> str:
    """How many GPUs this role could get one of right now."""
    if total == 0:
        return "this hub has no GPUs"
    if total < role.gpus:
        return f"this hub has only {total} GPU{'' if total == 1 else 's'}"
    if role.gpu_mode == "shared":
        return f"room on {available} of {total} GPUs now"
    return f"{available} of {total} GPUs free now"


def form_rows(
    choices: list[Choice],
    selected: str | None = None,
    gpus: tuple[Mapping[str, int], int] | None = None,
    contents: Mapping[str, str] | None = None,
    host: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """What the template shows for each choice (see templates/form.html).

    ``host``: role name -> why it can never start on this host (the notebooks' share
    of it is smaller than one server; the Docker spawner knows it).
    Such a role, and a GPU role that needs more GPUs than the hub has, is shown disabled
    and never selected: ``selected`` if it can start, else the first choice that can.
    """
    rows = []
    for choice in choices:
        role = choice.role
        gpu = None
        if role.gpus and gpus is not None:
            available, total = gpus[0].get(role.name, 0), gpus[1]
            gpu = {"available": available, "total": total, "enough": available >= role.gpus,
                   "text": describe_free(role, available, total)}
        too_big = (host or {}).get(role.name, "")
        rows.append({
            "key": choice.key, "role": role, "image": choice.image, "checked": False,
            "limits": describe_limits(role),
            "contents": (contents or {}).get(choice.image.image, ""), "gpu": gpu,
            "host": too_big,
            "startable": not too_big and (gpu is None or gpu["total"] >= role.gpus),
        })
    startable = [row for row in rows if row["startable"]]
    chosen = next((row for row in startable if row["key"] == selected),
                  startable[0] if startable else None)
    if chosen is not None:
        chosen["checked"] = True
    return rows


@functools.cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("spawner.quota", "templates"),
        autoescape=True, undefined=jinja2.StrictUndefined,
    )


def render_form(
    choices: list[Choice],
    selected: str | None = None,
    always: bool = False,
    gpus: tuple[Mapping[str, int], int] | None = None,
    contents: Mapping[str, str] | None = None,
    template: str = "",
    host: Mapping[str, str] | None = None,
) -> str:
    """The form's HTML; empty when there is nothing to choose (unless ``always``, or the
    one choice can never start: the form then says why, instead of a start that fails).

    ``gpus`` is (GPUs available per GPU role's name, GPUs in the inventory).
    ``contents`` is what each image (by reference) holds, from its own label.
    ``template`` is an admin's Jinja2 source in place of templates/form.html.
    ``host``: role name -> why it can never start on this host (``form_rows``).
    """
    if not choices:
        return ""
    rows = form_rows(choices, selected, gpus, contents, host)
    if len(rows) == 1 and not always and rows[0]["startable"]:
        return ""
    env = _environment()
    form = env.from_string(template) if template else env.get_template(TEMPLATE)
    return form.render(choices=rows, field=FIELD)


def options_from_form(formdata: Mapping[str, object]) -> dict[str, str]:
    """Form or query data to user_options: {"profile": ..., "image": ...}.

    Form fields arrive as lists, query arguments as strings. What comes out is
    checked against the quota table in ``QuotaSpawner.start``, not here.
    """

    def first(name: str) -> str | None:
        value = formdata.get(name)
        if isinstance(value, list | tuple):
            value = value[0] if value else None
        return value if isinstance(value, str) else None

    options: dict[str, str] = {}
    choice = first(FIELD)
    if choice is not None:
        profile, _, image = choice.partition("/")
        options["profile"], options["image"] = profile, image
    for name in ("profile", "image"):
        value = first(name)
        if value is not None:
            options[name] = value
    return options
