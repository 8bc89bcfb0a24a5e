"""Every name that crosses the container boundary: labels and environment variables.

The hub writes these on the containers it creates; the pool, the culler and
the images' own code (the GPU monitor, the torch cap hook) read them back.
docs/architecture.md#the-contract-between-hub-and-container lists them.

Imported at every Python start inside the images (by the torch cap hook), so
it stays standard-library only.
"""

from __future__ import annotations

from collections.abc import Mapping

# --- labels --------------------------------------------------------------------

LABEL_PREFIX = "quota-spawner."
USER_LABEL = LABEL_PREFIX + "user"  # the hub user, as written
ROLE_LABEL = LABEL_PREFIX + "role"
IMAGE_LABEL = LABEL_PREFIX + "image"  # the quota table's image key
GPUS_LABEL = LABEL_PREFIX + "gpus"  # the assigned UUIDs, comma-separated; "" for none
GPU_MODE_LABEL = LABEL_PREFIX + "gpu-mode"  # "exclusive", "shared:<gpu_share>" or ""
HUB_LABEL = LABEL_PREFIX + "hub"  # the hub id: which hub's pool the container belongs to
NETWORK_LABEL = LABEL_PREFIX + "network"  # on the notebook network the hub creates
# On the notebook images, set by scripts/build-images.sh: what framework the
# image holds ("PyTorch 2.14.1 · CUDA 13.0"); the spawn form shows it.
FRAMEWORKS_LABEL = LABEL_PREFIX + "frameworks"
# The home's size in bytes the server started with; "" when its role has no disk or the
# hub does not enforce disk (docs/disk.md). Docker writes it on every container.
DISK_LABEL = LABEL_PREFIX + "disk"
# What the spawner writes on every server it starts, in this order (Docker's labels,
# a pod's annotations).
CONTRACT_LABELS = (USER_LABEL, ROLE_LABEL, IMAGE_LABEL, GPUS_LABEL, GPU_MODE_LABEL, HUB_LABEL)

# --- environment ---------------------------------------------------------------

QUOTA_ROLE = "QUOTA_ROLE"
CPU_LIMIT = "CPU_LIMIT"  # CPUs, as "%g"; read by jupyter-resource-usage
MEM_LIMIT = "MEM_LIMIT"  # bytes; read by jupyter-resource-usage
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
# Variables that select devices for the NVIDIA container hook: only the GPU
# assignment sets them.
NVIDIA_DEVICE_ENV = (NVIDIA_VISIBLE_DEVICES, "NVIDIA_MIG_CONFIG_DEVICES",
                     "NVIDIA_MIG_MONITOR_DEVICES")
# NVIDIA_VISIBLE_DEVICES without a GPU. CUDA images default to "all", so it is
# always set, and nothing from an earlier spawn's environment can survive.
NO_GPU = "void"
NO_GPU_VALUES = ("", NO_GPU, "none")  # what the NVIDIA hook reads as no GPU
GPU_MEMORY_LIMIT = "GPU_MEMORY_LIMIT"  # the soft cap in bytes, shared mode only
TORCH_ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
TORCH_FRACTION_KEY = "per_process_memory_fraction"  # torch 2.10+ reads it in TORCH_ALLOC_CONF
# The soft cap for each framework, set with GPU_MEMORY_LIMIT (spawner/policy/gpu.py).
PADDLE_MEMORY_LIMIT_MB = "FLAGS_gpu_memory_limit_mb"
PADDLE_ALLOCATOR = "FLAGS_allocator_strategy"
JAX_MEMORY_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"
JAX_PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"
TF_ALLOW_GROWTH = "TF_FORCE_GPU_ALLOW_GROWTH"
CAP_VARIABLES = (GPU_MEMORY_LIMIT, PADDLE_MEMORY_LIMIT_MB, PADDLE_ALLOCATOR,
                 JAX_MEMORY_FRACTION, JAX_PREALLOCATE, TF_ALLOW_GROWTH)
# The home's size, where the hub enforces disk (docs/disk.md#what-a-user-sees): set only
# then, with the file the container reads its home's use from, and, where the home held
# its size or more at the start (a smaller role), the sentence that says so.
DISK_LIMIT = "DISK_LIMIT"  # bytes, beside CPU_LIMIT and MEM_LIMIT
HOME_USE_FILE = "HOME_USE_FILE"  # names HOME_USE_PATH
HOME_OVER_SIZE = "HOME_OVER_SIZE"
DISK_ENV = (DISK_LIMIT, HOME_USE_FILE, HOME_OVER_SIZE)
# Where a home has a size, the files every Jupyter start writes live outside it, so a
# full home never keeps the server or a kernel from starting: the runtime files, and
# IPython's folder, which the kernel spec lookup and every kernel create. Jupyter's own
# variables: set by the hub only there, and an admin may set them elsewhere.
JUPYTER_RUNTIME_DIR = "JUPYTER_RUNTIME_DIR"
IPYTHONDIR = "IPYTHONDIR"
OFF_HOME = {JUPYTER_RUNTIME_DIR: "/tmp/jupyter-runtime", IPYTHONDIR: "/tmp/ipython"}
# Every variable the spawner owns: an admin may not set any of them.
CONTRACT_ENV = (CPU_LIMIT, MEM_LIMIT, QUOTA_ROLE, *THREAD_ENV, *NVIDIA_DEVICE_ENV,
                *CAP_VARIABLES, *DISK_ENV)


