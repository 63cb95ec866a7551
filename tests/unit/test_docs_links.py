"""What the user-facing docs point at exists: every markdown link resolves (a file, and its heading where
one is named), every `python -m cpbench.X` is a module that runs, every `key=value` override names a key
of the schema, a workload's own config or Hydra's (and a config group's or enum's choice where it names
one), every repository path names a file, and no page cites what a user cannot open."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import yaml
from hydra.conf import HydraConf
from hydra.core.config_store import ConfigStore
from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf, SlurmQueueConf
from omegaconf import OmegaConf

from cpbench.settings.schema import BenchConfig, DType, Mode, Workflow

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SCRIPTS = sorted((ROOT / "launch").glob("*.sh"))
# Keys shown as what cpbench refuses (an error message quoted in a page), not as overrides to use.
REFUSED_ON_PURPOSE = {"workload.nonsense", "nonsense.key"}
GROUPS = {"workload", "experiment", "hydra/launcher"}
ENUMS = {"workflow": Workflow, "mode": Mode, "dtype": DType}

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
MODULE = re.compile(r"python3? -m (cpbench(?:\.\w+)*)")
# A command: cpbench's entry point (also under torchrun), or one of launch/'s scripts.
COMMAND = re.compile(r"-m cpbench\b|\blaunch/\w+\.sh\b")
OVERRIDE = re.compile(r"""(?:^|(?<=[\s"'`(\[]))([+~]{0,2}[a-z_]\w*(?:[./]\w+)*)=(?!=)([^\s`]*)""")
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:\.ci|benchmarks|configs|cpbench|docs|examples|launch|tests)/[\w./-]*\w)"
)
WEB_LINK = re.compile(r"\[[^\]]*\]\([a-z]+:[^)]*\)")
UNOPENABLE = re.compile(r"DESIGN\.md|\bissues? #?\d+|\b(?:numbers|README|the)\s+issue\b", re.IGNORECASE)
CODE_SPAN = re.compile(r"`([^`]+)`")


def _code_lines(page: Path) -> list[tuple[int, str, bool]]:
    """(line number, text, whether the whole line is code: a fenced or indented block, or a script)."""
    out, fenced = [], False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        code = fenced or page.suffix == ".sh" or line.startswith("    ")
        out.append((number, line, code))
    return out


