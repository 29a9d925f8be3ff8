"""Provisioning of the Grafana workspace at deploy: the handler against a fake Grafana, and the stack's wiring.

The handler (``observability/grafana_provisioning/handler.py``) runs here against

* a fake Grafana HTTP API: ``http.server`` on 127.0.0.1, holding data sources and dashboards by uid
  and accepting only the bearer token the (stubbed) AWS API handed out. It models Grafana's
  answers to the calls the handler makes (``/api/health``, ``/api/datasources[/uid/<uid>]``,
  ``/api/dashboards/db``: 200, 404 for an unknown uid, 409 for a duplicate data source uid, 412
  for an existing dashboard without ``overwrite``, 401 for a wrong token); not Grafana's
  validation of the bodies, its folders or permissions;
* botocore ``Stubber``s for the ``grafana`` and ``s3`` clients, which check every AWS call's
  parameters against the service model and the expected values.
"""

from __future__ import annotations

import ast
import io
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import boto3
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber

from kv_constructs import grafana_provisioning as construct
from observability import dashboards
from observability.grafana_provisioning import handler
from tests.fake_http import JsonServer

WORKSPACE = "g-0123456789"
ACCOUNT_ID = "sa-1"
BUCKET, KEY = "cdk-assets", "abc.json"


class FakeGrafana:
    """State and request log of the fake Grafana HTTP API."""

    def __init__(self) -> None:
        self.datasources: dict[str, dict[str, Any]] = {}
        self.dashboards: dict[str, dict[str, Any]] = {}
        self.versions: dict[str, int] = {}
        self.valid_tokens: set[str] = set()
        self.calls: list[tuple[str, str]] = []
        self.unhealthy_probes = 0
        self.fail_dashboards = False

    def answer(self, method: str, path: str, token: str | None, body: Any) -> tuple[int, Any]:
        self.calls.append((method, path))
        if path == "/api/health":
            if self.unhealthy_probes > 0:
                self.unhealthy_probes -= 1
                return 503, {"database": "failing"}
            return 200, {"database": "ok"}
        if token not in self.valid_tokens:
            return 401, {"message": "invalid API key"}
        if path.startswith("/api/datasources/uid/"):
            uid = path.rsplit("/", 1)[1]
            if uid not in self.datasources:
                return 404, {"message": "Data source not found"}
            if method == "PUT":
                self.datasources[uid] = body
                return 200, {"message": "Datasource updated"}
            return 200, self.datasources[uid]
        if path == "/api/datasources" and method == "POST":
            if body["uid"] in self.datasources:
                return 409, {"message": "data source with the same uid already exists"}
            self.datasources[body["uid"]] = body
            return 200, {"message": "Datasource added"}
        if path == "/api/dashboards/db" and method == "POST":
            if self.fail_dashboards:
                return 500, {"message": "internal error"}
            model = body["dashboard"]
            if model["uid"] in self.dashboards and not body.get("overwrite"):
                return 412, {"status": "version-mismatch"}
            self.dashboards[model["uid"]] = model
            self.versions[model["uid"]] = self.versions.get(model["uid"], 0) + 1
            return 200, {"uid": model["uid"], "status": "success", "version": self.versions[model["uid"]]}
        return 404, {"message": "not found"}


@pytest.fixture
def grafana_server() -> Iterator[tuple[FakeGrafana, str]]:
    state = FakeGrafana()

    def answer(method: str, path: str, body: Any, headers: Any) -> tuple[int, Any]:
        auth = headers.get("Authorization", "")
        return state.answer(method, path, auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None, body)

    with JsonServer(answer) as server:
        yield state, server.url


def _request(url: str, **overrides: Any) -> handler.Request:
    props = {"WorkspaceId": WORKSPACE, "WorkspaceEndpoint": url,
             "PrometheusUrl": "https://aps-workspaces.us-west-2.amazonaws.com/workspaces/ws-1/",
             "Region": "us-west-2", "DataSourceUid": "kvcache-amp", "DataSourceName": "AMP",
             "DashboardsBucket": BUCKET, "DashboardsKey": KEY, "ServiceAccountName": "kvcache-provisioning",
             "ReadyTimeoutSeconds": "120", **overrides}
    return handler.Request.from_properties(props)


@pytest.fixture(scope="module")
def models(obs_project) -> list[dict[str, Any]]:
    return [dashboards.build_dashboard(obs_project.platform, obs_project.business_lines)]


