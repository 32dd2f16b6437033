"""The OCR pipeline, without HTTP: admission (concurrency, queue, drain) -> decode (ocr_app/documents/, in
worker processes) -> engine (ocr_app/engines/) -> the response; and what /healthz knows of it (health.py)."""
