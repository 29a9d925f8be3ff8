"""Real boto3 clients answered by botocore's Stubber, for the operator tools' AWS calls (no account
is reachable here): every request and answer is still checked against the installed service models."""

from __future__ import annotations

import json
from typing import Any

import boto3
from botocore.stub import Stubber


def offline_client(service: str, region: str) -> Any:
    """A boto3 client of ``service`` in ``region`` with dummy credentials (to be wrapped in a Stubber)."""
    return boto3.session.Session(aws_access_key_id="AKIAEXAMPLE", aws_secret_access_key="secret",
                                 region_name=region).client(service)


def stub_get_template(stub: Stubber, stack: str, deployed: dict[str, Any] | None) -> None:
    """CloudFormation's next ``GetTemplate`` of ``stack`` (original stage) answers ``deployed``, or, when
    None, the ValidationError CloudFormation gives for a stack that does not exist."""
    params = {"StackName": stack, "TemplateStage": "Original"}
    if deployed is None:
        stub.add_client_error("get_template", "ValidationError", f"Stack with id {stack} does not exist",
                              expected_params=params)
    else:
        stub.add_response("get_template", {"TemplateBody": json.dumps(deployed)}, params)
