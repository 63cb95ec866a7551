"""The server the local ranks fork from (cpbench/launch/rank_server.py): forked from a launching process
of one thread, started afresh from any other; either way a rank computes on threads of its own and the
launcher's files stay its own."""

from __future__ import annotations

import json
import sys

import pytest
from support.processes import run_cmd

# A launching process in three states, then a rank from its server that computes on two threads (GNU
# OpenMP hangs one forked from a parent whose thread pool had started). The rank reports where it came
# from: the launcher's own command line for a forked server, the standard library's for a fresh one.
LAUNCHER = """
import fcntl, json, multiprocessing, os, sys, threading
import torch
from cpbench.launch import rank_server

def rank(queue):
    torch.set_num_threads(2)
    x = torch.randn(1000, 1000)
    total = float((x @ x).exp().sum())
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as cmdline:
        queue.put((total, cmdline.read().decode().split("\\0")))

if __name__ == "__main__":
    state = sys.argv[1]
    lock = open("held.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    if state == "a thread":
        threading.Thread(target=threading.Event().wait, daemon=True).start()
    if state == "computed":
        torch.set_num_threads(2)
        x = torch.randn(1000, 1000)
        (x @ x).exp().sum()
    rank_server.ensure_running("cpbench.launch.rank_image")
    lock.close()
    with open("held.lock", "w") as again:  # the server holds nothing of the launcher's
        fcntl.flock(again, fcntl.LOCK_EX | fcntl.LOCK_NB)
    context = multiprocessing.get_context("forkserver")
    queue = context.Queue()
    child = context.Process(target=rank, args=(queue,))
    child.start()
    total, server = queue.get(timeout=60)
    child.join(60)
    print(json.dumps({"exit": child.exitcode, "forked": sys.argv[0] in server}))
"""


@pytest.mark.parametrize(
    ("state", "forked"),
    [("alone", True), ("a thread", False), ("computed", False)],
)
def test_the_rank_server_is_forked_only_from_a_launcher_of_one_thread(tmp_path, state, forked):
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    proc = run_cmd([sys.executable, str(script), state], tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"exit": 0, "forked": forked}, proc.stderr
