"""`make mutate`: mutation testing of the modules that guard the service, with cosmic-ray.

cosmic-ray writes each mutant into the module's file and runs the tests, so the server the app tests start as
a subprocess runs the mutant too. It runs on a copy of the working tree (tracked and untracked, not ignored
files) in a temporary folder, never in the checkout: a killed run leaves at most a mutant in that copy. The
copy is imported through PYTHONPATH, ahead of the checkout's editable install, for the tests and the servers
they start alike.

Each module (MODULES) is mutated against the tests that reach it only (files, pytest's node ids, and
--deselect=<node id> options), in one process, stopping at the first failure. A baseline run on the unmutated
copy times those tests; each mutant may take TIMEOUT_FACTOR times that (a mutant that runs past it counts as
killed, as cosmic-ray counts it), and the whole run stops starting mutants once --budget seconds have gone; a
later run goes on where it stopped.

With --jobs N (make mutate's MUTATE_JOBS: 2, one a core here), N workers mutate modules at once, each on its
own copy, each taking the next module no run holds: a module is held (a lock on build/mutate/<module>.lock)
while it is mutated, so two runs, or two workers, never mutate one module's session at once; a module held
elsewhere is left to its holder.

Sessions (cosmic-ray's SQLite work databases) are kept in build/mutate/ (git-ignored), one per module. A new
run carries a mutant's result over while its module's code is unchanged (comments aside); a survivor's only
while the module's tests are unchanged too, so a test written to kill it is tried on the next run.

Left out, as skipped: operators in EXCLUDED_OPERATORS (cosmic-ray's operators filter), mutants in annotations
(never evaluated: the modules use `from __future__ import annotations`), and mutants argued equivalent by a
comment on their line or in the comment lines right above it, `# mutation: <operator> ... equivalent because
...`, where <operator> is the start of cosmic-ray's operator name (ReplaceComparisonOperator_Lt_LtE,
NumberReplacer, ...); `# mutation: <operator> to `<text>` ...` covers only the mutants whose line then holds
<text>.

The report (printed, and in build/mutate/report.txt): per module killed/total and the score, each survivor
with file, line and the mutation, then the mutants cosmic-ray could not make (`!`, with its error: no test
ran) and those argued equivalent (`=`), both left out of the score.
"""

from __future__ import annotations

import argparse
import ast
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "mutate"
TIMEOUT_FACTOR = 3.0
TIMEOUT_FLOOR_S = 20.0


@dataclass(frozen=True)
class Module:
    files: tuple[str, ...]
    tests: tuple[str, ...]