def _headings(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    slugs = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            slugs.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return slugs


def _structured_keys(node, prefix: str) -> set[str]:
    keys = set()
    for key in node:
        child = node._get_node(key)
        keys.add(f"{prefix}{key}")
        if OmegaConf.is_dict(child):
            keys |= _structured_keys(child, f"{prefix}{key}.")
    return keys


def _yaml_keys(mapping: dict, prefix: str) -> set[str]:
    keys = set()
    for key, value in mapping.items():
        keys.add(f"{prefix}{key}")
        if isinstance(value, dict):
            keys |= _yaml_keys(value, f"{prefix}{key}.")
    return keys


@cache
def _keys() -> frozenset[str]:
    """Every key an override may name."""
    keys = _structured_keys(OmegaConf.structured(BenchConfig), "")
    for path in (CONFIGS / "workload").glob("*.yaml"):
        keys |= _yaml_keys(yaml.safe_load(path.read_text()) or {}, "workload.")
    keys |= _structured_keys(OmegaConf.structured(HydraConf), "hydra.")
    for conf in (SlurmQueueConf, LocalQueueConf):
        keys |= _structured_keys(OmegaConf.structured(conf), "hydra.launcher.")
    return frozenset(keys | GROUPS)


OPEN = ("workload.options.", "slurm.additional_parameters.", "hydra.launcher.additional_parameters.")


def _choices(group: str) -> set[str]:
    choices = {p.stem for p in (CONFIGS / group).glob("*.yaml")} | {"null"}
    if group == "hydra/launcher":  # hydra-submitit-launcher's own, and Hydra's default
        choices |= {name.removesuffix(".yaml") for name in ConfigStore.instance().list(group)} | {"basic"}
    return choices


def _problem(key: str, value: str, command: str) -> str | None:
    """What is wrong with one override, or None."""
    key = key.lstrip("+~")
    if key in REFUSED_ON_PURPOSE:
        return None
    if key not in _keys() and not key.startswith(OPEN):
        return f"{key}: no such key"
    value = re.sub(r"'s$", "", value).strip("'\".,;:)]")
    if not value or re.search(r"[<>$*{]|\.\.\.", value):
        return None  # a placeholder or a shell variable
    if key in GROUPS and not (key == "experiment" and "hydra.searchpath" in command):
        bad = [v for v in value.split(",") if v not in _choices(key)]
        return f"{key}={value}: no such choice {bad}" if bad else None
    if key in ENUMS:
        bad = [v for v in value.split(",") if v not in {m.value for m in ENUMS[key]}]
        return f"{key}={value}: not one of {[m.value for m in ENUMS[key]]}" if bad else None
    return None


def _commands(line: str, code: bool) -> list[str]:
    """The commands on a line, each from its program on (not the shell variables set before it) to a
    shell comment: in the whole line where it is code, else in each code span."""
    spans = [line] if code else CODE_SPAN.findall(line)
    return [span[m.start() :].split(" #")[0] for span in spans if (m := COMMAND.search(span))]


def _where(path: Path, number: int) -> str:
    return f"{path.relative_to(ROOT)}:{number}"


def test_every_link_resolves():
    broken = []
    for page in PAGES:
        for number, line, code in _code_lines(page):
            for target in [] if code else LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue  # a web address: not fetched here
                file, _, anchor = target.partition("#")
                resolved = (page.parent / file).resolve() if file else page
                if not resolved.exists():
                    broken.append(f"{_where(page, number)}: {target}")
                elif anchor and resolved.suffix == ".md" and anchor not in _headings(resolved):
                    broken.append(f"{_where(page, number)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_python_m_module_runs():
    missing = []
    for page in [*PAGES, *SCRIPTS]:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for module in MODULE.findall(line):
                path = ROOT / module.replace(".", "/")
                if not (path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()):
                    missing.append(f"{_where(page, number)}: python -m {module}")
    assert not missing, "\n".join(missing)


def test_every_override_names_a_real_key():
    """In commands every `key=value`; in prose the ones that are plainly cpbench's (dotted, or a
    top-level key): `cp=2` in a sentence is a figure's label, not an override."""
    top = {key for key in _keys() if "." not in key}
    wrong = []
    for page in [*PAGES, *SCRIPTS]:
        for number, line, code in _code_lines(page):
            commands = _commands(line, code)
            checked = [(k, v, c) for c in commands for k, v in OVERRIDE.findall(c)]
            rest = line
            for command in commands:
                rest = rest.replace(command, " ")
            checked += [
                (k, v, "")
                for k, v in OVERRIDE.findall(rest)
                if re.search(r"[./]", k) or k.lstrip("+~") in top
            ]
            wrong += [f"{_where(page, number)}: {p}" for k, v, c in checked if (p := _problem(k, v, c))]
    assert not wrong, "\n".join(wrong)


def test_every_repository_path_exists():
    missing = []
    for page in [*PAGES, *SCRIPTS]:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            paths = REPO_PATH.findall(WEB_LINK.sub(" ", line))  # a link's text to the web names the web's
            missing += [f"{_where(page, number)}: {p}" for p in paths if not (ROOT / p).exists()]
    assert not missing, "\n".join(missing)


def test_no_page_cites_what_a_user_cannot_open():
    cited = []
    for page in [*PAGES, *SCRIPTS]:
        text = page.read_text()  # whole: a phrase may break across lines
        for m in UNOPENABLE.finditer(text):
            cited.append(
                f"{_where(page, text.count(chr(10), 0, m.start()) + 1)}: {' '.join(m.group().split())}"
            )
    assert not cited, "\n".join(cited)


def test_the_checks_catch_what_they_are_for():
    """The rules above, against lines that break them."""
    assert _problem("topology.cpp", "4", "") == "topology.cpp: no such key"
    assert _problem("workload", "folded", "") is not None
    assert _problem("dtype", "bf16", "") is not None
    assert _problem("hydra/launcher", "cpbench_slurm", "") is None
    assert _problem("+slurm.additional_parameters.exclusive", "true", "") is None
    assert _problem("workload.sampling.steps", "2", "") is None
    assert _commands(
        "at cp=2, `CUDA_VISIBLE_DEVICES=0 python -m cpbench topology.cp=2` runs", code=False
    ) == ["-m cpbench topology.cp=2"]
    assert UNOPENABLE.search("as issue 28 found") and UNOPENABLE.search("see DESIGN.md")
    assert UNOPENABLE.search("as the\nissue measured") and not UNOPENABLE.search("every rank issues the same")
