"""Helpers of a fleet of running services, each a client of one: the canary's shadow replays (shadow.py),
`ocr-app eval`'s release gate (evaluation.py), and `ocr-app jobs` (jobclient.py)."""
