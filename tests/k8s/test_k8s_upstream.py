"""Every third-party container the platform renders or configures, held against its upstream.

The programs (curvine-csi, curvine-server, the kubernetes-csi sidecars, Kyverno's and the DCGM
exporter's charts, the inference add-on's load balancer controller) cannot run here, so the rendered
spec is checked against what their own manifests, chart defaults and start-up code need at the pinned
tags: :mod:`tests.k8s.upstream_facts`, each fact with its citation (docs/sources.md §23). No network
and no git at test time.

Each ``*_problems`` function returns the mismatches it finds, as sentences; the rendering has none,
and every kind of check has a mutation test showing it finds the drift it is meant to find (an
unknown flag, a missing variable, a deprecated sidecar flag, a chart key that does not exist...).
The deliberate differences from upstream's own examples are :data:`upstream_facts.DEVIATIONS`; a test
checks each still holds and that docs/sources.md §23 lists it.
"""

from __future__ import annotations

import copy
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any, Callable, Iterable
from urllib.parse import urlparse

import pytest
import yaml

from k8s import names
from k8s.curvine_chart import CSI_HEALTH_PORT, PROVISIONER_TIMEOUT_S
from k8s.kyverno import kyverno_helm_values
from observability.cluster_objects import DCGM_COUNTERS_PATH, dcgm_exporter_values
from platform_config.addon_configuration import INFERENCE_ADDON_KEYS, inference_addon_configuration
from tests.k8s import upstream_facts as up
from tests.k8s.conftest import REPO, find

WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet")
CSI_PODS = (("Deployment", names.CSI_CONTROLLER), ("DaemonSet", names.CSI_NODE))
#: Values of the downward API fields the charts use, as a running pod sees them.
FIELD_VALUES = {"spec.nodeName": "<node-name>", "status.hostIP": "<host-ip>", "status.podIP": "<pod-ip>",
                "metadata.name": "<pod-name>"}
_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
#: A Kubernetes quantity (``resource.ParseQuantity``): the FUSE pods' STANDALONE_* values.
_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[mkMGTPE])?$")


# --- reading rendered objects ---------------------------------------------------------------------

def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def containers(obj: dict) -> list[dict]:
    pod = pod_spec(obj)
    return pod.get("initContainers", []) + pod["containers"]


def container(obj: dict, name: str) -> dict:
    (c,) = [c for c in pod_spec(obj)["containers"] if c["name"] == name]
    return c


def resolved_env(obj: dict, c: dict) -> dict[str, str]:
    """A container's environment as the process sees it: values with earlier ``$(VAR)`` expanded,
    ``fieldRef`` resolved against the object (``metadata.namespace``) or a placeholder."""
    env: dict[str, str] = {}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = expand(e["value"], env)[0]
        elif "fieldRef" in e.get("valueFrom", {}):
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            env[e["name"]] = obj["metadata"]["namespace"] if path == "metadata.namespace" else \
                FIELD_VALUES.get(path, f"<{path}>")
        else:
            env[e["name"]] = "<from the API>"
    return env


def expand(text: str, env: dict[str, str]) -> tuple[str, list[str]]:
    """Kubernetes' ``$(VAR)`` expansion of a command, an argument or a value: a defined variable is
    replaced, an undefined one is left as it is (the program then gets ``$(VAR)`` literally)."""
    undefined = [m.group(1) for m in _VAR_REF.finditer(text) if m.group(1) not in env]
    return _VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), text), undefined


def argv(obj: dict, c: dict) -> tuple[list[str], list[str]]:
    """``command + args`` expanded, and the undefined variables they reference."""
    env = resolved_env(obj, c)
    out, undefined = [], []
    for part in c.get("command", []) + c.get("args", []):
        text, missing = expand(part, env)
        out.append(text)
        undefined += missing
    return out, undefined


def parse_flags(args: Iterable[str]) -> tuple[dict[str, list[str | None]], list[str]]:
    """``--name=value``, ``--name value`` or ``-name``: flag name -> values, and positional words."""
    flags: dict[str, list[str | None]] = {}
    positional: list[str] = []
    args = list(args)
    i = 0
    while i < len(args):
        word = args[i]
        if word.startswith("-") and word.strip("-"):
            name, eq, value = word.lstrip("-").partition("=")
            if not eq and i + 1 < len(args) and not args[i + 1].startswith("-"):
                value, i = args[i + 1], i + 1
            flags.setdefault(name, []).append(value if (eq or value) else None)
        else:
            positional.append(word)
        i += 1
    return flags, positional


def flag_problems(args: list[str], flags: up.Flags) -> list[str]:
    """The program's own command-line check: unknown flags (the program exits), deprecated ones,
    required ones missing or empty, positional words."""
    parsed, positional = parse_flags(args)
    problems = [f"{flags.program}: --{n} is not a flag at the pinned release (unknown flags exit; {flags.cite})"
                for n in parsed if n not in flags.names]
    problems += [f"{flags.program}: --{n} is deprecated at the pinned release ({flags.cite})"
                 for n in parsed if n in flags.deprecated]
    problems += [f"{flags.program}: --{n} is required ({flags.cite})"
                 for n in sorted(flags.required) if not any(parsed.get(n, []))]
    problems += [f"{flags.program}: positional argument {p!r} (not a flag)" for p in positional]
    return problems


def image_parts(ref: str) -> tuple[str, str | None]:
    """``repository``, ``tag`` of an image reference (``None`` for a digest without a tag)."""
    name = ref.split("@", 1)[0]
    repo, sep, tag = name.rpartition(":")
    if not sep or "/" in tag:
        return name, None
    return repo, tag


def volume(obj: dict, name: str) -> dict:
    (v,) = [v for v in pod_spec(obj).get("volumes", []) if v["name"] == name]
    return v


def mount_for(c: dict, path: str) -> dict | None:
    """The volume mount of ``c`` that holds ``path`` (the deepest one)."""
    hits = [m for m in c.get("volumeMounts", [])
            if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
    return max(hits, key=lambda m: len(m["mountPath"]), default=None)


def config_map_file(objs: list[dict], obj: dict, c: dict, path: str) -> str | None:
    """Text of ``path`` in ``c`` when it is a key of a ConfigMap volume of the pod, else ``None``."""
    m = mount_for(c, path)
    if m is None or "subPath" in m:
        return None
    source = volume(obj, m["name"]).get("configMap")
    if source is None:
        return None
    key = path[len(m["mountPath"].rstrip("/")) + 1:]
    cm = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == source["name"]
          and o["metadata"].get("namespace") == obj["metadata"]["namespace"]]
    return cm[0]["data"].get(key) if cm else None


def host_path_of(obj: dict, c: dict, path: str) -> str | None:
    """The node path behind ``path`` in ``c`` when a hostPath volume holds it."""
    m = mount_for(c, path)
    if m is None:
        return None
    hp = volume(obj, m["name"]).get("hostPath")
    if hp is None:
        return None
    rest = path[len(m["mountPath"].rstrip("/")):]
    return hp["path"].rstrip("/") + rest


def service_accounts(objs: list[dict], namespace: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objs
            if o["kind"] == "ServiceAccount" and o["metadata"].get("namespace") == namespace}


# --- RBAC ------------------------------------------------------------------------------------------

