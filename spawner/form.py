"""The spawn form: one radio button per (role, image) choice a user holds.

Everything a user or admin can name is escaped before it lands in HTML.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape

from .quota import Choice, Role
from .units import format_human

FIELD = "choice"


def describe_limits(role: Role) -> str:
    """'2 CPUs · 4 GiB memory · 8 GiB shared memory'."""
    cpus = f"{role.cpus:g} CPU" + ("" if role.cpus == 1 else "s")
    parts = [cpus, f"{format_human(role.memory)} memory"]
    if role.shm:
        parts.append(f"{format_human(role.shm)} shared memory")
    return " · ".join(parts)


def render_form(choices: list[Choice], selected: str | None = None, always: bool = False) -> str:
    """The form's HTML; empty when there is nothing to choose (unless ``always``)."""
    if not choices or (len(choices) == 1 and not always):
        return ""
    if selected not in {c.key for c in choices}:
        selected = choices[0].key
    rows = []
    for choice in choices:
        role, image = choice.role, choice.image
        checked = " checked" if choice.key == selected else ""
        description = (
            f'<div class="text-muted small">{escape(role.description)}</div>'
            if role.description else ""
        )
        rows.append(
            f'<label class="list-group-item d-flex gap-3 quota-choice"'
            f' data-role="{escape(role.name)}" data-image="{escape(image.key)}">'
            f'<input class="form-check-input flex-shrink-0" type="radio" name="{FIELD}"'
            f' value="{escape(choice.key)}"{checked}>'
            f'<span><strong>{escape(role.title)}</strong>'
            f' <span class="badge text-bg-secondary">{escape(image.display_name)}</span>'
            f'<div class="quota-limits">{escape(describe_limits(role))}</div>'
            f"{description}</span></label>"
        )
    return (
        '<div class="quota-spawner-form">'
        "<p>Choose a role and an image. The role sets the size of your server.</p>"
        f'<div class="list-group">{"".join(rows)}</div></div>'
    )


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
