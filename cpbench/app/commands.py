"""cpbench's commands: what one call does once its run is checked and its folder is its own, and
whether it starts ranks (a command that starts none needs neither their world nor their devices).
Each entry point sets its `command=` (cpbench/predict.py, forecast.py, calibrate.py; `python -m
cpbench` is measure). A new command is one module with its function and one entry here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cpbench.app.forecast import calibrate, forecast
from cpbench.app.invocation import Invocation
from cpbench.app.measure import measure
from cpbench.app.traces import predict_alone
from cpbench.settings.schema import Command


@dataclass(frozen=True)
class CommandEntry:
    starts_ranks: bool
    run: Callable[[Invocation], int]  # the exit code


COMMANDS: dict[Command, CommandEntry] = {
    Command.measure: CommandEntry(starts_ranks=True, run=measure),
    Command.predict: CommandEntry(starts_ranks=False, run=predict_alone),
    Command.forecast: CommandEntry(starts_ranks=False, run=forecast),
    Command.calibrate: CommandEntry(starts_ranks=True, run=calibrate),
}
