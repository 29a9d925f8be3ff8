"""Fixtures of the fault tier (``make test-faults``): the exported env, the rig, the results of
every fault, and the table printed at the end of the run (``pytest_terminal_summary``)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests_faults import bench, harness
from tests_lmcache.conftest import export_env

#: What the summary prints, filled by the fixtures below.
_REPORT: dict[str, Any] = {}


def pytest_configure(config: pytest.Config) -> None:
    if not os.path.exists("/dev/fuse"):
        raise pytest.UsageError("the fault tier needs /dev/fuse (run as root on a machine with FUSE: make test-faults)")


@pytest.fixture(scope="session")
def exported(tmp_path_factory) -> dict[str, Any]:
    return export_env(tmp_path_factory.mktemp("export") / "env.json")


@pytest.fixture(scope="module")
def rig(exported, tmp_path_factory):
    started = harness.start_rig(exported, tmp_path_factory.mktemp("rig"))
    yield started
    started.stop()


@pytest.fixture(scope="module")
def results(rig, tmp_path_factory) -> dict[str, harness.FaultResult]:
    """Every fault of :data:`tests_faults.harness.FAULTS`, in order, on the one rig."""
    done = [harness.run_fault(rig, mode, k) for k, mode in enumerate(harness.FAULTS)]
    harness.dump(done, tmp_path_factory.mktemp("results") / "faults.json")
    _REPORT["table"] = harness.table(done, {"lookup_timeout_ms": rig.lookup_timeout_ms,
                                            "blocking_timeout_s": rig.blocking_timeout_s, "hang_ms": rig.hang_ms})
    return {r.mode: r for r in done}


@pytest.fixture(scope="session")
def throughput(exported, tmp_path_factory) -> dict[str, dict[str, list[float]]]:
    figures = bench.measure(exported, tmp_path_factory.mktemp("bench"))
    _REPORT["throughput"] = bench.report(figures)
    return figures


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    for key, title in (("table", "L2 faults: real LMCache pods, the janitor and the mount watchdog on a failing FUSE mount"),
                       ("throughput", "Throughput through the FUSE layer")):
        if key in _REPORT:
            terminalreporter.write_sep("=", title)
            terminalreporter.write_line(_REPORT[key])
