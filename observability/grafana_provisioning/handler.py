"""Custom-resource handler: the AMP data source and the dashboards, into an Amazon Managed Grafana workspace.

Runs as the ``onEvent`` handler of an ``aws_cdk.custom_resources.Provider`` (synchronous; the
framework reports the result to CloudFormation). Python standard library plus boto3 (which the
Lambda Python runtime ships); nothing else, so the directory is the whole asset.

Create / Update (the same, idempotent steps):

1. Find this stack's Grafana service account by name (``ServiceAccountName``), or create it with
   the ``ADMIN`` role (adding a data source needs the Admin organization role). It holds no
   token between deployments.
2. Delete the account's expired tokens (Amazon Managed Grafana counts expired tokens against the
   per-account token quota until they are deleted), then create one token that lives
   :data:`TOKEN_SECONDS_TO_LIVE` seconds (the API allows up to 30 days).
3. Wait until the workspace answers ``GET /api/health`` (at most ``ReadyTimeoutSeconds``, and never
   into the time the handler keeps to clean up).
4. Upsert the Prometheus data source by uid (``GET /api/datasources/uid/<uid>``, then ``PUT`` the
   same uid or ``POST`` a new one): SigV4 with the workspace's IAM role (``sigV4AuthType:
   ec2_iam_role``) to the AMP workspace's query endpoint; default data source.
5. Read the dashboards (a JSON list of Grafana dashboard models) from S3 (the CDK asset), bind
   each one's ``datasource`` variable to that data source, and import each with
   ``POST /api/dashboards/db``, ``overwrite: true`` (same uid: the dashboard is replaced).
6. Delete the token, whatever happened in 3-5 (a failed delete is logged: the token expires on
   its own and step 2 of the next run deletes it).

Delete: removes this stack's service account (and so any token left), and leaves the data source
and the dashboards in place: the workspace, when it is deleted too, takes them with it; when only
provisioning is switched off, users keep what they may have edited.

Errors: any Grafana or AWS error fails the request (CloudFormation shows the message, which never
includes the token).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Final, Iterator

LOG = logging.getLogger(__name__)
LOG.setLevel(logging.INFO)

#: Grafana organization role of the service account: data sources need Admin (Grafana docs,
#: "Data source permissions"; Amazon Managed Grafana, CreateWorkspaceServiceAccount ``grafanaRole``).
SERVICE_ACCOUNT_ROLE: Final = "ADMIN"
#: Lifetime of the token, seconds: the Lambda's own timeout is shorter, so an undeleted token
#: (the function killed mid-run) is dead soon after (API maximum: 2,592,000 = 30 days).
TOKEN_SECONDS_TO_LIVE: Final = 900
#: Timeout of one Grafana HTTP request, seconds.
HTTP_TIMEOUT_SECONDS: Final = 20
#: Seconds the handler keeps for deleting the token and answering the framework.
RESERVE_SECONDS: Final = 30
#: Pause between two readiness probes, seconds.
READY_POLL_SECONDS: Final = 5
#: Data source settings for AMP: SigV4 with the workspace's IAM role (``ec2_iam_role`` is what the
#: Amazon Managed Grafana console's "Workspace IAM role" stores), POST for long PromQL.
SIGV4_AUTH_TYPE: Final = "ec2_iam_role"


class GrafanaError(RuntimeError):
    """A Grafana HTTP API call answered with an unexpected status (message: method, path, status, body)."""


@dataclass(frozen=True)
class Request:
    """The custom resource's properties (CloudFormation passes every value as a string)."""

    workspace_id: str
    grafana_url: str
    prometheus_url: str
    region: str
    datasource_uid: str
    datasource_name: str
    dashboards_bucket: str
    dashboards_key: str
    service_account_name: str
    ready_timeout_seconds: int

    @classmethod
    def from_properties(cls, props: dict[str, Any]) -> "Request":
        """Parse ``ResourceProperties``.

        ``WorkspaceEndpoint`` is a host name (``g-....grafana-workspace.<region>.amazonaws.com``,
        https implied) or a full URL (the tests' local server).

        Raises:
            ValueError: a property is missing, names it.
        """
        required = ("WorkspaceId", "WorkspaceEndpoint", "PrometheusUrl", "Region", "DataSourceUid",
                    "DataSourceName", "DashboardsBucket", "DashboardsKey", "ServiceAccountName",
                    "ReadyTimeoutSeconds")
        missing = [k for k in required if not str(props.get(k, "")).strip()]
        if missing:
            raise ValueError(f"custom resource properties missing: {', '.join(missing)}")
        endpoint = str(props["WorkspaceEndpoint"]).rstrip("/")
        url = endpoint if "://" in endpoint else f"https://{endpoint}"
        return cls(workspace_id=props["WorkspaceId"], grafana_url=url, prometheus_url=props["PrometheusUrl"],
                   region=props["Region"], datasource_uid=props["DataSourceUid"],
                   datasource_name=props["DataSourceName"], dashboards_bucket=props["DashboardsBucket"],
                   dashboards_key=props["DashboardsKey"], service_account_name=props["ServiceAccountName"],
                   ready_timeout_seconds=int(props["ReadyTimeoutSeconds"]))


