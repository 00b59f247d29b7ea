"""moto's S3 server with atomic conditional writes: the test server every
S3 test of this project runs (through scripts/with-s3, as MOTO_SERVER).

moto 5.2.5 checks a write's condition (If-None-Match: *, If-Match) and then
stores the object, in a threaded server, with nothing between the two: two
conditional creates of one key that arrive together can both succeed, the
second overwriting the first. Measured: 300 keys each written by 4 threads
at once, 3 keys with two winners. Amazon S3 and MinIO decide each condition
atomically, and both the Delta log (a commit is the conditional create of
its log entry) and the object checkpoint storage's fencing (If-Match on
HEAD) depend on it: on plain moto, two instances committing to one Delta
table at once could overwrite each other's log entry, and data reported
committed would vanish (seen once, in the multi-host ingest test under
load).

This runs moto's own server with every write of a key (PUT, the completion
of a multipart upload, DELETE) under one lock, so that a condition and the
write it guards are one step, as on S3. Reads and listings run as before.
It also finds each request's service once per host rather than every time,
and writes no line per request (the tests' time is largely moto's).

Usage: python3 moto_atomic.py [moto_server's arguments]
"""

import logging
import sys
import threading

from moto import backends
from moto.moto_server.werkzeug_app import DomainDispatcherApplication
from moto.s3.responses import S3Response
from moto.server import main

_LOCK = threading.Lock()


def _atomic(method):
    def run(self, *args, **kwargs):
        with _LOCK:
            return method(self, *args, **kwargs)

    run.__name__ = method.__name__
    run.__doc__ = method.__doc__
    return run


for _name in ("put_object", "delete_object", "_key_response_post"):
    setattr(S3Response, _name, _atomic(getattr(S3Response, _name)))

# moto finds each request's service by listing its own package's folders
# (twice a request, under one lock) and matching the host against every
# service's URL patterns: a sixth of the server's time in the Delta
# certification. Both answers are the same for every request with the same
# host, so they are worked out once.
_MODULES = frozenset(backends.list_of_moto_modules())
backends.list_of_moto_modules = lambda: _MODULES
_by_host = DomainDispatcherApplication.get_backend_for_host
_BACKENDS = {}


def _backend_for_host(self, host):
    if host not in _BACKENDS:
        _BACKENDS[host] = _by_host(self, host)
    return _BACKENDS[host]


DomainDispatcherApplication.get_backend_for_host = _backend_for_host

if __name__ == "__main__":
    # A line per request, which nothing reads, cost moto about 6 % of its
    # time; errors are still written (scripts/with-s3 shows them when the
    # server does not start).
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    sys.exit(main())
