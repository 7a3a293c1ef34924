"""The benchmark's report: ratios against each group's reference row, the targets of issue 5, and the
results as a table on stdout and as benches/results/NAME.md and NAME.json (benches/README.md, "How to
read the table").
"""
import json
import os

from runner import BENCH, log
from workloads import GROUP_ORDER, PG_DURABILITY, REDIS_CONFIGS, REFERENCE, WORKLOADS, human


def ratios(bench):
    """Each row's throughput over its group's reference row (same durability class, clients, key mix)."""
    index = {}
    for r in bench.rows:
        index[(r["id"], r["class"], r["clients"], r["keys"])] = r
    for r in bench.rows:
        ref_id = REFERENCE.get(r["group"])
        ref = index.get((ref_id, r["class"], r["clients"], r["keys"])) if ref_id else None
        r["reference"] = ref_id if ref else None
        r["ratio"] = r["throughput"] / ref["throughput"] if ref else None


def targets(bench):
    """The targets of issue 5, each computed from the rows and met or missed."""
    idx = {(r["id"], r["class"], r["clients"], r["keys"]): r for r in bench.rows}
    top = max(bench.args.clients)
    out = []

    def ratio(a, b, cls, clients=top, metric="throughput"):
        ra, rb = idx.get((a, cls, clients, "new")), idx.get((b, cls, clients, "new"))
        if not ra or not rb:
            return None
        return ra[metric] / rb[metric]

    def add(name, goal, value, ok_if, how):
        met = None if value is None else ok_if(value)
        out.append({"target": name, "goal": goal, "measured": value, "met": met, "how": how})

    for cls in ("on", "off"):
        lab = PG_DURABILITY[cls]
        for n in (100, 1000):
            add(f"idem_once_batch({n}) >= 0.9x bare batch insert ({lab})", ">= 0.90", ratio(f"bo_{n}", f"bf_{n}", cls),
                lambda v: v >= 0.9, f"keys/s bo_{n} / bf_{n}, new keys, {top} clients")
            add(f"claim + complete batches({n}) >= 1.0x hand-written batch ({lab})", ">= 1.00",
                ratio(f"bc_{n}", f"bh_{n}", cls), lambda v: v >= 1.0, f"keys/s bc_{n} / bh_{n}, new keys, {top} clients")
        add(f"idem_once alone >= 0.9x floor ({lab})", ">= 0.90", ratio("w2a", "w1", cls), lambda v: v >= 0.9,
            f"throughput w2a / w1, new keys, {top} clients")
        add(f"idem_once + business row >= 1.25x 5a + business row ({lab})", ">= 1.25", ratio("w2b", "w5a_biz", cls),
            lambda v: v >= 1.25, f"throughput w2b / w5a_biz, new keys, {top} clients")
        add(f"claim + complete (1 tx) >= 1.0x 5a ({lab})", ">= 1.00", ratio("w3", "w5a", cls), lambda v: v >= 1.0,
            f"throughput w3 / w5a, new keys, {top} clients")
        add(f"claim + complete (1 tx) >= 1.2x 5b ({lab})", ">= 1.20", ratio("w3", "w5b", cls), lambda v: v >= 1.2,
            f"throughput w3 / w5b, new keys, {top} clients")
        add(f"idem_once_batch(1000) keys/s >= pipelined redis SET NX ({lab} vs {REDIS_CONFIGS[cls][0]})", ">= 1.00",
            ratio("b_once_1000", "r_nx_p16", cls), lambda v: v >= 1.0, f"keys/s, new keys, {top} clients, pipeline 16")
    for cls in ("on", "off"):
        add(f"statistics on: idem_once within 2% of statistics off ({PG_DURABILITY[cls]})", ">= 0.98",
            ratio("st_on", "st_off", cls), lambda v: v >= 0.98, f"throughput st_on / st_off, new keys, {top} clients")
    for cls in ("on", "off"):
        for clients in bench.args.clients:
            add(f"claim latency at {human(bench.args.growth_sizes[-1])} retained keys within 1.2x of empty ({PG_DURABILITY[cls]}, {clients} clients)",
                "<= 1.20", ratio("g_2", "g_0", cls, clients, "p50_ms"), lambda v: v <= 1.2, "p50 latency g_2 / g_0")
    # Issue 12: claims cost the same at any retention.
    for prefix, what in (("wk", "a week"), ("mo", "30 days")):
        add(f"{what} of keys: idem_once >= 0.9x floor (pg sync=on)", ">= 0.90", ratio(f"{prefix}_w2a", f"{prefix}_w1", "on"),
            lambda v: v >= 0.9, f"throughput {prefix}_w2a / {prefix}_w1, {human(bench.args.retained_keys)} keys, {top} clients")
        add(f"{what} of keys: claim + complete >= 1.0x 5a (pg sync=on)", ">= 1.00", ratio(f"{prefix}_w3", f"{prefix}_w5a", "on"),
            lambda v: v >= 1.0, f"throughput {prefix}_w3 / {prefix}_w5a, {human(bench.args.retained_keys)} keys, {top} clients")
    add("a week of keys: idem_once_batch(100) >= 0.9x bare batch insert (pg sync=on)", ">= 0.90",
        ratio("wk_bo_100", "wk_bf_100", "on"), lambda v: v >= 0.9, f"keys/s wk_bo_100 / wk_bf_100, {top} clients")
    add("a week of keys: claim + complete batches (100) >= 1.0x hand-written (pg sync=on)", ">= 1.00",
        ratio("wk_bc_100", "wk_bh_100", "on"), lambda v: v >= 1.0, f"keys/s wk_bc_100 / wk_bh_100, {top} clients")
    # Issue 28: the SQL edition against the same hand-written SQL, fresh and at a week of keys.
    for cls in bench.args.sync:
        lab = PG_DURABILITY[cls]
        add(f"SQL edition: claim + complete (1 tx) >= 0.9x 5a, the hand-written pair ({lab})", ">= 0.90",
            ratio("e_w3", "w5a", cls), lambda v: v >= 0.9, f"throughput e_w3 / w5a, new keys, {top} clients")
        add(f"SQL edition: idem_once + business row >= 1.0x 5a + business row ({lab})", ">= 1.00",
            ratio("e_w2b", "w5a_biz", cls), lambda v: v >= 1.0, f"throughput e_w2b / w5a_biz, new keys, {top} clients")
        for n in (100, 1000):
            add(f"SQL edition: idem_once_batch({n}) >= 0.8x bare batch insert ({lab})", ">= 0.80",
                ratio(f"e_bo_{n}", f"bf_{n}", cls), lambda v: v >= 0.8, f"keys/s e_bo_{n} / bf_{n}, new keys, {top} clients")
    # Issue 32: the SQL edition within 10% of the SQL it replaces, fresh and at a week of keys.
    for prefix, what in (("", "fresh"), ("wk_", "a week of keys")):
        add(f"issue 32, {what}: SQL edition claim + complete >= 0.9x the hand-written pair (pg sync=on)", ">= 0.90",
            ratio(f"{prefix}e_w3", f"{prefix}w5a", "on"), lambda v: v >= 0.9, f"throughput {prefix}e_w3 / {prefix}w5a, {top} clients")
        add(f"issue 32, {what}: SQL edition idem_once + business row >= 0.9x 5a + business row (pg sync=on)", ">= 0.90",
            ratio(f"{prefix}e_w2b", f"{prefix}w5a_biz", "on"), lambda v: v >= 0.9, f"throughput {prefix}e_w2b / {prefix}w5a_biz, {top} clients")
        add(f"issue 32, {what}: SQL edition idem_once >= 0.8x the bare insert (pg sync=on)", ">= 0.80",
            ratio(f"{prefix}e_w2a", f"{prefix}w1", "on"), lambda v: v >= 0.8, f"throughput {prefix}e_w2a / {prefix}w1, {top} clients")
        add(f"issue 32, {what}: minimal SECURITY DEFINER pair / hand-written pair (the approach's floor)", "(floor)",
            ratio(f"{prefix}m_w5a", f"{prefix}w5a", "on"), lambda v: True, f"throughput {prefix}m_w5a / {prefix}w5a, {top} clients")
        if not prefix:
            # The floor on the edition's own storage: its writes alone (and without the lease index).
            for wid, ref, label in (("f_w3", "w5a", "the edition's writes alone on its storage, pair"),
                                    ("f2_w3", "w5a", "the same pair without the lease index"),
                                    ("f_w2a", "w1", "the edition's writes alone on its storage, idem_once's insert"),
                                    ("m_w1", "w1", "the bare insert in a minimal SECURITY DEFINER function")):
                add(f"issue 32, {what}: {label} / {ref} (floor)", "(floor)",
                    ratio(wid, ref, "on"), lambda v: True, f"throughput {wid} / {ref}, {top} clients")
        for n in (100, 1000):
            add(f"issue 32, {what}: SQL edition idem_once_batch({n}) >= 0.8x bare batch insert (pg sync=on)", ">= 0.80",
                ratio(f"{prefix}e_bo_{n}", f"{prefix}bf_{n}", "on"), lambda v: v >= 0.8, f"keys/s {prefix}e_bo_{n} / {prefix}bf_{n}, {top} clients")
            add(f"issue 32, {what}: SQL edition claim + complete batches({n}) >= 1.0x hand-written batch (pg sync=on)", ">= 1.00",
                ratio(f"{prefix}e_bc_{n}", f"{prefix}bh_{n}", "on"), lambda v: v >= 1.0, f"keys/s {prefix}e_bc_{n} / {prefix}bh_{n}, {top} clients")
    for wid in ("e_w3", "e_w2b", "e_w2a", "e_bo_100", "e_bo_1000", "e_bc_100", "e_bc_1000"):
        add(f"issue 32: SQL edition {wid} at a week / fresh >= 0.9 (cost flat in retention)", ">= 0.90",
            ratio(f"wk_{wid}", wid, "on"), lambda v: v >= 0.9, f"throughput wk_{wid} / {wid}, {top} clients")
    wk = f"{human(bench.args.retained_keys)} keys, {top} clients"
    add("a week of keys: SQL edition claim + complete >= 0.9x 5a (pg sync=on)", ">= 0.90",
        ratio("wk_e_w3", "wk_w5a", "on"), lambda v: v >= 0.9, f"throughput wk_e_w3 / wk_w5a, {wk}")
    add("a week of keys: SQL edition idem_once + business row >= 1.0x 5a + business row (pg sync=on)", ">= 1.00",
        ratio("wk_e_w2b", "wk_w5a_biz", "on"), lambda v: v >= 1.0, f"throughput wk_e_w2b / wk_w5a_biz, {wk}")
    for n in (100, 1000):
        add(f"a week of keys: SQL edition idem_once_batch({n}) >= 0.8x bare batch insert (pg sync=on)", ">= 0.80",
            ratio(f"wk_e_bo_{n}", f"wk_bf_{n}", "on"), lambda v: v >= 0.8, f"keys/s wk_e_bo_{n} / wk_bf_{n}, {wk}")
    # Issue 29: every call at the floor, fresh and at a week of keys (--only floor29, on each major: --pg).
    for prefix, what in (("", "fresh"), ("wk_", "a week of keys")):
        add(f"{what}: idem_once >= 0.95x the bare insert (pg sync=on)", ">= 0.95", ratio(f"{prefix}w2a", f"{prefix}w1", "on"),
            lambda v: v >= 0.95, f"throughput {prefix}w2a / {prefix}w1, {top} clients")
        add(f"{what}: claim + complete >= 1.05x the hand-written pair 5a (pg sync=on)", ">= 1.05",
            ratio(f"{prefix}w3", f"{prefix}w5a", "on"), lambda v: v >= 1.05, f"throughput {prefix}w3 / {prefix}w5a, {top} clients")
        for n in (100, 1000):
            add(f"{what}: idem_once_batch({n}) >= 0.95x the bare batch insert (pg sync=on)", ">= 0.95",
                ratio(f"{prefix}bo_{n}", f"{prefix}bf_{n}", "on"), lambda v: v >= 0.95,
                f"keys/s {prefix}bo_{n} / {prefix}bf_{n}, {top} clients")
    counts = bench.args.partition_counts
    add(f"{counts[-1]} partitions >= 0.95x the claims/s of {counts[0]}", ">= 0.95",
        ratio(f"p_{len(counts) - 1}", "p_0", "off", 1), lambda v: v >= 0.95, "throughput, 1 client, sync=off")
    drop = next((r for r in bench.retention_rows if r["method"].startswith("drop")), None)
    delete = next((r for r in bench.retention_rows if r["method"].startswith("DELETE ...")), None)
    if drop and delete:
        add("retention: partition drop >= 100x less WAL than DELETE", ">= 100", delete["wal_bytes"] / max(1, drop["wal_bytes"]),
            lambda v: v >= 100, f"WAL bytes of DELETE / of drop, {drop['rows']:,} keys")
    return out


