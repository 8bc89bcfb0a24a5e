"""End to end: what a researcher gets, in the real images, through a real hub.

- PyTorch and PaddlePaddle import in their images and run on the CPU here;
  their thread pools follow the role's CPUs;
- torch with a shared GPU's memory cap (PYTORCH_CUDA_ALLOC_CONF);
- the start CPU boost: the role's quota is in the container's cgroup once
  the server is handed over, on every start path, and a refused update
  stops the server;
- in Chromium, logged in through the hub: the GPU usage page opened from the
  home page's link, and JupyterLab's status bar (CPU and memory from
  jupyter-resource-usage, the GPU item with its warning colour and its link).

The GPU is FAKE: a declared inventory, the fake NVIDIA hook of the test
engine, and a FAKE pynvml mounted first on the notebook's PYTHONPATH
(tests/fake_nvml_container). Everything else is real.
"""

from __future__ import annotations

import json
import re
import time

import pytest
import requests
from browser import launch, log_in, wait_for_lab
from hubs import GPU_HUB_GPUS, on_hub
from playwright.sync_api import expect

from harness import ARTIFACTS, Hub, container_for, exec_text, teardown, write_fake_gpus

pytestmark = pytest.mark.e2e

WARNING = re.compile(r"\bqs-gpu-status-warning\b")  # the GPU item's warning class
GPUS = GPU_HUB_GPUS  # the shared hub's two fake GPUs (tests/hubs.py)
GiB = 2**30
QUOTAS = """\
images:
  pytorch: {image: "quota-spawner/pytorch:latest", display_name: PyTorch}
  paddle: {image: "quota-spawner/paddle:latest", display_name: PaddlePaddle}
roles:
  tiny: {cpus: 0.5, memory: 1G, images: [pytorch]}
  one: {cpus: 1, memory: 2G, images: [pytorch, paddle]}
  two: {cpus: 2, memory: 2G, images: [pytorch, paddle]}
  gpu:
    cpus: 1
    memory: 2G
    gpus: 1
    gpu_mode: shared
    gpu_share: 2
    gpu_memory: 8G
    images: [pytorch]
assignments:
  default: [tiny, one, two, gpu]
"""

# What each framework reports about itself and its thread pools, as JSON.
PROBE = r"""
import json, os, sys
out = {}
import numpy, threadpoolctl
if sys.argv[1] == "torch":
    import torch
    out.update(version=torch.__version__, cuda_build=torch.version.cuda,
               cuda=torch.cuda.is_available(), threads=torch.get_num_threads(),
               hook=any(type(f).__name__ == "_TorchImportHook" for f in sys.meta_path),
               sum=float(torch.ones(4, 4).matmul(torch.ones(4, 4)).sum()))
else:
    import paddle
    out.update(version=paddle.__version__, cuda=paddle.is_compiled_with_cuda(),
               sum=float(paddle.matmul(paddle.ones([4, 4]), paddle.ones([4, 4])).sum()))
numpy.ones((64, 64)) @ numpy.ones((64, 64))
out["pools"] = [(p["internal_api"], os.path.basename(p["filepath"]), p["num_threads"])
                for p in threadpoolctl.threadpool_info()]
out["alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
print(json.dumps(out))
"""


def gpu_state(used_gib: float, utilization: int) -> list[dict]:
    return [{"uuid": GPUS[0], "name": "Fake GPU", "memory": 16 * GiB,
             "used": int(used_gib * GiB), "utilization": utilization},
            {"uuid": GPUS[1], "name": "Fake GPU", "memory": 16 * GiB,
             "used": 0, "utilization": 0}]


@pytest.fixture(scope="module")
def res_hub(gpu_hub):
    """The session's 2-GPU hub, whose containers read the FAKE NVML of
    ``gpu_hub.fake_nvml``, with this module's table."""
    write_fake_gpus(gpu_hub.fake_nvml, gpu_state(2, 37))
    with on_hub(gpu_hub, QUOTAS):
        yield gpu_hub


@pytest.fixture(scope="module")
def fake_nvml(res_hub):
    return res_hub.fake_nvml


