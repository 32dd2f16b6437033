"""Every step whose cost depends on the document, in worker processes that can be stopped.

Multipart parsing, type sniffing, PDF rendering, TIFF frame walks, image decode and resize run in a pebble
ProcessPool. Each worker has an address-space limit (RLIMIT_AS) and, per document, a CPU-time limit
(RLIMIT_CPU, re-armed for each task); the request's deadline cancels the task, and pebble then kills the
worker and starts another. PDFium renders inside C code that no flag can interrupt: a process is the unit
that can be stopped, and its memory is what a bound can hold.

Workers come from a forkserver that has imported the decoders once, so a replacement costs a fork, not
an interpreter start; the server process (engine threads, event loop) is never forked. A page comes back
as a file of raw BGR pixels (OpenCV's layout, what rapidocr reads) in a directory of the pool's on tmpfs
(/dev/shm), mapped privately by the server and unlinked: the mapping is the page's array, with no copy
(through pebble's pipe the same 5 MB page took 18 ms, as a file copied once 4.8; measured, 1540x1155).
"""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import logging
import mmap
import multiprocessing
import os
import resource
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import cv2
import numpy as np
from pebble import ProcessExpired, ProcessPool
from PIL import Image

from ..config import MiB, Settings
from ..errors import DecodeCpuLimit, DecodeMemoryLimit, InvalidDocument, NotReady, OcrError
from ..sched import to_job_priority
from .image import Limits, PageImage
from .pages import count_pages, load_pages
from .upload import MULTIPART_TYPE, classify, extract_multipart_file, normalise_media_type

log = logging.getLogger("ocr_app.decode")
T = TypeVar("T")
# mutation: NumberReplacer equivalent because the worker's exit and the parent's check read this one name.
OUT_OF_MEMORY_EXIT = 3  # a worker's exit status after a MemoryError
# mutation: NumberReplacer equivalent because another parameter (or one glibc does not know, which it
# ignores) changes how soon freed memory goes back to the kernel: speed (make bench), not what a worker
# decodes or may hold (RLIMIT_AS bounds that either way). # mutation: ReplaceUnaryOperator likewise.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt(3)'s parameters, from glibc's malloc.h
# Pillow imports its format plugins on first use: here, once in the forkserver, not in each new worker.
Image.init()


# mutation: ReplaceTrueWithFalse equivalent because nothing assigns to the bounds' fields.
@dataclass(frozen=True)
class DecodeBounds:
    cpu_s: int  # CPU seconds per document
    memory_mb: int  # address space per worker process


# mutation: ReplaceTrueWithFalse equivalent because nothing assigns to a request's fields.
@dataclass(frozen=True)
class DecodeRequest:
    """One document as the client sent it, and what of it to decode: what crosses to a worker."""

    body: bytes
    content_type: str  # the header as sent: a multipart body's boundary is in it
    selection: list[int] | None = None  # 1-based pages; None: every page
    preview: bool = False  # each page's image as a JPEG data URL too

    @property
    def media_type(self) -> str:
        return normalise_media_type(self.content_type)


PAGE_DIR_PREFIX = "ocr-app-pages-"  # + the server's pid + "-": a dead server's directory is known by its pid


# mutation: ReplaceTrueWithFalse equivalent because nothing assigns to a page's fields.
@dataclass(frozen=True)
class _Page:
    """A page as it crosses the process boundary: its pixels' file (raw BGR, OpenCV's layout) and sizes."""

    number: int
    width: int
    height: int
    size: tuple[int, int]
    path: str
    preview: str | None

    def to_page_image(self) -> PageImage:
        """In the server: the file mapped as the page's array and removed (its memory lives as long as the
        array). No copy: the mapping is private (an engine that writes to it writes its own pages) and
        populated at once (no page faults later, in the engine)."""
        with open(self.path, "rb") as f:
            pixels = mmap.mmap(
                f.fileno(),
                0,
                flags=mmap.MAP_PRIVATE | mmap.MAP_POPULATE,
                prot=mmap.PROT_READ | mmap.PROT_WRITE,
            )
        os.unlink(self.path)
        width, height = self.size
        bgr = np.frombuffer(pixels, np.uint8).reshape(height, width, 3)
        return PageImage(self.number, None, self.width, self.height, self.preview, bgr)  # type: ignore[arg-type]


