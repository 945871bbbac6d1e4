-- wrk script: prints one machine-readable summary line (read by bench/report.py).
-- WRK_REALISTIC=1: the headers an app sends, 12 lines of ~700 bytes (scripts/lib/realistic.sh).
if os.getenv("WRK_REALISTIC") == "1" then
  wrk.headers["User-Agent"] = "LegacyBilling/4.12.7 (Java/17.0.9; Linux amd64) okhttp/4.12.0"
  wrk.headers["Accept"] = "application/json, text/plain;q=0.9, */*;q=0.8"
  wrk.headers["Accept-Language"] = "en-GB,en;q=0.9,de;q=0.8"
  wrk.headers["Content-Type"] = "application/json; charset=utf-8"
  wrk.headers["X-Request-Id"] = "3f2b9c1e-7a4d-4e5f-9b8a-1c2d3e4f5a6b"
  wrk.headers["X-Correlation-Id"] = "billing-run-2026-11-25T18:00:00Z-000042"
  wrk.headers["traceparent"] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
  wrk.headers["X-Forwarded-For"] = "10.20.30.40"
  wrk.headers["X-Tenant"] = "acme-eu-west-1"
  wrk.headers["Cache-Control"] = "no-cache"
  wrk.headers["Cookie"] = "session=9f8e7d6c5b4a39281706f5e4d3c2b1a0; locale=en_GB; feature_flags=new-invoices,bulk-export,sso-v2; _ga=GA1.2.1234567890.1700000000"
  wrk.headers["X-Api-Version"] = "2024-06-01"
end
-- WRK_DELAY_MS=N: each connection waits N ms before each request (a paced load: about c × 1000 / N requests/s
-- offered whatever the proxy's speed; wrk's latency does not include the wait).
local pace = tonumber(os.getenv("WRK_DELAY_MS") or "")
if pace and pace > 0 then
  delay = function() return pace end
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"bytes":%d,"p50_us":%d,"p99_us":%d,"max_us":%d,' ..
    '"non2xx3xx":%d,"err_connect":%d,"err_read":%d,"err_write":%d,"err_timeout":%d}\n',
    summary.requests, summary.duration, summary.bytes,
    latency:percentile(50), latency:percentile(99), latency.max,
    e.status, e.connect, e.read, e.write, e.timeout))
end
