"""Nothing left behind, checked: the working directory's files (outside the run's folder) and, inside a
git checkout, `git status`, taken before a run and compared after it."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cpbench.record.run_record import Footprint

# Python's own bytecode cache (an imported adapter module's) and git's internals are not the run's writes.
_SKIP = {"__pycache__", ".git"}


def _files(cwd: Path, exclude: tuple[Path, ...]) -> dict[str, tuple[int, int]]:
    """Every file under `cwd` but those under `exclude`: relative path -> (size, mtime in ns)."""
    found = {}
    for root, dirs, files in os.walk(cwd):
        here = Path(root)
        dirs[:] = [d for d in dirs if d not in _SKIP and here / d not in exclude]
        for name in files:
            path = here / name
            try:
                stat = path.lstat()
            except OSError:  # gone between listing and stat
                continue
            found[str(path.relative_to(cwd))] = (stat.st_size, stat.st_mtime_ns)
    return found


def _git_root(cwd: Path) -> Path | None:
    """The top of the git work tree `cwd` is in; None outside one (or without git)."""
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=cwd, capture_output=True, text=True,
                             timeout=30)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(top.stdout.strip()).resolve() if top.returncode == 0 and top.stdout.strip() else None


def _git_status(cwd: Path) -> list[str] | None:
    """`git status --porcelain` lines (paths from the top of the work tree)."""
    try:
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=cwd,
                                capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return status.stdout.splitlines()


@dataclass
class Snapshot:
    cwd: Path
    exclude: tuple[Path, ...]
    files: dict[str, tuple[int, int]]
    git_root: Path | None
    git: list[str] | None

    @classmethod
    def take(cls, cwd: Path, exclude: tuple[Path, ...]) -> Snapshot:
        """Before the run: `exclude` holds the folders it may write (its output_dir)."""
        cwd, exclude = cwd.resolve(), tuple(p.resolve() for p in exclude)
        root = _git_root(cwd)
        return cls(cwd, exclude, _files(cwd, exclude), root, _git_status(cwd) if root else None)

    def _outside(self, line: str) -> bool:
        """A `git status` line about a path outside the excluded folders (`XY path`)."""
        path = (self.git_root / line[3:].strip('"').split(" -> ")[-1]).resolve()
        return not any(path == e or e in path.parents for e in self.exclude)

    def compare(self) -> Footprint:
        """What changed since the snapshot: `left` lists each finding (empty: nothing), `line` says it."""
        now = _files(self.cwd, self.exclude)
        left = [f"{p} (new)" for p in sorted(set(now) - set(self.files))]
        left += [f"{p} (changed)" for p in sorted(set(now) & set(self.files)) if now[p] != self.files[p]]
        left += [f"{p} (removed)" for p in sorted(set(self.files) - set(now))]
        git_now = _git_status(self.cwd) if self.git is not None else None
        if git_now is not None:
            before = {line for line in self.git if self._outside(line)}
            after = {line for line in git_now if self._outside(line)}
            left += [f"git status: +{line}" for line in sorted(after - before)]
            left += [f"git status: -{line}" for line in sorted(before - after)]
        where = f"the working directory {self.cwd}"
        if left:
            line = f"written outside output_dir in {where}: " + "; ".join(left)
        else:
            git = ", and git status is unchanged" if git_now is not None else " (not a git checkout)"
            line = f"nothing written outside output_dir in {where}{git}"
        return Footprint(tuple(left), line)
