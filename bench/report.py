#!/usr/bin/env python3
"""Bookkeeping for bench/run.sh.

  report.py record FILE key=value ...   append one JSON object to FILE (JSON lines). A value is parsed as
                                        JSON when it can be; `wrk=PATH` reads the WRKJSON line of a wrk output.
  report.py summary DIR [--json]        print the Markdown table (or one JSON object) for a finished run.
"""
import json
import math
import os
import statistics
import sys

MIB = 1024.0


def parse_value(v):
    try:
        return json.loads(v)
    except ValueError:
        return v


def wrk_summary(path):
    with open(path) as f:
        for line in f:
            if line.startswith("WRKJSON "):
                return json.loads(line[len("WRKJSON "):])
    return None


def record(path, pairs):
    obj = {}
    for pair in pairs:
        k, _, v = pair.partition("=")
        obj[k] = wrk_summary(v) if k == "wrk" else parse_value(v)
    with open(path, "a") as f:
        f.write(json.dumps(obj) + "\n")


def load_lines(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def load_json(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def happy_rows(runs):
    """Medians over rounds per (conns, target)."""
    out = []
    keys = []
    for r in runs:
        k = (r["conns"], r["target"])
        if k not in keys:
            keys.append(k)
    order = {"direct": 0, "backstop": 1, "backstop-bearer": 2, "backstop-tls-h2": 3, "backstop-tls-h1": 4}
    keys.sort(key=lambda k: (k[0], order.get(k[1], 9)))
    for conns, target in keys:
        rs = [r for r in runs if r["conns"] == conns and r["target"] == target and r.get("wrk")]
        if not rs:
            continue
        rps = [r["wrk"]["requests"] / (r["wrk"]["duration_us"] / 1e6) for r in rs]
        cpu = []
        for r in rs:
            if r.get("cpu_ticks") is not None and r["wrk"]["requests"]:
                cpu.append(r["cpu_ticks"] * 1e6 / r["hz"] / r["wrk"]["requests"])
        row = {
            "conns": conns,
            "target": target,
            "rounds": len(rs),
            "req_per_s": med(rps),
            "req_per_s_rounds": [round(x) for x in rps],
            "p50_ms": med([r["wrk"]["p50_us"] / 1000 for r in rs]),
            "p99_ms": med([r["wrk"]["p99_us"] / 1000 for r in rs]),
            "non2xx": sum(r["wrk"]["non2xx3xx"] for r in rs),
            "socket_errors": sum(r["wrk"][k] for r in rs for k in ("err_connect", "err_read", "err_write",
                                                                   "err_timeout")),
            "cpu_us_per_req": med(cpu),
            "rss_idle_mib": med([r.get("rss_idle_kb") and r["rss_idle_kb"] / MIB for r in rs]),
            "rss_idle_anon_mib": med([r.get("rss_idle_anon_kb") and r["rss_idle_anon_kb"] / MIB for r in rs]),
            "rss_load_mib": med([r.get("rss_end_kb") and r["rss_end_kb"] / MIB for r in rs]),
            "rss_load_max_mib": max([r["rss_max_kb"] / MIB for r in rs if r.get("rss_max_kb")] or [0]) or None,
            "hwm_mib": max([r["hwm_kb"] / MIB for r in rs if r.get("hwm_kb")] or [0]) or None,
            "origin_cpu_us_per_req": med([r["origin_ticks"] * 1e6 / r["hz"] / r["wrk"]["requests"]
                                          for r in rs if r.get("origin_ticks") is not None
                                          and r["wrk"]["requests"]]),
        }
        out.append(row)
    direct = {r["conns"]: r["req_per_s"] for r in out if r["target"] == "direct"}
    for r in out:
        d = direct.get(r["conns"])
        r["x_direct"] = r["req_per_s"] / d if d else None
    return out


def retry_rows(runs):
    out = []
    for r in runs:
        w = r.get("wrk")
        if not w:
            continue
        attempts = r["stats_after"]["attempts"] - r["stats_before"]["attempts"]
        conns = r["stats_after"]["connections"] - r["stats_before"]["connections"]
        reqs = w["requests"]
        dur_s = w["duration_us"] / 1e6
        # Slack the budget itself allows: min_per_second retries in every 1 s bucket the run touches (the run,
        # plus one for retries that land after wrk stops), and the requests still in flight when wrk stops
        # (counted by Backstop's budget and the origin, not by wrk), each with its 20% retry share.
        buckets = math.ceil(dur_s) + 2
        inflight = r["conns"] * (1 + r["ratio"])
        allowance = (r["min_per_second"] * buckets + inflight) / reqs if reqs else None
        out.append({
            "p": r["p"],
            "requests": reqs,
            "req_per_s": reqs / dur_s if dur_s else None,
            "origin_attempts": attempts,
            "attempts_per_request": attempts / reqs if reqs else None,
            "allowance_per_request": allowance,
            "attempts_limit": 1 + r["ratio"] + allowance if allowance is not None else None,
            "success_rate": 1 - w["non2xx3xx"] / reqs if reqs else None,
            "non2xx": w["non2xx3xx"],
            "socket_errors": sum(w[k] for k in ("err_connect", "err_read", "err_write", "err_timeout")),
            "upstream_connections": conns,
            "budget_exhausted": r.get("budget_exhausted"),
            "p50_ms": w["p50_us"] / 1000,
            "p99_ms": w["p99_us"] / 1000,
        })
    return out


def fmt(v, spec=",.0f", unit=""):
    if v is None:
        return "–"
    return format(v, spec) + unit


def verdict(ok):
    if ok is None:
        return "–"
    return "pass" if ok else "**FAIL**"


def build(d):
    meta = load_json(os.path.join(d, "meta.json")) or {}
    happy = happy_rows(load_lines(os.path.join(d, "happy.jsonl")))
    idle = load_json(os.path.join(d, "idle.json"))
    stream = load_lines(os.path.join(d, "stream.jsonl"))
    retry = retry_rows(load_lines(os.path.join(d, "retry.jsonl")))
    commands = []
    if os.path.exists(os.path.join(d, "commands.txt")):
        with open(os.path.join(d, "commands.txt")) as f:
            commands = [line.rstrip("\n") for line in f if line.strip()]

    checks = []  # (scenario, measure, value text, target text, ok, raw value, raw limit)

    def check(scenario, measure, value, text, target, ok, limit=None):
        checks.append({"scenario": scenario, "measure": measure, "value": value, "text": text,
                       "target": target, "pass": ok, "limit": limit})

    rows = []
    for r in happy:
        name = f"happy c={r['conns']} {r['target']}"
        rows.append((name, "req/s (× direct)",
                     f"{fmt(r['req_per_s'])} ({fmt(r['x_direct'], '.2f')}×)"
                     + (f"; rounds {', '.join(format(x, ',') for x in r['req_per_s_rounds'])}"
                        if r["rounds"] > 1 else ""), "–", "–"))
        errs = f", {r['socket_errors']} socket errors" if r["socket_errors"] else ""
        rows.append((name, "latency p50 / p99", f"{fmt(r['p50_ms'], '.2f')} / {fmt(r['p99_ms'], '.2f')} ms; "
                     f"non-2xx {r['non2xx']}{errs}", "non-2xx 0", verdict(r["non2xx"] == 0)))
        if r["target"] != "direct":
            rows.append((name, "Backstop CPU per request", fmt(r["cpu_us_per_req"], ".1f", " µs"), "–", "–"))
            rows.append((name, "RSS idle → end of load (peak VmHWM)",
                         f"{fmt(r['rss_idle_mib'], '.1f')} → {fmt(r['rss_load_mib'], '.1f')} "
                         f"({fmt(r['hwm_mib'], '.1f')}) MiB", "–", "–"))
    idle_rows = [r for r in happy if r["target"] == "backstop" and r["rss_idle_mib"]]
    if idle_rows:
        r = min(idle_rows, key=lambda r: r["rss_idle_mib"])
        v = r["rss_idle_mib"]
        anon = r.get("rss_idle_anon_mib")
        detail = f" ({fmt(anon, '.1f')} anonymous, {fmt(v - anon, '.1f')} file-backed: binary and libraries)" \
            if anon else ""
        check("idle", "Backstop idle RSS (after start + 1 request)", v, fmt(v, ".1f", " MiB") + detail,
              "≤ 20 MiB", v <= 20, 20)
    if idle:
        v = idle["rss_open_max_kb"] / MIB
        ok_conns = idle["responses_2xx"] == idle["connections"] and idle["still_open_after_hold"] == idle["connections"]
        check("1,000 idle keep-alive conns", "Backstop RSS with all open (max sampled)", v,
              f"{fmt(v, '.1f')} MiB (fresh daemon {fmt(idle['rss_before_kb'] / MIB, '.1f')}; anonymous "
              f"{fmt((idle.get('rss_before_anon_kb') or 0) / MIB, '.1f')} → "
              f"{fmt((idle.get('rss_open_anon_kb') or 0) / MIB, '.1f')}; after close "
              f"{fmt(idle['rss_after_close_kb'] / MIB, '.1f')})", "≤ 64 MiB", v <= 64, 64)
        check("1,000 idle keep-alive conns", "responses 2xx / still open after hold",
              idle["responses_2xx"], f"{idle['responses_2xx']} / {idle['still_open_after_hold']} of "
              f"{idle['connections']} (setup {idle['setup_s']:.2f} s)", "all", ok_conns)
    for s in stream:
        label = "64 MiB response" + (f", client at {s['limit_rate']}/s" if s.get("limit_rate") else "")
        ok_body = s["code"] == 200 and s["size"] == s["expected_size"]
        check(label, "throughput through Backstop", s["speed_Bps"] / (1 << 20),
              f"{fmt(s['speed_Bps'] / (1 << 20), ',.0f')} MiB/s (HTTP {s['code']}, {s['size']:,} bytes)",
              "200, all bytes", ok_body)
        v = s["hwm_kb"] / MIB
        check(label, "Backstop peak RSS (VmHWM, fresh daemon)", v,
              f"{fmt(v, '.1f')} MiB (before {fmt(s['hwm_before_kb'] / MIB, '.1f')})", "≤ 128 MiB", v <= 128, 128)
    for r in retry:
        label = f"retry storm {r['p'] * 100:.0f}% 503"
        extra = (f"; {r['requests']:,} requests at {fmt(r['req_per_s'])} req/s, {r['origin_attempts']:,} attempts, "
                 f"{r['upstream_connections']} upstream conns, budget exhausted {r['budget_exhausted']}")
        if r["p"] >= 1.0:
            check(label, "origin attempts per client request", r["attempts_per_request"],
                  fmt(r["attempts_per_request"], ".3f") + extra,
                  f"≤ 1.2 + {r['allowance_per_request']:.3f} allowance = {r['attempts_limit']:.3f} "
                  "(allowance: min_per_second × seconds + in-flight at the end, per request)",
                  r["attempts_per_request"] <= r["attempts_limit"], r["attempts_limit"])
            check(label, "client success rate", r["success_rate"], fmt(r["success_rate"] * 100, ".1f", "%"),
                  "– (0% expected)", None)
        else:
            check(label, "origin attempts per client request", r["attempts_per_request"],
                  fmt(r["attempts_per_request"], ".3f") + extra,
                  f"≤ {r['attempts_limit']:.3f} (1.2 + allowance)",
                  r["attempts_per_request"] <= r["attempts_limit"], r["attempts_limit"])
            check(label, "client success rate", r["success_rate"],
                  fmt(r["success_rate"] * 100, ".1f", "%") + f" (p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms)",
                  "> 51%", r["success_rate"] > 0.51, 0.51)
    return meta, happy, idle, stream, retry, rows, checks, commands


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "record":
        record(sys.argv[2], sys.argv[3:])
        return
    if len(sys.argv) < 3 or sys.argv[1] != "summary":
        sys.exit(__doc__)
    d = sys.argv[2]
    meta, happy, idle, stream, retry, rows, checks, commands = build(d)
    configs = {}
    for name in ("plain.yaml", "bearer.yaml", "retry.yaml"):
        if os.path.exists(os.path.join(d, name)):
            with open(os.path.join(d, name)) as f:
                configs[name] = f.read()
    failed = [c for c in checks if c["pass"] is False]
    if "--json" in sys.argv[3:]:
        print(json.dumps({"meta": meta, "happy_path": happy, "idle_connections": idle, "stream": stream,
                          "retry_storm": retry, "targets": checks, "targets_failed": len(failed),
                          "commands": commands, "configs": configs}, indent=2))
        return
    print(f"# Backstop benchmark ({meta.get('mode', '?')} run, {meta.get('date_utc', '?')})")
    print()
    print(f"{meta.get('nproc', '?')} CPUs, load average before {meta.get('loadavg_before', '?')}, after "
          f"{meta.get('loadavg_after', '?')}; {meta.get('rounds', '?')} round(s) of wrk -t1 -d{meta.get('dur', '?')}; "
          f"backstop {meta.get('backstop_version', '?')}, wrk {meta.get('wrk', '?')}, nginx {meta.get('nginx', '?')}. "
          "The CPU is shared: absolute req/s move 10–20% between runs, compare ratios within one run.")
    print()
    print("| scenario | measure | value | target | result |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    for c in checks:
        print(f"| {c['scenario']} | {c['measure']} | {c['text']} | {c['target']} | {verdict(c['pass'])} |")
    print()
    n = sum(1 for c in checks if c["pass"] is not None)
    print(f"Targets: {n - len(failed)} of {n} met." + (" Missed: " + "; ".join(
        f"{c['scenario']} {c['measure']}" for c in failed) if failed else ""))
    print()
    print("Commands used (ports and paths of this run; configs and raw outputs are in "
          f"{meta.get('out', d)}):")
    print()
    print("```sh")
    for c in commands:
        print(c)
    print("```")
    for name, text in configs.items():
        print()
        print(f"`{name}`" + (" (idle.yaml and stream.yaml are the same on their own ports)"
                             if name == "plain.yaml" else "") + ":")
        print()
        print("```yaml")
        print(text.rstrip("\n"))
        print("```")


if __name__ == "__main__":
    main()
