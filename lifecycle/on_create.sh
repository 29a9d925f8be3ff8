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
#   1. finds the instance storage (NVMe) mount: the first of $KVCACHE_INSTANCE_STORE_MOUNTS
#      that is a mount point backed by instance-store devices (below), waiting for it during
#      boot, and fails if there is none on a group that hosts a Curvine Worker (L2 lives there);
#   2. makes the Worker's data directory (curvine.worker_data_dir, the hostPath its DaemonSet
#      mounts) available on that instance storage (Curvine stores blocks under <dir>/<cluster_id>);
#   3. moves containerd's image store onto /opt/sagemaker (below);
#   4. logs what it chose, for support.
#
# Steps 1-2, the instance storage. Where it is mounted depends on the AMI: the DLAMI mounts the
# NVMe drives at /opt/dlami/nvme (where the reference deployment found them), while HyperPod's
# EKS storage docs describe them combined into one LVM volume mounted at /opt/sagemaker, the
# path HyperPod also uses for the group's secondary EBS volume (InstanceStorageConfigs). So the
# path alone does not say what is behind it: a candidate counts only if `lsblk --inverse` of its
# source device reaches a disk whose model is "Amazon EC2 NVMe Instance Storage" (EBS volumes
# report "Amazon Elastic Block Store"). If the data directory is under the chosen mount, it is
# created there; otherwise it is created at the same relative path on the chosen mount and
# bind-mounted at the configured path by a systemd mount unit (bind_mount). At a later boot the
# mounts may come up after kubelet, and a Worker started before them would write KV blocks to the
# root volume. Two guards, in both cases:
#   - a kubelet drop-in, RequiresMountsFor=<data dir>: kubelet, hence the Worker, starts only
#     after every mount unit on the way to the data directory (our bind mount; the instance-store
#     mount too when systemd knows it as a unit, e.g. from fstab). If such a mount fails, kubelet
#     does not start: the node fails its health checks and HyperPod replaces it;
#   - the Worker DaemonSet's hostPath has `type: Directory` (k8s/curvine_chart.py), never
#     DirectoryOrCreate: when the data directory is under the instance-store mount, it exists
#     only on that file system, so until the mount is there kubelet refuses the volume and the
#     Worker pod waits (FailedMount, retried) instead of creating the directory on the root
#     volume. This guard holds however the AMI mounts the NVMe, unit or not. (In the bind-mount
#     case the empty mount point exists on the root volume, and the drop-in on our own mount
#     unit is the guard.)
#
# Step 3, containerd on /opt/sagemaker. HyperPod mounts the group's EBS volume
# (InstanceStorageConfigs, `ebs_volume_size_gb` in config/platform.yaml) at /opt/sagemaker; the
# root volume is small. vLLM images are many GB, so with containerd on the root volume image
# pulls fill it (DiskPressure, evictions) and the configured EBS size goes unused. When
# /opt/sagemaker is the instance-store LVM volume instead, images share it with the Curvine
# Worker's data (the script logs that; size curvine.worker_capacity_gib for it). AWS's base
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
#   KVCACHE_MOUNT_WAIT_S      wait for the mounts       (120 s; HyperPod mounts them during boot)
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
: "${KVCACHE_INSTANCE_STORE_MOUNTS:?set in kvcache.env}"
KVCACHE_CURVINE_DATA_DIR="${KVCACHE_CURVINE_DATA_DIR:-}"
IFS=: read -ra INSTANCE_STORE_MOUNTS <<< "$KVCACHE_INSTANCE_STORE_MOUNTS"
# Disk models the NVMe controllers report (EC2 User Guide: instance store and EBS NVMe devices).
INSTANCE_STORE_MODEL="Amazon EC2 NVMe Instance Storage"
EBS_MODEL="Amazon Elastic Block Store"

# Runs "$@" every 5 s until it succeeds; returns 1 once MOUNT_WAIT_S have passed without success.
wait_until() {
  local waited=0
  until "$@"; do
    if (( waited >= MOUNT_WAIT_S )); then
      return 1
    fi
    sleep 5
    waited=$(( waited + 5 ))
  done
}