WEBHOOK_UNIT_TESTS = (
    "test_sign_and_verify",
    "test_verify_at_its_limits",
    "test_headers_sign_only_with_a_secret",
    "test_payload_flattens_the_status",
    "test_classify_at_each_boundary",
    "test_backoff_doubles_is_capped_and_jittered",
    "test_backoff_at_the_cap_and_the_jitters_ends",
)
LAYOUT_ENGINE_TESTS = (
    "reading_order.py::test_a_two_column_article_is_read_column_by_column",
    "reading_order.py::test_layout_pages_read_in_order_with_their_blocks",
    "reading_order.py::test_a_wrapped_label_is_one_row_read_through_the_engine",
    "deskew.py::test_a_tilted_two_column_article_read_through_the_engine_comes_out_column_by_column",
)
MODULES: dict[str, Module] = {
    "auth": Module(("ocr_app/auth.py",), ("tests/test_auth.py",)),
    "admission": Module(("ocr_app/ocr/admission.py",), ("tests/test_admission.py",)),
    # What a webhook sends, how it is signed and when again: the unit tests (the app's, with a receiver,
    # take half a minute each run on these cores).
    "webhooks": Module(
        ("ocr_app/jobs/webhooks.py",),
        tuple(f"tests/test_job_webhooks.py::{name}" for name in WEBHOOK_UNIT_TESTS),
    ),
    # The delivery rows' claims and leases, on PostgreSQL.
    "deliveries": Module(
        ("ocr_app/jobs/deliveries.py",),
        (
            "tests/test_job_webhooks.py::test_a_dead_senders_delivery_is_taken_by_another_once_its_lease_expires",
        ),
    ),
    "egress": Module(("ocr_app/egress.py", "ocr_app/jobs/fetch.py"), ("tests/test_jobs_url.py",)),
    # Which URLs a webhook may go to: its unit tests (the app's submit check calls the same function).
    "urls": Module(
        ("ocr_app/urls.py",),
        (
            "tests/test_job_webhooks.py::test_url_rules_at_their_limits",
            "tests/test_job_webhooks.py::test_prefix_problems_and_what_a_log_line_names",
            "tests/test_job_webhooks.py::test_allowed_urls",
            "tests/test_job_webhooks.py::test_allowed_urls_are_checked_at_start",
        ),
    ),
    # The rules at their limits on the test's clock first (2 s), then the real app over HTTP (35 s).
    "health": Module(("ocr_app/ocr/health.py",), ("tests/test_health_rules.py", "tests/test_health.py")),
    # Not the previous release's run on this schema: it takes that release from git history, which the copy
    # the mutants run in has not (and it runs that release's store.py, not this one's).
    "store": Module(
        ("ocr_app/jobs/store.py",),
        (
            "tests/test_jobs_store.py",
            "--deselect=tests/test_jobs_store.py::test_the_previous_release_works_on_this_schema",
            # Following the primary (the pool drained on 25006 or a broken connection, the probe's read-only
            # check): its unit tests and the failover of a job on a real standby.
            "tests/test_jobs_failover.py",
        ),
    ),
    "documents": Module(
        (
            "ocr_app/documents/upload.py",
            "ocr_app/documents/pdf.py",
            "ocr_app/documents/image.py",
            "ocr_app/documents/raster.py",
            "ocr_app/documents/pages.py",
        ),
        ("tests/test_documents.py", "tests/test_hostile.py"),
    ),
    # The decode workers (their limits, deadlines, page files): the pool's tests, then the hostile documents
    # through the app (the documents' tests above call the decoders in-process and never reach it).
    "decode": Module(
        ("ocr_app/documents/decode.py",), ("tests/test_decode_pool.py", "tests/test_hostile.py")
    ),
    # The line boxes' tests, the limits of the rules first (a second): not the four that run the rapidocr
    # engine on rendered pages, which take most of a run's time (9 of 13 s on these cores, a survivor's each
    # time) and test the engine and the layout together.
    "layout": Module(
        ("ocr_app/engines/layout.py",),
        (
            "tests/test_layout_rules.py",
            "tests/test_reading_order.py",
            "tests/test_tables.py",
            "tests/test_deskew.py",
            *(f"--deselect=tests/test_{name}" for name in LAYOUT_ENGINE_TESTS),
        ),
    ),
    # Line boxes fitted to the page's gutters: the limits on synthetic pages (seconds), not the page read
    # through the engine (two engine runs).
    "gutters": Module(
        ("ocr_app/engines/gutters.py",),
        (
            "tests/test_gutter.py",
            "--deselect=tests/test_gutter.py::test_columns_the_detector_joins_are_read_column_by_column",
        ),
    ),
}

# Of the binary and comparison operators' replacements, those that make a plausible bug: the operation's
# counterpart, a limit's boundary (< for <=) and the negation; the others (+ for **, < for `is`) mostly fail
# on the first call and would multiply the run's time by about four.
KEPT_BINARY = "Add_Sub Sub_Add Mul_Div Div_Mul FloorDiv_Mul Mod_FloorDiv Pow_Mul LShift_RShift RShift_LShift"
KEPT_BINARY += " BitOr_BitAnd BitAnd_BitOr BitXor_BitOr"
KEPT_COMPARISON = (
    "Eq_NotEq NotEq_Eq Lt_LtE Lt_GtE LtE_Lt LtE_Gt Gt_GtE Gt_LtE GtE_Gt GtE_Lt Is_IsNot IsNot_Is"
)
EXCLUDED_OPERATORS = [
    rf"core/ReplaceBinaryOperator_(?!({'|'.join(KEPT_BINARY.split())})$)",
    rf"core/ReplaceComparisonOperator_(?!({'|'.join(KEPT_COMPARISON.split())})$)",
]
EQUIVALENT_RE = re.compile(r"#\s*mutation:\s*(\w+)(?:\s+to\s+`([^`]+)`)?")


def ast_digest(path: Path) -> str:
    """The code's digest, comments and line numbers aside."""
    return hashlib.sha256(ast.dump(ast.parse(path.read_text())).encode()).hexdigest()


def files_digest(root: Path, files: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for name in files:
        if name.startswith("-"):  # an option (--deselect=...): its text
            digest.update(name.encode() + b"\0")
            continue
        digest.update(name.encode() + b"\0" + (root / name.split("::")[0]).read_bytes() + b"\0")
    return digest.hexdigest()


def copy_tree(dest: Path) -> None:
    """The working tree as git sees it (tracked and untracked files, ignored ones left out)."""
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    for name in filter(None, listing.decode().split("\0")):
        src = ROOT / name
        if src.is_file() and not src.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
        elif src.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).symlink_to(os.readlink(src))


