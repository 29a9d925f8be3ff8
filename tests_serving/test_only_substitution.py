"""The servers run the rendered Pod: what each server process got (``/proc/<pid>/cmdline`` and
``/proc/<pid>/environ``, read back from the running processes) differs from the admitted Pod's vLLM
container (args and env as rendered) only by the substitutions of :mod:`tests_serving.servers`,
and the copy connector is the one substitution on the KV path: its base is the class the rendered
``--kv-transfer-config`` names, and every other key of that JSON is passed on unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests_serving import servers
from tests_serving.cpu_connector import BASE_ENV, CONNECTOR_NAME
from tests_serving.servers import ENV_ADDED, ENV_REPLACED, GPU_ONLY_FLAGS, KV_TRANSFER_FLAG


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")


def _environ(pid: int) -> dict[str, str]:
    items = Path(f"/proc/{pid}/environ").read_bytes().rstrip(b"\0").decode().split("\0")
    return dict(item.split("=", 1) for item in items if "=" in item)


def _flags(args: list[str]) -> dict[str, str | None]:
    """``--flag value`` / ``--flag=value`` / ``--flag`` pairs of an argv (positional args skipped)."""
    out: dict[str, str | None] = {}
    k = 0
    while k < len(args):
        arg = args[k]
        if not arg.startswith("-"):
            k += 1
            continue
        if "=" in arg:
            key, value = arg.split("=", 1)
            out[key] = value
            k += 1
        elif k + 1 < len(args) and not args[k + 1].startswith("-"):
            out[arg] = args[k + 1]
            k += 2
        else:
            out[arg] = None
            k += 1
    return out


def test_every_server_process_runs_the_rendered_pod_but_for_the_listed_substitutions(rig):
    for server in rig.servers:
        cmd = _cmdline(server.proc.pid)
        assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"], cmd
        got, rendered = _flags(cmd[3:]), _flags(server.rendered_args)
        # Every rendered flag is there with its value, unless GPU-only (dropped) or the connector's.
        for flag, value in rendered.items():
            if flag in GPU_ONLY_FLAGS:
                assert flag not in got
            elif flag != KV_TRANSFER_FLAG:
                assert got.get(flag, "<absent>") == value, (server.name, flag)
        # The model: the rendered positional path, here as --model (the only positional rendered arg).
        assert [a for a in server.rendered_args if not a.startswith("-") and a not in rendered.values()] == ["/opt/ml/model"]
        assert got["--model"] == str(rig.model_dir)
        added = set(got) - set(rendered) - {"--model"}
        assert added == {"--host", "--port", "--dtype", "-O0"}, added
        assert (got["--host"], got["--dtype"]) == ("127.0.0.1", "float32")
        # The connector: every key as rendered but the class and its module.
        kv = json.loads(got[KV_TRANSFER_FLAG])
        want = json.loads(rendered[KV_TRANSFER_FLAG])
        if server is not rig.default_policy:
            assert want["kv_load_failure_policy"] == kv["kv_load_failure_policy"] == "recompute"
        assert kv["kv_connector"] == CONNECTOR_NAME and kv["kv_connector_module_path"] == "tests_serving.cpu_connector"
        overrides = {"kv_load_failure_policy"} if server is rig.default_policy else set()
        changed = {k for k in set(kv) | set(want) if kv.get(k) != want.get(k)}
        assert changed <= {"kv_connector", "kv_connector_module_path"} | overrides, changed
        env = _environ(server.proc.pid)
        assert env[BASE_ENV] == servers.connector_base(want)
        # The env: every rendered variable with its value but the re-pointed ones; no other.
        for name, value in server.rendered_env.items():
            if name not in ENV_REPLACED:
                assert env.get(name) == value, (server.name, name)
        assert set(env) - set(server.rendered_env) <= set(ENV_ADDED), set(env) - set(server.rendered_env)
        # PYTHONPATH: the rendered plugin mount replaced by a directory holding the rendered
        # ConfigMap's files byte for byte, then the repository (the test connector's module).
        plugins = rig.exported["lines"][servers.LINE].get("vllm_plugins")
        path = env["PYTHONPATH"].split(":")
        assert path[-1] == str(servers.REPO)
        if plugins:
            assert server.rendered_env["PYTHONPATH"].split(":") == [plugins["dir"]]
            plugin_dir = Path(path[0])
            # (Python's __pycache__ beside them: the Pod's mount is read-only, this directory is not.)
            assert {f.name: f.read_text(encoding="utf-8") for f in plugin_dir.iterdir() if f.is_file()} \
                == plugins["files"]
        assert env["LMCACHE_REMOTE_URL"].endswith(
            server.rendered_env["LMCACHE_REMOTE_URL"][len(rig.exported["l2_root_url"]):])
        # The engine core and worker are children that inherit this env (vLLM's setproctitle
        # overwrites their /proc environ, so their reading is taken from what LMCache logged in the
        # worker: the URL and the L1 size it was built with).
        log = server.log()
        assert f"'remote_url': '{env['LMCACHE_REMOTE_URL']}'" in log, server.name
        assert f"'max_local_cpu_size': {float(env['LMCACHE_MAX_LOCAL_CPU_SIZE'])}" in log, server.name

def test_the_engine_loaded_the_copy_connector_over_the_rendered_base(rig):
    """vLLM's log of each server: the test class is the connector it created, LMCache built its engine
    (not "degraded mode"), and the rendered base class's own __init__ ran (LMCache's vLLM adapter)."""
    for server in rig.servers:
        log = server.log()
        assert f"Creating v1 connector with name: {CONNECTOR_NAME}" in log, server.name
        assert "degraded mode" not in log and "No supported cpu connector" not in log, server.name
        assert "Creating LMCacheEngine instance" in log, server.name
        # The rendered base's own code ran: the L2 gate, when the rendered JSON names it, started
        # its prober on the server's (re-pointed) L2 directory.
        if server.argv.base.startswith("kvcache_l2_gate:"):
            l2_dir = server.env["LMCACHE_REMOTE_URL"].split("localhost:0", 1)[1].rstrip("/")
            assert "L2GATE on: probing" in log and l2_dir in log, server.name
