// Swagger UI at /docs, from files this app serves (no CDN); the OpenAPI document is this app's own.
"use strict";
window.ui = SwaggerUIBundle({
  url: new URL("openapi.json", document.baseURI).href,
  dom_id: "#swagger-ui",
  deepLinking: true,
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
});