def _clients() -> tuple[Any, Stubber, Any, Stubber]:
    grafana = boto3.client("grafana", region_name="us-west-2", aws_access_key_id="x", aws_secret_access_key="x")
    s3 = boto3.client("s3", region_name="us-west-2", aws_access_key_id="x", aws_secret_access_key="x")
    return grafana, Stubber(grafana), s3, Stubber(s3)


def _stub_dashboards(s3_stub: Stubber, models: list[dict[str, Any]]) -> None:
    raw = json.dumps(models).encode()
    s3_stub.add_response("get_object", {"Body": StreamingBody(io.BytesIO(raw), len(raw))},
                         {"Bucket": BUCKET, "Key": KEY})


def _stub_account(stub: Stubber, *, exists: bool, expired_tokens: tuple[str, ...] = ()) -> None:
    accounts = [{"id": "sa-other", "name": "someone-else", "isDisabled": "false", "grafanaRole": "VIEWER"}]
    if exists:
        accounts.append({"id": ACCOUNT_ID, "name": "kvcache-provisioning", "isDisabled": "false",
                         "grafanaRole": "ADMIN"})
    stub.add_response("list_workspace_service_accounts", {"serviceAccounts": accounts, "workspaceId": WORKSPACE},
                      {"workspaceId": WORKSPACE})
    if not exists:
        stub.add_response("create_workspace_service_account",
                          {"id": ACCOUNT_ID, "name": "kvcache-provisioning", "grafanaRole": "ADMIN",
                           "workspaceId": WORKSPACE},
                          {"workspaceId": WORKSPACE, "name": "kvcache-provisioning", "grafanaRole": "ADMIN"})
    past, future = datetime(2026, 1, 1, tzinfo=timezone.utc), datetime(2999, 1, 1, tzinfo=timezone.utc)
    tokens = [{"id": t, "name": t, "createdAt": past - timedelta(hours=1), "expiresAt": past} for t in expired_tokens]
    tokens.append({"id": "live", "name": "live", "createdAt": past, "expiresAt": future})
    stub.add_response("list_workspace_service_account_tokens",
                      {"serviceAccountTokens": tokens, "serviceAccountId": ACCOUNT_ID, "workspaceId": WORKSPACE},
                      {"workspaceId": WORKSPACE, "serviceAccountId": ACCOUNT_ID})
    for token in expired_tokens:
        stub.add_response("delete_workspace_service_account_token",
                          {"tokenId": token, "serviceAccountId": ACCOUNT_ID, "workspaceId": WORKSPACE},
                          {"workspaceId": WORKSPACE, "serviceAccountId": ACCOUNT_ID, "tokenId": token})


def _stub_token(stub: Stubber, state: FakeGrafana, key: str) -> None:
    state.valid_tokens.add(key)
    stub.add_response("create_workspace_service_account_token",
                      {"serviceAccountToken": {"id": f"id-{key}", "name": "cfn-r", "key": key},
                       "serviceAccountId": ACCOUNT_ID, "workspaceId": WORKSPACE},
                      {"workspaceId": WORKSPACE, "serviceAccountId": ACCOUNT_ID, "name": "cfn-r",
                       "secondsToLive": handler.TOKEN_SECONDS_TO_LIVE})
    stub.add_response("delete_workspace_service_account_token",
                      {"tokenId": f"id-{key}", "serviceAccountId": ACCOUNT_ID, "workspaceId": WORKSPACE},
                      {"workspaceId": WORKSPACE, "serviceAccountId": ACCOUNT_ID, "tokenId": f"id-{key}"})


def _stub_run(stub: Stubber, s3_stub: Stubber, state: FakeGrafana, models: list[dict[str, Any]], *, key: str = "t",
              exists: bool = True, expired_tokens: tuple[str, ...] = ()) -> None:
    """Every AWS call of one provisioning run, in order: dashboards, account, expired tokens, token."""
    _stub_dashboards(s3_stub, models)
    _stub_account(stub, exists=exists, expired_tokens=expired_tokens)
    _stub_token(stub, state, key)


def _provision(request: handler.Request, grafana: Any, s3: Any, **kwargs: Any) -> dict[str, str]:
    return handler.provision(request, grafana=grafana, s3=s3, token_name="cfn-r", seconds_left=lambda: 400.0,
                             **kwargs)


