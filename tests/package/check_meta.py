#!/usr/bin/env python3
"""META.json (PGXN) agrees with the rest of the repository.

PGXN's own validator (pgxn_meta, run by tests/package/run) checks META.json against the meta spec 1.0.0;
this checks what the spec cannot know: the distribution's version is Cargo.toml's (the extension's
default_version is @CARGO_VERSION@), the file it names is the released schema of that version, the license
and the abstract are Cargo.toml's, and the PostgreSQL it requires is the majors the extension builds for.
Prints one line per check; exits 1 when one fails.
"""
import json
import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXT = "idempotency"


def main():
    meta = json.loads((ROOT / "META.json").read_text())
    cargo = tomllib.loads((ROOT / "Cargo.toml").read_text())["package"]
    control = (ROOT / f"{EXT}.control").read_text()
    lib_sh = (ROOT / "scripts" / "lib.sh").read_text()
    version = cargo["version"]
    provided = meta.get("provides", {}).get(EXT, {})
    majors = [int(m) for m in re.search(r"^SUPPORTED_MAJORS=\(([0-9 ]+)\)", lib_sh, re.M).group(1).split()]
    wanted_pg = f">= {min(majors)}.0.0, < {max(majors) + 1}.0.0"

    checks = [
        (f"META.json version is Cargo.toml's ({version})", meta.get("version") == version,
         meta.get("version")),
        (f"META.json provides {EXT} {version}", provided.get("version") == version, provided.get("version")),
        ("the control file's default_version is Cargo.toml's (@CARGO_VERSION@)",
         re.search(r"^default_version\s*=\s*'@CARGO_VERSION@'", control, re.M) is not None, None),
        (f"META.json's file is sql/released/{EXT}--{version}.sql and exists",
         provided.get("file") == f"sql/released/{EXT}--{version}.sql" and (ROOT / provided["file"]).is_file(),
         provided.get("file")),
        ("META.json's docfile exists", (ROOT / provided.get("docfile", "-")).is_file(), provided.get("docfile")),
        ("META.json's abstract is Cargo.toml's description", meta.get("abstract") == cargo["description"],
         meta.get("abstract")),
        ("META.json's license is Cargo.toml's (PostgreSQL)",
         meta.get("license") == "postgresql" and cargo["license"] == "PostgreSQL", meta.get("license")),
        (f"META.json requires PostgreSQL {wanted_pg} (scripts/lib.sh SUPPORTED_MAJORS)",
         meta.get("prereqs", {}).get("runtime", {}).get("requires", {}).get("PostgreSQL") == wanted_pg,
         meta.get("prereqs")),
        ("META.json's meta-spec is 1.0.0", meta.get("meta-spec", {}).get("version") == "1.0.0",
         meta.get("meta-spec")),
    ]
    failed = 0
    for name, ok, found in checks:
        if ok:
            print(f"ok     {name}")
        else:
            failed += 1
            print(f"FAILED {name} (found: {found!r})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