def annotation_lines(path: Path) -> set[tuple[int, int, int, int]]:
    """Spans of the annotations in a module that never evaluates them (from __future__ import annotations)."""
    tree = ast.parse(path.read_text())
    if not any(
        isinstance(n, ast.ImportFrom)
        and n.module == "__future__"
        and any(a.name == "annotations" for a in n.names)
        for n in tree.body
    ):
        return set()
    spans = set()
    for node in ast.walk(tree):
        annotations: list[ast.expr | None] = []
        if isinstance(node, (ast.arg, ast.AnnAssign)):
            annotations.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            annotations.append(node.returns)
        for ann in annotations:
            if ann is not None:
                spans.add((ann.lineno, ann.col_offset, ann.end_lineno or ann.lineno, ann.end_col_offset or 0))
    return spans


def in_spans(spans: set[tuple[int, int, int, int]], start: tuple[int, int]) -> bool:
    line, col = start
    return any((l0, c0) <= (line, col) < (l1, c1) for l0, c0, l1, c1 in spans)


def argued_equivalent(source: str, line: int, mutation: Any) -> bool:
    """A `# mutation: <operator>` comment on the mutated line or in the comment lines right above it covers
    this mutant; with a `snippet` in backticks, only a mutant whose line then reads so."""
    from cosmic_ray.mutating import mutate_code
    from cosmic_ray.plugins import get_operator

    name = mutation.operator_name.removeprefix("core/")
    lines = source.splitlines()
    above = line - 1  # the comment lines right above the mutated line, and the line itself
    while above > 0 and lines[above - 1].lstrip().startswith("#"):
        above -= 1
    for match in EQUIVALENT_RE.finditer("\n".join(lines[above:line])):
        if not name.startswith(match.group(1)):
            continue
        if match.group(2) is None:
            return True
        operator = get_operator(mutation.operator_name)(**(mutation.operator_args or {}))
        mutated = mutate_code(source, operator, mutation.occurrence)
        if mutated is not None and match.group(2) in mutated.splitlines()[line - 1]:
            return True
    return False


def run_quiet(cmd: list[str], cwd: Path, env: dict[str, str]) -> None:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"mutate: {' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")


