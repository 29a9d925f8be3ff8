"""Prometheus' own tools in the tests: ``promtool`` from Debian's ``prometheus`` package (2.42.0 on
Debian 12, installed by ``make system-deps`` from ``debian-packages.txt``).

Helpers only: where the binaries are, how to run ``promtool`` on files written to a directory,
and how to write ``promtool test rules`` input series and expected alerts.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

#: The Debian package that ships ``promtool`` and ``prometheus`` (debian-packages.txt).
DEBIAN_PACKAGE = "prometheus"


def binary(name: str) -> str:
    """Path of ``promtool`` or ``prometheus``; fails the test (never skips) when it is missing."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: install the Debian package {DEBIAN_PACKAGE!r} (`make system-deps`, "
                    "as root; debian-packages.txt)")
    return path


def version() -> str:
    """``promtool --version``'s first line (e.g. ``promtool, version 2.42.0+ds ...``)."""
    out = subprocess.run([binary("promtool"), "--version"], capture_output=True, text=True, check=True)
    return (out.stdout or out.stderr).splitlines()[0]


def promtool(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``promtool <args>`` in ``cwd``; stdout and stderr captured, never raises on failure."""
    return subprocess.run([binary("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def write_yaml(path: Path, data: Any) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False, width=1000), encoding="utf-8")
    return path


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    """One ``input_series`` entry: ``name{labels}`` and promtool's expanding notation (``0+10x30``)."""
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{body}}}", "values": values}


def expect(alertname: str, eval_time: str, alerts: list[tuple[dict[str, str], dict[str, str]]]) -> dict[str, Any]:
    """One ``alert_rule_test``: the alerts firing at ``eval_time``, each (labels, annotations)."""
    return {"eval_time": eval_time, "alertname": alertname,
            "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations} for labels, annotations in alerts]}


#: Debian's Prometheus is built without Kubernetes service discovery ("Kubernetes support has been
#: completely removed, due to the insane amount of dependencies in their client library",
#: /usr/share/doc/prometheus/NEWS.Debian.gz): its ``promtool`` and ``prometheus`` reject
#: ``kubernetes_sd_configs``. The same jobs with file discovery instead keep every other field.
K8S_SD = "kubernetes_sd_configs"


def with_file_sd(scrape_config: dict[str, Any], directory: Path) -> dict[str, Any]:
    """``scrape_config`` with each job's Kubernetes discovery replaced by file discovery of
    ``<directory>/<job>.json`` (relabel rules, paths, intervals unchanged), and each credential
    file (bearer token, CA) by an empty file there. The files are created
    empty (``[]``) when missing; write target groups with Kubernetes' ``__meta_kubernetes_*``
    labels into them and the job's own relabel rules do the rest, as on the cluster."""
    out = yaml.safe_load(yaml.safe_dump(scrape_config))
    for job in out["scrape_configs"]:
        # The scraper's mounted service-account token and CA (the API server job): files here,
        # as Prometheus checks that they exist.
        for holder, key, name in ((job, "bearer_token_file", "token"), (job.get("tls_config") or {}, "ca_file", "ca.crt")):
            if key in holder:
                path = directory / f"{job['job_name']}.{name}"
                path.touch()
                holder[key] = str(path)
        assert K8S_SD in job, job["job_name"]
        del job[K8S_SD]
        path = directory / f"{job['job_name']}.json"
        if not path.exists():
            path.write_text("[]\n", encoding="utf-8")
        job["file_sd_configs"] = [{"files": [str(path)], "refresh_interval": "1s"}]
    return out
