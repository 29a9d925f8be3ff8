#!/usr/bin/env bash
# HyperPod lifecycle script (LifeCycleConfig.OnCreate), run as root once per new node.
#
# Shipped to S3 by the HyperPod stack (one prefix per instance group, next to a generated
# kvcache.env with that group's settings). Everything is logged to
# /var/log/provision/provisioning.log (HyperPod also streams stdout to CloudWatch under
# /aws/sagemaker/Clusters/<cluster>/). Any failing command makes the script exit non-zero,
# which fails node provisioning instead of leaving a half-configured node in the cluster.
#
# What it does:
#   1. waits for the instance NVMe that HyperPod mounts at $KVCACHE_NVME_ROOT, and fails if it
#      never appears on a group that hosts a Curvine Worker (the L2 tier lives there);
#   2. creates the Worker's data directory on it (Curvine stores blocks under <dir>/<cluster_id>);
#   3. moves containerd's image store onto the group's secondary EBS volume (below);
#   4. records what it found, for support.
#
# Step 3, containerd on the secondary EBS volume. HyperPod mounts the group's EBS volume
# (InstanceStorageConfigs, `ebs_volume_size_gb` in config/platform.yaml) at /opt/sagemaker; the
# root volume is small. vLLM images are many GB, so with containerd on the root volume image
# pulls fill it (DiskPressure, evictions) and the configured EBS size goes unused. AWS's base
# lifecycle script (awsome-distributed-training, 7.sagemaker-hyperpod-eks/LifecycleScripts/
# base-config) moves containerd's data root to /opt/sagemaker/containerd/data-root. We do the
# same with a different mechanism and a narrower scope:
#   - Bind mount, not a rewritten containerd config: a systemd mount unit binds
#     /opt/sagemaker/containerd/data-root onto /var/lib/containerd, and a containerd drop-in
#     (RequiresMountsFor=) orders containerd after it, at this boot and every later one.
#     containerd's own config stays the AMI's (AWS's script replaces it with a hand-written one
#     that hard-codes the runtime and sandbox image), and whatever reads /var/lib/containerd
#     keeps working. The store present now (the AMI's pre-loaded images, e.g. the pause image)
#     is copied first; the copy left on the root volume is hidden under the mount.
#   - If the bind mount cannot be made at a later boot, containerd does not start: the node
#     fails its health checks and HyperPod replaces it (NodeRecovery: Automatic), rather than
#     quietly filling the root volume again.
#   - /var/lib/kubelet is NOT moved. AWS's script replaces it with a symlink to /opt/sagemaker;
#     the CSI node plugins (Curvine, EBS, Mountpoint for S3, FSx) bind-mount /var/lib/kubelet
#     into their pods with Bidirectional mount propagation and register sockets under
#     /var/lib/kubelet/plugins*, and kubelet publishes volumes under /var/lib/kubelet/pods. Mount
#     propagation through a symlinked kubelet root is not something those drivers test or
#     document, and a failure there breaks the L2 mount of every inference pod on the node.
#     What stays on the root volume: pod logs, emptyDir volumes, kubelet state.
#   - Only when /opt/sagemaker is a mount point (after waiting as for the NVMe); otherwise the
#     step logs that containerd stays on the root volume and provisioning continues.
#   - Idempotent: if /var/lib/containerd is already a mount point, nothing is done. Data left on
#     the EBS volume by an earlier root image (HyperPod re-images the root volume but keeps the
#     EBS volume) is replaced by a fresh copy, as AWS's script does: stale snapshots that the new
#     metadata does not know would only waste space.
#   - containerd (and kubelet, if running) is stopped for the copy and started again afterwards.
#     OnCreate runs before the node joins the cluster, so normally neither has containers.
#
# Environment (defaults are the production values; tests override them):
#   KVCACHE_LOG_FILE          log file                  (/var/log/provision/provisioning.log)
#   KVCACHE_MOUNT_WAIT_S      wait for each mount       (120 s; HyperPod mounts them during boot)
#   KVCACHE_FAIL_DELAY_S      delay before exit 1       (60 s, so the CloudWatch agent ships the log)
#   KVCACHE_EBS_ROOT          secondary EBS volume      (/opt/sagemaker; empty skips step 3)
#   KVCACHE_CONTAINERD_ROOT   containerd's data root    (/var/lib/containerd)
#   KVCACHE_SYSTEMD_DIR       systemd unit directory    (/etc/systemd/system)
set -Eeuo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_FILE="${KVCACHE_LOG_FILE:-/var/log/provision/provisioning.log}"
MOUNT_WAIT_S="${KVCACHE_MOUNT_WAIT_S:-120}"
FAIL_DELAY_S="${KVCACHE_FAIL_DELAY_S:-60}"
EBS_ROOT="${KVCACHE_EBS_ROOT-/opt/sagemaker}"
CONTAINERD_ROOT="${KVCACHE_CONTAINERD_ROOT:-/var/lib/containerd}"
SYSTEMD_DIR="${KVCACHE_SYSTEMD_DIR:-/etc/systemd/system}"

mkdir -p "$(dirname "$LOG_FILE")"
touch "$LOG_FILE"
# Everything below goes to the log file and to stdout.
exec > >(tee -a "$LOG_FILE") 2>&1