def _write_page(path: str, page: PageImage) -> None:
    """The page's pixels into the file `path`, in OpenCV's layout (BGR): an array as it is, an image
    packed so by Pillow as it writes."""
    with open(path, "xb") as f:
        f.write(page.image.tobytes("raw", "BGR") if page.bgr is None else page.bgr.data)


def _page_dir() -> str:
    """A directory of this server's for pages in flight, on tmpfs where there is one; directories of
    servers that are gone (killed before they could remove theirs) are removed first."""
    # mkdtemp: a directory of mode 0700 that nobody else can have made; /dev/shm's sticky bit keeps the
    # sweep below to our own user's.
    shm = "/dev/shm"  # noqa: S108
    root = shm if os.access(shm, os.W_OK | os.X_OK) else tempfile.gettempdir()
    with suppress(OSError):
        for name in os.listdir(root):
            # mutation: NumberReplacer to `split("-", 2)` equivalent because the first part is the same.
            pid = name.removeprefix(PAGE_DIR_PREFIX).split("-", 1)[0]
            if name.startswith(PAGE_DIR_PREFIX) and pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{PAGE_DIR_PREFIX}{os.getpid()}-", dir=root)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        pass
    return True


def _init_worker(memory_mb: int, idle: bool) -> None:
    # pebble stops a worker with SIGTERM and a Python handler, which cannot run while PDFium is inside a
    # render; the default action ends it at once. The parent holds the pool's channel lock while it kills.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # mutation: NumberReplacer equivalent because the soft limit, 0, is what keeps the core file from being
    # written; the hard one only caps how far the process may raise it.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGXCPU would otherwise dump core
    # Under the unit's MemoryMax the kernel kills the cgroup's likeliest process: a worker, not the server.
    with suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
    _keep_freed_memory()
    # Bulk-job pages: next to no CPU time an interactive request's decode or page wants. Before OpenCV starts
    # its threads below, which inherit the priority (after it, its resize thread stayed at normal priority).
    if idle and (why := to_job_priority()):
        log.warning("job decode worker runs at normal CPU priority: %s", why)
    # OpenCV's resize on two threads: 2.1 ms where one takes 3.8-5.2 (measured), while a worker is alone
    # on the host; its threads start here, so their stacks and malloc arenas count as the libraries below.
    cv2.setNumThreads(2)  # mutation: NumberReplacer equivalent because the thread count is speed only.
    # mutation: NumberReplacer equivalent because any resize of this order starts OpenCV's threads, all
    # it is here for.
    cv2.resize(np.zeros((1024, 1024, 3), np.uint8), (512, 512), interpolation=cv2.INTER_LINEAR)
    # The bound is what a document may add: the libraries a worker starts with mapped (OpenCV's and
    # numpy's alone are ~400 MB of address space, and more on hosts with more cores) are not its cost.
    limit = _address_space() + memory_mb * MiB
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _keep_freed_memory() -> None:
    """glibc gives a freed block of a page's size (1-32 MB) back to the kernel at once, so each document's
    buffers are fresh pages again: ~5 000 page faults for a 12 MP JPEG, 7-12 ms of it (measured). A worker
    keeps them for the next document instead (up to M_TRIM_THRESHOLD free at the heap's top); RLIMIT_AS
    still bounds what it holds."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: its own allocator's defaults
        return
    # mutation: NumberReplacer equivalent because a threshold a MiB off changes speed only (as above).
    libc.mallopt(M_MMAP_THRESHOLD, 32 * MiB)  # glibc's upper bound on 64-bit; larger blocks are mmap()ed
    libc.mallopt(M_TRIM_THRESHOLD, 128 * MiB)  # mutation: NumberReplacer equivalent because speed only.


def _address_space() -> int:
    """This process' mapped address space (VmSize), in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))


def _cpu_used_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _set_cpu_soft_limit(seconds: int | None) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY if seconds is None else seconds, hard))


