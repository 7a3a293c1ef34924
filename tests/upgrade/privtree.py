"""A private PostgreSQL 15 installation whose extension files we choose, and clusters run from it.

PostgreSQL finds its library and share directories relative to its own executable. A tree under /tmp with
copies of postgres, initdb and pg_ctl, symlinks to everything else of the system installation, and the
idempotency files of our choice (an old build, then the new one) therefore runs whichever version we put
there, while the system installation (which other people build into and test against) is never touched.
The same idea as tests/torture/harness.py's snapshot, with the extension's files as a parameter.
"""
import hashlib
import os
import pathlib
import shutil
import subprocess
import time

import psycopg

SYSTEM_BIN = pathlib.Path("/usr/lib/postgresql/15/bin")
SYSTEM_LIB = pathlib.Path("/usr/lib/postgresql/15/lib")
SYSTEM_SHARE = pathlib.Path("/usr/share/postgresql/15")
EXT = "idempotency"
PORTS = range(54360, 54370)

CRASH_PATTERNS = ("PANIC:", "TRAP:", "terminated by signal", "was terminated by", "server process (PID",
                  "terminating any other active server processes", "all server processes terminated")


def as_postgres(args, **kw):
    """Runs a command as the postgres OS user (initdb and pg_ctl refuse root)."""
    if os.geteuid() == 0:
        args = ["sudo", "-u", "postgres", "-H", *args]
    return subprocess.run(args, **kw)


def is_ext_file(name):
    return name == f"{EXT}.so" or name == f"{EXT}.control" or (name.startswith(f"{EXT}--") and name.endswith(".sql"))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ext_files(source=None):
    """The extension's files in the system installation (what scripts/build installed), or anywhere
    under the directory `source` (e.g. a `cargo pgrx package` output directory)."""
    if source is not None:
        return sorted((p for p in pathlib.Path(source).rglob(f"{EXT}*") if p.is_file() and is_ext_file(p.name)),
                      key=lambda p: p.name)
    files = [SYSTEM_LIB / f"{EXT}.so"] if (SYSTEM_LIB / f"{EXT}.so").exists() else []
    files += sorted(p for p in (SYSTEM_SHARE / "extension").iterdir() if is_ext_file(p.name))
    return files


def copy_system_ext_files(dest, source=None):
    """Copies the installed extension files (or those under `source`) into dest, twice over until the
    copy and the originals agree (an install running right now would otherwise leave a half-written
    library). Returns the copies."""
    dest = pathlib.Path(dest)
    for _ in range(10):
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        before = {p.name: sha256(p) for p in ext_files(source)}
        for p in ext_files(source):
            shutil.copy2(p, dest / p.name)
        time.sleep(1.0)
        after = {p.name: sha256(p) for p in ext_files(source)}
        copied = {p.name: sha256(p) for p in dest.iterdir()}
        if before == after == copied:
            return sorted(dest.iterdir())
    raise RuntimeError("the installed extension files kept changing while they were copied")


def control_default_version(path):
    for line in pathlib.Path(path).read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "default_version":
            return value.strip().strip("'")
    return None


