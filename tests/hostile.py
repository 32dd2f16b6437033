"""Hostile documents for issue #9's corpus, written byte by byte at test time (nothing binary is committed):
PDF objects by hand, zlib for Flate bombs, struct for TIFF IFDs and PNG chunks. Each takes milliseconds."""

from __future__ import annotations

import struct
import zlib

from .docs import encode, png_bomb, render  # noqa: F401  (png_bomb: re-exported for the corpus)
from .test_decode_pool import nested_xobject_pdf  # noqa: F401
from .test_malformed import CATALOG, pdf, tiff, tiff_1px_frames  # noqa: F401

MiB = 1024 * 1024
INCH = 72  # PDF points


def flate_zeros(mib: int) -> bytes:
    """A zlib stream of `mib` MiB of zero bytes in ~1 KB per MiB: one full-flushed block repeated (a full
    flush resets the compressor's window, so each identical MiB compresses to identical bytes)."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate: header and trailer written here
    first = c.compress(b"\0" * MiB) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(b"\0" * MiB) + c.flush(zlib.Z_FULL_FLUSH)
    last = c.flush()  # the final (empty) block
    adler = ((mib * MiB) % 65521) << 16 | 1  # Adler-32 of zeros: a stays 1, b counts the bytes
    return b"\x78\xda" + first + block * (mib - 1) + last + struct.pack(">I", adler)


def _stream(dictionary: bytes, data: bytes) -> bytes:
    return b"<< %s /Length %d >>\nstream\n%s\nendstream" % (dictionary, len(data), data)


def _one_page(page: bytes, *more: bytes) -> bytes:
    return pdf(CATALOG, b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>", page, *more)


def text_pdf(text: bytes = b"Clean page 42", media_box: bytes = b"0 0 612 792") -> bytes:
    """One page of Helvetica text (PDFium's built-in font): a PDF whose OCR can be checked."""
    content = b"BT /F1 48 Tf 72 600 Td (%s) Tj ET" % text
    return _one_page(
        b"<< /Type /Page /Parent 2 0 R /MediaBox [%s] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>" % media_box,
        _stream(b"", content),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    )


def pdf_huge_page(inches: int = 200) -> bytes:
    """A page of `inches` x `inches` (200 in = 14 400 pt: 40 000 px a side at 200 dpi)."""
    side = b"%d" % (inches * INCH)
    return text_pdf(media_box=b"0 0 %s %s" % (side, side))


def pdf_sliver_page() -> bytes:
    """A page 10^9 pt wide and 1 pt high: scaled to max_image_side, it is less than a pixel high."""
    return text_pdf(media_box=b"0 0 1000000000 1")


def pdf_count_lies(count: int) -> bytes:
    """The page tree says `count` pages and holds one."""
    return pdf(
        CATALOG,
        b"<< /Type /Pages /Kids [3 0 R] /Count %d >>" % count,
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>",
    )


def pdf_form_fills(forms: int, fills: int, extra: int = 0) -> bytes:
    """A page that draws form X `forms` times, X holding `fills` 1 pt fills, and `extra` fills of its own:
    PDFium counts forms * (1 + fills) + extra page objects (each invocation holds its own copies). Tiny
    fills render fast, so a page at MAX_PDF_PAGE_OBJECTS is cheap to serve."""
    fill = b"0 0 1 1 re f"
    content = b"\n".join([b"q /X Do Q"] * forms + [fill] * extra)
    return _one_page(
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /XObject << /X 5 0 R >> >> >>",
        _stream(b"", content),
        _stream(b"/Type /XObject /Subtype /Form /BBox [0 0 612 792]", b"\n".join([fill] * fills)),
    )


def pdf_xref_lies() -> bytes:
    """Every xref offset points 7 bytes off and the trailer's /Size is wrong: readers must rebuild."""
    good = text_pdf()
    head, _, tail = good.partition(b"xref\n")
    lines = tail.split(b"\n")
    shifted = [
        b"%010d 00000 n " % (int(line[:10]) + 7) if line.endswith(b" n ") else line for line in lines[:-1]
    ]
    xref = b"\n".join(shifted).replace(b"/Size ", b"/Size 9")
    return head + b"xref\n" + xref + b"\n"


def pdf_flate_content(mib: int) -> bytes:
    """A page whose content stream inflates to `mib` MiB of zeros (PDF whitespace) from ~1 KB per MiB."""
    return _one_page(
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >>",
        _stream(b"/Filter /FlateDecode", flate_zeros(mib)),
    )


def pdf_flate_image(side: int) -> bytes:
    """A page drawing one `side` x `side` RGB image XObject whose samples inflate to 3 * side^2 bytes."""
    mib = -(-3 * side * side // MiB)
    content = b"q 612 0 0 792 0 0 cm /Im0 Do Q"
    return _one_page(
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /XObject << /Im0 5 0 R >> >> >>",
        _stream(b"", content),
        _stream(
            b"/Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace /DeviceRGB "
            b"/BitsPerComponent 8 /Filter /FlateDecode" % (side, side),
            flate_zeros(mib),
        ),
    )


def tiff_ifd_loop(frames: int) -> bytes:
    """`frames` 1x1 frames whose last IFD points back to the first: a reader that follows offsets loops."""
    body = bytearray(tiff_1px_frames(frames))
    first, ifd_size = 10, 2 + 8 * 12 + 4
    last_next = first + frames * ifd_size - 4
    body[last_next : last_next + 4] = struct.pack("<I", first)
    return bytes(body)


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png_with(clean_png: bytes, chunk: bytes) -> bytes:
    """`chunk` inserted right after IHDR (8-byte signature + 25-byte IHDR chunk)."""
    return clean_png[:33] + chunk + clean_png[33:]


def png_ztxt_bomb(clean_png: bytes, mib: int = 256) -> bytes:
    return _png_with(clean_png, png_chunk(b"zTXt", b"Comment\x00\x00" + flate_zeros(mib)))


def png_iccp_bomb(clean_png: bytes, mib: int = 256) -> bytes:
    return _png_with(clean_png, png_chunk(b"iCCP", b"icc\x00\x00" + flate_zeros(mib)))


def png_huge_text(clean_png: bytes, mib: int = 8) -> bytes:
    """An uncompressed tEXt chunk of `mib` MiB: no bomb, only bytes (under max_upload_bytes)."""
    return _png_with(clean_png, png_chunk(b"tEXt", b"Comment\x00" + b"A" * (mib * MiB)))


def png_pdf_polyglot(clean_png: bytes) -> bytes:
    """A valid PNG that holds a whole PDF in a private chunk (so `%PDF-` lies in its first KB)."""
    return _png_with(clean_png, png_chunk(b"pdFx", text_pdf(b"Polyglot PDF 17")))


def zip_pdf_polyglot() -> bytes:
    """A ZIP local file header, then a PDF: PDF readers find `%PDF-` within the first 1024 bytes."""
    name = b"a.txt"
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0, 0, 0, 0, len(name), 0) + name
    return local + text_pdf(b"Polyglot 42")


def multipart_parts(parts: int, boundary: bytes = b"hostileboundary") -> tuple[bytes, str]:
    """A multipart/form-data body of `parts` tiny fields (and no file)."""
    one = b'--%s\r\nContent-Disposition: form-data; name="f"\r\n\r\nx\r\n' % boundary
    body = one * parts + b"--%s--\r\n" % boundary
    return body, f"multipart/form-data; boundary={boundary.decode()}"