def prepare(name: str, module: Module, tree: Path, env: dict[str, str], timeout: float) -> Path:
    """A fresh session for the module in the copy, with what still holds of the last one carried over."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    BUILD.mkdir(parents=True, exist_ok=True)
    config = BUILD / f"{name}.toml"
    session = BUILD / f"{name}.sqlite"
    state_file = BUILD / f"{name}.json"
    test_cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *module.tests]
    config.write_text(
        "[cosmic-ray]\n"
        f"module-path = {json.dumps(list(module.files))}\n"
        f"timeout = {timeout:.1f}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(' '.join(test_cmd))}\n"
        '[cosmic-ray.distributor]\nname = "local"\n'
        "[cosmic-ray.filters.operators-filter]\n"
        f"exclude-operators = {json.dumps(EXCLUDED_OPERATORS)}\n"
    )
    state = {
        "code": {f: ast_digest(tree / f) for f in module.files},
        "tests": files_digest(tree, module.tests),
    }
    old_state = json.loads(state_file.read_text()) if state_file.exists() else None
    carried: dict[tuple[str, str, int], object] = {}
    if old_state and session.exists():
        with use_db(session, WorkDB.Mode.open) as db:
            items = {item.job_id: item for item in db.work_items}
            for job_id, result in db.results:
                mutation = items[job_id].mutations[0]
                path = str(mutation.module_path)
                if result.worker_outcome == WorkerOutcome.SKIPPED:
                    continue
                if old_state["code"].get(path) != state["code"].get(path):
                    continue
                if not result.is_killed and old_state["tests"] != state["tests"]:
                    continue
                carried[(path, mutation.operator_name, mutation.occurrence)] = result
    fresh = session.with_suffix(".new")
    fresh.unlink(missing_ok=True)
    run_quiet([str(Path(sys.executable).parent / "cosmic-ray"), "init", str(config), str(fresh)], tree, env)
    run_quiet([str(Path(sys.executable).parent / "cr-filter-operators"), str(fresh), str(config)], tree, env)
    sources = {f: (tree / f).read_text() for f in module.files}
    spans = {f: annotation_lines(tree / f) for f in module.files}
    with use_db(fresh, WorkDB.Mode.open) as db:
        done = {job_id for job_id, _ in db.results}
        for item in list(db.work_items):
            if item.job_id in done:
                continue
            mutation = item.mutations[0]
            path = str(mutation.module_path)
            line = mutation.start_pos[0]
            if in_spans(spans[path], mutation.start_pos):
                db.set_result(
                    item.job_id, WorkResult(output="annotation", worker_outcome=WorkerOutcome.SKIPPED)
                )
            elif argued_equivalent(sources[path], line, mutation):
                db.set_result(
                    item.job_id, WorkResult(output="argued equivalent", worker_outcome=WorkerOutcome.SKIPPED)
                )
            elif (key := (path, mutation.operator_name, mutation.occurrence)) in carried:
                db.set_result(item.job_id, carried[key])  # type: ignore[arg-type]
    fresh.replace(session)
    state_file.write_text(json.dumps(state, indent=1))
    return session


def baseline(module: Module, tree: Path, env: dict[str, str]) -> float:
    test_cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *module.tests]
    start = time.monotonic()
    proc = subprocess.run(test_cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=900)
    took = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"mutate: the unmutated tests fail ({' '.join(module.tests)}):\n{proc.stdout[-4000:]}")
    return took


def reap(tree: Path) -> list[int]:
    """Processes a test run left behind, killed: a server or a database its tests started, when cosmic-ray
    ended the run at its timeout (it ends the run's process only). They are known by the copy on their
    PYTHONPATH, which every process of the copy's test runs inherits."""
    mark = str(tree).encode()
    killed = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            pid = int(environ.parent.name)
            paths = [v for v in environ.read_bytes().split(b"\0") if v.startswith(b"PYTHONPATH=")]
            if pid != os.getpid() and any(mark in v.split(b"=", 1)[1].split(b":") for v in paths):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        except (OSError, ValueError):
            continue
    return killed


def execute(session: Path, tree: Path, timeout: float, deadline: float) -> bool:
    """Run the session's pending mutants until the deadline; True when none is left."""
    from cosmic_ray.config import load_config
    from cosmic_ray.mutating import mutate_and_test
    from cosmic_ray.work_db import WorkDB, use_db

    cfg = load_config(str(session.with_suffix(".toml")))
    here = Path.cwd()
    os.chdir(tree)
    try:
        with use_db(session, WorkDB.Mode.open) as db:
            for item in list(db.pending_work_items):
                if time.monotonic() + timeout > deadline:
                    return False
                db.set_result(item.job_id, mutate_and_test(item.mutations, cfg.test_command, timeout))
                if left := reap(tree):
                    print(f"mutate: killed {len(left)} processes a test run left behind: {left}", flush=True)
    finally:
        os.chdir(here)
    return True


def report(names: list[str]) -> str:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome

    out = []
    for name in names:
        session = BUILD / f"{name}.sqlite"
        if not session.exists():
            out.append(f"{name}: no session yet")
            continue
        with use_db(session, WorkDB.Mode.open) as db:
            items = {item.job_id: item for item in db.work_items}
            results = dict(db.results)
        killed = survived = pending = equivalent = 0
        survivors: list[str] = []
        argued: list[str] = []
        unmade: list[str] = []
        for job_id, item in items.items():
            result = results.get(job_id)
            mutation = item.mutations[0]
            where = (
                f"{mutation.module_path}:{mutation.start_pos[0]}"
                f" {mutation.operator_name.removeprefix('core/')} #{mutation.occurrence}"
            )
            if result is None:
                pending += 1
            elif result.worker_outcome == WorkerOutcome.SKIPPED:
                if result.output == "argued equivalent":
                    equivalent += 1
                    argued.append(f"    = {where}")
            elif result.worker_outcome == WorkerOutcome.EXCEPTION:
                # cosmic-ray could not write this mutant (its ExceptionReplacer on a dotted name, e.g.
                # `except httpx.InvalidURL`): no test ran, so it is neither killed nor a survivor.
                unmade.append(f"    ! {where}: {(result.output or '').strip().splitlines()[-1:]}")
            elif result.is_killed:
                killed += 1
            else:
                survived += 1
                mutation = item.mutations[0]
                changed = [
                    line[1:].strip()
                    for line in (result.diff or "").splitlines()
                    if line[:1] in "+-" and line[:3] not in ("+++", "---")
                ]
                operator = mutation.operator_name.removeprefix("core/")
                survivors.append(
                    f"    {mutation.module_path}:{mutation.start_pos[0]} {operator}"
                    f" #{mutation.occurrence}: {' -> '.join(changed)}"
                )
        run = killed + survived
        score = f"{100 * killed / run:.1f} %" if run else "-"
        out.append(
            f"{name}: {killed}/{run} killed, score {score}; {equivalent} argued equivalent"
            + (f"; {len(unmade)} cosmic-ray could not make (!)" if unmade else "")
            + (f"; {pending} not run yet" if pending else "")
        )

        def by_line(text: str) -> tuple[str, int]:
            path, rest = text.split(":", 1)
            return path, int(rest.split()[0])

        out.extend(sorted(survivors, key=by_line))
        out.extend(sorted(unmade, key=lambda text: by_line(text.removeprefix("    ! "))))
        out.extend(sorted(argued, key=lambda text: by_line(text.removeprefix("    = "))))
    return "\n".join(out) + "\n"


def held(name: str) -> Any:
    """The module's lock, taken (an open file: held until closed), or None when another run holds it."""
    BUILD.mkdir(parents=True, exist_ok=True)
    lock = (BUILD / f"{name}.lock").open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    return lock


def run_workers(args: argparse.Namespace, names: list[str]) -> None:
    """--jobs workers, each this script on all the modules (each takes those no one holds); SIGTERM or
    Ctrl-C is passed on to them, which end their test runs and remove their copies."""
    cmd = [sys.executable, __file__, "--worker", "--budget", str(args.budget), *names]
    workers = [subprocess.Popen(cmd) for _ in range(min(args.jobs, len(names)))]

    def pass_on(signum: int, frame: object) -> None:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, pass_on)
    signal.signal(signal.SIGINT, pass_on)
    codes = [worker.wait() for worker in workers]
    text = report(names)
    (BUILD / "report.txt").write_text(text)
    print(text, end="")
    if any(codes):
        sys.exit(f"mutate: a worker ended with {codes}")


