"""The torch cap hook, in a child process with a fake torch, and its .pth line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
G = 2**30


FAKE_TORCH_CUDA = '''\
"""A FAKE torch.cuda: records what the cap hook queues and what it sets."""
queued = []
fractions = []
TOTALS = [80 * 2**30, 16 * 2**30]


class _Properties:
    def __init__(self, total):
        self.total_memory = total


def _lazy_call(fn):
    queued.append(fn)


def device_count():
    return len(TOTALS)


def get_device_properties(device):
    return _Properties(TOTALS[device])


def set_per_process_memory_fraction(fraction, device):
    fractions.append([device, fraction])
'''

REPORT = (  # after the lines that set `hooked`: import torch, run CUDA's lazy init, print
    "import torch\n"
    "queued = len(torch.cuda.queued)\n"
    "[fn() for fn in list(torch.cuda.queued)]\n"
    "print(json.dumps({'hooked': hooked, 'queued': queued, 'fractions': torch.cuda.fractions}))\n"
)
HOOKS = "sum(type(f).__name__ == '_TorchImportHook' for f in sys.meta_path)"


def cap_child(torch_first: bool = False, installs: int = 1) -> str:
    """Install the hook (after or before torch is imported), then REPORT."""
    return (
        "import json, sys\n"
        + ("import torch\n" if torch_first else "")
        + "import spawner.notebook.torch_cap as m\n"
        + "m.install()\n" * installs
        + f"hooked = {HOOKS}\n"
        + REPORT
        + f"assert {HOOKS} == 0, 'the hook stays after torch was imported'\n"
    )


@pytest.fixture
def fake_torch(tmp_path):
    package = tmp_path / "fake" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""A FAKE torch."""\nfrom . import cuda  # noqa\n')
    (package / "cuda.py").write_text(FAKE_TORCH_CUDA)
    return package.parent


def run_child(code: str, fake: Path, limit: str | None, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("GPU_MEMORY_LIMIT", "PYTHONPATH")}
    env["PYTHONPATH"] = f"{fake}{os.pathsep}{ROOT}"
    if limit is not None:
        env["GPU_MEMORY_LIMIT"] = limit
    result = subprocess.run([sys.executable, "-c", code, *args], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("torch_first", [False, True])
def test_torch_cap_applied_to_every_device(fake_torch, torch_first):
    out = run_child(cap_child(torch_first, installs=1 if torch_first else 2), fake_torch,
                    str(20 * G))
    assert out["fractions"] == [[0, 0.25], [1, 1.0]]  # 20G of 80G; more than 16G -> all of it
    assert out["queued"] == 1  # one lazy call, however often install() ran
    assert out["hooked"] == (0 if torch_first else 1)


@pytest.mark.parametrize("limit", [None, "", "0", "-5", "lots"])
def test_torch_untouched_without_a_valid_limit(fake_torch, limit):
    assert run_child(cap_child(), fake_torch, limit) == {
        "hooked": 0, "queued": 0, "fractions": []}


PTH = ROOT / "images" / "common" / "quota_spawner_gpu_cap.pth"


def pth_line() -> str:
    script = (ROOT / "images" / "common" / "notebook-setup.sh").read_text()
    assert f'"$HERE/{PTH.name}"' in script, "notebook-setup.sh no longer installs the .pth file"
    return PTH.read_text().strip()


@pytest.mark.parametrize("limit, hooked, fractions", [
    (str(8 * G), True, [[0, 0.1], [1, 0.5]]),
    (None, False, []),
    ("", False, []),
])
def test_pth_line_from_notebook_setup(fake_torch, tmp_path, limit, hooked, fractions):
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "quota_spawner_gpu_cap.pth").write_text(pth_line() + "\n")
    code = (
        "import json, site, sys\n"
        "site.addsitedir(sys.argv[1])\n"
        "hooked = 'spawner.notebook.torch_cap' in sys.modules\n"
        + REPORT
    )
    out = run_child(code, fake_torch, limit, str(site_dir))
    assert out["hooked"] is hooked
    assert out["fractions"] == fractions


def test_torch_hook_stands_aside_for_a_torch_that_reads_the_allocator_setting(monkeypatch):
    from spawner.notebook import torch_cap as cap

    assert cap.reads_alloc_conf(cap.release("2.14.1+cu130")) and cap.reads_alloc_conf((3, 0))
    assert not cap.reads_alloc_conf(cap.release("2.7.1")) and not cap.reads_alloc_conf(None)
    assert cap.release("nightly") is None
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF",
                       "expandable_segments:True,per_process_memory_fraction:0.250")
    cap.drop_fraction_option()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "per_process_memory_fraction:0.250")
    cap.drop_fraction_option()
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ
