#!/usr/bin/env python3
"""Vendors a Go module's dependencies from Debian's Go sources (/usr/share/gocode, the golang-*-dev
packages), so that `go build` and `go test` work offline, in module mode, with no module proxy: Go uses
vendor/ by itself when it exists (go.mod says go 1.14 or later).

    python3 clients/go/mkvendor.py                      clients/go/vendor/ (run by clients/go/install-deps)
    python3 clients/go/mkvendor.py --module DIR         DIR/vendor/ for a module of yours that imports idem
    python3 clients/go/mkvendor.py --module DIR --check  only say whether DIR/go.mod lacks requirements
    --gocode SRC (or a last positional argument) reads Debian's sources elsewhere than /usr/share/gocode/src

The packages vendored are the ones the module imports (its tests' imports included) and their
dependencies, found by `go list -deps` in GOPATH mode over Debian's sources. For a module other than
clients/go, the idem package itself is vendored too, from this directory (or from the directory that
DIR/go.mod already replaces it with). Before vendoring, the requirements DIR/go.mod lacks are added to
it with `go mod edit`: `require idempotency/clients/go/idem v<Version>` with
`replace idempotency/clients/go/idem => <this directory>` (relative when DIR is inside this repository),
and the modules of pgx & co. at the versions of clients/go/go.mod, which are Debian's. vendor/modules.txt
is written as `go mod vendor` would: every requirement of go.mod, its packages, its replacement.
vendor/ is generated, never committed. Rerun after changing the imports.
"""
import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent      # clients/go: the idem module
REPO = HERE.parent.parent
IDEM_MODULE = "idempotency/clients/go/idem"


def go_env(**extra):
    env = dict(os.environ, GOFLAGS="", GOPROXY="off", GOTOOLCHAIN="local")
    env.update(extra)
    return env


def run(cmd, cwd, env, what):
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"mkvendor: {what} failed ({' '.join(cmd)} in {cwd}):\n{out.stderr.strip()}")
    return out.stdout


def read_gomod(moddir):
    """go.mod as `go mod edit -json` gives it: Module.Path, Go, Require[], Replace[]."""
    if not (moddir / "go.mod").is_file():
        sys.exit(f"mkvendor: no go.mod in {moddir}: run `go mod init <module path>` there first")
    return json.loads(run(["go", "mod", "edit", "-json"], moddir, go_env(), "reading go.mod"))


def is_dir_path(p):
    return p.startswith(("./", "../", "/")) or p in (".", "..")


def idem_version():
    m = re.search(r'^const Version = "([^"]+)"', (HERE / "idem.go").read_text(), re.M)
    return "v" + m.group(1)


def go_version_of(module_dir):
    gomod = module_dir / "go.mod"
    if gomod.is_file():
        m = re.search(r"^go (\d+\.\d+)", gomod.read_text(), re.M)
        if m:
            return m.group(1)
    return None


def copy_go_tree(src, dst):
    """The .go files (tests excepted) of a module's package tree, for go list in GOPATH mode."""
    for d, dirs, files in os.walk(src):
        rel = pathlib.Path(d).relative_to(src)
        dirs[:] = [x for x in dirs if x not in ("vendor", "testdata") and not x.startswith((".", "_"))
                   and not (pathlib.Path(d, x) / "go.mod").exists()]
        for f in files:
            if f.endswith(".go") and not f.endswith("_test.go"):
                (dst / rel).mkdir(parents=True, exist_ok=True)
                shutil.copy2(pathlib.Path(d, f), dst / rel / f)


