"""Quota tables that tests of several layers share, with what each is expected to do: the
injected user_options every spawner refuses (one case table, run against the resolver and
against both spawners), and a table with GPU-hour budgets."""

from __future__ import annotations

# The options cases' table (tests/unit/test_options.py)
TABLE_TEXT = """\
images:
  pytorch: {image: "img/pytorch", display_name: "PyTorch <2.7> & CUDA"}
  paddle: {image: "img/paddle"}
roles:
  small: {cpus: 1, memory: 1G, images: [pytorch, paddle], description: "<script>x</script>"}
  big: {cpus: 8, memory: 32G, shm: 8G, images: [pytorch]}
assignments:
  default: [small]
  users:
    lead: [small, big]
    solo: [big]
"""
# Injected options and what a user with only the default role is told: the same table
# is run against the resolver (tests/unit/test_options.py) and against QuotaSpawner and
# QuotaKubeSpawner (tests/service/test_kube_spawner.py).
INJECTED = [
    ({"profile": "big"}, 400, "You asked for the role 'big', which you do not hold"),
    ({"profile": "admin"}, 400, "which you do not hold"),
    ({"image": "ubuntu:latest"}, 400, "do not offer the image 'ubuntu:latest'"),
    ({"profile": "small", "image": "img/pytorch"}, 400, "does not offer the image"),
    ({"mem_limit": "100G"}, 400, "Unknown server option 'mem_limit'"),
    ({"profile": ["big"]}, 400, "must be text"),
    ({"profile": "x" * 500}, 400, "x…"),
]


def budget_table(budgets: str, roles: str = "") -> str:
    """A table with a CPU and a GPU role for everyone, and these budgets lines."""
    return (
        "images:\n"
        "  pytorch:\n"
        "    image: quota-spawner/pytorch:latest\n"
        "roles:\n"
        "  cpu: {cpus: 1, memory: 1G, images: [pytorch]}\n"
        "  gpu: {cpus: 1, memory: 1G, images: [pytorch], gpus: 1}\n"
        f"{roles}"
        "assignments:\n"
        "  default: [cpu, gpu]\n"
        f"budgets:\n{budgets}"
    )
