"""Several runs of one configuration read as one: each point's step, comm time and per-op collective
seconds are their medians over the runs that measured the point. A machine whose speed drifts over
minutes (a shared or virtual one: here the same point measured 25 % apart in runs two hours apart,
docs/predict.md) makes any two runs taken at different times differ by the drift; runs taken in
turn and pooled show its typical speed."""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from cpbench.core import ConfigError
from cpbench.results.folder import RunFolder
from cpbench.results.row import row_key

POOLED = ("walltime_ms", "comm_ms")  # a point's figures that take the median over the runs
RUNS = "runs"  # the column of a pooled row that says over how many runs
SPREAD = "walltime_spread"  # and how far apart their steps were: (max - min) / median


def run_folders(key: str, where: str, also: Sequence[Path | str] = ()) -> list[RunFolder]:
    """The runs `where` names, a run's output_dir or a glob pattern of several, after the folders
    `also` (each once); an error naming the setting `key` when none holds a results.csv."""
    matched = sorted(glob.glob(where)) if glob.has_magic(where) else [where]
    paths = dict.fromkeys(Path(p).resolve() for p in [*also, *matched])
    folders = [RunFolder(p) for p in paths if RunFolder(p).results.exists()]
    if len(folders) == len(also):
        raise ConfigError(
            f"{key}={where}: no results.csv there (a run's output_dir, or a glob pattern of several)"
        )
    return folders


def _medians(frame: pd.DataFrame, keys: pd.Series, columns: Sequence[str]) -> pd.DataFrame:
    """One row per key, the first; `columns` its medians over the rows of that key, `runs` their
    count."""
    by = frame.assign(_key=keys).groupby("_key", sort=False)
    pooled = by.head(1).set_index("_key")
    for column in columns:
        pooled[column] = by[column].median()
    pooled[RUNS] = by.size()
    return pooled.reset_index(drop=True)


def _point_keys(frame: pd.DataFrame) -> pd.Series:
    """Which configuration, CP layout and point each row is (a CP run's cp=1 baseline rows carry its
    config hash): rows with equal keys in two runs measured the same."""
    layout = frame[["config_hash", "topology", "cp", "grid"]].astype(str).agg("|".join, axis=1)
    return layout + "|" + frame.apply(row_key, axis=1)


def pooled_results(folders: Sequence[RunFolder]) -> pd.DataFrame:
    """The points measured ok, one row each: the first run's row, its step and comm time the
    medians over the runs, `runs` how many they were and `walltime_spread` how far apart."""
    frames = [frame for frame in (f.read_results() for f in folders) if not frame.empty]
    if not frames:
        return pd.DataFrame()
    rows = pd.concat(frames, ignore_index=True)
    rows = rows[(rows["status"] == "ok") & (rows["kind"] == "point")]
    if rows.empty:
        return pd.DataFrame()
    keys = _point_keys(rows)
    steps = rows.groupby(keys, sort=False)["walltime_ms"]
    spread = (steps.max() - steps.min()) / steps.median()
    return _medians(rows, keys, POOLED).assign(**{SPREAD: spread.to_numpy()})


def pooled_comm_ops(folders: Sequence[RunFolder]) -> pd.DataFrame:
    """Each point's collectives per op label, their seconds the median over the runs (calls and
    bytes are the configuration's, equal in every run)."""
    frames = [pd.read_csv(f.comm_ops) for f in folders if f.comm_ops.exists()]
    if not frames:
        return pd.DataFrame()
    ops = pd.concat(frames, ignore_index=True)
    return _medians(ops, _point_keys(ops) + "|" + ops["op"].astype(str), ["seconds"])
