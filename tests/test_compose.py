"""docker-compose.yml as Docker Compose reads it (`docker compose config`): every CEP service
has a /readyz healthcheck, Kafka keeps its data in a named volume, the schema folder is
mounted where the image's CEP_SCHEMA_PATH points. Defined only where the Docker CLI has
the compose plugin: elsewhere this module holds no test (nothing claims this coverage)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _compose_available() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        found = subprocess.run(["docker", "compose", "version"], capture_output=True,
                               timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return found.returncode == 0


if _compose_available():

    def test_compose_file_as_docker_reads_it():
        refused = subprocess.run(["docker", "compose", "config"], cwd=ROOT,
                                 capture_output=True, text=True, timeout=60,
                                 env={k: v for k, v in os.environ.items()
                                      if k != "CEP_API_TOKEN"})
        assert refused.returncode != 0 and "CEP_API_TOKEN" in refused.stderr
        result = subprocess.run(["docker", "compose", "config", "--format", "json"],
                                cwd=ROOT, capture_output=True, text=True, timeout=60,
                                env={**os.environ, "CEP_API_TOKEN": "test-token"})
        assert result.returncode == 0, result.stderr
        config = json.loads(result.stdout)
        services = config["services"]
        for name in ("splitter", "worker", "coordinator"):
            assert "/readyz" in " ".join(services[name]["healthcheck"]["test"]), name
            targets = [v["target"] for v in services[name]["volumes"]]
            assert "/etc/cep/schemas" in targets, name
        kafka_volumes = services["kafka"]["volumes"]
        assert [v["source"] for v in kafka_volumes if v["type"] == "volume"] == ["kafka-data"]
        assert "kafka-data" in config["volumes"]