def test_create_then_update_is_idempotent_and_never_keeps_a_token(grafana_server, models) -> None:
    state, url = grafana_server
    grafana, stub, s3, s3_stub = _clients()
    with stub, s3_stub:
        _stub_run(stub, s3_stub, state, models, key="first", exists=False)
        data = _provision(_request(url), grafana, s3)
        stub.assert_no_pending_responses()  # the token was deleted
    uid = models[0]["uid"]
    assert data == {"DataSourceUid": "kvcache-amp", "DashboardUids": uid}
    assert list(state.datasources) == ["kvcache-amp"] and list(state.dashboards) == [uid]
    assert ("POST", "/api/datasources") in state.calls

    # Update: the same account is found, the data source is updated in place, the dashboard replaced.
    state.calls.clear()
    grafana, stub, s3, s3_stub = _clients()
    with stub, s3_stub:
        _stub_run(stub, s3_stub, state, models, key="second", expired_tokens=("left-by-a-killed-run",))
        _provision(_request(url), grafana, s3)
        stub.assert_no_pending_responses()
    assert ("POST", "/api/datasources") not in state.calls and ("PUT", "/api/datasources/uid/kvcache-amp") in state.calls
    assert list(state.datasources) == ["kvcache-amp"]  # created once
    assert state.versions[uid] == 2  # upserted (overwrite), not duplicated


def test_the_data_source_signs_with_the_workspace_role_and_the_dashboard_binds_to_it(grafana_server, models) -> None:
    state, url = grafana_server
    grafana, stub, s3, s3_stub = _clients()
    with stub, s3_stub:
        _stub_run(stub, s3_stub, state, models, key="t")
        _provision(_request(url), grafana, s3)
    source = state.datasources["kvcache-amp"]
    assert (source["type"], source["access"], source["url"]) == (
        "prometheus", "proxy", "https://aps-workspaces.us-west-2.amazonaws.com/workspaces/ws-1/")
    assert source["jsonData"] == {"httpMethod": "POST", "sigV4Auth": True, "sigV4AuthType": "ec2_iam_role",
                                  "sigV4Region": "us-west-2"}
    imported = state.dashboards[models[0]["uid"]]
    (variable,) = [v for v in imported["templating"]["list"] if v["type"] == "datasource"]
    assert variable["current"]["value"] == "kvcache-amp"
    assert imported["panels"] == models[0]["panels"]


def test_token_is_deleted_when_grafana_fails(grafana_server, models) -> None:
    state, url = grafana_server
    state.fail_dashboards = True
    grafana, stub, s3, s3_stub = _clients()
    with stub, s3_stub:
        _stub_run(stub, s3_stub, state, models, key="t")
        with pytest.raises(handler.GrafanaError, match="HTTP 500") as failure:
            _provision(_request(url), grafana, s3)
        stub.assert_no_pending_responses()  # delete_workspace_service_account_token was called
    assert "t" not in str(failure.value).split()  # the message does not carry the token


def test_token_is_deleted_when_grafana_never_gets_ready(grafana_server, models) -> None:
    state, url = grafana_server
    state.unhealthy_probes = 10**6
    now = [0.0]
    grafana, stub, s3, s3_stub = _clients()
    with stub, s3_stub:
        _stub_run(stub, s3_stub, state, models, key="t")
        with pytest.raises(TimeoutError, match="HTTP 503") as err:
            _provision(_request(url, ReadyTimeoutSeconds="60"), grafana, s3, clock=lambda: now[0],
                       sleep=lambda s: now.__setitem__(0, now[0] + s))
        assert "resolve to the endpoint" in str(err.value)  # the private workspace's likeliest cause
        stub.assert_no_pending_responses()
    assert 60 - handler.READY_POLL_SECONDS <= now[0] <= 60  # waited its budget, not longer
    assert state.datasources == {}


def test_a_workspace_that_answers_late_is_waited_for(grafana_server, models) -> None:
    state, url = grafana_server
    state.unhealthy_probes = 3
    slept: list[float] = []
    grafana, stub, s3, s3_stub = _clients()
    with stub, s3_stub:
        _stub_run(stub, s3_stub, state, models, key="t")
        _provision(_request(url), grafana, s3, sleep=slept.append)
    assert slept == [handler.READY_POLL_SECONDS] * 3 and list(state.dashboards) == [models[0]["uid"]]


def test_a_wrong_token_fails_loudly(grafana_server, models) -> None:
    state, url = grafana_server
    grafana, stub, s3, s3_stub = _clients()
    with stub, s3_stub:
        _stub_run(stub, s3_stub, state, models, key="t")
        state.valid_tokens.clear()
        with pytest.raises(handler.GrafanaError, match="HTTP 401"):
            _provision(_request(url), grafana, s3)
        stub.assert_no_pending_responses()


