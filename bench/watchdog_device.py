"""The watchdog's GPU claims that only a real GPU can show, in one run (for a GPU machine).

    python3 bench/watchdog_device.py          # needs torch with CUDA and nvidia-ml-py

1. NVML's process list under a real torch allocation: the watchdog's
   ``Nvml.host_gpus()`` lists the allocating process, by host PID, with its memory.
2. The PID mapping for it: ``container_id_of(pid)`` and the /proc/PID/cgroup
   lines it reads (outside a container it is None, and says so), and
   ``gpu_memory_by_container`` for the same reading.
3. The cost of one watchdog NVML cycle (every GPU with its processes, plus the
   XID poll) against one ``nvidia-smi`` call that reads the same (GPUs and
   compute apps), as the polling scripts operators run today do.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spawner.gpu.nvml import Nvml, XidWatcher  # noqa: E402
from spawner.watchdog.app import reading_of  # noqa: E402
from spawner.watchdog.host import container_id_of, gpu_memory_by_container  # noqa: E402

HOLD = 2 * 2**30
CHILD = (
    "import sys, time, torch\n"
    f"x = torch.empty({HOLD}, dtype=torch.uint8, device='cuda:0'); x.fill_(1)\n"
    "torch.cuda.synchronize(); print('ready', flush=True); time.sleep(120)\n"
)


def part(title: str) -> None:
    print(f"\n== {title}", flush=True)


def main() -> None:
    nvml = Nvml()
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline().strip() if child.stdout else ""
        assert line == "ready", f"the torch child did not start: {line!r}"
        time.sleep(1)
        part("1. NVML's process list under a real torch allocation (Nvml.host_gpus)")
        scan = nvml.host_gpus()
        print("scan error:", scan.error)
        samples = [reading_of(d, []) for d in scan.gpus]  # as the watchdog reads them
        for gpu in samples:
            print(f"GPU {gpu.index} {gpu.uuid} {gpu.name}: used {gpu.memory_used} of "
                  f"{gpu.memory_total}, utilization {gpu.utilization}, lost {gpu.lost}")
            for p in gpu.processes:
                mark = "  <- the torch child" if p.pid == child.pid else ""
                print(f"   process pid {p.pid}: {p.used_memory} bytes{mark}")
        pids = [p.pid for g in samples for p in g.processes]
        print(f"torch child pid {child.pid}; NVML lists it: {child.pid in pids}")
        if child.pid not in pids:
            print("NVML's PIDs are not this namespace's (a sandbox or container without the "
                  "host's PID namespace): the mapping needs the host's PIDs (pid: host)")

        part("2. The PID mapping for it (container_id_of, gpu_memory_by_container)")
        for pid in sorted(set(pids) | {child.pid}):
            try:
                lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
            except OSError as e:
                lines = [f"(unreadable: {e})"]
            print(f"pid {pid}: container {container_id_of(pid)!r}; /proc/{pid}/cgroup: {lines[:4]}")
        print("gpu_memory_by_container:", gpu_memory_by_container(samples))

        part("3. One watchdog NVML cycle against one nvidia-smi call")
        xids = XidWatcher(nvml)
        print("XID events watched on:", xids.poll() == [] and "ok", "skipped:", xids.skipped)
        times = []
        for _ in range(50):
            began = time.perf_counter()
            nvml.host_gpus()
            xids.poll()
            times.append(time.perf_counter() - began)
        smi = shutil.which("nvidia-smi")
        smi_times = []
        if smi:
            for _ in range(10):
                began = time.perf_counter()
                subprocess.run([smi, "--query-gpu=index,uuid,memory.used,memory.total,"
                                "utilization.gpu", "--format=csv,noheader"],
                               capture_output=True, check=True)
                subprocess.run([smi, "--query-compute-apps=pid,gpu_uuid,used_memory",
                                "--format=csv,noheader"], capture_output=True, check=True)
                smi_times.append(time.perf_counter() - began)
        ours = statistics.median(times) * 1000
        print(f"watchdog NVML cycle: median {ours:.3f} ms, max {max(times) * 1000:.3f} ms "
              f"({len(scan.gpus)} GPU(s), 50 cycles)")
        if smi_times:
            theirs = statistics.median(smi_times) * 1000
            print(f"nvidia-smi (GPUs + compute apps): median {theirs:.1f} ms (10 calls)")
            print(f"ratio watchdog / nvidia-smi: {ours / theirs:.4f}")
        else:
            print("nvidia-smi: not on PATH")
    finally:
        child.kill()
        child.wait()
        xids_close = getattr(locals().get("xids"), "close", None)
        if xids_close:
            xids_close()
        print(f"\npython {sys.version.split()[0]}, pid {os.getpid()}")


if __name__ == "__main__":
    main()