def grants(objs: list[dict], sa: str, namespace: str) -> list[tuple[dict, str | None]]:
    """Every rule bound to a service account: ``(rule, namespace)``, ``None`` for cluster scope."""
    subject = {"kind": "ServiceAccount", "name": sa, "namespace": namespace}

    def bound(binding: dict) -> bool:
        return any(all(s.get(k) == v for k, v in subject.items()) for s in binding.get("subjects", []))

    def role(kind: str, name: str, ns: str | None) -> list[dict]:
        hits = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name
                and (kind == "ClusterRole" or o["metadata"].get("namespace") == ns)]
        return hits[0].get("rules", []) if hits else []

    out: list[tuple[dict, str | None]] = []
    for b in objs:
        if b["kind"] == "ClusterRoleBinding" and bound(b):
            out += [(r, None) for r in role("ClusterRole", b["roleRef"]["name"], None)]
        elif b["kind"] == "RoleBinding" and bound(b):
            ns = b["metadata"]["namespace"]
            out += [(r, ns) for r in role(b["roleRef"]["kind"], b["roleRef"]["name"], ns)]
    return out


def allowed(objs: list[dict], sa: str, namespace: str, call: up.ApiCall, verb: str, where: str) -> bool:
    """May ``sa`` make this call (cluster-wide, or in namespace ``where``)?"""
    for rule, scope in grants(objs, sa, namespace):
        if scope is not None and (call.cluster_scope or scope != where):
            continue
        if (call.group in rule.get("apiGroups", []) or "*" in rule.get("apiGroups", [])) and \
                (call.resource in rule.get("resources", []) or "*" in rule.get("resources", [])) and \
                (verb in rule.get("verbs", []) or "*" in rule.get("verbs", [])):
            return True
    return False


def rbac_problems(objs: list[dict], sa: str, namespace: str, calls: Iterable[up.ApiCall], where: str) -> list[str]:
    return [f"{sa}: may not {verb} {c.resource}{'' if c.cluster_scope else ' in ' + where} ({c.when}; {c.cite})"
            for c in calls for verb in sorted(c.verbs) if not allowed(objs, sa, namespace, c, verb, where)]


# --- curvine-csi --------------------------------------------------------------------------------

def plugin_problems(objs: list[dict], kind: str, name: str) -> list[str]:
    """curvine-csi's ``csi-plugin`` container of one pod against the binary's flags, environment,
    start-up per mount mode and API calls (CSI_DRIVER_*, CSI_STANDALONE_CALLS, FUSE_POD)."""
    obj = find(objs, kind, name)
    ns = obj["metadata"]["namespace"]
    c = container(obj, "csi-plugin")
    words, undefined = argv(obj, c)
    env = resolved_env(obj, c)
    problems = [f"{name}: $({v}) is not defined in the container's env (passed literally)" for v in undefined]
    if words[:1] != [up.CSI_DRIVER_BINARY]:
        problems.append(f"{name}: command {words[:1]} is not {up.CSI_DRIVER_BINARY} (the image has no ENTRYPOINT; "
                        f"{up.CSI_IMAGE_CITE})")
    problems += [f"{name}: {p}" for p in flag_problems(words[1:], up.CSI_DRIVER_FLAGS)]
    flags, _ = parse_flags(words[1:])
    endpoint = (flags.get("endpoint") or ["unix://tmp/csi.sock"])[-1] or ""
    url = urlparse(endpoint)
    socket = "/" + (url.netloc + url.path).strip("/")
    if url.scheme != "unix" or mount_for(c, socket) is None:
        problems.append(f"{name}: --endpoint {endpoint!r} is not a unix socket on a mounted volume ({up.CSI_ENDPOINT_CITE})")
    # Every variable is read by the binary or its children, or used in the command line.
    used = {m.group(1) for part in c.get("command", []) + c.get("args", []) for m in _VAR_REF.finditer(part)}
    for var in env:
        if var not in up.CSI_DRIVER_ENV and var not in up.CSI_CHILD_ENV and var not in used:
            problems.append(f"{name}: {var} is read by neither curvine-csi nor its children, nor used in its args")
    mode = env.get("MOUNT_MODE") or up.MOUNT_MODE_DEFAULT
    if mode not in up.MOUNT_MODES:
        problems.append(f"{name}: MOUNT_MODE {mode!r}: NewDriver exits (klog.Fatalf) ({up.MOUNT_MODE_CITE})")
    for var, fact in up.CSI_DRIVER_ENV.items():
        if var in env and fact.modes and mode not in fact.modes:
            problems.append(f"{name}: {var} is read only in {sorted(fact.modes)} mode, this process runs {mode}")
    # The namespace of its objects: upstream sets it in both pods; the default is "curvine".
    if "KUBERNETES_NAMESPACE" not in env:
        problems.append(f"{name}: KUBERNETES_NAMESPACE unset: the driver uses 'curvine' whatever the namespace "
                        f"({up.CSI_DRIVER_ENV['KUBERNETES_NAMESPACE'].cite})")
    where = env.get("KUBERNETES_NAMESPACE") or up.CSI_DRIVER_ENV["KUBERNETES_NAMESPACE"].default
    if where != ns:
        problems.append(f"{name}: the driver's namespace {where!r} is not the pod's {ns!r}")
    if mode == up.STANDALONE:
        sa = env.get("STANDALONE_SERVICE_ACCOUNT")
        if not sa:
            problems.append(f"{name}: standalone mode without STANDALONE_SERVICE_ACCOUNT: NewDriver exits "
                            f"({up.CSI_DRIVER_ENV['STANDALONE_SERVICE_ACCOUNT'].cite})")
        elif sa not in service_accounts(objs, where):
            problems.append(f"{name}: STANDALONE_SERVICE_ACCOUNT {sa!r} is no ServiceAccount of namespace {where!r} "
                            "(the FUSE pods could not be created)")
        if env.get("STANDALONE_IMAGE") != c["image"]:
            problems.append(f"{name}: STANDALONE_IMAGE {env.get('STANDALONE_IMAGE')!r} is not the plugin's own "
                            f"image {c['image']!r}: the FUSE pods pull with policy {up.FUSE_POD.image_pull_policy} "
                            f"({up.FUSE_POD.cite})")
        for var in ("STANDALONE_CPU_REQUEST", "STANDALONE_CPU_LIMIT", "STANDALONE_MEMORY_REQUEST",
                    "STANDALONE_MEMORY_LIMIT"):
            if var in env and not _QUANTITY.match(env[var]):
                problems.append(f"{name}: {var}={env[var]!r} is no quantity: the driver skips it "
                                f"({up.CSI_DRIVER_ENV[var].cite})")
        problems += fuse_pod_problems(objs, obj, c, where)
    # curvine-cli reads CURVINE_CONF_FILE, validate-config FUSE_CONF_PATH (default: the image's conf
    # directory, which a ConfigMap mount there replaces): each must be a file the container has.
    for var, default in (("CURVINE_CONF_FILE", None), ("FUSE_CONF_PATH", up.CSI_DRIVER_ENV["FUSE_CONF_PATH"].default)):
        path = env.get(var, default)
        if path is None:
            continue
        m = mount_for(c, path)
        if m is not None and config_map_file(objs, obj, c, path) is None:
            problems.append(f"{name}: {var} {path} is hidden by the mount at {m['mountPath']} and not in it")
    # In-cluster client config: the service-account token must be mounted.
    pod = pod_spec(obj)
    sa_obj = service_accounts(objs, ns).get(pod.get("serviceAccountName", "default"), {})
    if pod.get("automountServiceAccountToken") is False or (
            sa_obj.get("automountServiceAccountToken") is False and pod.get("automountServiceAccountToken") is not True):
        problems.append(f"{name}: no service-account token: rest.InClusterConfig fails ({up.CSI_IN_CLUSTER_CITE})")
    return problems


