"""The layering of docs/architecture.md, read from the code's own imports: lower layers never import
higher ones, and no two folders import each other (directly or around a circle)."""

from __future__ import annotations

import ast
from pathlib import Path

import cpbench

PACKAGE = Path(cpbench.__file__).parent
# What the lower layers may never import: the layers above them.
UPPER = (
    "cpbench.workloads",
    "cpbench.launch",
    "cpbench.record",
    "cpbench.report",
    "cpbench.rank",
    "cpbench.app",
    "cpbench.__main__",
)
LOWER = ("core", "models", "distributed", "inputs", "results")


def _room(module: str) -> str:
    """The folder (or top-level module) a module belongs to: cpbench.measure.point -> measure."""
    return module.split(".")[1] if module.count(".") else module


def _imports() -> dict[str, set[str]]:
    """cpbench module -> the cpbench modules it imports (at any depth of its code)."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(("cpbench", *path.relative_to(PACKAGE).with_suffix("").parts))
        module = module.removesuffix(".__init__")
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cpbench"):
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names if a.name.startswith("cpbench"))
        graph[module] = names
    return graph


def test_lower_layers_never_import_upper_ones():
    wrong = [
        (module, name)
        for module, names in _imports().items()
        if _room(module) in LOWER
        for name in names
        if name.startswith(UPPER)
    ]
    assert not wrong


def test_core_imports_nothing_of_cpbench_but_itself():
    wrong = [(m, n) for m, names in _imports().items() if _room(m) == "core" for n in names
             if _room(n) != "core"]  # fmt: skip
    assert not wrong


def test_no_import_circles_between_folders():
    rooms: dict[str, set[str]] = {}
    for module, names in _imports().items():
        rooms.setdefault(_room(module), set()).update(_room(n) for n in names if _room(n) != _room(module))

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            room = todo.pop()
            if room == goal:
                return True
            if room not in seen:
                seen.add(room)
                todo.extend(rooms.get(room, ()))
        return False

    circles = sorted((a, b) for a, targets in rooms.items() for b in targets if reaches(b, a))
    assert not circles


def test_the_report_renders_records_and_imports_nothing_that_measures():
    allowed = {"report", "results", "record", "settings", "core", "cpbench"}  # cpbench: the package root
    wrong = [(m, n) for m, names in _imports().items() if _room(m) == "report" for n in names
             if _room(n) not in allowed]  # fmt: skip
    assert not wrong


# Every room of the package (each folder, each top-level module) in its layer's order, the lowest
# first: a room imports only rooms before it. A new folder is placed here, or this test fails.
LAYERS = (
    "cpbench",  # the package's own __init__
    "core",
    "torch_compat",
    "results",
    "inputs",
    "runtime",
    "distributed",
    "settings",
    "models",
    "sweep",
    "record",
    "workloads",
    "report",
    "measure",
    "experiment",
    "probe",
    "checks",
    "steptime",
    "preview",
    "check",
    "reference_curves",
    "rank",
    "launch",
    "app",
    "callbacks",
    "__main__",
    "calibrate",
    "predict",
    "forecast",
)


def test_every_room_has_its_layer_and_imports_only_rooms_below_it():
    graph = _imports()
    assert {_room(m) for m in graph} == set(LAYERS)
    rank = {room: i for i, room in enumerate(LAYERS)}
    upward = [(m, n) for m, names in graph.items() for n in names if rank[_room(n)] > rank[_room(m)]]
    assert not upward
