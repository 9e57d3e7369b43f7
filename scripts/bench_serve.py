#!/usr/bin/env python3
"""Load test of `edgellm serve` (and llama-server in the same run): N concurrent streaming clients.

    python scripts/bench_serve.py smollm2-135m-instruct -c 1,4,8,16 -t 2 --parallel 8 \\
        --llama-server /path/to/llama-server
    python scripts/bench_serve.py smollm2-135m-instruct --soak 10 -c 8 -t 2 --parallel 8
    python scripts/bench_serve.py --url http://127.0.0.1:8080 -c 8      # a server already running
    python scripts/bench_serve.py -c 1,8 --json-schema scripts/bench_serve_schema.json --llama-server ...
    python scripts/bench_serve.py gemma3-270m --vs-generate 4 -r 3     # one client against `edgellm generate`
    python scripts/bench_serve.py -c 8,16 -r 3 --llama-server ... --base-python /other/venv/bin/python  # before/after

Each client holds one keep-alive connection and sends streaming chat completions back to back:
a shared system prompt, a user message of its own, 128 tokens each (end-of-generation tokens
banned through logit_bias, so every request generates exactly -n tokens), llama.cpp's default
sampling with a seed per request. For every concurrency level the servers take turns (llama-server,
then edgellm, --rounds times; medians over rounds), both started once, on the same file, thread
count and slots (llama-server's -c is --parallel x --seq-ctx, edgellm's -c is --seq-ctx). Reported:
aggregate generated tok/s (all tokens / wall time of the level), time to first token p50/p95/p99,
end-to-end latency p50/p99, per-stream decode tok/s (median of (tokens - 1) / (end - first token)),
errors, tokens per second of the server's CPU time (what load from other programs disturbs
least), and for edgellm where its engine steps' wall time went (ms per step by phase, from
/metrics); and the ratios edgellm / llama-server. --base-python PYTHON runs a second edgellm,
"edgellm-base", from another environment (an older build) taking turns with the others, for
before/after figures in one run. --json-schema FILE sends every request with
response_format json_schema (both servers constrain it; replies end where the schema does, so
their lengths vary and tok/s counts usage.completion_tokens). --soak MINUTES keeps -c clients busy that long and
prints each minute's throughput (content events streamed within it), the server's resident memory,
its CPU time and the CPU time of everything else on the machine (a minute slowed by other programs
shows as less server CPU and more of theirs; tokens per server CPU second takes that out).
--vs-generate PROMPTS sends one client's streaming /v1/completions of plain prompts and runs
`edgellm generate -v` on the same prompts with the same sampling and seeds, taking turns: first-token
time and decode tok/s side by side (replies end at the end-of-text token on both sides).

The client is a small asyncio HTTP/1.1 reader of server-sent events (no client library), so it
costs little CPU next to the servers on a 2-core machine. Only loopback addresses are used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

SYSTEM_PROMPT = (
    "You are a helpful assistant for a small office. You answer questions about scheduling, documents, "
    "printers, email and the shared calendar. Be precise and friendly, prefer short paragraphs, and when you "
    "are not sure about something, say so and suggest who in the office could know. Never invent facts about "
    "people, dates or numbers. If a question is about a private matter, answer politely that you cannot help "
    "with that. Use plain language without jargon, and explain any technical term the first time it appears."
)
TOPICS = ["the printer on the second floor", "booking the meeting room", "sharing a calendar", "archiving old email",
          "a document template", "the office wifi", "scanning receipts", "the holiday schedule", "backing up files",
          "ordering supplies", "a video call", "naming shared folders", "the fire drill", "a new colleague's first day",
          "the coffee machine", "sending large attachments"]
# llama.cpp's default sampling (common_params_sampling), sent explicitly so both servers do the same work
SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
START_TIMEOUT = 300


# -- the client ----------------------------------------------------------------------------------


@dataclass
class Result:
    ok: bool
    start: float
    ttft: float = float("nan")  # seconds from sending to the first generated text
    e2e: float = float("nan")
    tokens: int = 0
    error: str = ""


class Connection:
    """One keep-alive HTTP/1.1 connection that posts JSON and reads a streamed (SSE) answer."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def _open(self):
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    def close(self):
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def _body_chunks(self, headers: dict):
        r = self.reader
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await r.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    await r.readline()
                    return
                data = await r.readexactly(size)
                await r.readexactly(2)
                yield data
        elif "content-length" in headers:
            yield await r.readexactly(int(headers["content-length"]))
        else:
            while data := await r.read(65536):
                yield data
            self.close()

    async def stream(self, path: str, body: dict, headers: dict, on_data) -> tuple[int, bytes]:
        """POST body; call on_data(payload) for each SSE data line; returns (status, body if not 200)."""
        data = json.dumps(body).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"Accept: text/event-stream\r\nContent-Length: {len(data)}\r\n"
                + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n")
        # a kept-alive connection the server has closed since the last answer is reopened once and
        # the request sent again (nothing of it was read), as HTTP clients do
        for reused in ((True, False) if self.writer is not None else (False,)):
            if self.writer is None:
                await self._open()
            try:
                self.writer.write(head.encode() + data)
                await self.writer.drain()
                status_line = await self.reader.readline()
            except (ConnectionResetError, BrokenPipeError):
                status_line = b""
            if status_line:
                break
            self.close()
            if not reused:
                raise ConnectionError("the server closed the connection")
        status = int(status_line.split()[1])
        hdrs = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b"\n", b""):
            k, _, v = line.decode("latin-1").partition(":")
            hdrs[k.strip().lower()] = v.strip()
        pending, other = b"", b""
        async for chunk in self._body_chunks(hdrs):
            if status != 200:
                other += chunk
                continue
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.startswith(b"data: "):
                    on_data(line[6:].strip())
        if hdrs.get("connection", "").lower() == "close":
            self.close()
        return status, other


