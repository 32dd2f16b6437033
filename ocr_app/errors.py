"""What went wrong, as what it is: a document too large or malformed, a parameter out of range, an instance
too busy, a job that is not there. Raised where it is found (the decode workers, the pipeline, the job store)
by code that knows nothing of HTTP.

Each error has a stable machine-readable `code` (what clients match on) and a message for people. How a
protocol reports one is decided in one place: ocr_app/http/errors.py maps each class to its HTTP status and
the API's JSON error body; a bulk job's page that fails keeps its code and message.
"""

from __future__ import annotations

from typing import ClassVar


class OcrError(Exception):
    """An error the service answers with. `retry_after_s`: when asking again may succeed (a busy instance)."""

    code: ClassVar[str] = "internal_error"
    # The request field at fault, where one is (the chat route names it, as OpenAI's API does).
    param: str | None = None

    def __init__(self, message: str, *, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s

    def __reduce__(self) -> tuple[object, ...]:
        # Raised in decode workers and pickled back to the server: rebuilt whatever its constructor takes.
        return (_rebuilt, (type(self), self.message, self.retry_after_s))


def _rebuilt(cls: type[OcrError], message: str, retry_after_s: int | None) -> OcrError:
    err = cls.__new__(cls)
    OcrError.__init__(err, message, retry_after_s=retry_after_s)
    return err


# --- the request and its document -----------------------------------------------------------------------


class InvalidParameter(OcrError):
    """A parameter, a header or the body's framing out of what the API accepts."""

    code = "invalid_parameter"


class InvalidRequest(InvalidParameter):
    """A field of an OpenAI-style request (POST /v1/chat/completions) out of what the route takes: a 400, as
    OpenAI's API answers it, naming the field (`param`)."""

    code = "invalid_parameter"

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class UnsupportedOption(InvalidRequest):
    """An option of OpenAI's chat API that this service does not offer (n > 1, tools, logprobs, ...)."""

    code = "unsupported_option"


class UnsupportedMediaType(OcrError):
    code = "unsupported_media_type"


class FormatUnavailable(InvalidParameter):
    """A result format the API names but this release does not build (none now: formats.UNAVAILABLE)."""

    code = "format_unavailable"


class NotAcceptable(OcrError):
    """An Accept header that allows none of the formats the route answers with."""

    code = "not_acceptable"


class InvalidDocument(OcrError):
    """A document that cannot be read: undecodable, truncated, malformed, or one its decoder crashed on."""

    code = "invalid_image"


class TooLarge(OcrError):
    """A document beyond a bound: its bytes, pixels, pages, or what decoding it costs."""

    code = "payload_too_large"


class PayloadTooLarge(TooLarge):
    code = "payload_too_large"


class ImageTooLarge(TooLarge):
    code = "image_too_large"


class TooManyPages(TooLarge):
    code = "too_many_pages"


class DecodeCpuLimit(TooLarge):
    code = "decode_cpu_limit"


class DecodeMemoryLimit(TooLarge):
    code = "decode_memory_limit"


# --- the caller -------------------------------------------------------------------------------------------


class Unauthorized(OcrError):
    """A missing or unknown API key."""

    code = "unauthorized"


class ClientGone(OcrError):
    """The client closed the connection: its work was stopped, and nobody reads the answer."""

    code = "client_closed_request"

    def __init__(self) -> None:
        super().__init__("the client closed the connection; its work was stopped")


# --- this instance ----------------------------------------------------------------------------------------


class Unavailable(OcrError):
    """This instance's trouble, not the request's: another try (here later, or elsewhere) may succeed."""

    code = "unavailable"


class Overloaded(Unavailable):
    code = "overloaded"

    def __init__(self, retry_after_s: int) -> None:
        super().__init__("server is at capacity; retry later", retry_after_s=retry_after_s)


class NotReady(Unavailable):
    """The engine is loading, unhealthy, or its decode pool is restarting (`status` says which)."""

    code = "not_ready"

    def __init__(self, status: str) -> None:
        super().__init__(f"engine is not ready ({status})", retry_after_s=5)


class JobsUnavailable(Unavailable):
    """The bulk jobs' database is not configured, not reached, or its schema is behind this release."""

    code = "jobs_unavailable"

    def __init__(self, message: str) -> None:
        super().__init__(message, retry_after_s=5)


class Timeout(OcrError):
    """A deadline passed: the work was cancelled."""

    code = "timeout"


class RequestTimeout(Timeout):
    """A request not answered within request_timeout_s, its time in the queue included."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"request did not finish within {seconds:g} s and was cancelled")


class JobResultTimeout(Timeout):
    """A job's result (its pdf, built whole before the first byte) not ready within job_result_timeout_s."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the job's result was not ready within {seconds:g} s (job_result_timeout_s)")


class JobPageTimeout(Timeout):
    """A bulk-job page not read within job_page_timeout_s: the page's error."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the page was not read within {seconds:g} s (job_page_timeout_s)")


# --- bulk jobs --------------------------------------------------------------------------------------------


class InvalidWebhook(OcrError):
    code = "invalid_webhook"


class JobNotFound(OcrError):
    """No such job, or another key's (the same answer: a job is visible to its own key only)."""

    code = "not_found"

    def __init__(self) -> None:
        super().__init__("no such job for this API key")


class JobNotFinished(OcrError):
    code = "job_not_finished"

    def __init__(self, status: str) -> None:
        super().__init__(f"the job is {status}: its result is ready once it is finished")


class DocumentGone(OcrError):
    """format=pdf of a job whose document is no longer kept (a cancelled job's is deleted at once)."""

    code = "document_gone"

    def __init__(self) -> None:
        super().__init__(
            "the job's document is no longer kept (a cancelled job's is deleted when it is cancelled, and "
            "so was a job's finished by an earlier release): format=pdf cannot be built; every other "
            "format can"
        )


class IdempotencyConflict(OcrError):
    code = "idempotency_conflict"

    def __init__(self) -> None:
        super().__init__("this Idempotency-Key was used for another document or other options")


class TooManyJobs(OcrError):
    code = "too_many_jobs"

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"this API key has {limit} jobs queued or running (max_jobs_in_flight); retry once one finishes",
            retry_after_s=10,
        )


