"""What the homes' mechanisms raise: each message is a sentence for the log or the user."""

from __future__ import annotations


class HomeError(Exception):
    """A home could not be made, sized, read or released; the message says why."""


class HomesUnavailable(HomeError):
    """The mechanism asked for cannot work on this host; the message says why."""