def decode_document(request: DecodeRequest, limits: Limits, cpu_s: int, pages_at: str) -> list[_Page]:
    """In a worker: the body as the client sent it -> its pages, each page's pixels in the file
    `pages_at`-N. RLIMIT_CPU counts the process' lifetime, so the limit is re-armed from what this worker
    has used so far."""
    _set_cpu_soft_limit(int(_cpu_used_s()) + 1 + cpu_s)
    try:
        body, media_type = request.body, request.media_type
        if media_type == MULTIPART_TYPE:
            body, media_type = extract_multipart_file(body, request.content_type)
        media_type = classify(body, media_type)
        # mutation: ReplaceTrueWithFalse equivalent because _write_page packs an image's pixels in the same
        # BGR layout as the array: the same file, written a little slower.
        pages = load_pages(body, media_type, request.selection, limits, request.preview, bgr=True)
        out = []
        for p in pages:
            path = f"{pages_at}-{p.number}"
            _write_page(path, p)
            out.append(_Page(p.number, p.width, p.height, p.size, path, p.preview))
            p.image = p.bgr = None  # type: ignore[assignment]  # one copy of each page at a time: less peak memory
        return out
    except MemoryError:
        _exit_out_of_memory()
    finally:
        _set_cpu_soft_limit(None)  # never SIGXCPU while pebble sends the result (it holds a lock then)


def count_document_pages(request: DecodeRequest, bound: int, cpu_s: int) -> tuple[int, str]:
    """In a worker: the page count of the document (at most `bound`) and its sha256 (a multipart body's file,
    so that the same document sent twice has one fingerprint whatever its boundary)."""
    _set_cpu_soft_limit(int(_cpu_used_s()) + 1 + cpu_s)
    try:
        body, media_type = request.body, request.media_type
        if media_type == MULTIPART_TYPE:
            body, media_type = extract_multipart_file(body, request.content_type)
        count = count_pages(body, classify(body, media_type), bound)
        return count, hashlib.sha256(body).hexdigest()
    except MemoryError:
        _exit_out_of_memory()
    finally:
        _set_cpu_soft_limit(None)


def _exit_out_of_memory() -> NoReturn:
    """The worker ends: what it freed stays mapped in its heap, under RLIMIT_AS, and the next document
    would find its bound taken. The parent answers DecodeMemoryLimit (ProcessExpired with this code) and
    starts another."""
    os._exit(OUT_OF_MEMORY_EXIT)


def _probe() -> int:
    """In a worker: nothing; that it comes back is the answer (HealthMonitor)."""
    return os.getpid()


def _killed_by_backstop(future: Future[Any]) -> bool:
    return future.done() and not future.cancelled() and isinstance(future.exception(), TimeoutError)