def output(bench, meta, targets):
    """The table, the retention figures and the targets on stdout, and in benches/results/NAME.{md,json}."""
    order = {g: i for i, g in enumerate(GROUP_ORDER)}
    cls_order = {"on": 0, "off": 1}
    wid_order = {w: i for i, w in enumerate(WORKLOADS)}
    rows = [r for r in bench.rows if r["group"] != "inputs"]
    rows.sort(key=lambda r: (cls_order[r["class"]], order[r["group"]], r["clients"], r["keys"] != "new", wid_order[r["id"]]))
    head = ["group", "workload", "keys", "durability", "clients", "throughput", "unit", "p50 ms", "p99 ms", "ratio", "vs"]
    table = []
    for r in rows:
        table.append([r["group"], r["workload"], r["keys"], r["durability"], str(r["clients"]),
                      f"{r['throughput']:,.0f}", r["unit"], f"{r['p50_ms']:.3f}", f"{r['p99_ms']:.3f}",
                      "" if r["ratio"] is None else f"{r['ratio']:.2f}", r["reference"] or ""])
    widths = [max(len(h), *(len(t[i]) for t in table)) if table else len(h) for i, h in enumerate(head)]
    right = {4, 5, 7, 8, 9}

    def fmt(cells):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    print()
    print(fmt(head))
    print("  ".join("-" * w for w in widths))
    prev = None
    for r, t in zip(rows, table):
        if prev is not None and (r["class"], r["group"]) != prev:
            print()
        prev = (r["class"], r["group"])
        print(fmt(t))
    if bench.retention_rows:
        print("\nretention (workload 9), synchronous_commit=on:")
        for r in bench.retention_rows:
            print(f"  {r['method']:50s} {r['seconds']:9.3f} s  WAL {r['wal_bytes']:>14,} B  size {r['size_before']:>13,} -> {r['size_after']:>13,} B")
    print("\ntargets of issue 5:")
    for t in targets:
        v = "n/a" if t["measured"] is None else f"{t['measured']:.3f}"
        verdict = {True: "MET", False: "MISSED", None: "not measured"}[t["met"]]
        print(f"  {verdict:12s} {t['target']}: {v} (goal {t['goal']}; {t['how']})")
    if meta["runs_with_busy_machine"]:
        print(f"\nWARNING: for {meta['runs_with_busy_machine']} rows the median run started while other work kept the machine >25% busy: noisy.")

    os.makedirs(os.path.join(BENCH, "results"), exist_ok=True)
    name = bench.args.name or meta["mode"]
    base = os.path.join(BENCH, "results", name)
    with open(base + ".json.tmp", "w") as f:
        json.dump({"meta": meta, "rows": bench.rows, "retention": bench.retention_rows, "targets": targets}, f, indent=1, default=str)
    os.replace(base + ".json.tmp", base + ".json")
    md = [f"# Benchmark results ({meta['mode']} run)", "",
          f"* command: `{meta['command']}` (every row: median of {meta['rounds']} runs of {meta['duration_s']} s, spread over the benchmark; clients {', '.join(map(str, meta['clients']))})",
          f"* date: {meta['date']}",
          f"* machine: {meta['cpu']}, {meta['memory']} RAM, {meta['virtualization'] or 'bare metal'} VM, Linux {meta['kernel']}",
          f"* {meta['postgres']}",
          "* PostgreSQL settings: " + ", ".join(f"{k}={v}" for k, v in meta["postgres_settings"].items()),
          f"* extension {meta['extension_version']}, git {meta['git_commit']}" + (" (with uncommitted changes in src/ or sql/)" if meta["git_worktree_dirty"] else "") + f", idempotency.so sha256 {meta['extension_so_sha256'][:16]}",
          f"* {meta['redis']}"]
    if meta.get("edition_version"):
        md.append(f"* SQL edition {meta['edition_version']} (scripts/sql-edition, plain script installed by a non-superuser owner) "
                  f"in database {meta['edition_database']} of the same cluster; its rows say \"SQL edition\"")
    for cls, line in meta["redis_command_lines"].items():
        md.append(f"* redis ({REDIS_CONFIGS[cls][0]}): `{line}`")
    if meta["runs_with_busy_machine"]:
        md.append(f"* WARNING: for {meta['runs_with_busy_machine']} rows the median run started while other work kept the machine >25% busy (noisy)")
    md += ["", "| " + " | ".join(head) + " |", "|" + "|".join("---:" if i in right else "---" for i in range(len(head))) + "|"]
    for t in table:
        md.append("| " + " | ".join(c.replace("|", "\\|") for c in t) + " |")
    if bench.retention_rows:
        md += ["", "## Retention (workload 9), synchronous_commit=on", "",
               "| method | keys | time s | WAL bytes | size before | size after |", "|---|---:|---:|---:|---:|---:|"]
        for r in bench.retention_rows:
            md.append(f"| {r['method']} | {r['rows']:,} | {r['seconds']:.3f} | {r['wal_bytes']:,} | {r['size_before']:,} | {r['size_after']:,} |")
    md += ["", "## Targets of issue 5", "", "| target | goal | measured | verdict | how |", "|---|---|---:|---|---|"]
    for t in targets:
        v = "n/a" if t["measured"] is None else f"{t['measured']:.3f}"
        md.append(f"| {t['target']} | {t['goal']} | {v} | {({True: 'met', False: 'MISSED', None: 'not measured'})[t['met']]} | {t['how']} |")
    with open(base + ".md.tmp", "w") as f:
        f.write("\n".join(md) + "\n")
    os.replace(base + ".md.tmp", base + ".md")
    log(f"wrote {base}.md and {base}.json")
