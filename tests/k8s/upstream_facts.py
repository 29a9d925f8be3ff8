"""What each third-party program the platform renders or configures needs, read at the pinned tag.

Facts only: names, defaults, flags, API calls, chart keys, each with the upstream file and lines it
was read from (``Ref.at``). Nothing here is fetched or parsed at test time; the facts were read from
bare clones of the upstream repositories at the tags below and written down by hand
(docs/sources.md §23 lists the same facts). When a pin in ``config/platform.yaml`` moves, the tag
here no longer matches and ``tests/k8s/test_k8s_upstream.py`` fails until the facts are re-read at
the new tag.

Upstream code is not copied: a fact is the smallest statement a check needs (a flag name, a
default, a verb), with its citation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final


@dataclass(frozen=True)
class Ref:
    """One upstream tree at a pinned tag."""

    repo: str
    tag: str
    commit: str

    def at(self, path: str, lines: str) -> str:
        """``repo@tag (commit[:8]) path l.lines``: the citation of one fact."""
        return f"{self.repo}@{self.tag} ({self.commit[:8]}) {path} l.{lines}"


CURVINE: Final = Ref("CurvineIO/curvine", "v0.3.2-alpha", "f40ca6ff7fbc985b15e7a3f3079516d244f10a62")
#: Newest release, read for docs/sources.md §23 "Curvine v0.4.1" (not the pin).
CURVINE_041: Final = Ref("CurvineIO/curvine", "v0.4.1", "709f24781f35a0ea8dda01b12212ede007712498")
PROVISIONER: Final = Ref("kubernetes-csi/external-provisioner", "v5.2.0", "12a344a40072d655cb9374a93483305f1a1be557")
REGISTRAR: Final = Ref("kubernetes-csi/node-driver-registrar", "v2.13.0", "9b41324b20f609bce4dda9e50cc484c4ef4f5949")
LIVENESSPROBE: Final = Ref("kubernetes-csi/livenessprobe", "v2.15.0", "5022ba7d587840cd84abd3706c610754ccdb3d4d")
KYVERNO: Final = Ref("kyverno/kyverno", "kyverno-chart-3.5.2", "f4ffc2d43d2d93b3daf3e5a9cb8a5d42738aba4b")
#: The same commit as the chart tag (chart 3.5.2 = appVersion v1.15.2).
KYVERNO_APP: Final = Ref("kyverno/kyverno", "v1.15.2", "f4ffc2d43d2d93b3daf3e5a9cb8a5d42738aba4b")
DCGM: Final = Ref("NVIDIA/dcgm-exporter", "4.5.3-4.8.2", "691c92762eb551313c825f6efe4ceeee20982801")
HYPERPOD_CLI: Final = Ref("aws/sagemaker-hyperpod-cli", "011ca927", "011ca927123e02b35a399935bbb3ab1905fe33c7")
LBC: Final = Ref("kubernetes-sigs/aws-load-balancer-controller", "v2.13.2", "ac0e1ffc76adfb6af8342534f13f178a24b65e92")

#: Every pinned tree (docs/sources.md §23 names each).
REFS: Final = (CURVINE, CURVINE_041, PROVISIONER, REGISTRAR, LIVENESSPROBE, KYVERNO, KYVERNO_APP, DCGM,
               HYPERPOD_CLI, LBC)


# --- command lines ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Flags:
    """The command-line flags a program registers. Go's ``flag`` (and pflag) and Rust's clap refuse an
    unknown flag and exit, so nothing outside :attr:`names` may be passed.

    Attributes:
        program: what runs.
        names: every flag name (without dashes) the program accepts.
        deprecated: flags still accepted but marked deprecated at this tag.
        required: flags without which the program exits.
        cite: where they are registered.
    """

    program: str
    names: frozenset[str]
    deprecated: frozenset[str] = frozenset()
    required: frozenset[str] = frozenset()
    cite: str = ""


#: k8s.io/component-base ``logsapi.AddFlags``/``AddGoFlags`` (vendored identically by the three
#: sidecars at their pins), which each sidecar's ``main`` calls before ``flag.Parse``. The two JSON
#: flags are registered only when the JSON format is linked in (l.373-378), so they are left out.
LOGSAPI_FLAGS: Final = frozenset({"logging-format", "log-flush-frequency", "v", "vmodule", "log-text-split-stream",
                                  "log-text-info-buffer-size"})
LOGSAPI_CITE: Final = REGISTRAR.at("vendor/k8s.io/component-base/logs/api/v1/options.go", "54, 360-379")

#: ``curvine-csi`` (``/opt/curvine/csi``): Go's standard ``flag`` package; ``klog.InitFlags`` is never
#: called, so not even ``--v`` exists. ``--nodeid`` empty: ``klog.Fatalln("nodeID must be provided")``.
CSI_DRIVER_FLAGS: Final = Flags(
    "curvine-csi", frozenset({"endpoint", "nodeid", "version", "version-json"}), required=frozenset({"nodeid"}),
    cite=CURVINE.at("curvine-csi/main.go", "27-35, 48-50"))
#: ``external-provisioner`` v5.2.0 (pflag; ``--timeout`` default 10s, ``--leader-election`` false).
PROVISIONER_FLAGS: Final = Flags(
    "csi-provisioner", frozenset({
        "master", "kubeconfig", "csi-address", "volume-name-prefix", "volume-name-uuid-length", "version",
        "retry-interval-start", "retry-interval-max", "worker-threads", "cloning-protection-threads",
        "capacity-threads", "timeout", "leader-election", "leader-election-namespace", "strict-topology",
        "immediate-topology", "extra-create-metadata", "metrics-address", "http-endpoint", "metrics-path",
        "enable-pprof", "leader-election-lease-duration", "leader-election-renew-deadline",
        "leader-election-retry-period", "default-fstype", "kube-api-qps", "kube-api-burst", "kube-api-capacity-qps",
        "kube-api-capacity-burst", "enable-capacity", "capacity-for-immediate-binding", "capacity-poll-interval",
        "capacity-ownerref-level", "node-deployment", "node-deployment-immediate-binding",
        "node-deployment-base-delay", "node-deployment-max-delay", "controller-publish-readonly",
        "prevent-volume-mode-conversion", "feature-gates"}) | LOGSAPI_FLAGS,
    deprecated=frozenset({"metrics-address"}),
    cite=PROVISIONER.at("cmd/csi-provisioner/csi-provisioner.go", "77-125, 136-145"))
#: ``node-driver-registrar`` v2.13.0: ``--kubelet-registration-path`` empty exits 1.
REGISTRAR_FLAGS: Final = Flags(
    "csi-node-driver-registrar", frozenset({
        "connection-timeout", "timeout", "csi-address", "plugin-registration-path", "kubelet-registration-path",
        "health-port", "http-endpoint", "version", "mode", "enable-pprof"}) | LOGSAPI_FLAGS,
    deprecated=frozenset({"connection-timeout", "health-port", "mode"}),
    required=frozenset({"kubelet-registration-path"}),
    cite=REGISTRAR.at("cmd/csi-node-driver-registrar/main.go", "56-66, 121-142"))
#: ``livenessprobe`` v2.15.0: ``--health-port`` and ``--metrics-address`` are "(deprecated)";
#: ``--http-endpoint`` is their replacement (a non-default ``--health-port`` with it exits 1).
LIVENESSPROBE_FLAGS: Final = Flags(
    "livenessprobe", frozenset({"probe-timeout", "csi-address", "health-port", "metrics-address", "http-endpoint",
                                "metrics-path"}) | LOGSAPI_FLAGS,
    deprecated=frozenset({"health-port", "metrics-address"}),
    cite=LIVENESSPROBE.at("cmd/livenessprobe/main.go", "39-51, 93-113"))


@dataclass(frozen=True)
class Sidecar:
    """A kubernetes-csi sidecar at its pin: the image the config must name, and its flags."""

    image: str
    ref: Ref
    flags: Flags

    @property
    def tag(self) -> str:
        return self.ref.tag


#: ``versions.images`` field -> the sidecar read at that tag.
SIDECARS: Final = {
    "csi_provisioner": Sidecar("registry.k8s.io/sig-storage/csi-provisioner", PROVISIONER, PROVISIONER_FLAGS),
    "csi_node_driver_registrar": Sidecar("registry.k8s.io/sig-storage/csi-node-driver-registrar", REGISTRAR,
                                         REGISTRAR_FLAGS),
    "livenessprobe": Sidecar("registry.k8s.io/sig-storage/livenessprobe", LIVENESSPROBE, LIVENESSPROBE_FLAGS),
}

#: The livenessprobe serves ``/healthz`` on ``--http-endpoint``, else on ``0.0.0.0:<--health-port>``
#: (default 9808); the CSI driver itself serves no HTTP (``identity.go`` ``Probe`` is gRPC only).
LIVENESSPROBE_PATH: Final = "/healthz"
LIVENESSPROBE_DEFAULT_PORT: Final = 9808
LIVENESSPROBE_SERVE_CITE: Final = (LIVENESSPROBE.at("cmd/livenessprobe/main.go", "40, 114-119, 171-173") + "; "
                                   + CURVINE.at("curvine-csi/pkg/csi/identity.go", "82-90"))
#: The registrar's ``--plugin-registration-path`` default (where the kubelet's plugin watcher looks).
REGISTRAR_PLUGIN_REGISTRATION_PATH: Final = "/registration"
#: The provisioner runs without leader election unless ``--leader-election`` (default false): two
#: replicas would both provision.
PROVISIONER_LEADER_ELECTION_DEFAULT: Final = False


# --- curvine-csi: environment, modes, start-up -----------------------------------------------------

@dataclass(frozen=True)
class EnvVar:
    """An environment variable a program reads.

    Attributes:
        name: the variable.
        default: what applies when it is unset or empty (``None``: nothing, or described in ``effect``).
        modes: the ``MOUNT_MODE`` values in which curvine-csi reads it (empty: every mode).
        effect: what it does.
        cite: where it is read.
    """

    name: str
    default: str | None
    modes: frozenset[str]
    effect: str
    cite: str


EMBEDDED: Final = "embedded"
STANDALONE: Final = "standalone"
#: ``NewDriver``: ``MOUNT_MODE`` empty -> ``standalone``; any value but these two is ``klog.Fatalf``.
#: Every process builds a node service, the controller's too.
MOUNT_MODES: Final = frozenset({EMBEDDED, STANDALONE})
MOUNT_MODE_DEFAULT: Final = STANDALONE
MOUNT_MODE_CITE: Final = CURVINE.at("curvine-csi/pkg/csi/driver.go", "58-84")

_SM = "curvine-csi/pkg/csi/standalone_manager.go"
_NS = "curvine-csi/pkg/csi/node_standalone.go"
#: ``git grep os.Getenv v0.3.2-alpha -- curvine-csi/``: every variable the binary reads.
CSI_DRIVER_ENV: Final = {e.name: e for e in (
    EnvVar("MOUNT_MODE", MOUNT_MODE_DEFAULT, frozenset(), "node service: embedded FUSE or standalone FUSE pods",
           MOUNT_MODE_CITE),
    EnvVar("KUBERNETES_NAMESPACE", "curvine", frozenset(),
           "namespace of the embedded mount-state Secret, of the FUSE pods and their state ConfigMap",
           CURVINE.at("curvine-csi/pkg/csi/node.go", "56-59") + "; " + CURVINE.at(_NS, "43-46")),
    EnvVar("STANDALONE_SERVICE_ACCOUNT", None, frozenset({STANDALONE}),
           "required: unset, newNodeServiceStandalone returns an error and NewDriver exits (klog.Fatalf); the "
           "FUSE pods' serviceAccountName", CURVINE.at(_NS, "57-61") + "; " + CURVINE.at(_SM, "71, 450")),
    EnvVar("STANDALONE_IMAGE", None, frozenset({STANDALONE}),
           "the FUSE pods' image; unset: GET pods/$HOSTNAME for the csi-plugin container's image, else "
           "ghcr.io/curvineio/curvine-csi:latest", CURVINE.at(_NS, "55") + "; " + CURVINE.at(_SM, "42, 177-219")),
    EnvVar("STANDALONE_CPU_REQUEST", None, frozenset({STANDALONE}), "FUSE pod CPU request (unparsable: skipped)",
           CURVINE.at(_SM, "74, 576-582")),
    EnvVar("STANDALONE_CPU_LIMIT", None, frozenset({STANDALONE}), "FUSE pod CPU limit", CURVINE.at(_SM, "77, 585-591")),
    EnvVar("STANDALONE_MEMORY_REQUEST", None, frozenset({STANDALONE}), "FUSE pod memory request",
           CURVINE.at(_SM, "80, 594-600")),
    EnvVar("STANDALONE_MEMORY_LIMIT", None, frozenset({STANDALONE}), "FUSE pod memory limit",
           CURVINE.at(_SM, "83, 603-609")),
    EnvVar("HOSTNAME", None, frozenset({STANDALONE}), "pod name for the STANDALONE_IMAGE lookup (set by Kubernetes)",
           CURVINE.at(_SM, "179")),
    EnvVar("FUSE_BINARY_PATH", "/opt/curvine/curvine-fuse", frozenset(), "binary of validate-config",
           CURVINE.at("curvine-csi/pkg/csi/fuse_validate.go", "45-50")),
    EnvVar("FUSE_CONF_PATH", "/opt/curvine/conf/curvine-cluster.toml", frozenset(),
           "--conf of curvine-fuse validate-config (CreateVolume; static volumes' NodeStageVolume)",
           CURVINE.at("curvine-csi/pkg/csi/fuse_validate.go", "31-33, 52-58")),
    EnvVar("FUSE_DEBUG_ENABLED", None, frozenset({EMBEDDED}), "-d for the in-container curvine-fuse",
           CURVINE.at("curvine-csi/pkg/csi/fuse_manager.go", "173")),
    EnvVar("KUBECONFIG", None, frozenset(), "only when rest.InClusterConfig fails (no service-account token)",
           CURVINE.at("curvine-csi/pkg/csi/k8s_client.go", "45-57")),
    EnvVar("HOME", None, frozenset(), "with KUBECONFIG", CURVINE.at("curvine-csi/pkg/csi/k8s_client.go", "49-51")),
)}
#: Read by the CSI binary's children, which inherit its environment (``executeCommandWithTimeout``
#: copies ``cmd.Env``, nil): ``curvine-cli`` takes ``--conf``, else ``$CURVINE_CONF_FILE``.
CSI_CHILD_ENV: Final = {"CURVINE_CONF_FILE": CURVINE.at("curvine-cli/src/main.rs", "120-127") + "; "
                        + CURVINE.at("curvine-csi/pkg/csi/utils.go", "75-83")}
#: The driver talks to the API server with ``rest.InClusterConfig()``: the pod's service-account
#: token must be mounted (``KUBECONFIG`` is a fallback no pod of ours has).
CSI_IN_CLUSTER_CITE: Final = (CURVINE.at("curvine-csi/pkg/csi/k8s_client.go", "41-62") + "; "
                              + CURVINE.at("curvine-csi/pkg/csi/pv_client.go", "37-47"))
#: ``--endpoint`` is a URL: ``unix://<path>`` listens on ``/<host>/<path>`` after removing a stale socket.
CSI_ENDPOINT_CITE: Final = CURVINE.at("curvine-csi/pkg/csi/driver.go", "198-213, 260-281")
#: ``DriverName`` (the CSIDriver object's and the StorageClass provisioner's name).
CSI_DRIVER_NAME: Final = "curvine"
CSI_DRIVER_NAME_CITE: Final = CURVINE.at("curvine-csi/pkg/csi/driver.go", "33-36")
#: Controller capabilities: ``PUBLISH_UNPUBLISH_VOLUME`` makes the provisioner watch VolumeAttachments.
CSI_CONTROLLER_CAPABILITIES: Final = frozenset({"CREATE_DELETE_VOLUME", "PUBLISH_UNPUBLISH_VOLUME"})
CSI_CONTROLLER_CAPABILITIES_CITE: Final = CURVINE.at("curvine-csi/pkg/csi/controller.go", "28-33")
#: The CSI image: binaries in ``/opt/curvine``, the image's own config in ``/opt/curvine/conf`` (a copy
#: of the repository's ``etc/``), ``CURVINE_HOME=/opt/curvine``, ``WORKDIR /opt/curvine``; no
#: ENTRYPOINT, no USER.
CSI_DRIVER_BINARY: Final = "/opt/curvine/csi"
CSI_IMAGE_BINARIES: Final = frozenset({CSI_DRIVER_BINARY, "/opt/curvine/curvine-cli", "/opt/curvine/curvine-fuse"})
CSI_IMAGE_CONF_DIR: Final = "/opt/curvine/conf"
CSI_IMAGE_CITE: Final = CURVINE.at("curvine-csi/Dockerfile", "91-129")


@dataclass(frozen=True)
class ApiCall:
    """Kubernetes API calls a program makes, hence the RBAC it needs.

    Attributes:
        group, resource: what is called.
        verbs: the verbs.
        cluster_scope: across all namespaces (else in the program's namespace).
        when: the code path, and what happens without the right.
        start_blocker: without it the process never serves (or exits).
        cite: where the calls are.
    """

    group: str
    resource: str
    verbs: frozenset[str]
    cluster_scope: bool
    when: str
    start_blocker: bool
    cite: str


#: The standalone node service (``MOUNT_MODE=standalone``).
CSI_STANDALONE_CALLS: Final = (
    ApiCall("", "persistentvolumes", frozenset({"list", "watch"}), True,
            "start: a shared PV informer, then cache.WaitForCacheSync on a stop channel nothing closes, so "
            "without list+watch NewDriver never returns and no socket is created; the GC lists PVs too",
            True, CURVINE.at(_NS, "82-85, 538-587, 683")),
    ApiCall("", "pods", frozenset({"get", "create", "delete", "list"}), False,
            "EnsureStandalone, DeleteStandalone, RecoverState, the orphan GC (label app=curvine-standalone)",
            False, CURVINE.at(_SM, "281, 328, 401, 411, 644, 666, 687, 816, 1041, 1068") + "; "
            + CURVINE.at(_NS, "674")),
    ApiCall("", "configmaps", frozenset({"get", "update", "create"}), False,
            "the state ConfigMap curvine-standalone-state-<node> (RecoverState at start: an error is a warning)",
            False, CURVINE.at(_SM, "51, 787, 876-881")),
)
#: Every mode's controller service: ``DeleteVolume`` looks the PV up by handle.
CSI_CONTROLLER_CALLS: Final = (
    ApiCall("", "persistentvolumes", frozenset({"list"}), True, "DeleteVolume (GetPVByVolumeHandle)", False,
            CURVINE.at("curvine-csi/pkg/csi/pv_client.go", "69-70")),
)
#: Embedded mode's start reads the mount-state Secret ``curvine-csi-mount-<node>``; any error,
#: 403 included, is only a warning (``NewMountState``). Not required; the platform grants none.
CSI_EMBEDDED_OPTIONAL_SECRET_CITE: Final = (CURVINE.at("curvine-csi/pkg/csi/mount_state.go", "51-65") + "; "
                                            + CURVINE.at("curvine-csi/pkg/csi/k8s_client.go", "64, 77-84"))
#: external-provisioner v5.2.0 ``deploy/kubernetes/rbac.yaml`` ClusterRole, without the snapshot rules
#: (used only for snapshot data sources) and the leader-election/capacity Role (neither enabled).
#: ``volumeattachments`` because the driver has ``PUBLISH_UNPUBLISH_VOLUME`` (csi-provisioner.go
#: l.311-317).
PROVISIONER_CALLS: Final = tuple(
    ApiCall(g, r, frozenset(v), True, "external-provisioner informers and writes", True,
            PROVISIONER.at("deploy/kubernetes/rbac.yaml", lines))
    for g, r, v, lines in (
        ("", "persistentvolumes", ("get", "list", "watch", "create", "patch", "delete"), "29-31"),
        ("", "persistentvolumeclaims", ("get", "list", "watch", "update"), "32-34"),
        ("storage.k8s.io", "storageclasses", ("get", "list", "watch"), "35-37"),
        ("", "events", ("list", "watch", "create", "update", "patch"), "38-40"),
        ("storage.k8s.io", "csinodes", ("get", "list", "watch"), "47-49"),
        ("", "nodes", ("get", "list", "watch"), "50-52"),
        ("storage.k8s.io", "volumeattachments", ("get", "list", "watch"), "53-59"),
    ))
PROVISIONER_VA_CITE: Final = PROVISIONER.at("cmd/csi-provisioner/csi-provisioner.go", "311-317")


# --- CreateVolume's duration (the provisioner's --timeout) ----------------------------------------

#: ``CreateVolume``: ``curvine-fuse validate-config`` under a 30 s context (``CommandTimeout``),
#: then for ``fs-path`` and ``fs-path/<pv>``: ``curvine-cli fs ls`` and, when that fails,
#: ``fs mkdir -p``. Each curvine-cli run goes through ``ExecuteWithRetry(cmd, 3, 2s, 30s)``:
#: attempts 0..3 (four runs) of up to 30 s each, 2 s apart, under ``context.Background()`` (the gRPC
#: request's deadline does not stop them).
CREATE_VOLUME_VALIDATE_TIMEOUT_S: Final = 30
CLI_RETRIES: Final = 3
CLI_RETRY_INTERVAL_S: Final = 2
CLI_COMMAND_TIMEOUT_S: Final = 30
CREATE_VOLUME_CITE: Final = (CURVINE.at("curvine-csi/pkg/csi/controller.go", "85-90, 99-154, 335-412") + "; "
                             + CURVINE.at("curvine-csi/pkg/csi/utils.go", "31-50, 75-80") + "; "
                             + CURVINE.at("curvine-csi/pkg/csi/fuse_validate.go", "135-142") + "; "
                             + CURVINE.at("curvine-csi/pkg/csi/config.go", "41-50"))
#: external-provisioner: ``CreateVolume`` under ``context.WithTimeout(p.timeout)``; a
#: ``DeadlineExceeded`` is "in background" (retried with backoff, the old call may still run),
#: a driver error such as ``Internal`` is final (reported as the PVC's ProvisioningFailed event).
PROVISIONER_TIMEOUT_CITE: Final = PROVISIONER.at("pkg/controller/controller.go", "824-852, 1879-1914")


def cli_call_max_s() -> int:
    """Longest single curvine-cli call of the controller: 4 runs x 30 s + 3 x 2 s = 126 s."""
    return (CLI_RETRIES + 1) * CLI_COMMAND_TIMEOUT_S + CLI_RETRIES * CLI_RETRY_INTERVAL_S


def create_volume_failing_path_s() -> int:
    """``CreateVolume`` with the Primary unreachable, until the driver's own error: validate-config,
    then ``fs ls`` and ``fs mkdir -p`` of ``fs-path`` both time out -> ``Internal`` (282 s)."""
    return CREATE_VOLUME_VALIDATE_TIMEOUT_S + 2 * cli_call_max_s()


# --- the FUSE pods the node plugin builds ----------------------------------------------------------

@dataclass(frozen=True)
class FusePod:
    """``buildStandalone``: the pod every FUSE mount runs in (not an object of our chart)."""

    image_pull_policy: str = "Never"
    command: str = "/opt/curvine/curvine-fuse"
    privileged: bool = True
    host_network: bool = True
    host_pid: bool = True
    mount_path: str = "/mnt/curvine"
    mount_propagation: str = "Bidirectional"
    host_mount_base: str = "/var/lib/kubelet/plugins/curvine"
    default_image: str = "ghcr.io/curvineio/curvine-csi:latest"
    #: No ``--conf``: curvine-fuse reads ``conf/curvine-cluster.toml`` below the image's WORKDIR.
    passes_conf: bool = False
    env: tuple[str, ...] = ()
    cite: str = (CURVINE.at(_SM, "32-61, 423-566, 626-637") + "; "
                 + CURVINE.at("curvine-fuse/src/cli/mount_args.rs", "42-48, 178-189"))


FUSE_POD: Final = FusePod()


# --- Curvine servers (Primary = master, Workers) ---------------------------------------------------

#: ``curvine-server`` (clap): exactly ``--service master|worker`` and ``--conf <file>``; ``--conf``
#: defaults to ``""``, which ``ClusterConf::from`` cannot read: the server exits.
CURVINE_SERVER_FLAGS: Final = Flags(
    "curvine-server", frozenset({"service", "conf"}), required=frozenset({"service", "conf"}),
    cite=CURVINE.at("curvine-server/src/bin/curvine-server.rs", "23-78") + "; "
    + CURVINE.at("curvine-common/src/conf/cluster_conf.rs", "78-80"))
CURVINE_SERVICES: Final = frozenset({"master", "worker"})
#: Where the curvine image installs the server (``CURVINE_HOME=/app/curvine``; ``lib/curvine-server``)
#: and the directory its entrypoint ``cd``s into before starting it.
CURVINE_HOME: Final = "/app/curvine"
CURVINE_SERVER: Final = f"{CURVINE_HOME}/lib/curvine-server"
CURVINE_IMAGE_CITE: Final = (CURVINE.at("curvine-docker/deploy/Dockerfile_rocky9", "187-227") + "; "
                             + CURVINE.at("curvine-docker/deploy/entrypoint.sh", "40-59"))
#: What the server reads from its environment (``ClusterConf::from``, ``RpcServer::get_bind_addr``).
CURVINE_SERVER_ENV: Final = {e.name: e for e in (
    EnvVar("CURVINE_MASTER_HOSTNAME", None, frozenset(), "sets master.hostname and journal.hostname",
           CURVINE.at("curvine-common/src/conf/cluster_conf.rs", "73, 82-85")),
    EnvVar("CURVINE_WORKER_HOSTNAME", None, frozenset(), "sets worker.hostname (the address a Worker registers)",
           CURVINE.at("curvine-common/src/conf/cluster_conf.rs", "74, 87-90")),
    EnvVar("CURVINE_CLIENT_HOSTNAME", None, frozenset(), "sets client.hostname",
           CURVINE.at("curvine-common/src/conf/cluster_conf.rs", "75, 92-95")),
    EnvVar("ORPC_BIND_HOSTNAME", None, frozenset(), "bind host of every RPC server (the image sets 0.0.0.0)",
           CURVINE.at("orpc/src/server/rpc_server.rs", "41, 252-255")),
)}
#: Read by ``curvine-cli`` (an operator's ``kubectl exec``) and the image's entrypoint, not by the server.
CURVINE_CLI_ENV: Final = {"CURVINE_CONF_FILE": CURVINE.at("curvine-cli/src/main.rs", "120-127") + "; "
                          + CURVINE.at("curvine-docker/deploy/entrypoint.sh", "43-45")}
#: The master refuses to start unless ``master.hostname`` is one of ``journal.journal_addrs[].hostname``.
MASTER_HOSTNAME_CITE: Final = CURVINE.at("curvine-common/src/conf/cluster_conf.rs", "112-134") + "; " + CURVINE.at(
    "curvine-server/src/bin/curvine-server.rs", "37-42")


# --- Helm chart values -----------------------------------------------------------------------------

@dataclass(frozen=True)
class ChartKey:
    """A key of a chart's ``values.yaml`` and its default.

    Attributes:
        path: dotted path.
        default: the chart's default value.
        kind: the type a value must have (``int`` for a ``~`` documented as ``(int)``).
        free_form: the template renders whatever it is given (``toYaml``), so the keys below it are not
            chart keys.
        cite: where it is.
    """

    path: str
    default: Any
    kind: type
    cite: str
    free_form: bool = False


_KV = "charts/kyverno/values.yaml"
#: Chart 3.5.2 keys the platform sets (``k8s.kyverno.kyverno_helm_values``).
KYVERNO_KEYS: Final = {k.path: k for k in (
    ChartKey("admissionController.replicas", None, int, KYVERNO.at(_KV, "815-816") + " ('(int) Desired number of pods')"),
    ChartKey("admissionController.podDisruptionBudget.enabled", False, bool, KYVERNO.at(_KV, "970-973")),
    ChartKey("admissionController.podDisruptionBudget.minAvailable", 1, int, KYVERNO.at(_KV, "974-976")),
    ChartKey("admissionController.podDisruptionBudget.maxUnavailable", None, int, KYVERNO.at(_KV, "977-979")),
    ChartKey("admissionController.podDisruptionBudget.unhealthyPodEvictionPolicy", None, str,
             KYVERNO.at(_KV, "980-982")),
    ChartKey("backgroundController.enabled", True, bool, KYVERNO.at(_KV, "1205-1211")),
    ChartKey("cleanupController.enabled", True, bool, KYVERNO.at(_KV, "1531-1537")),
    ChartKey("reportsController.enabled", True, bool, KYVERNO.at(_KV, "1865-1871")),
    ChartKey("config.excludeGroups", ["system:nodes"], list, KYVERNO.at(_KV, "238-240")),
    ChartKey("config.excludeUsernames", [], list, KYVERNO.at(_KV, "242-243")),
    ChartKey("config.webhooks", {"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]}}, dict,
        KYVERNO.at(_KV, "365-377"), free_form=True),
    ChartKey("features.admissionReports.enabled", True, bool, KYVERNO.at(_KV, "638-641")),
)}
#: Kyverno parses the ConfigMap's ``webhooks`` as one ``WebhookConfig`` (JSON object with
#: ``namespaceSelector`` / ``objectSelector`` label selectors); the chart writes a map value as that
#: object with ``{kubernetes.io/metadata.name NotIn [<release namespace>]}`` appended.
KYVERNO_WEBHOOK_CONFIG_KEYS: Final = frozenset({"namespaceSelector", "objectSelector"})
KYVERNO_WEBHOOK_CONFIG_CITE: Final = (KYVERNO_APP.at("pkg/config/types.go", "15-26") + "; "
                                      + KYVERNO.at("charts/kyverno/templates/config/_helpers.tpl", "57-80") + "; "
                                      + KYVERNO.at("charts/kyverno/templates/config/configmap.yaml", "41-47"))
#: The PDB template: rendered when enabled or replicas > 1; ``minAvailable`` and ``maxUnavailable``
#: together fail the render; ``replicas: 0`` fails it too.
KYVERNO_PDB_CITE: Final = (KYVERNO.at("charts/kyverno/templates/admission-controller/poddisruptionbudget.yaml", "1")
                           + "; " + KYVERNO.at("charts/kyverno/templates/_helpers/_pdb.tpl", "11-24"))
#: Admission reports: with ``features.admissionReports.enabled`` (``--admissionReports``, default true)
#: and ``reporting.mutate`` (default true), the admission controller creates one ``EphemeralReport``
#: per mutated Pod (no owner reference); only the reports controller (its aggregate and background
#: controllers, run by ``cmd/reports-controller``) deletes them, and the admission controller stops
#: creating more once ``--maxAdmissionReports`` (the chart's ``backPressureThreshold``, 1000) exist.
KYVERNO_ADMISSION_REPORTS_CITE: Final = (
    KYVERNO_APP.at("pkg/webhooks/resource/mutation/mutation.go", "159-165, 199-216") + "; "
    + KYVERNO_APP.at("pkg/webhooks/resource/mutation/utils.go", "11-29") + "; "
    + KYVERNO_APP.at("pkg/utils/report/new.go", "17-33, 59-63") + "; "
    + KYVERNO_APP.at("pkg/controllers/report/aggregate/controller.go", "482-484") + "; "
    + KYVERNO_APP.at("cmd/kyverno/main.go", "383, 394, 756-794") + "; "
    + KYVERNO.at("charts/kyverno/templates/_helpers.tpl", "18-25") + "; " + KYVERNO.at(_KV, "654-658, 767-770"))

_DV = "deployment/values.yaml"
#: dcgm-exporter chart 4.8.2 keys the platform sets (``observability.cluster_objects.dcgm_exporter_values``).
DCGM_KEYS: Final = {k.path: k for k in (
    ChartKey("serviceMonitor.enabled", True, bool, DCGM.at(_DV, "127-129")),
    ChartKey("affinity", {}, dict, DCGM.at(_DV, "159") + "; " + DCGM.at("deployment/templates/daemonset.yaml", "66-69"),
             free_form=True),
    ChartKey("tolerations", [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
                              "effect": "NoSchedule"}], list, DCGM.at(_DV, "153-156")),
    ChartKey("securityContext", {"runAsNonRoot": False, "runAsUser": 0,
                                 "capabilities": {"add": ["SYS_ADMIN"], "drop": ["ALL"]},
                                 "allowPrivilegeEscalation": False}, dict,
             DCGM.at(_DV, "95-101") + "; " + DCGM.at("deployment/templates/daemonset.yaml", "113-115"), free_form=True),
    ChartKey("arguments", ["-f", "/etc/dcgm-exporter/default-counters.csv"], list,
             DCGM.at(_DV, "24") + "; " + DCGM.at("deployment/templates/daemonset.yaml", "122-125")),
    ChartKey("customMetrics", None, str,
             DCGM.at(_DV, "268") + " (commented); " + DCGM.at("deployment/templates/metrics-configmap.yaml", "9-12")),
    ChartKey("resources", {"limits": {"cpu": "200m", "memory": "512Mi"}, "requests": {"cpu": "100m", "memory": "128Mi"}},
             dict, DCGM.at(_DV, "120-126"), free_form=True),
)}
#: The chart mounts its counters ConfigMap at this path (``extraConfigMapVolumes`` /
#: ``extraVolumeMounts`` defaults), and ``-f`` (alias of ``--collectors``) names the file the
#: exporter reads.
DCGM_COUNTERS_MOUNT: Final = "/etc/dcgm-exporter/default-counters.csv"
DCGM_COUNTERS_CITE: Final = DCGM.at(_DV, "171-182") + "; " + DCGM.at("pkg/cmd/app.go", "123-129")
DCGM_FILE_FLAGS: Final = frozenset({"-f", "--collectors"})
#: Kubernetes ``SecurityContext`` fields (the chart writes ``securityContext`` with ``toYaml``; any
#: other key is pruned or refused by the API server).
SECURITY_CONTEXT_FIELDS: Final = frozenset({
    "allowPrivilegeEscalation", "appArmorProfile", "capabilities", "privileged", "procMount",
    "readOnlyRootFilesystem", "runAsGroup", "runAsNonRoot", "runAsUser", "seLinuxOptions", "seccompProfile",
    "windowsOptions"})


# --- the inference add-on and its load balancer controller -----------------------------------------

_H2A = "helm_chart/HyperPodHelmChart/charts/inference-operator/migration/helm_to_addon.sh"
_IOV = "helm_chart/HyperPodHelmChart/charts/inference-operator/values.yaml"
#: The add-on configuration AWS's own migration script sends (``create-addon --configuration-values``).
ADDON_KEYS_AWS_SENDS: Final = frozenset({
    "executionRoleArn", "tlsCertificateS3Bucket", "hyperpodClusterArn", "jumpstartGatedModelDownloadRoleArn",
    "alb.enabled", "alb.serviceAccount.create", "alb.serviceAccount.roleArn",
    "keda.enabled", "keda.auth.aws.irsa.enabled", "keda.auth.aws.irsa.roleArn"})
ADDON_KEYS_CITE: Final = HYPERPOD_CLI.at(_H2A, "1003-1037")
#: The add-on keys AWS's gateway guide documents for v2.0.0-eksbuild.2 and later (its Prerequisites'
#: ``create-addon`` example; a web page, not a file of a repository: docs/sources.md §31).
ADDON_KEYS_AWS_DOCUMENTS: Final = frozenset({"inferenceGateway.enabled", "inferenceGateway.serviceAccount.roleArn"})
ADDON_KEYS_AWS_DOCUMENTS_CITE: Final = ("AWS, Inference Gateway for Amazon SageMaker HyperPod Inference, Prerequisites "
                                        "(docs/sources.md §31)")
#: The operator's namespace and the service accounts whose IRSA roles the add-on keys carry.
INFERENCE_NAMESPACE: Final = "hyperpod-inference-system"
INFERENCE_NAMESPACE_CITE: Final = HYPERPOD_CLI.at(_H2A, "99-101, 270-272")
ALB_SERVICE_ACCOUNT: Final = "aws-load-balancer-controller"
ALB_SERVICE_ACCOUNT_CITE: Final = HYPERPOD_CLI.at(_IOV, "92-101") + "; " + HYPERPOD_CLI.at(_H2A, "549-554")
KEDA_SERVICE_ACCOUNT: Final = "keda-operator"
KEDA_SERVICE_ACCOUNT_CITE: Final = HYPERPOD_CLI.at(_H2A, "556-561")
#: The bundled controller: chart ``aws-load-balancer-controller`` 1.13.2 under alias ``alb`` = app
#: v2.13.2; its ``ingressClassParams.spec`` is rendered verbatim into the IngressClassParams, whose
#: ``scheme`` is an enum.
ALB_CHART_CITE: Final = (HYPERPOD_CLI.at("helm_chart/HyperPodHelmChart/charts/inference-operator/Chart.yaml", "39-43")
                         + "; " + LBC.at("helm/aws-load-balancer-controller/Chart.yaml", "4") + "; "
                         + LBC.at("helm/aws-load-balancer-controller/values.yaml", "135-140") + "; "
                         + LBC.at("helm/aws-load-balancer-controller/templates/ingressclass.yaml", "11-21"))
ALB_SCHEMES: Final = frozenset({"internal", "internet-facing"})
ALB_SCHEMES_CITE: Final = LBC.at("apis/elbv2/v1beta1/ingressclassparams_types.go", "33-43")


# --- deliberate deviations -------------------------------------------------------------------------

@dataclass(frozen=True)
class Deviation:
    """Where the platform's rendering differs from upstream's own example on purpose.

    The test module holds a check per ``id`` that the rendering still deviates (a row that is no
    longer true fails), and docs/sources.md §23 lists every ``id`` in its table.
    """

    id: str
    component: str
    ours: str
    upstream: str
    reason: str
    cite: str = field(default="")


_DEPLOY = "curvine-csi/deploy/deployment.yaml"
_DS = "curvine-csi/deploy/daemonset.yaml"
DEVIATIONS: Final = (
    Deviation("pinned-images", "Curvine, CSI", "`v0.3.2-alpha` tags, pull policy left to Kubernetes (IfNotPresent)",
              "`:latest`, `imagePullPolicy: Always`, `STANDALONE_IMAGE` `:latest`",
              "reproducible deploys; the FUSE pod's `Never` pull policy needs the node plugin's exact reference",
              CURVINE.at(_DEPLOY, "26-27") + "; " + CURVINE.at(_DS, "23-24, 46-47")),
    Deviation("sidecar-versions", "CSI sidecars", "provisioner v5.2.0, registrar v2.13.0, livenessprobe v2.15.0",
              "provisioner `quay.io/k8scsi` v1.6.0, registrar v2.5.1, livenessprobe v2.11.0/v2.8.0",
              "current releases on registry.k8s.io; every flag passed is checked against the pinned release",
              CURVINE.at(_DEPLOY, "66-90") + "; " + CURVINE.at(_DS, "82-108")),
    Deviation("no-attacher", "CSI controller", "no csi-attacher", "csi-attacher v4.5.0",
              "the CSIDriver has `attachRequired: false`, so no VolumeAttachment exists for it to act on",
              CURVINE.at(_DEPLOY, "91-101") + "; " + CURVINE.at("curvine-csi/deploy/csidriver.yaml", "6")),
    Deviation("controller-unprivileged", "CSI controller", "restricted: no privilege, all capabilities dropped",
              "`privileged: true` plus `SYS_ADMIN`",
              "embedded mode mounts nothing at start; CreateVolume/DeleteVolume only exec curvine-cli over RPC and "
              "`validate-config`, which parses its arguments and never mounts",
              CURVINE.at(_DEPLOY, "58-62") + "; " + CURVINE.at("curvine-fuse/src/cli/validate_run.rs", "18-23")),
    Deviation("controller-rbac", "CSI controller", "external-provisioner's rules (no snapshots), VolumeAttachments read-only",
              "also VolumeAttachment create/update/delete/patch, `volumeattachments/status`, events get, PV update",
              "only the provisioner calls the API (no attacher); the driver itself lists PVs",
              CURVINE.at("curvine-csi/deploy/clusterrole.yaml", "19-99") + "; " + PROVISIONER.at(
                  "deploy/kubernetes/rbac.yaml", "29-59")),
    Deviation("node-rbac-namespaced", "CSI node plugin", "pods and configmaps in a namespaced Role",
              "ClusterRole `curvine-csi-standalone-role` (pods, configmaps cluster-wide)",
              "the FUSE pods and their state ConfigMap live in `KUBERNETES_NAMESPACE`; only PVs are read cluster-wide",
              CURVINE.at(_DS, "124-158")),
    Deviation("no-secrets", "CSI node plugin, controller", "no Secret rights", "ClusterRole `curvine-csi-node-role`: "
              "secrets, every verb, bound to the node plugin",
              "Secrets hold only embedded mode's mount state; the node plugin runs standalone, and the embedded "
              "controller's one Secret GET fails softly (a warning)",
              CURVINE.at("curvine-csi/deploy/clusterrole.yaml", "1-17") + "; "
              + CURVINE.at("curvine-csi/deploy/clusterrolebinding.yaml", "1-12")),
    Deviation("provisioner-flags", "csi-provisioner", "`--timeout=300s --v=2`", "`--timeout=300s --v=5` "
              "(curvine-helm: 60s)", "the timeout covers the driver's failing CreateVolume (282 s); "
              "verbosity 5 logs every request", CURVINE.at(_DEPLOY, "66-69")),
    Deviation("livenessprobe-endpoint", "livenessprobe", "`--http-endpoint=:9909`", "`--health-port=9909`",
              "`--health-port` is deprecated at v2.15.0; `--http-endpoint` also serves the probe's /metrics",
              CURVINE.at(_DEPLOY, "78-85") + "; " + LIVENESSPROBE.at("cmd/livenessprobe/main.go", "47-49, 106-119, 153-156")),
    Deviation("registrar-flags", "node-driver-registrar", "`--v=2`", "`--v=5`", "verbosity 5 logs every call",
              CURVINE.at(_DS, "83-86")),
    Deviation("plugin-dir", "CSI node plugin", "socket dir `/var/lib/kubelet/csi-plugins/csi.curvine.io/`",
              "`/var/lib/kubelet/plugins/curvine` (deploy/)",
              "the curvine-helm chart's path; the FUSE pods' host mounts stay under `/var/lib/kubelet/plugins/curvine` "
              "(a driver constant) and reach the plugin through its `/var/lib/kubelet` mount",
              CURVINE.at(_DS, "90-91, 110-114")),
    Deviation("csi-own-config", "CSI controller and node plugin",
              "our ConfigMap at `/opt/curvine/conf`, `CURVINE_CONF_FILE` set",
              "the image's own `/opt/curvine/conf` (repository `etc/`, a `localhost` master)",
              "curvine-cli (`CURVINE_CONF_FILE`) and validate-config (`FUSE_CONF_PATH` default) read the cluster's "
              "config; the FUSE pods still use the image's (they mount nothing of ours)",
              CSI_IMAGE_CITE),
    Deviation("fuse-resources", "FUSE pods", "`STANDALONE_*` 2 CPU / 2Gi, requests = limits (Guaranteed)",
              "unset (BestEffort); curvine-helm 500m/512Mi to 2/2Gi", "docs/sources.md §16",
              CURVINE.at(_SM, "569-618")),
    Deviation("fuse-account", "FUSE pods", "`STANDALONE_SERVICE_ACCOUNT` `curvine-fuse`: no binding, no token; the "
              "node plugin's identity confined by `curvine-csi-node-limits`",
              "the node plugin's own account (pods create/delete, configmaps) for every FUSE pod",
              "curvine-fuse never calls the API server; a stolen node token may start only FUSE pods (issue 25)",
              CURVINE.at(_NS, "57-61")),
    Deviation("csidriver-fields", "CSIDriver", "`volumeLifecycleModes: [Persistent]`, `fsGroupPolicy: None`",
              "neither (defaults: Persistent, ReadWriteOnceWithFSType)",
              "no recursive chown of a shared cache on every mount", CURVINE.at("curvine-csi/deploy/csidriver.yaml", "1-7")),
    Deviation("sidecars-restricted", "CSI sidecars", "restricted securityContext and resources on every sidecar",
              "none", "least privilege; the node budget counts them (platform_config/pod_resources.py)",
              CURVINE.at(_DEPLOY, "66-101")),
    Deviation("controller-placement", "CSI controller", "prefers non-HyperPod nodes; no `CriticalAddonsOnly` toleration",
              "tolerates `CriticalAddonsOnly`",
              "keeps GPU nodes for inference; the platform's system nodes carry no such taint", CURVINE.at(_DEPLOY, "19-23")),
    Deviation("servers-direct", "Primary, Workers", "`curvine-server --service ... --conf ...` as PID 1",
              "`/entrypoint.sh master|worker start` (`... | tee` under bash as PID 1)",
              "SIGTERM reaches the server and logs are not copied into the writable layer (docs/sources.md §19)",
              CURVINE_IMAGE_CITE),
    Deviation("worker-unprivileged", "Workers", "restricted, no capabilities",
              "`privileged: true` (example and curvine-helm `worker.privileged`)",
              "a Worker only reads and writes files in its data directory (`root 0750`, uid 0)",
              CURVINE.at("curvine-docker/deploy/example/curvine-worker.yaml", "18-88")),
    Deviation("server-ports", "Primary, Workers", "web ports 9001 (master), 9002 (worker), 9003 (FUSE) written out",
              "defaults 9000 / 9001 / 9002", "the Worker and the FUSE pods share the host network; no default collides",
              CURVINE.at("curvine-common/src/conf/cluster_conf.rs", "65-71")),
    Deviation("kyverno-controllers-off", "Kyverno", "cleanup and reports controllers off; admission "
              "reports off; background controller on", "all on", "the mutate-at-admission policies need none of "
              "them, the generate rule of block-curvine-ports needs the background controller; with the reports "
              "controller off nothing would delete admission reports", KYVERNO_ADMISSION_REPORTS_CITE),
    Deviation("kyverno-webhook-scope", "Kyverno", "webhooks only for namespaces labelled `kvcache.io/business-line`, "
              "3 replicas and a PDB", "every namespace but kube-system, one replica",
              "a fail-closed policy must not block other namespaces' Pods when Kyverno is down",
              KYVERNO.at(_KV, "365-377, 815-816, 970-982")),
    Deviation("dcgm-least", "DCGM exporter", "no `SYS_ADMIN`, our counters only, no ServiceMonitor, HyperPod nodes only",
              "`SYS_ADMIN`, ~40 fields incl. profiling, a ServiceMonitor, a control-plane toleration",
              "the platform reads only `DCGM_FI_DEV_*` fields; the cluster has no Prometheus operator",
              DCGM.at(_DV, "95-101, 127-129, 153-156")),
    Deviation("alb-keys", "inference add-on", "only the keys AWS's script sends, minus the JumpStart role; "
              "unverified keys opt-in", "the script also sends `jumpstartGatedModelDownloadRoleArn`",
              "lines deploy no gated JumpStart model; the add-on's schema is not public", ADDON_KEYS_CITE),
)
