"""The GPU timing and metadata paths, as far as a machine without a GPU can check them."""

from __future__ import annotations

import time

import pytest
import torch

from cpbench.measure.point import PointSettings, comm_timing
from cpbench.measure.step import StepClock
from cpbench.record import nvml


def test_without_nvml_every_gpu_field_says_unknown_and_why():
    state = nvml.gpu_state("00000000-0000-0000-0000-000000000000")
    assert set(state) == set(nvml.FIELDS)
    for value in state.values():
        assert value.startswith("unknown (") and len(value) > len("unknown ()"), value


USER_DEFINED = 0x2  # pynvml.nvmlClocksEventReasonUserDefinedClocks


@pytest.mark.parametrize(
    ("reasons", "applications", "default", "expected"),
    [
        (USER_DEFINED | 0x4, 1980, 1980, "yes (user-defined clocks)"),
        (0x4, 1755, 1980, "yes (applications clocks 1755 MHz, default 1980 MHz)"),
        (0x4, 1980, 1980, "no"),
        ("unknown (NVML: Not Supported)", 1980, 1980, "unknown (NVML: Not Supported)"),
    ],
)
def test_clocks_locked_reads_the_reason_nvml_gives(reasons, applications, default, expected):
    assert nvml.clocks_locked(reasons, applications, default, USER_DEFINED) == expected


def test_step_clock_on_cpu_gives_the_wall_time_between_marks():
    clock = StepClock(torch.device("cpu"))
    clock.mark()
    time.sleep(0.02)
    clock.mark()
    clock.mark()
    first, second = clock.seconds()
    assert 0.015 < first < 1.0 and 0 <= second < 0.01


@pytest.mark.parametrize(
    ("device", "settings", "words"),
    [
        ("cpu", PointSettings(), "wall clock"),
        ("cuda", PointSettings(), "CUDA events"),
        ("cpu", PointSettings(profile_comm=True), "profiler"),
        ("cpu", PointSettings(counts_comm=False), "not measured"),
    ],
)
def test_the_report_says_how_comm_time_was_measured(device, settings, words):
    assert words in comm_timing(torch.device(device), settings)