def stop(signum: int, frame: object) -> None:
    """On SIGTERM or Ctrl-C: end the test run under way too (cosmic-ray starts it in a session of its own,
    out of reach of the terminal's signal), then leave through the cleanups (the copy is removed)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid, ppid = int(stat.parent.name), int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if ppid == os.getpid():
                os.killpg(pid, signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            continue
    sys.exit(f"mutate: stopped by signal {signum}; the sessions keep what was done")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("modules", nargs="*", help=f"of {', '.join(MODULES)} (default: all, in that order)")
    parser.add_argument(
        "--budget", type=float, default=4 * 3600, help="seconds for the whole run (default 4 h)"
    )
    parser.add_argument("--report", action="store_true", help="only print the report of the kept sessions")
    parser.add_argument(
        "--jobs", type=int, default=1, help="modules mutated at once, each on its own copy (default 1)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # one of --jobs' workers
    args = parser.parse_args()
    names = args.modules or list(MODULES)
    if unknown := set(names) - set(MODULES):
        parser.error(f"no such module: {', '.join(sorted(unknown))}")
    if args.report:
        print(report(names), end="")
        return
    if args.jobs > 1 and len(names) > 1:
        run_workers(args, names)
        return
    deadline = time.monotonic() + args.budget
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    with tempfile.TemporaryDirectory(prefix="ocrfleet-mutate-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        env = os.environ | {"PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
        imported = subprocess.run(
            # -P: no working folder on sys.path, as in the servers the tests start (bin/ocr-app).
            [sys.executable, "-P", "-c", "import ocr_app; print(ocr_app.__file__)"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if not imported.startswith(str(tree)):
            sys.exit(f"mutate: ocr_app imports from {imported}, not from the copy {tree}")
        os.environ.update(env)
        for name in names:
            lock = held(name)
            if lock is None:
                print(f"mutate: {name}: held by another run, left to it", flush=True)
                continue
            with lock:
                module = MODULES[name]
                took = baseline(module, tree, env)
                timeout = max(TIMEOUT_FACTOR * took, took + TIMEOUT_FLOOR_S)
                session = prepare(name, module, tree, env, timeout)
                print(f"mutate: {name}: baseline {took:.1f} s, each mutant up to {timeout:.0f} s", flush=True)
                if not execute(session, tree, timeout, deadline):
                    print(f"mutate: the budget ({args.budget:.0f} s) ran out in {name}", flush=True)
                    break
        reap(tree)
    if args.worker:
        return  # the report is the parent's, once every worker has ended
    text = report(names)
    (BUILD / "report.txt").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
