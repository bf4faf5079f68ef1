"""The web console in a real headless browser (Debian's chromium and chromium-driver, which
`make test` installs when missing, through selenium), served by the API over a running
pipeline: a query with an error shows the error under its line, a good one goes live and
its composite events appear in the live table; a screenshot is saved under the test's tmp
dir (and at $CEP_CONSOLE_SCREENSHOT when set: docs/console.png is made so).

And the API's safety rules in the browser (docs/api.md, "Safety"): a page of another
origin (a second HTTP server on 127.0.0.1) tries to add queries (a text/plain fetch, a JSON
fetch that needs a preflight, a text/plain form) and a name that resolves to 127.0.0.1 (a
DNS rebinding) asks for the console; none gets through, while the console itself adds
and removes a query."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import threading
import urllib.request
import uuid
from pathlib import Path

import pytest

from cep_core import reference
from cep_core.checker import load_query_text
from cep_core.event_io import read_events
from cep_service.api.app import ApiConfig, ApiThread
from cep_service.stream.kafka import KafkaSettings, Topics, flush_all, produce, produce_end
from cep_service.stream.live_changes import services_view
from cep_service.stream.pipeline import LocalPipeline, create_topics, wait_for

ROOT = Path(__file__).resolve().parent.parent
TRADES = ROOT / "examples" / "data" / "trades.jsonl"
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture(autouse=True)
def browser_installed():
    """make test installs them (make sysdeps): their absence is a failure, not a skip."""
    if not (CHROMIUM and DRIVER):
        pytest.fail("chromium and chromium-driver are not installed: run make sysdeps")

BAD = "QUERY oops FROM trades INTO oops\nPATTERN ( a )\nDEFINE a AS symbol > 3\n" \
      "EMIT symbol = symbol;"
GOOD = """QUERY ups FROM trades INTO {output} PARTITION BY symbol
PATTERN ( . up up ) DEFINE up AS price > Last(price)
EMIT symbol = symbol, n = Count();"""


REBOUND = "rebound.test"  # the browser resolves it to 127.0.0.1, as a DNS rebinding


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                 "--disable-gpu", "--window-size=1280,900",
                 f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def until(browser, condition, what: str, timeout_s: float = 60):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, timeout_s, poll_frequency=0.1).until(
        lambda b: condition(b), message=what)


def type_query(browser, text: str) -> None:
    from selenium.webdriver.common.by import By

    editor = browser.find_element(By.ID, "editor")
    editor.clear()
    editor.send_keys(text)


def test_console_checks_adds_and_shows_composites(kafka_bootstrap, browser, tmp_path):
    from selenium.webdriver.common.by import By

    settings = KafkaSettings(kafka_bootstrap, session_timeout_ms=2000)
    run = uuid.uuid4().hex[:8]
    topics = Topics("trades", source=f"src.console.{run}", prefix=f"console{run}")
    output = f"console_ups_{run}"
    create_topics(settings, topics, 2, [output])
    text = GOOD.format(output=output)
    queries = load_query_text(text)
    events, _ = read_events(TRADES, queries[0].schema)
    expected = [json.dumps(c, separators=(",", ":")) for c in reference.run(queries, events)]
    assert expected

    with LocalPipeline(settings, topics, workers=1, partitions=2), \
            ApiThread(ApiConfig(settings, topic_prefix=topics.prefix)) as api:
        wait_for(lambda: any(e["role"] == "splitter" for e in
                             services_view(settings, topics.status).values()), 60,
                 "the splitter's presence record")
        browser.get(api.url + "/")
        type_query(browser, BAD)
        error = until(browser, lambda b: b.find_elements(
            By.CSS_SELECTOR, "#checked .error"), "the error of the bad query")[0]
        assert error.get_attribute("data-line") == "3"
        above = browser.execute_script("return arguments[0].previousElementSibling", error)
        assert above.get_attribute("data-line") == "3"
        assert "DEFINE a AS symbol > 3" in above.text
        assert "3:" in error.text and "^" in error.text

        type_query(browser, text)
        until(browser, lambda b: "ok" in b.find_element(By.ID, "checked")
              .get_attribute("class") and not b.find_elements(By.CSS_SELECTOR,
                                                              "#checked .error"),
              "the good query checked")
        browser.find_element(By.ID, "add").click()
        until(browser, lambda b: "applied" in b.find_element(By.ID, "outcome").text,
              "the add applied", 120)
        until(browser, lambda b: b.find_elements(
            By.CSS_SELECTOR, '#queries tr[data-query="ups"][data-tail="ready"]'),
            "the query's row, its tail placed")

        producer = settings.producer()
        for line in TRADES.read_bytes().splitlines():
            produce(producer, topics.source, line)
        produce_end(producer, topics.source)
        flush_all(producer, 30)
        kept = min(8, len(expected))
        # read in one script: the tables are rebuilt as events come (no stale elements)
        rows = "#composites tr[data-query=ups]"
        shown = until(browser, lambda b: (lambda texts: len(texts) >= kept and texts)(
            b.execute_script(f"return [...document.querySelectorAll('{rows}')]"
                             ".map(tr => tr.dataset.composite)")), "composite events", 120)
        wanted = [json.loads(e) for e in expected]
        assert all(json.loads(s) in wanted for s in shown), shown
        # the queries table refreshes on its own cadence: it may still show the row it
        # drew before every partition switched (the kernels compile first, docs/live.md)
        until(browser, lambda b: "live" in b.execute_script(
            "return document.querySelector('#queries tr[data-query=ups]').textContent"),
            "the query's row saying live", 60)
        type_query(browser, BAD.replace("oops", "draft"))  # the picture shows a check too
        until(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#checked .error"),
              "the error of the draft")
        picture = tmp_path / "console.png"
        browser.save_screenshot(str(picture))
        assert picture.stat().st_size > 10_000
        if os.environ.get("CEP_CONSOLE_SCREENSHOT"):
            shutil.copy(picture, os.environ["CEP_CONSOLE_SCREENSHOT"])


ELSEWHERE = """<!doctype html><meta charset="utf-8"><title>elsewhere</title>
<pre id="result"></pre>
<iframe name="sink"></iframe>
<form id="form" method="post" enctype="text/plain" target="sink" action="%API%/api/queries">
<input name='{"text": %FORM%, "x": "' value='"}'></form>
<script>
const API = "%API%";
async function attempt(name, init) {
  try {
    const reply = await fetch(API + "/api/queries", init);
    return name + ": " + reply.type + " " + reply.status;
  } catch (e) {
    return name + ": blocked (" + e.name + ")";
  }
}
(async () => {
  const said = [];
  said.push(await attempt("text/plain", {method: "POST", mode: "no-cors",
    headers: {"Content-Type": "text/plain"}, body: JSON.stringify({text: %SIMPLE%})}));
  said.push(await attempt("json", {method: "POST",
    headers: {"Content-Type": "application/json"}, body: JSON.stringify({text: %JSON%})}));
  said.push(await attempt("read", {}));
  document.querySelector("iframe").addEventListener("load", () => {
    said.push("form: sent");
    document.getElementById("result").textContent = JSON.stringify(said);
  }, {once: true});
  document.getElementById("form").submit();
})();
</script>"""


class Elsewhere(http.server.ThreadingHTTPServer):
    """Another origin: one page, on its own port of 127.0.0.1."""

    def __init__(self, page: str):
        class Page(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = page.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass
        super().__init__(("127.0.0.1", 0), Page)
        self.url = f"http://127.0.0.1:{self.server_address[1]}/"
        threading.Thread(target=self.serve_forever, daemon=True).start()


def live_names(api) -> list[str]:
    with urllib.request.urlopen(api.url + "/api/queries?state=false", timeout=60) as reply:
        return [q["name"] for q in json.loads(reply.read())["queries"]]


def test_other_origins_cannot_change_queries_the_console_can(kafka_bootstrap, browser):
    from selenium.webdriver.common.by import By

    settings = KafkaSettings(kafka_bootstrap, session_timeout_ms=2000)
    run = uuid.uuid4().hex[:8]
    query = GOOD.replace("ups", "{name}", 1).format
    texts = {k: query(name=f"evil_{k}", output=f"evil_{run}")
             for k in ("simple", "json", "form")}
    config = ApiConfig(settings, topic_prefix=f"site{run}", timeout_s=5)
    with ApiThread(config) as api:
        page = ELSEWHERE.replace("%API%", api.url)
        for key, text in texts.items():
            page = page.replace(f"%{key.upper()}%", json.dumps(text))
        elsewhere = Elsewhere(page)
        try:
            browser.get(elsewhere.url)
            said = json.loads(until(browser, lambda b: b.find_element(
                By.ID, "result").text, "the other origin's attempts"))
        finally:
            elsewhere.shutdown()
            elsewhere.server_close()
        # the simple request went out (its answer is opaque to the page): the API refused
        # it; the JSON one and the read stopped in the browser (no CORS for that origin)
        assert said == ["text/plain: opaque 0", "json: blocked (TypeError)",
                        "read: blocked (TypeError)", "form: sent"], said

        port = api.url.rsplit(":", 1)[1]
        browser.get(f"http://{REBOUND}:{port}/")  # a DNS rebinding: same page, other name
        refused = json.loads(browser.find_element(By.TAG_NAME, "body").text)
        assert REBOUND in refused["error"] and "not this API's" in refused["error"]

        browser.get(api.url + "/")  # the console itself
        type_query(browser, query(name="from_console", output=f"console_{run}"))
        until(browser, lambda b: "ok" in b.find_element(By.ID, "checked")
              .get_attribute("class"), "the query checked")
        browser.find_element(By.ID, "add").click()
        until(browser, lambda b: "no 'trades' pipeline is up" in
              b.find_element(By.ID, "outcome").text, "the add queued", 120)
        assert live_names(api) == ["from_console"]  # and none of the other origin's
        until(browser, lambda b: b.find_elements(
            By.CSS_SELECTOR, '#queries tr[data-query="from_console"] button.remove'),
            "the query's row")[0].click()
        until(browser, lambda b: not live_names(api), "the query removed", 120)
