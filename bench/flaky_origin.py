#!/usr/bin/env python3
"""Flaky origin for the retry-amplification scenario of bench/run.sh.

Every request answers 503 with probability P (drawn from a seeded RNG, so a run is repeatable up to
thread scheduling), else 200. Attempts are counted; GET /__stats (sent directly, not through Backstop)
returns {"attempts": N, "failures": N, "connections": N} as JSON and is not counted.
No Retry-After is sent: the proxy's own backoff decides the pacing.

usage: flaky_origin.py PORT P [SEED]
"""
import json
import random
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(sys.argv[1])
P = float(sys.argv[2])
rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
lock = threading.Lock()
stats = {"attempts": 0, "failures": 0, "connections": 0}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # Nagle + delayed ACK would add 40 ms per keep-alive response

    def log_message(self, *args):
        pass

    def setup(self):
        super().setup()
        with lock:
            stats["connections"] += 1

    def reply(self, code, body, ctype="text/plain"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def handle_any(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if self.path == "/__stats":
            with lock:
                body = json.dumps(stats).encode()
            self.reply(200, body, "application/json")
            return
        with lock:
            stats["attempts"] += 1
            fail = rng.random() < P
            if fail:
                stats["failures"] += 1
        if fail:
            self.reply(503, b"unavailable\n")
        else:
            self.reply(200, b"ok\n")

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = handle_any


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024


Server(("127.0.0.1", PORT), Handler).serve_forever()
