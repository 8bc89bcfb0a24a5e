"""The Docker backend: ``QuotaSpawner`` and what only it needs (the container body,
the engine, the notebook network, mounts, the evictor, the hub's runtime)."""
