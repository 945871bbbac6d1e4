#!/usr/bin/env python3
"""Black-box replay, against any backstop binary, of the scenarios behind the security regression tests
(Tests/IntegrationTests/UpstreamFramingTests.swift, SecurityReviewTests.swift, SecondReviewTests.swift,
KeychainFaultTests.swift): response splitting by a lying origin, Via loops, passthrough to metadata addresses, dot
segments, TRACE echoing the injected credential, a stalled response body, a passthrough loop, rekey with a failing
directory fsync; and the second review's request-path findings (the unspecified address, tunnels to this host,
trickled heads on the admin listener, traversal spellings, the kept-body budget, unsolicited 101s).
Prints one row per scenario with PASS/FAIL. Used to show that a binary from before the fixes fails them.

    python3 scripts/security-probes.py .build/release/backstop --new     # --new: the binary knows timeouts.idle

Needs clang (the fault-injection shim). Everything runs on 127.0.0.1 (ports 19400-19402); every process started
here is killed and every wait is bounded. `--metadata` adds a probe that asks the binary to pass a request through
to 169.254.169.254: a binary without the destination guard really connects there, so it is off by default."""
import os, socket, subprocess, sys, tempfile, threading, time

BIN = sys.argv[1]
NEW = "--new" in sys.argv
BASE = 19400
WORK = tempfile.mkdtemp(prefix="probe-")
results = []


def serve(port, handler):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port)); s.listen(64)
    def loop():
        while True:
            try: c, _ = s.accept()
            except OSError: return
            threading.Thread(target=handler, args=(c,), daemon=True).start()
    threading.Thread(target=loop, daemon=True).start()
    return s


def read_head(c):
    data = b""
    c.settimeout(60)
    try:
        while b"\r\n\r\n" not in data:
            chunk = c.recv(65536)
            if not chunk: break
            data += chunk
    except OSError:
        c.close(); return b""
    return data


FORGED = b"HTTP/1.1 200 OK\r\nX-Injected: yes\r\nContent-Length: 6\r\n\r\nforged"
LIES = {
    "CL+TE": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
    "TE+CL": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
}
recorded = []