async def one_request(conn: Connection, body: dict, headers: dict, on_token=None,
                      path: str = "/v1/chat/completions") -> Result:
    """One streaming request (chat, or /v1/completions); on_token() is called for every content
    event as it arrives."""
    res = Result(ok=False, start=time.perf_counter())
    counted = [0, None]  # content events, usage.completion_tokens

    def on_data(payload: bytes):
        if payload == b"[DONE]":
            return
        ev = json.loads(payload)
        if "error" in ev:
            res.error = str(ev["error"].get("message", ev["error"]))[:200]
            return
        for ch in ev.get("choices") or []:
            if (ch.get("delta") or {}).get("content") or ch.get("text"):
                if counted[0] == 0:
                    res.ttft = time.perf_counter() - res.start
                counted[0] += 1
                if on_token:
                    on_token()
        if ev.get("usage"):
            counted[1] = ev["usage"].get("completion_tokens")

    try:
        status, other = await conn.stream(path, body, headers, on_data)
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        conn.close()
        res.error = f"{type(exc).__name__}: {exc}"
        return res
    res.e2e = time.perf_counter() - res.start
    res.tokens = counted[1] if counted[1] is not None else counted[0]
    if status != 200:
        res.error = f"HTTP {status}: {other[:200].decode(errors='replace')}"
    res.ok = not res.error and res.tokens > 0
    return res


def request_body(model: str, n_tokens: int, client: int, seq: int, fields: dict) -> dict:
    """One request; `fields` go into it as they are (logit_bias, or response_format with --json-schema)."""
    topic = TOPICS[(client + seq) % len(TOPICS)]
    return {"model": model, "stream": True, "stream_options": {"include_usage": True}, "max_tokens": n_tokens,
            "seed": 1000 * client + seq, **SAMPLING, **fields,
            "messages": [{"role": "system", "content": SYSTEM_PROMPT},
                         {"role": "user", "content": f"Client {client} asks (#{seq}): how do I deal with {topic}?"}]}


async def run_clients(host: str, port: int, model: str, clients: int, *, n_tokens: int, fields: dict,
                      headers: dict, requests_each: int | None = None, until: float | None = None,
                      on_result=None, on_token=None) -> tuple[list[Result], float]:
    """`clients` concurrent clients, each sending requests back to back: `requests_each` of them, or
    until time.perf_counter() passes `until`. Returns the results and the wall time."""

    async def client(i: int) -> list[Result]:
        conn, out, seq = Connection(host, port), [], 0
        while (requests_each is not None and seq < requests_each) or (until is not None and time.perf_counter() < until):
            r = await one_request(conn, request_body(model, n_tokens, i, seq, fields), headers, on_token)
            out.append(r)
            if on_result:
                on_result(r)
            seq += 1
        conn.close()
        return out

    t0 = time.perf_counter()
    per_client = await asyncio.gather(*(client(i) for i in range(clients)))
    return [r for rs in per_client for r in rs], time.perf_counter() - t0


