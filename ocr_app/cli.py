"""ocr-app: serve | check | keys | manifest | verify | rapidocr-models | ocr | eval | jobs | db."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from . import __version__
from .config import ConfigError, Settings, load_settings
from .fleet.jobclient import EXTENSIONS
from .manifest import build_manifest, read_manifest, verify_manifest

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("ocr_app.cli")


def _settings(args: argparse.Namespace, **overrides: object) -> Settings:
    return load_settings(args.config, **{k: v for k, v in overrides.items() if v is not None})


def cmd_serve(args: argparse.Namespace) -> int:
    from .http.serve import Service
    from .logs import setup_logging

    settings = _settings(args, host=args.host, port=args.port)
    setup_logging(settings.log_level)
    service = Service(settings)
    log.info(
        "starting",
        extra={
            "version": __version__,
            "host": settings.host,
            "port": settings.port,
            "engine": settings.engine,
        },
    )
    return service.run()


def cmd_check(args: argparse.Namespace) -> int:
    """Validate the configuration, the model files and what the engine needs; then load the engine and
    OCR the built-in sample, unless the engine claims a device (vLLM: a share of the GPU) and --load is
    not given: a release is checked while the running one holds that device, and a second claim fails.
    `serve` always loads and self-tests before it reports ready."""
    from .auth import KeyStore
    from .engines import create_engine
    from .engines.base import EngineError

    settings = _settings(args)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if settings.api_keys_file is not None:
        keys = KeyStore(settings.api_keys_file)
        print(f"api keys: {len(keys)} in {settings.api_keys_file}")
    if settings.model_path is not None:
        manifest = settings.model_path / ".manifest.json"  # stored with each revision by the ocr_model role
        if manifest.is_file():
            problems = verify_manifest(settings.model_path, read_manifest(manifest))
            if problems:
                raise EngineError(f"model files do not match {manifest}: {'; '.join(problems)}")
            print(f"model: {settings.model_path} matches {manifest}")
    engine = create_engine(settings)
    full = args.load or not engine.claims_device

    async def run() -> None:
        try:
            for line in await engine.preflight():
                print(line)
            if full:
                await engine.load()
                await engine.self_test()
        finally:
            await engine.close()

    asyncio.run(run())
    if full:
        print(f"ok: engine {engine.name} ({engine.model}) on {engine.device} passed its self-test")
    else:
        print(
            f"ok: engine {engine.name} ({engine.model}) on {engine.device} passed its preflight; not loaded, "
            "as a running instance may hold the device (--load loads it and OCRs the sample)"
        )
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    from .auth import add_key, parse_key_file, remove_key

    path = Path(args.file)
    if args.keys_cmd == "add":
        key = add_key(path, args.name)
        print(f"added key {args.name!r} to {path}; it is shown once, store it now:", file=sys.stderr)
        print(key)
    elif args.keys_cmd == "remove":
        remove_key(path, args.name)
        print(f"removed key {args.name!r} from {path}")
    else:
        for name, _ in parse_key_file(path.read_text(), str(path)):
            print(name)
    return 0


def cmd_manifest(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    if not root.is_dir():
        raise ConfigError(f"{root} is not a directory")
    text = json.dumps(build_manifest(root), indent=2) + "\n"
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    manifest = read_manifest(args.manifest)
    problems = verify_manifest(Path(args.dir), manifest)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"FAILED: {len(problems)} of {len(manifest['files'])} files do not match", file=sys.stderr)
        return 1
    print(f"ok: {len(manifest['files'])} files match")
    return 0


def cmd_rapidocr_models(args: argparse.Namespace) -> int:
    """The CPU engine's models as a model revision, from the installed rapidocr wheel (no network)."""
    from .engines.rapidocr.revision import export_wheel_models

    out = Path(args.dir)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} is not empty: a revision is written once (give a new directory)")
    files = export_wheel_models(out)
    print(f"wrote {', '.join(p.name for p in files)} to {out}")
    if args.manifest:
        Path(args.manifest).write_text(json.dumps(build_manifest(out), indent=2) + "\n")
        print(f"manifest: {args.manifest}")
    return 0


