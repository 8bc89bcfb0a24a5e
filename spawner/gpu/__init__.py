"""The GPUs: what the host has (inventory, through the one NVML layer), who holds
which (allocator, pool), and what a container gets for them (env, torch_cap).

Kept empty: the notebook images import ``spawner.notebook.torch_cap`` at every
Python start, so importing this package must cost nothing.
"""
