"""A model of Pod Security admission's ``baseline`` level at Kubernetes 1.34, for the tests.

This is a model, not the real checker. The real one is the Go library
``k8s.io/pod-security-admission`` (the API server's PodSecurity admission plugin; Kyverno's
``podSecurity`` rule runs a fork of it); neither runs here, and nothing on PyPI implements it.
So this module restates, check by check, the baseline checks of that library at ``v0.34.9``
(the release for Kubernetes 1.34, the version the line namespaces pin with
``pod-security.kubernetes.io/enforce-version``), ``policy/check_*.go``, which implement the
"Pod Security Standards" page's Baseline table (docs/sources.md §9). Each violation is
formatted as the library formats it, ``<reason> (<detail>)``, in its order (check IDs sorted),
so a test compares with what the API server answers::

    pods "x" is forbidden: violates PodSecurity "baseline:v1.34": hostPath volumes (volume "host-shm")

Covered (every baseline check of v0.34.9): ``appArmorProfile``, ``capabilities_baseline``,
``hostNamespaces``, ``hostPathVolumes``, ``hostPorts``, ``hostProbesAndHostLifecycle`` (new in
1.34: ``host`` in probes and lifecycle handlers), ``privileged``, ``procMount``,
``seLinuxOptions`` (1.31+ types), ``seccompProfile_baseline`` (1.19+ fields), ``sysctls``
(1.32+ safe set), ``windowsHostProcess``; init, regular and ephemeral containers alike.

Not covered: the ``restricted`` level (the line namespaces only warn and audit it); the
pre-1.19 seccomp annotations; the ``procMount`` relaxation for ``hostUsers: false`` Pods (an
opt-in that only loosens); exemptions from the admission configuration (usernames, runtime
classes, namespaces); checks of later versions, hence :data:`KUBERNETES_VERSION` and the test
that pins it to the cluster's version (between v0.33.13 and v0.34.9 the library's ``policy/``
changed only by adding ``check_hostProbesAndhostLifecycle.go``, read for the check below). Exact message text beyond what the library's own test cases
show (Go's ``%q`` escaping of unusual characters) is not reproduced.
"""

from __future__ import annotations

from typing import Any, Callable, Final, Iterator

#: The Kubernetes minor version whose checks this module states (k8s.io/pod-security-admission v0.34.9).
KUBERNETES_VERSION: Final = "1.34"

#: ``capabilities_baseline``: capabilities a container may add.
BASELINE_CAPABILITIES: Final = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
#: ``sysctls``: the safe set from 1.32 on (1.27 added ip_local_reserved_ports, 1.29 the tcp_keepalive_*
#: and tcp_fin_timeout, 1.32 tcp_rmem / tcp_wmem).
SAFE_SYSCTLS: Final = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start", "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem"})
#: ``seLinuxOptions``: allowed types from 1.31 on (user and role must stay unset).
SELINUX_TYPES: Final = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
#: ``appArmorProfile`` and ``seccompProfile_baseline``: allowed profile types.
PROFILE_TYPES: Final = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_ANNOTATION_PREFIX: Final = "container.apparmor.security.beta.kubernetes.io/"


def _quote(items: list[str]) -> str:
    return ", ".join(f'"{i}"' for i in items)


def _plural(singular: str, plural: str, n: int) -> str:
    return singular if n == 1 else plural