# -- figures --------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    v = sorted(x for x in values if x == x)
    if not v:
        return float("nan")
    k = (len(v) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def summarize(results: list[Result], wall: float) -> dict:
    ok = [r for r in results if r.ok]
    ttft, e2e = [r.ttft for r in ok], [r.e2e for r in ok]
    per_stream = [(r.tokens - 1) / (r.e2e - r.ttft) for r in ok if r.tokens > 1 and r.e2e > r.ttft]
    errors = [r.error or "no tokens" for r in results if not r.ok]
    return {"requests": len(results), "errors": len(errors), "error_examples": sorted(set(errors))[:3],
            "tokens": sum(r.tokens for r in ok), "wall_s": wall,
            "agg_tps": sum(r.tokens for r in ok) / wall if wall > 0 else 0.0,
            "ttft_p50": percentile(ttft, 50), "ttft_p95": percentile(ttft, 95), "ttft_p99": percentile(ttft, 99),
            "e2e_p50": percentile(e2e, 50), "e2e_p95": percentile(e2e, 95), "e2e_p99": percentile(e2e, 99),
            "stream_tps": statistics.median(per_stream) if per_stream else float("nan")}


def median_of(rounds: list[dict]) -> dict:
    out = dict(rounds[-1])
    for k, v in rounds[0].items():
        if isinstance(v, float):
            out[k] = statistics.median(r[k] for r in rounds)
    out["errors"] = sum(r["errors"] for r in rounds)
    out["requests"] = sum(r["requests"] for r in rounds)
    return out


COLUMNS = [("agg tok/s", "agg_tps", "{:.1f}"), ("TTFT p50", "ttft_p50", "{:.3f}"), ("p95", "ttft_p95", "{:.3f}"),
           ("p99", "ttft_p99", "{:.3f}"), ("E2E p50", "e2e_p50", "{:.2f}"), ("p99", "e2e_p99", "{:.2f}"),
           ("stream tok/s", "stream_tps", "{:.1f}"), ("tok/server CPU s", "tok_per_cpu_s", "{:.1f}")]


def table(levels: dict[int, dict[str, dict]]) -> str:
    head = "| clients | server | " + " | ".join(c[0] for c in COLUMNS) + " | errors |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 3)]
    for n, by_server in levels.items():
        for name, s in by_server.items():
            cells = [fmt.format(s[key]) for _, key, fmt in COLUMNS]
            lines.append(f"| {n} | {name} | " + " | ".join(cells) + f" | {s['errors']}/{s['requests']} |")
        b = by_server.get("llama-server")
        for name, a in by_server.items():
            if b is not None and name != "llama-server":
                cells = [f"{a[key] / b[key]:.2f}x" if b[key] else "-" for _, key, _ in COLUMNS]
                lines.append(f"| {n} | {name} / llama | " + " | ".join(cells) + " | |")
    return "\n".join(lines)


def step_phases(host: str, port: int, headers: dict) -> dict[str, float] | None:
    """edgellm's engine_step_seconds by phase and its step count, from /metrics (None: another server)."""
    req = urllib.request.Request(f"http://{host}:{port}/metrics", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read().decode()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        m = re.match(r'edgellm_engine_step_seconds_total\{phase="(\w+)"\} (\S+)', line)
        if m:
            out[m[1]] = float(m[2])
        elif line.startswith("edgellm_engine_steps_total "):
            out["steps"] = float(line.split()[1])
    return out if "steps" in out and len(out) > 1 else None


def phases_text(before: dict | None, after: dict | None) -> str:
    """ms per step by phase between two step_phases() readings."""
    if not before or not after or after["steps"] <= before["steps"]:
        return ""
    steps = after["steps"] - before["steps"]
    ms = {k: 1000 * (after[k] - before[k]) / steps for k in after if k != "steps"}
    python = sum(v for k, v in ms.items() if k != "decode")
    return (f"{steps:.0f} steps, ms per step: " + ", ".join(f"{k} {v:.2f}" for k, v in ms.items())
            + f" (Python {100 * python / (python + ms.get('decode', 0)):.0f}% of the step)")


def tail_ratios(s: dict) -> str:
    return (f"P99/P95: first token {s['ttft_p99'] / s['ttft_p95']:.2f}, end-to-end {s['e2e_p99'] / s['e2e_p95']:.2f}"
            if s["ttft_p95"] and s["e2e_p95"] else "")


# -- servers --------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int | None) -> float:
    if pid is None:
        return float("nan")
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def cpu_seconds(pid: int | None) -> float:
    """CPU time (user + system) a process has used, its threads' included."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, TypeError, IndexError, ValueError):
        return float("nan")


def machine_busy_seconds() -> float:
    """CPU time all processes have used (every core's non-idle time, /proc/stat)."""
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = values[3] + values[4]  # idle, iowait
        return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


@dataclass
class Server:
    name: str
    host: str
    port: int
    proc: subprocess.Popen | None = None
    model: str = ""
    log: Path | None = None
    headers: dict = field(default_factory=dict)

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                sys.exit(f"{self.name} exited while starting; its log: {self.log}")
            try:
                with urllib.request.urlopen(f"http://{self.host}:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.25)
        else:
            sys.exit(f"{self.name} did not become ready in {START_TIMEOUT} s; its log: {self.log}")
        req = urllib.request.Request(f"http://{self.host}:{self.port}/v1/models", headers=self.headers)
        with urllib.request.urlopen(req, timeout=30) as r:
            self.model = json.load(r)["data"][0]["id"]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def start(name: str, cmd: list[str], port: int, logdir: Path) -> Server:
    log = logdir / f"{name}.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    srv = Server(name, "127.0.0.1", port, proc, log=log)
    srv.wait_ready()
    return srv


def eog_bias_for(path: Path) -> dict:
    from edgellm.gguf_file import GGUFFile
    from edgellm.tokenizer import Tokenizer

    return {str(t): -100 for t in sorted(Tokenizer.from_metadata(GGUFFile(path).metadata).eog_ids)}


# -- main -----------------------------------------------------------------------------------------


async def bench_levels(servers: list[Server], levels: list[int], args, fields) -> dict:
    out: dict[int, dict[str, dict]] = {}
    for n in levels:
        rounds: dict[str, list[dict]] = {s.name: [] for s in servers}
        for r in range(args.rounds):
            for s in servers:
                phases = step_phases(s.host, s.port, s.headers)
                cpu, busy = cpu_seconds(s.pid), machine_busy_seconds()
                results, wall = await run_clients(s.host, s.port, s.model, n, n_tokens=args.n_tokens, fields=fields,
                                                  headers=s.headers, requests_each=args.requests)
                summary = summarize(results, wall)
                summary["rss_mib"] = rss_mib(s.pid)
                # cores the server had, and the cores everything else took meanwhile (this client
                # included): a busy machine slows a server whose threads wait for each other
                summary["server_cores"] = (cpu_seconds(s.pid) - cpu) / wall
                summary["other_cores"] = (machine_busy_seconds() - busy) / wall - summary["server_cores"]
                summary["tok_per_cpu_s"] = summary["agg_tps"] / summary["server_cores"] if summary["server_cores"] else 0.0
                summary["phases"] = phases_text(phases, step_phases(s.host, s.port, s.headers))
                rounds[s.name].append(summary)
                print(f"  {n} clients, round {r + 1}, {s.name}: {summary['agg_tps']:.1f} tok/s, "
                      f"TTFT p99 {summary['ttft_p99']:.3f} s, errors {summary['errors']}/{summary['requests']}"
                      + (f" e.g. {summary['error_examples'][0]}" if summary["error_examples"] else "")
                      + f"; CPU cores: server {summary['server_cores']:.2f}, everything else {summary['other_cores']:.2f}"
                      + (f"; {summary['phases']}" if summary["phases"] else ""),
                      file=sys.stderr, flush=True)
        out[n] = {name: median_of(rs) for name, rs in rounds.items()}
    return out


async def soak(server: Server, clients: int, minutes: float, args, fields) -> list[dict]:
    t0 = time.perf_counter()
    end = t0 + minutes * 60
    per_minute: list[dict] = []
    current = {"tokens": 0, "errors": 0, "requests": 0, "streamed": 0}

    def on_token():
        current["streamed"] += 1

    def on_result(r: Result):
        current["requests"] += 1
        current["tokens"] += r.tokens if r.ok else 0
        current["errors"] += 0 if r.ok else 1

    async def ticker():
        minute = 0
        cpu, busy = cpu_seconds(server.pid), machine_busy_seconds()
        while time.perf_counter() < end:
            await asyncio.sleep(max(0.0, t0 + 60 * (minute + 1) - time.perf_counter()))
            minute += 1
            # tok/s: the content events streamed within the minute (requests finish in waves of
            # -c, so counting finished requests' tokens jumps by a wave: 8 of ~80 is 10%). The
            # server's CPU time and the rest of the machine's (other programs and this client) say
            # whether a slow minute had fewer cores to run on or did more work per token.
            cpu1, busy1 = cpu_seconds(server.pid), machine_busy_seconds()
            row = {"minute": minute, "tok_s": current["streamed"] / 60, "done_tok_s": current["tokens"] / 60,
                   "errors": current["errors"], "requests": current["requests"], "rss_mib": rss_mib(server.pid),
                   "server_cpu_s": cpu1 - cpu, "other_cpu_s": (busy1 - busy) - (cpu1 - cpu)}
            cpu, busy = cpu1, busy1
            per_minute.append(row)
            print(f"  minute {minute}: {row['tok_s']:.1f} tok/s streamed ({row['done_tok_s']:.1f} in finished requests), "
                  f"{row['requests']} requests, {row['errors']} errors, RSS {row['rss_mib']:.1f} MiB, server CPU "
                  f"{row['server_cpu_s']:.0f} s, others {row['other_cpu_s']:.0f} s",
                  file=sys.stderr, flush=True)
            current.update(tokens=0, errors=0, requests=0, streamed=0)

    await asyncio.gather(ticker(), run_clients(server.host, server.port, server.model, clients, n_tokens=args.n_tokens,
                                               fields=fields, headers=server.headers, until=end,
                                               on_result=on_result, on_token=on_token))
    return per_minute


def completion_prompt(i: int) -> str:
    """The question first, so that no two prompts share a prefix (the server's prefix cache
    would take the shared part's prefill out of its first-token time, generate's keeps it)."""
    return f"Question {i}: how do I deal with {TOPICS[i % len(TOPICS)]}?\n\n{SYSTEM_PROMPT}\n\nAnswer:"


_STATS = re.compile(r"\[prompt: (\d+) tok, ([\d.]+) tok/s \| answer: (\d+) tok, ([\d.]+) tok/s")


def generate_cli(path: Path, prompt: str, seed: int, args) -> dict:
    """`edgellm generate -v` on one prompt: its first-token time (prompt tokens / prompt speed,
    the model load left out) and decode speed, from the speed line it prints."""
    cmd = [sys.executable, "-m", "edgellm", "generate", str(path), "-p", prompt, "-n", str(args.n_tokens), "-v",
           "-t", str(args.threads), "-c", str(args.seq_ctx), "--seed", str(seed), "--temp", str(SAMPLING["temperature"]),
           "--top-k", str(SAMPLING["top_k"]), "--top-p", str(SAMPLING["top_p"]), "--min-p", str(SAMPLING["min_p"])]
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600)
    m = _STATS.search(r.stderr)
    if r.returncode != 0 or m is None:
        sys.exit(f"edgellm generate failed ({r.returncode}): {r.stderr[-400:]}")
    n_prompt, pps, n_out, dps = int(m[1]), float(m[2]), int(m[3]), float(m[4])
    return {"ttft": n_prompt / pps, "stream_tps": dps, "tokens": n_out}


async def server_completion(server: Server, prompt: str, seed: int, args) -> dict:
    body = {"model": server.model, "prompt": prompt, "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": args.n_tokens, "seed": seed, **SAMPLING}
    conn = Connection(server.host, server.port)
    try:
        r = await one_request(conn, body, server.headers, path="/v1/completions")
    finally:
        conn.close()
    if not r.ok:
        sys.exit(f"{server.name}: /v1/completions failed: {r.error}")
    return {"ttft": r.ttft, "stream_tps": (r.tokens - 1) / (r.e2e - r.ttft) if r.tokens > 1 else float("nan"),
            "tokens": r.tokens}


def vs_generate(server: Server, path: Path, prompts: int, args) -> str:
    """One client against `edgellm generate` on the same prompts (plain completions, the same
    sampling and seed), taking turns prompt by prompt for --rounds rounds: medians and ratios."""
    got: dict[str, list[dict]] = {"edgellm serve": [], "edgellm generate": []}
    for r in range(args.rounds):
        for i in range(prompts):
            seed = r * prompts + i  # a new prompt each time: nothing for the prefix cache to reuse
            got["edgellm serve"].append(asyncio.run(server_completion(server, completion_prompt(seed), seed, args)))
            got["edgellm generate"].append(generate_cli(path, completion_prompt(seed), seed, args))
        print(f"  one client vs generate: round {r + 1} done", file=sys.stderr, flush=True)
    med = {k: {f: statistics.median(x[f] for x in v) for f in ("ttft", "stream_tps", "tokens")} for k, v in got.items()}
    a, b = med["edgellm serve"], med["edgellm generate"]
    lines = ["| one client | first token s | decode tok/s | tokens |", "|---|---:|---:|---:|"]
    lines += [f"| {k} | {v['ttft']:.3f} | {v['stream_tps']:.1f} | {v['tokens']:.0f} |" for k, v in med.items()]
    lines.append(f"| serve / generate | {a['ttft'] / b['ttft']:.2f}x | {a['stream_tps'] / b['stream_tps']:.2f}x | |")
    return "\n".join(lines) + (f"\n\nmedians of {len(got['edgellm serve'])} requests each; the server's first-token "
                               "time is the client's (HTTP, tokenizing and prefill), generate's its prompt evaluation")


def soak_report(rows: list[dict]) -> str:
    full = rows  # whole minutes only (requests still running at the end are not counted)
    tps = [r["tok_s"] for r in full]
    mean = statistics.mean(tps) if tps else float("nan")
    # tokens per CPU-second of the server: its throughput with the machine's other load taken out
    per_cpu = [r["tok_s"] * 60 / r["server_cpu_s"] if r["server_cpu_s"] > 0 else float("nan") for r in full]
    mean_cpu = statistics.mean(per_cpu) if per_cpu else float("nan")
    lines = ["| minute | tok/s streamed | vs mean | tok/s of finished requests | requests | errors | RSS MiB | "
             "server CPU s | others' CPU s | tokens per server CPU s | vs mean |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r, c in zip(full, per_cpu):
        lines.append(f"| {r['minute']} | {r['tok_s']:.1f} | {100 * (r['tok_s'] / mean - 1):+.1f}% | {r['done_tok_s']:.1f} | "
                     f"{r['requests']} | {r['errors']} | {r['rss_mib']:.1f} | {r['server_cpu_s']:.0f} | "
                     f"{r['other_cpu_s']:.0f} | {c:.1f} | {100 * (c / mean_cpu - 1):+.1f}% |")
    if len(full) > 1:
        growth = full[-1]["rss_mib"] - full[0]["rss_mib"]
        worst = max(abs(t / mean - 1) for t in tps) * 100
        worst_cpu = max(abs(c / mean_cpu - 1) for c in per_cpu) * 100
        lines.append(f"\nmean {mean:.1f} tok/s; worst minute {worst:.1f}% from the mean ({worst_cpu:.1f}% in tokens per "
                     f"server CPU second); RSS after minute 1 grew {growth:+.1f} MiB; errors "
                     f"{sum(r['errors'] for r in full)}/{sum(r['requests'] for r in full)}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default="smollm2-135m-instruct", help="alias from models.toml or .gguf path")
    ap.add_argument("-c", "--clients", default="1,4,8,16", help="comma-separated concurrency levels")
    ap.add_argument("-n", "--n-tokens", type=int, default=128, help="tokens generated per request")
    ap.add_argument("-r", "--rounds", type=int, default=1, help="alternating rounds per level (medians reported)")
    ap.add_argument("--requests", type=int, default=4, help="requests each client sends per level and round")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=8, help="sequences each server decodes at once")
    ap.add_argument("--seq-ctx", type=int, default=2048, help="context per sequence")
    ap.add_argument("--max-queue", type=int, default=256, help="edgellm's --max-queue")
    ap.add_argument("--llama-server", help="llama-server binary: run it too, same prompts, same run")
    ap.add_argument("--base-python", help="also run edgellm from this Python (another build) as edgellm-base")
    ap.add_argument("--url", help="benchmark a server already running here (http://127.0.0.1:PORT) instead")
    ap.add_argument("--api-key", default=os.environ.get("EDGELLM_API_KEY"), help="for --url servers that need one")
    ap.add_argument("--soak", type=float, metavar="MINUTES", help="run the first -c level this long; per minute")
    ap.add_argument("--json-schema", metavar="FILE", help="constrain every reply to this JSON schema (response_format)")
    ap.add_argument("--vs-generate", type=int, metavar="PROMPTS",
                    help="one client's completions against `edgellm generate` on the same PROMPTS prompts instead")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    levels = [int(x) for x in args.clients.split(",")]
    if any(n <= 0 for n in levels) or args.n_tokens <= 0 or args.requests <= 0 or args.rounds <= 0:
        ap.error("clients, tokens, requests and rounds must be positive")

    from edgellm.registry import resolve

    # a SIGTERM (a run cut short) ends like Ctrl-C: through the finally that stops the servers
    signal.signal(signal.SIGTERM, lambda sig, frame: sys.exit(128 + sig))
    servers: list[Server] = []
    logdir = Path(tempfile.mkdtemp(prefix="bench_serve_"))
    try:
        if args.url:
            from urllib.parse import urlsplit

            u = urlsplit(args.url)
            if u.hostname not in ("127.0.0.1", "localhost", "::1"):
                ap.error("--url must be a loopback address")
            srv = Server("edgellm", u.hostname, u.port or 80)
            if args.api_key:
                srv.headers = {"Authorization": f"Bearer {args.api_key}"}
            srv.wait_ready()
            servers.append(srv)
            path = resolve(args.model) if args.model else None
        else:
            path = Path(resolve(args.model, progress=True))
            if args.llama_server:
                port = free_port()
                servers.append(start("llama-server", [args.llama_server, "-m", str(path), "-t", str(args.threads),
                                                      "-c", str(args.seq_ctx * args.parallel), "-np", str(args.parallel),
                                                      "--host", "127.0.0.1", "--port", str(port)], port, logdir))
            builds = ([("edgellm-base", args.base_python)] if args.base_python else []) + [("edgellm", sys.executable)]
            for name, python in builds:
                port = free_port()
                servers.append(start(name, [python, "-m", "edgellm", "serve", str(path), "-t", str(args.threads),
                                            "-c", str(args.seq_ctx), "--parallel", str(args.parallel),
                                            "--max-queue", str(args.max_queue), "--port", str(port)], port, logdir))
        if args.json_schema:  # the schema ends each reply: no banned end tokens, lengths vary (usage counts them)
            schema = json.loads(Path(args.json_schema).read_text())
            fields = {"response_format": {"type": "json_schema", "json_schema": {"name": "bench", "schema": schema}}}
        else:
            fields = {"logit_bias": eog_bias_for(Path(path)) if path else {}}
        print(f"model {path}; {args.threads} threads, {args.parallel} parallel, {args.n_tokens} tokens per request; "
              f"logs in {logdir}", file=sys.stderr)
        for s in servers:  # warm up: first-use costs (huge pages, caches) out of the figures
            asyncio.run(run_clients(s.host, s.port, s.model, 1, n_tokens=8, fields=fields, headers=s.headers,
                                    requests_each=1))
        figures: dict = {"model": str(path), "threads": args.threads, "parallel": args.parallel,
                         "n_tokens": args.n_tokens, "json_schema": args.json_schema}
        if args.vs_generate:
            srv = next(s for s in servers if s.name == "edgellm")
            report = vs_generate(srv, Path(path), args.vs_generate, args)
            figures["vs_generate"] = report
            print(f"\n### one client, {Path(path).name}, {args.threads} threads\n\n{report}")
        elif args.soak:
            for s in servers:
                print(f"soak: {s.name}, {levels[0]} clients, {args.soak} minutes", file=sys.stderr)
                rows = asyncio.run(soak(s, levels[0], args.soak, args, fields))
                figures.setdefault("soak", {})[s.name] = rows
                print(f"\n### soak: {s.name}, {levels[0]} clients\n\n{soak_report(rows)}")
        else:
            results = asyncio.run(bench_levels(servers, levels, args, fields))
            figures["levels"] = results
            print(table(results))
            for n, by in results.items():
                for name, s in by.items():
                    print(f"{n} clients, {name}: {tail_ratios(s)}; RSS {s['rss_mib']:.1f} MiB; CPU cores: server "
                          f"{s['server_cores']:.2f}, everything else {s['other_cores']:.2f} (medians of rounds)"
                          + (f"; last round: {s['phases']}" if s.get("phases") else ""))
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=1))
    finally:
        for s in servers:
            s.stop()


if __name__ == "__main__":
    main()
