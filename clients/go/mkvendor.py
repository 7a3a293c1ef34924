#!/usr/bin/env python3
"""Builds clients/go/vendor/ from Debian's Go sources (/usr/share/gocode, the golang-*-dev packages), so
that `go build` and `go test` work offline, in module mode, with no module proxy: Go uses vendor/ by
itself when it exists (go.mod says go 1.19). The modules and versions are go.mod's; the packages are the
ones the module imports, found by `go list -deps` over Debian's GOPATH. vendor/ is generated, never
committed (.gitignore). Run by clients/go/install-deps; rerun it after changing the imports.

    python3 clients/go/mkvendor.py [GOCODE_SRC]     (default /usr/share/gocode/src)
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
SRC = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "/usr/share/gocode/src")
# What the module imports from outside the standard library, tests included.
ROOTS = ["github.com/jackc/pgx/v4", "github.com/jackc/pgx/v4/pgxpool", "github.com/jackc/pgconn",
         "github.com/google/uuid"]


def requirements():
    """(module, version) pairs of go.mod's require blocks, in order."""
    text = (HERE / "go.mod").read_text()
    reqs = []
    for block in re.findall(r"require \((.*?)\)", text, re.S):
        for line in block.splitlines():
            fields = line.split("//")[0].split()
            if len(fields) == 2:
                reqs.append((fields[0], fields[1]))
    return reqs


def go_version_of(module_dir):
    gomod = module_dir / "go.mod"
    if gomod.exists():
        m = re.search(r"^go (\d+\.\d+)", gomod.read_text(), re.M)
        if m:
            return m.group(1)
    return None


def main():
    env = dict(os.environ, GO111MODULE="off", GOPATH=str(SRC.parent), GOFLAGS="")
    out = subprocess.run(["go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", *ROOTS],
                         env=env, cwd="/", capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"go list over {SRC} failed (are Debian's golang-github-jackc-pgx-v4-dev and "
                 f"golang-github-google-uuid-dev installed?):\n{out.stderr}")
    packages = sorted(p for p in out.stdout.split() if p)
    reqs = requirements()
    by_module = {m: [] for m, _ in reqs}
    for pkg in packages:
        owners = [m for m, _ in reqs if pkg == m or pkg.startswith(m + "/")]
        if not owners:
            sys.exit(f"package {pkg} belongs to no module of go.mod: add its module to go.mod's require")
        by_module[max(owners, key=len)].append(pkg)

    vendor = HERE / "vendor"
    tmp = HERE / "vendor.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    lines = []
    for module, version in reqs:
        pkgs = by_module[module]
        lines.append(f"# {module} {version}")
        gov = go_version_of(SRC / module)
        lines.append(f"## explicit; go {gov}" if gov else "## explicit")
        for pkg in pkgs:
            lines.append(pkg)
            src, dst = SRC / pkg, tmp / pkg
            dst.mkdir(parents=True, exist_ok=True)
            for f in src.iterdir():
                # the package's own files (sources, embedded data), not its tests or subpackages
                if f.is_file() and not f.name.endswith("_test.go"):
                    shutil.copy2(f, dst / f.name)
        for lic in ("LICENSE", "LICENSE.txt", "COPYING"):
            if (SRC / module / lic).is_file():
                (tmp / module).mkdir(parents=True, exist_ok=True)
                shutil.copy2(SRC / module / lic, tmp / module / lic)
    (tmp / "modules.txt").write_text("\n".join(lines) + "\n")
    shutil.rmtree(vendor, ignore_errors=True)
    tmp.rename(vendor)
    print(f"clients/go/vendor: {len(packages)} packages of {len(reqs)} modules from {SRC}")


if __name__ == "__main__":
    main()