def test_delete_removes_the_service_account_and_leaves_the_dashboards(grafana_server) -> None:
    state, url = grafana_server
    state.dashboards["kvcache-kv-tiers"] = {"uid": "kvcache-kv-tiers"}
    grafana, stub, _, _ = _clients()
    with stub:
        stub.add_response(
            "list_workspace_service_accounts",
            {"serviceAccounts": [{"id": ACCOUNT_ID, "name": "kvcache-provisioning", "isDisabled": "false",
                                  "grafanaRole": "ADMIN"}], "workspaceId": WORKSPACE}, {"workspaceId": WORKSPACE})
        stub.add_response("delete_workspace_service_account", {"serviceAccountId": ACCOUNT_ID, "workspaceId": WORKSPACE},
                          {"workspaceId": WORKSPACE, "serviceAccountId": ACCOUNT_ID})
        assert handler.remove(_request(url), grafana=grafana) is True
        # The workspace is already gone (deleted with the stack): not an error.
        stub.add_client_error("list_workspace_service_accounts", service_error_code="ResourceNotFoundException",
                              http_status_code=404)
        assert handler.remove(_request(url), grafana=grafana) is False
        stub.assert_no_pending_responses()
    assert list(state.dashboards) == ["kvcache-kv-tiers"] and state.calls == []


def test_on_event_answers_the_provider_framework(grafana_server, models, monkeypatch) -> None:
    state, url = grafana_server
    grafana, stub, s3, s3_stub = _clients()
    monkeypatch.setattr(boto3, "client", lambda service, **_: {"grafana": grafana, "s3": s3}[service])

    class Context:
        @staticmethod
        def get_remaining_time_in_millis() -> int:
            return 400_000

    event = {"RequestType": "Create", "RequestId": "r", "ResourceProperties": {
        "ServiceToken": "arn:aws:lambda:us-west-2:111122223333:function:f", "WorkspaceId": WORKSPACE,
        "WorkspaceEndpoint": url, "PrometheusUrl": "https://aps/ws/", "Region": "us-west-2",
        "DataSourceUid": "kvcache-amp", "DataSourceName": "AMP", "DashboardsBucket": BUCKET, "DashboardsKey": KEY,
        "ServiceAccountName": "kvcache-provisioning", "ReadyTimeoutSeconds": "120"}}
    with stub, s3_stub:
        _stub_run(stub, s3_stub, state, models, key="t")
        answer = handler.on_event(event, Context())
    assert answer == {"PhysicalResourceId": f"{WORKSPACE}/grafana-provisioning",
                      "Data": {"DataSourceUid": "kvcache-amp", "DashboardUids": models[0]["uid"]}}
    assert len(json.dumps(answer)) < 4096  # CloudFormation's limit on a custom resource's response


def test_missing_properties_are_named() -> None:
    with pytest.raises(ValueError, match="DashboardsKey, ServiceAccountName"):
        handler.Request.from_properties({"WorkspaceId": WORKSPACE, "WorkspaceEndpoint": "g.example",
                                         "PrometheusUrl": "u", "Region": "r", "DataSourceUid": "d",
                                         "DataSourceName": "n", "DashboardsBucket": "b", "ReadyTimeoutSeconds": "1"})
    assert _request("g-0123456789.grafana-workspace.us-west-2.amazonaws.com").grafana_url == (
        "https://g-0123456789.grafana-workspace.us-west-2.amazonaws.com")