class GrafanaApi:
    """Minimal Grafana HTTP API client (JSON in, JSON out) with a bearer token."""

    def __init__(self, base_url: str, token: str, timeout: float = HTTP_TIMEOUT_SECONDS) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None, *, ok: tuple[int, ...] = (200,)) -> tuple[int, Any]:
        """Send one request; return (status, parsed JSON body or None).

        Raises:
            GrafanaError: the status is not in ``ok``.
        """
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method, headers={
            "Authorization": f"Bearer {self._token}", "Content-Type": "application/json",
            "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 (https URL from the stack)
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        parsed = json.loads(raw) if raw else None
        if status not in ok:
            raise GrafanaError(f"{method} {path}: HTTP {status}: {raw[:500].decode(errors='replace')}")
        return status, parsed


def wait_until_ready(base_url: str, deadline: float, *, clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep) -> None:
    """Poll ``GET /api/health`` until it answers 200 or ``deadline`` (a ``clock()`` value) passes.

    Raises:
        TimeoutError: still not ready at the deadline (names the last answer).
    """
    last = "no answer"
    while True:
        try:
            with urllib.request.urlopen(f"{base_url}/api/health", timeout=HTTP_TIMEOUT_SECONDS) as response:  # noqa: S310
                if response.status == 200:
                    return
                last = f"HTTP {response.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        if clock() + READY_POLL_SECONDS > deadline:
            raise TimeoutError(f"Grafana at {base_url} not ready before the deadline (last: {last}); a private "
                               "workspace answers only through its VPC endpoint, so its host name must resolve to "
                               "the endpoint in the handler's subnets (docs/observability.md, 'Reaching a private "
                               "workspace')")
        sleep(READY_POLL_SECONDS)


def datasource_body(request: Request) -> dict[str, Any]:
    """The Prometheus data source of the AMP workspace, SigV4-signed with the workspace's role."""
    return {
        "uid": request.datasource_uid, "name": request.datasource_name, "type": "prometheus", "access": "proxy",
        "url": request.prometheus_url, "isDefault": True,
        "jsonData": {"httpMethod": "POST", "sigV4Auth": True, "sigV4AuthType": SIGV4_AUTH_TYPE,
                     "sigV4Region": request.region},
    }


def upsert_datasource(api: GrafanaApi, request: Request) -> str:
    """Create the data source, or update it in place (same uid); return ``"created"`` or ``"updated"``."""
    status, _ = api.call("GET", f"/api/datasources/uid/{request.datasource_uid}", ok=(200, 404))
    if status == 200:
        api.call("PUT", f"/api/datasources/uid/{request.datasource_uid}", datasource_body(request))
        return "updated"
    api.call("POST", "/api/datasources", datasource_body(request))
    return "created"


def bind_datasource(model: dict[str, Any], uid: str, name: str) -> dict[str, Any]:
    """A copy of a dashboard model whose data-source variables (type ``datasource``) select ``uid``."""
    bound = json.loads(json.dumps(model))
    for variable in bound.get("templating", {}).get("list", []):
        if variable.get("type") == "datasource":
            variable["current"] = {"selected": True, "text": name, "value": uid}
    bound.pop("id", None)  # Grafana matches by uid; a stale numeric id would be refused
    return bound


def import_dashboard(api: GrafanaApi, model: dict[str, Any], message: str) -> str:
    """``POST /api/dashboards/db`` with ``overwrite: true``; return the dashboard's uid."""
    _, answer = api.call("POST", "/api/dashboards/db", {"dashboard": model, "overwrite": True, "message": message})
    return str((answer or {}).get("uid") or model.get("uid"))


def find_service_account(grafana: Any, workspace_id: str, name: str) -> str | None:
    """Id of the workspace's service account called ``name``, or None (follows ``nextToken``)."""
    kwargs: dict[str, Any] = {"workspaceId": workspace_id}
    while True:
        page = grafana.list_workspace_service_accounts(**kwargs)
        for account in page.get("serviceAccounts", []):
            if account["name"] == name:
                return str(account["id"])
        if not page.get("nextToken"):
            return None
        kwargs["nextToken"] = page["nextToken"]


def ensure_service_account(grafana: Any, workspace_id: str, name: str) -> str:
    """Id of the service account ``name``, created with :data:`SERVICE_ACCOUNT_ROLE` if missing."""
    found = find_service_account(grafana, workspace_id, name)
    if found is not None:
        return found
    created = grafana.create_workspace_service_account(workspaceId=workspace_id, name=name,
                                                       grafanaRole=SERVICE_ACCOUNT_ROLE)
    return str(created["id"])


def delete_expired_tokens(grafana: Any, workspace_id: str, account_id: str, now: datetime) -> int:
    """Delete the account's tokens that expired before ``now`` (an earlier run killed mid-way); return how many."""
    deleted, kwargs = 0, {"workspaceId": workspace_id, "serviceAccountId": account_id}
    while True:
        page = grafana.list_workspace_service_account_tokens(**kwargs)
        for token in page.get("serviceAccountTokens", []):
            if token.get("expiresAt") is not None and token["expiresAt"] <= now:
                grafana.delete_workspace_service_account_token(workspaceId=workspace_id, serviceAccountId=account_id,
                                                               tokenId=token["id"])
                deleted += 1
        if not page.get("nextToken"):
            return deleted
        kwargs["nextToken"] = page["nextToken"]


@contextmanager
def short_lived_token(grafana: Any, workspace_id: str, account_id: str, name: str) -> Iterator[str]:
    """A token of the service account for the ``with`` block; deleted on the way out, also on failure."""
    created = grafana.create_workspace_service_account_token(
        workspaceId=workspace_id, serviceAccountId=account_id, name=name, secondsToLive=TOKEN_SECONDS_TO_LIVE)
    token = created["serviceAccountToken"]
    try:
        yield token["key"]
    finally:
        try:
            grafana.delete_workspace_service_account_token(workspaceId=workspace_id, serviceAccountId=account_id,
                                                           tokenId=token["id"])
        except Exception:  # noqa: BLE001 - the token expires on its own; the next run deletes it
            LOG.exception("could not delete token %s of service account %s (it expires in %d s)",
                          token["id"], account_id, TOKEN_SECONDS_TO_LIVE)


def load_dashboards(s3: Any, bucket: str, key: str) -> list[dict[str, Any]]:
    """The dashboard models of the asset (a JSON list).

    Raises:
        ValueError: the object is not a JSON list of objects with a ``uid``.
    """
    models = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    if not isinstance(models, list) or not all(isinstance(m, dict) and m.get("uid") for m in models):
        raise ValueError(f"s3://{bucket}/{key} is not a JSON list of dashboards with a uid")
    return models


def provision(request: Request, *, grafana: Any, s3: Any, token_name: str, seconds_left: Callable[[], float],
              clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
              now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)) -> dict[str, str]:
    """Steps 1-6 of the module docstring; return the custom resource's ``Data``.

    Args:
        grafana, s3: boto3 clients (``grafana``, ``s3``).
        token_name: name of this run's token (unique per request).
        seconds_left: seconds until the Lambda is killed (``context.get_remaining_time_in_millis``).

    Raises:
        GrafanaError, TimeoutError, botocore errors: the request fails.
    """
    dashboards = load_dashboards(s3, request.dashboards_bucket, request.dashboards_key)
    account_id = ensure_service_account(grafana, request.workspace_id, request.service_account_name)
    pruned = delete_expired_tokens(grafana, request.workspace_id, account_id, now())
    if pruned:
        LOG.info("deleted %d expired token(s) of service account %s", pruned, account_id)
    with short_lived_token(grafana, request.workspace_id, account_id, token_name) as token:
        budget = min(request.ready_timeout_seconds, seconds_left() - RESERVE_SECONDS)
        wait_until_ready(request.grafana_url, clock() + budget, clock=clock, sleep=sleep)
        api = GrafanaApi(request.grafana_url, token)
        datasource = upsert_datasource(api, request)
        uids = []
        for model in dashboards:
            if seconds_left() < RESERVE_SECONDS:
                raise TimeoutError("no time left to import the remaining dashboards; deploy again")
            uids.append(import_dashboard(api, bind_datasource(model, request.datasource_uid, request.datasource_name),
                                         message=f"provisioned by CloudFormation ({request.dashboards_key})"))
    LOG.info("data source %s %s; dashboards %s imported", request.datasource_uid, datasource, uids)
    return {"DataSourceUid": request.datasource_uid, "DashboardUids": ",".join(uids)}


