"""The hub's web app for admins, instructors and users (the ``usage`` service): the
usage report, the quota table editor, the host map, the class dashboard and role
requests, behind the hub's OAuth (docs/architecture.md#the-web-app).

``app.py`` is the process and its routes; a module per resource holds its page and its
JSON API (``report``, ``table``, ``gpus``, ``classes`` with ``prewarm``, ``requests``);
they stand on ``base`` (the page and API handlers), ``access`` (who sees what),
``inputs``, ``formatting``, ``charts``, ``reader`` and ``hub_api``, which stand on
spawner.usage (the ledger and the documents the processes share) and spawner.quota.
Nothing imports upwards.
"""