wait_for_mount() {
  wait_until mountpoint -q "$1"
}

# The device mounted at $1, without a bind mount's [/subdir] suffix; empty if $1 is no mount point.
mount_source() {
  local source
  source="$(findmnt -n -o SOURCE --mountpoint "$1" 2>/dev/null | head -n 1)" || true
  printf '%s\n' "${source%%\[*}"
}

# What backs the mount point $1: instance-store, ebs, or other (tmpfs, unknown disks).
# `lsblk --inverse` lists the device and everything under it (LVM or md over several NVMe disks).
mount_backing() {
  local source models
  source="$(mount_source "$1")"
  if [[ -z "$source" ]]; then
    echo other
    return 0
  fi
  models="$(lsblk --noheadings --inverse --output MODEL "$source" 2>/dev/null)" || true
  if grep -qF "$INSTANCE_STORE_MODEL" <<< "$models"; then
    echo instance-store
  elif grep -qF "$EBS_MODEL" <<< "$models"; then
    echo ebs
  else
    echo other
  fi
}

# Sets INSTANCE_STORE to the first candidate mount backed by instance storage; returns 1 if none is.
pick_instance_store() {
  local dir
  for dir in "${INSTANCE_STORE_MOUNTS[@]}"; do
    if mountpoint -q "$dir" && [[ "$(mount_backing "$dir")" == instance-store ]]; then
      INSTANCE_STORE="$dir"
      return 0
    fi
  done
  return 1
}

# pick_instance_store, waiting up to MOUNT_WAIT_S for the mounts to appear during boot.
find_instance_store() {
  INSTANCE_STORE=""
  wait_until pick_instance_store
}

