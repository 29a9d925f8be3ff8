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
#   3. records what it found, for support.
#
# Environment (defaults are the production values; tests override them):
#   KVCACHE_LOG_FILE       log file            (/var/log/provision/provisioning.log)
#   KVCACHE_MOUNT_WAIT_S   wait for the NVMe   (120 s; HyperPod mounts it during boot)
#   KVCACHE_FAIL_DELAY_S   delay before exit 1 (60 s, so the CloudWatch agent ships the log)
set -Eeuo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_FILE="${KVCACHE_LOG_FILE:-/var/log/provision/provisioning.log}"
MOUNT_WAIT_S="${KVCACHE_MOUNT_WAIT_S:-120}"
FAIL_DELAY_S="${KVCACHE_FAIL_DELAY_S:-60}"

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

  log "[stop] instance group ${KVCACHE_INSTANCE_GROUP}: done"
}

main