def debian_hint(src, pkg):
    """For an error message: the module root and Debian package of a package of Debian's sources."""
    d = src / pkg
    while d != src and not (d / "go.mod").is_file():
        d = d.parent
    module = str(d.relative_to(src)) if d != src else pkg
    deb = subprocess.run(["dpkg", "-S", str(src / module)], capture_output=True, text=True).stdout.split(":")[0]
    ver = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", deb], capture_output=True,
                         text=True).stdout if deb else ""
    return module, deb, ver


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--module", default=str(HERE), help="the module to vendor for (default clients/go)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if go.mod lacks requirements")
    ap.add_argument("--gocode", default=None, help="Debian's Go sources (default /usr/share/gocode/src)")
    ap.add_argument("gocode_pos", nargs="?", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    src = pathlib.Path(args.gocode or args.gocode_pos or "/usr/share/gocode/src")
    target = pathlib.Path(args.module).resolve()
    mod = read_gomod(target)
    own = mod["Module"]["Path"]

    # Modules whose sources are a directory: the target's directory replacements, and idem for a consumer.
    local = {}  # module path -> directory
    for r in mod.get("Replace") or []:
        if r["Old"].get("Version"):
            sys.exit(f"mkvendor: replace {r['Old']['Path']} {r['Old']['Version']}: only whole-module replacements are supported")
        if not is_dir_path(r["New"]["Path"]):
            sys.exit(f"mkvendor: replace {r['Old']['Path']} => {r['New']['Path']}: only replacements by a directory are supported offline")
        local[r["Old"]["Path"]] = (target / r["New"]["Path"]).resolve()
    add_replace = None
    if own != IDEM_MODULE and IDEM_MODULE not in local:
        local[IDEM_MODULE] = HERE
        if target == REPO or REPO in target.parents:
            add_replace = os.path.relpath(HERE, target)
            if not add_replace.startswith("."):
                add_replace = "./" + add_replace
        else:
            add_replace = str(HERE)

    with tempfile.TemporaryDirectory(prefix="idem-mkvendor-") as tmp:
        gopath = pathlib.Path(tmp)
        for m, d in local.items():
            copy_go_tree(d, gopath / "src" / m)
        env = go_env(GO111MODULE="off", GOPATH=f"{gopath}:{src.parent}")
        # what the module's packages import, tests included (GOPATH mode reads the import lines only)
        listed = run(["go", "list", "-e", "-f",
                      '{{join .Imports "\\n"}}\n{{join .TestImports "\\n"}}\n{{join .XTestImports "\\n"}}', "./..."],
                     target, env, "listing the module's imports")
        roots = sorted({p for p in listed.split() if p != "C" and p != own and not p.startswith(own + "/")})
        packages = []
        if roots:
            out = subprocess.run(["go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", *roots],
                                 env=env, cwd="/", capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"mkvendor: go list over {src} failed: a package the module imports is not in Debian's "
                         f"sources (pgx and uuid come with clients/go/install-deps; install the golang-*-dev package "
                         f"of any other):\n{out.stderr}")
            packages = sorted(p for p in out.stdout.split() if p)

    # which module provides each package: the target's requirements, else the ones clients/go uses
    required = {r["Path"]: r["Version"] for r in mod.get("Require") or []}
    known = {r["Path"]: r["Version"] for r in read_gomod(HERE).get("Require") or []}
    known[IDEM_MODULE] = idem_version()
    additions, unknown = {}, []
    for pkg in packages:
        owners = [m for m in list(required) + list(local) + list(known) if pkg == m or pkg.startswith(m + "/")]
        if not owners:
            unknown.append(pkg)
            continue
        m = max(owners, key=len)
        if m not in required and m not in additions:
            additions[m] = known.get(m) or required.get(m)
            if additions[m] is None:
                unknown.append(pkg)
                del additions[m]
    if unknown:
        lines = []
        for pkg in unknown:
            module, deb, ver = debian_hint(src, pkg)
            lines.append(f"  {pkg}: module {module}" + (f" (Debian's {deb} {ver})" if deb else ""))
        sys.exit("mkvendor: packages of modules unknown to " + str(target / "go.mod") +
                 ": add `require <module> <version>` for them (the version of Debian's package):\n" + "\n".join(lines))

    edits = [f"-require={m}@{v}" for m, v in additions.items()]
    if add_replace:
        edits.append(f"-replace={IDEM_MODULE}={add_replace}")
    if args.check:
        if edits:
            print(f"mkvendor: {target / 'go.mod'} lacks: " + " ".join(e.split("=", 1)[1] for e in edits))
            sys.exit(1)
        print(f"mkvendor: {target / 'go.mod'} lists every module it needs ({len(packages)} packages)")
        return
    if edits:
        run(["go", "mod", "edit", *edits], target, go_env(), "adding requirements to go.mod")
        added = [f"require {m} {v}" for m, v in additions.items()]
        if add_replace:
            added.append(f"replace {IDEM_MODULE} => {add_replace}")
        print(f"mkvendor: added to {target / 'go.mod'}: " + "; ".join(added))
        mod = read_gomod(target)

    replaced = {r["Old"]["Path"]: r["New"]["Path"] for r in mod.get("Replace") or []}
    by_module = {r["Path"]: [] for r in mod.get("Require") or []}
    for pkg in packages:
        by_module[max((m for m in by_module if pkg == m or pkg.startswith(m + "/")), key=len)].append(pkg)

    vendor = target / "vendor"
    tmpv = target / "vendor.tmp"
    shutil.rmtree(tmpv, ignore_errors=True)
    lines = []
    for r in mod.get("Require") or []:
        module, version = r["Path"], r["Version"]
        moddir = local.get(module, src / module)
        lines.append(f"# {module} {version}" + (f" => {replaced[module]}" if module in replaced else ""))
        gov = go_version_of(moddir)
        lines.append(f"## explicit; go {gov}" if gov else "## explicit")
        for pkg in by_module[module]:
            lines.append(pkg)
            pdir = moddir / pkg[len(module) + 1:] if pkg != module else moddir
            dst = tmpv / pkg
            dst.mkdir(parents=True, exist_ok=True)
            for f in pdir.iterdir():
                # the package's own files (sources, embedded data), not its tests, subpackages or go.mod;
                # of a local module (idem), its sources only (not its README, scripts or tests)
                if (f.is_file() and not f.name.endswith("_test.go") and f.name not in ("go.mod", "go.sum")
                        and (module not in local or f.suffix in (".go", ".s", ".c", ".h"))):
                    shutil.copy2(f, dst / f.name)
        for lic in ("LICENSE", "LICENSE.txt", "COPYING"):
            if (moddir / lic).is_file():
                (tmpv / module).mkdir(parents=True, exist_ok=True)
                shutil.copy2(moddir / lic, tmpv / module / lic)
    # whole-module replacements are also recorded on lines of their own, as go mod vendor does
    for old, new in replaced.items():
        lines.append(f"# {old} => {new}")
    tmpv.mkdir(exist_ok=True)
    (tmpv / "modules.txt").write_text("\n".join(lines) + "\n")
    shutil.rmtree(vendor, ignore_errors=True)
    tmpv.rename(vendor)
    print(f"mkvendor: {vendor}: {len(packages)} packages of {len(by_module)} modules from {src}"
          + (f" and {', '.join(sorted(local))}" if local else ""))


if __name__ == "__main__":
    main()
