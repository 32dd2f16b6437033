"""TEST FIXTURE (Molecule, monitoring): a stand-in for one ocr-app instance behind nginx_tls, as Prometheus
sees it: GET /instances/0/metrics answers a few of the app's series (Prometheus' text format); and for
PostgreSQL's exporter: GET /metrics answers `pg_up 1`; all else 404.

    test-fixture-ocr-metrics PORT
"""

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BODY = b"""# HELP ocr_model_loaded 1 when the engine is loaded and passed its self-test.
# TYPE ocr_model_loaded gauge
ocr_model_loaded 1
# HELP ocr_queue_depth Requests waiting for a slot.
# TYPE ocr_queue_depth gauge
ocr_queue_depth 0
"""
PG_BODY = b"""# HELP pg_up Whether the last scrape of metrics from PostgreSQL was able to connect to it.
# TYPE pg_up gauge
pg_up 1
"""
BODIES = {"/instances/0/metrics": BODY, "/metrics": PG_BODY}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = BODIES.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    # Every address: Prometheus scrapes the host's lab address, as it would an app host's nginx.
    ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Handler).serve_forever()  # noqa: S104
