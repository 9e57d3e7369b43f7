"""A real `edgellm serve` process on a free local port (--port 0; the port is read from its ready
line), and small HTTP helpers for the server tests."""

from __future__ import annotations

import http.client
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

READY = re.compile(r"at (http://[^ ]+)/v1$")
START_TIMEOUT = 180  # seconds: loading a model on a busy 2-core machine


class ServerProcess:
    def __init__(self, model, *args: str, env: dict | None = None):
        cmd = [sys.executable, "-m", "edgellm", "serve", str(model), "--port", "0", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.stdout, lines), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr, None), daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise RuntimeError(f"the server did not start: {''.join(self.stderr)[-2000:]}") from None
            if line is None:
                raise RuntimeError(f"the server exited: {''.join(self.stderr)[-2000:]}")
            m = READY.search(line.rstrip())
            if m:
                self.url = m.group(1)
                break
        self.host, self.port = urlsplit(self.url).hostname, urlsplit(self.url).port
        self.base_url = self.url + "/v1"

    @staticmethod
    def _pump(stream, sink: list, lines):
        for line in stream:
            sink.append(line)
            if lines is not None:
                lines.put(line)
        if lines is not None:
            lines.put(None)

    def connection(self, timeout: float = 120) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, method: str, path: str, body=None, headers: dict | None = None, raw: bytes | None = None):
        """(status, headers, parsed JSON or text) of one request on a fresh connection."""
        conn = self.connection()
        try:
            data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
            hdrs = {"Content-Type": "application/json", **(headers or {})}
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
            text = resp.read().decode()
            try:
                payload = json.loads(text)
            except ValueError:
                payload = text
            return resp.status, dict(resp.getheaders()), payload
        finally:
            conn.close()

    def metrics(self, headers: dict | None = None) -> dict[str, float]:
        """The /metrics samples as {'name{labels}': value}."""
        status, _, text = self.request("GET", "/metrics", headers=headers)
        assert status == 200, text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out

    def signal(self, sig=signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                return self.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode


def open_stream(server: ServerProcess, path: str, body: dict, headers: dict | None = None):
    """Start a streamed request; returns (connection, response) with the body unread."""
    conn = server.connection()
    conn.request("POST", path, body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json", **(headers or {})})
    return conn, conn.getresponse()


def sse_events(resp):
    """The JSON payloads of a server-sent event stream, until [DONE] (yields "[DONE]")."""
    while True:
        line = resp.readline()
        if not line:
            return
        line = line.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            yield data
            return
        yield json.loads(data)


def wait_for(predicate, timeout: float, interval: float = 0.05):
    """Poll until predicate() is truthy (returns its value) or fail after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)
