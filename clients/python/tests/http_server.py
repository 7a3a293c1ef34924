"""The server processes of the HTTP tests (http_app.py under uvicorn) and what they poll: started on the ports of
tests/ports "clients-http" (the first two), killed with SIGKILL, frozen with SIGSTOP, restarted; readiness, the
end of a killed server's database sessions and the end of a lease are polled, never waited for by the clock."""
import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid

import httpx

HERE = pathlib.Path(__file__).resolve().parent
TABLES = """
CREATE TABLE IF NOT EXISTS http_orders (id serial PRIMARY KEY, idem_key text, scope text, item text);
CREATE TABLE IF NOT EXISTS http_runs (id serial PRIMARY KEY, idem_key text, scope text, mode text, token bigint,
                                      server_pid int, backend_pid int, started_at timestamptz DEFAULT clock_timestamp());
"""


def poll(what, fn, timeout=30.0, every=0.02):
    """fn() until it returns something true (returned); AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        out = fn()
        if out:
            return out
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def sf(key: str) -> str:
    """The Idempotency-Key field of a key: an RFC 8941 sf-string."""
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def new_key(name="k") -> str:
    return f"{name}-{uuid.uuid4().hex[:12]}"


class Server:
    """uvicorn serving http_app:app; ``app_name`` (the application_name of its database sessions) is new at
    each start, so that the sessions of a killed process can be told apart."""

    def __init__(self, cluster, db, port, log_dir, framework="fastapi"):
        self.cluster, self.db, self.port, self.framework = cluster, db, port, framework
        self.url = f"http://127.0.0.1:{port}"
        self.log = pathlib.Path(log_dir) / f"http-server-{port}.log"
        self.proc = None
        self.app_name = None
        self.starts = 0

    def start(self, lease=3.0):
        self.starts += 1
        self.app_name = f"idem-http-{self.port}-{os.getpid()}-{self.starts}"
        dsn = (f"host={self.cluster.sockdir} port={self.cluster.port} user=postgres dbname={self.db} "
               f"application_name={self.app_name}")
        env = dict(os.environ, IDEM_HTTP_DSN=dsn, IDEM_HTTP_FRAMEWORK=self.framework, IDEM_HTTP_LEASE=str(lease))
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "http_app:app", "--app-dir", str(HERE), "--host", "127.0.0.1",
                 "--port", str(self.port), "--log-level", "warning", "--no-access-log"],
                env=env, stdout=log, stderr=subprocess.STDOUT)

        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited ({self.proc.returncode}): {self.log.read_text()[-3000:]}")
            try:
                return httpx.get(self.url + "/_test/health", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        poll("the HTTP server to answer", ready)

    def kill(self, conn):
        """kill -9, then wait until PostgreSQL has ended every session of the process (so its transactions are
        rolled back and no statement of it runs any more)."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        poll("the killed server's sessions to end", lambda: conn.execute(
            "SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name = %s", (self.app_name,)).fetchone()[0])

    def freeze(self):
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def counts(conn, key, scope="http"):
    """(handler runs, business rows) of a key."""
    runs = conn.execute("SELECT count(*) FROM http_runs WHERE idem_key = %s AND scope = %s", (key, scope)).fetchone()[0]
    rows = conn.execute("SELECT count(*) FROM http_orders WHERE idem_key = %s AND scope = %s", (key, scope)).fetchone()[0]
    return runs, rows


def record(conn, key, scope="http"):
    """idem_status of a key as a dict, or None."""
    row = conn.execute("SELECT status, attempts, token, expires_at, error FROM idem_status(%s, scope => %s)",
                       (key, scope)).fetchone()
    return None if row is None else dict(zip(("status", "attempts", "token", "expires_at", "error"), row))
