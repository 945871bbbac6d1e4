#!/usr/bin/env python3
"""Signs the requests given as JSON on stdin with botocore and prints, for each, its signature and canonical request.

Input: a list of {method, host, path, query, service, region, access_key, secret_key, token, amz_date,
payload_hash, client_headers}; the signed headers are host, x-amz-content-sha256, x-amz-date, x-amz-security-token
(with a token) and the client's x-amz-* headers (client_headers: a JSON list of [name, value]), as Backstop signs
them (docs/reference/aws-sigv4.md). Used by the Swift tests (BackstopIdentityTests).
"""
import json
import sys

from botocore_common import signature, signer

out = []
for case in json.load(sys.stdin):
    auth = signer(case["service"], case["region"], case["access_key"], case["secret_key"], case.get("token"))
    headers = {"host": case["host"], "x-amz-content-sha256": case["payload_hash"], "x-amz-date": case["amz_date"]}
    if case.get("token"):
        headers["x-amz-security-token"] = case["token"]
    # The client's other x-amz-* headers, signed too: a JSON list of [name, value] pairs.
    for name, value in json.loads(case.get("client_headers", "[]")):
        headers[name] = value
    sig, canonical = signature(auth, case["method"], case["host"], case["path"], case.get("query", ""), headers,
                               case["amz_date"])
    out.append({"signature": sig, "canonical_request": canonical})
json.dump(out, sys.stdout)
