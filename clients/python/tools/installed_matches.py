#!/usr/bin/env python3
"""Exit 0 when the idempotency_client installed in this interpreter is the one in clients/python/src
(same version, same source files), 1 otherwise (and says why). Used by install-deps and test."""
import importlib.metadata
import pathlib
import sys

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "idempotency_client"


def main():
    try:
        import idempotency_client
    except ImportError as e:
        print(f"idempotency_client is not installed ({e})")
        return 1
    installed = pathlib.Path(idempotency_client.__file__).parent
    if installed.resolve() == SRC.resolve():
        print(f"idempotency_client is imported from the source tree {SRC} (editable or PYTHONPATH)")
        return 0
    wanted = {p.relative_to(SRC): p.read_bytes() for p in SRC.rglob("*.py")}
    have = {p.relative_to(installed): p.read_bytes() for p in installed.rglob("*.py")}
    if wanted != have:
        differ = sorted(str(k) for k in set(wanted) | set(have) if wanted.get(k) != have.get(k))
        print(f"installed idempotency_client ({installed}) differs from {SRC}: {', '.join(differ)}")
        return 1
    print(f"idempotency-client {importlib.metadata.version('idempotency-client')} installed, same as {SRC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
