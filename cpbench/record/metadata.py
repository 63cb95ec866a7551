"""The run's metadata: what a reader needs to trust or reproduce a table."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

import cpbench
from cpbench.core import Topology
from cpbench.record import nvml
from cpbench.record.run_record import RunMetadata
from cpbench.settings.schema import BenchConfig


def project_commit() -> str:
    """The checkout cpbench runs from, `-dirty` with uncommitted changes; `unknown` when installed."""
    root = Path(cpbench.__file__).resolve().parent.parent

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()  # fmt: skip

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's marketing name from /proc/cpuinfo ("model name"; "Model" or "Hardware" on some ARM
    machines); the architecture where none is given."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    for field in ("model name", "Model", "Hardware"):
        for line in cpuinfo.splitlines():
            name, _, value = line.partition(":")
            if name.strip() == field and value.strip():
                return " ".join(value.split())
    return platform.processor() or platform.machine()


def smt(active_file: Path = Path("/sys/devices/system/cpu/smt/active"), cpuinfo: str | None = None) -> str:
    """Whether the cores run two hardware threads each ("on" / "off"): the kernel's own flag, else
    "siblings" against "cpu cores" in /proc/cpuinfo; "unknown" where neither is there."""
    try:
        return "on" if active_file.read_text().strip() == "1" else "off"
    except OSError:
        pass
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "unknown"
    siblings = re.search(r"^siblings\s*:\s*(\d+)", cpuinfo, re.MULTILINE)
    cores = re.search(r"^cpu cores\s*:\s*(\d+)", cpuinfo, re.MULTILINE)
    if not (siblings and cores):
        return "unknown"
    return "on" if int(siblings.group(1)) > int(cores.group(1)) else "off"


def device_model(device: torch.device) -> str:
    """The model of the device a rank runs on: the GPU's name, or the CPU's."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def workload_settings(settings: BenchConfig) -> dict[str, Any]:
    """The workload's settings as plain containers (a model's options included), for run.json."""
    return OmegaConf.to_container(OmegaConf.create(settings.workload), resolve=True)


def workload_labels(settings: BenchConfig, name: str) -> tuple[str, str]:
    """The workload's preset and the first 8 hex digits of a sha256 of its resolved settings (sorted
    keys), which tell two presets, or one preset with other sizes, apart. The preset is the setting
    `workload_preset` (the Hydra choice, `workload=fold_small`), else the workload's `name` (a config
    composed outside Hydra's app)."""
    container = OmegaConf.to_container(OmegaConf.create(settings.workload), resolve=True)
    digest = hashlib.sha256(json.dumps(container, sort_keys=True, default=str).encode()).hexdigest()
    return settings.workload_preset or name, digest[:8]


def sharing(local_world: int, gpus_seen: int | None, cores: int) -> dict[str, Any]:
    """How this node's `local_world` ranks share its devices, counted from the devices each rank sees.
    GPU ranks (`gpus_seen`: those one rank sees) see the same GPUs and take one each, or see one GPU of
    their own each where a site binds one per task (CUDA_VISIBLE_DEVICES=<k>; NCCL refuses two ranks of
    one group on one GPU), which is no sharing. CPU ranks (None) share the node's `cores`."""
    if gpus_seen is None:
        devices, units, unit = 1, cores, "CPU core"
    else:
        devices = local_world if gpus_seen == 1 else gpus_seen
        units, unit = devices, "GPU"
    shared = local_world > devices
    return {
        "device_count": devices,
        "devices_shared": f"yes ({local_world} ranks on {devices} device(s))" if shared else "no",
        "ranks_per_device": round(local_world / units, 2),
        "oversubscribed": f"yes ({local_world} ranks on {units} {unit}(s))" if local_world > units else "no",
    }


def collect(
    device: torch.device,
    backend: str,
    topology: Topology,
    world_size: int,
    local_world: int,
    config_digest: str,
) -> RunMetadata:
    """What the run ran on and with, at its start (the session adds the seed, the cap, comm timing).
    Called in a rank, after its device is set: the CUDA queries here never run in a launching process."""
    on_cuda = device.type == "cuda"
    gpu = nvml.gpu_state(str(torch.cuda.get_device_properties(device).uuid)) if on_cuda else {}
    found = {
        "date": now(),
        "host": socket.gethostname(),
        "device": device_model(device),
        "cpu_cores": os.cpu_count(),
        "smt": smt(),
        "backend": backend,
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none",
        "topology": topology.label,
        "cp": topology.cp,
        "grid": topology.grid_label,
        "world_size": world_size,
        "clocks_locked": "n/a (CPU)",
        **gpu,
        **sharing(local_world, torch.cuda.device_count() if on_cuda else None, os.cpu_count() or 1),
        "config_hash": config_digest,
        "commit": project_commit(),
    }
    return RunMetadata(**found)
