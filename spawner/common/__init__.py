"""The bottom layer: small parts that any layer may use and that belong to none of
them: ``registry`` (one object per key per hub process), ``outages`` (a failure that
can repeat, logged once), ``hub_client`` (the one client of the hub's REST API).
Imports nothing of the package (``make lint`` checks it)."""