def probe(container, framework: str) -> dict:
    # PYTHONPATH holds the fake pynvml only; the frameworks are the image's own.
    code, out = exec_text(container, f"python -c '{PROBE}' {framework} 2>/dev/null")
    assert code == 0, out
    return json.loads(out.strip().splitlines()[-1])


def cpu_max(container) -> str:
    """The container's CPU quota and period as its cgroup says: "50000 100000"."""
    code, out = exec_text(container, "cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo "
                          "$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) "
                          "$(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)")  # cgroup v2, else v1
    assert code == 0, out
    return out.strip()


def threads_of(result: dict, api: str) -> set[int]:
    return {n for internal_api, _, n in result["pools"] if internal_api == api}


# --- frameworks ---------------------------------------------------------------------


def start(hub: Hub, client, name: str, role: str, image: str):
    """Start NAME's server with ROLE and IMAGE; its container."""
    hub.create_user(name)
    hub.start_server(name, {"profile": role, "image": image})
    return container_for(client, name)


@pytest.mark.parametrize("role,threads", [("one", 1), ("two", 2)])
def test_torch_runs_on_the_cpu_and_its_threads_follow_the_role(res_hub, docker_client,
                                                              role, threads):
    """This machine has 2 cores: in the 1-CPU role every pool must say 1, not 2."""
    name = f"torch-{role}"
    c = start(res_hub, docker_client, name, role, "pytorch")
    assert c.labels["quota-spawner.frameworks"].startswith("PyTorch 2.14.1 · CUDA 13.0")
    result = probe(c, "torch")
    assert result["version"].startswith("2.14.1") and result["cuda_build"] == "13.0"
    assert result["cuda"] is False and result["sum"] == 64.0  # CPU here, no error
    assert result["threads"] == threads
    assert threads_of(result, "openblas") == {threads}, result["pools"]  # NumPy's BLAS
    assert threads_of(result, "openmp") <= {threads}, result["pools"]  # torch's OpenMP
    assert cpu_max(c) == f"{threads * 100_000} 100000"
    res_hub.stop_server(name)


@pytest.mark.parametrize("role,threads", [("one", 1), ("two", 2)])
def test_paddle_runs_on_the_cpu_and_its_threads_follow_the_role(res_hub, docker_client,
                                                               role, threads):
    name = f"paddle-{role}"
    c = start(res_hub, docker_client, name, role, "paddle")
    assert c.labels["quota-spawner.frameworks"] == "PaddlePaddle 3.0.0 · CPU build"
    result = probe(c, "paddle")
    assert result["version"] == "3.0.0" and result["cuda"] is False
    assert result["sum"] == 64.0
    pools = {api for api, _, _ in result["pools"]}
    assert pools, "threadpoolctl found no thread pool"
    for api in pools:
        assert threads_of(result, api) == {threads}, result["pools"]
    res_hub.stop_server(name)


def test_torch_with_a_shared_gpus_memory_cap(res_hub, docker_client):
    """The cap travels as torch's own allocator setting; the startup hook stays out."""
    name = "torch-capped"
    c = start(res_hub, docker_client, name, "gpu", "pytorch")
    env = dict(e.split("=", 1) for e in c.attrs["Config"]["Env"])
    assert env["GPU_MEMORY_LIMIT"] == str(8 * GiB)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "per_process_memory_fraction:0.500"
    result = probe(c, "torch")
    assert result["version"].startswith("2.14.1") and result["sum"] == 64.0
    assert result["hook"] is False
    assert result["alloc_conf"] == "per_process_memory_fraction:0.500"
    res_hub.stop_server(name)


# --- the start CPU boost --------------------------------------------------------------


def test_boost_ends_with_the_roles_quota_on_every_start(res_hub, docker_client):
    name = "boosted"
    res_hub.create_user(name)
    for attempt in range(2):  # a first start, then a restart
        res_hub.start_server(name, {"profile": "tiny", "image": "pytorch"})
        c = container_for(docker_client, name)
        assert cpu_max(c) == "50000 100000", f"start {attempt}"
        assert c.attrs["HostConfig"]["CpuQuota"] == 50_000
        res_hub.stop_server(name)
    boosted = [line for line in res_hub.log().splitlines()
               if "CPU quota set from the start boost" in line and name in line]
    assert len(boosted) == 2, boosted