def remove(request: Request, *, grafana: Any) -> bool:
    """Delete this stack's service account (dashboards and data source stay); True if one was deleted.

    A workspace or account already gone is not an error.
    """
    try:
        account_id = find_service_account(grafana, request.workspace_id, request.service_account_name)
        if account_id is None:
            return False
        grafana.delete_workspace_service_account(workspaceId=request.workspace_id, serviceAccountId=account_id)
        return True
    except grafana.exceptions.ResourceNotFoundException:
        return False


def physical_id(request: Request) -> str:
    """One provisioning per workspace: a new workspace id replaces the resource (and deletes the old one)."""
    return f"{request.workspace_id}/grafana-provisioning"


def on_event(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Provider-framework entry point (``handler.on_event``)."""
    import boto3  # the Lambda runtime's; imported here so the module loads without it

    request = Request.from_properties(event["ResourceProperties"])
    grafana = boto3.client("grafana", region_name=request.region)
    if event["RequestType"] == "Delete":
        remove(request, grafana=grafana)
        return {"PhysicalResourceId": event.get("PhysicalResourceId") or physical_id(request)}
    data = provision(request, grafana=grafana, s3=boto3.client("s3"),
                     token_name=f"cfn-{event['RequestId']}"[:128],
                     seconds_left=lambda: context.get_remaining_time_in_millis() / 1000)
    return {"PhysicalResourceId": physical_id(request), "Data": data}
