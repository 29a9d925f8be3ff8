#!/usr/bin/env bash
# Put one business line's operator-rendered Deployment on the Curvine L2 tier, for clusters
# WITHOUT Kyverno (with Kyverno, the line's Policy does this on every Pod; do not use this).
#
# The operator overwrites this patch whenever it re-renders the Deployment (CRD edit, operator
# upgrade, Deployment deletion): re-run the script after each. The sequence avoids both known
# traps of the manual procedure (docs/sources.md §1):
#   1. pause the operator (scale its controller to 0) so its reconcile loop cannot undo the patch;
#   2. scale the Deployment to 0: frees the GPUs, so no rolling update deadlocks on maxSurge
#      when replicas == GPUs available;
#   3. compute the patch against the live Deployment (python -m k8s.patch --deployment: removes
#      every entry it owns first -- the L2 volume and mount, the operator's LMCACHE_REMOTE_URL and
#      LMCACHE_EXTRA_CONFIG, the CR's LMCACHE_REMOTE_SERDE and PYTHONHASHSEED, and
#      LMCACHE_MAX_LOCAL_CPU_SIZE when cache.l1_cpu_gib is set, duplicates included, and the
#      Tiered Storage shared-memory hostPath (/dev/shm or below) with every mount of it, which Pod
#      Security "baseline" refuses -- each guarded by a JSON-patch "test", then appends exactly one
#      of each to the vLLM container)
#      and apply it in one `kubectl patch --type=json`;
#   4. scale back to the previous replica count and wait until the Pods are Ready;
#   5. restore the operator (also on failure, via the EXIT trap).
#
# It never reads dist/patches/<line>.reference.json (an append-only reference, not applicable).
#
# Usage: scripts/patch_endpoint.sh <business-line> [--config DIR] [--dry-run]   (--help: options, exit codes)
# Needs: kubectl pointed at the cluster, the repository's .venv (make setup).
# Exit codes follow the operator tools' convention (operator_tools/cli.py EXIT_CODES, docs/operator-tools.md's
# table): a failed kubectl or Python step exits 2, never 1 (the ERR trap below).
set -Eeuo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
usage() {
  cat <<EOF
usage: scripts/patch_endpoint.sh <business-line> [--config DIR] [--dry-run]

Put one business line's operator-rendered Deployment on the Curvine L2 tier (clusters without
Kyverno only): pause the operator, scale the line to 0, patch, scale back, restore the operator.

  <business-line>  the line's name (its file stem in DIR/business-lines/)
  --config DIR     config directory (default: \$KVCACHE_CONFIG_DIR, else $REPO/config)
  --dry-run        print the patch and validate it server-side; change nothing
  -h, --help       this help

exit status: 0 = the line's Deployment is patched and its Pods Ready (--dry-run: the patch passed
server-side validation); 1 = not used (the script asks no yes/no question); 2 = bad input (unknown
line, invalid config, L2 off), or a kubectl step failed (the operator is restored).
Environment: PYTHON (default: the repository's .venv), OPERATOR_NS, OPERATOR_DEPLOY, TIMEOUT.
EOF
}
fail_input() { echo "error: $*" >&2; echo "run 'scripts/patch_endpoint.sh --help' for usage" >&2; exit 2; }

LINE=""
CONFIG="${KVCACHE_CONFIG_DIR:-$REPO/config}"
DRY_RUN=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --config) [[ $# -ge 2 ]] || fail_input "--config needs a directory"
              CONFIG="$2"; shift 2 ;;
    --config=*) CONFIG="${1#--config=}"; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -*) fail_input "unknown option $1" ;;
    *) [[ -z "$LINE" ]] || fail_input "one business line at a time (got '$LINE' and '$1')"
       LINE="$1"; shift ;;
  esac
done
[[ -n "$LINE" ]] || fail_input "no business line given"
[[ -d "$CONFIG" ]] || fail_input "config directory $CONFIG not found"
CONFIG="$(cd "$CONFIG" && pwd)"  # the Python steps run in $REPO: keep a relative --config the caller's

PY="${PYTHON:-$REPO/.venv/bin/python}"
command -v "$PY" >/dev/null || fail_input "no Python at $PY: run 'make setup' (or set PYTHON)"
OPERATOR_NS="${OPERATOR_NS:-hyperpod-inference-system}"
OPERATOR_DEPLOY="${OPERATOR_DEPLOY:-hyperpod-inference-controller-manager}"
TIMEOUT="${TIMEOUT:-30m}"

