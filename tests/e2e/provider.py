#!/usr/bin/env python3
"""A tiny "payment provider" on loopback that deduplicates by Idempotency-Key, as Stripe and others do.

    POST /charges   headers: Idempotency-Key   body: {"amount": 1234}
        first request of a key: creates a charge, answers 201 {"charge": "ch_<n>", "amount": ...}
        a repeat of the key:    answers 200 with the same body (the provider's own deduplication)
        same key, other body:   answers 422 (the key was reused for a different request)
    GET /stats      every charge, with how many requests each key received

Usage: provider.py PORT [SLOW_P]. A fraction SLOW_P of the requests take 0.3-1.2 s (a slow upstream),
so consumers have to heartbeat their leases; the rest take 1-4 ms. In memory only: it lives as long as the run.
"""
import json
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
CHARGES = {}      # key -> {"charge": id, "amount": n, "requests": n}
STATS = {"requests": 0, "created": 0, "replayed": 0, "mismatched": 0}
SLOW_P = float(sys.argv[2]) if len(sys.argv) > 2 else 0.01


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall

    def log_message(self, *args):  # quiet
        pass

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path != "/stats":
            return self.reply(404, {"error": "not found"})
        with LOCK:
            self.reply(200, {"stats": dict(STATS), "charges": CHARGES})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        key = self.headers.get("Idempotency-Key")
        if self.path != "/charges" or not key or not isinstance(body.get("amount"), int):
            return self.reply(400, {"error": "POST /charges with Idempotency-Key and an integer amount"})
        time.sleep(random.uniform(0.3, 1.2) if random.random() < SLOW_P else random.uniform(0.001, 0.004))
        with LOCK:
            STATS["requests"] += 1
            charge = CHARGES.get(key)
            if charge is None:
                STATS["created"] += 1
                charge = CHARGES[key] = {"charge": f"ch_{STATS['created']}", "amount": body["amount"],
                                         "requests": 1}
                status = 201
            elif charge["amount"] != body["amount"]:
                STATS["mismatched"] += 1
                return self.reply(422, {"error": "idempotency key reused with another request"})
            else:
                STATS["replayed"] += 1
                charge["requests"] += 1
                status = 200
            self.reply(status, {"charge": charge["charge"], "amount": charge["amount"]})


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.daemon_threads = True
    print(f"provider listening on 127.0.0.1:{sys.argv[1]}", flush=True)
    server.serve_forever()
