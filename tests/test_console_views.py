"""The console's views in Debian's headless chromium (selenium), as a person uses them,
against a running pipeline (splitter, 2 workers, coordinator as threads, each with its
Prometheus endpoint, read by the API): the pipeline drawn with its processes and their
rates, the keyed partitions with lag and seq, the last checkpoints, what is withheld;
per query composites/s above 0 while composite events arrive, a chart with points, the
explain drawing of a MATCH, a WINDOW and a SEQ query, a failed query with its reason;
the composite events as a table with a column per field, filtered by query and key, and
paused. Then the page under load: 100 live queries and 1,000 composite events a second,
its own work measured by the browser's performance API against its refresh period.

With CEP_CONSOLE_SCREENSHOTS=DIR the views' screenshots are saved there (docs/console.md's
pictures are made so)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import uuid
from pathlib import Path

import orjson

from cep_core import failpoints
from cep_service.api.app import ApiConfig, ApiThread
from cep_service.stream.broker import free_port
from cep_service.stream.checkpoint import PIPELINE_HEADER
from cep_service.stream.control import ControlMessage, publish, split_query_file
from cep_service.stream.demo import trade_lines
from cep_service.stream.kafka import KafkaSettings, Topics, produce
from cep_service.stream.pipeline import LocalPipeline, create_topics, wait_progressing
from tests import test_console

# the browser (Debian's chromium through selenium) as tests/test_console.py makes it
browser, browser_installed, until = (test_console.browser, test_console.browser_installed,
                                     test_console.until)

ROOT = Path(__file__).resolve().parent.parent
REFRESH_MS = 2000  # the console's refresh period (console.js)
MATCH_Q = (ROOT / "examples" / "finance.cep").read_text()
BROKEN = """QUERY broken FROM trades INTO broken_out PARTITION BY symbol
PATTERN ( . up ) DEFINE up AS price > Last(price) EMIT symbol = symbol;"""
SEQ_Q = """QUERY unshipped FROM rfid INTO unshipped_out PATTERN SEQ(O o, R r, D d)
WHERE o.item = r.item AND r.item = d.item WITHIN 1 hour;"""


def js(browser, script: str):
    return browser.execute_script(script)


def screenshot(browser, element_id: str, name: str, tmp_path: Path) -> None:
    """An element's picture (`page`: the window's)."""
    from selenium.webdriver.common.by import By

    picture = tmp_path / name
    if element_id == "page":
        browser.save_screenshot(str(picture))
    else:
        element = browser.find_element(By.ID, element_id)
        # below the page's sticky header
        browser.execute_script("arguments[0].scrollIntoView(); window.scrollBy(0, -60)",
                               element)
        element.screenshot(str(picture))
    assert picture.stat().st_size > 5_000
    if os.environ.get("CEP_CONSOLE_SCREENSHOTS"):
        shutil.copy(picture, Path(os.environ["CEP_CONSOLE_SCREENSHOTS"]) / name)


class Producing:
    """Trades to the source topic at a steady pace from a thread, until stopped."""

    def __init__(self, settings, topic: str, per_s: int = 2000):
        self.lines = trade_lines(200_000)
        self.settings, self.topic, self.per_s = settings, topic, per_s
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        producer = self.settings.producer()
        chunk = self.per_s // 10
        while not self.stop.is_set() and self.sent < len(self.lines):
            for line in self.lines[self.sent:self.sent + chunk]:
                produce(producer, self.topic, line)
            self.sent += chunk
            producer.poll(0)
            self.stop.wait(0.1)
        producer.flush(10)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(30)


def test_console_shows_the_pipeline_queries_and_events(kafka_bootstrap, browser, tmp_path,
                                                       monkeypatch):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    monkeypatch.setenv("CEP_FAILPOINTS", "broken:process@50")
    failpoints.reset()
    settings = KafkaSettings(kafka_bootstrap, session_timeout_ms=2000)
    run = uuid.uuid4().hex[:8]
    topics = Topics("trades", source=f"src.views.{run}", prefix=f"views{run}")
    create_topics(settings, topics, 2, ["double_tops", "trade_stats", "broken_out"])
    for name, text in split_query_file(MATCH_Q) + [("broken", BROKEN),
                                                   ("unshipped", SEQ_Q)]:
        publish(settings, topics.control, ControlMessage("add", name, text))
    ports = [free_port() for _ in range(4)]
    urls = [f"http://127.0.0.1:{p}/metrics" for p in ports]
    try:
        with LocalPipeline(settings, topics, workers=2, partitions=2,
                           metrics_ports=ports) as pipeline, \
                ApiThread(ApiConfig(settings, topic_prefix=topics.prefix,
                                    metrics_urls=urls)) as api, \
                Producing(settings, topics.source):
            def wait(condition, what):
                wait_progressing(lambda: condition(browser), pipeline.progress, what,
                                 stall_s=120)

            browser.set_window_size(1280, 1500)  # the screenshots show whole views
            browser.get(api.url + "/")
            # the pipeline: every process a node, events flowing through the splitter
            wait(lambda b: js(b, "return [...document.querySelectorAll("
                              "'.pipeline[data-stream=trades] .graph g[data-process]')]"
                              ".filter(g => g.dataset.process.startsWith('splitter') && "
                              "Number(g.dataset.rate) > 0).length"),
                 "the splitter's node with a rate")
            nodes = js(browser, "return [...document.querySelectorAll('.pipeline[data-stream="
                                "trades] .graph g[data-process]')].map(g => "
                                "[g.dataset.process, g.textContent])")
            roles = sorted(p.split("@")[0] for p, _ in nodes)
            assert roles == ["api", "broker", "coordinator", "splitter", "worker", "worker"]
            assert all("/s" in text for _, text in nodes), nodes
            wait(lambda b: len(js(b, "return [...document.querySelectorAll('.pipeline[data-"
                                  "stream=trades] .partitions tbody tr')].filter(r => "
                                  "Number(r.cells[3].textContent) > 0)")) == 2,
                 "both keyed partitions with their seq")
            wait(lambda b: js(b, "return [...document.querySelectorAll('.pipeline[data-"
                              "stream=trades] .processes tbody tr')].filter(r => r.cells[4]"
                              ".textContent.includes('generation')).length") >= 4,
                 "a checkpoint of each service")
            assert "wait for" in browser.find_element(
                By.CSS_SELECTOR, ".pipeline[data-stream=trades] .withheld").text or \
                "nothing withheld" in browser.find_element(
                    By.CSS_SELECTOR, ".pipeline[data-stream=trades] .withheld").text
            screenshot(browser, "pipeline", "console-pipeline.png", tmp_path)

            # the queries: composites/s above 0 while composite events arrive
            wait(lambda b: any(float(v.replace(",", "") or 0) > 0 for v in js(
                b, "return [...document.querySelectorAll('#queries tr[data-query=activity] "
                   "td.rate, #queries tr[data-query=mshape] td.rate')].map(td => "
                   "td.textContent.replace('–', ''))")), "composites/s above 0")
            wait(lambda b: "injected fault" in js(b, "return document.querySelector("
                                                  "'#queries tr[data-query=broken]')"
                                                  "?.textContent || ''"),
                 "the failed query's reason")
            for name, kind in (("unshipped", "SEQ"), ("broken", "MATCH"),
                               ("activity", "WINDOW"), ("mshape", "MATCH")):
                # the table is drawn again at each refresh: found and clicked at once
                js(browser, f"document.querySelector('#queries tr[data-query=\"{name}\"] "
                            "button.details').click()")
                drawn = ("return document.querySelector('#explain').dataset.kind === "
                         f"'{kind}' && document.getElementById('detail-name').textContent "
                         f"=== '{name}' && document.querySelectorAll('#explain svg g.node')"
                         ".length")
                wait(lambda b, drawn=drawn: js(b, drawn), f"the explain drawing of {name}")
                if name == "broken":
                    reason = browser.find_element(By.ID, "detail-reason")
                    assert reason.is_displayed() and "injected fault" in reason.text
            wait(lambda b: int(js(b, "return document.getElementById('chart-composites_per_s')"
                                     ".dataset.points || 0")) >= 2 and
                 js(b, "return !!document.querySelector('#chart-composites_per_s canvas')"),
                 "the mshape query's chart with points")
            screenshot(browser, "live", "console-queries.png", tmp_path)

            # composite events: a column per field, filtered by query and key, paused
            wait(lambda b: js(b, "return document.querySelectorAll('#composites tbody tr')"
                                 ".length") >= 5, "composite events in the table")
            Select(browser.find_element(By.ID, "filter-query")).select_by_value("activity")
            wait(lambda b: js(b, "const rows = [...document.querySelectorAll('#composites "
                                 "tbody tr')]; return rows.length > 0 && rows.every(r => "
                                 "r.dataset.query === 'activity')"), "activity's events only")
            head = js(browser, "return [...document.querySelectorAll('#composites thead th')]"
                               ".map(th => th.textContent)")
            assert head[:3] == ["query", "key", "seq"] and \
                {"trades", "volume", "hi", "lo", "mean"} <= set(head), head
            key = js(browser, "return document.querySelector('#composites tbody tr td"
                              "[data-field=key]').textContent")
            browser.find_element(By.ID, "filter-key").send_keys(key.strip('"'))
            shown = js(browser, "return [...document.querySelectorAll('#composites tbody tr "
                                "td[data-field=key]')].map(td => td.textContent)")
            assert shown and all(key.strip('"') in k for k in shown)
            browser.find_element(By.ID, "filter-key").clear()
            Select(browser.find_element(By.ID, "filter-query")).select_by_value("")
            wait(lambda b: js(b, "return new Set([...document.querySelectorAll('#composites "
                                 "tbody tr')].map(r => r.dataset.query)).size") >= 2,
                 "the events of the followed queries again")
            browser.find_element(By.ID, "pause").click()
            before = js(browser, "return document.querySelector('#composites tbody')"
                                 ".innerHTML")
            wait(lambda b: "new while paused" in b.find_element(By.ID, "paused-count").text,
                 "events arriving while paused")
            assert js(browser, "return document.querySelector('#composites tbody')"
                               ".innerHTML") == before
            screenshot(browser, "events", "console-events.png", tmp_path)
            browser.find_element(By.ID, "pause").click()
            assert browser.find_element(By.ID, "paused-count").text == ""
            js(browser, "window.scrollTo(0, 0)")
            screenshot(browser, "page", "console.png", tmp_path)
    finally:
        monkeypatch.delenv("CEP_FAILPOINTS")
        failpoints.reset()


def test_console_shows_a_chained_pipeline_as_one_process(kafka_bootstrap, browser,
                                                         tmp_path):
    """The chained pipeline (`make demo`'s default: routing, partition and merge cores in
    one process, one metrics endpoint): one node of role chained around its three stages,
    each with its rates, its checkpoint (one cut: time, generation, how long it took), the
    keyed partitions it holds with their merged seq."""
    settings = KafkaSettings(kafka_bootstrap, session_timeout_ms=2000)
    run = uuid.uuid4().hex[:8]
    topics = Topics("trades", source=f"src.chained.{run}", prefix=f"chained{run}")
    create_topics(settings, topics, 2, ["double_tops", "trade_stats"])
    for name, text in split_query_file(MATCH_Q):
        publish(settings, topics.control, ControlMessage("add", name, text))
    port = free_port()
    with LocalPipeline(settings, topics, partitions=2, metrics_ports=[port, 0],
                       chained=True) as pipeline, \
            ApiThread(ApiConfig(settings, topic_prefix=topics.prefix, metrics_urls=[
                f"http://127.0.0.1:{port}/metrics"])) as api, \
            Producing(settings, topics.source):
        def wait(condition, what):
            wait_progressing(lambda: condition(browser), pipeline.progress, what,
                             stall_s=120)

        view = ".pipeline[data-stream=trades]"
        browser.set_window_size(1280, 1100)
        browser.get(api.url + "/")
        wait(lambda b: js(b, f"return [...document.querySelectorAll('{view} .graph "
                             "g[data-process]')].filter(g => g.dataset.process.startsWith("
                             "'splitter') && Number(g.dataset.rate) > 0).length"),
             "the chained node with a rate")
        nodes = js(browser, f"return [...document.querySelectorAll('{view} .graph "
                            "g[data-process]')].map(g => [g.dataset.process, [...g"
                            ".querySelectorAll('text')].map(t => t.textContent).join(' ')])")
        assert sorted(p.split("@")[0] for p, _ in nodes) == ["api", "broker", "splitter"]
        chained = next(text for p, text in nodes if p.startswith("splitter")).split()
        assert chained[0] == "chained" and "events/s in" in " ".join(chained), nodes
        # its stages inside it, in the order data flows, events going in and out of each
        wait(lambda b: js(b, f"return [...document.querySelectorAll('{view} .graph "
                             "g[data-stage]')].map(g => g.dataset.stage + ':' + (Number("
                             "g.dataset.rateIn) > 0) + ':' + (g.dataset.stage === 'merge' ||"
                             " Number(g.dataset.rateOut) > 0)).join(' ')") ==
             "routing:true:true partitions:true:true merge:true:true",
             "each stage with its rates")
        stages = js(browser, f"return [...document.querySelectorAll('{view} .stages tbody "
                             "tr')].map(r => r.cells[0].textContent + ' ' + r.cells[3]"
                             ".textContent)")
        assert [s.split()[0] for s in stages] == ["routing", "partitions", "merge"]
        assert stages[2].endswith("composites/s out"), stages
        # the one process's row: role chained, its cut as the last checkpoint
        wait(lambda b: "took" in js(b, f"return [...document.querySelectorAll('{view} "
                                       ".processes tbody tr')].find(r => r.cells[1]"
                                       ".textContent === 'chained')?.cells[4].textContent "
                                       "|| ''"), "the chained checkpoint")
        row = js(browser, f"return [...document.querySelectorAll('{view} .processes tbody "
                          "tr')].map(r => [...r.cells].map(c => c.textContent))")
        assert [r[1] for r in row] == ["broker", "chained", "api"], row
        assert "UTC" in row[1][4] and "one cut, generation" in row[1][4], row
        # the keyed partitions it holds, merged up to a seq
        wait(lambda b: js(b, f"return [...document.querySelectorAll('{view} .partitions "
                             "tbody tr')].filter(r => r.cells[1].textContent.startsWith("
                             "'splitter') && Number(r.cells[3].textContent) > 0).length")
             == 2, "both keyed partitions merged up to a seq")
        withheld = js(browser, f"return document.querySelector('{view} .withheld')"
                               ".textContent")
        assert "wait for" in withheld or "nothing withheld" in withheld
        screenshot(browser, "pipeline", "console-pipeline-chained.png", tmp_path)


LOAD_QUERY = """QUERY {name} FROM trades INTO {output} PARTITION BY symbol
PATTERN ( . up up ) DEFINE up AS price > Last(price) EMIT symbol = symbol, n = Count();"""


def test_console_stays_responsive_with_100_queries_and_1000_events_a_second(
        kafka_bootstrap, browser):
    """No pipeline runs: the 100 queries wait on the control topic (the API lists them
    all with their state), and composite events of four of them come at 1,000 a second
    straight into their INTO topic, as the coordinator writes them; the page follows every
    query (one tail)."""
    from selenium.webdriver.common.by import By

    settings = KafkaSettings(kafka_bootstrap)
    run = uuid.uuid4().hex[:8]
    topics = Topics("trades", prefix=f"load{run}")
    output = f"load_out_{run}"
    create_topics(settings, topics, 1, [output])
    names = [f"q{i:03d}" for i in range(100)]
    for name in names:
        publish(settings, topics.control, ControlMessage(
            "add", name, LOAD_QUERY.format(name=name, output=output)))
    tag = [(PIPELINE_HEADER, topics.group("coordinator").encode())]
    stop = threading.Event()

    def composites():
        producer, seq = settings.producer(), 0
        while not stop.is_set():
            for _ in range(100):  # 1,000 a second: 100 each 0.1 s
                seq += 1
                produce(producer, output, orjson.dumps(
                    {"query": names[seq % 4], "key": f"S{seq % 50}", "seq": seq,
                     "symbol": f"S{seq % 50}", "n": seq % 7}), headers=tag)
            producer.poll(0)
            stop.wait(0.1)
        producer.flush(10)

    with ApiThread(ApiConfig(settings, topic_prefix=topics.prefix)) as api:
        browser.get(api.url + "/")
        js(browser, "window.longest = 0; new PerformanceObserver(list => { for (const e of "
                    "list.getEntries()) window.longest = Math.max(window.longest, e.duration)"
                    " }).observe({type: 'longtask', buffered: true})")
        until(browser, lambda b: js(b, "return document.querySelectorAll('#queries tbody "
                                       "tr').length") == 100, "the 100 queries listed", 120)
        until(browser, lambda b: js(b, "return document.querySelectorAll('#queries tbody "
                                       "tr[data-tail=ready]').length") == 100,
              "the tail of every query placed", 120)
        producer = threading.Thread(target=composites, daemon=True)
        producer.start()
        try:
            until(browser, lambda b: js(b, "return document.querySelectorAll('#composites "
                                           "tbody tr').length") >= 200,
                  "composite events in the table", 120)
            started = js(browser, "return window.cepConsole")
            # 5,000 more events (5 s at 1,000 a second), over at least two refreshes
            until(browser, lambda b: (lambda now: now["received"] >= started["received"] +
                                      5000)(
                js(b, "return window.cepConsole")), "the page drawing 5,000 events", 180)
            # a user's action: pause, seen on the page within a frame
            took = js(browser, "const t0 = performance.now(); document.getElementById("
                               "'pause').click(); return new Promise(done => "
                               "requestAnimationFrame(() => done(performance.now() - t0)))")
            assert browser.find_element(By.ID, "pause").text == "Resume"
        finally:
            stop.set()
            producer.join(30)
        timing = js(browser, "return window.cepConsole")
        longest = js(browser, "return window.longest")
    # generous bounds tied to the page's own refresh period, not to this machine's speed
    assert took < REFRESH_MS / 2, took
    assert timing["longestRenderMs"] < REFRESH_MS / 2, timing
    assert longest < REFRESH_MS, longest
    print(json.dumps({"pause_click_ms": took, "longest_task_ms": longest, **timing}))