def fuse_pod_problems(objs: list[dict], obj: dict, plugin: dict, where: str) -> list[str]:
    """What the FUSE pods ``buildStandalone`` makes from the node plugin's env need: a namespace that
    admits privileged host pods, and their mount point reaching the plugin (Bidirectional)."""
    problems = []
    ns_objs = [o for o in objs if o["kind"] == "Namespace" and o["metadata"]["name"] == where]
    level = ns_objs[0]["metadata"].get("labels", {}).get("pod-security.kubernetes.io/enforce") if ns_objs else None
    if level != "privileged":
        problems.append(f"FUSE pods: namespace {where!r} enforces {level!r}, not 'privileged': they are privileged, "
                        f"hostNetwork, hostPID, with hostPath volumes ({up.FUSE_POD.cite})")
    m = mount_for(plugin, up.FUSE_POD.host_mount_base)
    if m is None or host_path_of(obj, plugin, up.FUSE_POD.host_mount_base) != up.FUSE_POD.host_mount_base \
            or m.get("mountPropagation") != "Bidirectional":
        problems.append(f"FUSE pods: {up.FUSE_POD.host_mount_base} is not the node's own path under a Bidirectional "
                        "mount of the node plugin (it bind-mounts the FUSE mounts into pods from there)")
    if not (plugin.get("securityContext") or {}).get("privileged"):
        problems.append("CSI node plugin: not privileged (mounts need it, and Bidirectional propagation is only "
                        "admitted for privileged containers)")
    return problems


def csi_rbac_problems(objs: list[dict]) -> list[str]:
    """The API calls each CSI pod's processes make, against the RBAC bound to its service account."""
    problems = []
    for kind, name in CSI_PODS:
        obj = find(objs, kind, name)
        ns = obj["metadata"]["namespace"]
        sa = pod_spec(obj)["serviceAccountName"]
        env = resolved_env(obj, container(obj, "csi-plugin"))
        where = env.get("KUBERNETES_NAMESPACE") or "curvine"
        calls: list[up.ApiCall] = []
        if (env.get("MOUNT_MODE") or up.MOUNT_MODE_DEFAULT) == up.STANDALONE:
            calls += up.CSI_STANDALONE_CALLS
        # The controller service answers only the provisioner: where it runs, DeleteVolume's PV list.
        if any(image_parts(c["image"])[0] == up.SIDECARS["csi_provisioner"].image for c in containers(obj)):
            calls += [*up.CSI_CONTROLLER_CALLS, *up.PROVISIONER_CALLS]
        problems += rbac_problems(objs, sa, ns, calls, where)
    return problems


def sidecar_problems(objs: list[dict]) -> list[str]:
    """Each kubernetes-csi sidecar: its flags at the pinned release, the driver socket it talks to,
    where it registers or listens."""
    problems = []
    for kind, name in CSI_PODS:
        obj = find(objs, kind, name)
        plugin = container(obj, "csi-plugin")
        words, _ = argv(obj, plugin)
        endpoint = (parse_flags(words[1:])[0].get("endpoint") or [""])[-1] or ""
        url = urlparse(endpoint)
        plugin_socket = "/" + (url.netloc + url.path).strip("/")
        socket_volume = (mount_for(plugin, plugin_socket) or {}).get("name")
        for c in pod_spec(obj)["containers"]:
            repo, tag = image_parts(c["image"])
            facts = [s for s in up.SIDECARS.values() if s.image == repo]
            if not facts:
                continue
            (side,) = facts
            where = f"{name}/{c['name']}"
            if tag != side.tag:
                problems.append(f"{where}: image tag {tag!r}, the facts were read at {side.tag} (re-read them)")
            words, undefined = argv(obj, c)
            problems += [f"{where}: $({v}) is not defined in the container's env" for v in undefined]
            problems += [f"{where}: {p}" for p in flag_problems(words, side.flags)]
            flags, _ = parse_flags(words)
            address = (flags.get("csi-address") or ["/run/csi/socket"])[-1] or ""
            m = mount_for(c, address)
            if address != plugin_socket or m is None or m["name"] != socket_volume:
                problems.append(f"{where}: --csi-address {address!r} is not the driver's socket {plugin_socket!r} "
                                f"on the same volume")
            if side.flags is up.REGISTRAR_FLAGS:
                registration = (flags.get("plugin-registration-path") or [up.REGISTRAR_PLUGIN_REGISTRATION_PATH])[-1]
                if host_path_of(obj, c, registration) != "/var/lib/kubelet/plugins_registry":
                    problems.append(f"{where}: {registration} is not the kubelet's plugins_registry on the node")
                kubelet_path = (flags.get("kubelet-registration-path") or [""])[-1]
                if kubelet_path != host_path_of(obj, plugin, plugin_socket):
                    problems.append(f"{where}: --kubelet-registration-path {kubelet_path!r} is not the node path of "
                                    f"the driver's socket {host_path_of(obj, plugin, plugin_socket)!r}")
            if side.flags is up.LIVENESSPROBE_FLAGS:
                problems += liveness_problems(obj, plugin, flags, where)
            if side.flags is up.PROVISIONER_FLAGS and not any(flags.get("leader-election", [])) \
                    and obj["spec"].get("replicas", 1) != 1:
                problems.append(f"{where}: {obj['spec']['replicas']} replicas without --leader-election "
                                f"(default {up.PROVISIONER_LEADER_ELECTION_DEFAULT}): every replica provisions")
    return problems


def liveness_problems(obj: dict, plugin: dict, flags: dict[str, list[str | None]], where: str) -> list[str]:
    """The plugin's livenessProbe must reach the livenessprobe sidecar's /healthz."""
    endpoint = (flags.get("http-endpoint") or [None])[-1]
    port = int(endpoint.rpartition(":")[2]) if endpoint else \
        int((flags.get("health-port") or [up.LIVENESSPROBE_DEFAULT_PORT])[-1])
    probe = plugin.get("livenessProbe", {}).get("httpGet")
    if probe is None:
        return [f"{where}: the csi-plugin container has no httpGet livenessProbe"]
    target = probe["port"]
    if isinstance(target, str):
        target = {p.get("name"): p["containerPort"] for p in plugin.get("ports", [])}.get(target)
    problems = []
    if target != port or probe.get("path") != up.LIVENESSPROBE_PATH:
        problems.append(f"{where}: the plugin's probe {probe.get('path')}:{target} is not the sidecar's "
                        f"{up.LIVENESSPROBE_PATH}:{port} ({up.LIVENESSPROBE_SERVE_CITE})")
    return problems


def csi_problems(objs: list[dict]) -> list[str]:
    """Everything above for both CSI pods."""
    return [p for kind, name in CSI_PODS for p in plugin_problems(objs, kind, name)] + csi_rbac_problems(objs) \
        + sidecar_problems(objs)


# --- curvine-server -------------------------------------------------------------------------------

def server_argv(c: dict) -> list[str]:
    """The server's argv: the command itself, or the ``exec`` line of a ``sh -c`` wrapper."""
    if c.get("command", [])[:2] == ["/bin/sh", "-c"]:
        execs = [line.strip()[5:] for line in c["args"][0].splitlines() if line.strip().startswith("exec ")]
        return shlex.split(execs[-1]) if execs else []
    return c.get("command", []) + c.get("args", [])


