"""A headless Chromium for the tests that look at pages (the report, the planner page, the
Ray dashboard): find it, start it, drive one page over the DevTools protocol, collect the
page's errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
#: What the test set-up runs when Chromium is missing (Debian; needs root).
CHROMIUM_INSTALL = "apt-get update && apt-get install -y chromium"


def find_chromium() -> str | None:
    """Chromium's executable: ``$OPTW_CHROMIUM``, else the first known name on PATH."""
    env = os.environ.get("OPTW_CHROMIUM")
    if env:
        return env if Path(env).exists() or shutil.which(env) else None
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


class DevTools:
    """A minimal Chrome DevTools Protocol client over an open WebSocket to one page target
    (``websockets``' sync client); events are kept in ``events``."""

    def __init__(self, ws: Any):
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self._id = 0

    def call(self, method: str, timeout: float = 20.0, **params: Any) -> dict[str, Any]:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def load(self, url: str, width: int, height: int) -> None:
        """Enable the Page, Runtime, Log and Network events, size the viewport, open ``url``
        and wait for its load event."""
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)
        self.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired", timeout=30)

    def wait_for(self, event: str, timeout: float = 20.0) -> dict[str, Any]:
        for msg in self.events:
            if msg.get("method") == event:
                return msg
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            self.events.append(msg)
            if msg.get("method") == event:
                return msg


def start_chromium(binary: str, profile: Path) -> tuple[subprocess.Popen, int]:
    """Headless Chromium with remote debugging on a free port (read from the profile's
    ``DevToolsActivePort`` file)."""
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={profile}", "--remote-debugging-port=0",
             "--remote-allow-origins=*", "about:blank"]
    proc = subprocess.Popen([binary, *flags], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
            raise RuntimeError(f"chromium exited with {proc.returncode}: {err}")
        if port_file.exists() and port_file.read_text().strip():
            return proc, int(port_file.read_text().split()[0])
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("chromium did not open its DevTools port within 30 s")


def page_target(port: int) -> str:
    """The WebSocket URL of Chromium's first page target."""
    deadline = time.monotonic() + 10
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
            targets = json.load(r)
        pages = [t for t in targets if t.get("type") == "page"]
        if pages:
            return pages[0]["webSocketDebuggerUrl"]
        if time.monotonic() > deadline:
            raise RuntimeError(f"no page target in {targets}")
        time.sleep(0.2)


def page_errors(events: list[dict[str, Any]]) -> list[str]:
    """The page's exceptions, console errors, logged errors and failed loads."""
    out = []
    for e in events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.exceptionThrown":
            out.append(f"exception: {p['exceptionDetails'].get('text')}")
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console.error: " + " ".join(str(a.get("value", a.get("description")))
                                                    for a in p.get("args", [])))
        elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
            out.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        elif m == "Network.loadingFailed":
            out.append(f"load failed: {p.get('errorText')} ({p.get('type')})")
    return out