def test_the_handler_asset_needs_only_the_standard_library_and_boto3() -> None:
    """The directory is the whole Lambda asset: nothing of this repository may be imported."""
    import sys

    for path in Path(handler.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                   for alias in node.names}
        modules |= {node.module.split(".")[0] for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
        assert modules - {"__future__", "boto3"} <= set(sys.stdlib_module_names), path.name


def test_token_outlives_the_handler_only_briefly() -> None:
    lifetime = construct.HANDLER_TIMEOUT.to_seconds()
    assert lifetime < handler.TOKEN_SECONDS_TO_LIVE <= 2 * lifetime  # and far below the API's 30 days
    assert construct.READY_TIMEOUT.to_seconds() + handler.RESERVE_SECONDS < lifetime


# --- The stack's side -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def obs_template(templates, obs_project):
    return templates[f"{obs_project.platform.project}-observability"]


def test_custom_resource_targets_this_workspace_and_prometheus(obs_template) -> None:
    from aws_cdk.assertions import Capture, Match

    dashboards_key = Capture()
    obs_template.has_resource_properties(construct.RESOURCE_TYPE, {
        "WorkspaceId": {"Fn::GetAtt": [Match.any_value(), "Id"]},
        "WorkspaceEndpoint": {"Fn::GetAtt": [Match.any_value(), "Endpoint"]},
        "PrometheusUrl": {"Fn::GetAtt": [Match.any_value(), "PrometheusEndpoint"]},
        "DataSourceUid": "kvcache-amp", "DashboardsKey": dashboards_key,
        "ReadyTimeoutSeconds": construct.READY_TIMEOUT.to_seconds(),
    })
    ((_, resource),) = obs_template.find_resources(construct.RESOURCE_TYPE).items()
    resources = obs_template.to_json()["Resources"]
    grafana_id = resource["Properties"]["WorkspaceId"]["Fn::GetAtt"][0]
    amp_id = resource["Properties"]["PrometheusUrl"]["Fn::GetAtt"][0]
    assert resources[grafana_id]["Type"] == "AWS::Grafana::Workspace"
    assert resources[amp_id]["Type"] == "AWS::APS::Workspace"
    assert dashboards_key.as_string().endswith(".json")


def test_dashboards_ship_as_an_asset_equal_to_the_written_json(obs_template, synthesized, platform) -> None:
    """The template carries a reference, not the JSON (50 lines are ~480 KB, see the size test)."""
    ((_, resource),) = obs_template.find_resources(construct.RESOURCE_TYPE).items()
    key = resource["Properties"]["DashboardsKey"]
    staged = synthesized.outdir / f"asset.{key}"
    assert json.loads(staged.read_text()) == platform.observability.dashboards
    assert platform.observability.dashboards[0]["uid"] not in json.dumps(obs_template.to_json()["Resources"])


def test_handler_role_is_scoped_to_the_workspace_and_the_asset(obs_template) -> None:
    ((_, function),) = [(k, f) for k, f in obs_template.find_resources("AWS::Lambda::Function").items()
                        if f["Properties"].get("Handler") == "handler.on_event"]
    props = function["Properties"]
    assert props["Timeout"] == construct.HANDLER_TIMEOUT.to_seconds() and props["Runtime"] == construct.RUNTIME.name
    role_id = props["Role"]["Fn::GetAtt"][0]
    (policy,) = [p for p in obs_template.find_resources("AWS::IAM::Policy").values()
                 if {"Ref": role_id} in p["Properties"]["Roles"]]
    statements = {s["Sid"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}
    grafana = statements["ServiceAccountAndShortLivedTokensOfThisWorkspace"]
    assert sorted(grafana["Action"]) == sorted(construct.GRAFANA_ACTIONS)
    ((workspace_id, _),) = obs_template.find_resources("AWS::Grafana::Workspace").items()
    assert grafana["Resource"]["Fn::Join"][1][-1] == {"Fn::GetAtt": [workspace_id, "Id"]}
    assert grafana["Resource"]["Fn::Join"][1][0].endswith(":/workspaces/")
    ((_, resource),) = obs_template.find_resources(construct.RESOURCE_TYPE).items()
    asset = statements["ReadTheDashboardsAsset"]
    assert asset["Action"] == "s3:GetObject"
    assert asset["Resource"].endswith(f"/{resource['Properties']['DashboardsKey']}")
    assert not any("*" in a for s in statements.values() for a in ([s["Action"]] if isinstance(s["Action"], str)
                                                                   else s["Action"]))


def test_no_provisioning_without_a_workspace(obs_project, tmp_path) -> None:
    import stacks
    from aws_cdk.assertions import Template
    from platform_config import load_project
    from tests.example_config import copy_example_config, edit_yaml

    config = copy_example_config(tmp_path / "config")
    edit_yaml(config / "platform.yaml", lambda d: d.setdefault("observability", {}).setdefault(
        "grafana", {}).update({"create_workspace": False}))
    app = stacks.new_app(outdir=str(tmp_path / "out"))
    built = stacks.build_platform(app, load_project(config))
    template = Template.from_stack(built.observability)
    assert template.find_resources(construct.RESOURCE_TYPE) == {}
    assert template.find_resources("AWS::Grafana::Workspace") == {}
    assert built.observability.dashboards  # still written to cdk.out/dashboards/ by app.py


def test_fifty_lines_of_dashboard_json_are_too_big_for_a_property(obs_project) -> None:
    """Why an asset: 50 business lines make ~480 KB of compact JSON, half of CloudFormation's 1 MB template."""
    lines = obs_project.business_lines
    many = tuple(lines[i % len(lines)].model_copy(update={"name": f"{lines[i % len(lines)].name}-{i}",
                                                          "namespace": f"ns-{i}"}) for i in range(50))
    size = len(json.dumps(dashboards.build_dashboard(obs_project.platform, many), separators=(",", ":")))
    assert size > 400_000