REFUSING_SPAWNER = """
from spawner import QuotaSpawner

class UpdateRefusedSpawner(QuotaSpawner):
    # FAULT INJECTION at the engine call: the update of the CPU quota fails.
    async def docker(self, method, *args, **kwargs):
        if method == "update_container":
            raise RuntimeError("fault injected: the engine refused the update")
        return await super().docker(method, *args, **kwargs)

c.JupyterHub.spawner_class = UpdateRefusedSpawner
"""


def test_a_refused_update_stops_the_server(docker_client, tmp_path_factory):
    prefix = "qsboost"
    hub = Hub(tmp_path_factory.mktemp("boosthub"), quota_text=QUOTAS, prefix=prefix,
              extra_config=REFUSING_SPAWNER).start()
    try:
        name = "never-unlimited"
        hub.create_user(name)
        r = hub.spawn(name, {"profile": "tiny", "image": "pytorch"})
        assert r.status_code in (201, 202, 500), r.text
        hub.wait_stopped(name, timeout=120)
        deadline = time.monotonic() + 30
        while docker_client.containers.list(all=True, filters={"name": f"{prefix}-"}):
            assert time.monotonic() < deadline, "the boosted container was left running"
            time.sleep(0.5)
        assert "could not be given its CPU limit, so it was stopped" in hub.log()
        assert "fault injected" in hub.log()
    finally:
        teardown(hub, docker_client, "boost-refused")


# --- in Chromium, through the hub's login ---------------------------------------------


@pytest.fixture(scope="module")
def browser():
    yield from launch()


@pytest.fixture
def browser_page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    yield context.new_page()
    context.close()


def spawn_from_form(page, role: str, image: str) -> None:
    page.click("#start")
    page.wait_for_url("**/hub/spawn**")
    page.locator(f".quota-choice[data-role={role}][data-image={image}]").click()
    page.click("form#spawn_form input[type=submit], form#spawn_form button[type=submit]")


@pytest.mark.browser
def test_gpu_page_from_the_home_link_and_the_lab_status_bar(res_hub, docker_client, fake_nvml,
                                                            browser_page):
    page = browser_page
    name = "lab-gpu"
    res_hub.create_user(name)
    write_fake_gpus(fake_nvml, gpu_state(2, 37))
    ARTIFACTS.mkdir(exist_ok=True)
    log_in(page, res_hub, name)
    page.click("#start")
    page.wait_for_url("**/hub/spawn**")
    gpu_choice = page.locator(".quota-choice[data-role=gpu][data-image=pytorch]")
    assert "PyTorch 2.14.1 · CUDA 13.0" in gpu_choice.inner_text()  # what the image holds
    page.screenshot(path=str(ARTIFACTS / "researcher-spawn-form.png"))
    gpu_choice.click()
    page.click("form#spawn_form input[type=submit], form#spawn_form button[type=submit]")
    wait_for_lab(page, "researcher-gpu")
    # handed over from the form: the role's quota, not the boost
    assert cpu_max(container_for(docker_client, name)) == "100000 100000"
    # No news popup: JupyterLab asks nothing about news on a first start, because
    # the image's overrides set fetchNews to "false" (the default asks).
    page.wait_for_timeout(1500)
    assert page.locator("text=official Jupyter news").count() == 0
    settings = requests.get(
        f"{res_hub.url}/user/{name}/lab/api/settings/@jupyterlab/apputils-extension:notification",
        headers={"Authorization": f"token {res_hub.user_token(name)}"}, timeout=30).json()
    assert settings["schema"]["properties"]["fetchNews"]["default"] == "false"

    # jupyter-resource-usage: memory in the status bar against MEM_LIMIT (2 GiB),
    # CPU and memory in the top bar against CPU_LIMIT and MEM_LIMIT.
    bar = page.locator("#jp-main-statusbar")
    expect(bar).to_contain_text("Mem:", timeout=30_000)
    expect(bar).to_contain_text("2048", timeout=30_000)  # "… / 2048.00 MB"
    top = page.locator("#jp-top-panel")
    expect(top).to_contain_text("CPU:", timeout=30_000)
    expect(top).to_contain_text("Mem:", timeout=30_000)
    # ... and the GPU item with the fake NVML's numbers against the 8 GiB cap.
    item = page.locator(".qs-gpu-status")
    expect(item).to_contain_text("37%", timeout=30_000)
    expect(item).to_contain_text("2.0 / 8.0 GiB")
    expect(item).not_to_have_class(WARNING)
    page.screenshot(path=str(ARTIFACTS / "lab-status-bar.png"))

    write_fake_gpus(fake_nvml, gpu_state(7.3, 95))  # 91% of the 8 GiB cap
    expect(item).to_have_class(WARNING, timeout=30_000)
    expect(item).to_contain_text("95%")
    page.screenshot(path=str(ARTIFACTS / "lab-status-bar-warning.png"))

    with page.context.expect_page() as opened:
        item.click()
    gpu_page = opened.value
    gpu_page.wait_for_load_state()
    assert gpu_page.url.endswith(f"/user/{name}/gpu")
    expect(gpu_page.locator("#gpus")).to_contain_text("95%", timeout=30_000)
    gpu_page.close()

    # The home page's link, as people reach the GPU page from the hub.
    write_fake_gpus(fake_nvml, gpu_state(3, 42))
    page.goto(f"{res_hub.url}/hub/home")
    page.click("a.gpu-usage-link")
    page.wait_for_url(f"**/user/{name}/gpu")
    expect(page.locator("#gpus")).to_contain_text("42%", timeout=30_000)
    expect(page.locator("#gpus")).to_contain_text("3.0 GiB")
    expect(page.locator("#updated")).not_to_contain_text("Could not update")
    page.screenshot(path=str(ARTIFACTS / "gpu-page-from-home.png"))
    res_hub.stop_server(name)


