"""`cep demo` as a new user runs it: an empty home directory, the embedded broker (or the
one KAFKA_BOOTSTRAP names), real service processes; and no process left behind when it is
stopped by a signal, as CI, `timeout` or a closed terminal would stop it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cep_core.home import kernel_cache_dir
from cep_service.stream.demo import ServiceFailed, check_services
from cep_service.stream.pipeline import wait_for


def demo_env(tmp_path: Path) -> dict[str, str]:
    """An empty, not yet existing home; the kernel cache shared with the rest of the suite
    (compiling is not what is tested here)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("CEP_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME")}
    return {**env, "HOME": str(tmp_path / "home"), "CEP_KERNEL_CACHE": str(kernel_cache_dir())}


def processes_with(variable: str) -> list[int]:
    """PIDs of live processes whose environment holds `variable` (NAME=value)."""
    found, needle = [], variable.encode() + b"\0"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes() and \
                    (entry / "stat").read_text().split(") ")[1][0] != "Z":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_demo_verifies_from_an_empty_home(tmp_path):
    done = subprocess.run([sys.executable, "-m", "cep_service.cli.main", "demo", "--events", "3000",
                           "--workers", "2", "--verify"], env=demo_env(tmp_path),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "chained" in done.stdout  # the default: the chained pipeline
    assert "verify: identical to cep run --engine reference" in done.stdout
    assert (tmp_path / "home/.local/state/cep/faust").is_dir()
    # nothing written outside the product's folders (the broker binary is run in place)
    assert sorted(p.name for p in (tmp_path / "home").iterdir()) == [".cache", ".local"]


def test_demo_with_two_coordinator_shards_verifies(tmp_path):
    """`--distributed --coordinators 2`: one process per role, the demo's two INTO topics
    go to different shards (one process each), and the output is still the reference
    interpreter's."""
    done = subprocess.run([sys.executable, "-m", "cep_service.cli.main", "demo", "--events", "3000",
                           "--distributed", "--workers", "2", "--coordinators", "2",
                           "--verify"],
                          env=demo_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 workers, 2 coordinator shards" in done.stdout
    assert "verify: identical to cep run --engine reference" in done.stdout


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc (Linux)")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_stops_the_demo_and_everything_it_started(tmp_path, signum):
    marker = f"CEP_HOME={tmp_path / 'cep-home'}"
    env = {**demo_env(tmp_path), "CEP_HOME": str(tmp_path / "cep-home")}
    demo = subprocess.Popen([sys.executable, "-m", "cep_service.cli.main", "demo", "--events",
                             "1000000", "--rate", "2000"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    logs = tmp_path / "cep-home/state/logs"
    try:
        # the broker, `serve all`, the chained pipeline and the API are up
        wait_for(lambda: any("chained_started" in p.read_text() for p in logs.glob("*.log"))
                 if logs.is_dir() else False, 180, "services started")
        assert len(processes_with(marker)) >= 5  # the demo itself too
        demo.send_signal(signum)
        demo.wait(150)
        deadline = time.monotonic() + 30  # children reaped after their parents exit
        while processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_with(marker) == []
    finally:
        for pid in processes_with(marker):
            os.kill(pid, signal.SIGKILL)
        if demo.poll() is None:
            demo.kill()
            demo.wait()


def test_a_dead_service_is_reported_with_its_log(tmp_path):
    log = tmp_path / "demo.log"
    log.write_text('{"event":"started_all"}\n' + "".join(f"line {i}\n" for i in range(40)) +
                   '{"level":"error","event":"process_exited","role_of":"splitter"}\n')
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(ServiceFailed, match=r"(?s)failed to start.*line 39.*process_exited"):
            check_services(alive, log)
        log.write_text('{"event":"started_all"}\n')
        check_services(alive, log)  # all well: nothing raised
    finally:
        alive.kill()
        alive.wait()
    with pytest.raises(ServiceFailed):
        check_services(alive, log)  # `cep serve all` itself has exited