def server_problems(objs: list[dict]) -> list[str]:
    """The Primary's master and the Workers' worker container against curvine-server's flags,
    environment and configuration (CURVINE_SERVER_*, MASTER_HOSTNAME_CITE)."""
    problems = []
    for kind, name, cname, service in (("StatefulSet", names.CURVINE_MASTER, "master", "master"),
                                       ("DaemonSet", names.CURVINE_WORKER, "worker", "worker")):
        obj = find(objs, kind, name)
        c = container(obj, cname)
        words = server_argv(c)
        where = f"{name}/{cname}"
        if not words or words[0] != up.CURVINE_SERVER:
            problems.append(f"{where}: does not run {up.CURVINE_SERVER} ({up.CURVINE_IMAGE_CITE})")
            continue
        problems += [f"{where}: {p}" for p in flag_problems(words[1:], up.CURVINE_SERVER_FLAGS)]
        flags, _ = parse_flags(words[1:])
        given = (flags.get("service") or [None])[-1]
        if given not in up.CURVINE_SERVICES or given != service:
            problems.append(f"{where}: --service {given!r} is not {service!r} ({up.CURVINE_SERVER_FLAGS.cite})")
        conf_path = (flags.get("conf") or [""])[-1] or ""
        text = config_map_file(objs, obj, c, conf_path)
        if text is None:
            problems.append(f"{where}: --conf {conf_path!r} is no file of a mounted ConfigMap: the server exits")
            continue
        toml = tomllib.loads(text)
        if c.get("workingDir") != up.CURVINE_HOME:
            problems.append(f"{where}: workingDir {c.get('workingDir')!r}, the entrypoint runs the server in "
                            f"{up.CURVINE_HOME} (relative paths) ({up.CURVINE_IMAGE_CITE})")
        env = resolved_env(obj, c)
        for var in env:
            if var not in up.CURVINE_SERVER_ENV and var not in up.CURVINE_CLI_ENV:
                problems.append(f"{where}: {var} is read by neither curvine-server nor curvine-cli")
        if env.get("CURVINE_CONF_FILE") not in (None, conf_path):
            problems.append(f"{where}: CURVINE_CONF_FILE {env['CURVINE_CONF_FILE']!r} is not --conf {conf_path!r} "
                            "(curvine-cli in the container would read another config)")
        if service == "master":
            host = env.get("CURVINE_MASTER_HOSTNAME", toml["master"].get("hostname"))
            peers = [p["hostname"] for p in toml["journal"]["journal_addrs"]]
            if host not in peers:
                problems.append(f"{where}: master hostname {host!r} is not in journal_addrs {peers}: the master "
                                f"refuses to start ({up.MASTER_HOSTNAME_CITE})")
            bound = {toml["master"]["rpc_port"], toml["journal"]["rpc_port"], toml["master"]["web_port"]}
            rpc = toml["master"]["rpc_port"]
        else:
            if env.get("CURVINE_WORKER_HOSTNAME") != FIELD_VALUES["status.hostIP"] or not pod_spec(obj).get("hostNetwork"):
                problems.append(f"{where}: a Worker registers CURVINE_WORKER_HOSTNAME as its address: it must be the "
                                "node IP of a host-network pod (docs/sources.md §19)")
            bound = {toml["worker"]["rpc_port"], toml["worker"]["web_port"]}
            rpc = toml["worker"]["rpc_port"]
        declared = {p["containerPort"] for p in c.get("ports", [])}
        if declared != bound:
            problems.append(f"{where}: container ports {sorted(declared)} are not the ports the config binds "
                            f"{sorted(bound)}")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            port = c.get(probe, {}).get("tcpSocket", {}).get("port")
            if port != rpc:
                problems.append(f"{where}: {probe} checks {port}, not the RPC port {rpc}")
    return problems


# --- Helm values and the add-on configuration ----------------------------------------------------

def _kind_ok(value: Any, kind: type) -> bool:
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def chart_value_problems(values: dict[str, Any], keys: dict[str, up.ChartKey], chart: str) -> list[str]:
    """Every value set is a key of the chart's values.yaml (a branch to one, or one) of its type."""
    branches = {k.rsplit(".", i)[0] for k in keys for i in range(1, k.count(".") + 1)}
    problems: list[str] = []

    def walk(value: Any, path: str) -> None:
        if path in keys:
            if not _kind_ok(value, keys[path].kind):
                problems.append(f"{chart} {path}: {type(value).__name__}, the chart's is {keys[path].kind.__name__} "
                                f"({keys[path].cite})")
        elif (path in branches or not path) and isinstance(value, dict):
            for key, sub in value.items():
                walk(sub, f"{path}.{key}" if path else key)
        else:
            problems.append(f"{chart} {path}: not a key of the chart's values.yaml (or not one read for this platform)")

    walk(values, "")
    return problems


def _get(values: dict[str, Any], path: str, default: Any = None) -> Any:
    for part in path.split("."):
        if not isinstance(values, dict) or part not in values:
            return default
        values = values[part]
    return values


def label_selector_problems(selector: Any, where: str) -> list[str]:
    if not isinstance(selector, dict) or set(selector) - {"matchLabels", "matchExpressions"}:
        return [f"{where}: not a label selector"]
    problems = []
    for e in selector.get("matchExpressions", []):
        op = e.get("operator")
        if set(e) - {"key", "operator", "values"} or op not in ("In", "NotIn", "Exists", "DoesNotExist") or \
                (op in ("In", "NotIn")) != bool(e.get("values")):
            problems.append(f"{where}: bad expression {e}")
    return problems


def kyverno_problems(values: dict[str, Any]) -> list[str]:
    """Kyverno chart 3.5.2 values: keys and types, the webhook config Kyverno parses, the PDB the
    template renders, and admission reports nobody would delete."""
    problems = chart_value_problems(values, up.KYVERNO_KEYS, "kyverno")
    webhooks = _get(values, "config.webhooks")
    if webhooks is not None:
        if not isinstance(webhooks, dict) or set(webhooks) - up.KYVERNO_WEBHOOK_CONFIG_KEYS:
            problems.append(f"kyverno config.webhooks: not a WebhookConfig ({up.KYVERNO_WEBHOOK_CONFIG_CITE})")
        else:
            for key, selector in webhooks.items():
                problems += label_selector_problems(selector, f"kyverno config.webhooks.{key}")
    pdb = _get(values, "admissionController.podDisruptionBudget", {})
    if pdb.get("minAvailable") is not None and pdb.get("maxUnavailable") is not None:
        problems.append(f"kyverno: minAvailable and maxUnavailable both set: the render fails ({up.KYVERNO_PDB_CITE})")
    if _get(values, "admissionController.replicas") == 0:
        problems.append(f"kyverno: replicas 0 fails the render ({up.KYVERNO_PDB_CITE})")
    reports_controller = _get(values, "reportsController.enabled", up.KYVERNO_KEYS["reportsController.enabled"].default)
    admission_reports = _get(values, "features.admissionReports.enabled",
                             up.KYVERNO_KEYS["features.admissionReports.enabled"].default)
    if admission_reports and not reports_controller:
        problems.append("kyverno: admission reports on with the reports controller off: one EphemeralReport per "
                        f"mutated Pod that nothing deletes ({up.KYVERNO_ADMISSION_REPORTS_CITE})")
    return problems


def dcgm_problems(values: dict[str, Any]) -> list[str]:
    """dcgm-exporter chart 4.8.2 values: keys and types, the security context the template writes,
    and ``-f`` naming the counters file the chart mounts (where ``customMetrics`` lands)."""
    problems = chart_value_problems(values, up.DCGM_KEYS, "dcgm-exporter")
    context = values.get("securityContext", {})
    problems += [f"dcgm-exporter securityContext.{k}: not a SecurityContext field" for k in context
                 if k not in up.SECURITY_CONTEXT_FIELDS]
    args = values.get("arguments", up.DCGM_KEYS["arguments"].default)
    flags, positional = parse_flags(args)
    files = [v for f, vs in flags.items() if f"-{f}" in up.DCGM_FILE_FLAGS or f"--{f}" in up.DCGM_FILE_FLAGS
             for v in vs]
    if "customMetrics" in values and files != [up.DCGM_COUNTERS_MOUNT]:
        problems.append(f"dcgm-exporter: arguments {args} do not read {up.DCGM_COUNTERS_MOUNT}, where the chart "
                        f"mounts customMetrics ({up.DCGM_COUNTERS_CITE})")
    return problems