class PrivateTree:
    """A copy of the PostgreSQL 15 installation under `root` with its own idempotency files."""

    def __init__(self, root):
        self.root = pathlib.Path(root)
        self.bin = self.root / SYSTEM_BIN.relative_to("/")
        self.lib = self.root / SYSTEM_LIB.relative_to("/")
        self.share = self.root / SYSTEM_SHARE.relative_to("/")
        self.ext = self.share / "extension"

    def build(self):
        """Makes the tree without any idempotency file."""
        if self.root.exists():
            shutil.rmtree(self.root)
        for d in (self.bin, self.lib, self.ext):
            d.mkdir(parents=True)
        # Executables are copied: PostgreSQL resolves symlinks to find its own location.
        for exe in ("postgres", "initdb", "pg_ctl"):
            shutil.copy2(SYSTEM_BIN / exe, self.bin / exe)
        for entry in SYSTEM_LIB.iterdir():
            if not is_ext_file(entry.name):
                (self.lib / entry.name).symlink_to(entry)
        for entry in SYSTEM_SHARE.iterdir():
            if entry.name != "extension":
                (self.share / entry.name).symlink_to(entry)
        for entry in (SYSTEM_SHARE / "extension").iterdir():
            if not is_ext_file(entry.name):
                (self.ext / entry.name).symlink_to(entry)
        subprocess.run(["chmod", "-R", "a+rX", str(self.root)], check=True)

    def install(self, files):
        """Replaces the tree's idempotency files by `files` (the .so goes to lib, the rest to extension).
        New files, never rewritten in place: a server that still had the old library mapped keeps it."""
        for d in (self.lib, self.ext):
            for entry in d.iterdir():
                if is_ext_file(entry.name):
                    entry.unlink()
        for f in map(pathlib.Path, files):
            if not is_ext_file(f.name):
                raise ValueError(f"not a file of the extension: {f}")
            target = (self.lib if f.suffix == ".so" else self.ext) / f.name
            shutil.copy2(f, target)
            target.chmod(0o755 if f.suffix == ".so" else 0o644)

    def installed(self):
        return sorted(p.name for d in (self.lib, self.ext) for p in d.iterdir() if is_ext_file(p.name))

    def default_version(self):
        return control_default_version(self.ext / f"{EXT}.control")


class Cluster:
    """A throwaway cluster run from a PrivateTree, owned by postgres, on a private port and socket dir."""

    def __init__(self, tree, port, conf=()):
        assert port in PORTS, port
        self.tree = tree
        self.port = port
        self.sockdir = f"/tmp/idem-sock-{port}"
        self.pgdata = f"/tmp/idem-data-{port}"
        self.logfile = pathlib.Path(self.pgdata) / "server.log"
        self.conf = list(conf)
        self.running = False

    def _pg_ctl(self, *args, check=True):
        r = as_postgres([str(self.tree.bin / "pg_ctl"), "-D", self.pgdata, *args], capture_output=True, text=True)
        if check and r.returncode != 0:
            raise RuntimeError(f"pg_ctl {' '.join(args)} failed: {r.stdout} {r.stderr}\n{self.log_tail()}")
        return r

    def init(self):
        """A new data directory (any previous one on this port is stopped and wiped)."""
        if os.path.exists(f"{self.pgdata}/postmaster.pid"):
            self._pg_ctl("stop", "-m", "immediate", "-w", check=False)
        subprocess.run(["rm", "-rf", self.pgdata, self.sockdir], check=True)
        subprocess.run(["install", "-d", "-o", "postgres", "-g", "postgres", self.sockdir], check=True)
        as_postgres([str(self.tree.bin / "initdb"), "-D", self.pgdata, "-A", "trust", "-U", "postgres", "--no-sync"],
                    check=True, stdout=subprocess.DEVNULL)
        lines = [f"port = {self.port}", "listen_addresses = ''", f"unix_socket_directories = '{self.sockdir}'",
                 "max_connections = 50", "fsync = off", "log_line_prefix = '%m [%p] %e '", *self.conf]
        as_postgres(["tee", "-a", f"{self.pgdata}/postgresql.conf"], input="\n".join(lines) + "\n", text=True,
                    check=True, stdout=subprocess.DEVNULL)

    def start(self):
        self.running = True  # before the call: a start interrupted half-way is still stopped on exit
        self._pg_ctl("start", "-l", str(self.logfile), "-w", "-t", "120")

    def stop(self):
        if os.path.exists(f"{self.pgdata}/postmaster.pid"):
            self._pg_ctl("stop", "-m", "fast", "-w", "-t", "120", check=False)
        self.running = False

    def connect(self, dbname="postgres", autocommit=True, **kw):
        return psycopg.connect(host=self.sockdir, port=self.port, user="postgres", dbname=dbname,
                               autocommit=autocommit, connect_timeout=10,
                               options="-c statement_timeout=60000", **kw)

    def log_size(self):
        try:
            return self.logfile.stat().st_size
        except OSError:
            return 0

    def log_since(self, offset=0):
        try:
            with open(self.logfile, "rb") as f:
                f.seek(offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def log_tail(self, n=20):
        return "\n".join(self.log_since().splitlines()[-n:])
