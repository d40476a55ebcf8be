"""Open an HTML file in real headless Chromium and report what a reader would see.

Talks the DevTools protocol over `--remote-debugging-pipe` (JSON messages ending in NUL on file
descriptors 3 and 4), so no websocket library is needed. Collects console errors, uncaught
exceptions, error log entries and every network request the page makes; after the page has
loaded, reads each plotly container's DOM and writes a full-page screenshot.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# Screenshots are copied here (git-ignored) so CI can upload them and a person can look.
ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts"

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run")

# Resolves, once every plotly container has drawn its SVG (or the deadline passes), to one
# entry per container: its id, how many traces it holds and shows, and what the DOM drew.
_READ_PLOTS = """
new Promise(resolve => {
  const deadline = Date.now() + %d;
  const read = () => Array.from(document.querySelectorAll('div.plotly-graph-div')).map(gd => ({
    id: gd.id,
    traces: (gd.data || []).length,
    visible_traces: (gd._fullData || []).filter(t => t.visible === true).length,
    rendered_traces: gd.querySelectorAll('g.trace').length,
    marks: gd.querySelectorAll('g.trace path, g.trace .point').length,
    svg: gd.querySelectorAll('svg.main-svg').length,
    width: gd.getBoundingClientRect().width,
    height: gd.getBoundingClientRect().height,
  }));
  const poll = () => {
    const plots = read();
    const done = plots.every(p => p.svg > 0 && p.rendered_traces >= p.visible_traces);
    if (done || Date.now() > deadline) resolve(plots); else setTimeout(poll, 100);
  };
  poll();
})
"""


class BrowserError(RuntimeError):
    pass


@dataclass
class PageReport:
    """console_errors: console.error/assert calls, uncaught exceptions and error log entries.
    requests: URLs the page fetched other than itself. plots: one dict per plotly container."""

    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    plots: list[dict] = field(default_factory=list)
    headline: str = ""
    values: dict = field(default_factory=dict)  # results of the caller's `evaluate` expressions
    screenshot: Path | None = None


def keep_artifact(path: Path) -> Path:
    """Copy a test's file (e.g. a screenshot under pytest's tmp dir) to ARTIFACTS; returns the copy."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(path, ARTIFACTS / Path(path).name))


def find_chromium() -> str | None:
    return os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


class _Pipe:
    """One Chromium process and its DevTools pipe; events are collected while waiting for replies."""

    def __init__(self, executable: str, profile: Path, log: Path | None):
        to_chrome_read, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_write = os.pipe()

        def wire_fds():  # in the child: the pipe ends must be fds 3 (commands) and 4 (replies)
            commands, replies = os.dup(to_chrome_read), os.dup(from_chrome_write)
            os.dup2(commands, 3)
            os.dup2(replies, 4)

        output = open(log, "wb") if log else subprocess.DEVNULL  # Chromium's own log (dbus noise and all)
        try:
            self.process = subprocess.Popen(
                [executable, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"],
                stdin=subprocess.DEVNULL, stdout=output, stderr=output, preexec_fn=wire_fds, close_fds=False)
        finally:
            if log:
                output.close()
        os.close(to_chrome_read)
        os.close(from_chrome_write)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout_s: float = 60) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while True:
            reply = self._receive(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply["result"]
            if "method" in reply:
                self.events.append(reply)

    def _receive(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_chrome], [], [], left)[0]:
                raise BrowserError("Chromium did not answer in time")
            chunk = os.read(self._from_chrome, 1 << 16)
            if not chunk:
                raise BrowserError(f"Chromium exited (code {self.process.poll()})")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout_s=10)
        except BrowserError:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)


def _errors(events: list[dict]) -> list[str]:
    found = []
    for event in events:
        method, params = event["method"], event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            found.append("console." + params["type"] + ": " + " ".join(
                str(arg.get("value", arg.get("description", ""))) for arg in params["args"]))
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            found.append("exception: " + details.get("exception", {}).get("description", details["text"]))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            found.append(f"log: {params['entry']['text']} ({params['entry'].get('url', '')})")
    return found


def open_page(page: Path, screenshot: Path, *, width: int = 1400, settle_ms: int = 30_000,
              evaluate: dict[str, str] | None = None, log: Path | None = None) -> PageReport:
    """Load `page` in a fresh profile, wait for its plots, read them and write a full-page PNG to `screenshot`.

    `evaluate` maps names to JavaScript expressions run once the plots are drawn (e.g. to read
    what a figure holds); their JSON-able results come back in `values`."""
    executable = find_chromium()
    if executable is None:
        raise BrowserError("chromium not found: install it with `bash scripts/setup.sh` (Debian package chromium)")
    page = Path(page).resolve()
    profile = Path(tempfile.mkdtemp(prefix="ddprof-chromium-"))
    browser = _Pipe(executable, profile, log)
    try:
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            browser.call(f"{domain}.enable", session=session)
        browser.call("Emulation.setDeviceMetricsOverride",
                     {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session)
        browser.call("Page.navigate", {"url": page.as_uri()}, session)
        deadline = time.monotonic() + 60
        while not any(e["method"] == "Page.loadEventFired" for e in browser.events):
            if time.monotonic() > deadline:
                raise BrowserError(f"{page}: the load event never fired")
            browser.call("Runtime.evaluate", {"expression": "1"}, session)
            time.sleep(0.1)
        plots = browser.call("Runtime.evaluate", {"expression": _READ_PLOTS % settle_ms, "awaitPromise": True,
                                                  "returnByValue": True}, session, timeout_s=settle_ms / 1000 + 30)
        headline = browser.call("Runtime.evaluate", {
            "expression": "(document.getElementById('headline') || {}).textContent || ''", "returnByValue": True},
            session)
        values = {name: browser.call("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                                     session)["result"].get("value") for name, expression in (evaluate or {}).items()}
        size = browser.call("Page.getLayoutMetrics", session=session)["cssContentSize"]
        browser.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": int(size["height"]) + 1,
                                                            "deviceScaleFactor": 1, "mobile": False}, session)
        image = browser.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session)
        screenshot = Path(screenshot)
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        screenshot.write_bytes(base64.b64decode(image["data"]))
        requests = [e["params"]["request"]["url"] for e in browser.events if e["method"] == "Network.requestWillBeSent"]
        return PageReport(console_errors=_errors(browser.events),
                          requests=[url for url in requests if url != page.as_uri()],
                          plots=plots["result"]["value"], headline=headline["result"]["value"],
                          values=values, screenshot=screenshot)
    finally:
        browser.close()
        shutil.rmtree(profile, ignore_errors=True)
