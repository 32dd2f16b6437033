"""Hostile documents for issue #9's corpus, written byte by byte at test time (nothing binary is committed):
PDF objects by hand, zlib for Flate bombs, struct for TIFF IFDs and PNG chunks. Each takes milliseconds."""

from __future__ import annotations

import io
import struct
import zlib

from PIL import Image

MiB = 1024 * 1024
INCH = 72  # PDF points


def tiff(frames: int, side: int = 8) -> bytes:
    buf = io.BytesIO()
    ims = [Image.new("L", (side, side), 255) for _ in range(frames)]
    ims[0].save(buf, "TIFF", save_all=True, append_images=ims[1:])
    return buf.getvalue()


def tiff_1px_frames(frames: int) -> bytes:
    """A little-endian TIFF of `frames` 1x1 grey frames sharing one pixel, written directly (Pillow's writer
    takes minutes for 20 000 frames)."""
    pixel, first = 8, 10
    ifd_size = 2 + 8 * 12 + 4
    out = bytearray(b"II*\x00" + struct.pack("<I", first) + b"\xff\x00")
    for i in range(frames):
        tags = [(256, 3, 1), (257, 3, 1), (258, 3, 8), (259, 3, 1), (262, 3, 1), (273, 4, pixel),
                (278, 3, 1), (279, 4, 1)]  # fmt: skip
        nxt = first + (i + 1) * ifd_size if i + 1 < frames else 0
        out += struct.pack("<H", len(tags))
        out += b"".join(struct.pack("<HHII", tag, typ, 1, val) for tag, typ, val in tags)
        out += struct.pack("<I", nxt)
    return bytes(out)


def pdf(*objects: bytes) -> bytes:
    """A PDF whose objects are numbered from 1 (1 is the catalog), with a correct xref table."""
    out, offsets = b"%PDF-1.4\n", []
    for i, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (i, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    return out + b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)


CATALOG = b"<< /Type /Catalog /Pages 2 0 R >>"


def nested_xobject_pdf(depth: int, fanout: int = 10) -> bytes:
    """A page that draws form X{depth}, each form drawing the one below it `fanout` times: fanout**depth
    fills from ~2 KB. Depth 4 (21 111 page objects) renders for ~9 s in PDFium at the default
    max_image_side; depth 5 (211 111) is over MAX_PDF_PAGE_OBJECTS and refused before it renders
    (ocr_app/documents/pdf.py)."""
    first_form = 5  # objects 1-4: catalog, page tree, page, page content
    content = b"/X%d Do" % depth
    objects = [
        CATALOG,
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /XObject << /X%d %d 0 R >> >> >>" % (depth, first_form + depth),
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content),
    ]
    for level in range(depth + 1):
        if level == 0:
            body, resources = b"0 0 1 rg 10 10 500 700 re f", b""
        else:
            body = b" ".join(b"q 1 0 0 1 0.1 0.1 cm /X%d Do Q" % (level - 1) for _ in range(fanout))
            resources = b"/Resources << /XObject << /X%d %d 0 R >> >>" % (level - 1, first_form + level - 1)
        objects.append(
            b"<< /Type /XObject /Subtype /Form /BBox [0 0 612 792] %s /Length %d >>\nstream\n%s\nendstream"
            % (resources, len(body), body)
        )
    return pdf(*objects)


def slow_render_pdf() -> bytes:
    """A page that is still rendering when a test's deadline (at most ~10 s) or client gives up: the slowest
    nesting under MAX_PDF_PAGE_OBJECTS, depth 4 x fanout 14 (79 787 objects), renders for ~43 s on one of
    this machine's cores (depth 4 x 10, ~9 s, lost that race to a 10 s deadline about one run in three)."""
    return nested_xobject_pdf(4, fanout=14)


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


def filled_form_pdf(value: bytes = b"Filled in 2026") -> bytes:
    """A 300 x 200 pt page with one text field, filled in as many form fillers save it: its value and
    NeedAppearances, no appearance stream of its own (a viewer draws it). The field is at 20-280 x 80-120 pt
    (from the page's bottom left)."""
    return pdf(
        b"<< /Type /Catalog /Pages 2 0 R /AcroForm << /Fields [4 0 R] /NeedAppearances true"
        b" /DA (/Helv 0 Tf 0 g) /DR << /Font << /Helv 5 0 R >> >> >> >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 200] /Annots [4 0 R] >>",
        b"<< /Type /Annot /Subtype /Widget /FT /Tx /T (name) /V (%s) /DA (/Helv 18 Tf 0 g)"
        b" /Rect [20 80 280 120] /F 4 /P 3 0 R >>" % value,
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