def _client(args: argparse.Namespace) -> httpx.Client:
    """An HTTP client of a running service, from the options _client_options() adds."""
    import httpx

    key = args.key or os.environ.get("OCR_APP_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    verify: bool | str = args.cacert or not args.insecure
    return httpx.Client(base_url=args.url, headers=headers, verify=verify, timeout=args.timeout)


def cmd_ocr(args: argparse.Namespace) -> int:
    from .documents.upload import sniff

    if Path(args.file).is_dir():
        return _ocr_folder(args)
    data = Path(args.file).read_bytes()
    headers = {"Content-Type": sniff(data) or "application/octet-stream"}
    params = {"pages": args.pages} if args.pages else {}
    if args.format:
        params["format"] = args.format
    with _client(args) as client:
        resp = client.post("/v1/ocr", content=data, headers=headers, params=params or None)
    if args.format and resp.status_code == 200:
        if args.output and args.output != "-":
            Path(args.output).write_bytes(resp.content)
        else:
            sys.stdout.buffer.write(resp.content)
            sys.stdout.buffer.flush()
        return 0
    try:
        body = resp.json()
    except ValueError:
        print(f"error: HTTP {resp.status_code}: {resp.text[:200]}", file=sys.stderr)
        return 1
    if resp.status_code != 200:
        err = body.get("error", {})
        print(f"error: HTTP {resp.status_code} {err.get('code')}: {err.get('message')}", file=sys.stderr)
        return 1
    text = (
        json.dumps(body, indent=2, ensure_ascii=False) + "\n"
        if args.json
        else "".join(
            (f"--- page {page['page']} ---\n" if len(body["pages"]) > 1 else "") + page["text"] + "\n"
            for page in body["pages"]
        )
    )
    if args.output and args.output != "-":
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def _ocr_folder(args: argparse.Namespace) -> int:
    """Each document of the folder through POST /v1/ocr, its answer into -o DIR (<path><extension>)."""
    from .fleet.submission import gather

    if not args.output:
        raise ConfigError("a folder: give -o DIR (one answer file per document)")
    out_dir = Path(args.output)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"-o {out_dir}: not a directory (a folder: one answer file per document)")
    fmt = args.format or "json"
    docs, skipped, _ = gather([args.file])
    for source, why in skipped:
        print(f"skipped {source}: {why}", file=sys.stderr)
    params = {"format": fmt, **({"pages": args.pages} if args.pages else {})}
    failed = 0
    with _client(args) as client:
        for doc in docs:
            assert doc.path is not None
            headers = {"Content-Type": doc.content_type}
            resp = client.post("/v1/ocr", content=doc.path.read_bytes(), headers=headers, params=params)
            if resp.status_code != 200:
                try:
                    err = resp.json().get("error", {})
                    why = f"{err.get('code')}: {err.get('message')}"
                except ValueError:
                    why = resp.text[:200]
                print(f"error: {doc.source}: HTTP {resp.status_code} {why}", file=sys.stderr)
                failed += 1
                continue
            target = out_dir / f"{doc.name}{EXTENSIONS[fmt]}"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(resp.content)
            print(f"{doc.source} -> {target}", file=sys.stderr)
    print(f"{len(docs) - failed} of {len(docs)} document(s) read", file=sys.stderr)
    return 1 if failed else 0


