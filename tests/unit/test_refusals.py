"""The sentences a user gets when no GPU can be given: why, and what to do now."""

from __future__ import annotations

import pytest

from spawner.gpu.allocator import GpuRequest, NoGpuFree, Usage
from spawner.policy.refusals import no_gpu
from spawner.quota.model import Choice, ImageSpec, Role

G = 2**30
IMAGE = ImageSpec("pytorch", "quota-spawner/pytorch:latest", "PyTorch")
ONE = Role("gpu-one", 4, 8 * G, ("pytorch",), gpus=1)
TWO = Role("gpu-two", 4, 8 * G, ("pytorch",), gpus=2)
LAB = Role("gpu-lab", 2, 4 * G, ("pytorch",), gpus=1, gpu_mode="shared", gpu_share=3)
CPU = Role("cpu", 2, 4 * G, ("pytorch",))


def refused(role: Role, usage: Usage) -> NoGpuFree:
    return NoGpuFree(GpuRequest(role.gpus, role.gpu_mode, role.gpu_share), usage, 0)


@pytest.mark.parametrize("role, usage, reason, expected", [
    (ONE, Usage(0, 0, 0, 0), "NVML: Driver Not Loaded",
     "The role 'gpu-one' needs 1 GPU, but this hub has no GPUs (NVML: Driver Not Loaded)."),
    (ONE, Usage(0, 0, 0, 0), "",
     "The role 'gpu-one' needs 1 GPU, but this hub has no GPUs (none were found)."),
    (TWO, Usage(1, 0, 0, 1), "",
     "The role 'gpu-two' needs 2 GPUs, but this hub has only 1; an admin must fix the "
     "quota table."),
    (ONE, Usage(4, 3, 1, 0), "",
     "No GPU is free for the role 'gpu-one', which needs 1 GPU (exclusive): this hub has "
     "4 GPUs and 4 are held (3 exclusively, 1 shared)."),
    (LAB, Usage(1, 1, 0, 0), "",
     "No GPU is free for the role 'gpu-lab', which needs 1 GPU (shared): this hub has "
     "1 GPU and 1 is held (1 exclusively, 0 shared)."),
])
def test_why_no_gpu(role, usage, reason, expected):
    with_cpu = [Choice(role, IMAGE), Choice(CPU, IMAGE)]
    assert no_gpu(role, refused(role, usage), reason, with_cpu) == (
        expected + " You can start a CPU-only server now with the role 'cpu'.")
    assert no_gpu(role, refused(role, usage), reason, [Choice(role, IMAGE)]) == (
        expected + " You have no CPU-only role; try again when a GPU is released.")
