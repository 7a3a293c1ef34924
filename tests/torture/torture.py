"""Entry point of the torture suites; run it through tests/torture/run.

Six suites, each against a cluster of its own, each printing its figures and failing on any violation:
  1 torture     concurrency torture (workload.py, suite_concurrency.py)
  2 crash       kill -9 of backends and of the maintenance launcher, immediate stops (suite_crash.py)
  3 badinput    table-driven hostile calls to every public function (suite_badinput.py)
  4 privileges  consumer role, no role, malicious search_path (suite_privileges.py)
  5 dump        pg_dump / pg_restore into a fresh database (suite_dump.py)
  6 fuzz        random calls with random arguments for a bounded time (suite_fuzz.py)
The last line is `torture: N passed, N failed`.
"""
import argparse
import os
import random
import signal
import sys
import time
import traceback

import harness
import suite_badinput
import suite_concurrency
import suite_crash
import suite_dump
import suite_fuzz
import suite_privileges

SUITES = (
    ("torture", "1. concurrency torture", suite_concurrency),
    ("crash", "2. crash and restart", suite_crash),
    ("badinput", "3. bad input", suite_badinput),
    ("privileges", "4. privileges", suite_privileges),
    ("dump", "5. dump and restore", suite_dump),
    ("fuzz", "6. SQL fuzzing", suite_fuzz),
)

PROFILES = {
    # CI: the whole run in about 4-5 minutes on 2 cores.
    "quick": dict(consumers=8, messages=1000, lease_ms=300, slow_permille=80, crash_consumers=8, crash_messages=3000,
                  crash_cycles=8, fuzz_seconds=40, fuzz_sessions=4),
    # The full sizes of the issue.
    "long": dict(consumers=16, messages=20000, lease_ms=300, slow_permille=30, crash_consumers=16, crash_messages=20000,
                 crash_cycles=16, fuzz_seconds=60, fuzz_sessions=6),
}


def parse():
    p = argparse.ArgumentParser(prog="tests/torture/run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_const", dest="profile", const="quick",
                      help="short version for CI (default)")
    size.add_argument("--long", action="store_const", dest="profile", const="long",
                      help="full sizes: 16 consumers, 20,000 messages, 60 s fuzzing, 16 crash cycles")
    p.add_argument("--only", help="comma-separated suites to run: " + ",".join(s[0] for s in SUITES))
    p.add_argument("--seed", type=int, help="random seed (default: random, printed)")
    # Self-test of the checks: consumers that break the rules on purpose must make suite 1 fail.
    p.add_argument("--sabotage", choices=("double-apply", "offset-ahead", "ignore-fencing"), help=argparse.SUPPRESS)
    p.add_argument("--system-install", action="store_true",
                   help="run the clusters from the system installation instead of a snapshot")
    for k in PROFILES["quick"]:
        p.add_argument("--" + k.replace("_", "-"), type=int, dest=k, help=argparse.SUPPRESS)
    a = p.parse_args()
    a.profile = a.profile or "quick"
    for k, v in PROFILES[a.profile].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(1, 10**9)
    return a


def main():
    opts = parse()
    wanted = [s for s in SUITES if not opts.only or s[0] in opts.only.split(",")]

    def on_signal(signum, _frame):
        harness.stop_all_clusters()
        print(f"torture: interrupted by signal {signum}", flush=True)
        os._exit(130)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    install = harness.Install(snapshot=not opts.system_install)
    install.prepare()
    print(f"torture: profile {opts.profile}, seed {opts.seed}, server from {install.describe()}", flush=True)
    t_all = time.monotonic()
    results = []
    try:
        for key, title, module in wanted:
            print(f"\n=== suite {title} ===", flush=True)
            result = harness.Result(key)
            t0 = time.monotonic()
            try:
                module.run(install, opts, result)
            except Exception as e:  # noqa: BLE001 - a suite that breaks is a failed suite
                result.error = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
            result.seconds = time.monotonic() - t0
            report(result)
            results.append(result)
    finally:
        harness.stop_all_clusters()
    print(f"\ntorture: seed {opts.seed}, {time.monotonic() - t_all:.0f}s in all", flush=True)
    if install.snapshot and install.system_library_changed():
        print("torture: note: the system's idempotency.so was replaced during the run (a concurrent install); "
              "the clusters ran on the snapshot taken at the start", flush=True)
    passed = sum(r.passed for r in results)
    print(f"torture: {passed} passed, {len(results) - passed} failed", flush=True)
    return 0 if passed == len(results) else 1


def report(r):
    print(f"--- {r.name}: figures", flush=True)
    for k, v in r.figures.items():
        print(f"    {k}: {v}")
    for n in r.notes:
        print(f"    note: {n}")
    for v in r.violations[:60]:
        print(f"    VIOLATION: {v}")
    if len(r.violations) > 60:
        print(f"    ... {len(r.violations) - 60} more violations")
    if r.error:
        print(f"    ERROR: {r.error}")
    verdict = "PASS" if r.passed else "FAIL"
    print(f"--- {r.name}: {verdict} ({len(r.violations)} violations, {r.seconds:.0f}s)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