def leaf_paths(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        path = f"{prefix}.{key}" if prefix else key
        out.update(leaf_paths(value, path) if isinstance(value, dict) and value else {path: value})
    return out


def addon_problems(configuration: dict[str, Any], keys: Iterable[Any] = INFERENCE_ADDON_KEYS) -> list[str]:
    """Each key sent is declared, and marked verified exactly when AWS's own script sends it or AWS's
    gateway guide documents it."""
    declared = {k.path: k for k in keys}
    problems = []
    for path, value in leaf_paths(configuration).items():
        key = declared.get(path)
        if key is None:
            problems.append(f"inference add-on {path}: not declared in INFERENCE_ADDON_KEYS")
            continue
        if key.verified != (path in up.ADDON_KEYS_AWS_SENDS | up.ADDON_KEYS_AWS_DOCUMENTS):
            problems.append(f"inference add-on {path}: marked {'verified' if key.verified else 'unverified'}, but "
                            f"AWS {'neither sends nor documents' if key.verified else 'sends or documents'} it "
                            f"({up.ADDON_KEYS_CITE}; {up.ADDON_KEYS_AWS_DOCUMENTS_CITE})")
        if key.never_sent:
            problems.append(f"inference add-on {path}: declared never sent")
        if path == "alb.ingressClassParams.spec.scheme" and value not in up.ALB_SCHEMES:
            problems.append(f"inference add-on {path}: {value!r} is not a scheme ({up.ALB_SCHEMES_CITE})")
    return problems


def placeholder_addon_configuration(platform, **switches: Any) -> dict[str, Any]:
    role = "arn:aws:iam::000000000000:role/placeholder"
    return inference_addon_configuration(
        platform, execution_role_arn=role, tls_bucket="hyperpod-tls-placeholder",
        hyperpod_cluster_arn="arn:aws:sagemaker:us-east-1:000000000000:cluster/placeholder",
        alb_role_arn=role, keda_role_arn=role, **switches)


# === the rendering agrees with upstream ===========================================================

def _config_pins(config_dir: Path) -> dict[str, Any]:
    return yaml.safe_load((config_dir / "platform.yaml").read_text(encoding="utf-8"))


@pytest.mark.parametrize("config_dir", [REPO / "tests" / "fixtures" / "config", REPO / "config"],
                         ids=["fixture", "shipped"])
def test_the_facts_were_read_at_the_pinned_tags(config_dir):
    """A pin moved without re-reading the facts fails here: the images, Kyverno's and the DCGM
    exporter's chart versions are the tags :mod:`upstream_facts` was read at. (A digest without a
    tag, as config/platform.yaml suggests once the images are pulled, names no release: skipped.)"""
    platform = _config_pins(config_dir)
    images = platform["versions"]["images"]
    expected = {"curvine": ("ghcr.io/curvineio/curvine", up.CURVINE.tag),
                "curvine_csi": ("ghcr.io/curvineio/curvine-csi", up.CURVINE.tag),
                **{field: (side.image, side.tag) for field, side in up.SIDECARS.items()}}
    for field, (repo, tag) in expected.items():
        got_repo, got_tag = image_parts(images[field])
        if got_tag is None and "@" in images[field]:
            continue
        assert (got_repo.rsplit("/", 1)[-1], got_tag) == (repo.rsplit("/", 1)[-1], tag), field
    assert up.KYVERNO.tag == f"kyverno-chart-{platform['versions']['charts']['kyverno']['version']}"
    dcgm = (platform.get("observability", {}).get("dcgm_exporter", {}).get("chart") or {}).get("version", "4.8.2")
    assert up.DCGM.tag.endswith(f"-{dcgm}")


@pytest.mark.parametrize("kind, name", CSI_PODS, ids=["controller", "node-plugin"])
def test_each_csi_plugin_process_has_what_curvine_csi_reads(curvine, kind, name):
    """curvine-csi v0.3.2-alpha: only ``--endpoint``/``--nodeid`` (plus ``--version*``), a unix socket on a
    shared volume, every variable read by the binary or used in its args, a valid mount mode, the
    namespace from ``metadata.namespace``, standalone mode's service account (of this chart) and its own
    image as the FUSE pods' image (pull policy Never), the config files curvine-cli and validate-config
    read, a service-account token."""
    assert plugin_problems(curvine, kind, name) == []


def test_the_csi_processes_may_make_the_api_calls_they_make(curvine):
    """The node plugin's PV informer (cluster-wide list+watch; without it the start blocks for ever),
    its FUSE pods and state ConfigMap in its namespace; the controller's PV list and the provisioner's
    rules, VolumeAttachments included (the driver has PUBLISH_UNPUBLISH_VOLUME)."""
    assert "PUBLISH_UNPUBLISH_VOLUME" in up.CSI_CONTROLLER_CAPABILITIES
    assert any(c.resource == "volumeattachments" for c in up.PROVISIONER_CALLS)
    assert csi_rbac_problems(curvine) == []


def test_each_sidecar_passes_only_flags_of_its_pinned_release_and_reaches_the_driver(curvine):
    """Provisioner v5.2.0, registrar v2.13.0, livenessprobe v2.15.0: no unknown or deprecated flag,
    the required ones, the driver's socket on the same volume, the registrar's node path of that
    socket, the plugin's probe on the livenessprobe's ``/healthz`` port, one provisioner without
    leader election."""
    assert sidecar_problems(curvine) == []


def test_the_csi_driver_object_is_the_drivers_name(curvine):
    """CSIDriver and StorageClass name ``DriverName`` (``curvine``)."""
    assert find(curvine, "CSIDriver")["metadata"]["name"] == up.CSI_DRIVER_NAME == names.CSI_DRIVER_NAME
    assert find(curvine, "StorageClass")["provisioner"] == up.CSI_DRIVER_NAME


def test_the_curvine_servers_start_as_curvine_server_needs(curvine):
    """curvine-server: exactly ``--service`` and ``--conf`` (a file of the mounted ConfigMap), run in
    CURVINE_HOME; only variables the server or curvine-cli read; the master's hostname among the journal
    peers; the Worker's address the node IP; container ports and probes those of the config."""
    assert server_problems(curvine) == []


def test_kyverno_values_are_keys_of_chart_3_5_2():
    assert kyverno_problems(kyverno_helm_values()) == []


def test_dcgm_values_are_keys_of_chart_4_8_2(k8s_project):
    values = dcgm_exporter_values(k8s_project.platform)
    assert dcgm_problems(values) == []
    assert DCGM_COUNTERS_PATH == up.DCGM_COUNTERS_MOUNT


@pytest.mark.parametrize("switches", [{}, {"set_scheme_in_addon": True, "load_balancer_scheme": "internet-facing"}])
def test_the_inference_addon_keys_are_awss_or_opt_in(k8s_project, switches):
    """Every key sent is declared, verified exactly when AWS's migration script sends it; by default
    only those; the scheme is one the IngressClassParams CRD accepts."""
    platform = k8s_project.platform.model_copy(update={
        "inference_operator": k8s_project.platform.inference_operator.model_copy(update=switches)})
    configuration = placeholder_addon_configuration(platform)
    assert addon_problems(configuration) == []
    if not switches:
        assert set(leaf_paths(configuration)) <= up.ADDON_KEYS_AWS_SENDS | up.ADDON_KEYS_AWS_DOCUMENTS


def test_the_addon_roles_trust_the_service_accounts_the_addon_creates():
    """The IRSA trusts name the namespace and service accounts of AWS's operator chart."""
    from stacks import addons_stack

    assert addons_stack.INFERENCE_NAMESPACE == up.INFERENCE_NAMESPACE
    assert addons_stack.INFERENCE_ALB_SA == up.ALB_SERVICE_ACCOUNT
    assert addons_stack.INFERENCE_KEDA_SA == up.KEDA_SERVICE_ACCOUNT


def test_the_provisioner_waits_for_the_drivers_own_error(curvine):
    """With the Primary unreachable, CreateVolume ends in the driver's own Internal error after
    validate-config (30 s) and two curvine-cli calls of 4 x 30 s + 3 x 2 s: 282 s. The provisioner's
    ``--timeout`` covers it, so the PVC's event carries that error and no second CreateVolume runs
    beside one still in flight (a DeadlineExceeded is retried in the background; curvine-cli's runs
    ignore the gRPC deadline)."""
    assert up.cli_call_max_s() == 126 and up.create_volume_failing_path_s() == 282
    provisioner = container(find(curvine, "Deployment", names.CSI_CONTROLLER), "csi-provisioner")
    (timeout,) = parse_flags(provisioner["args"])[0]["timeout"]
    assert timeout == f"{PROVISIONER_TIMEOUT_S}s" and PROVISIONER_TIMEOUT_S >= up.create_volume_failing_path_s()


def test_the_livenessprobe_serves_the_port_the_plugins_probe(curvine):
    for kind, name in CSI_PODS:
        args = container(find(curvine, kind, name), "liveness-probe")["args"]
        assert f"--http-endpoint=:{CSI_HEALTH_PORT}" in args and not any(a.startswith("--health-port") for a in args)


# === each check finds the drift it is for ========================================================

def _edit_container(kind: str, name: str, cname: str, change: Callable[[dict], None]) -> Callable[[list[dict]], None]:
    def edit(objs: list[dict]) -> None:
        change(container(find(objs, kind, name), cname))
    return edit


def _drop_env(var: str) -> Callable[[dict], None]:
    def change(c: dict) -> None:
        c["env"] = [e for e in c["env"] if e["name"] != var]
    return change


def _set_env(var: str, value: str) -> Callable[[dict], None]:
    def change(c: dict) -> None:
        c["env"] = [e for e in c["env"] if e["name"] != var] + [{"name": var, "value": value}]
    return change


def _rename_env(old: str, new: str) -> Callable[[dict], None]:
    def change(c: dict) -> None:
        for e in c["env"]:
            if e["name"] == old:
                e["name"] = new
    return change


def _replace_arg(prefix: str, new: str | None) -> Callable[[dict], None]:
    def change(c: dict) -> None:
        c["args"] = [a for a in c["args"] if not a.startswith(prefix)] + ([new] if new else [])
    return change


def _move_namespace(objs: list[dict]) -> None:
    find(objs, "Deployment", names.CSI_CONTROLLER)["metadata"]["namespace"] = "kv-l2"
    _edit_container("Deployment", names.CSI_CONTROLLER, "csi-plugin", _drop_env("KUBERNETES_NAMESPACE"))(objs)


def _drop_rule(kind: str, name: str, resource: str, verb: str) -> Callable[[list[dict]], None]:
    def edit(objs: list[dict]) -> None:
        for rule in find(objs, kind, name)["rules"]:
            if resource in rule["resources"]:
                rule["verbs"] = [v for v in rule["verbs"] if v != verb]
    return edit


def _no_token(objs: list[dict]) -> None:
    pod_spec(find(objs, "Deployment", names.CSI_CONTROLLER))["automountServiceAccountToken"] = False


def _no_propagation(objs: list[dict]) -> None:
    plugin = container(find(objs, "DaemonSet", names.CSI_NODE), "csi-plugin")
    for m in plugin["volumeMounts"]:
        m.pop("mountPropagation", None)


def _two_provisioners(objs: list[dict]) -> None:
    find(objs, "Deployment", names.CSI_CONTROLLER)["spec"]["replicas"] = 2


def _namespace_baseline(objs: list[dict]) -> None:
    find(objs, "Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] = "baseline"


def _probe_port(objs: list[dict]) -> None:
    plugin = container(find(objs, "DaemonSet", names.CSI_NODE), "csi-plugin")
    plugin["ports"] = [{"name": "healthz", "containerPort": 9808, "protocol": "TCP"}]


_CTRL, _NODE = ("Deployment", names.CSI_CONTROLLER), ("DaemonSet", names.CSI_NODE)
CSI_MUTATIONS = {
    "controller without MOUNT_MODE": (_edit_container(*_CTRL, "csi-plugin", _drop_env("MOUNT_MODE")),
                                      "without STANDALONE_SERVICE_ACCOUNT"),
    "controller MOUNT_MODE misspelt": (_edit_container(*_CTRL, "csi-plugin", _set_env("MOUNT_MODE", "Embedded")),
                                       "MOUNT_MODE 'Embedded'"),
    "variable name misspelt": (_edit_container(*_NODE, "csi-plugin", _rename_env("STANDALONE_IMAGE", "STANDALONE_IMG")),
                               "STANDALONE_IMG is read by neither"),
    "FUSE image not the plugin's": (_edit_container(*_NODE, "csi-plugin", _set_env(
        "STANDALONE_IMAGE", "ghcr.io/curvineio/curvine-csi:latest")), "pull with policy Never"),
    "FUSE pods' account absent": (_edit_container(*_NODE, "csi-plugin", _set_env(
        "STANDALONE_SERVICE_ACCOUNT", "curvine-csi-node-sa")), "is no ServiceAccount"),
    "FUSE resources not quantities": (_edit_container(*_NODE, "csi-plugin", _set_env(
        "STANDALONE_MEMORY_LIMIT", "2 GiB")), "is no quantity"),
    "standalone variable on the embedded controller": (_edit_container(*_CTRL, "csi-plugin", _set_env(
        "STANDALONE_CPU_LIMIT", "2")), "read only in ['standalone'] mode"),
    "namespace not passed": (_move_namespace, "is not the pod's 'kv-l2'"),
    "unknown driver flag": (_edit_container(*_CTRL, "csi-plugin", _replace_arg("--v=", "--v=5")),
                            "curvine-csi: --v is not a flag"),
    "no node id": (_edit_container(*_NODE, "csi-plugin", _replace_arg("--nodeid", None)), "--nodeid is required"),
    "undefined variable in args": (_edit_container(*_NODE, "csi-plugin", _drop_env("NODE_NAME")),
                                   "$(NODE_NAME) is not defined"),
    "no service-account token": (_no_token, "rest.InClusterConfig fails"),
    "node plugin may not watch PVs": (_drop_rule("ClusterRole", names.CSI_NODE, "persistentvolumes", "watch"),
                                      "may not watch persistentvolumes"),
    "node plugin may not create FUSE pods": (_drop_rule("Role", names.CSI_NODE, "pods", "create"),
                                             "may not create pods in curvine"),
    "provisioner may not watch VolumeAttachments": (
        _drop_rule("ClusterRole", names.CSI_CONTROLLER, "volumeattachments", "watch"),
        "may not watch volumeattachments"),
    "deprecated livenessprobe flag": (_edit_container(*_NODE, "liveness-probe", _replace_arg(
        "--http-endpoint", "--health-port=9909")), "livenessprobe: --health-port is deprecated"),
    "provisioner flag of another release": (_edit_container(*_CTRL, "csi-provisioner", _replace_arg(
        "--v=", "--leader-election-type=leases")), "csi-provisioner: --leader-election-type is not a flag"),
    "registrar without its node path": (_edit_container(*_NODE, "node-driver-registrar", _replace_arg(
        "--kubelet-registration-path", None)), "--kubelet-registration-path is required"),
    "registrar registers another path": (_edit_container(*_NODE, "node-driver-registrar", _set_env(
        "DRIVER_REG_SOCK_PATH", "/var/lib/kubelet/plugins/curvine/csi.sock")), "is not the node path"),
    "sidecar on another socket": (_edit_container(*_CTRL, "csi-provisioner", _set_env("ADDRESS", "/run/csi/socket")),
                                  "is not the driver's socket"),
    "probe not on the sidecar's port": (_probe_port, "is not the sidecar's /healthz:9909"),
    "two provisioners without leader election": (_two_provisioners, "without --leader-election"),
    "FUSE mounts not propagated": (_no_propagation, "Bidirectional mount"),
    "namespace refuses the FUSE pods": (_namespace_baseline, "not 'privileged'"),
}


@pytest.mark.parametrize("mutation", CSI_MUTATIONS, ids=list(CSI_MUTATIONS))
def test_the_csi_checks_find_each_drift(curvine, mutation):
    edit, expected = CSI_MUTATIONS[mutation]
    objs = copy.deepcopy(curvine)
    edit(objs)
    problems = csi_problems(objs)
    assert any(expected in p for p in problems), problems


def _master_host(objs: list[dict]) -> None:
    _edit_container("StatefulSet", names.CURVINE_MASTER, "master",
                    _set_env("CURVINE_MASTER_HOSTNAME", "curvine-master-0"))(objs)


def _worker_port(objs: list[dict]) -> None:
    worker = container(find(objs, "DaemonSet", names.CURVINE_WORKER), "worker")
    worker["ports"][0]["containerPort"] = 8998


SERVER_MUTATIONS = {
    "unknown server flag": (_edit_container("DaemonSet", names.CURVINE_WORKER, "worker",
                                            lambda c: c["args"].append("--log-level=warn")),
                            "curvine-server: --log-level is not a flag"),
    "no config": (_edit_container("DaemonSet", names.CURVINE_WORKER, "worker",
                                  lambda c: c.update(args=c["args"][:2])), "--conf is required"),
    "master not a journal peer": (_master_host, "refuses to start"),
    "port not the config's": (_worker_port, "are not the ports the config binds"),
    "variable no server reads": (_edit_container("DaemonSet", names.CURVINE_WORKER, "worker",
                                                 _rename_env("CURVINE_WORKER_HOSTNAME", "CURVINE_WORKER_HOST")),
                                 "CURVINE_WORKER_HOST is read by neither"),
    "entrypoint's directory lost": (_edit_container("StatefulSet", names.CURVINE_MASTER, "master",
                                                    lambda c: c.pop("workingDir")), "workingDir None"),
}


@pytest.mark.parametrize("mutation", SERVER_MUTATIONS, ids=list(SERVER_MUTATIONS))
def test_the_server_checks_find_each_drift(curvine, mutation):
    edit, expected = SERVER_MUTATIONS[mutation]
    objs = copy.deepcopy(curvine)
    edit(objs)
    problems = server_problems(objs)
    assert any(expected in p for p in problems), problems


KYVERNO_MUTATIONS = {
    "misspelt key": (lambda v: v.update(admissionControler={"replicas": 3}), "admissionControler: not a key"),
    "wrong type": (lambda v: v["admissionController"].update(replicas="3"), "str, the chart's is int"),
    "PDB both ways": (lambda v: v["admissionController"]["podDisruptionBudget"].update(maxUnavailable=1),
                      "the render fails"),
    "reports nobody deletes": (lambda v: v.pop("features"), "nothing deletes"),
    "webhook config Kyverno cannot parse": (lambda v: v["config"]["webhooks"].update(namespaceSelectors={}),
                                            "not a WebhookConfig"),
    "bad selector": (lambda v: v["config"]["webhooks"]["namespaceSelector"]["matchExpressions"].append(
        {"key": "x", "operator": "Exists", "values": ["y"]}), "bad expression"),
}


@pytest.mark.parametrize("mutation", KYVERNO_MUTATIONS, ids=list(KYVERNO_MUTATIONS))
def test_the_kyverno_checks_find_each_drift(mutation):
    edit, expected = KYVERNO_MUTATIONS[mutation]
    values = copy.deepcopy(kyverno_helm_values())
    edit(values)
    problems = kyverno_problems(values)
    assert any(expected in p for p in problems), problems


DCGM_MUTATIONS = {
    "misspelt key": (lambda v: v.update(serviceMonitor={"enable": False}), "serviceMonitor.enable: not a key"),
    "a key the platform never read": (lambda v: v.update(extraVolumeMounts=[]), "extraVolumeMounts: not a key"),
    "counters file elsewhere": (lambda v: v.update(arguments=["-f", "/etc/dcgm-exporter/dcp-metrics-included.csv"]),
                                "do not read /etc/dcgm-exporter/default-counters.csv"),
    "not a security context field": (lambda v: v["securityContext"].update(privilege=False),
                                     "securityContext.privilege: not a SecurityContext field"),
}


@pytest.mark.parametrize("mutation", DCGM_MUTATIONS, ids=list(DCGM_MUTATIONS))
def test_the_dcgm_checks_find_each_drift(k8s_project, mutation):
    edit, expected = DCGM_MUTATIONS[mutation]
    values = copy.deepcopy(dcgm_exporter_values(k8s_project.platform))
    edit(values)
    problems = dcgm_problems(values)
    assert any(expected in p for p in problems), problems


def test_the_addon_checks_find_each_drift(k8s_project):
    configuration = placeholder_addon_configuration(k8s_project.platform)
    undeclared = copy.deepcopy(configuration)
    undeclared["alb"]["clusterName"] = "kvcache"
    assert any("alb.clusterName: not declared" in p for p in addon_problems(undeclared))
    from dataclasses import replace

    overclaimed = [replace(k, opt_in=None) if k.path == "alb.ingressClassParams.spec.scheme" else k
                   for k in INFERENCE_ADDON_KEYS]
    with_scheme = copy.deepcopy(configuration)
    with_scheme["alb"]["ingressClassParams"] = {"spec": {"scheme": "public"}}
    problems = addon_problems(with_scheme, overclaimed)
    assert any("marked verified, but AWS neither sends nor documents it" in p for p in problems), problems
    assert any("'public' is not a scheme" in p for p in problems), problems


# === deliberate deviations =========================================================================

def _sidecars(curvine: list[dict]) -> list[dict]:
    return [c for kind, name in CSI_PODS for c in pod_spec(find(curvine, kind, name))["containers"]
            if c["name"] != "csi-plugin"]


def _rules(curvine: list[dict]) -> list[dict]:
    return [r for o in curvine if o["kind"] in ("Role", "ClusterRole") for r in o["rules"]]


def _toml(curvine: list[dict]) -> dict:
    return tomllib.loads(find(curvine, "ConfigMap", names.CURVINE_CONFIG_MAP)["data"][names.CURVINE_CONFIG_FILE])


def _plugin(curvine, pod) -> dict:
    return container(find(curvine, *pod), "csi-plugin")


def _plugin_env(curvine, pod) -> dict[str, str]:
    return resolved_env(find(curvine, *pod), _plugin(curvine, pod))


#: Deviation id -> "the rendering still deviates so" (docs/sources.md §23 table).
DEVIATION_HOLDS: dict[str, Callable[[list[dict], Any], bool]] = {
    "pinned-images": lambda cv, p: all(
        image_parts(c["image"])[1] not in (None, "latest") and c.get("imagePullPolicy") != "Always"
        for o in cv if o["kind"] in WORKLOADS for c in containers(o))
    and _plugin_env(cv, _NODE)["STANDALONE_IMAGE"] == p.platform.versions.images.curvine_csi,
    "sidecar-versions": lambda cv, p: {image_parts(c["image"])[1] for c in _sidecars(cv)} == {
        s.tag for s in up.SIDECARS.values()},
    "no-attacher": lambda cv, p: "csi-attacher" not in {c["name"] for c in _sidecars(cv)}
    and find(cv, "CSIDriver")["spec"]["attachRequired"] is False,
    "controller-unprivileged": lambda cv, p: _plugin(cv, _CTRL)["securityContext"]["privileged"] is False
    and _plugin(cv, _CTRL)["securityContext"]["capabilities"] == {"drop": ["ALL"]},
    "controller-rbac": lambda cv, p: all(
        set(r["verbs"]) == {"get", "list", "watch"} for r in find(cv, "ClusterRole", names.CSI_CONTROLLER)["rules"]
        if "volumeattachments" in r["resources"])
    and not any("volumeattachments/status" in r["resources"] for r in _rules(cv)),
    "node-rbac-namespaced": lambda cv, p: {r for rule in find(cv, "ClusterRole", names.CSI_NODE)["rules"]
                                           for r in rule["resources"]} == {"persistentvolumes", "events"}
    and {r for rule in find(cv, "Role", names.CSI_NODE)["rules"] for r in rule["resources"]} == {"pods", "configmaps"},
    "no-secrets": lambda cv, p: not any("secrets" in r["resources"] for r in _rules(cv)),
    "provisioner-flags": lambda cv, p: {"--timeout=300s", "--v=2"} <= set(
        container(find(cv, *_CTRL), "csi-provisioner")["args"]),
    "livenessprobe-endpoint": lambda cv, p: all(
        f"--http-endpoint=:{CSI_HEALTH_PORT}" in container(find(cv, *pod), "liveness-probe")["args"] for pod in CSI_PODS),
    "registrar-flags": lambda cv, p: "--v=2" in container(find(cv, *_NODE), "node-driver-registrar")["args"],
    "plugin-dir": lambda cv, p: volume(find(cv, *_NODE), "plugin-dir")["hostPath"]["path"]
    == "/var/lib/kubelet/csi-plugins/csi.curvine.io/",
    "csi-own-config": lambda cv, p: all(
        config_map_file(cv, find(cv, *pod), _plugin(cv, pod), up.CSI_DRIVER_ENV["FUSE_CONF_PATH"].default) is not None
        and "CURVINE_CONF_FILE" in _plugin_env(cv, pod) for pod in CSI_PODS),
    "fuse-resources": lambda cv, p: (lambda e: e["STANDALONE_CPU_REQUEST"] == e["STANDALONE_CPU_LIMIT"]
                                     and e["STANDALONE_MEMORY_REQUEST"] == e["STANDALONE_MEMORY_LIMIT"])(
        _plugin_env(cv, _NODE)),
    "fuse-account": lambda cv, p: _plugin_env(cv, _NODE)["STANDALONE_SERVICE_ACCOUNT"] == "curvine-fuse"
    and find(cv, "ServiceAccount", "curvine-fuse")["automountServiceAccountToken"] is False
    and any(o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"] == "curvine-csi-node-limits" for o in cv),
    "csidriver-fields": lambda cv, p: find(cv, "CSIDriver")["spec"]["volumeLifecycleModes"] == ["Persistent"]
    and find(cv, "CSIDriver")["spec"]["fsGroupPolicy"] == "None",
    "sidecars-restricted": lambda cv, p: all(
        c["securityContext"]["allowPrivilegeEscalation"] is False and c["resources"]["requests"] for c in _sidecars(cv)),
    "controller-placement": lambda cv, p: "tolerations" not in pod_spec(find(cv, *_CTRL))
    and "preferredDuringSchedulingIgnoredDuringExecution" in pod_spec(find(cv, *_CTRL))["affinity"]["nodeAffinity"],
    "servers-direct": lambda cv, p: all(
        server_argv(container(find(cv, k, n), c))[0] == up.CURVINE_SERVER
        for k, n, c in (("StatefulSet", names.CURVINE_MASTER, "master"), ("DaemonSet", names.CURVINE_WORKER, "worker"))),
    "worker-unprivileged": lambda cv, p: container(find(cv, "DaemonSet", names.CURVINE_WORKER), "worker")[
        "securityContext"]["privileged"] is False,
    "server-ports": lambda cv, p: (_toml(cv)["master"]["web_port"], _toml(cv)["worker"]["web_port"],
                                   _toml(cv)["fuse"]["web_port"]) == (9001, 9002, 9003),
    "kyverno-controllers-off": lambda cv, p: (lambda v: not any(
        v[c]["enabled"] for c in ("cleanupController", "reportsController")) and v["backgroundController"]["enabled"]
        and v["features"]["admissionReports"]["enabled"] is False)(kyverno_helm_values()),
    "kyverno-webhook-scope": lambda cv, p: (lambda v: {"key": "kvcache.io/business-line", "operator": "Exists"} in
                                            v["config"]["webhooks"]["namespaceSelector"]["matchExpressions"]
                                            and v["admissionController"]["replicas"] == 3
                                            and v["admissionController"]["podDisruptionBudget"]["enabled"])(
        kyverno_helm_values()),
    "dcgm-least": lambda cv, p: (lambda v: v["securityContext"]["capabilities"]["add"] == []
                                 and v["serviceMonitor"]["enabled"] is False and bool(v["customMetrics"]))(
        dcgm_exporter_values(p.platform)),
    "alb-keys": lambda cv, p: "jumpstartGatedModelDownloadRoleArn" not in placeholder_addon_configuration(p.platform),
}


def test_every_deviation_has_a_check():
    assert {d.id for d in up.DEVIATIONS} == set(DEVIATION_HOLDS)
    assert len({d.id for d in up.DEVIATIONS}) == len(up.DEVIATIONS)


@pytest.mark.parametrize("deviation", [d.id for d in up.DEVIATIONS])
def test_each_listed_deviation_still_holds(curvine, k8s_project, deviation):
    """A row of the deviations table that the rendering no longer shows is stale: drop or fix it."""
    assert DEVIATION_HOLDS[deviation](curvine, k8s_project)


# === docs/sources.md §23 ===========================================================================

SECTION_HEADING = "## §23 Third-party containers against their upstream"
_CITE = re.compile(r"(?P<repo>[\w.-]+/[\w.-]+)@(?P<tag>[\w.-]+) \((?P<commit>[0-9a-f]{8})\) (?P<path>\S+) l\.")


@pytest.fixture(scope="module")
def section() -> str:
    text = (REPO / "docs" / "sources.md").read_text(encoding="utf-8")
    assert SECTION_HEADING in text
    body = text.split(SECTION_HEADING, 1)[1]
    return body.split("\n## ", 1)[0]


def _citations() -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for value in vars(up).values():
        texts: list[str] = []
        if isinstance(value, str):
            texts = [value]
        elif isinstance(value, dict):
            texts = [getattr(v, "cite", v) for v in value.values() if isinstance(getattr(v, "cite", v), str)]
        elif isinstance(value, tuple):
            texts = [getattr(v, "cite", "") for v in value]
        elif hasattr(value, "cite"):
            texts = [value.cite]
        for text in texts:
            found |= {(m["repo"], m["path"].rstrip(";,")) for m in _CITE.finditer(text)}
    return found


def test_the_sources_section_names_every_tree_and_file_the_facts_cite(section):
    for ref in up.REFS:
        assert ref.repo in section and ref.tag in section and ref.commit[:8] in section, ref
    missing = sorted(path for _, path in _citations() if path not in section)
    assert missing == []


def test_the_sources_section_lists_every_deviation(section):
    table = section.split("### Deliberate deviations", 1)[1].split("\n### ", 1)[0]
    rows = {m.group(1) for m in re.finditer(r"^\| `([a-z0-9-]+)` \|", table, re.M)}
    assert rows == {d.id for d in up.DEVIATIONS}
    assert "### Curvine v0.4.1: what moving would fix or break" in section
