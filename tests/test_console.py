"""The web console in a real headless browser (Debian's chromium and chromium-driver, which
`make test` installs when missing, through selenium), served by the API over a running
pipeline: a query with an error shows the error under its line, a good one goes live and
its composite events appear in the live table; a screenshot is saved under the test's tmp
dir (and at $CEP_CONSOLE_SCREENSHOT when set: docs/console.png is made so)."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import pytest

from cep_core import reference
from cep_core.checker import load_query_text
from cep_core.event_io import read_events
from services.api.app import ApiConfig, ApiThread
from services.stream.kafka import KafkaSettings, Topics, flush_all, produce, produce_end
from services.stream.live_changes import services_view
from services.stream.pipeline import LocalPipeline, create_topics, wait_for

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


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                 "--disable-gpu", "--window-size=1280,900"):
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
        kept = min(8, len(expected))  # the table keeps the newest 8 of each query
        # read in one script: the tables are rebuilt as events come (no stale elements)
        cells = "#composites tr[data-query=ups] td:nth-child(3)"
        shown = until(browser, lambda b: (lambda texts: len(texts) >= kept and texts)(
            b.execute_script(f"return [...document.querySelectorAll('{cells}')]"
                             ".map(td => td.textContent)")), "composite events", 120)
        assert all(s in expected for s in shown), shown
        state = browser.execute_script("return document.querySelector("
                                       "'#queries tr[data-query=ups]').textContent")
        assert "live" in state
        type_query(browser, BAD.replace("oops", "draft"))  # the picture shows a check too
        until(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#checked .error"),
              "the error of the draft")
        picture = tmp_path / "console.png"
        browser.save_screenshot(str(picture))
        assert picture.stat().st_size > 10_000
        if os.environ.get("CEP_CONSOLE_SCREENSHOT"):
            shutil.copy(picture, os.environ["CEP_CONSOLE_SCREENSHOT"])
