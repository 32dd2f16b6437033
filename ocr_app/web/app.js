// The OCR page: send one document to POST /v1/ocr?preview=true (or, as a bulk job, to POST /v1/jobs and
// show each page as its event arrives), draw each page's line boxes over the page image the engine saw,
// show the text; below, the key's jobs (GET /v1/jobs) with their results as JSON Lines. Plain DOM, no
// dependencies; API data goes in as textContent.
"use strict";

(() => {
  const KEY_STORAGE = "ocrfleet.apiKey"; // sessionStorage only: this tab, until it is closed
  const SVG_NS = "http://www.w3.org/2000/svg";
  const HINTS = {
    unauthorized: "Check the API key above.",
    unsupported_media_type: "Send a PNG, JPEG, WebP, TIFF or BMP image, or a PDF.",
    invalid_parameter: "Check the pages field (e.g. 1-3,5).",
    jobs_unavailable: "Untick “Run as a bulk job” to send the document in one request instead.",
    too_many_jobs: "Wait for one of this key's jobs to finish, or cancel one.",
  };
  const BULK_BYTES = 5 * 1024 * 1024; // a PDF larger than this goes as a bulk job
  const STREAM_RETRIES = 5; // the event stream opened again without a page in between, at most
  const FINISHED = new Set(["done", "failed", "cancelled"]); // a job's states with a result to fetch

  const $ = (id) => document.getElementById(id);
  const form = $("ocr-form");
  const keyInput = $("api-key");
  const fileInput = $("file");
  const dropZone = $("drop-zone");
  const fileName = $("file-name");
  const pagesInput = $("pages");
  const asJob = $("as-job");
  const submit = $("submit");
  const cancelJob = $("cancel-job");
  const jobProgress = $("job-progress");
  const status = $("status");
  const errorBox = $("error");
  const results = $("results");
  const pagesOut = $("pages-out");
  const jobsSection = $("jobs");
  const jobsList = $("jobs-list");
  const jobsMore = $("jobs-more");
  const jobsStatus = $("jobs-status");

  let chosen = null; // the File to send
  let lastResponse = null;
  let job = null; // the bulk job being followed

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
  keyInput.addEventListener("change", () => loadJobs());
  $("forget-key").addEventListener("click", () => {
    keyInput.value = "";
    storage()?.removeItem(KEY_STORAGE);
    hideJobs();
    keyInput.focus();
  });

  function validKey(key) {
    return !key || /^[\x21-\x7e]+$/.test(key);
  }

  function authHeaders(key) {
    return key ? { Authorization: `Bearer ${key}` } : {};
  }

  // --- choosing or dropping a file --------------------------------------------------------------
  function choose(file, of = 1) {
    chosen = file;
    fileName.textContent = file
      ? `${file.name || "(unnamed)"} · ${formatBytes(file.size)}${of > 1 ? ` (the first of ${of} files)` : ""}`
      : "No file chosen";
    dropZone.classList.toggle("has-file", Boolean(file));
    const pdf = file && (file.type === "application/pdf" || /\.pdf$/i.test(file.name || ""));
    if (pdf && file.size > BULK_BYTES) asJob.checked = true;
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
    if (!validKey(key)) {
      showLocalError("Invalid key", "An API key has only printable ASCII characters, no spaces.");
      keyInput.focus();
      return;
    }
    const params = new URLSearchParams({ preview: "true" });
    const pages = pagesInput.value.trim();
    if (pages) params.set("pages", pages);
    const body = new FormData();
    body.append("file", chosen, chosen.name || "document");
    const headers = authHeaders(key);

    setBusy(true, chosen.name);
    clearOutput();
    let done = "";
    try {
      done = asJob.checked ? await runJob(params, body, headers) : await runOnce(params, body, headers);
    } finally {
      setBusy(false, "", done);
    }
  });

  function clearOutput() {
    errorBox.hidden = true;
    results.hidden = true;
    pagesOut.replaceChildren();
    lastResponse = null;
    lastDocument = null;
    $("download-controls").hidden = true;
    job = null;
    jobProgress.hidden = true;
  }

  // Each format's file name extension (the API's format= names; JSON Lines: a job's default).
  const EXTENSIONS = {
    jsonl: ".jsonl", json: ".json", text: ".txt", markdown: ".md", hocr: ".hocr", alto: ".xml", pdf: ".pdf",
  };
  let lastDocument = null; // {file, pages} of the last single request: Download sends it again

  function saveBlob(blob, name) {
    const url = URL.createObjectURL(blob);
    const link = el("a", { href: url, download: name.replace(/[^\w.-]/g, "_"), hidden: "" });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
  }

  // A download: the answer as a blob, `button` disabled meanwhile; an error shown as any other (and handed
  // to `onError`), null then.
  async function fetchBlob(button, url, options, onError = () => {}) {
    button.disabled = true;
    let res, blob, text;
    try {
      res = await fetch(url, { ...options, cache: "no-store" });
      if (res.ok) blob = await res.blob();
      else text = await res.text();
    } catch (err) {
      showNetworkError(err);
      return null;
    } finally {
      button.disabled = false;
    }
    if (!res.ok) {
      showApiError(res, parseJson(text), text);
      onError(res);
      return null;
    }
    return blob;
  }

  // The document in another format: POST /v1/ocr?format= with the same file and pages (read again).
  $("download").addEventListener("click", async (e) => {
    const button = e.currentTarget;
    if (!lastDocument) return;
    const format = $("download-format").value;
    const params = new URLSearchParams({ format });
    if (lastDocument.pages) params.set("pages", lastDocument.pages);
    const body = new FormData();
    body.append("file", lastDocument.file, lastDocument.file.name || "document");
    const blob = await fetchBlob(button, `v1/ocr?${params}`, {
      method: "POST", body, headers: authHeaders(keyInput.value.trim()),
    });
    if (!blob) return;
    const stem = (lastDocument.file.name || "document").replace(/\.[^.]*$/, "");
    saveBlob(blob, `${stem}${EXTENSIONS[format]}`);
  });

  // One request: every page in one answer. Returns the status line ("" after an error).
  async function runOnce(params, body, headers) {
    let res, text;
    try {
      res = await fetch(`v1/ocr?${params}`, { method: "POST", body, headers, cache: "no-store" });
      text = await res.text();
    } catch (err) {
      showNetworkError(err);
      return "";
    }
    const data = parseJson(text);
    if (!res.ok) {
      showApiError(res, data, text);
      return "";
    }
    if (!data || !Array.isArray(data.pages)) {
      showLocalError("Unexpected answer", `HTTP ${res.status}: not an OCR result.`);
      return "";
    }
    lastResponse = data;
    lastDocument = { file: body.get("file"), pages: params.get("pages") };
    $("download-controls").hidden = false;
    return render(data);
  }

  function showNetworkError(err) {
    showLocalError(
      "Could not reach the OCR service",
      `The request did not get an answer (${err.message || err}). Check the network and try again.`,
      "network",
    );
  }

  function parseJson(text) {
    try {
      return JSON.parse(text);
    } catch {
      return null;
    }
  }

  // --- a bulk job: POST /v1/jobs, then its Server-Sent Events, read with fetch() (EventSource cannot send
  // the key), a page shown as each `page` event arrives; a dropped stream resumes with Last-Event-ID ------
  async function runJob(params, body, headers) {
    let res, text;
    try {
      res = await fetch(`v1/jobs?${params}`, { method: "POST", body, headers, cache: "no-store" });
      text = await res.text();
    } catch (err) {
      showNetworkError(err);
      return "";
    }
    const data = parseJson(text);
    if (res.status !== 202) {
      showApiError(res, data, text);
      return "";
    }
    if (!data || typeof data.job_id !== "string") {
      showLocalError("Unexpected answer", `HTTP ${res.status}: not a job.`);
      return "";
    }
    jobsAvailable = true;
    loadJobs(); // the new job heads the list
    return watchJob(data.job_id, headers);
  }

  // A job, just submitted or picked from the list, followed until it ends: each page shown as it is read.
  // Returns the status line ("" after an error).
  async function watchJob(id, headers) {
    job = { id, headers, total: null, status: "queued", last: 0, pages: [], shown: 0, lines: 0 };
    job.failed = 0;
    job.note = "";
    lastResponse = { pages: job.pages };
    $("summary").textContent = "";
    $("copy-all").hidden = true;
    cancelJob.hidden = false;
    cancelJob.disabled = false;
    jobProgress.hidden = false;
    showProgress();
    try {
      const final = await followJob(job);
      if (final === null) return "";
      job.status = final;
      job.note = "";
      showProgress();
      const read = `${job.shown} of ${plural(job.total ?? job.shown, "page")}`;
      if (final === "done") {
        const failed = job.failed ? `, ${job.failed} not read` : "";
        return `Done: ${read}${failed}, ${plural(job.lines, "line")}.`;
      }
      return `Job ${final}: ${read} shown.`;
    } finally {
      cancelJob.hidden = true;
      loadJobs(); // its state in the list
    }
  }

  async function followJob(current) {
    const url = `v1/jobs/${encodeURIComponent(current.id)}/events`;
    let failures = 0;
    let delay = 500;
    for (;;) {
      const headers = { ...current.headers, Accept: "text/event-stream" };
      if (current.last) headers["Last-Event-ID"] = String(current.last);
      let reason;
      try {
        const res = await fetch(url, { headers, cache: "no-store" });
        if (!res.ok) {
          const text = await res.text();
          if (![502, 503, 504].includes(res.status)) {
            showApiError(res, parseJson(text), text);
            return null;
          }
          reason = `HTTP ${res.status}`;
        } else {
          reason = "the stream ended before the job did";
          for await (const ev of sseEvents(res.body)) {
            if (ev.event === "progress") {
              const info = JSON.parse(ev.data);
              current.total = info.pages_total ?? current.total;
              current.status = info.status ?? current.status;
              showProgress();
            } else if (ev.event === "page" || ev.event === "page_error") {
              const page = JSON.parse(ev.data);
              if (page.page <= current.last) continue; // shown already
              current.last = page.page;
              failures = 0;
              delay = 500;
              current.note = "";
              showJobPage(current, page, ev.event === "page_error");
            } else if (ev.event === "done") {
              return JSON.parse(ev.data).status;
            } else if (ev.event === "unavailable") {
              // The service's job database is away for now: back after its Retry-After.
              const info = JSON.parse(ev.data);
              reason = info.message;
              delay = Math.max(delay, (info.retry_after_s ?? 5) * 1000);
            }
          }
        }
      } catch (err) {
        reason = err.message || String(err);
      }
      failures += 1;
      if (failures > STREAM_RETRIES) {
        showLocalError(
          "Lost the job's progress",
          `The job's event stream failed ${failures} times (${reason}). The job goes on at the service: ` +
            `job ${current.id}.`,
          "network",
        );
        return null;
      }
      current.note = `reconnecting (${reason})…`;
      showProgress();
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 10000);
    }
  }

  function showJobPage(current, page, failed) {
    current.shown += 1;
    if (failed) {
      current.failed += 1;
      pagesOut.append(renderPageError(page));
    } else {
      current.pages.push(page);
      current.lines += page.lines.length;
      pagesOut.append(renderPage(page));
    }
    $("summary").textContent =
      `${current.shown} of ${plural(current.total ?? current.shown, "page")}, ` +
      `${plural(current.lines, "line")} · job ${current.id}`;
    $("copy-all").hidden = current.pages.length < 2;
    results.hidden = false;
    showProgress();
  }

  function showProgress() {
    if (!job) return;
    const total = job.total ?? 0;
    const bar = $("job-bar");
    bar.max = Math.max(total, 1);
    bar.value = job.shown;
    $("job-count").textContent = `${job.shown} of ${plural(total, "page")}`;
    $("job-note").textContent = job.note || job.status;
    jobProgress.dataset.status = job.status;
  }

  cancelJob.addEventListener("click", async () => {
    if (!job) return;
    const cancelling = job;
    cancelJob.disabled = true;
    let res, text;
    try {
      res = await fetch(`v1/jobs/${encodeURIComponent(job.id)}`, {
        method: "DELETE",
        headers: job.headers,
        cache: "no-store",
      });
      text = await res.text();
    } catch (err) {
      cancelJob.disabled = false;
      showNetworkError(err);
      return;
    }
    if (!res.ok) {
      cancelJob.disabled = false;
      showApiError(res, parseJson(text), text);
      return;
    }
    // The event stream ends with `done` once the service has stopped the job; that may come first.
    if (job !== cancelling || cancelJob.hidden) return;
    job.note = "cancelling…";
    showProgress();
  });

  // text/event-stream as the HTML standard parses it: lines end at CRLF, CR or LF; `field: value`;
  // `:` comments; data lines joined by LF; an event at a blank line (if it has data); id carries over.
  async function* sseEvents(stream) {
    const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    let event = "";
    let data = [];
    let id = null;
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        buffer += value;
        for (;;) {
          const m = /\r\n|\r|\n/.exec(buffer);
          // A CR last in the buffer may be the first half of a CRLF: wait for the next chunk.
          if (!m || (m[0] === "\r" && m.index === buffer.length - 1)) break;
          const line = buffer.slice(0, m.index);
          buffer = buffer.slice(m.index + m[0].length);
          if (line === "") {
            if (data.length) yield { event: event || "message", data: data.join("\n"), id };
            event = "";
            data = [];
            continue;
          }
          if (line.startsWith(":")) continue;
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          let val = colon < 0 ? "" : line.slice(colon + 1);
          if (val.startsWith(" ")) val = val.slice(1);
          if (field === "event") event = val;
          else if (field === "data") data.push(val);
          else if (field === "id" && !val.includes("\0")) id = val;
        }
      }
    } finally {
      reader.releaseLock();
    }
  }

  // While busy: the button is off and the status says so (announced once; the seconds are not read out).
  let ticker = null;
  function setBusy(busy, name, message = "") {
    submit.disabled = busy;
    for (const button of jobsList.querySelectorAll("button.follow")) button.disabled = busy;
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

  function renderPageError(item) {
    const article = el("article", { class: "page page-error", "data-page": item.page });
    const titleId = `page-${item.page}-title`;
    article.setAttribute("aria-labelledby", titleId);
    const head = el("header", { class: "page-head" });
    head.append(el("h2", { id: titleId }, `Page ${item.page}`));
    const err = item.error || {};
    article.append(
      head,
      el("p", { class: "warning" }, `Not read: ${String(err.message ?? "")} (${String(err.code ?? "")})`),
    );
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

  // --- the key's jobs: GET /v1/jobs, newest first, a page at a time (More follows next_cursor) ---------
  // Shown once the service has listed them: a service without a job database answers 503 jobs_unavailable
  // and the section stays hidden; a key it refuses (401) lists nothing.
  let jobsAvailable = null; // null: not known yet; false: no job database; true: it lists or takes jobs
  let jobsCursor = null;
  let jobsGen = 0; // each new listing makes the answers to older ones stale

  function jobsPageSize() {
    const n = Number.parseInt(jobsSection.dataset.pageSize, 10);
    return Number.isInteger(n) ? Math.min(Math.max(n, 1), 100) : 20;
  }

  function hideJobs() {
    jobsGen += 1;
    jobsSection.hidden = true;
    jobsList.replaceChildren();
    jobsCursor = null;
    jobsMore.hidden = true;
    jobsStatus.textContent = "";
  }

  async function loadJobs(more = false) {
    const key = keyInput.value.trim();
    // Without a key only a service with auth off answers: asked once a job sent from here proved it does.
    if (!validKey(key) || jobsAvailable === false || (!key && !jobsAvailable)) {
      hideJobs();
      return;
    }
    if (!more) jobsGen += 1;
    const gen = jobsGen;
    const params = new URLSearchParams({ limit: String(jobsPageSize()) });
    if (more && jobsCursor) params.set("cursor", jobsCursor);
    jobsMore.disabled = true;
    jobsSection.setAttribute("aria-busy", "true");
    let res, text;
    try {
      res = await fetch(`v1/jobs?${params}`, { headers: authHeaders(key), cache: "no-store" });
      text = await res.text();
    } catch (err) {
      if (gen === jobsGen) jobsFailed(`the service did not answer (${err.message || err}).`);
      return;
    }
    if (gen !== jobsGen) return;
    const data = parseJson(text);
    const err = data && typeof data.error === "object" ? data.error : null;
    if (res.status === 503 && err?.code === "jobs_unavailable") {
      jobsAvailable = false;
      hideJobs();
      return;
    }
    if (res.status === 401) {
      hideJobs();
      return;
    }
    if (!res.ok || !data || !Array.isArray(data.jobs)) {
      const said = err ? ` ${String(err.code ?? "")}: ${String(err.message ?? "")}` : "";
      jobsFailed(`HTTP ${res.status}${said}.`);
      return;
    }
    jobsAvailable = true;
    const rows = data.jobs.map(jobRow);
    if (more) jobsList.append(...rows);
    else jobsList.replaceChildren(...rows);
    jobsCursor = typeof data.next_cursor === "string" ? data.next_cursor : null;
    jobsMore.hidden = !jobsCursor;
    jobsMore.disabled = false;
    jobsStatus.textContent = jobsList.children.length ? "" : "No jobs for this key yet.";
    jobsSection.removeAttribute("aria-busy");
    jobsSection.hidden = false;
  }

  function jobsFailed(message) {
    jobsStatus.textContent = `Could not list the jobs: ${message}`;
    jobsMore.disabled = false;
    jobsSection.removeAttribute("aria-busy");
    jobsSection.hidden = !jobsAvailable;
  }

  function jobRow(item) {
    const id = String(item.job_id);
    const status = String(item.status);
    const pages = item.pages || {};
    const row = el("tr", { "data-job-id": id, "data-status": status });
    const idCell = el("td");
    idCell.append(el("code", {}, id));
    const created = el("td");
    created.append(el("time", { datetime: String(item.created_at) }, formatTime(item.created_at)));
    const failed = pages.failed ? `, ${pages.failed} not read` : "";
    const actions = el("td", { class: "job-actions" });
    if (FINISHED.has(status)) {
      const label = `Result of job ${id}, saved in the format chosen above the list`;
      actions.append(actionButton("result", "Result", label, (b) => downloadResult(id, b)));
    } else {
      const label = `Follow job ${id}: its pages shown as they are read`;
      const follow = actionButton("follow", "Follow", label, () => followListed(id));
      follow.disabled = submit.disabled;
      const cancel = actionButton("cancel", "Cancel", `Cancel job ${id}`, (b) => cancelListed(id, b));
      actions.append(follow, cancel);
    }
    row.append(
      idCell,
      el("td", { class: "job-state" }, status),
      el("td", { class: "job-pages" }, `${pages.done ?? 0} of ${pages.total ?? 0}${failed}`),
      created,
      actions,
    );
    return row;
  }

  function actionButton(cls, text, label, onClick) {
    const button = el("button", { type: "button", class: `secondary ${cls}`, "aria-label": label }, text);
    button.addEventListener("click", () => onClick(button));
    return button;
  }

  jobsMore.addEventListener("click", () => loadJobs(true));
  $("jobs-refresh").addEventListener("click", () => loadJobs());

  // The result needs the key, so a plain link cannot fetch it: fetched here, then saved as <job_id>.jsonl
  // (or, in the format chosen above the list, <job_id> and its extension).
  async function downloadResult(id, button) {
    const format = $("jobs-format").value;
    const headers = authHeaders(keyInput.value.trim());
    if (format === "jsonl") headers.Accept = "application/x-ndjson";
    const query = format === "jsonl" ? "" : `?format=${encodeURIComponent(format)}`;
    const url = `v1/jobs/${encodeURIComponent(id)}/result${query}`;
    const blob = await fetchBlob(button, url, { headers }, (res) => {
      if (res.status === 404) loadJobs(); // expired or purged meanwhile
    });
    if (!blob) return;
    const type = format === "jsonl" ? "application/x-ndjson" : blob.type;
    saveBlob(new Blob([blob], { type }), `${id}${EXTENSIONS[format]}`);
  }

  async function followListed(id) {
    if (submit.disabled) return; // a document or a job is on its way already
    const key = keyInput.value.trim();
    setBusy(true, `job ${id}`);
    clearOutput();
    let done = "";
    try {
      done = await watchJob(id, authHeaders(key));
    } finally {
      setBusy(false, "", done);
    }
  }

  async function cancelListed(id, button) {
    button.disabled = true;
    let res, text;
    try {
      res = await fetch(`v1/jobs/${encodeURIComponent(id)}`, {
        method: "DELETE",
        headers: authHeaders(keyInput.value.trim()),
        cache: "no-store",
      });
      text = await res.text();
    } catch (err) {
      button.disabled = false;
      showNetworkError(err);
      return;
    }
    if (!res.ok) {
      button.disabled = false;
      showApiError(res, parseJson(text), text);
      return;
    }
    loadJobs();
  }

  if (keyInput.value.trim()) loadJobs();

  // --- helpers ----------------------------------------------------------------------------------
  function el(tag, attrs = {}, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function formatTime(value) {
    const date = new Date(value);
    return Number.isNaN(date.getTime()) ? String(value ?? "") : date.toLocaleString();
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