# --- files the hub writes into a running container -------------------------------

# A preemption notice (JSON, docs/preemption.md#the-notice): written by the hub, as
# the notebook user, when the server is chosen to be preempted; read by the GPU
# monitor (the banner) and by spawner.checkpoint.on_preempt. Removed if withdrawn.
PREEMPT_DIR = "/tmp/quota-spawner"
PREEMPT_NOTICE = PREEMPT_DIR + "/preemption.json"
# Processes that asked for the SIGTERM (spawner.checkpoint.on_preempt) leave an
# empty file named by their PID here; kernels are signalled without one.
PREEMPT_PIDS_DIR = PREEMPT_DIR + "/pids"


# The home's use as the container sees it, where disk is enforced: the host folder
# <state dir>/HOME_USE_STATE/<home name>/ is bind-mounted read-only at HOME_USE_DIR; the
# watchdog (and the hub, at the start) writes HOME_USE_NAME there atomically:
# {"version": 1, "used": bytes, "limit": bytes, "at": epoch seconds, "mechanism": "btrfs",
#  "full": bool}. btrfs's statfs does not show qgroup limits, so the container cannot
# read its own use.
HOME_USE_STATE = "home-use"
HOME_USE_DIR = "/run/quota-spawner"
HOME_USE_NAME = "home.json"
HOME_USE_PATH = HOME_USE_DIR + "/" + HOME_USE_NAME
HOME_USE_VERSION = 1
# A home is full when less than this is left of its size: the filesystem refuses a write
# a little before the size (btrfs reserves ahead; an image's ext4 keeps its metadata), so
# a home filled by writes may never reach used == limit.
HOME_FULL_MARGIN = 4 * 1024 * 1024


def home_is_full(used: int, limit: int) -> bool:
    """Whether a home of ``limit`` bytes holding ``used`` is full, as every reader says:
    its use within HOME_FULL_MARGIN (or 1%, for a small home) of its size, or past it."""
    return used >= limit - min(HOME_FULL_MARGIN, limit // 100)


# --- reading them back, inside the container -------------------------------------


def gpu_mode_value(gpus: int, mode: str, share: int) -> str:
    """GPU_MODE_LABEL's value for a holding of ``gpus`` GPUs in ``mode`` ("exclusive" or
    "shared", at most ``share`` holders a GPU); "" for none."""
    if not gpus:
        return ""
    return f"shared:{share}" if mode == "shared" else "exclusive"


def labelled_gpus(labels: Mapping[str, str]) -> tuple[str, ...]:
    """The UUIDs the quota-spawner.gpus label (or annotation) names, in order."""
    return tuple(u for u in (labels.get(GPUS_LABEL) or "").split(",") if u)


def labelled_disk(labels: Mapping[str, str]) -> int | None:
    """The home's size the quota-spawner.disk label says, in bytes; None when it is empty
    (no size), missing or not a positive whole number."""
    try:
        value = int(labels.get(DISK_LABEL) or "")
    except ValueError:
        return None
    return value if value > 0 else None


def reserved_cpus(env: Mapping[str, str], limit: float | None) -> float | None:
    """The CPUs a running container reserves: CPU_LIMIT in its environment (its role's,
    set from the start), else ``limit``, its CPU limit, which the start boost raises
    for the server's first seconds."""
    try:
        found = float(env.get(CPU_LIMIT, ""))
    except ValueError:
        return limit
    return found if 0 < found < float("inf") else limit  # NaN compares false


def gpu_memory_limit(env: Mapping[str, str]) -> int | None:
    """GPU_MEMORY_LIMIT in bytes; None when unset, unreadable or not positive."""
    try:
        value = int(env.get(GPU_MEMORY_LIMIT, ""))
    except ValueError:
        return None
    return value if value > 0 else None


def visible_devices(env: Mapping[str, str]) -> list[str] | None:
    """NVIDIA_VISIBLE_DEVICES as a list; None means all; [] means no GPU assigned."""
    value = env.get(NVIDIA_VISIBLE_DEVICES, "").strip()
    if value.lower() in NO_GPU_VALUES:
        return []
    if value.lower() == "all":
        return None
    return [v.strip() for v in value.split(",") if v.strip()]
