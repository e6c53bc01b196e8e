#!/usr/bin/env python3
"""moto's server with its signature check fixed for query strings.

moto (5.2.1) checks a request's SigV4 signature against the URL as
werkzeug hands it over, with the query already percent-decoded, and
botocore's canonical request takes that query as it is: a request whose
query has a '/' (an S3 listing with `prefix=dir/` or `delimiter=/`, which
every S3 client sends) then never matches, whatever the key. This wrapper
encodes the query again (RFC 3986 unreserved characters only, as SigV4
says) before moto checks it, and runs moto's own server with the
arguments given. The check stays as strict as moto makes it: a wrong key
or a changed request still fails.
"""

import sys
from urllib.parse import parse_qsl, quote, urlparse, urlunparse

from moto.core import authorization


def _encoded(uri):
    parts = urlparse(uri)
    if not parts.query:
        return uri
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    query = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in pairs)
    return urlunparse(parts._replace(query=query))


_check = authorization.ActionAuthenticatorMixin._authenticate_and_authorize_action


def _authenticate_and_authorize_action(self, iam_request_cls, resource="*"):
    decoded = self.uri
    self.uri = _encoded(decoded)
    try:
        return _check(self, iam_request_cls, resource)
    finally:
        self.uri = decoded


authorization.ActionAuthenticatorMixin._authenticate_and_authorize_action = _authenticate_and_authorize_action

if __name__ == "__main__":
    from moto.server import main

    sys.exit(main(sys.argv[1:]))
