// The OCR page: send one document to POST /v1/ocr?preview=true, draw each page's line boxes over the
// page image the engine saw, show the text. Plain DOM, no dependencies; API data goes in as textContent.
"use strict";

(() => {
  const KEY_STORAGE = "ocrfleet.apiKey"; // sessionStorage only: this tab, until it is closed
  const SVG_NS = "http://www.w3.org/2000/svg";
  const HINTS = {
    unauthorized: "Check the API key above.",
    unsupported_media_type: "Send a PNG, JPEG, WebP, TIFF or BMP image, or a PDF.",
    invalid_parameter: "Check the pages field (e.g. 1-3,5).",
  };

  const $ = (id) => document.getElementById(id);
  const form = $("ocr-form");
  const keyInput = $("api-key");
  const fileInput = $("file");
  const dropZone = $("drop-zone");
  const fileName = $("file-name");
  const pagesInput = $("pages");
  const submit = $("submit");
  const status = $("status");
  const errorBox = $("error");
  const results = $("results");
  const pagesOut = $("pages-out");

  let chosen = null; // the File to send
  let lastResponse = null;

  // --- the key: in sessionStorage only (this tab), never in persistent storage -----------------------
  function storage() {
    try {
      return window.sessionStorage;
    } catch {
      return null; // storage disabled: the key lives in the field only
    }
  }
  keyInput.value = storage()?.getItem(KEY_STORAGE) ?? "";
  keyInput.addEventListener("input", () => {
    const value = keyInput.value.trim();
    if (value) storage()?.setItem(KEY_STORAGE, value);
    else storage()?.removeItem(KEY_STORAGE);
  });
  $("forget-key").addEventListener("click", () => {
    keyInput.value = "";
    storage()?.removeItem(KEY_STORAGE);
    keyInput.focus();
  });

  // --- choosing or dropping a file --------------------------------------------------------------
  function choose(file, of = 1) {
    chosen = file;
    fileName.textContent = file
      ? `${file.name || "(unnamed)"} · ${formatBytes(file.size)}${of > 1 ? ` (the first of ${of} files)` : ""}`
      : "No file chosen";
    dropZone.classList.toggle("has-file", Boolean(file));
  }
  fileInput.addEventListener("change", () => choose(fileInput.files[0] || null));

  for (const type of ["dragenter", "dragover"]) {
    dropZone.addEventListener(type, (e) => {
      e.preventDefault();
      e.dataTransfer.dropEffect = "copy";
      dropZone.classList.add("dragging");
    });
  }
  for (const type of ["dragleave", "dragend", "drop"]) {
    dropZone.addEventListener(type, () => dropZone.classList.remove("dragging"));
  }
  dropZone.addEventListener("drop", (e) => {
    e.preventDefault();
    const files = e.dataTransfer.files;
    if (!files || files.length === 0) return;
    choose(files[0], files.length);
  });
  // A file dropped next to the zone must not make the browser navigate away from the page.
  window.addEventListener("dragover", (e) => e.preventDefault());
  window.addEventListener("drop", (e) => e.preventDefault());

  // --- sending ----------------------------------------------------------------------------------
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    if (!chosen) {
      showLocalError("No file chosen", "Choose or drop an image or a PDF first.");
      fileInput.focus();
      return;
    }
    const key = keyInput.value.trim();
    if (key && !/^[\x21-\x7e]+$/.test(key)) {
      showLocalError("Invalid key", "An API key has only printable ASCII characters, no spaces.");
      keyInput.focus();
      return;
    }
    const params = new URLSearchParams({ preview: "true" });
    const pages = pagesInput.value.trim();
    if (pages) params.set("pages", pages);
    const body = new FormData();
    body.append("file", chosen, chosen.name || "document");
    const headers = key ? { Authorization: `Bearer ${key}` } : {};

    setBusy(true, chosen.name);
    errorBox.hidden = true;
    results.hidden = true;
    pagesOut.replaceChildren();
    lastResponse = null;
    let done = "";
    try {
      let res, text;
      try {
        res = await fetch(`v1/ocr?${params}`, { method: "POST", body, headers, cache: "no-store" });
        text = await res.text();
      } catch (err) {
        showLocalError(
          "Could not reach the OCR service",
          `The request did not get an answer (${err.message || err}). Check the network and try again.`,
          "network",
        );
        return;
      }
      let data = null;
      try {
        data = JSON.parse(text);
      } catch {
        data = null;
      }
      if (!res.ok) {
        showApiError(res, data, text);
        return;
      }
      if (!data || !Array.isArray(data.pages)) {
        showLocalError("Unexpected answer", `HTTP ${res.status}: not an OCR result.`);
        return;
      }
      lastResponse = data;
      done = render(data);
    } finally {
      setBusy(false, "", done);
    }
  });

  // While busy: the button is off and the status says so (announced once; the seconds are not read out).
  let ticker = null;
  function setBusy(busy, name, message = "") {
    submit.disabled = busy;
    form.setAttribute("aria-busy", String(busy));
    document.body.classList.toggle("busy", busy);
    clearInterval(ticker);
    status.replaceChildren(busy ? `Recognising ${name || "the document"}… ` : message);
    if (busy) {
      const started = performance.now();
      const seconds = el("span", { "aria-hidden": "true" });
      status.append(seconds);
      ticker = setInterval(() => {
        seconds.textContent = `${Math.round((performance.now() - started) / 1000)} s`;
      }, 1000);
    }
  }

  // --- errors: what the API said, as it said it ---------------------------------------------------
  function showApiError(res, data, text) {
    const err = data && data.error;
    const retry = res.headers.get("Retry-After");
    if (err && typeof err === "object") {
      showError({
        kind: "api",
        title: "The OCR service refused the request",
        status: `${res.status}`,
        code: String(err.code ?? ""),
        message: String(err.message ?? ""),
        requestId: String(err.request_id ?? res.headers.get("X-Request-ID") ?? ""),
        hint: [Object.hasOwn(HINTS, err.code) ? HINTS[err.code] : "", retry ? `Retry after ${retry} s.` : ""]
          .filter(Boolean)
          .join(" "),
      });
    } else {
      // Not the API's JSON (a proxy's own page, say): the status and the start of what came back.
      showError({
        kind: "http",
        title: "The request failed",
        status: `${res.status} ${res.statusText}`.trim(),
        code: "",
        message: text.replace(/<[^>]*>/g, " ").replace(/\s+/g, " ").trim().slice(0, 300),
        requestId: res.headers.get("X-Request-ID") || "",
        hint: retry ? `Retry after ${retry} s.` : "",
      });
    }
  }

  function showLocalError(title, message, kind = "local") {
    showError({ kind, title, status: "", code: "", message, requestId: "", hint: "" });
  }

  function showError({ kind, title, status: httpStatus, code, message, requestId, hint }) {
    errorBox.dataset.kind = kind;
    $("error-title").textContent = title;
    const fields = {
      ".error-status": httpStatus,
      ".error-code": code,
      ".error-message": message,
      ".error-request-id": requestId,
    };
    for (const [selector, value] of Object.entries(fields)) {
      const dd = errorBox.querySelector(selector).closest("dd");
      errorBox.querySelector(selector).textContent = value;
      dd.hidden = !value;
      dd.previousElementSibling.hidden = !value;
    }
    const hintEl = errorBox.querySelector(".error-hint");
    hintEl.textContent = hint;
    hintEl.hidden = !hint;
    errorBox.hidden = false;
    errorBox.scrollIntoView({ block: "nearest" });
  }

  // --- results ----------------------------------------------------------------------------------
  function render(data) {
    pagesOut.replaceChildren(...data.pages.map(renderPage));
    const lines = data.pages.reduce((n, p) => n + p.lines.length, 0);
    const seconds = data.timings_ms ? ` in ${(data.timings_ms.total / 1000).toFixed(1)} s` : "";
    $("summary").textContent =
      `${plural(data.pages.length, "page")}, ${plural(lines, "line")}${seconds} · ` +
      `${data.engine} (${data.model}) · request ${data.request_id}`;
    $("copy-all").hidden = data.pages.length < 2;
    results.hidden = false;
    results.scrollIntoView({ block: "start" });
    return `Done: ${plural(data.pages.length, "page")}, ${plural(lines, "line")}.`;
  }

  function renderPage(page) {
    const article = el("article", { class: "page", "data-page": page.page });
    const titleId = `page-${page.page}-title`;
    article.setAttribute("aria-labelledby", titleId);

    const head = el("header", { class: "page-head" });
    head.append(
      el("h2", { id: titleId }, `Page ${page.page}`),
      el("span", { class: "meta" }, `${page.width} × ${page.height} px · ${plural(page.lines.length, "line")}`),
    );
    const copy = el("button", { type: "button", class: "secondary copy" }, "Copy");
    copy.setAttribute("aria-label", `Copy the text of page ${page.page}`);
    copy.addEventListener("click", () => copyWithFeedback(copy, page.text));
    head.append(copy);

    const body = el("div", { class: "page-body" });
    body.append(renderImage(page), renderText(page));
    article.append(head, body);
    for (const w of page.warnings || []) article.append(el("p", { class: "warning" }, w));
    linkHover(article);
    return article;
  }

  function renderImage(page) {
    const figure = el("figure", { class: "page-image" });
    const canvas = el("div", { class: "canvas" });
    if (page.preview) {
      canvas.append(el("img", { src: page.preview, alt: `Page ${page.page} as the OCR engine saw it` }));
    } else {
      // No picture: keep the page's shape so the boxes still show where the lines are.
      const blank = el("div", { class: "blank" });
      blank.style.aspectRatio = `${page.width} / ${page.height}`;
      canvas.append(blank);
    }
    const svg = document.createElementNS(SVG_NS, "svg");
    svg.setAttribute("class", "boxes");
    svg.setAttribute("viewBox", "0 0 1 1");
    svg.setAttribute("preserveAspectRatio", "none");
    svg.setAttribute("aria-hidden", "true");
    (page.blocks || []).forEach((block, i) => {
      if (!Array.isArray(block.bbox)) return; // none of its lines localised
      svg.append(svgRect(block.bbox, `block block-${block.type}`, `${block.type} block`, { block: i }));
    });
    page.lines.forEach((line, i) => {
      if (!Array.isArray(line.bbox)) return; // an engine that cannot localise this line
      svg.append(svgRect(line.bbox, "box", line.text, { line: i }));
    });
    canvas.append(svg);
    figure.append(canvas);
    return figure;
  }

  function svgRect([x0, y0, x1, y1], cls, label, data) {
    const rect = document.createElementNS(SVG_NS, "rect");
    for (const [k, v] of Object.entries({ x: x0, y: y0, width: x1 - x0, height: y1 - y0 })) {
      rect.setAttribute(k, String(v));
    }
    rect.setAttribute("class", cls);
    for (const [k, v] of Object.entries(data)) rect.dataset[k] = String(v);
    const title = document.createElementNS(SVG_NS, "title");
    title.textContent = label;
    rect.append(title);
    return rect;
  }

  function renderText(page) {
    const wrap = el("div", { class: "page-text" });
    const pre = el("pre", { class: "text", tabindex: "0" });
    pre.setAttribute("aria-label", `Text of page ${page.page}`);
    if (!page.text) {
      wrap.append(el("p", { class: "empty" }, "No text found on this page."));
      return wrap;
    }
    // The text as the engine joins it: each block's lines by newlines, blocks apart by a blank line.
    const groups = page.blocks?.length ? page.blocks.map((b) => b.lines) : [page.lines.map((_, i) => i)];
    const joined = groups.map((g) => g.map((i) => page.lines[i].text).join("\n")).join("\n\n");
    if (joined === page.text) {
      // One span per line, so a line and its box light up together; the text stays exactly page.text.
      groups.forEach((g, k) => {
        if (k > 0) pre.append("\n\n");
        g.forEach((i, j) => {
          if (j > 0) pre.append("\n");
          pre.append(el("span", { class: "line", "data-line": i }, page.lines[i].text));
        });
      });
    } else {
      pre.textContent = page.text;
    }
    wrap.append(pre);
    return wrap;
  }

  function linkHover(article) {
    const toggle = (i, on) => {
      for (const node of article.querySelectorAll(`[data-line="${i}"]`)) node.classList.toggle("hot", on);
    };
    for (const type of ["mouseover", "mouseout"]) {
      article.addEventListener(type, (e) => {
        const target = e.target.closest?.("[data-line]");
        if (target) toggle(target.dataset.line, type === "mouseover");
      });
    }
  }

  // Block outlines on every page at once; the choice outlives a new result.
  const showBlocks = $("show-blocks");
  showBlocks.addEventListener("change", () => results.classList.toggle("show-blocks", showBlocks.checked));

  // --- copying ----------------------------------------------------------------------------------
  $("copy-all").addEventListener("click", (e) => {
    if (!lastResponse) return;
    const all = lastResponse.pages.map((p) => p.text).join("\n\n");
    copyWithFeedback(e.currentTarget, all);
  });

  async function copyWithFeedback(button, text) {
    const label = button.dataset.label || button.textContent;
    button.dataset.label = label;
    const ok = await copyText(text);
    button.textContent = ok ? "Copied" : "Copy failed: select the text";
    button.classList.toggle("copied", ok);
    button.classList.toggle("failed", !ok);
    clearTimeout(button.resetTimer);
    button.resetTimer = setTimeout(() => {
      button.textContent = label;
      button.classList.remove("copied", "failed");
    }, 2500);
  }

  async function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      try {
        await navigator.clipboard.writeText(text);
        return true;
      } catch {
        // refused (permissions, focus): try the old way below
      }
    }
    // Plain http on a non-local address has no Clipboard API: a selected textarea and execCommand.
    const area = el("textarea", { class: "clipboard-helper", readonly: "" });
    area.value = text;
    document.body.append(area);
    area.select();
    let ok = false;
    try {
      ok = document.execCommand("copy");
    } catch {
      ok = false;
    }
    area.remove();
    return ok;
  }

  // --- helpers ----------------------------------------------------------------------------------
  function el(tag, attrs = {}, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function plural(n, word) {
    return `${n} ${word}${n === 1 ? "" : "s"}`;
  }

  function formatBytes(n) {
    if (n < 1024) return `${n} B`;
    if (n < 1024 * 1024) return `${(n / 1024).toFixed(0)} KB`;
    return `${(n / 1024 / 1024).toFixed(1)} MB`;
  }
})();
