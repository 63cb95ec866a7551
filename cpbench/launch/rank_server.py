"""The server the local ranks fork from: multiprocessing's forkserver, which has loaded the rank loop,
torch and the FLOP counter once (`rank_image`) for every rank, restart and later launch of this process
(a sweep's next job) rather than each rank loading them anew, and ends with this process. It is forked
from the launching process, which holds torch already, instead of started as a fresh interpreter that
imports it again: about 2 s of CPU less a launch (docs/architecture.md, "Start-up cost").

A fork copies a process's memory but only the thread that forks: a lock another thread held (glibc's
resolver lock, held by torch elastic's agent threads) or GNU OpenMP's thread pool (started by the first
parallel op) would be copied half, and a rank forked from that copy hangs. So the server is forked only
from a launcher that has no other thread across the fork, before the agent starts any; otherwise, and
off Linux, it starts as a fresh interpreter, as the standard library does it. Nothing of the launcher's
stays live in it: its files point at /dev/null (an inherited lock is let go, a stale file object writes
nowhere), its signal handlers are the defaults, its objects are frozen out of the garbage collector, and
it ends with `os._exit`, never unwinding into the launcher's frames.

multiprocessing has no public way to hand it a server started otherwise: `forkserver._forkserver` is the
one instance whose address `connect_to_new_process` dials (CPython 3.10-3.13, checked before use)."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import socket
import sys
import tempfile
import threading
import traceback
import warnings
from multiprocessing import connection, forkserver, resource_tracker

# The longest temporary folder the server's socket fits under (it adds 32 bytes:
# "/pymp-XXXXXXXX/listener-XXXXXXXX"); a socket's path is bounded (107 bytes on Linux).
_SOCKET_BASE_MAX = 70


def ensure_running(preload: str) -> None:
    """Start this process's rank server once (every later launch reuses it: a restart, a sweep's next
    job), with `preload` imported in it; a server that died is started again."""
    base = tempfile.gettempdir()
    tempdir, tempfile.tempdir = tempfile.tempdir, base if len(base) <= _SOCKET_BASE_MAX else "/tmp"
    try:
        if not (_forkable() and _fork_server(preload)):
            multiprocessing.set_forkserver_preload([preload])
            forkserver.ensure_running()
    finally:
        tempfile.tempdir = tempdir


def _forkable() -> bool:
    """Linux (threads are counted in /proc), a CPython whose forkserver is laid out as this module
    expects, no server started yet, and no Python thread but this one."""
    server = getattr(forkserver, "_forkserver", None)
    return (
        os.path.isdir("/proc/self/task")
        and sys.version_info < (3, 14)
        and getattr(server, "_forkserver_pid", 0) is None
        and threading.active_count() == 1
    )


def _live_threads() -> list[str]:
    """This process's threads, less those that have ended and are not yet reaped (state Z or X)."""
    live = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone since the listing
            continue
        if state not in "ZX":
            live.append(tid)
    return live


def _fork_server(preload: str) -> bool:
    """Fork the server; keep it only if no other thread was alive across the fork. Counted in this
    process right after it, so that a thread that stops itself for every fork is no hazard: OpenBLAS's
    pool (numpy's) does, through pthread_atfork, and starts again when next used."""
    resource_tracker.ensure_running()  # its descriptor is handed to every rank, as the stdlib's server does
    with socket.socket(socket.AF_UNIX) as listener:
        address = connection.arbitrary_address("AF_UNIX")
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        # Every client holds the write end of the "alive" pipe: when they are all gone the server ends.
        alive_r, alive_w = os.pipe()
        go_r, go_w = os.pipe()  # this process's verdict on the fork, to the server
        ready_r, ready_w = os.pipe()  # the server's word that it holds nothing of this process's
        with warnings.catch_warnings():  # Python 3.12+ warns of every thread; those left are judged below
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            for fd in (go_w, ready_r, alive_w):
                os.close(fd)
            if os.read(go_r, 1) == b"1":
                _serve(listener.fileno(), alive_r, ready_w, preload)
            os._exit(0)
        for fd in (go_r, ready_w, alive_r):
            os.close(fd)
        alone = len(_live_threads()) == 1
        os.write(go_w, b"1" if alone else b"0")
        os.close(go_w)
        ready = alone and os.read(ready_r, 1) == b"1"
        os.close(ready_r)
        if not ready:
            os.close(alive_w)
            os.waitpid(pid, 0)
            os.unlink(address)
            return False
    server = forkserver._forkserver
    server._forkserver_address, server._forkserver_alive_fd, server._forkserver_pid = address, alive_w, pid
    return True


def _serve(listener_fd: int, alive_r: int, ready_w: int, preload: str) -> None:
    """The forked server's whole life: it never returns into the launcher's code."""
    code = 0
    try:
        _detach(keep={listener_fd, alive_r, ready_w})
        os.write(ready_w, b"1")
        os.close(ready_w)
        gc.freeze()  # the launcher's objects: never walked by a rank's collections, never finalized there
        forkserver.main(listener_fd, alive_r, [preload])
    except SystemExit:  # the last client is gone
        pass
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


def _detach(keep: set[int]) -> None:
    """Let go of what the launcher held: every descriptor but stdio and `keep` now reads /dev/null (kept
    open under its number, so that a stale Python object never reaches a file opened later), and every
    signal handler the launcher set is the default again."""
    null = os.open(os.devnull, os.O_RDWR)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != null and fd not in keep:
            os.dup2(null, fd)  # the listing's own descriptor, closed by now, is only one more /dev/null
    os.close(null)
    for signum in signal.valid_signals():
        handler = signal.getsignal(signum)
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(signum, signal.SIG_DFL)
