"""Private copies of the installation, and the extension's files: `PrivateTree` and the helpers that copy,
list and digest the extension's files. Part of tests/pgtools.py, which re-exports it.
"""
import hashlib
import pathlib
import shutil
import subprocess
import time

from pgpaths import EXT, pg



def is_ext_file(name):
    return name == f"{EXT}.so" or name == f"{EXT}.control" or (name.startswith(f"{EXT}--") and name.endswith(".sql"))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ext_digest(lib_dir, ext_dir):
    """One digest over the extension's library, control file and scripts in two directories."""
    h = hashlib.sha256()
    for path in [pathlib.Path(lib_dir) / f"{EXT}.so", *sorted(pathlib.Path(ext_dir).glob(f"{EXT}*"))]:
        h.update(path.name.encode())
        h.update(sha256(path).encode())
    return h.hexdigest()


def system_ext_digest():
    """ext_digest of the extension installed into the system (what scripts/build installed)."""
    return ext_digest(pg().pkglibdir, pg().extdir)


def ext_files(source=None):
    """The extension's files in the system installation (what scripts/build installed), or anywhere
    under the directory `source` (e.g. a `cargo pgrx package` output directory)."""
    if source is not None:
        return sorted((p for p in pathlib.Path(source).rglob(f"{EXT}*") if p.is_file() and is_ext_file(p.name)),
                      key=lambda p: p.name)
    lib = pg().pkglibdir / f"{EXT}.so"
    files = [lib] if lib.exists() else []
    files += sorted(p for p in pg().extdir.iterdir() if is_ext_file(p.name))
    return files


def copy_ext_files(dest, source=None):
    """Copies the installed extension files (or those under `source`) into dest, over and over until the
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
    """A copy of the PostgreSQL installation under `root` with idempotency files of our choice.

    PostgreSQL finds its library and share directories relative to its own executable. A tree with copies
    of postgres, initdb and pg_ctl, symlinks to everything else of the installation and the extension files
    we put there therefore runs those files, while the system installation (which `scripts/build` and
    `cargo pgrx test` rewrite in place, crashing every server that has the old library mapped) is never
    touched. `Cluster(..., bindir=tree.bin)` runs a cluster from it.
    """

    EXECUTABLES = ("postgres", "initdb", "pg_ctl")

    def __init__(self, root):
        paths = pg()
        self.root = pathlib.Path(root)
        self.bin = self.root / paths.bindir.relative_to("/")
        self.lib = self.root / paths.pkglibdir.relative_to("/")
        self.share = self.root / paths.sharedir.relative_to("/")
        self.ext = self.share / "extension"

    def build(self):
        """Makes the tree, without any idempotency file."""
        paths = pg()
        if self.root.exists():
            shutil.rmtree(self.root)
        for d in (self.bin, self.lib, self.ext):
            d.mkdir(parents=True)
        # Executables are copied: PostgreSQL resolves symlinks to find its own location.
        for exe in self.EXECUTABLES:
            shutil.copy2(paths.bindir / exe, self.bin / exe)
        for entry in paths.pkglibdir.iterdir():
            if not is_ext_file(entry.name):
                (self.lib / entry.name).symlink_to(entry)
        for entry in paths.sharedir.iterdir():
            if entry.name != "extension":
                (self.share / entry.name).symlink_to(entry)
        for entry in paths.extdir.iterdir():
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

    def digest(self):
        return ext_digest(self.lib, self.ext)
