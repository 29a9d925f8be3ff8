"""The L2 gate's connector class in the real vLLM 0.29.0 and LMCache 0.5.5 (no server; the serving tier's venv).

``vllm_plugins/l2_gate.py`` is loaded the way a pod loads it: the file copied under its ConfigMap
name ``kvcache_l2_gate.py`` into a directory on ``sys.path``, then found by vLLM's own
``KVConnectorFactory.get_connector_class`` from the ``--kv-transfer-config`` the wiring renders.
The scheduler-side methods are then driven on an instance whose LMCache implementation is a stand-in
recording its calls (a real one needs a running worker); the metadata it returns is built from
LMCache's own ``LMCacheConnectorMetadata`` / ``ReqMeta`` / ``SaveSpec`` classes, so the save
suppression is held against the released types. The full path, with a server and a hanging mount,
is tests_serving/test_hung_l2.py.
"""

from __future__ import annotations

import importlib
import shutil
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytest.importorskip("lmcache")

REPO = Path(__file__).resolve().parents[1]
MODULE = "kvcache_l2_gate"


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory):
    """The module as a pod imports it: ``kvcache_l2_gate`` from a directory on the path."""
    where = tmp_path_factory.mktemp("configmap")
    shutil.copy(REPO / "vllm_plugins" / "l2_gate.py", where / f"{MODULE}.py")
    sys.path.insert(0, str(where))
    try:
        yield importlib.import_module(MODULE)
    finally:
        sys.path.remove(str(where))
        sys.modules.pop(MODULE, None)


def test_vllm_finds_the_class_by_the_rendered_kv_transfer_config(shipped) -> None:
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector import LMCacheConnectorV1

    config = KVTransferConfig(kv_connector="GatedLMCacheConnectorV1", kv_connector_module_path=MODULE,
                              kv_role="kv_both")
    cls = KVConnectorFactory.get_connector_class(config)
    assert cls is shipped.GatedLMCacheConnectorV1
    assert issubclass(cls, LMCacheConnectorV1) and cls.__name__ == "GatedLMCacheConnectorV1"


class StandInImpl:
    """Stands in for LMCache's ``LMCacheConnectorV1Impl`` (what ``LMCacheConnectorV1`` delegates to)."""

    def __init__(self, hit_tokens: int = 64, delay_s: float = 0.0) -> None:
        self.hit_tokens, self.delay_s = hit_tokens, delay_s
        self.lookups = 0

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        self.lookups += 1
        time.sleep(self.delay_s)
        return self.hit_tokens

    def build_connector_meta(self, scheduler_output):
        from lmcache.integration.vllm.vllm_v1_adapter import LMCacheConnectorMetadata, ReqMeta, SaveSpec

        meta = LMCacheConnectorMetadata()
        for i, can_save in enumerate((True, False)):
            meta.add_request(ReqMeta(req_id=f"r{i}", token_ids=[1, 2, 3], slot_mapping=None,
                                     save_spec=SaveSpec(0, can_save)))
        return meta


def _connector(shipped, impl: StandInImpl):
    """An instance without ``__init__`` (which would build LMCache and a lookup client), with a gate."""
    cls = shipped.GatedLMCacheConnectorV1
    conn = cls.__new__(cls)
    conn._lmcache_engine = impl
    gate = shipped.L2Gate(open_after_s=0.05, close_after_s=0.5, lookup_slow_s=0.1)
    conn._l2_gate = shipped.GateRuntime(shipped.GateSettings(path="/unused"), gate,
                                        shipped.GateProber(gate, lambda: None, interval_s=1.0), None)
    return conn, gate


def test_closed_gate_asks_lmcache_open_gate_does_not(shipped) -> None:
    impl = StandInImpl()
    conn, gate = _connector(shipped, impl)
    assert conn.get_num_new_matched_tokens(object(), 0) == (64, False)
    assert impl.lookups == 1
    gate.probe_failed("OSError(5, 'Input/output error')")
    started = time.monotonic()
    assert conn.get_num_new_matched_tokens(object(), 0) == (0, False)
    assert time.monotonic() - started < 0.01
    assert impl.lookups == 1 and gate.bypassed == 1


def test_a_slow_lookup_opens_the_gate(shipped) -> None:
    conn, gate = _connector(shipped, StandInImpl(delay_s=0.15))
    assert conn.get_num_new_matched_tokens(object(), 0) == (64, False)
    assert gate.is_open


def test_open_gate_stops_saves_with_lmcaches_own_save_spec(shipped) -> None:
    conn, gate = _connector(shipped, StandInImpl())
    meta = conn.build_connector_meta(object())
    assert [r.save_spec.can_save for r in meta.requests] == [True, False]
    gate.probe_failed("OSError(107)")
    meta = conn.build_connector_meta(object())
    assert [r.save_spec.can_save for r in meta.requests] == [False, False]
