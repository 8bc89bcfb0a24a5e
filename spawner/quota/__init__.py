"""The quota table: its model, the validating loader, the hot-reloading store,
the user's options checked against it, and the spawn form.

Kept empty: the GPU monitor inside the images imports ``spawner.quota.units``.
"""