class DecodePool:
    def __init__(
        self,
        workers: int,
        bounds: DecodeBounds,
        limits: Limits,
        on_killed: Callable[[str], None] | None,
        idle: bool,
    ):
        self.workers = workers
        self.idle = idle  # workers at nice 19 (the bulk-job pages' pool)
        self.bounds = bounds
        self.limits = limits
        # Told the reason each time a worker is stopped (and replaced): shows that abandoned work stops.
        self.on_killed = on_killed or (lambda reason: None)
        self._page_dir = _page_dir()
        self._decoding: set[str] = set()  # the tokens (page file prefixes) of the decodes in flight
        self._pool = self._new_pool()

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        on_killed: Callable[[str], None] | None = None,
        workers: int | None = None,
        idle: bool = False,
    ) -> DecodePool:
        return cls(
            workers or settings.preprocess_workers,
            DecodeBounds(settings.decode_cpu_s, settings.decode_memory_mb),
            Limits.from_settings(settings),
            on_killed,
            idle,
        )

    def _new_pool(self) -> ProcessPool:
        ctx = multiprocessing.get_context("forkserver")
        # The decoders are imported once in the forkserver; each worker is a fork of it.
        ctx.set_forkserver_preload(["__main__", "ocr_app.documents.decode"])
        return ProcessPool(
            max_workers=self.workers,
            initializer=_init_worker,
            initargs=(self.bounds.memory_mb, self.idle),
            context=ctx,
        )

    def start(self) -> None:
        """Start the forkserver and the workers (seconds: interpreters importing the decoders); blocking,
        so called off the event loop before the service says ready. pebble would otherwise do it lazily on
        the first request, on the loop."""
        if not self._pool.active:
            raise RuntimeError("the decode pool did not start")

    def _running_pool(self) -> ProcessPool:
        if not self._pool.active:  # pebble gives a pool up when a worker dies while none has a task
            log.error("decode pool broken; starting a new one")
            self._pool.stop()
            self._pool = self._new_pool()
        return self._pool

    def probe(self) -> Future[int]:
        """A no-op task behind whatever the workers are doing; restarts a broken pool as decode() does."""
        return self._running_pool().schedule(_probe)

    async def decode(self, request: DecodeRequest, deadline_s: float) -> list[PageImage]:
        """The pages; at `deadline_s` (time.monotonic()) or when cancelled, its worker is killed."""
        self._remove_stray_pages()
        token = uuid.uuid4().hex
        self._decoding.add(token)
        try:
            args = (request, self.limits, self.bounds.cpu_s, os.path.join(self._page_dir, token))
            pages = await self._run(decode_document, args, deadline_s)
            # Off the event loop: a 50-page PDF is 50 copies of up to 9 MB.
            return await asyncio.to_thread(lambda: [p.to_page_image() for p in pages])
        finally:
            self._decoding.discard(token)

    def _remove_stray_pages(self) -> None:
        """Page files of no decode in flight: a worker killed at a deadline (its files stop with it), or
        pages not read because the request had gone. On tmpfs they would hold memory until a restart."""
        with suppress(FileNotFoundError):
            for name in os.listdir(self._page_dir):
                # mutation: NumberReplacer to `split("-", 2)` equivalent because the first part is the same.
                if name.split("-", 1)[0] not in self._decoding:
                    with suppress(FileNotFoundError):
                        os.unlink(os.path.join(self._page_dir, name))

    async def count_pages(self, request: DecodeRequest, bound: int, deadline_s: float) -> tuple[int, str]:
        """The document's page count (at most `bound`) and sha256, in a worker bound as decode() is."""
        return await self._run(count_document_pages, (request, bound, self.bounds.cpu_s), deadline_s)

    async def _run(self, fn: Callable[..., T], args: tuple[Any, ...], deadline_s: float) -> T:
        future = self._running_pool().schedule(
            fn,
            args=args,
            # A backstop to the caller's asyncio deadline: pebble times a task from its start. The floor keeps
            # the timeout off 0, which pebble reads as none.
            # mutation: NumberReplacer equivalent because the floor (1.1 or -0.9 for 0.1) acts only on a
            # deadline under a second away, where the caller's deadline ends the task at the same moment.
            timeout=max(0.1, deadline_s - time.monotonic()),
        )
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError as err:  # the request's deadline, or its client left (the reason)
            # pebble kills the worker running it and starts another; or its backstop, timed from the same
            # deadline, has just done so.
            if future.cancel() or _killed_by_backstop(future):
                # mutation: NumberReplacer to `args[ -1]` equivalent because a cancellation has one reason.
                self.on_killed(str(err.args[0]) if err.args else "deadline")  # asyncio.timeout gives none
            raise
        except TimeoutError:  # pebble's backstop fired first; the caller answers 504
            self.on_killed("deadline")
            raise
        except ProcessExpired as err:
            reason, error = self._expired(err)
            self.on_killed(reason)
            raise error from None
        except BrokenProcessPool:
            raise NotReady("decode pool restarting") from None

    def _expired(self, err: ProcessExpired) -> tuple[str, OcrError]:
        if err.exitcode == -signal.SIGXCPU:
            return "cpu_limit", DecodeCpuLimit(
                f"decoding the document took more than {self.bounds.cpu_s} s of CPU (decode_cpu_s)"
            )
        # SIGKILL: the kernel's OOM killer, or a cgroup limit. OUT_OF_MEMORY_EXIT: Python's MemoryError
        # under RLIMIT_AS (the worker ends itself). SIGABRT: PDFium's allocator (and C++'s
        # std::bad_alloc) abort the process when RLIMIT_AS refuses memory; a Flate bomb in a PDF stream.
        if err.exitcode in (-signal.SIGKILL, -signal.SIGABRT, OUT_OF_MEMORY_EXIT):
            return "memory_limit", DecodeMemoryLimit(
                "decoding the document needed more memory than a worker may use (decode_memory_mb)"
            )
        return "crashed", InvalidDocument(f"the decoder crashed on this document (exit {err.exitcode})")

    def close(self) -> None:
        self._pool.stop()
        # mutation: NumberReplacer equivalent because it bounds a wait for workers that the stop has ended.
        self._pool.join(timeout=5)
        shutil.rmtree(self._page_dir, ignore_errors=True)
