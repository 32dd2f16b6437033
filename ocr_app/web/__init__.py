"""The web page at `/` and the pages that start the API docs at `/docs` and `/redoc`: plain HTML, CSS and JS
files shipped inside the package (no CDN, no build step), served by ocr_app/http/routes/web.py."""
