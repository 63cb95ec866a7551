"""Two ranks run on dist.socket_ifname=lo and see it."""

from __future__ import annotations

import json

from support.processes import FAST, cpbench, ok, results
from support.run_inputs import LOOPBACK

from cpbench.runtime.rank import GLOO_IFNAME, NCCL_IFNAME


def test_two_ranks_run_on_it_and_see_it(tmp_path):
    """A real cp=2 run with the launching environment holding names gloo cannot bind to: each rank
    sees the setting's instead (the run would fail at its first group otherwise)."""
    out, report = tmp_path / "out", tmp_path / "seen"
    report.mkdir()
    bogus = {GLOO_IFNAME: "nosuch0", NCCL_IFNAME: "nosuch0"}
    adapter = ["workload=adapter", "workload.module=adapters.sockets_seen", "workload.contract=native",
               f"workload.options={{report_dir: {report}}}"]  # fmt: skip
    ok(cpbench(*adapter, "topology.cp=2", f"dist.socket_ifname={LOOPBACK}", "sweep.n_tokens=[8]", *FAST,
               f"output_dir={out}", cwd=tmp_path, env=bogus))  # fmt: skip
    assert list(results(out)["status"]) == ["ok"]
    for rank in (0, 1):
        seen = json.loads((report / f"rank{rank}.json").read_text())
        assert seen == {GLOO_IFNAME: LOOPBACK, NCCL_IFNAME: f"={LOOPBACK}"}
