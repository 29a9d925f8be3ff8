"""The three in-cluster agents' ConfigMaps (:mod:`k8s.agent`): every script they ship imports only
the standard library and files shipped beside it, and starts from a directory holding just them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from k8s import names
from tests.k8s.conftest import find

#: (chart, ConfigMap, script, the other modules it ships) of each agent in the example config; the
#: janitor of a line with hot prefixes (rag-assistant) also ships its warmer.
AGENTS = [("curvine", names.L2_MOUNT_WATCHDOG, "l2_mount_watchdog.py", {"agent_core"}),
          ("curvine", names.NODE_FIREWALL, "node_firewall.py", {"agent_core"}),
          ("line-rag-assistant", names.L2_JANITOR, "l2_janitor.py", {"agent_core", "l2_directories", "hot_prefixes"}),
          ("line-research-reasoning", names.L2_JANITOR, "l2_janitor.py", {"agent_core", "l2_directories"}),
          ("line-rag-assistant", names.KV_CANARY, "kv_canary.py", {"agent_core"})]
#: Script -> {module it imports only when given a flag: that flag}. The janitor of a line without hot
#: prefixes ships no warmer and is never given ``--hot-prefixes``.
LAZY = {"l2_janitor.py": {"hot_prefixes": "--hot-prefixes"}}


def imports(source: str) -> tuple[set[str], set[str]]:
    """(top-level modules of the absolute imports, modules of ``from . import ...``) of ``source``."""
    tree = ast.parse(source)
    absolute = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    absolute |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
    relative = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level for a in n.names}
    return absolute, relative


@pytest.mark.parametrize("chart,config_map,script,modules", AGENTS)
def test_shipped_files_import_only_the_standard_library_and_each_other(manifests, chart, config_map, script,
                                                                       modules) -> None:
    """A ConfigMap never ships a script that cannot import in the pinned ``python`` image."""
    data = find(manifests[chart], "ConfigMap", config_map)["data"]
    shipped = {Path(f).stem for f in data if f.endswith(".py")}
    assert shipped == {Path(script).stem, *modules}
    for name in sorted(f for f in data if f.endswith(".py")):
        absolute, relative = imports(data[name])
        # A module imported only for a flag may be absent when the container is not given the flag.
        lazy = {m for m, flag in LAZY.get(name, {}).items() if m not in shipped and flag not in _command(manifests, chart)}
        assert absolute - {"__future__"} <= set(sys.stdlib_module_names) | shipped | lazy, (name, absolute)
        assert relative <= shipped | lazy, (name, relative)


def _command(manifests, chart: str) -> list[str]:
    """Every command word of the chart's agent containers (the janitor's, the canary's, the watchdog's)."""
    return [word for obj in manifests[chart] if obj["kind"] in ("Deployment", "DaemonSet")
            for c in obj["spec"]["template"]["spec"]["containers"] for word in c.get("command", [])]


@pytest.mark.parametrize("chart,config_map,script,modules", AGENTS)
def test_each_script_starts_from_its_configmaps_files_alone(manifests, tmp_path, chart, config_map, script,
                                                            modules) -> None:
    """As the container runs it: ``python3 <dir>/<script>`` with the ConfigMap's files in ``<dir>`` as
    the kubelet lays them out (``<file> -> ..data/<file>``, ``..data -> ..<timestamp>/``), no
    site-packages (``-S``) and no project on the path (``-E``, another working directory)."""
    (tmp_path / "..2026_12_01").mkdir()
    (tmp_path / "..data").symlink_to("..2026_12_01")
    for name, text in find(manifests[chart], "ConfigMap", config_map)["data"].items():
        (tmp_path / "..2026_12_01" / name).write_text(text)
        (tmp_path / name).symlink_to(f"..data/{name}")
    result = subprocess.run([sys.executable, "-S", "-E", str(tmp_path / script), "--help"], cwd="/",
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("usage:"), result.stderr