def lying(c):
    head = read_head(c)
    kind = "CL+TE" if b"/cl-te" in head else "TE+CL" if b"/te-cl" in head else "CL5,CL82" if b"/cl-twice" in head else "long"
    body = b"HELLO" + FORGED
    if kind in LIES:
        c.sendall(LIES[kind] + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
    elif kind == "CL5,CL82":
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    else:
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n" + body)
    time.sleep(1); c.close()


def honest(c):
    while True:
        head = read_head(c)
        if not head: return
        recorded.append(head.split(b"\r\n")[0].decode())
        if head.startswith(b"TRACE"):
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: message/http\r\nContent-Length: %d\r\n\r\n" % len(head) + head)
        elif b"/stall" in head:
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789"); time.sleep(30); return
        else:
            c.sendall(b"HTTP/1.1 200 OK\r\nX-Honest: 1\r\nContent-Length: 6\r\n\r\nhonest")


def start(config, port):
    path = os.path.join(WORK, f"c{port}.yaml")
    open(path, "w").write(config)
    p = subprocess.Popen([BIN, "run", "--config", path], stdout=subprocess.DEVNULL, stderr=open(path + ".log", "w"))
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close(); return p
        except OSError:
            if p.poll() is not None: break
            time.sleep(0.1)
    p.kill(); return None


def exchange(sock, raw, timeout=8):
    """Sends one request; reads one response framed by its Content-Length. Returns (status line, headers, body)."""
    sock.sendall(raw); sock.settimeout(timeout)
    buf = exchange.left.get(sock, b"")
    t0 = time.time()
    try:
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk: return ("closed", "", b"")
            buf += chunk
        head, rest = buf.split(b"\r\n\r\n", 1)
        length = 0
        for line in head.split(b"\r\n")[1:]:
            if line.lower().startswith(b"content-length:"): length = int(line.split(b":")[1])
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk: break
            rest += chunk
        exchange.left[sock] = rest[length:]
        err = [l.split(b":", 1)[1].strip().decode() for l in head.split(b"\r\n") if l.lower().startswith(b"x-backstop-error:")]
        return (head.split(b"\r\n")[0].decode() + (f" ({err[0]})" if err else ""), head.decode(errors="replace"), rest[:length])
    except socket.timeout:
        return (f"no answer within {timeout}s", "", b"")
exchange.left = {}


def record(name, expected, observed, ok):
    results.append((name, expected, observed, "PASS" if ok else "FAIL"))


def probes():
    lie_port, honest_port, proxy = BASE, BASE + 1, BASE + 2
    serve(lie_port, lying); serve(honest_port, honest)
    kc = os.path.join(WORK, "kc")
    os.makedirs(kc)
    cfg = f"""version: 1
listen: [127.0.0.1:{proxy}]
unmatched: passthrough
keychain: {{path: {kc}/kc.bkc, key_file: {kc}/kc.key}}
upstreams:
  - {{name: evil, match: {{hosts: [evil.test]}}, url: "http://127.0.0.1:{lie_port}", retry: {{attempts: 1}}}}
  - {{name: api, match: {{hosts: [api.test], path_prefix: /api}}, url: "http://127.0.0.1:{honest_port}/v2",
     retry: {{attempts: 1}}, auth: {{type: static, entry: api/token}}{", timeouts: {idle: 2s}" if NEW else ""}}}
"""
    cfgpath = os.path.join(WORK, "kc.yaml"); open(cfgpath, "w").write(cfg)
    subprocess.run([BIN, "keychain", "init", "--config", cfgpath], capture_output=True)
    subprocess.run([BIN, "keychain", "set", "api/token", "--config", cfgpath], input=b"sekrit-token", capture_output=True)
    p = start(cfg, proxy)
    if not p:
        print(open(os.path.join(WORK, f"c{proxy}.yaml.log")).read()); return
    try:
        for path, name in [("/cl-te", "CL+TE"), ("/te-cl", "TE+CL"), ("/cl-twice", "CL 5 then CL 82"), ("/long", "body longer than CL")]:
            s = socket.create_connection(("127.0.0.1", proxy))
            first = exchange(s, f"GET http://evil.test{path} HTTP/1.1\r\nHost: evil.test\r\n\r\n".encode())
            second = exchange(s, b"GET http://api.test/api/hello HTTP/1.1\r\nHost: api.test\r\n\r\n", 4)
            injected = "X-Injected" in second[1]
            record(f"splitting {name}", "2nd answer honest or closed",
                   f"1st: {first[0]}; 2nd: {second[0]}{' X-Injected!' if injected else ''}", not injected)
            s.close()
        s = socket.create_connection(("127.0.0.1", proxy))
        via = "".join("Via: 1.1 backstop\r\n" for _ in range(8))
        r = exchange(s, f"GET http://api.test/api/x HTTP/1.1\r\nHost: api.test\r\n{via}\r\n".encode())
        record("8 Via backstop entries", "508", r[0], " 508 " in r[0]); s.close()
        if "--metadata" in sys.argv:
          s = socket.create_connection(("127.0.0.1", proxy))
          t0 = time.time()
          r = exchange(s, b"GET http://169.254.169.254/latest/meta-data HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n", 15)
          record("passthrough to metadata address", "403 destination-denied, no connect",
                 f"{r[0]} after {time.time() - t0:.1f}s", "(destination-denied)" in r[0])
          s.close()
        for target in ["/api/../admin/secret", "/api/%2e%2e/admin/secret"]:
            before = len(recorded)
            s = socket.create_connection(("127.0.0.1", proxy))
            r = exchange(s, f"GET {target} HTTP/1.1\r\nHost: api.test\r\n\r\n".encode())
            reached = recorded[before:]
            record(f"dot segments {target}", "400, origin sees nothing", f"{r[0]}; origin saw {reached}",
                   " 400 " in r[0] and not reached)
            s.close()
        s = socket.create_connection(("127.0.0.1", proxy))
        r = exchange(s, b"TRACE http://api.test/api/t HTTP/1.1\r\nHost: api.test\r\n\r\n")
        leaked = b"sekrit-token" in r[2]
        record("TRACE to auth upstream", "405, secret never echoed", f"{r[0]}{'; token echoed in body!' if leaked else ''}",
               " 405 " in r[0] and not leaked)
        s.close()
        s = socket.create_connection(("127.0.0.1", proxy))
        s.sendall(b"GET http://api.test/api/stall HTTP/1.1\r\nHost: api.test\r\n\r\n"); s.settimeout(1)
        t0 = time.time(); closed = False
        while time.time() - t0 < 10:
            try:
                if s.recv(65536) == b"": closed = True; break
            except socket.timeout: pass
            except OSError: closed = True; break
        record("response body stalls after 10 of 100 bytes", "client connection closed after timeouts.idle (2s)",
               f"closed after {time.time() - t0:.1f}s" if closed else "still open after 10s", closed)
        s.close()
        # Last: on a binary without loop detection this floods the daemon with its own requests.
        s = socket.create_connection(("127.0.0.1", proxy))
        t0 = time.time()
        r = exchange(s, f"GET http://127.0.0.1:{proxy}/loop HTTP/1.1\r\nHost: 127.0.0.1:{proxy}\r\n\r\n".encode(), 10)
        record("passthrough loop to itself", "508 quickly", f"{r[0]} after {time.time() - t0:.1f}s", " 508 " in r[0])
        s.close()
    finally:
        p.terminate(); p.wait(10)


def rekey_probe():
    shim = os.path.join(WORK, "shim.c"); lib = os.path.join(WORK, "libfault.so")
    src = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "Tests", "BackstopKeychainTests", "Support", "FaultShim.swift")).read()
    open(shim, "w").write(src.split('#"""')[1].split('"""#')[0])
    subprocess.run(["clang", "-shared", "-fPIC", "-O1", "-o", lib, shim, "-ldl"], check=True)
    d = os.path.join(WORK, "rk"); main, new = d + "/main", d + "/new"
    os.makedirs(main); os.makedirs(new)
    def cfg(key):
        p = os.path.join(d, os.path.basename(key) + ".yaml")
        open(p, "w").write(f"version: 1\nlisten: [127.0.0.1:18080]\nkeychain:\n  path: {main}/kc.bkc\n  key_file: {key}\n")
        return p
    old_cfg, new_cfg = cfg(main + "/kc.key"), cfg(new + "/new.key")
    subprocess.run([BIN, "keychain", "init", "--config", old_cfg], capture_output=True)
    subprocess.run([BIN, "keychain", "set", "x", "--config", old_cfg], input=b"v", capture_output=True)
    env = dict(os.environ, LD_PRELOAD=lib, BACKSTOP_FAULT="fsync-dir-after-rename")
    r = subprocess.run([BIN, "keychain", "rekey", "--new-key-file", new + "/new.key", "--config", old_cfg],
                       capture_output=True, env=env)
    opens = [name for name, c in [("old key", old_cfg), ("new key", new_cfg)]
             if subprocess.run([BIN, "keychain", "get", "x", "--config", c], capture_output=True).returncode == 0]
    exists = os.path.exists(new + "/new.key")
    record("rekey, directory fsync fails after rename", "exactly one key opens the keychain, its file exists",
           f"rekey exit {r.returncode}; keys that open: {opens or 'none'}; new key file exists: {exists}",
           len(opens) == 1)


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"): return int(line.split()[1])
    return 0


