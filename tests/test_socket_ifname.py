"""dist.socket_ifname: the network interface every rank's process groups bind to, set in each rank as
GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME before its groups start (cpbench/runtime/rank.py); a name this
machine lacks is refused in one line before any rank starts; the setting moves no key a run records by."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch
import torch.distributed as dist
from conftest import FAST, cpbench, ok, refused, results
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from cpbench.core import ConfigError, Topology
from cpbench.runtime.rank import GLOO_IFNAME, NCCL_IFNAME, check_socket_ifname, rank_runtime
from cpbench.settings import identity
from cpbench.settings.schema import BenchConfig, register

LOOPBACK = next(name for _, name in socket.if_nameindex() if name == "lo")


def settings(*overrides: str) -> BenchConfig:
    register()
    with initialize_config_module("cpbench.configs", version_base="1.3"):
        return OmegaConf.to_object(compose("config", ["output_dir=out", *overrides]))


@pytest.mark.unit
def test_a_name_this_machine_lacks_is_one_line_naming_those_it_has():
    check_socket_ifname(LOOPBACK)
    with pytest.raises(ConfigError) as err:
        check_socket_ifname(f"{LOOPBACK},nosuch0")
    message = str(err.value)
    assert message.startswith("dist.socket_ifname=lo,nosuch0: ") and "\n" not in message
    assert "no network interface nosuch0 (it has lo" in message


@pytest.mark.unit
def test_a_rank_takes_it_before_its_groups_start(monkeypatch):
    """Set over what the environment held (a name gloo could not bind to): the rank's gloo group starts
    on the interface given, and NCCL gets `=` (exact names, as gloo takes them)."""
    monkeypatch.setenv(GLOO_IFNAME, "nosuch0")
    monkeypatch.setenv(NCCL_IFNAME, "nosuch0")
    with rank_runtime(Topology("1d", 1, (1, 1)), "gloo", 60, torch.float32, 0, socket_ifname=LOOPBACK):
        group = dist.new_group(backend="gloo")
        dist.all_reduce(torch.ones(1), group=group)
        assert (os.environ[GLOO_IFNAME], os.environ[NCCL_IFNAME]) == (LOOPBACK, f"={LOOPBACK}")


@pytest.mark.unit
@pytest.mark.parametrize("value", ["=eth0", "^docker", "eth0 ", "eth0,,ib0", "a" * 16])
def test_only_exact_names_are_taken(tmp_path, value):
    proc = refused(f"dist.socket_ifname='{value}'", cwd=tmp_path)
    assert proc.returncode == 2 and "dist.socket_ifname=" in proc.stderr, proc.stderr
    assert "exact" in proc.stderr and proc.stderr.strip().count("\n") == 0


@pytest.mark.unit
def test_a_missing_interface_is_refused_before_any_rank_starts(tmp_path):
    out = tmp_path / "out"
    proc = refused("topology.cp=2", "dist.socket_ifname=nosuch0", f"output_dir={out}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "dist.socket_ifname=nosuch0: " in proc.stderr and "has no network interface nosuch0" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and not out.exists()


@pytest.mark.unit
def test_the_interface_moves_no_key():
    """Where the ranks meet is not what they compute: resume, the baseline cache and the references
    keep their keys (and so do runs made before the setting existed)."""
    base, given = settings(), settings("dist.socket_ifname=lo")
    assert given.dist.socket_ifname == "lo"
    for key in (identity.config_hash, identity.baseline_key, identity.curve_key):
        assert key(given) == key(base)
    assert identity.config_hash(settings("dist.timeout_s=77")) != identity.config_hash(base)


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
