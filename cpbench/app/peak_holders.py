"""Who holds the peak at each edge the probe found, for the readout: a fake-tensor trace at the
max-fit N, written into that row's `peak_holder`. The launching process makes it once the ranks are
done: a rank's own process group would clash with the trace's fake one."""

from __future__ import annotations

from hydra.utils import instantiate

from cpbench.core import Topology
from cpbench.probe.predict import CannotTrace, holders_at
from cpbench.results.folder import RunFolder
from cpbench.settings.identity import config_hash
from cpbench.settings.schema import BenchConfig
from cpbench.workloads.base import Workload

_BUILT_IN = "cpbench.workloads."
_USERS = ("cpbench.workloads.adapter",)  # a user's model behind cpbench's adapter: not ours to trace


def record_peak_holders(
    folder: RunFolder, settings: BenchConfig, topology: Topology, workload: Workload | None = None
) -> None:
    """Fill the run's max-fit row with who holds the peak there (built-in workloads only; a trace
    that cannot run leaves it blank)."""
    workload = workload or instantiate(settings.workload)
    module = type(workload).__module__
    if not module.startswith(_BUILT_IN) or module.startswith(_USERS):
        return
    frame = folder.read_results()
    if frame.empty:
        return
    edge = (frame["kind"] == "max-fit") & (frame["status"] == "ok")
    edge &= (frame["config_hash"] == config_hash(settings)) & (frame["source"].fillna("") == "")
    if not edge.any():
        return
    n = int(frame.loc[edge, "N_tokens"].max())
    try:
        held = holders_at(settings, workload, topology, n)
    except CannotTrace:
        return
    total = sum(size for _, size in held) or 1
    text = ", ".join(f"{name} {size / total:.0%}" for name, size in held[:2])
    folder.set_column(edge & (frame["N_tokens"] == n), "peak_holder", text)
