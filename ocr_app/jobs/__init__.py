"""Bulk OCR jobs: PostgreSQL is the job store and the queue; every instance works it (issue 11).

A bulk job's way: POST /v1/jobs stores the document and queues its page ranges (store.py) -> each
instance's worker claims a range while its interactive queue is short, keeps the range's lease alive while
it reads the pages, and writes each page's result once (worker.py, on ranges.py's rows) -> SSE page events
and the result stream read those rows (events.py) -> once the job is finished, its webhook, if it asked
for one, is POSTed by any instance's worker (webhooks.py). No job state lives in a process: any instance
answers for any job.

The queue is our own SQL, not a library (procrastinate 3.x, pgqueuer 1.x were read for it):
- Both are task queues: the unit is one task run by a function. Ours is a page range whose pages are
  written one by one, idempotently, and whose claims must wait for this instance's interactive admission
  queue (ocr_app/ocr/admission.py); with a library its worker loop would own the concurrency and the claim.
- Recovery of work whose worker died is what we need most, and it is where both have had their faults:
  procrastinate marks a killed worker's jobs stalled but leaves them in `doing` until the application
  retries them itself (procrastinate#307, #1518: jobs stuck in doing forever once the dead worker's row was
  pruned); pgqueuer re-picks by a heartbeat/retry_timer, which did not reclaim a crashed worker's picked job
  under a concurrency limit (pgqueuer#474/#475, fixed 2025-10) and re-picked still-running jobs when its
  heartbeat buffer flushed later than the timer (pgqueuer#430).
- What we need is three statements on psycopg 3: claim (`FOR UPDATE SKIP LOCKED`, taking a queued range or
  one whose lease has expired), renew (lease_expires_at moves forward while the owner works), finish; plus
  `INSERT ... ON CONFLICT (job_id, page) DO NOTHING` for the results, so a range run twice (its first
  worker died after writing some pages) changes nothing. At-least-once runs, exactly-once results.
"""
