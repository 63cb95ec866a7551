"""Who holds the peak at each edge the probe found, for the readout: a fake-tensor trace at the
max-fit N, written into that row's `peak_holder`. The launching process makes it once the ranks are
done: a rank's own process group would clash with the trace's fake one."""

from __future__ import annotations

import sys

from hydra.utils import instantiate

from cpbench.app.traces import holders_at
from cpbench.core import Topology
from cpbench.results.folder import RunFolder
from cpbench.settings.identity import config_hash
from cpbench.settings.schema import BenchConfig
from cpbench.workloads.base import Workload

_BUILT_IN = "cpbench.workloads."
_USERS = ("cpbench.workloads.adapter",)  # a user's model behind cpbench's adapter: not ours to trace


def record_peak_holders(
    folder: RunFolder, settings: BenchConfig, topology: Topology, workload: Workload | None = None
) -> None:
    """Fill the run's max-fit row with who holds the peak there (built-in workloads only). It labels
    a run that is done: whatever stops the trace leaves the label blank, with one line, never the run
    failed."""
    target = str(settings.workload.get("_target_", ""))
    if not target.startswith(_BUILT_IN) or target.startswith(_USERS):
        return
    frame = folder.read_results()
    if frame.empty or "config_hash" not in frame.columns:
        return
    edge = (frame["kind"] == "max-fit") & (frame["status"] == "ok")
    edge &= frame["config_hash"] == config_hash(settings)
    if "source" in frame.columns:
        edge &= frame["source"].fillna("") == ""
    if not edge.any():
        return
    n = int(frame.loc[edge, "N_tokens"].max())
    try:
        held = holders_at(settings, workload or instantiate(settings.workload), topology, n)
    except Exception as err:  # noqa: BLE001 - a label, not the run
        why = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        print(f"cpbench: who holds the peak at N={n} is not known ({why})", file=sys.stderr)
        return
    total = sum(size for _, size in held) or 1
    text = ", ".join(f"{name} {size / total:.0%}" for name, size in held[:2])
    folder.set_column(edge & (frame["N_tokens"] == n), "peak_holder", text)
