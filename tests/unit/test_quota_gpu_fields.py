"""The quota table's GPU fields (gpus, gpu_mode, gpu_share, gpu_memory): each mistake with its
file and line, checked against the hub's GPU capacity, also when the store reloads."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from harness import gpu_table, line_of
from spawner.quota.loader import parse_quota_table
from spawner.quota.model import GpuCapacity, QuotaTableError
from spawner.quota.store import QuotaStore

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "hub_config" / "quotas.yaml"
G = 2**30


def problems(text: str, gpus: GpuCapacity | None = None, path: str = "q.yaml") -> list[str]:
    with pytest.raises(QuotaTableError) as info:
        parse_quota_table(text, path, gpus)
    return [str(p) for p in info.value.problems]


EXCLUSIVE_ONLY = "gpu_share needs gpu_mode: shared (exclusive GPUs have one user)"
CAP_NEEDS_SHARED = ("gpu_memory is the per-user cap on a shared GPU; it needs gpu_mode: shared "
                    "(an exclusive user has the whole GPU)")


@pytest.mark.parametrize("fields, capacity, expected", [
    ("gpus: 1\ngpu_share: 2", None, [("gpu_share", EXCLUSIVE_ONLY)]),
    ("gpus: 1\ngpu_mode: exclusive\ngpu_share: 2", None, [("gpu_share", EXCLUSIVE_ONLY)]),
    ("gpus: 1\ngpu_memory: 8G", None, [("gpu_memory", CAP_NEEDS_SHARED)]),
    ("gpus: 1\ngpu_mode: exclusive\ngpu_memory: 8G", None, [("gpu_memory", CAP_NEEDS_SHARED)]),
    ("gpus: 2\ngpu_mode: shared", None,
     [("gpu_mode", "gpu_mode: shared needs gpu_share, the most users on one GPU")]),
    ("gpus: 2\ngpu_mode: shared\ngpu_memory: 8G", None,
     [("gpu_mode", "gpu_mode: shared needs gpu_share, the most users on one GPU")]),
    ("gpus: 0\ngpu_mode: shared\ngpu_share: 2", None,
     [("gpu_mode", "gpu_mode applies only to a role with gpus of 1 or more"),
      ("gpu_share", "gpu_share applies only to a role with gpus of 1 or more")]),
    ("gpu_mode: exclusive", None,
     [("gpu_mode", "gpu_mode applies only to a role with gpus of 1 or more")]),
    ("gpu_memory: 8G", None,
     [("gpu_memory", "gpu_memory applies only to a role with gpus of 1 or more")]),
    ("gpus: -1", None, [("gpus", "gpus must be a whole number, 0 or more, not -1")]),
    ("gpus: two", None, [("gpus", "gpus must be a whole number, 0 or more, not text 'two'")]),
    ("gpus: 1.5", None, [("gpus", "gpus must be a whole number, 0 or more, not 1.5")]),
    ("gpus: true", None, [("gpus", "gpus must be a whole number, 0 or more, not True")]),
    ("gpus: 1\ngpu_mode: partial", None,
     [("gpu_mode", "gpu_mode must be one of exclusive, shared, not text 'partial'")]),
    ("gpus: 1\ngpu_mode: Shared\ngpu_share: 2", None,
     [("gpu_mode", "gpu_mode must be one of exclusive, shared, not text 'Shared'")]),
    ("gpus: 1\ngpu_mode: shared\ngpu_share: 0", None,
     [("gpu_share", "gpu_share must be a whole number of at least 1, not 0")]),
    ("gpus: 2", GpuCapacity(1, 80 * G),
     [("gpus", "gpus is 2, but this hub has only 1 GPU")]),
    ("gpus: 5\ngpu_mode: shared\ngpu_share: 2", GpuCapacity(4),
     [("gpus", "gpus is 5, but this hub has only 4 GPUs")]),
    ("gpus: 1\ngpu_mode: shared\ngpu_share: 2\ngpu_memory: 96G", GpuCapacity(2, 80 * G),
     [("gpu_memory", "gpu_memory 96 GiB is more than the smallest GPU's memory (80 GiB)")]),
    ("gpus: 3\ngpu_mode: shared\ngpu_share: 2\ngpu_memory: 96G", GpuCapacity(2, 80 * G),
     [("gpus", "gpus is 3, but this hub has only 2 GPUs"),
      ("gpu_memory", "gpu_memory 96 GiB is more than the smallest GPU's memory (80 GiB)")]),
])
def test_gpu_field_problems_with_file_and_line(fields, capacity, expected):
    text = gpu_table(fields)
    want = [f"q.yaml:{line_of(text, key + ':', after='  r:')}: role 'r': {message}"
            for key, message in expected]
    assert problems(text, capacity) == want


def test_gpu_problems_in_several_roles_are_all_reported_in_line_order():
    text = gpu_table("gpus: 1\ngpu_share: 2").replace(
        "  cpu:\n    cpus: 1\n", "  cpu:\n    cpus: 1\n    gpu_mode: shared\n")
    assert problems(text) == [
        f"q.yaml:{line_of(text, 'gpu_mode')}: role 'cpu': gpu_mode applies only to a role "
        "with gpus of 1 or more",
        f"q.yaml:{line_of(text, 'gpu_share')}: role 'r': {EXCLUSIVE_ONLY}",
    ]


def test_valid_gpu_roles_parse():
    text = gpu_table("gpus: 2\ngpu_mode: shared\ngpu_share: 3\ngpu_memory: 80G").replace(
        "assignments:",
        "  whole:\n    cpus: 1\n    memory: 1G\n    images: [pytorch]\n"
        "    gpus: 1\n    gpu_mode: exclusive\nassignments:")
    table = parse_quota_table(text, "q.yaml", GpuCapacity(2, 80 * G))  # both at the limit
    r = table.roles["r"]
    assert (r.gpus, r.gpu_mode, r.gpu_share, r.gpu_memory) == (2, "shared", 3, 80 * G)
    whole = table.roles["whole"]
    assert (whole.gpus, whole.gpu_mode, whole.gpu_share, whole.gpu_memory) == (
        1, "exclusive", 1, None)
    cpu = table.roles["cpu"]
    assert (cpu.gpus, cpu.gpu_mode, cpu.gpu_share, cpu.gpu_memory) == (0, "exclusive", 1, None)


@pytest.mark.parametrize("capacity", [None, GpuCapacity(0), GpuCapacity(0, 8 * G),
                                      GpuCapacity(8)])
def test_gpu_roles_accepted_without_inventory_or_memory_figure(capacity):
    # No inventory: GPU roles are refused at spawn time, not when the table loads.
    # No memory figure: gpu_memory cannot be checked against it.
    text = gpu_table("gpus: 8\ngpu_mode: shared\ngpu_share: 2\ngpu_memory: 1T")
    assert parse_quota_table(text, "q.yaml", capacity).roles["r"].gpus == 8


def test_example_table_valid_for_one_80g_gpu():
    text = EXAMPLE.read_text()
    table = parse_quota_table(text, str(EXAMPLE), GpuCapacity(1, 80 * G))
    shared = [r for r in table.roles.values() if r.gpu_mode == "shared" and r.gpus]
    exclusive = [r for r in table.roles.values() if r.gpu_mode == "exclusive" and r.gpus]
    assert shared and exclusive
    # and a GPU smaller than a shared role's cap is caught, at that role's gpu_memory line
    role = next(r for r in shared if r.gpu_memory)
    small = role.gpu_memory // 2
    found = problems(text, GpuCapacity(1, small), str(EXAMPLE))
    line = line_of(text, "gpu_memory:", after=f"  {role.name}:")
    assert any(p.startswith(f"{EXAMPLE}:{line}: role '{role.name}': gpu_memory ") for p in found)


def test_store_revalidates_when_capacity_changes(tmp_path, caplog):
    path = tmp_path / "quotas.yaml"
    text = gpu_table("gpus: 2")
    path.write_text(text)
    log = logging.getLogger("test.store")
    store = QuotaStore(str(path))
    assert store.get(log, GpuCapacity(0)).roles["r"].gpus == 2
    assert store.problems == []
    with caplog.at_level(logging.ERROR):
        kept = store.get(log, GpuCapacity(1))  # same file, smaller hub
    assert kept.roles["r"].gpus == 2  # the last good table stays in use
    line = line_of(text, "gpus:")
    assert [str(p) for p in store.problems] == [
        f"{path}:{line}: role 'r': gpus is 2, but this hub has only 1 GPU"]
    assert f"{path}:{line}: role 'r': gpus is 2" in caplog.text
    store.get(log, GpuCapacity(2))
    assert store.problems == []
    with pytest.raises(QuotaTableError):
        QuotaStore(str(path)).get(log, GpuCapacity(1))  # never a good table
