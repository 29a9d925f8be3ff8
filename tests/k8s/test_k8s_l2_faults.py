"""What an unhealthy L2 may cost (issue 15 item 3): Curvine's client timeouts on the StorageClass,
LMCache's lookup and blocking timeouts in the pods' env, and the bound they give.

The bound itself is measured with the real LMCache and a FUSE mount that fails on command by
``make test-faults`` (tests_faults/); here: that the rendered manifests carry the settings, and that
the bound of one FUSE operation follows from Curvine's retry logic (docs/sources.md §18).
"""

from __future__ import annotations

import itertools

import pytest

from k8s.curvine_config import (
    CURVINE_DEFAULT_CLIENT_TIMEOUTS, FUSE_CLIENT_TIMEOUTS, ClientTimeouts, fuse_master_op_bound_ms,
)
from k8s.lmcache import l2_fault_timeouts, lmcache_env
from tests.k8s.conftest import find

#: The ``#[client_cli]`` fields of ``ClientConf`` that are retry or timeout settings, at Curvine
#: v0.3.2-alpha (curvine-common/src/conf/client_conf.rs lines 125-151): each is the curvine-fuse flag
#: ``--client.<field, '_' as '-'>`` (``cli_long_name``, curvine-common/macros/src/client_cli.rs lines
#: 321-354). ``pipeline_timeout_ms`` carries no ``#[client_cli]`` and so is no flag.
V032_CLIENT_TIMEOUT_FLAGS = {
    "--client.conn-retry-max-duration-ms", "--client.conn-retry-min-sleep-ms", "--client.conn-retry-max-sleep-ms",
    "--client.rpc-retry-max-duration-ms", "--client.rpc-retry-min-sleep-ms", "--client.rpc-retry-max-sleep-ms",
    "--client.conn-timeout-ms", "--client.rpc-timeout-ms", "--client.data-timeout-ms",
}


def test_storage_class_carries_the_client_timeouts(manifests):
    """The CSI passes every non-reserved parameter ``k`` to curvine-fuse as ``--k <value>``
    (curvine-csi pkg/csi/fuse_cli.go ``CollectPassthroughParams``, ``appendPassthroughArgs``)."""
    params = find(manifests["curvine"], "StorageClass", "curvine-sc")["parameters"]
    client = {k: v for k, v in params.items() if k.startswith("client.") and k != "client.audit-logging-enabled"}
    assert client == {
        "client.conn-timeout-ms": "250",
        "client.rpc-timeout-ms": "1000",
        "client.data-timeout-ms": "1000",
        "client.rpc-retry-max-duration-ms": "500",
        "client.rpc-retry-min-sleep-ms": "50",
        "client.rpc-retry-max-sleep-ms": "200",
        "client.conn-retry-max-duration-ms": "500",
    }
    assert {f"--{k}" for k in client} <= V032_CLIENT_TIMEOUT_FLAGS
    assert not any("ttl" in k for k in params)  # still no TTL anywhere (docs/l2-cache.md, "No TTL inside Curvine")


def _rpc_duration(t: ClientTimeouts, attempts: list[int]) -> int:
    """ms that orpc's ``ClusterConnector::rpc`` takes when its attempts take ``attempts`` ms each
    (the leader attempt first), transcribed from v0.3.2-alpha: ``orpc/src/client/cluster_connector.rs``
    (leader once, then ``while policy.attempt()``) and ``orpc/src/io/retry/time_bounded_retry.rs``
    (``attempt``: the first is free; later ones return false once the window has passed, else sleep
    ``min_sleep``, then twice the last sleep up to ``max_sleep``, cut at the window's end)."""
    now, durations = attempts[0], iter(attempts[1:])
    end, count, next_sleep = now + t.rpc_retry_max_duration_ms, 0, t.rpc_retry_min_sleep_ms
    while True:
        if count:
            if now >= end:
                return now
            wait = next_sleep if count == 1 else min(next_sleep * 2, t.rpc_retry_max_sleep_ms)
            wait = min(wait, end - now)
            now, next_sleep = now + wait, wait
        count += 1
        now += next(durations, 0)


@pytest.mark.parametrize("timeouts", [FUSE_CLIENT_TIMEOUTS, CURVINE_DEFAULT_CLIENT_TIMEOUTS])
def test_the_operation_bound_is_the_longest_retry_sequence(timeouts: ClientTimeouts):
    """Every attempt takes between 0 (refused) and connect + request timeout (a hung Primary); the
    longest sequence is a slow leader attempt, fast failures through the whole window, and a slow
    last attempt started as the window closes: what ``master_op_bound_ms`` says."""
    slow = timeouts.conn_timeout_ms + timeouts.rpc_timeout_ms
    worst = 0
    for pattern in itertools.product((0, slow), repeat=6):
        worst = max(worst, _rpc_duration(timeouts, list(pattern)))
    # The worst pattern: slow, then failures at once until the window closes, then slow again.
    fast_then_slow = [slow] + [0] * 200
    n_fast = 1
    while _rpc_duration(timeouts, [slow] + [0] * n_fast + [slow]) < timeouts.master_op_bound_ms():
        n_fast += 1
        assert n_fast < 200
    assert worst <= timeouts.master_op_bound_ms()
    assert _rpc_duration(timeouts, [slow] + [0] * n_fast + [slow]) == timeouts.master_op_bound_ms()
    # A Primary that refuses every connection costs about the retry window.
    assert _rpc_duration(timeouts, fast_then_slow[:1] + [0] * 200) - slow == timeouts.rpc_retry_max_duration_ms


def test_the_bounds_in_ms():
    """Curvine's defaults wait up to 420 s for an absent Primary per operation (issue 15: "up to
    120 s" of retries alone); the FUSE pods' settings 3 s, the hang the fault tier models."""
    assert CURVINE_DEFAULT_CLIENT_TIMEOUTS.master_op_bound_ms() == 150_000 + 120_000 + 150_000
    assert fuse_master_op_bound_ms() == 1_250 + 500 + 1_250 == 3_000


def test_every_l2_pod_gets_the_lookup_and_blocking_timeouts(k8s_project):
    for line in k8s_project.business_lines:
        if not line.cache.l2_enabled:
            continue
        env = lmcache_env(k8s_project.platform, line, tmp_dir_token="x", remote_url="fs://localhost:0/mnt/x/")
        assert env["LMCACHE_LOOKUP_TIMEOUT_MS"] == "200" and env["LMCACHE_BLOCKING_TIMEOUT_SECS"] == "1"
        # The steady cost of an unhealthy L2 fits every L2 line's TTFT SLO (the loader refuses less).
        assert l2_fault_timeouts(k8s_project.platform)["lookup_timeout_ms"] < line.slo.ttft_p90_ms
