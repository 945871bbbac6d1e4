# The origin of scripts/sigv4/curl-probe.sh: records what libcurl's CURLOPT_AWS_SIGV4 sent (signed headers, payload
# hash, date) and checks the signature with botocore, as sent and as if the body were empty.
import hashlib, http.server, json, sys
from botocore.auth import SigV4Auth, S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

AK, SK = "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def handle_one(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        auth = self.headers.get("Authorization", "")
        parts = dict(p.strip().split("=", 1) for p in auth.split(" ", 1)[1].split(",")) if auth else {}
        signed = parts.get("SignedHeaders", "").split(";")
        cred = parts.get("Credential", "").split("/")
        region, service = (cred[2], cred[3]) if len(cred) > 3 else ("", "")
        token = self.headers.get("x-amz-security-token")
        signer = (S3SigV4Auth if service == "s3" else SigV4Auth)(Credentials(AK, SK, None), service, region)
        req = AWSRequest(method=self.command, url="http://" + self.headers["Host"] + self.path, data=body,
                         headers={h: self.headers[h] for h in signed if h in self.headers})
        req.context["timestamp"] = self.headers.get("x-amz-date", "")
        canonical = signer.canonical_request(req)
        expected = signer.signature(signer.string_to_sign(req, canonical), req)
        req2 = AWSRequest(method=self.command, url="http://" + self.headers["Host"] + self.path, data=b"",
                         headers={h: self.headers[h] for h in signed if h in self.headers})
        req2.context["timestamp"] = req.context["timestamp"]
        empty_ok = signer.signature(signer.string_to_sign(req2, signer.canonical_request(req2)), req2) == parts.get("Signature")
        out = {"signed_as_if_empty_body": empty_ok, "method": self.command, "path": self.path, "signed_headers": signed,
               "x-amz-date": self.headers.get("x-amz-date"),
               "x-amz-content-sha256": self.headers.get("x-amz-content-sha256"),
               "body_sha256": hashlib.sha256(body).hexdigest(), "body_len": len(body),
               "token_header_sent": token is not None,
               "botocore_agrees": expected == parts.get("Signature")}
        print(json.dumps(out), flush=True)
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    do_GET = do_POST = do_PUT = handle_one

srv = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H)
srv.serve_forever()