def second_review_probes():
    """The second review's request-path findings, on their own daemon (ports BASE+3..BASE+6)."""
    origin, proxy, admin = BASE + 3, BASE + 4, BASE + 5
    def origin_handler(c):
        head = read_head(c)
        if b"/switch" in head:
            c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n\x81\x05hello")
            time.sleep(1); c.close(); return
        recorded.append(head.split(b"\r\n")[0].decode())
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nreached"); c.close()
    serve(origin, origin_handler)
    # A binary from before the fixes refuses the new limits: it runs with its defaults, and the probes show what
    # they let through.
    limits = ", header_timeout: 2s, buffer_memory: 4MiB"
    trial = os.path.join(WORK, "limits.yaml")
    open(trial, "w").write(f"version: 1\nlisten: [127.0.0.1:{proxy}]\nlimits: {{max_connections: 64{limits}}}\n")
    if subprocess.run([BIN, "check", "--config", trial], capture_output=True).returncode != 0: limits = ""
    cfg = f"""version: 1
listen: [127.0.0.1:{proxy}]
admin: {{listen: 127.0.0.1:{admin}}}
unmatched: passthrough
limits: {{max_connections: 64{limits}}}
tunnels: {{allow: ["0.0.0.0:{admin}", "[::]:{admin}"], deny_addresses: [10.0.0.0/8]}}
upstreams:
  - {{name: api, match: {{hosts: [api.test], path_prefix: /api}}, url: "http://127.0.0.1:{origin}/v2", retry: {{attempts: 1}}}}
"""
    p = start(cfg, proxy)
    if not p:
        print(open(os.path.join(WORK, f"c{proxy}.yaml.log")).read()); return
    try:
        for host in [f"0.0.0.0:{admin}", f"0:{admin}"]:
            s = socket.create_connection(("127.0.0.1", proxy))
            r = exchange(s, f"GET http://{host}/metrics HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            leaked = b"backstop_" in r[2]
            record(f"passthrough to {host} (admin port)", "508, no metrics", f"{r[0]}{'; metrics page leaked!' if leaked else ''}",
                   " 508 " in r[0] and not leaked)
            s.close()
        s = socket.create_connection(("127.0.0.1", proxy)); t0 = time.time()
        r = exchange(s, f"GET http://0.0.0.0:{proxy}/x HTTP/1.1\r\nHost: 0.0.0.0:{proxy}\r\n\r\n".encode(), 10)
        record("passthrough to 0.0.0.0 on its own port", "508 on the first hop", f"{r[0]} after {time.time() - t0:.1f}s",
               " 508 " in r[0] and time.time() - t0 < 1)
        s.close()
        for target in [f"0.0.0.0:{admin}", f"[::]:{admin}"]:
            s = socket.create_connection(("127.0.0.1", proxy))
            r = exchange(s, f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            record(f"tunnel to {target}, deny list without 0.0.0.0/8", "508", r[0], " 508 " in r[0])
            s.close()
        # 64 admin slots: 64 heads trickled a byte at a time; a health probe must still get in.
        trickle = [socket.create_connection(("127.0.0.1", admin)) for _ in range(64)]
        probe = socket.create_connection(("127.0.0.1", admin)); probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
        probe.settimeout(0.2); t0 = time.time(); answer = b""
        while time.time() - t0 < 8 and b"\r\n\r\n" not in answer:
            for c in trickle:
                try: c.send(b"G")
                except OSError: pass
            try: answer += probe.recv(4096)
            except socket.timeout: pass
            except OSError: break
        ok = answer.startswith(b"HTTP/1.1 200")
        status = answer.split(b"\r\n")[0].decode() or "no answer"
        record("trickled heads hold every admin slot", "/healthz answered within header_timeout",
               f"{status} after {time.time() - t0:.1f}s", ok)
        for c in trickle + [probe]: c.close()
        for target in ["/api/..;/admin", "/api/%2e%2e;x=1/admin", "/api/..%2fadmin", "/api/%2e%2e%2fadmin", "/api/..%5cadmin",
                       "/api/..\\admin", "/api/%252e%252e/admin", "/api/%c0%ae%c0%ae/admin", "http://api.test/..;/admin"]:
            before = len(recorded)
            s = socket.create_connection(("127.0.0.1", proxy))
            r = exchange(s, f"GET {target} HTTP/1.1\r\nHost: api.test\r\n\r\n".encode())
            reached = recorded[before:]
            record(f"traversal {target}", "400, origin sees nothing", f"{r[0]}; origin saw {reached}",
                   " 400 " in r[0] and not reached)
            s.close()
        s = socket.create_connection(("127.0.0.1", proxy))
        r = exchange(s, b"GET http://api.test/api/switch HTTP/1.1\r\nHost: api.test\r\n\r\n")
        record("101 to a request without Upgrade", "502 bad-upstream-response", r[0], "(bad-upstream-response)" in r[0])
        s.close()
        # 60 bodies of 1 MB trickling: the kept bytes stay within buffer_memory (4 MiB here).
        base = rss_kib(p.pid); held = []
        for _ in range(60):
            c = socket.create_connection(("127.0.0.1", proxy))
            c.sendall(b"PUT http://api.test/api/b HTTP/1.1\r\nHost: api.test\r\nContent-Length: 1000000\r\n\r\n" + b"a" * 900000)
            held.append(c)
        time.sleep(1)
        grown = (rss_kib(p.pid) - base) // 1024
        record("60 kept bodies of 1 MB trickling", "RSS grows by little more than buffer_memory (4 MiB)",
               f"RSS +{grown} MiB", grown < 24)
        for c in held: c.close()
        if "--metadata" in sys.argv:
            s = socket.create_connection(("127.0.0.1", proxy)); t0 = time.time()
            r = exchange(s, b"GET http://168.63.129.16/machine HTTP/1.1\r\nHost: 168.63.129.16\r\n\r\n", 15)
            record("passthrough to Azure WireServer", "403 destination-denied, no connect",
                   f"{r[0]} after {time.time() - t0:.1f}s", "(destination-denied)" in r[0])
            s.close()
    finally:
        p.terminate(); p.wait(10)


probes()
second_review_probes()
rekey_probe()
print(f"\n{BIN}\n| probe | correct behaviour | observed | |\n|---|---|---|---|")
for row in results: print("| " + " | ".join(row) + " |")
