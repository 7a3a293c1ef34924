"""C sources of the tests built into shared libraries under /tmp, once per content (readable by the postgres
user, which loads them): tests/fakeclock_waits.c (preloaded into a server under libfaketime) and
tests/planpause.c (a module a test session LOADs)."""
import hashlib
import os
import pathlib
import shutil
import subprocess


def shared_library(source, out_dir, prefix, args=()):
    """`source` (a path) built with the C compiler into out_dir/<prefix>-<hash of source and args>.so; its
    path. args: more compiler arguments (include directories, libraries)."""
    source = pathlib.Path(source)
    digest = hashlib.sha256(source.read_bytes() + "\0".join(args).encode()).hexdigest()[:16]
    out = pathlib.Path(out_dir) / f"{prefix}-{digest}.so"
    if out.exists():
        return str(out)
    cc = shutil.which("cc") or shutil.which("clang") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError(f"no C compiler (cc, clang or gcc) to build {source}: scripts/install-deps test")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.parent.chmod(0o755)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    r = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(source), *args],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"building {source} failed: {r.stderr.strip()}")
    tmp.chmod(0o755)
    os.replace(tmp, out)
    return str(out)
