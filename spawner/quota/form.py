"""The spawn form: one radio button per (role, image) choice a user holds.

Everything a user or admin can name is escaped before it lands in HTML.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape

from .model import Choice, Role
from .units import format_human

FIELD = "choice"


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
    """'2 CPUs · 4 GiB memory · 8 GiB shared memory · 1 GPU, exclusive'."""
    cpus = f"{role.cpus:g} CPU" + ("" if role.cpus == 1 else "s")
    parts = [cpus, f"{format_human(role.memory)} memory"]
    if role.shm:
        parts.append(f"{format_human(role.shm)} shared memory")
    if role.gpus:
        parts.append(describe_gpus(role))
    return " · ".join(parts)


def describe_free(role: Role, available: int, total: int) -> str:
    """How many GPUs this role could get one of right now."""
    if total == 0:
        return "this hub has no GPUs"
    if role.gpu_mode == "shared":
        return f"room on {available} of {total} GPUs now"
    return f"{available} of {total} GPUs free now"


def render_form(
    choices: list[Choice],
    selected: str | None = None,
    always: bool = False,
    gpus: tuple[Mapping[str, int], int] | None = None,
    contents: Mapping[str, str] | None = None,
) -> str:
    """The form's HTML; empty when there is nothing to choose (unless ``always``).

    ``gpus`` is (GPUs available per GPU role's name, GPUs in the inventory).
    ``contents`` is what each image (by reference) holds, from its own label.
    """
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
        holds = ""
        if contents and contents.get(image.image):
            holds = (f' <span class="quota-image-contents small text-muted">'
                     f"{escape(contents[image.image])}</span>")
        gpu_state = ""
        if role.gpus and gpus is not None:
            available, total = gpus[0].get(role.name, 0), gpus[1]
            enough = "text-success" if available >= role.gpus else "text-danger"
            gpu_state = (
                f'<div class="quota-gpus small {enough}" data-available="{available}">'
                f"{escape(describe_free(role, available, total))}</div>"
            )
        rows.append(
            f'<label class="list-group-item d-flex gap-3 quota-choice"'
            f' data-role="{escape(role.name)}" data-image="{escape(image.key)}">'
            f'<input class="form-check-input flex-shrink-0" type="radio" name="{FIELD}"'
            f' value="{escape(choice.key)}"{checked}>'
            f'<span><strong>{escape(role.title)}</strong>'
            f' <span class="badge text-bg-secondary">{escape(image.display_name)}</span>'
            f"{holds}"
            f'<div class="quota-limits">{escape(describe_limits(role))}</div>'
            f"{gpu_state}{description}</span></label>"
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