def cmd_eval(args: argparse.Namespace) -> int:
    """An evaluation set read by a running service: CER and latency, optionally gated against a baseline."""
    from .fleet import evaluation as ev

    if args.repeat < 1:
        raise ConfigError("--repeat: at least 1")
    docs = ev.load_set(Path(args.dir))
    baseline = None
    if args.baseline:
        try:
            baseline = json.loads(Path(args.baseline).read_text())
            float(baseline["cer"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"{args.baseline}: not a report of `ocr-app eval --output` ({err})") from None
    with _client(args) as client:
        report = ev.evaluate(client, docs, repeat=args.repeat, route=args.route)
    report["url"] = args.url
    margins = ev.Margins(args.max_cer_increase, args.max_latency_ratio)
    worse = ev.judge(report, baseline, margins, args.max_cer)
    report["worse"] = worse
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(report, indent=2, ensure_ascii=False) if args.json else ev.format_report(report))
    for reason in worse:
        print(f"ocr-app eval: worse: {reason}", file=sys.stderr)
    return 1 if worse else 0


def cmd_jobs(args: argparse.Namespace) -> int:
    """Bulk jobs through a running service: submit (and follow), status, result, cancel, list, wait."""
    from .fleet import jobclient

    return jobclient.run(args, _client)


def cmd_db(args: argparse.Namespace) -> int:
    """The job database's schema: `status` (exit 1 while behind this release), `upgrade`."""
    import psycopg

    from .jobs import schema

    settings = _settings(args)
    if not settings.database_url:
        raise ConfigError("database_url is not set (env OCR_APP_DATABASE_URL): there is no job database")
    try:
        with psycopg.connect(settings.database_url, autocommit=True, connect_timeout=10) as conn:
            if args.db_cmd == "upgrade":
                applied = schema.upgrade(conn)
                print(f"applied {applied}" if applied else "nothing to apply", end="; ")
            at = schema.status(conn)
    except psycopg.Error as err:  # its message names the host, never the password
        print(f"ocr-app: job database: {err}", file=sys.stderr)
        return 1
    verdict = "current" if at >= schema.LATEST else "BEHIND"
    print(f"schema version {at}, this release needs {schema.LATEST}: {verdict}")
    return 0 if at >= schema.LATEST else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ocr-app", description=__doc__)
    p.add_argument("--version", action="version", version=f"ocr-app {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)

    def with_config(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument("--config", "-c", help="YAML settings file (env OCR_APP_CONFIG); env OCR_APP_* wins")
        return sp

    s = with_config(sub.add_parser("serve", help="run the HTTP service"))
    s.add_argument("--host")
    s.add_argument("--port", type=int)
    s.set_defaults(func=cmd_serve)

    s = with_config(sub.add_parser("check", help="validate config, model and engine before a switch"))
    s.add_argument(
        "--load",
        action="store_true",
        help="load the engine and OCR a sample even if it claims a device (vllm): for a host serving nothing",
    )
    s.set_defaults(func=cmd_check)

    keys = sub.add_parser("keys", help="manage API keys (stored as sha256 hashes)")
    ksub = keys.add_subparsers(dest="keys_cmd", required=True)
    for name, helptext in (("add", "add a new random key; prints it as the last line"), ("remove", "remove")):
        k = ksub.add_parser(name, help=helptext)
        k.add_argument("name")
        k.add_argument("--file", "-f", required=True)
    ksub.add_parser("list", help="list key names").add_argument("--file", "-f", required=True)
    keys.set_defaults(func=cmd_keys)

    s = sub.add_parser("manifest", help="sha256 manifest of a model directory, as JSON")
    s.add_argument("dir")
    s.add_argument("--output", "-o")
    s.set_defaults(func=cmd_manifest)

    s = sub.add_parser("verify", help="check a model directory against a manifest")
    s.add_argument("dir")
    s.add_argument("manifest")
    s.set_defaults(func=cmd_verify)

    s = sub.add_parser(
        "rapidocr-models", help="write the rapidocr wheel's models into DIR as a model revision (model_path)"
    )
    s.add_argument("dir")
    s.add_argument("--manifest", "-m", help="also write DIR's manifest (as `ocr-app manifest DIR -o`) here")
    s.set_defaults(func=cmd_rapidocr_models)

    def client_options(sp: argparse.ArgumentParser, timeout: bool = True) -> argparse.ArgumentParser:
        sp.add_argument(
            "--url",
            default=os.environ.get("OCR_APP_URL", "http://127.0.0.1:8000"),
            help="the service (env OCR_APP_URL; default http://127.0.0.1:8000)",
        )
        sp.add_argument("--key", help="API key (default: env OCR_APP_KEY)")
        sp.add_argument(
            "--cacert",
            "--ca-file",
            default=os.environ.get("OCR_APP_CA_FILE"),
            help="CA bundle to verify the server's certificate, e.g. a private CA (env OCR_APP_CA_FILE)",
        )
        sp.add_argument("--insecure", action="store_true", help="do not verify TLS certificates")
        if timeout:
            sp.add_argument("--timeout", type=float, default=120.0, help="seconds per request (120)")
        else:
            sp.set_defaults(timeout=120.0)
        return sp

    s = client_options(
        sub.add_parser(
            "ocr",
            help="OCR a file (or a folder's documents) through a running service",
            description="A file: its text is printed (--json: the whole JSON answer; --format: the answer "
            "in that format, to stdout or -o FILE). A folder (walked recursively; what is not a document of "
            "an accepted type is skipped, listed on stderr): one answer per document, in --format (json "
            "unless given), into -o DIR as DIR/<its path under the folder> plus the format's extension "
            "(.json, .txt, .md, .hocr, .xml for alto, .pdf).",
        )
    )
    s.add_argument("file", help="a file or a folder")
    s.add_argument("--pages", help="PDF/TIFF pages, e.g. 1-3,5")
    s.add_argument("--json", action="store_true", help="print the whole JSON response")
    s.add_argument(
        "--format", choices=list(EXTENSIONS), help="the answer in this format (POST /v1/ocr?format=)"
    )
    s.add_argument("--output", "-o", help="write the answer here (a folder: the directory of the answers)")
    s.set_defaults(func=cmd_ocr)

    s = client_options(
        sub.add_parser(
            "eval",
            help="read an evaluation set (documents + <stem>.txt) through a running service: CER, latency; "
            "exit 1 when worse than --baseline by more than the margins, or than --max-cer",
        )
    )
    s.add_argument("dir")
    s.add_argument("--repeat", type=int, default=1, help="requests per document (more latency samples)")
    s.add_argument(
        "--route",
        choices=("ocr", "chat"),  # evaluation.ROUTES (imported when eval runs)
        default="ocr",
        help="ocr: POST /v1/ocr; chat: POST /v1/chat/completions (OpenAI's chat API), the Markdown as text",
    )
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s.add_argument("--output", "-o", help="also write the report as JSON here (a later run's --baseline)")
    s.add_argument("--baseline", help="a report of the version to compare with (its --output)")
    s.add_argument(
        "--max-cer-increase", type=float, default=1.0, help="points of CER above the baseline's allowed (1.0)"
    )
    s.add_argument(
        "--max-latency-ratio", type=float, default=1.5, help="median latency allowed, x the baseline's (1.5)"
    )
    s.add_argument("--max-cer", type=float, help="CER allowed, in percent, whatever the baseline")
    s.set_defaults(func=cmd_eval)

    jobs = sub.add_parser(
        "jobs",
        help="bulk jobs through a running service: submit [--follow], status, result, cancel, list, wait",
        description="Bulk jobs (/v1/jobs) through a running service. Pages are written as JSON Lines, one "
        "page per line in page order (a page not read: {page, error}). Exit 0: the job is done with every "
        "page read; 1: the server's error (its message and request id) or the network's, or a job that "
        "ended cancelled, failed or with a page not read; 2: a usage error.",
    )
    jsub = jobs.add_subparsers(dest="jobs_cmd", required=True)

    def following(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument(
            "--output",
            "-o",
            help="write the pages (JSON Lines) here instead of stdout; several documents with --follow: a "
            "directory, one DIR/<path>.jsonl each",
        )
        sp.add_argument(
            "--format",
            choices=list(EXTENSIONS),
            help="the result in this format (GET /v1/jobs/{id}/result?format=) instead of JSON Lines, once "
            "the job is finished; several documents: DIR/<path> plus the format's extension (.json, .txt, "
            ".md, .hocr, .xml for alto, .pdf)",
        )
        sp.add_argument(
            "--retries",
            type=int,
            default=5,
            help="--follow: times the event stream is opened again without a page in between (5)",
        )
        return sp

    s = following(
        client_options(
            jsub.add_parser(
                "submit",
                help="submit documents as jobs; prints each one's id (with --follow: writes their pages)",
                description="Submit each document as a job: files, folders (walked recursively; what is not "
                "a document of an accepted type is skipped, listed on stderr), - (stdin) and http(s) URLs "
                "(the server fetches them). Prints the job's id; for several documents one `JOB_ID<TAB>"
                "SOURCE` line each. Within the key's max_jobs_in_flight: the rest wait for a job to finish.",
            )
        )
    )
    s.add_argument("files", nargs="+", metavar="FILE", help="a file, a folder, - (stdin) or an http(s) URL")
    s.add_argument("--pages", help="PDF/TIFF pages, e.g. 1-3,7")
    s.add_argument("--idempotency-key", help="the same key and document return the same job, not a new one")
    s.add_argument(
        "--webhook-url",
        help="the service POSTs job.finished here when the job ends (signed; under the server's "
        "job_webhook_allowed_urls)",
    )
    s.add_argument(
        "--follow", "-f", action="store_true", help="wait, showing progress on stderr; write the pages"
    )
    s = client_options(jsub.add_parser("status", help="a job's status, as JSON"))
    s.add_argument("job_id")
    s = following(
        client_options(
            jsub.add_parser("result", help="a finished job's pages (with --follow: as they are read)")
        )
    )
    s.add_argument("job_id")
    s.add_argument(
        "--follow", "-f", action="store_true", help="wait for an unfinished job, showing progress on stderr"
    )
    s = client_options(jsub.add_parser("cancel", help="cancel a job: its pages not yet started are not run"))
    s.add_argument("job_id")
    s = client_options(jsub.add_parser("list", help="this key's jobs, newest first: a table, or --json"))
    s.add_argument(
        "--status",
        action="append",
        choices=("queued", "running", "done", "failed", "cancelled"),
        help="repeatable",
    )
    s.add_argument("--limit", type=int, default=20, help="jobs per page, 1 to 100 (20)")
    s.add_argument("--all", action="store_true", help="every page of them (follows next_cursor)")
    s.add_argument("--json", action="store_true", help="as the API's JSON")
    s = client_options(
        jsub.add_parser(
            "wait", help="until each job is finished; exit 0 when all are done with every page read"
        ),
        timeout=False,
    )
    s.add_argument("job_ids", nargs="+", metavar="JOB")
    s.add_argument("--timeout", dest="timeout_s", type=float, help="give up after this many seconds (exit 1)")
    jobs.set_defaults(func=cmd_jobs)

    db = sub.add_parser("db", help="the job database's schema (database_url)")
    dsub = db.add_subparsers(dest="db_cmd", required=True)
    with_config(dsub.add_parser("status", help="the schema's version; exit 1 while behind this release"))
    with_config(dsub.add_parser("upgrade", help="apply the migrations this release needs (idempotent)"))
    db.set_defaults(func=cmd_db)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status: int = args.func(args)
        return status
    except ConfigError as err:
        print(f"ocr-app: {err}", file=sys.stderr)
        return 2
    except Exception as err:
        from .auth import KeyFileError
        from .engines.base import EngineError

        if isinstance(err, (KeyFileError, EngineError, OSError)):
            print(f"ocr-app: {err}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
