"""The hub's web app for admins, instructors and users (the ``usage`` service): the
usage report, the quota table editor, the GPU map, the class dashboard and role
requests, behind the hub's OAuth (docs/architecture.md#the-web-app)."""
