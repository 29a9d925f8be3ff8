"""The vLLM plugin every vLLM pod of an L2 line loads: the L2 gate (:mod:`vllm_plugins.l2_gate`).

Why a ConfigMap. The gate is one standard-library Python file that vLLM imports by module name
(``kv_connector_module_path`` of ``--kv-transfer-config``), so it must be on the vLLM container's
``PYTHONPATH``; the line's image is the unmodified ``lmcache/vllm-openai`` (no image of our own to
build, scan and pin). The line chart ships the file as ConfigMap ``kvcache-vllm-plugins`` in the
line's namespace, the L2 mutation mounts it read-only at :data:`PLUGIN_DIR` in the vLLM container
and sets ``PYTHONPATH`` to it (the image sets none: LMCache 0.5.5 ``docker/Dockerfile``, so nothing
of the image's is replaced), and the ``--kv-transfer-config`` the mutation completes names the
gate's class and module (:data:`KV_TRANSFER_SETTINGS`, merged into
:data:`k8s.kv_transfer.PLATFORM_SETTINGS`).

The ConfigMap's content is the repository's ``vllm_plugins/l2_gate.py``, byte for byte: the file
the unit tests and the serving tier (``make test-serving``, real vLLM) run is the file the pods
run. A change of it changes the ConfigMap; pods read it at start, so running pods keep the old
gate until they are replaced (docs/l2-cache.md, "When the L2 hangs: the L2 gate").
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Final

from k8s import names
from platform_config import PlatformConfig
from vllm_plugins import l2_gate

#: Where the vLLM container mounts the plugin ConfigMap (read-only); ``PYTHONPATH`` names it.
PLUGIN_DIR: Final = "/opt/kvcache/vllm-plugins"
#: The module name vLLM imports (``kv_connector_module_path``): the ConfigMap key without ``.py``.
GATE_MODULE: Final = "kvcache_l2_gate"
#: The connector class vLLM instantiates (``kv_connector``).
GATE_CONNECTOR: Final = l2_gate.CONNECTOR_CLASS_NAME
#: What the gate adds to the vLLM pods' ``--kv-transfer-config``.
KV_TRANSFER_SETTINGS: Final[dict[str, str]] = {"kv_connector": GATE_CONNECTOR, "kv_connector_module_path": GATE_MODULE}
#: The gate's variable holding the line's chunk key (:func:`vllm_plugins.l2_gate.apply_chunk_key`),
#: set from the line's Secret by a ``secretKeyRef`` (:func:`k8s.patch.pod_env_entries`).
CHUNK_KEY_ENV: Final = l2_gate.CHUNK_KEY_ENV
#: Environment variable that puts :data:`PLUGIN_DIR` on the vLLM container's import path.
PYTHONPATH_ENV: Final = "PYTHONPATH"
#: The gate's settings the pods get from ``lmcache.l2_gate`` (:func:`l2_gate_env`), read by
#: :meth:`vllm_plugins.l2_gate.GateSettings.from_env`.
L2_GATE_ENV: Final = tuple(l2_gate.ENV_PREFIX + k for k in ("ENABLED", "OPEN_AFTER_MS", "LOOKUP_SLOW_MS", "CLOSE_AFTER_MS"))


def l2_gate_env(platform: PlatformConfig) -> dict[str, str]:
    """``KVCACHE_L2_GATE_*`` of ``platform.lmcache.l2_gate`` (milliseconds; ENABLED ``1``/``0``), in
    :data:`L2_GATE_ENV` order. The probe interval and the longest hold keep the gate's defaults."""
    gate = platform.lmcache.l2_gate
    values = ("1" if gate.enabled else "0", str(gate.open_after_ms), str(gate.lookup_slow_ms), str(gate.close_after_ms))
    return dict(zip(L2_GATE_ENV, values))


@functools.cache
def gate_source() -> str:
    """The text of ``vllm_plugins/l2_gate.py``, read once per process."""
    return Path(l2_gate.__file__).read_text(encoding="utf-8")


def config_map_data() -> dict[str, str]:
    """The plugin ConfigMap's data: ``kvcache_l2_gate.py`` -> the gate's source."""
    return {f"{GATE_MODULE}.py": gate_source()}


def volume() -> dict[str, Any]:
    """The pod volume of the plugin ConfigMap (files read-only to everyone: mode 0444)."""
    return {"name": names.VLLM_PLUGINS, "configMap": {"name": names.VLLM_PLUGINS, "defaultMode": 0o444}}


def volume_mount() -> dict[str, Any]:
    """Its read-only mount in the vLLM container, at :data:`PLUGIN_DIR`."""
    return {"name": names.VLLM_PLUGINS, "mountPath": PLUGIN_DIR, "readOnly": True}
