"""`cep serve splitter`: the splitter as a faust-streaming app.

Faust owns the process: start and stop, SIGTERM/SIGINT (mode's Worker), logging, the pulse
cadence (`@app.timer`) and a web view of the splitter's state (`GET /status/`: last seq,
events and frames per keyed partition, live queries, as JSON). The data stays on the
batched confluent-kafka path (Faust's per-event stream iteration tops out near 13-15k
events/s here): `SplitterLoop`, a Faust Service, runs `Splitter.loop` in its own thread.

The app joins no consumer group and starts no Faust Kafka client (`enable_kafka = False`
in its boot strategy): the splitter's confluent consumer assigns the source partitions
itself, so startup does not wait for a group join (docs/broker.md: joins wait half the
session timeout). Should Kafka be enabled, the app carries short-session settings.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import faust
from faust.app.base import BootStrategy
from faust.worker import Worker
from mode import Service

from cep_core.home import state_dir
from cep_service.stream.serve import log, log_level, logging_config
from cep_service.stream.splitter import Splitter


class SplitterBoot(BootStrategy):
    enable_kafka = False  # the data path is confluent-kafka; Faust runs web, timers, services


class SplitterApp(faust.App):
    BootStrategy = SplitterBoot


class SplitterLoop(Service):
    """The splitter's batched consume/stamp/produce loop in a thread of its own. Stopping
    the service lets the loop finish its batch, flush, commit and close."""

    def __init__(self, splitter: Splitter, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.splitter = splitter
        self.stopping = threading.Event()
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="splitter-loop")
        self.error: BaseException | None = None
        self.finished: asyncio.Future | None = None

    async def on_start(self) -> None:
        self.finished = asyncio.get_running_loop().run_in_executor(
            self.thread, self.splitter.run, self.stopping, False)

    @Service.task
    async def _watch(self) -> None:
        while self.finished is None:
            await asyncio.sleep(0.05)
        try:
            await asyncio.shield(self.finished)
        except Exception as e:  # the loop died: stop the whole app, exit non-zero
            self.error = e
            log("splitter_failed", level="error", error=repr(e))
            await self.crash(e)

    async def on_stop(self) -> None:
        self.stopping.set()
        if self.finished is not None:
            try:
                await self.finished
            except Exception as e:
                self.error = self.error or e
        self.thread.shutdown(wait=True)


def create_app(splitter: Splitter, web_port: int = 6066, web_bind: str = "0.0.0.0",
               datadir: Path | None = None) -> tuple[SplitterApp, SplitterLoop]:
    settings = splitter.settings
    app = SplitterApp(
        splitter.topics.group("splitter"), broker=f"kafka://{settings.bootstrap}",
        web_port=web_port, web_bind=web_bind, web_host="127.0.0.1", web_enabled=True,
        datadir=str(datadir or state_dir("faust")),
        autodiscover=False, broker_session_timeout=3.0, broker_heartbeat_interval=0.5,
        topic_partitions=splitter.partitions,
        broker_credentials=settings.faust_credentials())
    service = SplitterLoop(splitter, loop=app.loop, beacon=app.beacon)

    @app.timer(interval=splitter.pulse_s)
    async def pulse() -> None:
        splitter.pulse_if_due()

    @app.page("/status/")
    async def status(web: Any, request: Any) -> Any:
        # the splitter's lock is held for at most one batch: wait for it off the loop
        state = await asyncio.get_running_loop().run_in_executor(None, splitter.status)
        return web.json(state)

    # faust types service() as a class decorator; it keeps an instance alike (it only
    # appends what it is given to the services it starts)
    app.service(service)  # type: ignore[arg-type]
    return app, service


def serve_splitter(splitter: Splitter, web_port: int = 6066,
                   datadir: Path | None = None) -> int:
    """Run the app until SIGTERM/SIGINT; the exit code (1 when the loop failed). Faust's
    own log records are JSON lines like the splitter's (cep_service.stream.serve.logging_config)."""
    app, service = create_app(splitter, web_port, datadir=datadir)
    worker = Worker(app, quiet=True, redirect_stdouts=False, loglevel=log_level(),
                    logging_config=logging_config())
    try:
        worker.execute_from_commandline()
    except SystemExit as e:
        if service.error is None:
            return int(e.code or 0)
    return 1 if service.error is not None else 0
