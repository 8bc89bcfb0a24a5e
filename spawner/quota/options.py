"""Check a start's user_options against what the quota table gives the user.

Runs on every start, so options from the REST API, from a query string or saved
from an earlier spawn get the same checks as the form.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from spawner.quota.model import Choice

ALLOWED_KEYS = ("profile", "image")


class OptionsError(Exception):
    """A start that must be refused; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str):
        self.status = status
        self.message = message
        super().__init__(message)


def _quote(value: object, limit: int = 60) -> str:
    text = str(value)
    return repr(text if len(text) <= limit else text[:limit] + "…")


def resolve_choice(choices: list[Choice], options: Mapping[str, object] | None,
                   startable: Callable[[Choice], bool] | None = None) -> Choice:
    """The choice these options select, or OptionsError saying plainly why not.

    Missing options fall back to the first role and its first image, so a
    user with one choice, or an API call with no body, just starts: the first
    that is ``startable``, if any is (a role that can never start on this hub is
    passed over), as the spawn form preselects (form.py).
    """
    if not choices:
        raise OptionsError(
            403,
            "You have no role in the quota table, so you cannot start a server. "
            "Ask an admin to give you a role.",
        )
    options = options or {}
    if not isinstance(options, Mapping):
        raise OptionsError(400, "Server options must be an object like "
                                '{"profile": "<role>", "image": "<image>"}.')
    unknown = [k for k in options if k not in ALLOWED_KEYS]
    if unknown:
        raise OptionsError(
            400,
            f"Unknown server option {_quote(unknown[0])}. "
            "Only 'profile' (a role) and 'image' can be chosen; the role sets every limit.",
        )
    profile, image = options.get("profile"), options.get("image")
    for name, value in (("profile", profile), ("image", image)):
        if value is not None and not isinstance(value, str):
            raise OptionsError(400, f"The server option '{name}' must be text.")

    roles = list(dict.fromkeys(c.role.name for c in choices))
    if profile:
        if profile not in roles:
            raise OptionsError(
                400,
                f"You asked for the role {_quote(profile)}, which you do not hold. "
                f"Your roles: {', '.join(roles)}.",
            )
        choices = [c for c in choices if c.role.name == profile]
    if image:
        matching = [c for c in choices if c.image.key == image]
        if not matching:
            offered = ", ".join(dict.fromkeys(c.image.key for c in choices))
            scope = f"The role '{profile}'" if profile else "Your roles"
            raise OptionsError(
                400,
                f"{scope} do{'es' if profile else ''} not offer the image {_quote(image)}. "
                f"Choose one of: {offered}.",
            )
        choices = matching
    if startable is not None:
        return next((c for c in choices if startable(c)), choices[0])
    return choices[0]
