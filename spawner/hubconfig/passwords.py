"""Checks on the shared passwords of the shipped hub config.

The shipped config logs people in with JupyterHub's SharedPasswordAuthenticator.
Outside the demo it must never run with the passwords printed in the README.
"""

from __future__ import annotations

DEMO_PASSWORD = "quota-demo"
DEMO_ADMIN_PASSWORD = "quota-spawner-admin-demo-password"
MIN_USER = 8  # SharedPasswordAuthenticator's own minimums
MIN_ADMIN = 32


def password_problems(user_password: str, admin_password: str) -> list[str]:
    """Why these passwords must not guard a real hub; empty when they may."""
    problems = []
    if not user_password:
        problems.append("QUOTA_SPAWNER_DEMO_PASSWORD is not set")
    elif user_password == DEMO_PASSWORD:
        problems.append("QUOTA_SPAWNER_DEMO_PASSWORD is the published demo password")
    elif len(user_password) < MIN_USER:
        problems.append(f"QUOTA_SPAWNER_DEMO_PASSWORD has fewer than {MIN_USER} characters")
    if not admin_password:
        problems.append("QUOTA_SPAWNER_DEMO_ADMIN_PASSWORD is not set")
    elif admin_password == DEMO_ADMIN_PASSWORD:
        problems.append("QUOTA_SPAWNER_DEMO_ADMIN_PASSWORD is the published demo password")
    elif len(admin_password) < MIN_ADMIN:
        problems.append(f"QUOTA_SPAWNER_DEMO_ADMIN_PASSWORD has fewer than {MIN_ADMIN} "
                        "characters")
    if user_password and user_password == admin_password:
        problems.append("the user and admin passwords are the same")
    return problems
