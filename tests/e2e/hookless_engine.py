"""A private dockerd started WITHOUT the NVIDIA hook on its PATH (its `nvidia` device driver
is then off, as on a host without the NVIDIA Container Toolkit), and the tiny imported
image it and the test engine get (TINY), so nothing waits for the notebook images. The
module fixture ``hookless`` (tests/e2e/conftest.py) starts one; skipped where dockerd is
not installed."""

from __future__ import annotations

import io
import os
import secrets
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import docker
import pytest

ROOT = Path(__file__).resolve().parents[2]
FAKE_HOOK_DIR = ROOT / "scripts" / "fake-nvidia"
TINY = f"quota-spawner-test/tiny:{secrets.token_hex(4)}"  # what the test table names


def tiny_image(client: docker.APIClient, tag: str) -> None:
    """`docker import` of a tar holding one file: enough to create and start a container
    up to the device driver's selection (it has no program to run)."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        content = b"the NVIDIA runtime probe needs only an image\n"
        info = tarfile.TarInfo("README")
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    repository, _, version = tag.rpartition(":")
    client.import_image_from_data(data.getvalue(), repository=repository, tag=version)


def hookless_path() -> str:
    """PATH without any NVIDIA hook, fake or real."""
    keep = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and Path(d).resolve() != FAKE_HOOK_DIR.resolve()
            and not (Path(d) / "nvidia-container-runtime-hook").exists()]
    return os.pathsep.join(keep)


class Engine(NamedTuple):
    client: docker.APIClient
    host: str  # its DOCKER_HOST value


def hookless_engine() -> Iterator[Engine]:
    """A private dockerd with no NVIDIA hook on its PATH, and the tiny image as TINY (the
    body of the fixture ``hookless``), stopped and removed afterwards."""
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        pytest.skip("dockerd is not installed")
    # short: unix socket paths (containerd's under the exec root too) have a length limit
    folder = Path(tempfile.mkdtemp(prefix="qsnv", dir="/tmp"))
    host = f"unix://{folder}/docker.sock"
    log = open(folder / "dockerd.log", "wb")  # noqa: SIM115 (closed below)
    process = subprocess.Popen(
        [dockerd, "--host", host, "--data-root", str(folder / "data"),
         "--exec-root", str(folder / "exec"), "--pidfile", str(folder / "docker.pid"),
         "--bridge=none", "--iptables=false", "--ip-masq=false"],
        env={**os.environ, "PATH": hookless_path()}, stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True)
    client = docker.APIClient(base_url=host, version="auto", timeout=60) \
        if _answers(host, 60, process) else None
    try:
        if client is None:
            log.flush()
            pytest.fail("the hook-less dockerd did not answer within 60 s:\n" +
                        (folder / "dockerd.log").read_text(errors="replace")[-3000:])
        tiny_image(client, TINY)
        yield Engine(client, host)
    finally:
        if client is not None:
            client.close()
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        log.close()
        unmount_under(folder)
        shutil.rmtree(folder, ignore_errors=True)


def unmount_under(folder: Path) -> None:
    """What the engine left mounted under ``folder`` (its default netns), deepest first."""
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts]
    for point in sorted((p for p in points if p.startswith(f"{folder}/")), reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def _answers(host: str, seconds: float, process: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with docker.APIClient(base_url=host, version="auto", timeout=5) as client:
                client.ping()
            return True
        except Exception:
            time.sleep(0.2)
    return False
