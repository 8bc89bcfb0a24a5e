"""The container environment of a GPU server: visible devices and the soft-cap variables."""

from __future__ import annotations

import pytest

from spawner.contract import CAP_VARIABLES
from spawner.policy.gpu import gpu_environment, memory_fraction

G = 2**30


def test_no_gpus_only_void():
    assert gpu_environment([]) == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert gpu_environment([], 16 * G, 80 * G) == {"NVIDIA_VISIBLE_DEVICES": "void"}


def test_exclusive_only_the_uuids():
    assert gpu_environment(["GPU-a", "GPU-b"]) == {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}


def test_soft_cap_variables():
    env = gpu_environment(["GPU-a"], 16 * G, 80 * G)
    assert env == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-a",
        "GPU_MEMORY_LIMIT": str(16 * G),
        "FLAGS_gpu_memory_limit_mb": "16384",
        "FLAGS_allocator_strategy": "auto_growth",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.200",
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    }
    assert set(CAP_VARIABLES) == set(env) - {"NVIDIA_VISIBLE_DEVICES"}
    assert len(CAP_VARIABLES) == len(set(CAP_VARIABLES))
    # without the card's size, JAX gets no fraction; the rest stays
    assert set(gpu_environment(["GPU-a"], 16 * G)) == set(env) - {
        "XLA_PYTHON_CLIENT_MEM_FRACTION"}


@pytest.mark.parametrize("cap, device, text", [
    (2 * G, 3 * G, "0.666"),  # rounded down, never up
    (G, 3 * G, "0.333"),
    (10 * G, 80 * G, "0.125"),
    (96 * G, 80 * G, "1.000"),
    (1, 80 * G, "0.001"),
])
def test_memory_fraction_rounds_down(cap, device, text):
    assert f"{memory_fraction(cap, device):.3f}" == text
    assert gpu_environment(["GPU-a"], cap, device)["XLA_PYTHON_CLIENT_MEM_FRACTION"] == text
    assert memory_fraction(cap, device) <= max(0.001, cap / device)
