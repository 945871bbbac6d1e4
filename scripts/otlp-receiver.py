#!/usr/bin/env python3
"""A minimal OTLP/HTTP trace receiver: decodes each POST /v1/traces with the reference protobuf classes
(PyPI `opentelemetry-proto`) and prints one JSON object per span on stdout, so a test (or a person checking a
`tracing` section) sees exactly what Backstop sent.

    otlp-receiver.py PORT [--status CODE]   serve on 127.0.0.1:PORT; answer every export with CODE (default 200)
    otlp-receiver.py --decode [FILE]        decode one ExportTraceServiceRequest (FILE, else stdin), print its spans

Each span line: {"resource": {...}, "scope": "...", "trace_id": hex, "span_id": hex, "parent_span_id": hex,
"trace_state": "...", "name": "...", "kind": "SPAN_KIND_SERVER", "start": ns, "end": ns, "attributes": {...},
"status": {"code": "...", "message": "..."}, "flags": int, "links": [{"trace_id": hex, "span_id": hex}]}.
"""
import http.server
import json
import sys

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.trace.v1 import trace_pb2


def value_of(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def spans_of(body):
    request = trace_service_pb2.ExportTraceServiceRequest()
    request.ParseFromString(body)
    for resource_spans in request.resource_spans:
        resource = {kv.key: value_of(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield {
                    "resource": resource,
                    "scope": scope_spans.scope.name,
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex(),
                    "trace_state": span.trace_state,
                    "name": span.name,
                    "kind": trace_pb2.Span.SpanKind.Name(span.kind),
                    "start": span.start_time_unix_nano,
                    "end": span.end_time_unix_nano,
                    "attributes": {kv.key: value_of(kv.value) for kv in span.attributes},
                    "status": {"code": trace_pb2.Status.StatusCode.Name(span.status.code),
                               "message": span.status.message},
                    "flags": span.flags,
                    "links": [{"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex()} for link in span.links],
                }


def main():
    if sys.argv[1:2] == ["--decode"]:
        body = open(sys.argv[2], "rb").read() if len(sys.argv) > 2 else sys.stdin.buffer.read()
        for span in spans_of(body):
            print(json.dumps(span, sort_keys=True))
        return
    port = int(sys.argv[1])
    status = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--status" else 200

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                print(json.dumps({"error": "unexpected request", "path": self.path,
                                  "content_type": self.headers.get("Content-Type")}), flush=True)
                self.send_response(400)
            else:
                for span in spans_of(body):
                    print(json.dumps(span, sort_keys=True), flush=True)
                self.send_response(status)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print("listening", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
