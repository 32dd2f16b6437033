"""Backups you can restore (`make test-fleet`): the job database's WAL goes to pgBackRest's repository on
mon-1, which took a full backup when site.yml made it. A job accepted (202) before a target time and another
accepted after it; playbooks/db-restore.yml restores the repository to the target into mon-1 (a host without
a job database: a Debian cluster `pitr` on port 5499, which the test names): the first job is there, the
second is not. Prints `pitr_restore: target=T job_before_found=1 job_after_found=0 restore_s=S`.

Then a backup run that fails (the repository's backup directory unreadable for it) makes OcrJobBackupLate
fire, and a run that succeeds afterwards ends it.
"""

from __future__ import annotations

import time
import uuid

import pytest

from lab.base import wait_until
from tests.fleet.conftest import firing, say
from tests.fleet.jobs import DATABASE, FleetJob, db_leader

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

REPO = "mon-1"  # the lab inventory's pgbackrest_repo
PGBACKREST = ["runuser", "-u", "postgres", "--", "pgbackrest", "--stanza=ocrfleet"]
# The Debian cluster the restore makes (the test's choice, not the role's defaults: restore, 5433).
RESTORE_CLUSTER = "pitr"
RESTORE_PORT = 5499
BACKUP_INCR = "ocrfleet-pgbackrest@incr.service"
BACKUP_DIR = "/var/lib/pgbackrest/backup/ocrfleet"  # the role's postgresql_pgbackrest_repo_path, the stanza's
ALERT = "OcrJobBackupLate"


def psql(fleet, host: str, query: str, port: int = 5432) -> str:
    argv = ["runuser", "-u", "postgres", "--", "psql", "-XAt", "-p", str(port), "-d", DATABASE, "-c", query]
    return fleet.lab.exec(host, argv).stdout.strip()


def test_a_point_in_time_restore_has_the_jobs_accepted_before_it(fleet):
    before = FleetJob.submit(fleet, 1, f"restore-before-{uuid.uuid4()}")
    # The leader's clock, read after the first job's commit (its 202) and before the second's.
    target = psql(fleet, db_leader(fleet), "SELECT clock_timestamp()")
    after = FleetJob.submit(fleet, 1, f"restore-after-{uuid.uuid4()}")
    # A WAL switch on the primary, then a wait until the repository holds the segment (both jobs in it).
    fleet.lab.exec(REPO, [*PGBACKREST, "check"], timeout=300)

    start = time.monotonic()
    fleet.playbook(
        "playbooks/db-restore.yml",
        {
            "postgresql_restore_target": target,
            "postgresql_restore_replace": True,
            "postgresql_restore_cluster": RESTORE_CLUSTER,
            "postgresql_restore_port": RESTORE_PORT,
        },
    )
    restore_s = time.monotonic() - start
    found = psql(
        fleet,
        REPO,
        f"SELECT id FROM ocr_jobs WHERE id IN ('{before.job_id}', '{after.job_id}')",  # noqa: S608 - uuids
        RESTORE_PORT,
    ).split()
    print(
        f"pitr_restore: target={target!r} job_before_found={found.count(before.job_id)}"
        f" job_after_found={found.count(after.job_id)} restore_s={restore_s:.0f}",
        flush=True,
    )
    assert found == [before.job_id], (found, before.job_id, after.job_id)
    # pg_lsclusters -h: version, name, port, status, owner, data directory, log file.
    clusters = [line.split() for line in fleet.lab.exec(REPO, ["pg_lsclusters", "-h"]).stdout.splitlines()]
    version = next(c[0] for c in clusters if c[1] == RESTORE_CLUSTER and c[2] == str(RESTORE_PORT))
    fleet.lab.exec(REPO, ["pg_dropcluster", "--stop", version, RESTORE_CLUSTER])


def test_a_failed_backup_makes_its_alert_fire(fleet):
    assert firing(fleet, ALERT) == []
    # Not the database hosts' pgBackRest stopped: the backup then tries each for two minutes before it fails.
    try:
        fleet.lab.exec(REPO, ["chmod", "000", BACKUP_DIR])
        r = fleet.lab.exec(REPO, ["systemctl", "start", BACKUP_INCR], check=False, timeout=300)
        assert r.returncode != 0, "the backup ran without its backup directory"
        start = time.monotonic()
        alert = wait_until(lambda: firing(fleet, ALERT), 120, f"{ALERT} firing", interval=1)
        say(f"{ALERT} fired {time.monotonic() - start:.0f} s after the failed run: {alert[0]['labels']}")
    finally:
        fleet.lab.exec(REPO, ["chmod", "750", BACKUP_DIR])
    fleet.lab.exec(REPO, ["systemctl", "start", BACKUP_INCR], timeout=300)
    wait_until(lambda: not firing(fleet, ALERT), 120, f"{ALERT} resolved", interval=1)
