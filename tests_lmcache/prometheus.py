"""A live Prometheus server for the test tiers: the generated rules and scrape jobs, real targets.

:class:`LivePrometheus` starts Debian's ``prometheus`` (2.42.0, ``make system-deps``) on loopback
with

* the **scrape jobs the AMP scraper runs** (:func:`observability.targets.scrape_configuration`,
  exported as rendered): every job name and relabel rule unchanged; only Kubernetes discovery is
  replaced by file discovery (Debian's build has none, ``tests.observability.promtool.with_file_sd``),
  whose target groups carry the ``__meta_kubernetes_*`` labels pod discovery would give the pods
  (:meth:`LivePrometheus.set_targets`), so the job's own relabelling decides what is scraped and
  with which labels; and the scrape interval shortened to ``scrape_interval``;
* the **rule file the stack sends to AMP** with, as the only changes, every group's evaluation
  interval set to ``evaluation_interval`` and every ``for:`` to 0 (:func:`fast_rules`): expressions,
  labels and annotations are the generated ones. The ``for:`` windows are proven by
  ``promtool test rules`` (``tests/observability/test_promtool.py``); here an alert fires at the
  first evaluation its expression holds, so a test waits seconds, not the 10-30 minutes of ``for:``.

It reads Prometheus' HTTP API (``/api/v1/alerts``, ``/api/v1/query``, ``/api/v1/targets``). Made to be
reused by other tiers (the L2 fault tier): give it the exported document's ``rule_file`` and
``scrape_config``, the targets, and poll :meth:`LivePrometheus.wait_for_alert`.
"""

from __future__ import annotations

import calendar
import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable

import yaml

from tests.observability.promtool import binary, with_file_sd


def fast_rules(rule_file: str, evaluation_interval: str) -> str:
    """``rule_file`` with every group's ``interval`` set to ``evaluation_interval`` and every ``for:`` 0s."""
    data = yaml.safe_load(rule_file)
    for group in data["groups"]:
        group["interval"] = evaluation_interval
        for rule in group["rules"]:
            rule["for"] = "0s"
    return yaml.safe_dump(data, sort_keys=False, width=1000)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LivePrometheus:
    """A ``prometheus`` process in ``workdir`` (see the module docstring).

    Args:
        workdir: its configuration, target files, TSDB and log.
        rule_file: the generated rule file (YAML text).
        scrape_config: the generated scrape configuration.
        scrape_interval, evaluation_interval: Prometheus durations of the test.
    """

    def __init__(self, workdir: Path, *, rule_file: str, scrape_config: dict[str, Any],
                 scrape_interval: str = "1s", evaluation_interval: str = "1s") -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "rules.yaml").write_text(fast_rules(rule_file, evaluation_interval), encoding="utf-8")
        config = with_file_sd(scrape_config, workdir)
        config["global"] = {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval,
                            "evaluation_interval": evaluation_interval}
        config["rule_files"] = [str(workdir / "rules.yaml")]
        (workdir / "prometheus.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        self.jobs = [job["job_name"] for job in config["scrape_configs"]]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60) -> "LivePrometheus":
        with open(self.log_path, "w", encoding="utf-8") as log:
            self.proc = subprocess.Popen(
                [binary("prometheus"), f"--config.file={self.workdir / 'prometheus.yaml'}",
                 f"--storage.tsdb.path={self.workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
                 "--web.enable-lifecycle"],
                cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT)
        self._wait(lambda: self._get("/-/ready") is not None, timeout_s, "Prometheus to be ready")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.workdir / "data", ignore_errors=True)

    def __enter__(self) -> "LivePrometheus":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # --- targets ---------------------------------------------------------------------------

    def set_targets(self, job: str, targets: list[tuple[str, dict[str, str]]]) -> None:
        """The pods job ``job`` discovers: (``host:port``, their ``__meta_kubernetes_*`` labels)."""
        assert job in self.jobs, f"{job} is not a job of the generated scrape configuration: {self.jobs}"
        groups = [{"targets": [address], "labels": labels} for address, labels in targets]
        path = self.workdir / f"{job}.json"
        path.with_suffix(".tmp").write_text(json.dumps(groups), encoding="utf-8")
        path.with_suffix(".tmp").replace(path)

    # --- API -------------------------------------------------------------------------------

    def _get(self, path: str) -> Any:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as response:
                body = response.read()
        except OSError:
            return None
        return json.loads(body) if body.startswith(b"{") else body

    def api(self, path: str, **params: str) -> Any:
        """``data`` of ``GET /api/v1/<path>``; AssertionError unless ``status`` is ``success``."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        reply = self._get(f"/api/v1/{path}{query}")
        assert reply and reply.get("status") == "success", (path, params, reply)
        return reply["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query result (vector)."""
        return self.api("query", query=expr)["result"]

    def active_targets(self) -> list[dict[str, Any]]:
        return self.api("targets")["activeTargets"]

    def alerts(self, name: str | None = None, state: str = "firing") -> list[dict[str, Any]]:
        """Active alerts (``labels``, ``annotations``, ``state``) of ``name`` (any) in ``state``."""
        return [a for a in self.api("alerts")["alerts"]
                if (name is None or a["labels"]["alertname"] == name) and a["state"] == state]

    def _wait(self, done: Callable[[], Any], timeout_s: float, what: str) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            result = done()
            if result:
                return result
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited:\n{self.log_path.read_text()[-4000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; firing: "
                                     f"{[a['labels'] for a in self.alerts()] if what != 'Prometheus to be ready' else ''}")
            time.sleep(0.5)

    def wait_for_alert(self, name: str, labels: dict[str, str], timeout_s: float = 60) -> dict[str, Any]:
        """The firing alert ``name`` whose labels include ``labels``, once there is one."""
        return self._wait(lambda: next((a for a in self.alerts(name) if labels.items() <= a["labels"].items()), None),
                          timeout_s, f"{name} {labels} to fire")

    def wait_for_resolved(self, name: str, labels: dict[str, str], timeout_s: float = 60) -> None:
        """Until no active alert ``name`` (pending or firing) has ``labels``."""
        def gone() -> bool:
            active = self.api("alerts")["alerts"]
            return not [a for a in active if a["labels"]["alertname"] == name and labels.items() <= a["labels"].items()]
        self._wait(gone, timeout_s, f"{name} {labels} to resolve")

    def settle(self, timeout_s: float = 60) -> None:
        """Until every active target was scraped, and then every rule group evaluated, after now:
        what the alerts show next reflects the targets' state at this call."""
        start = time.time()

        def after(stamp: str) -> bool:
            # RFC 3339 with nanoseconds, UTC; seconds precision is enough against a 1 s interval.
            return calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) > start + 1

        self._wait(lambda: all(after(t["lastScrape"]) for t in self.active_targets()), timeout_s,
                   "a scrape of every target")
        start = time.time()
        self._wait(lambda: all(after(g["lastEvaluation"]) for g in self.api("rules")["groups"]), timeout_s,
                   "an evaluation of every rule group")

    def wait_for_scrapes(self, job: str, count: int, timeout_s: float = 60) -> list[dict[str, Any]]:
        """Until ``count`` targets of ``job`` are up (their last scrape succeeded)."""
        return self._wait(lambda: (lambda up: up if len(up) >= count else None)(
            [t for t in self.active_targets() if t["labels"].get("job") == job and t["health"] == "up"]),
            timeout_s, f"{count} healthy target(s) of {job}")