log() { printf '%s [on_create] %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"; }

on_error() {
  local rc=$? line=$1
  log "[error] line ${line}: '${BASH_COMMAND}' exited ${rc}; node provisioning fails"
  sync
  sleep "$FAIL_DELAY_S"
  exit "$rc"
}
trap 'on_error $LINENO' ERR

# Settings rendered from config/platform.yaml by the HyperPod stack.
ENV_FILE="${SCRIPT_DIR}/kvcache.env"
if [[ ! -f "$ENV_FILE" ]]; then
  log "[error] ${ENV_FILE} is missing; it is shipped with this script by the HyperPod stack"
  false
fi
# shellcheck source=/dev/null
source "$ENV_FILE"
: "${KVCACHE_INSTANCE_GROUP:?set in kvcache.env}"
: "${KVCACHE_NVME_ROOT:?set in kvcache.env}"
KVCACHE_CURVINE_DATA_DIR="${KVCACHE_CURVINE_DATA_DIR:-}"

wait_for_mount() {
  local dir=$1 waited=0
  until mountpoint -q "$dir"; do
    if (( waited >= MOUNT_WAIT_S )); then
      return 1
    fi
    sleep 5
    waited=$(( waited + 5 ))
  done
}

# systemd's unit name for a mount point (systemd.unit(5) path escaping, what
# `systemd-escape --path --suffix=mount` prints): /var/lib/containerd -> var-lib-containerd.mount
mount_unit_name() {
  local path=${1#/} out="" c i
  path=${path%/}
  for (( i = 0; i < ${#path}; i++ )); do
    c=${path:i:1}
    if [[ $c == / ]]; then
      out+=-
    elif [[ $c =~ [A-Za-z0-9:_] || ( $c == . && $i -gt 0 ) ]]; then
      out+=$c
    else
      printf -v c '\\x%02x' "'$c"
      out+=$c
    fi
  done
  printf '%s.mount\n' "$out"
}

# Step 3 (see the header): containerd's data root onto the secondary EBS volume.
move_containerd_root() {
  if [[ -z "$EBS_ROOT" ]]; then
    log "containerd: no secondary EBS volume configured; containerd stays on the root volume"
    return 0
  fi
  if ! wait_for_mount "$EBS_ROOT"; then
    log "containerd: ${EBS_ROOT} not mounted after ${MOUNT_WAIT_S}s; containerd stays on the root volume"
    return 0
  fi
  if mountpoint -q "$CONTAINERD_ROOT"; then
    log "containerd: ${CONTAINERD_ROOT} is already a mount point; nothing to do"
    return 0
  fi

  local target="${EBS_ROOT}/containerd/data-root"
  local unit
  unit="$(mount_unit_name "$CONTAINERD_ROOT")"
  log "containerd: moving ${CONTAINERD_ROOT} to ${target} ($(df -h --output=size,avail "$EBS_ROOT" | tail -n 1 | xargs) on ${EBS_ROOT}) via ${unit}"

  local -a was_active=()
  local service
  for service in kubelet containerd; do
    if systemctl is-active --quiet "$service"; then
      was_active+=("$service")
      log "containerd: stopping ${service} for the move"
      systemctl stop "$service"
    fi
  done

  if [[ -e "$target" ]]; then
    log "containerd: replacing ${target} left by an earlier root image"
    rm -rf --one-file-system "${target:?}"
  fi
  install -d -m 0711 "$target"
  mkdir -p "$CONTAINERD_ROOT"
  cp -a "${CONTAINERD_ROOT}/." "${target}/"

  install -d -m 0755 "${SYSTEMD_DIR}" "${SYSTEMD_DIR}/containerd.service.d"
  cat > "${SYSTEMD_DIR}/${unit}" <<EOF
# Written by the HyperPod lifecycle script (on_create.sh): containerd's image store on the
# secondary EBS volume.
[Unit]
Description=containerd data root on ${EBS_ROOT}
RequiresMountsFor=${EBS_ROOT}
Before=containerd.service

[Mount]
What=${target}
Where=${CONTAINERD_ROOT}
Type=none
Options=bind
EOF
  cat > "${SYSTEMD_DIR}/containerd.service.d/10-kvcache-data-root.conf" <<EOF
# Written by the HyperPod lifecycle script (on_create.sh): start containerd only on its bind mount.
[Unit]
RequiresMountsFor=${CONTAINERD_ROOT}
EOF
  systemctl daemon-reload
  systemctl start "$unit"
  if ! mountpoint -q "$CONTAINERD_ROOT"; then
    log "[error] containerd: ${unit} started but ${CONTAINERD_ROOT} is not a mount point"
    return 1
  fi

  # Start in reverse order: containerd before kubelet.
  local i
  for (( i = ${#was_active[@]} - 1; i >= 0; i-- )); do
    log "containerd: starting ${was_active[i]}"
    systemctl start "${was_active[i]}"
  done
  log "containerd: data root is ${target} (bind-mounted on ${CONTAINERD_ROOT})"
}

main() {
  log "[start] instance group ${KVCACHE_INSTANCE_GROUP}"

  if wait_for_mount "$KVCACHE_NVME_ROOT"; then
    log "instance NVMe mounted at ${KVCACHE_NVME_ROOT}: $(df -h --output=size,avail "$KVCACHE_NVME_ROOT" | tail -n 1)"
  elif [[ -n "$KVCACHE_CURVINE_DATA_DIR" ]]; then
    log "[error] ${KVCACHE_NVME_ROOT} not mounted after ${MOUNT_WAIT_S}s; this group hosts a Curvine Worker (L2) and needs it"
    return 1
  else
    log "${KVCACHE_NVME_ROOT} not mounted; no Curvine Worker on this group, continuing"
  fi

  if [[ -n "$KVCACHE_CURVINE_DATA_DIR" ]]; then
    # Root-owned 0750: only the privileged Worker pod (hostPath) writes KV blocks here.
    install -d -m 0750 "$KVCACHE_CURVINE_DATA_DIR"
    log "Curvine Worker data directory ready: ${KVCACHE_CURVINE_DATA_DIR}"
  fi

  move_containerd_root

  log "[stop] instance group ${KVCACHE_INSTANCE_GROUP}: done"
}

main
