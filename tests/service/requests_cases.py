"""What the tests of role requests share, the API's (test_requests_api.py) and the page's
(test_requests_page.py): the hub's id and the clock, the visitors who ask beside those of
webapp_client, and the table that takes requests."""

from __future__ import annotations

from harness import shipped_table_without_requests

HUB_ID = "quota-0123456789ab"
NOW = 1_795_000_000.0  # 2026-11-18 11:06:40 UTC
DAY = 86400.0
STUDENT = {"kind": "user", "name": "student1", "admin": False,
           "scopes": ["access:services!service=usage", "read:users:name!user=student1"]}
DORA = {**STUDENT, "name": "dora"}
OTHER_INSTRUCTOR = {"kind": "user", "name": "prof-bo", "admin": False,
                    "scopes": ["access:services!service=usage",
                               "custom:quota-spawner:usage!group=cs102"]}


def table(instructors_approve: bool) -> str:
    text = shipped_table_without_requests()
    return text + ("\nrequests:\n  roles: [gpu-training, senior-engineer]\n  max_days: 14\n"
                   f"  instructors_approve: {'true' if instructors_approve else 'false'}\n")