# Names (namespace, Deployment, the label selector of its Pods) come from the same code as the
# charts (k8s/names.py), never retyped here. Bad input (invalid config, unknown line, L2 off) is
# reported without a traceback and exits 2.
NAMES="$(cd "$REPO" && "$PY" -c '
import sys
from k8s import names
from operator_tools import cli
from platform_config import ConfigError
try:
    line = cli.load_config(sys.argv[1]).business_line(sys.argv[2])
except ConfigError as exc:
    sys.exit(cli.fail(exc))
except KeyError as exc:
    print(f"error: {exc.args[0]}", file=sys.stderr)
    sys.exit(2)
if not line.cache.l2_enabled:
    print(f"error: business line {line.name!r} has cache.l2_enabled: false; nothing to patch", file=sys.stderr)
    sys.exit(2)
print(line.namespace, names.endpoint_name(line), f"{names.OPERATOR_POD_LABEL}={names.endpoint_name(line)}")' \
  "$CONFIG" "$LINE")" || exit 2
read -r NS DEPLOY SELECTOR <<<"$NAMES"

WORK="$(mktemp -d)"
OPERATOR_REPLICAS=""
restore_operator() {
  if [[ -n "$OPERATOR_REPLICAS" ]]; then
    echo "restoring $OPERATOR_NS/$OPERATOR_DEPLOY to $OPERATOR_REPLICAS replica(s)"
    kubectl -n "$OPERATOR_NS" scale deployment "$OPERATOR_DEPLOY" --replicas="$OPERATOR_REPLICAS" || true
  fi
  rm -rf "$WORK"
}
trap restore_operator EXIT
# Any failing step from here on (kubectl, the patch computation) is an error: exit 2 (the EXIT
# trap still restores the operator).
trap 'echo "error: step failed at line $LINENO: $BASH_COMMAND" >&2; exit 2' ERR

kubectl -n "$NS" get deployment "$DEPLOY" -o json > "$WORK/before.json"
(cd "$REPO" && "$PY" -m k8s.patch --config "$CONFIG" --line "$LINE" --deployment "$WORK/before.json") > "$WORK/patch.json"
echo "patch for $NS/$DEPLOY: $(grep -c '"op"' "$WORK/patch.json") operations ($WORK/patch.json)"
if [[ "$DRY_RUN" == 1 ]]; then
  cat "$WORK/patch.json"
  kubectl -n "$NS" patch deployment "$DEPLOY" --type=json --patch-file "$WORK/patch.json" --dry-run=server -o name
  exit 0
fi

REPLICAS="$(kubectl -n "$NS" get deployment "$DEPLOY" -o jsonpath='{.spec.replicas}')"
OPERATOR_REPLICAS="$(kubectl -n "$OPERATOR_NS" get deployment "$OPERATOR_DEPLOY" -o jsonpath='{.spec.replicas}')"

echo "1/5 pausing the operator ($OPERATOR_NS/$OPERATOR_DEPLOY)"
kubectl -n "$OPERATOR_NS" scale deployment "$OPERATOR_DEPLOY" --replicas=0
kubectl -n "$OPERATOR_NS" rollout status deployment "$OPERATOR_DEPLOY" --timeout="$TIMEOUT"

echo "2/5 scaling $NS/$DEPLOY to 0 (was $REPLICAS)"
kubectl -n "$NS" scale deployment "$DEPLOY" --replicas=0
kubectl -n "$NS" wait pod -l "$SELECTOR" --for=delete --timeout="$TIMEOUT" || true

echo "3/5 applying the patch (recomputed against the scaled Deployment)"
kubectl -n "$NS" get deployment "$DEPLOY" -o json > "$WORK/scaled.json"
(cd "$REPO" && "$PY" -m k8s.patch --config "$CONFIG" --line "$LINE" --deployment "$WORK/scaled.json") > "$WORK/patch.json"
kubectl -n "$NS" patch deployment "$DEPLOY" --type=json --patch-file "$WORK/patch.json"

echo "4/5 scaling back to $REPLICAS and waiting for Ready"
kubectl -n "$NS" scale deployment "$DEPLOY" --replicas="$REPLICAS"
kubectl -n "$NS" rollout status deployment "$DEPLOY" --timeout="$TIMEOUT"

echo "5/5 restoring the operator"  # done by the EXIT trap
