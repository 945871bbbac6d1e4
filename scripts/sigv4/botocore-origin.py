#!/usr/bin/env python3
"""An HTTP origin that accepts only requests whose SigV4 signature botocore computes too.

Usage: botocore-origin.py PORT ACCESS_KEY SECRET_KEY [SESSION_TOKEN]. Prints "listening" once bound. Answers 200
with a JSON account of the check when the Authorization header's signature equals botocore's over the request as
received (raw path, query, the signed headers' values, and, unless UNSIGNED-PAYLOAD, a body whose SHA-256 is the
x-amz-content-sha256 value) with every x-amz-* header signed (S3's rule), and 403 with the same account otherwise; `raw_url_agrees` says whether botocore
handed the raw URL (no decoded parameters) computes the same signature. A request with `Upgrade` whose signature
botocore accepts is answered `101 Switching Protocols` instead, and every byte that follows is echoed back.
"""
import hashlib
import http.server
import json
import sys

from botocore_common import signature, signature_of_url, signer

PORT, ACCESS_KEY, SECRET_KEY = int(sys.argv[1]), sys.argv[2], sys.argv[3]
TOKEN = sys.argv[4] if len(sys.argv) > 4 else None


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def check(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        authorization = self.headers.get("Authorization", "")
        scheme, _, rest = authorization.partition(" ")
        fields = dict(p.strip().split("=", 1) for p in rest.split(",") if "=" in p)
        credential = fields.get("Credential", "").split("/")
        signed = fields.get("SignedHeaders", "").split(";")
        path, _, query = self.path.partition("?")
        report = {"path": path, "query": query, "signed_headers": signed, "problems": []}
        if scheme != "AWS4-HMAC-SHA256" or len(credential) != 5 or credential[0] != ACCESS_KEY:
            report["problems"].append("no AWS4-HMAC-SHA256 credential for the access key")
        else:
            auth = signer(credential[3], credential[2], ACCESS_KEY, SECRET_KEY, TOKEN)
            headers = {name: self.headers.get(name, "") for name in signed}
            amz_date = self.headers.get("x-amz-date", "")
            expected, canonical = signature(auth, self.command, self.headers.get("Host", ""), path, query, headers,
                                            amz_date)
            report["canonical_request"] = canonical
            # Not a problem by itself (AWS decodes the query first): whether a verifier signing the raw URL agrees.
            report["raw_url_agrees"] = signature_of_url(
                auth, self.command, self.headers.get("Host", ""), path, query, headers, amz_date
            ) == fields.get("Signature")
            if expected != fields.get("Signature"):
                report["problems"].append("signature differs from botocore's")
            payload = self.headers.get("x-amz-content-sha256")
            if payload != "UNSIGNED-PAYLOAD" and payload != hashlib.sha256(body).hexdigest():
                report["problems"].append("x-amz-content-sha256 is not the body's hash")
            if TOKEN and self.headers.get("x-amz-security-token") != TOKEN:
                report["problems"].append("session token missing")
            for required in ["host", "x-amz-date", "x-amz-content-sha256"] + (["x-amz-security-token"] if TOKEN else []):
                if required not in signed:
                    report["problems"].append(required + " not signed")
            # S3's rule (HeadersNotSigned): every x-amz-* header present must be signed.
            for name in self.headers.keys():
                if name.lower().startswith("x-amz-") and name.lower() not in signed:
                    report["problems"].append(name.lower() + " present but not signed")
            if not TOKEN and "x-amz-security-token" in self.headers:
                report["problems"].append("a session token that is not the signing credentials'")
        if not report["problems"] and self.headers.get("Upgrade"):
            self.switch_and_echo()
            return
        reply = json.dumps(report).encode()
        self.send_response(403 if report["problems"] else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def switch_and_echo(self):
        self.send_response(101)
        self.send_header("Upgrade", self.headers["Upgrade"])
        self.send_header("Connection", "Upgrade")
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        while True:
            data = self.rfile.read1(65536)
            if not data:
                return
            self.wfile.write(data)
            self.wfile.flush()

    do_GET = do_POST = do_PUT = do_DELETE = check


server = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
print("listening", flush=True)
server.serve_forever()