# --- a document by URL (a job's `url`), and where the service may connect --------------------------------


class DocumentUrlError(OcrError):
    """A document URL the service refuses or could not fetch; each cause its own code (ocr_app/egress.py)."""

    code = "url_invalid"


class UrlUnsupportedScheme(DocumentUrlError):
    code = "url_unsupported_scheme"


class UrlUnresolvable(DocumentUrlError):
    code = "url_unresolvable"


class UrlTooManyRedirects(DocumentUrlError):
    code = "url_too_many_redirects"


class UrlFetchFailed(DocumentUrlError):
    """No document came back: no connection, TLS refused, a time-out, or an answer other than 200."""

    code = "url_fetch_failed"


class AddressRefused(DocumentUrlError):
    """The host resolves to an address of a kind the service never connects to for a client (request
    forgery), unless an operator allowed that host (job_url_allowed_hosts)."""

    code = "url_address_refused"
    kind: ClassVar[str] = "non-public"


class LoopbackRefused(AddressRefused):
    code = "url_loopback"
    kind = "loopback"


class PrivateRefused(AddressRefused):
    code = "url_private"
    kind = "private"


class LinkLocalRefused(AddressRefused):
    code = "url_link_local"
    kind = "link-local"


class UniqueLocalRefused(AddressRefused):
    code = "url_unique_local"
    kind = "unique-local"


class MulticastRefused(AddressRefused):
    code = "url_multicast"
    kind = "multicast"


class MetadataRefused(AddressRefused):
    code = "url_metadata"
    kind = "cloud metadata"


class ReservedRefused(AddressRefused):
    code = "url_reserved"
    kind = "reserved or unspecified"
