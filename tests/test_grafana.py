"""The Grafana dashboard of the compose stack: it parses, every metric it queries is one
the services export (services/stream/metrics.py, as prometheus-client names its samples), and
the compose file provisions it with the Prometheus data source it names."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from cep_service.stream.metrics import Metrics

ROOT = Path(__file__).resolve().parent.parent
GRAFANA = ROOT / "services" / "grafana"
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count",
                                                             "_created"),
            "gauge": ("",)}


def exported() -> set[str]:
    names = set()
    for family in Metrics("worker").registry.collect():
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
    return names


def test_every_metric_of_the_dashboard_is_exported():
    dashboard = json.loads((GRAFANA / "dashboards" / "cep.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    queried = {name for expr in exprs for name in re.findall(r"\bcep_[a-z_]+", expr)}
    assert len(queried) >= 10
    assert queried <= exported(), queried - exported()
    uids = {t["datasource"]["uid"] for panel in dashboard["panels"] for t in panel["targets"]}
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    sources = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml")
                             .read_text())["datasources"]
    assert uids == {s["uid"] for s in sources}


def test_compose_provisions_grafana_and_the_api():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    grafana = compose["services"]["grafana"]
    mounted = {v.split(":")[0]: v.split(":")[1] for v in grafana["volumes"]}
    assert mounted["./services/grafana/dashboards"] == "/var/lib/grafana/dashboards"
    assert mounted["./services/grafana/provisioning"] == "/etc/grafana/provisioning"
    provider = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "cep.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == \
        mounted["./services/grafana/dashboards"]
    api = compose["services"]["api"]
    assert api["command"][:2] == ["serve", "api"]
    # no default token: compose refuses to start the API without the user's own
    assert api["environment"]["CEP_API_TOKEN"].startswith("${CEP_API_TOKEN:?")
