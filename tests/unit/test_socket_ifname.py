"""dist.socket_ifname: the network interface every rank's process groups bind to, set in each rank as
GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME before its groups start (cpbench/runtime/rank.py); a name this
machine lacks is refused in one line before any rank starts; the setting moves no key a run records by.
Two real ranks on it: tests/e2e/test_socket_ifname_ranks.py."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from support.processes import refused
from support.run_inputs import LOOPBACK
from support.settings import composed

from cpbench.core import ConfigError, Topology
from cpbench.runtime.rank import GLOO_IFNAME, NCCL_IFNAME, check_socket_ifname, rank_runtime
from cpbench.settings import identity


def test_a_name_this_machine_lacks_is_one_line_naming_those_it_has():
    check_socket_ifname(LOOPBACK)
    with pytest.raises(ConfigError) as err:
        check_socket_ifname(f"{LOOPBACK},nosuch0")
    message = str(err.value)
    assert message.startswith("dist.socket_ifname=lo,nosuch0: ") and "\n" not in message
    assert "no network interface nosuch0 (it has lo" in message


def test_a_rank_takes_it_before_its_groups_start(monkeypatch):
    """Set over what the environment held (a name gloo could not bind to): the rank's gloo group starts
    on the interface given, and NCCL gets `=` (exact names, as gloo takes them)."""
    monkeypatch.setenv(GLOO_IFNAME, "nosuch0")
    monkeypatch.setenv(NCCL_IFNAME, "nosuch0")
    with rank_runtime(Topology("1d", 1, (1, 1)), "gloo", 60, torch.float32, 0, socket_ifname=LOOPBACK):
        group = dist.new_group(backend="gloo")
        dist.all_reduce(torch.ones(1), group=group)
        assert (os.environ[GLOO_IFNAME], os.environ[NCCL_IFNAME]) == (LOOPBACK, f"={LOOPBACK}")


@pytest.mark.parametrize("value", ["=eth0", "^docker", "eth0 ", "eth0,,ib0", "a" * 16])
def test_only_exact_names_are_taken(tmp_path, value):
    proc = refused(f"dist.socket_ifname='{value}'", cwd=tmp_path)
    assert proc.returncode == 2 and "dist.socket_ifname=" in proc.stderr, proc.stderr
    assert "exact" in proc.stderr and proc.stderr.strip().count("\n") == 0


def test_a_missing_interface_is_refused_before_any_rank_starts(tmp_path):
    out = tmp_path / "out"
    proc = refused("topology.cp=2", "dist.socket_ifname=nosuch0", f"output_dir={out}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "dist.socket_ifname=nosuch0: " in proc.stderr and "has no network interface nosuch0" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and not out.exists()


def test_the_interface_moves_no_key():
    """Where the ranks meet is not what they compute: resume, the baseline cache and the references
    keep their keys (and so do runs made before the setting existed)."""
    base, given = composed(), composed("dist.socket_ifname=lo")
    assert given.dist.socket_ifname == "lo"
    for key in (identity.config_hash, identity.baseline_key, identity.curve_key):
        assert key(given) == key(base)
    assert identity.config_hash(composed("dist.timeout_s=77")) != identity.config_hash(base)