TRANSPARENT = "rgba(0, 0, 0, 0)"


def background(locator) -> str:
    return locator.evaluate("e => getComputedStyle(e).backgroundColor")


@pytest.mark.browser
def test_cpu_only_server_no_gpu_item_and_the_memory_warning(res_hub, docker_client, browser_page):
    page = browser_page
    name = "lab-cpu"
    res_hub.create_user(name)
    log_in(page, res_hub, name)
    spawn_from_form(page, "one", "paddle")
    wait_for_lab(page, "researcher-cpu")
    expect(page.locator("#jp-main-statusbar")).to_contain_text("Mem:", timeout=30_000)
    page.wait_for_timeout(3000)  # a few polls of the metrics
    assert page.locator(".qs-gpu-status:visible").count() == 0
    page.screenshot(path=str(ARTIFACTS / "lab-status-bar-cpu-only.png"))

    # Memory turns to a warning at 80% of MEM_LIMIT: a kernel takes 1.6 of 2 GiB.
    usage = page.locator("#jp-main-statusbar span[title='Current resource usage']")
    expect(usage).to_contain_text(re.compile(r"Mem: +[0-9.]+ / 2048.00 MB"), timeout=30_000)
    assert background(usage) == TRANSPARENT  # no warning yet: no CPU warning either
    page.locator(".jp-LauncherCard[data-category=Notebook]").first.click()
    page.wait_for_selector(".jp-Notebook .jp-Cell .cm-content", timeout=60_000)
    expect(page.locator("#jp-main-statusbar")).to_contain_text("| Idle", timeout=60_000)
    page.locator(".jp-Notebook .jp-Cell .cm-content").first.click()
    page.keyboard.type("x = bytearray(1600 * 2**20); len(x)")
    page.keyboard.press("Shift+Enter")
    try:
        expect(page.locator(".jp-OutputArea-output").first).to_contain_text(
            "1677721600", timeout=60_000)
    finally:
        page.screenshot(path=str(ARTIFACTS / "lab-memory-cell.png"))
    deadline = time.monotonic() + 30  # jupyter-resource-usage polls every 5 s
    while background(usage) == TRANSPARENT:
        assert time.monotonic() < deadline, "no memory warning at 1.6 of 2 GiB"
        page.wait_for_timeout(500)
    page.screenshot(path=str(ARTIFACTS / "lab-memory-warning.png"))
    res_hub.stop_server(name)
