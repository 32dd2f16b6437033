"""Upload -> pages: type sniffing, byte/pixel/page limits, EXIF, resize, PDF and TIFF pages.

Everything here is CPU-bound and runs in a decode worker process (decode.py), never in the server process.
Documents live in memory only. Limits are enforced from headers before any full decode, so a decompression
bomb costs a header read. upload.py reads what the client sent; pages.py turns a document into its pages
(pdf.py, raster.py), each a PageImage (image.py), the engines' input.
"""
