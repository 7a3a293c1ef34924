#!/usr/bin/env python3
"""Writes src/idempotency_client/_sync.py (the synchronous helpers) from _async.py (the asyncio ones, the source)
with unasync, so that the two cannot drift:

    python clients/python/tools/gen_sync.py           # (re)write _sync.py
    python clients/python/tools/gen_sync.py --check   # exit 1 when _sync.py differs from what it generates

unasync works on tokens: it drops ``async`` / ``await``, turns ``__aenter__`` / ``__aexit__`` into
``__enter__`` / ``__exit__`` (and the like), and renames the names in REPLACEMENTS below; comments and docstrings
are copied as they are. What is not a rename (asyncio.sleep and the heartbeat task against time.sleep and the
heartbeat thread) is in the hand-written _async_backend.py / _sync_backend.py, whose names the two forms share.
Needs unasync (clients/python/install-deps installs the version pinned in pyproject.toml's dev extra).
"""
import argparse
import difflib
import pathlib
import shutil
import sys
import tempfile

import unasync

PKG = pathlib.Path(__file__).resolve().parents[1] / "src" / "idempotency_client"
SOURCE = PKG / "_async.py"
TARGET = PKG / "_sync.py"

# Names unasync's own table does not cover, or would get wrong (it renames AsyncFoo to SyncFoo).
REPLACEMENTS = {
    "AsyncConnection": "Connection",  # psycopg.AsyncConnection -> psycopg.Connection (.connect: psycopg.connect)
    "_async_backend": "_sync_backend",  # sleep, Heartbeats, HEARTBEAT_KEEPS: the thread forms
}

HEADER = """\
# GENERATED FILE, DO NOT EDIT: written by clients/python/tools/gen_sync.py (unasync) from _async.py, the source
# of the synchronous and the asyncio helpers. Edit _async.py (or _sync_backend.py, for what only the synchronous
# form has), then run clients/python/tools/gen_sync.py; clients/python/test fails while this file is stale.
"""


def generate() -> str:
    """The text of _sync.py: HEADER, then _async.py through unasync (which reads and writes files only)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = pathlib.Path(tmp, "_async", SOURCE.name)
        src.parent.mkdir()
        shutil.copyfile(SOURCE, src)
        rule = unasync.Rule(fromdir="/_async/", todir="/_sync/", additional_replacements=REPLACEMENTS)
        unasync.unasync_files([str(src)], [rule])
        body = pathlib.Path(tmp, "_sync", SOURCE.name).read_text(encoding="utf-8")
    return HEADER + body


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when _sync.py differs from what is generated")
    args = ap.parse_args()
    text = generate()
    if args.check:
        current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
        if current == text:
            print(f"gen_sync: {TARGET.name} is what {SOURCE.name} generates (unasync {unasync.__version__})")
            return 0
        diff = list(difflib.unified_diff(current.splitlines(keepends=True), text.splitlines(keepends=True),
                                         f"{TARGET.name} (committed)", f"{TARGET.name} (generated)"))
        sys.stderr.writelines(diff[:200])
        if len(diff) > 200:
            sys.stderr.write(f"... ({len(diff) - 200} more diff lines)\n")
        print(f"gen_sync: {TARGET} differs from what {SOURCE.name} generates (unasync {unasync.__version__}): "
              f"edit {SOURCE.name}, not {TARGET.name}, and run {pathlib.Path(__file__).resolve()}",
              file=sys.stderr)
        return 1
    if TARGET.exists() and TARGET.read_text(encoding="utf-8") == text:
        print(f"gen_sync: {TARGET} unchanged")
    else:
        TARGET.write_text(text, encoding="utf-8")
        print(f"gen_sync: wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
