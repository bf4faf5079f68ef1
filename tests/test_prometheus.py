"""Debian's `prometheus` (installed by make sysdeps) scrapes a service's metrics endpoint
(services/stream/metrics.py) and a metric the service set is read back through Prometheus's HTTP
API, by the name the Grafana dashboard queries it."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request

import pytest

from cep_service.stream.broker import free_port
from cep_service.stream.metrics import Metrics
from cep_service.stream.pipeline import wait_for

PROMETHEUS = shutil.which("prometheus")


@pytest.fixture(autouse=True)
def prometheus_installed():
    """make test installs it (make sysdeps): its absence is a failure, not a skip."""
    if PROMETHEUS is None:
        pytest.fail("Debian's prometheus is not installed: run make sysdeps")


def query(port: int, expr: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return json.loads(reply.read())["data"]["result"]
    except OSError:
        return []


def test_prometheus_scrapes_a_service(tmp_path):
    metrics = Metrics("worker", free_port())
    metrics.lag.set(1234)
    metrics.events_in.inc(7)
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: cep\n"
                      f"    static_configs:\n      - targets: ['127.0.0.1:{metrics.port}']\n"
                      "        labels: {service: worker}\n")
    server = subprocess.Popen([PROMETHEUS, f"--config.file={config}",
                               f"--storage.tsdb.path={tmp_path / 'data'}",
                               f"--web.listen-address=127.0.0.1:{port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: query(port, 'cep_consumer_lag{service="worker"}'), 60,
                 "the first scrape", interval_s=0.5)
        [lag] = query(port, 'sum by (service) (cep_consumer_lag)')
        assert lag["metric"] == {"service": "worker"} and float(lag["value"][1]) == 1234
        [events] = query(port, "cep_events_in_total")
        assert float(events["value"][1]) == 7
    finally:
        server.terminate()
        server.wait(30)
        metrics.close()
