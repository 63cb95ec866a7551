"""`python -m cpbench.check`'s rules on rows made in the test: repeats, a baseline row, a repeated point."""

from __future__ import annotations

import pandas as pd

from cpbench.checks.compliance import Results, RunUnderCheck, rule_repeats, rule_same_answer


def test_the_repeats_rule_alone_sees_repeats():
    def run(repeats: int) -> RunUnderCheck:
        row = {"kind": "point", "status": "ok", "N_tokens": 16, "warmup": 1, "repeats": repeats}
        return RunUnderCheck("r", pd.DataFrame([row]), {}, None)

    assert rule_repeats(Results([run(3)])).status == "pass"
    assert rule_repeats(Results([run(2)])).status == "fail"
    assert rule_repeats(Results([])).status == "n/a"


def test_a_baseline_row_is_not_a_repeat_of_the_cp_row():
    """A run's cp=1 baseline rows carry its config hash; the same N at cp=2 sums in another order."""
    run = pd.concat([_run("r", 1176.8678, cp=1).frame, _run("r", 1176.8694, cp=2).frame])
    assert rule_same_answer(Results([RunUnderCheck("r", run, {}, None)])).status == "n/a"


def _run(name: str, checksum: float, cp: int = 2) -> RunUnderCheck:
    row = {"kind": "point", "status": "ok", "config_hash": "abc", "topology": "1d", "cp": cp, "N_tokens": 16,
           "N_atoms": 144, "MSA_depth": 16, "checksum": checksum}  # fmt: skip
    return RunUnderCheck(name, pd.DataFrame([row]), {}, None)


def test_a_repeated_point_must_give_the_same_answer():
    assert rule_same_answer(Results([_run("a", 1.25)])).status == "n/a"
    assert rule_same_answer(Results([_run("a", 1.25), _run("b", 1.25)])).status == "pass"
    differ = rule_same_answer(Results([_run("a", 1.25), _run("b", 1.5)]))
    assert differ.status == "fail" and "checksums differ: N=16 (a, b)" in differ.detail
