"""One APIRouter per concern: ocr (POST /v1/ocr), jobs (/v1/jobs), probes (/healthz, /livez, /metrics),
web (the page at / and the API docs)."""