# One log line per candidate: what it is on this node (for the failure log).
describe_candidates() {
  local dir
  for dir in "${INSTANCE_STORE_MOUNTS[@]}"; do
    if mountpoint -q "$dir"; then
      log "  ${dir}: mounted from $(mount_source "$dir") ($(mount_backing "$dir"))"
    else
      log "  ${dir}: not a mount point"
    fi
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

# Bind-mounts $1 (what) on $2 (where) now and at every later boot, with a systemd mount unit that
# requires the mounts holding $1 (RequiresMountsFor=$3) and is ordered before $4 (a service);
# $5 is the unit's description. Fails unless $2 is a mount point afterwards. Sets BIND_UNIT.
bind_mount() {
  local what=$1 where=$2 requires=$3 before=$4 description=$5 unit
  unit="$(mount_unit_name "$where")"
  install -d -m 0755 "${SYSTEMD_DIR}"
  cat > "${SYSTEMD_DIR}/${unit}" <<EOF
# Written by the HyperPod lifecycle script (on_create.sh): ${description}.
[Unit]
Description=${description}
RequiresMountsFor=${requires}
Before=${before}

[Mount]
What=${what}
Where=${where}
Type=none
Options=bind
EOF
  systemctl daemon-reload
  systemctl start "$unit"
  if ! mountpoint -q "$where"; then
    log "[error] ${unit} started but ${where} is not a mount point"
    return 1
  fi
  BIND_UNIT="$unit"
}

# Writes the drop-in $3.conf of service $1: it starts only once every mount unit on the way to the
# path $2 is mounted (RequiresMountsFor=), at every later boot; $4 says why (a comment line).
# The caller reloads systemd (bind_mount does).
require_mounts_for() {
  local service=$1 path=$2 name=$3 why=$4
  install -d -m 0755 "${SYSTEMD_DIR}/${service}.d"
  cat > "${SYSTEMD_DIR}/${service}.d/${name}.conf" <<EOF
# Written by the HyperPod lifecycle script (on_create.sh): ${why}
[Unit]
RequiresMountsFor=${path}
EOF
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
  log "containerd: moving ${CONTAINERD_ROOT} to ${target} ($(df -h --output=size,avail "$EBS_ROOT" | tail -n 1 | xargs) on ${EBS_ROOT}) via $(mount_unit_name "$CONTAINERD_ROOT")"

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

  require_mounts_for containerd.service "$CONTAINERD_ROOT" 10-kvcache-data-root \
    "start containerd only on its bind mount."
  bind_mount "$target" "$CONTAINERD_ROOT" "$EBS_ROOT" containerd.service "containerd data root on ${EBS_ROOT}"

  # Start in reverse order: containerd before kubelet.
  local i
  for (( i = ${#was_active[@]} - 1; i >= 0; i-- )); do
    log "containerd: starting ${was_active[i]}"
    systemctl start "${was_active[i]}"
  done
  log "containerd: data root is ${target} (bind-mounted on ${CONTAINERD_ROOT})"
}

# Step 2 (see the header): the Worker's data directory $1 on the instance storage mounted at $2.
# Root-owned 0750: only the privileged Worker pod (hostPath) writes KV blocks there. In both
# cases kubelet gets the drop-in that keeps it (and so the Worker) from starting before the
# mounts holding the directory, at every later boot.
prepare_worker_data_dir() {
  local data_dir=$1 store=$2 root relative backing
  require_mounts_for kubelet.service "$data_dir" 10-kvcache-curvine-data \
    "no kubelet (so no Curvine Worker) without its data directory on instance storage."
  if [[ "$data_dir" == "$store"/* ]]; then
    install -d -m 0750 "$data_dir"
    systemctl daemon-reload
    log "Curvine Worker data directory ready: ${data_dir} (on the instance storage at ${store}; kubelet requires its mounts)"
    return 0
  fi
  # The same relative path below the chosen mount: /opt/dlami/nvme/curvine-data -> <store>/curvine-data.
  relative="${data_dir##*/}"
  for root in "${INSTANCE_STORE_MOUNTS[@]}"; do
    if [[ "$data_dir" == "$root"/* ]]; then
      relative="${data_dir#"$root"/}"
      break
    fi
  done
  backing="${store}/${relative}"
  install -d -m 0750 "$backing"
  if mountpoint -q "$data_dir"; then
    log "Curvine Worker data directory ${data_dir} is already a mount point; keeping it"
    return 0
  fi
  install -d -m 0750 "$data_dir"
  bind_mount "$backing" "$data_dir" "$store" kubelet.service "Curvine Worker data on the instance storage at ${store}"
  log "Curvine Worker data directory ready: ${data_dir} (bind mount of ${backing} on the instance storage at ${store}, via ${BIND_UNIT})"
}

main() {
  log "[start] instance group ${KVCACHE_INSTANCE_GROUP}"

  local store=""
  if find_instance_store; then
    store="$INSTANCE_STORE"
    log "instance storage (NVMe) chosen: ${store}, from $(mount_source "$store"): $(df -h --output=size,avail "$store" | tail -n 1 | xargs)"
  elif [[ -n "$KVCACHE_CURVINE_DATA_DIR" ]]; then
    log "[error] no instance storage (NVMe) mount after ${MOUNT_WAIT_S}s among ${INSTANCE_STORE_MOUNTS[*]}; this group hosts a Curvine Worker (L2) and needs one:"
    describe_candidates
    return 1
  else
    log "no instance storage (NVMe) mount among ${INSTANCE_STORE_MOUNTS[*]}; no Curvine Worker on this group, continuing"
  fi

  if [[ -n "$KVCACHE_CURVINE_DATA_DIR" ]]; then
    prepare_worker_data_dir "$KVCACHE_CURVINE_DATA_DIR" "$store"
  fi

  move_containerd_root
  if [[ -n "$KVCACHE_CURVINE_DATA_DIR" && "$store" == "$EBS_ROOT" ]] && mountpoint -q "$CONTAINERD_ROOT"; then
    log "note: containerd's images and the Curvine Worker's data share ${store}; keep curvine.worker_capacity_gib below its size minus the images"
  fi

  log "[stop] instance group ${KVCACHE_INSTANCE_GROUP}: done"
}

main
