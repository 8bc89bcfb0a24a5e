"""Helpers for the hub's config file: roles for instructors, the shared passwords'
checks, the idle culler's service and its per-role arbiter."""
