"""The GPU claims that only a real GPU can show, in one run (for the device machine).

    .venv/bin/python bench/device_check.py        # prints one block per claim

1. NVML discovery on the real card (spawner.gpu.inventory): UUID, name, memory.
2. A torch process under a shared-mode soft cap fails to allocate past it,
   with the environment the spawner gives it: GPU_MEMORY_LIMIT and
   PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:F, which torch 2.10+
   reads itself (the image's hook, spawner.gpu.torch_cap, stands aside);
   an older torch gets the cap from the hook. Also: torch sees the GPU.
5. PaddlePaddle sees the GPU (a GPU build; the local paddle image is the CPU
   build and says so).

Run it inside the pytorch image for the pinned torch, e.g.
    docker run --rm --gpus all -v $PWD:/src -w /src --entrypoint python \
        quota-spawner/pytorch:latest bench/device_check.py
3. The monitor's collector on the real card while torch allocates and
   multiplies matrices: its readings against nvidia-smi's, and the busy rule.
4. The cost of one NVML sample against one `nvidia-smi` call (target: at most
   1 ms per GPU for NVML).

Each part says SKIP with the reason when the machine lacks something (no
NVML, no torch, no nvidia-smi), so it also runs, uselessly, without a GPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spawner.gpu.env import memory_fraction, torch_alloc_conf  # noqa: E402
from spawner.gpu.inventory import discover_nvml  # noqa: E402
from spawner.monitor.collector import GpuMonitor  # noqa: E402

CAP = 2 * 2**30
TORCH_CAP = textwrap.dedent(f"""
    import sys
    import spawner.gpu.torch_cap as hook; hook.install()
    import torch, os
    print("torch", torch.__version__, "cuda", torch.version.cuda,
          "available", torch.cuda.is_available(), torch.cuda.get_device_name(0))
    print("PYTORCH_CUDA_ALLOC_CONF =", os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
          "| hook armed:", any(type(f).__name__ == "_TorchImportHook" for f in sys.meta_path))
    torch.cuda.init()
    a = torch.empty({CAP // 2}, dtype=torch.uint8, device="cuda")
    print("allocated 1 GiB under a 2 GiB cap: ok")
    try:
        b = torch.empty({CAP * 2}, dtype=torch.uint8, device="cuda")
        print("allocated 4 GiB under a 2 GiB cap: THE CAP DID NOT HOLD")
    except torch.cuda.OutOfMemoryError as e:
        print("4 GiB under a 2 GiB cap refused:", str(e).splitlines()[0][:160])
""")
PADDLE = textwrap.dedent("""
    try:
        import paddle
    except ImportError:
        print("SKIP: paddle is not installed (run this in the paddle image)")
    else:
        gpu = paddle.is_compiled_with_cuda()
        print("paddle", paddle.__version__, "GPU build" if gpu else "CPU build",
              "GPUs:", paddle.device.cuda.device_count() if gpu else 0)
        if gpu:
            paddle.utils.run_check()
""")
LOAD = textwrap.dedent("""
    import time, torch
    x = torch.empty(6 * 2**30, dtype=torch.uint8, device="cuda")  # 6 GiB held
    m = torch.randn(8192, 8192, device="cuda")
    end = time.time() + 25
    while time.time() < end:
        m = (m @ m).clamp_(-1, 1)
    torch.cuda.synchronize()
""")


def smi(query: str) -> list[str]:
    out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def part(title: str) -> None:
    print(f"\n== {title}", flush=True)


def main() -> int:
    part("1. NVML discovery (spawner.gpu.inventory.discover_nvml)")
    inventory = discover_nvml()
    print(inventory.describe())
    for d in inventory.devices:
        print(f"  {d.index}: {d.uuid} {d.name} memory={d.memory}")
    if not inventory.devices:
        print("SKIP the rest: no GPU")
        return 0
    has_smi = shutil.which("nvidia-smi") is not None
    if has_smi:
        print("nvidia-smi:", smi("index,uuid,name,memory.total"))

    fraction = memory_fraction(CAP, inventory.devices[0].memory)
    env = dict(os.environ, PYTHONPATH=str(ROOT), GPU_MEMORY_LIMIT=str(CAP),
               CUDA_VISIBLE_DEVICES="0", PYTORCH_CUDA_ALLOC_CONF=torch_alloc_conf("", fraction))
    try:
        import torch  # noqa: F401
        has_torch = True
    except ImportError:
        has_torch = False

    part("2. torch under a shared-mode soft cap (GPU_MEMORY_LIMIT=2 GiB)")
    if has_torch:
        r = subprocess.run([sys.executable, "-c", TORCH_CAP], env=env, capture_output=True,
                           text=True, timeout=300)
        print(r.stdout.strip() or r.stderr.strip()[-2000:])
    else:
        print("SKIP: torch is not installed")

    part("3. the collector under load, against nvidia-smi")
    monitor = GpuMonitor(env={"NVIDIA_VISIBLE_DEVICES": inventory.devices[0].uuid},
                         busy_window=10)
    load = None
    if has_torch:
        load = subprocess.Popen([sys.executable, "-c", LOAD], env=env)
        time.sleep(8)  # let it allocate and start multiplying
    for _ in range(15):
        reading = monitor.sample()
        monitor.record(reading)
        time.sleep(1)
    gpu = reading["gpus"][0] if reading["gpus"] else {}
    print("collector:", {k: gpu.get(k) for k in ("uuid", "memory_used", "memory_total",
                                                  "utilization", "temperature", "power_draw",
                                                  "processes")})
    if has_smi:
        print("nvidia-smi:", smi("uuid,memory.used,memory.total,utilization.gpu,"
                                 "temperature.gpu,power.draw")[0])
    print("busy rule:", monitor.busy, "(expected True under load)" if load else "")
    if load:
        load.wait(60)

    part("4. one NVML sample against one nvidia-smi call")
    n = 200
    t = time.perf_counter()
    for _ in range(n):
        monitor.sample()
    per = (time.perf_counter() - t) / n
    gpus = max(1, len(reading["gpus"]))
    print(f"NVML sample: {per * 1e3:.3f} ms for {gpus} GPU(s) = {per * 1e3 / gpus:.3f} ms/GPU "
          f"(target <= 1 ms/GPU: {'ok' if per / gpus <= 1e-3 else 'MISSED'})")
    if has_smi:
        t = time.perf_counter()
        for _ in range(10):
            smi("memory.used,utilization.gpu,temperature.gpu,power.draw")
        call = (time.perf_counter() - t) / 10
        print(f"nvidia-smi call: {call * 1e3:.1f} ms; ratio sample/call {per / call:.4f}")
    monitor.close()

    part("5. PaddlePaddle sees the GPU")
    r = subprocess.run([sys.executable, "-c", PADDLE], env=env, capture_output=True,
                       text=True, timeout=300)
    print(r.stdout.strip() or r.stderr.strip()[-1000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
