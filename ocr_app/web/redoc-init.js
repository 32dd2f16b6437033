// ReDoc at /redoc, from files this app serves (no CDN, no web fonts); the OpenAPI document is this app's own.
"use strict";
Redoc.init(new URL("openapi.json", document.baseURI).href, {}, document.getElementById("redoc"));
