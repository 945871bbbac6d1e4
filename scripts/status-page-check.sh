#!/usr/bin/env bash
# Opens the status page of a real daemon in headless Chromium (Debian's `chromium`): takes a screenshot and checks
# the DOM the browser built — every upstream and endpoint state, the failures table, no credential, and no
# Content-Security-Policy violation in the browser's console (the page's own style block must be allowed).
#   bash scripts/status-page-check.sh [BINARY] [SCREENSHOT]
#     BINARY      the daemon (default .build/debug/backstop)
#     SCREENSHOT  where the PNG goes (default docs/images/status.png)
# Everything listens on 127.0.0.1 ports picked at run time; all it starts is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
binary=$(readlink -f "${1:-.build/debug/backstop}")
screenshot=${2:-docs/images/status.png}
browser=$(command -v chromium || true)
[ -n "$browser" ] || { echo "status-page-check: chromium not found (apt-get install chromium)" >&2; exit 2; }
[ -x "$binary" ] || { echo "status-page-check: $binary is not an executable (build it first)" >&2; exit 2; }
source scripts/lib/ab-origin.sh  # wait_port

work=$(mktemp -d /tmp/status-page.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

read -r proxy admin ok_port fail_port dead_port < <(python3 - <<'PY'
import socket
socks = [socket.socket() for _ in range(5)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])
PY
)

# Two origins: one answers 200, one 503.
cat > "$work/origin.py" <<'PY'
import http.server, sys
status = int(sys.argv[2])
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = b"origin\n"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
python3 "$work/origin.py" "$ok_port" 200 & pids+=($!)
python3 "$work/origin.py" "$fail_port" 503 & pids+=($!)

secret="status-page-secret-$RANDOM$RANDOM"
cat > "$work/backstop.yaml" <<CONF
version: 1
listen: [127.0.0.1:$proxy]
admin: {listen: 127.0.0.1:$admin}
log: {level: warning}
keychain: {path: $work/keychain.bkc, key_file: $work/keychain.key}
upstreams:
  - name: orders
    match: {hosts: [orders.internal]}
    url: http://127.0.0.1:$ok_port
    auth: {type: static, entry: orders/api_key, header: X-Api-Key, scheme: ""}
  - name: payments
    match: {hosts: [payments.internal]}
    url: http://127.0.0.1:$fail_port
    retry: {attempts: 3, backoff: {strategy: constant, base: 10ms, max: 10ms, jitter: none}}
  - name: ledger
    match: {hosts: [ledger.internal]}
    url: http://127.0.0.1:$dead_port
    retry: {attempts: 2, backoff: {strategy: constant, base: 10ms, max: 10ms, jitter: none}}
CONF
"$binary" keychain init --config "$work/backstop.yaml" >/dev/null
printf '%s' "$secret" | "$binary" keychain set orders/api_key --config "$work/backstop.yaml" >/dev/null
"$binary" run --config "$work/backstop.yaml" 2>"$work/daemon.log" & pids+=($!)
wait_port "$ok_port" && wait_port "$fail_port" && wait_port "$proxy" 10 && wait_port "$admin" \
  || { echo "status-page-check: daemon or origins did not start" >&2; cat "$work/daemon.log" >&2; exit 1; }

for i in 1 2 3 4 5 6; do curl -s -o /dev/null -x "http://127.0.0.1:$proxy" http://orders.internal/items; done
for i in 1 2; do curl -s -o /dev/null -x "http://127.0.0.1:$proxy" http://payments.internal/charge; done
curl -s -o /dev/null -x "http://127.0.0.1:$proxy" http://ledger.internal/balance
url="http://127.0.0.1:$admin/status"
# The exchange records its end after the response: wait until the three failures are in.
for i in $(seq 1 100); do
  [ "$(curl -s "$url.json" | grep -c '"cause"')" -ge 3 ] && break
  sleep 0.05
done
curl -s "$url.json" > "$work/status.json"

flags=(--headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run --user-data-dir="$work/profile")
mkdir -p "$(dirname "$screenshot")"
"$browser" "${flags[@]}" --window-size=1280,1400 --screenshot="$screenshot" "$url" >/dev/null 2>"$work/shot.log"
"$browser" "${flags[@]}" --enable-logging=stderr --v=0 --dump-dom "$url" >"$work/dom.html" 2>"$work/browser.log"
[ -s "$screenshot" ] || { echo "status-page-check: no screenshot" >&2; cat "$work/shot.log" >&2; exit 1; }

python3 - "$work/dom.html" "$work/status.json" "$work/browser.log" "$secret" <<'PY'
import html.parser, json, sys
dom, status_json, console, secret = open(sys.argv[1]).read(), open(sys.argv[2]).read(), open(sys.argv[3]).read(), sys.argv[4]

class Tables(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.table, self.rows, self.captions, self.in_caption = None, {}, {}, False
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table": self.table = a.get("id"); self.rows[self.table] = []
        if tag == "caption": self.in_caption = True
        if tag == "tr" and self.table and "data-upstream" in a: self.rows[self.table].append(a)
    def handle_endtag(self, tag):
        if tag == "table": self.table = None
        if tag == "caption": self.in_caption = False
    def handle_data(self, data):
        if self.in_caption and self.table: self.captions[self.table] = self.captions.get(self.table, "") + data

t = Tables(); t.feed(dom)
problems = []
names = {"orders", "payments", "ledger"}
if {r["data-upstream"] for r in t.rows.get("upstreams", [])} != names: problems.append(f"upstreams table: {t.rows.get('upstreams')}")
states = {(r["data-upstream"], r.get("data-endpoint-state")) for r in t.rows.get("endpoints", [])}
# payments failed six attempts in a row (two requests, three attempts each): the default circuit.failures (5) ejects it.
if states != {("orders", "healthy"), ("payments", "ejected"), ("ledger", "healthy")}: problems.append(f"endpoints table: {states}")
failed = [r["data-upstream"] for r in t.rows.get("failures", [])]
if sorted(failed) != ["ledger", "payments", "payments"]: problems.append(f"failures table: {failed}")
for table in ("upstreams", "endpoints", "tokens", "failures"):
    if not t.captions.get(table, "").strip(): problems.append(f"{table} has no caption")
if secret in dom or secret in status_json: problems.append("the keychain secret appears on the page or in status.json")
if json.loads(status_json)["upstreams"][0]["token"] != {"kind": "static", "present": True}: problems.append("token status")
if "Content Security Policy" in console or "Refused to" in console: problems.append("CSP violation: " + console)
if problems:
    print("status-page-check: FAILED\n  " + "\n  ".join(problems)); sys.exit(1)
print(f"status-page-check: ok ({len(t.rows['upstreams'])} upstreams, {len(failed)} failures, no secret, no CSP violation)")
PY
echo "status-page-check: screenshot in $screenshot"
