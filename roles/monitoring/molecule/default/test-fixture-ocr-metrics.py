"""TEST FIXTURE (Molecule, monitoring): a stand-in for one ocr-app instance behind nginx_tls, as Prometheus
sees it: GET /instances/0/metrics answers a few of the app's series (Prometheus' text format), all else 404.

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


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path != "/instances/0/metrics":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    # Every address: Prometheus scrapes the host's lab address, as it would an app host's nginx.
    ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Handler).serve_forever()  # noqa: S104
