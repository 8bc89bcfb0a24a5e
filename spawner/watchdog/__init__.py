"""The GPU and memory watchdog: ``quota-spawner watchdog``, beside the hub on each GPU host.

Every cycle it reads NVML on the host and the engine's notebook containers
and their cgroups (``host.py``, ``spawner.gpu.nvml``), turns them into one
``Snapshot`` (``model.py``), applies the rules (``rules.py``), sends what
changed to the channels (``notify.py``), and serves the per-server gauges
for Prometheus (``metrics.py``). docs/watchdog.md is the operator's guide.
"""
