"""A peer's error file cut short by the kill does not hide the root cause."""

from __future__ import annotations


def test_a_peer_error_file_cut_short_by_the_kill_does_not_hide_the_root_cause(tmp_path):
    """The agent kills the other ranks as soon as one fails: a peer may leave its error file empty."""
    import json

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from cpbench.launch.local import _failure

    attempt = tmp_path / "attempt_0"
    for rank in (0, 1):
        (attempt / str(rank)).mkdir(parents=True)
    first = attempt / "0" / "error.json"
    message = {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": "x\ny", "timestamp": "0"}}
    first.write_text(json.dumps({"message": message}))
    (attempt / "1" / "error.json").write_text("")
    err = ChildFailedError("rank", {0: ProcessFailure(0, 1, 1, str(first))})
    failure = _failure(err)
    assert (failure.rank, failure.reason, failure.crashed) == (0, "RuntimeError: boom", False)
