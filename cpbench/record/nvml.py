"""What makes two GPU timings comparable, read through NVML: the driver, the SM clocks (applications
vs maximum, and whether they are locked), the power limit and the other processes on the device.
Each field is a reading or "unknown" with the reason it could not be read, never a guess. And the
device's used memory, which a point's peak records beside the allocator's figures."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

FIELDS = ("gpu_driver", "sm_clocks_mhz", "clocks_locked", "gpu_processes", "power_limit_w")


def gpu_state(uuid: str) -> dict[str, Any]:
    """The NVML reading of the GPU with this UUID (torch's `get_device_properties(d).uuid`: NVML
    indexes devices without CUDA_VISIBLE_DEVICES, so the UUID is what names the same device)."""
    try:
        import pynvml
    except ImportError:
        return _unknown("nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return _unknown(f"NVML: {err}")
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}".encode())
    except pynvml.NVMLError as err:
        pynvml.nvmlShutdown()
        return _unknown(f"NVML has no GPU-{uuid}: {err}")
    try:
        return _read(pynvml, handle)
    finally:
        pynvml.nvmlShutdown()


def used_gib(uuid: str) -> float | None:
    """NVML's used memory of the GPU with this UUID, GiB: every process on it, CUDA contexts and NCCL's
    buffers included, which no allocator statistic counts; None where NVML cannot say."""
    handle = _handle(uuid)
    if handle is None:
        return None
    import pynvml

    try:
        return pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**30
    except pynvml.NVMLError:
        return None


@cache
def _handle(uuid: str) -> Any | None:
    """The device's NVML handle, NVML started once for the process (a reading per point, not a start
    and a shutdown each); None without NVML or without that device."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}".encode())
    except pynvml.NVMLError:
        return None


def _unknown(reason: str) -> dict[str, Any]:
    return dict.fromkeys(FIELDS, f"unknown ({reason})")


def _read(nvml: Any, handle: Any) -> dict[str, Any]:
    def query(read: Callable[[], Any]) -> Any:
        try:
            return read()
        except nvml.NVMLError as err:
            return f"unknown (NVML: {err})"

    sm, user_defined = nvml.NVML_CLOCK_SM, nvml.nvmlClocksEventReasonUserDefinedClocks
    applications = query(lambda: nvml.nvmlDeviceGetApplicationsClock(handle, sm))
    default = query(lambda: nvml.nvmlDeviceGetDefaultApplicationsClock(handle, sm))
    maximum = query(lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, sm))
    reasons = query(lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
    processes = query(lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle))
    limit_mw = query(lambda: nvml.nvmlDeviceGetPowerManagementLimit(handle))
    return {
        "gpu_driver": query(nvml.nvmlSystemGetDriverVersion),
        "sm_clocks_mhz": f"{applications} applications / {maximum} max",
        "clocks_locked": clocks_locked(reasons, applications, default, user_defined),
        # This rank's own process is one of them: more than the ranks on the device means sharing.
        "gpu_processes": processes if isinstance(processes, str) else len(processes),
        "power_limit_w": limit_mw if isinstance(limit_mw, str) else round(limit_mw / 1000),
    }


def clocks_locked(reasons: int | str, applications: int | str, default: int | str, user_defined: int) -> str:
    """Held by user-defined clocks (`nvidia-smi --lock-gpu-clocks` or applications clocks: NVML gives
    one reason bit for both), or applications clocks set away from their default; else free to boost.
    A reading of the moment metadata is collected."""
    if isinstance(reasons, str):
        return reasons
    if reasons & user_defined:
        return "yes (user-defined clocks)"
    if isinstance(applications, int) and isinstance(default, int) and applications != default:
        return f"yes (applications clocks {applications} MHz, default {default} MHz)"
    return "no"
