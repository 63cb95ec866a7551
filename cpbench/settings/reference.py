"""docs/settings.md, written from the structured config: each key's type, its default and the comment
kept beside its field in cpbench/settings/, so that the reference cannot drift from the code
(tests/unit/test_settings_reference.py fails when they disagree).

    python -m cpbench.settings.reference            # rewrite docs/settings.md
    python -m cpbench.settings.reference OUT.md     # or write it elsewhere
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import io
import sys
import tokenize
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_module
from omegaconf import MISSING, OmegaConf

from cpbench.settings.schema import BenchConfig, register

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "settings.md"
CONFIGS = ROOT / "configs"
GROUPS = ("workload", "experiment", "hydra/launcher")  # the config groups a user picks from


@dataclass(frozen=True)
class Row:
    """One key of the page, each cell as the page shows it."""

    key: str
    type: str
    default: str
    description: str
    schema: str | None = None  # the schema's own default, where configs/config.yaml sets another


@cache
def _source(module_file: str) -> tuple[ast.Module, dict[int, str], list[str]]:
    """A source file's syntax tree, the comment on each of its lines (by number), and its lines."""
    source = Path(module_file).read_text()
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    comments = {t.start[0]: t.string.lstrip("#").strip() for t in tokens if t.type == tokenize.COMMENT}
    return ast.parse(source), comments, source.splitlines()


def _described(cls: type) -> dict[str, str]:
    """Each attribute of a class mapped to its description: the comment lines directly above it and the
    comment at the end of its own lines, joined into one line."""
    tree, comments, lines = _source(inspect.getsourcefile(cls))
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    found = {}
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            name = stmt.target.id
        elif isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
            name = stmt.targets[0].id
        else:
            continue
        above, line = [], stmt.lineno - 1
        while line >= 1 and lines[line - 1].lstrip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        trailing = [comments[n] for n in range(stmt.lineno, stmt.end_lineno + 1) if n in comments]
        found[name] = _joined([" ".join(above), *trailing])
    return found


def _joined(parts: list[str]) -> str:
    """Comment fragments as one line, each ended as a sentence where it is not."""
    parts = [p for p in parts if p]
    return " ".join(p if p is parts[-1] or p[-1] in ".:;!?" else f"{p}." for p in parts)


def _doc(cls: type) -> str:
    """A class's docstring as one line (dataclasses invent one from the signature: not a description)."""
    doc = cls.__dict__.get("__doc__") or ""
    return "" if doc.startswith(f"{cls.__name__}(") else " ".join(doc.split())


def _yaml(value: Any) -> str:
    """A value as an override would spell it."""
    if isinstance(value, enum.Enum):
        value = value.value
    if value is MISSING or value == "???":
        return "(required)"
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, str):
        return value if value else '""'
    if isinstance(value, list):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _choices(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


def _type(hint: Any, annotation: str) -> str:
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return " | ".join(m.value for m in hint)
    return annotation.replace("None", "null").replace("typing.", "")


def _schema_default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _enum_members(hint: type[enum.Enum]) -> str:
    described = _described(hint)
    return "; ".join(f"`{m.value}`: {described[m.name]}" for m in hint if described.get(m.name))


def sections(composed: dict[str, Any], chosen: dict[str, Any]) -> list[tuple[str, str, list[Row]]]:
    """(section key, its description, its rows): the top level first, then each nested config."""
    out: list[tuple[str, str, list[Row]]] = []

    def walk(cls: type, prefix: str, values: dict[str, Any], intro: str) -> None:
        hints = typing.get_type_hints(cls)
        described = _described(cls)
        rows, nested = [], []
        for f in dataclasses.fields(cls):
            key, hint = f"{prefix}{f.name}", hints[f.name]
            if dataclasses.is_dataclass(hint):
                nested.append((hint, key, described.get(f.name, "")))
                continue
            description = described.get(f.name, "")
            if isinstance(hint, type) and issubclass(hint, enum.Enum) and _enum_members(hint):
                description = _joined([description, _enum_members(hint)])
            kind, schema = _type(hint, str(f.type)), None
            if f.name in GROUPS:
                kind = "config group: " + ", ".join(_choices(f.name))
                default = _yaml(chosen.get(f.name))
            else:
                default = _yaml(values.get(f.name, MISSING))
                schema = _yaml(_schema_default(f))
            rows.append(Row(key, kind, default, description, None if schema == default else schema))
        out.append((prefix.rstrip("."), intro, rows))
        for hint, key, comment in nested:
            walk(hint, f"{key}.", values.get(key.rsplit(".", 1)[-1], {}), _doc(hint) or comment)

    walk(BenchConfig, "", composed, "")
    return out


def _composed() -> tuple[dict[str, Any], dict[str, Any]]:
    """`python -m cpbench`'s config with no overrides (unresolved: no environment is read), and the
    choice of each config group."""
    register()
    with initialize_config_module("cpbench.configs", version_base=None):
        cfg = compose("config", return_hydra_config=True)
    values = OmegaConf.to_container(cfg, resolve=False)
    return values, values.pop("hydra")["runtime"]["choices"]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _default(row: Row) -> str:
    schema = f" (schema: `{_cell(row.schema)}`)" if row.schema is not None else ""
    return f"`{_cell(row.default)}`{schema}"


def _leading_comment(path: Path) -> str:
    """A config file's opening comment lines, as one line: what the choice is."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def render() -> str:
    """The whole page."""
    composed, choices = _composed()
    out = [
        "# Settings reference",
        "",
        "<!-- Generated by `python -m cpbench.settings.reference` from cpbench/settings/schema.py, slurm.py",
        "and configs/: edit the comments beside the fields there, then run it again. -->",
        "",
        "Every key is a Hydra override: `python -m cpbench topology.cp=4 probe.granularity=64`. An unknown",
        "key or a value of the wrong type is refused by name before anything runs. **default** is what",
        "`python -m cpbench` gets with no override (configs/config.yaml over the structured schema); where",
        "the schema's own default differs, it follows in brackets.",
        "",
        "## Config groups",
        "",
        "| group | choice | what it is |",
        "|---|---|---|",
    ]
    for group in GROUPS:
        for name in _choices(group):
            default = " (default)" if choices.get(group) == name else ""
            description = _cell(_leading_comment(CONFIGS / group / f"{name}.yaml"))
            out.append(f"| `{group}` | `{name}`{default} | {description} |")
    out += [
        "",
        "`workload.*` keys are the workload's own sizes and knobs: see each file in configs/workload/,",
        "[fold.md](fold.md) and [pairformer.md](pairformer.md).",
    ]
    for key, intro, rows in sections(composed, choices):
        out += ["", f"## `{key}.*`" if key else "## Top level", ""]
        if intro:
            out += [_cell(intro), ""]
        out += ["| key | type | default | description |", "|---|---|---|---|"]
        out += [f"| `{r.key}` | {_cell(r.type)} | {_default(r)} | {_cell(r.description)} |" for r in rows]
    return "\n".join(out) + "\n"


def undescribed() -> list[str]:
    """Keys (and nested sections) with no description beside them in the code."""
    composed, choices = _composed()
    missing = []
    for key, intro, rows in sections(composed, choices):
        if key and not intro:
            missing.append(f"{key} (section)")
        missing += [r.key for r in rows if not r.description]
    return missing


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    target = Path(args[0]) if args else PAGE
    target.write_text(render())
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