def _containers(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Init, regular, then ephemeral containers (``visitContainers``)."""
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(kind) or []


def _sc(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("securityContext") or {}


def _containers_phrase(names: list[str]) -> str:
    return f"{_plural('container', 'containers', len(names))} {_quote(names)}"


def _bad_containers(spec: dict[str, Any], bad: Callable[[dict[str, Any]], bool]) -> list[str]:
    return [c["name"] for c in _containers(spec) if bad(c)]


def _bad_profiles(spec: dict[str, Any], field: str) -> tuple[list[str], set[str]]:
    """Who sets ``securityContext.<field>.type`` outside :data:`PROFILE_TYPES` ("pod", "containers
    ...") and the values they set (``appArmorProfile`` and ``seccompProfile`` share the rule)."""
    setters, values = [], set()
    pod_profile = _sc(spec).get(field)
    if pod_profile is not None and pod_profile.get("type") not in PROFILE_TYPES:
        setters.append("pod")
        values.add(pod_profile.get("type", ""))
    bad = []
    for c in _containers(spec):
        profile = _sc(c).get(field)
        if profile is not None and profile.get("type") not in PROFILE_TYPES:
            bad.append(c["name"])
            values.add(profile.get("type", ""))
    if bad:
        setters.append(_containers_phrase(bad))
    return setters, values


def _app_armor(meta: dict[str, Any], spec: dict[str, Any]) -> tuple[str, str] | None:
    setters, values = _bad_profiles(spec, "appArmorProfile")
    annotations = sorted(f'{k}="{v}"' for k, v in (meta.get("annotations") or {}).items()
                         if k.startswith(APPARMOR_ANNOTATION_PREFIX)
                         and not (v == "" or v == "runtime/default" or v.startswith("localhost/")))
    value_list = sorted(values) + annotations
    if annotations:
        setters.append(_plural("annotation", "annotations", len(annotations)))
    if not setters:
        return None
    return (_plural("forbidden AppArmor profile", "forbidden AppArmor profiles", len(value_list)),
            f"{' and '.join(setters)} must not set AppArmor profile type to {_quote(value_list)}")


def _capabilities(meta: dict[str, Any], spec: dict[str, Any]) -> tuple[str, str] | None:
    extra: set[str] = set()
    bad = []
    for c in _containers(spec):
        added = set((_sc(c).get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES
        if added:
            bad.append(c["name"])
            extra |= added
    if not bad:
        return None
    return ("non-default capabilities",
            f"{_containers_phrase(bad)} must not include {_quote(sorted(extra))} in securityContext.capabilities.add")


def _host_namespaces(meta: dict[str, Any], spec: dict[str, Any]) -> tuple[str, str] | None:
    shared = [f"{key}=true" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    return ("host namespaces", ", ".join(shared)) if shared else None


def _host_path_volumes(meta: dict[str, Any], spec: dict[str, Any]) -> tuple[str, str] | None:
    names = [v["name"] for v in spec.get("volumes") or [] if v.get("hostPath") is not None]
    return ("hostPath volumes", f"{_plural('volume', 'volumes', len(names))} {_quote(names)}") if names else None


def _host_ports(meta: dict[str, Any], spec: dict[str, Any]) -> tuple[str, str] | None:
    ports: set[str] = set()
    bad = []
    for c in _containers(spec):
        used = {str(p["hostPort"]) for p in c.get("ports") or [] if p.get("hostPort")}
        if used:
            bad.append(c["name"])
            ports |= used
    if not bad:
        return None
    return ("hostPort", f"{_containers_phrase(bad)} {_plural('uses', 'use', len(bad))} "
                        f"{_plural('hostPort', 'hostPorts', len(ports))} {', '.join(sorted(ports))}")


def _host_probes_and_lifecycle(meta: dict[str, Any], spec: dict[str, Any]) -> tuple[str, str] | None:
    """``hostProbesAndHostLifecycle`` (1.34+): ``host`` of an httpGet/tcpSocket probe or lifecycle handler."""
    hosts: set[str] = set()
    bad = []
    for c in _containers(spec):
        handlers = [c.get(p) for p in ("livenessProbe", "readinessProbe", "startupProbe")]
        handlers += [(c.get("lifecycle") or {}).get(h) for h in ("postStart", "preStop")]
        used = {(h.get(kind) or {}).get("host") for h in handlers if h for kind in ("httpGet", "tcpSocket")} - {None, ""}
        if used:
            bad.append(c["name"])
            hosts |= used
    if not bad:
        return None
    names = sorted(set(bad))
    return ("probe or lifecycle host", f"{_containers_phrase(names)} {_plural('uses', 'use', len(names))} "
                                       f"{_plural('probe or lifecycle host', 'probe or lifecycle hosts', len(hosts))} "
                                       f"{_quote(sorted(hosts))}")


def _privileged(meta: dict[str, Any], spec: dict[str, Any]) -> tuple[str, str] | None:
    bad = _bad_containers(spec, lambda c: _sc(c).get("privileged") is True)
    return ("privileged", f"{_containers_phrase(bad)} must not set securityContext.privileged=true") if bad else None


def _proc_mount(meta: dict[str, Any], spec: dict[str, Any]) -> tuple[str, str] | None:
    types = {_sc(c)["procMount"] for c in _containers(spec) if _sc(c).get("procMount") not in (None, "Default")}
    bad = _bad_containers(spec, lambda c: _sc(c).get("procMount") not in (None, "Default"))
    if not bad:
        return None
    return ("procMount", f"{_containers_phrase(bad)} must not set securityContext.procMount to {_quote(sorted(types))}")


def _se_linux(meta: dict[str, Any], spec: dict[str, Any]) -> tuple[str, str] | None:
    bad_types: set[str] = set()
    flags = {"user": False, "role": False}

    def invalid(opts: dict[str, Any]) -> bool:
        wrong = False
        if opts.get("type", "") not in SELINUX_TYPES:
            bad_types.add(opts["type"])
            wrong = True
        for key in flags:
            if opts.get(key):
                flags[key] = wrong = True
        return wrong

    setters = []
    pod_opts = _sc(spec).get("seLinuxOptions")
    if pod_opts is not None and invalid(pod_opts):
        setters.append("pod")
    bad = [c["name"] for c in _containers(spec)
           if _sc(c).get("seLinuxOptions") is not None and invalid(_sc(c)["seLinuxOptions"])]
    if bad:
        setters.append(_containers_phrase(bad))
    if not setters:
        return None
    data = [f"{_plural('type', 'types', len(bad_types))} {_quote(sorted(bad_types))}"] if bad_types else []
    data += [f"{key} may not be set" for key, seen in flags.items() if seen]
    return ("seLinuxOptions", f"{' and '.join(setters)} set forbidden securityContext.seLinuxOptions: {'; '.join(data)}")


def _seccomp(meta: dict[str, Any], spec: dict[str, Any]) -> tuple[str, str] | None:
    setters, values = _bad_profiles(spec, "seccompProfile")
    if not setters:
        return None
    return ("seccompProfile",
            f"{' and '.join(setters)} must not set securityContext.seccompProfile.type to {_quote(sorted(values))}")


def _sysctls(meta: dict[str, Any], spec: dict[str, Any]) -> tuple[str, str] | None:
    bad = [s["name"] for s in _sc(spec).get("sysctls") or [] if s["name"] not in SAFE_SYSCTLS]
    return ("forbidden sysctls", ", ".join(bad)) if bad else None


def _windows_host_process(meta: dict[str, Any], spec: dict[str, Any]) -> tuple[str, str] | None:
    setters = ["pod"] if (_sc(spec).get("windowsOptions") or {}).get("hostProcess") is True else []
    bad = _bad_containers(spec, lambda c: (_sc(c).get("windowsOptions") or {}).get("hostProcess") is True)
    if bad:
        setters.append(_containers_phrase(bad))
    if not setters:
        return None
    return ("hostProcess", f"{' and '.join(setters)} must not set securityContext.windowsOptions.hostProcess=true")


#: The baseline checks in the library's order (check IDs sorted).
CHECKS: Final = (
    ("appArmorProfile", _app_armor),
    ("capabilities_baseline", _capabilities),
    ("hostNamespaces", _host_namespaces),
    ("hostPathVolumes", _host_path_volumes),
    ("hostPorts", _host_ports),
    ("hostProbesAndHostLifecycle", _host_probes_and_lifecycle),
    ("privileged", _privileged),
    ("procMount", _proc_mount),
    ("seLinuxOptions", _se_linux),
    ("seccompProfile_baseline", _seccomp),
    ("sysctls", _sysctls),
    ("windowsHostProcess", _windows_host_process),
)


def baseline_violations(pod_spec: dict[str, Any], metadata: dict[str, Any] | None = None, *,
                        version: str = KUBERNETES_VERSION) -> list[str]:
    """Each baseline violation of a Pod, as ``"<reason> (<detail>)"``; empty when admitted.

    Args:
        pod_spec: the Pod's ``spec`` (or a workload's pod template spec), a Kubernetes dict.
        metadata: the Pod's ``metadata`` (only its AppArmor annotations are read).
        version: the ``enforce-version``; only :data:`KUBERNETES_VERSION` is modelled.

    Raises:
        ValueError: another version (its checks must be read again at that tag first).
    """
    if version != KUBERNETES_VERSION:
        raise ValueError(f"baseline checks are modelled for Kubernetes {KUBERNETES_VERSION} only, not {version}")
    out = []
    for _, check in CHECKS:
        hit = check(metadata or {}, pod_spec)
        if hit:
            reason, detail = hit
            out.append(f"{reason} ({detail})" if detail else reason)
    return out


def forbidden_message(pod_name: str, violations: list[str], *, version: str = KUBERNETES_VERSION) -> str:
    """The API server's answer to a Pod CREATE that ``baseline`` refuses (``admission.go``
    ``EvaluatePod``: ``violates PodSecurity %q: %s``), as shown in a ReplicaSet's FailedCreate event."""
    return f'pods "{pod_name}" is forbidden: violates PodSecurity "baseline:v{version}": {", ".join(violations)}'
