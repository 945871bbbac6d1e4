"""What AWS computes for a SigV4 request, with botocore's own signer (the reference the SigV4 tests use).

A request's query is decoded and handed to botocore as parameters, so botocore encodes it the way an AWS service
does on its side (decode, then encode each name and value); `+` in a query means a space, as in any form-encoded
query.
"""
from urllib.parse import parse_qsl

from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials


def signer(service, region, access_key, secret_key, token=None):
    cls = S3SigV4Auth if service == "s3" else SigV4Auth
    return cls(Credentials(access_key, secret_key, token), service, region)


def signature(auth, method, host, path, query, headers, amz_date):
    """The hex signature botocore computes for these signed headers (names lowercase, values as sent)."""
    request = AWSRequest(method=method, url="http://" + host + path, headers=headers,
                         params=parse_qsl(query, keep_blank_values=True) if query else None)
    request.context["timestamp"] = amz_date
    canonical = auth.canonical_request(request)
    return auth.signature(auth.string_to_sign(request, canonical), request), canonical


def signature_of_url(auth, method, host, path, query, headers, amz_date):
    """The hex signature botocore computes when handed the request's URL as received (no parameters): it then signs
    the raw query pairs, only sorted, and for S3 the raw path, so it agrees with AWS only on a canonical target."""
    url = "http://" + host + path + ("?" + query if query else "")
    request = AWSRequest(method=method, url=url, headers=headers)
    request.context["timestamp"] = amz_date
    return auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
