"""The bench's report: each figure beside its reference, their ratio and its goal, PASS or MISS, as one table.
The goals live here: measurements only measure, and a goal is read against them when they are reported."""

from __future__ import annotations

GOAL_VS_DIRECT = 0.97
GOAL_VS_PEER = 1.3
GOAL_HEALTHZ_P99_MS = 50.0
GOAL_DECODE_MS = 40.0
GOAL_JOBS_RATIO = 0.95  # job pages/s / the same pages as synchronous requests: the queue costs nothing
GOAL_JOBS_LATENCY_RATIO = 1.25  # /v1/ocr latency beside a running job / without one
GOAL_SPIN_CPU_RATIO = 0.8  # CPU per page, ONNX Runtime's threads not spinning / spinning (its default)
GOAL_LAYOUT_RATIO = 1.2  # per page, orientation and layout on / both off, upright single-column pages
GOAL_OCRMYPDF_RATIO = 1.5  # #42: searchable PDF pages/s, the service / OCRmyPDF with Tesseract
GOAL_DEVSET_MULTI_CER = 0.05  # #41: the development set's multi-column pages' CER; and <= Tesseract's


def fmt(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("PASS" if ok else "MISS")


def healthz_p99_row(label: str, m: dict, notes: str) -> tuple[str, str, str, str, str, str, str]:
    """Measurements 3 and 6: /healthz p99 against its goal."""
    ok = m["p99_ms"] < GOAL_HEALTHZ_P99_MS if m["n"] else None
    return (label, fmt(m["p99_ms"], ".1f"), "", "", f"< {GOAL_HEALTHZ_P99_MS:g}", verdict(ok), notes)


def build_rows(res: dict) -> list[tuple[str, str, str, str, str, str, str]]:
    rows = []
    for c, m in (res.get("service_vs_direct") or {}).items():
        s, d, r = m["service"], m["direct"], m["ratio"]
        rows.append(
            (
                f"1 service / direct engine  {c}  docs/s",
                fmt(s["throughput_docs_per_s"]),
                fmt(d["throughput_docs_per_s"]),
                fmt(r),
                f">= {GOAL_VS_DIRECT}",
                verdict(None if r is None else r >= GOAL_VS_DIRECT),
                f"{s['passes']}+{d['passes']} passes x {s['docs_per_pass']} docs",
            )
        )
    for c, m in (res.get("service_vs_peer") or {}).items():
        s, p, r = m["service"], m["rapidocr_api"], m["ratio"]
        rows.append(
            (
                f"2 service / rapidocr-api   {c}  docs/s",
                fmt(s["throughput_docs_per_s"]),
                fmt(p["throughput_docs_per_s"]),
                fmt(r, ".2f"),
                f">= {GOAL_VS_PEER}",
                verdict(None if r is None else r >= GOAL_VS_PEER),
                f"{s['passes']}+{p['passes']} passes x {s['docs_per_pass']} docs",
            )
        )
    h = res.get("healthz")
    if h:
        rows.append(
            (
                f"3 /healthz p50, {h['documents_in_flight']} big docs in flight  ms",
                fmt(h["p50_ms"], ".1f"),
                "",
                "",
                "",
                "",
                f"n={h['n']}",
            )
        )
        rows.append(
            healthz_p99_row(
                "3 /healthz p99                              ms",
                h,
                f"max {h['max_ms']:.1f} ms, peak {h['max_in_service']} in service",
            )
        )
    j = res.get("jobs")
    if j:
        rows.append(
            (
                "8 bulk job / synchronous requests  pages/s",
                fmt(j["job_pages_per_s"]),
                fmt(j["sync_pages_per_s"]),
                fmt(j["ratio"]),
                f">= {GOAL_JOBS_RATIO}",
                verdict(j["ratio"] >= GOAL_JOBS_RATIO),
                f"{j['pages']} pages x {j['rounds']} rounds, medians; sync clients {j['client_concurrency']}",
            )
        )
        lat = j["latency"]
        rows.append(
            (
                "8 /v1/ocr p50 beside a job / without  ms",
                fmt(lat["job_p50_ms"], ".0f"),
                fmt(lat["idle_p50_ms"], ".0f"),
                fmt(lat["ratio"], ".2f"),
                f"<= {GOAL_JOBS_LATENCY_RATIO}",
                verdict(lat["ratio"] <= GOAL_JOBS_LATENCY_RATIO if lat["job_ran_throughout"] else None),
                f"n={lat['n']} each, one client; p95 {lat['job_p95_ms']:.0f} / {lat['idle_p95_ms']:.0f} ms"
                f"; job pages read meanwhile {lat['job_pages_meanwhile']}"
                + ("" if lat["job_ran_throughout"] else "; the job ended first: no verdict"),
            )
        )
        rows.append(
            (
                f"8 same, client pausing {lat['think_s']:g} s  ms",
                fmt(lat["think_p50_ms"], ".0f"),
                fmt(lat["idle_think_p50_ms"], ".0f"),
                fmt(lat["think_ratio"], ".2f"),
                f"<= {GOAL_JOBS_LATENCY_RATIO}",
                verdict(
                    lat["think_ratio"] <= GOAL_JOBS_LATENCY_RATIO if lat["think_ran_throughout"] else None
                ),
                f"job pages read meanwhile {lat['think_job_pages']}; p95 {lat['think_p95_ms']:.0f} ms"
                + ("" if lat["think_ran_throughout"] else "; the job ended first: no verdict"),
            )
        )
    rows += ocrmypdf_rows(res.get("ocrmypdf"))
    rows += attack_rows(res.get("attack"))
    rows += layout_rows(res.get("layout"))
    rows += devset_rows(res.get("devset"))
    dec = res.get("decode")
    if dec:
        rows.append(
            (
                "4 12 MP JPEG -> 1540 px: ours / full decode  ms",
                fmt(dec["ours_ms"], ".1f"),
                fmt(dec["full_decode_ms"], ".1f"),
                fmt(dec["ratio_ours_over_full"], ".2f"),
                f"ours <= {GOAL_DECODE_MS:g}",
                verdict(dec["ours_ms"] <= GOAL_DECODE_MS),
                f"n={dec['n']}, {dec['speedup']:.1f}x faster; "
                f"load_pages in-process {dec['in_process_ms']:.1f} ms; "
                f"half-scale decode alone {dec['decode_floor_ms']:.1f} ms",
            )
        )
    b = res.get("bomb")
    if b:
        rows.append(
            (
                "+ PNG bomb 40000x40000 refusal  ms",
                fmt(b["latency_ms"], ".1f"),
                "",
                "",
                "",
                "",
                f"n={b['n']}, HTTP {b['statuses']}",
            )
        )
        rows.append(
            (
                "+ server RSS growth (peak growth)  MiB",
                fmt(b["rss_growth_mb"], ".1f"),
                "",
                "",
                "",
                "",
                f"peak +{fmt(b['peak_rss_growth_mb'], '.1f')}, base {fmt(b['rss_before_mb'], '.0f')} MiB",
            )
        )
    return rows


def ocrmypdf_rows(m: dict | None) -> list[tuple[str, str, str, str, str, str, str]]:
    """Measurement 10: the service's searchable PDF beside OCRmyPDF's, pages/s, each side's CER."""
    if not m:
        return []
    sides = m["sides"]

    def pps(name: str) -> float | None:
        return sides.get(name, {}).get("pages_per_s")

    def about(name: str) -> str:
        s = sides.get(name, {})
        if "pages_per_s" not in s:
            return f"no figure: {s.get('error', 'not run')}"[:160]
        return f"CER {s['cer']:.3f}, {s['pages']} pages, {s['bytes'] / 2**20:.1f} MiB, s {s['seconds']}"

    head = f"{m['pages']} pages {m['dpi']} dpi, {m['cpus']} CPUs"
    r = m["ratio_service_vs_tesseract"]
    rows = [
        (
            "10 searchable PDF: service / OCRmyPDF+Tesseract  pages/s",
            fmt(pps("service")),
            fmt(pps("ocrmypdf_tesseract")),
            fmt(r, ".2f"),
            f">= {GOAL_OCRMYPDF_RATIO}",
            verdict(None if r is None else r >= GOAL_OCRMYPDF_RATIO),
            f"{head}; ours {about('service')}; Tesseract {about('ocrmypdf_tesseract')}",
        ),
        (
            "10 same: service / OCRmyPDF+ocrmypdf-rapidocr  pages/s",
            fmt(pps("service")),
            fmt(pps("ocrmypdf_rapidocr")),
            fmt(m["ratio_service_vs_rapidocr"], ".2f"),
            "",
            "",
            about("ocrmypdf_rapidocr")
            + (f"; models {', '.join(m['rapidocr_plugin']['models'])}" if m.get("rapidocr_plugin") else "")
            + (
                f"; downloads: {m['rapidocr_plugin']['downloads']}"
                if m.get("rapidocr_plugin", {}).get("downloads")
                else ""
            ),
        ),
        (
            "10 same: OCRmyPDF+fleet plugin / +Tesseract  pages/s",
            fmt(pps("ocrmypdf_fleet_plugin")),
            fmt(pps("ocrmypdf_tesseract")),
            fmt(m["ratio_fleet_plugin_vs_tesseract"], ".2f"),
            "",
            "",
            about("ocrmypdf_fleet_plugin"),
        ),
    ]
    return rows + [("10 note", "", "", "", "", "", note) for note in m["notes"]]


def layout_rows(lay: dict | None) -> list[tuple[str, str, str, str, str, str, str]]:
    if not lay:
        return []
    rows = [
        (
            "7 page, orientation+layout on / off  ms",
            fmt(lay["orientation_on_ms"], ".1f"),
            fmt(lay["before_ms"], ".1f"),
            fmt(lay["ratio"], ".2f"),
            f"<= {GOAL_LAYOUT_RATIO}",
            verdict(lay["ratio"] <= GOAL_LAYOUT_RATIO),
            f"n={lay['n']} upright 1-column pages; layout {fmt(lay['layout_ms'], '.2f')} ms vs row sort "
            f"{fmt(lay['row_sort_ms'], '.2f')}; orientation off {fmt(lay['orientation_off_ms'], '.1f')}",
        )
    ]
    (small, ms_small), (large, ms_large) = sorted(lay["dense_ms"].items())
    rows.append(
        (
            f"7 layout of a dense page, {large} / {small} lines  ms",
            fmt(ms_large, ".1f"),
            fmt(ms_small, ".1f"),
            fmt(ms_large / ms_small, ".1f"),
            "",
            "",
            f"three shuffled columns; {large / small:.0f}x the lines: ~{large / small:.0f}-5x if n log n, "
            f"~{(large / small) ** 2:.0f}x if quadratic",
        )
    )
    if "spinning_cpu_s" in lay:
        ratio = lay["not_spinning_cpu_s"] / lay["spinning_cpu_s"]
        rows.append(
            (
                "7 page CPU, threads not spinning / spinning  s",
                fmt(lay["not_spinning_cpu_s"], ".3f"),
                fmt(lay["spinning_cpu_s"], ".3f"),
                fmt(ratio, ".2f"),
                f"<= {GOAL_SPIN_CPU_RATIO}",
                verdict(ratio <= GOAL_SPIN_CPU_RATIO),
                f"n={lay['spinning_n']} two-line pages each, 2 threads; wall "
                f"{fmt(lay['not_spinning_ms'], '.0f')} ms vs {fmt(lay['spinning_ms'], '.0f')} ms",
            )
        )
    for r in lay["cer"]:
        cells = [f"{v} {r[v]['cer']:.3f}" + ("" if r[v]["rotation"] == 0 else f" (turned {r[v]['rotation']})")
                 for v in ("upright", "90", "180", "270", "photo")]  # fmt: skip
        rows.append((f"7 CER {r['page']}", "", "", "", "", "", "; ".join(cells)))
    return rows


def devset_rows(ds: dict | None) -> list[tuple[str, str, str, str, str, str, str]]:
    """Measurement 9: per kind the median CER (reading order) and bag-of-words error, ours beside Tesseract's
    (the reference), then the layout's share of the engine's time, then each page."""
    if not ds:
        return []
    tess = ds["tesseract"]
    missing = "Tesseract not installed (apt-get install tesseract-ocr tesseract-ocr-eng)"
    rows = []
    for kind, k in ds["kinds"].items():
        ours, ref = k["ours"], k.get("tesseract")
        for m, label in (("cer", "CER"), ("bow", "bag-of-words error")):
            o, r = ours[f"{m}_median"], ref[f"{m}_median"] if ref else None
            goal, ok = "", None
            if kind == "multi-column" and m == "cer":
                goal = f"<= {GOAL_DEVSET_MULTI_CER}, <= Tesseract"
                ok = o <= GOAL_DEVSET_MULTI_CER and (r is None or o <= r)
            notes = f"{k['n']} pages, median; mean {fmt(ours[f'{m}_mean'])}"
            notes += f" vs {fmt(ref[f'{m}_mean'])}" if ref else f"; {missing}"
            rows.append((f"9 {label} {kind}", fmt(o), fmt(r), fmt(o / r if r else None, ".2f"), goal,
                         verdict(ok), notes))  # fmt: skip
    engine, layout = ds["engine_ms"], ds["layout_ms"]
    ratio = engine / (engine - layout) if engine > layout else None
    rows.append(
        (
            "9 engine with layout / without, all pages  ms",
            fmt(engine, ".0f"),
            fmt(engine - layout, ".0f"),
            fmt(ratio, ".3f"),
            f"<= {GOAL_LAYOUT_RATIO}",
            verdict(None if ratio is None else ratio <= GOAL_LAYOUT_RATIO),
            f"{len(ds['pages'])} pages at {ds['dpi']} dpi; layout {layout:.1f} ms of it; {tess or missing}",
        )
    )
    for r in ds["pages"]:  # tables against their truth: tabula-py's expected CSV, or pdfplumber on the rules
        ref = "pdfplumber on the PDF's rules" if "cells_from" in r else "tabula-py's expected CSV"
        for k, tb in enumerate(r.get("tables", [])):
            shape_ok = tb["rows"][0] == tb["rows"][1] and tb["columns"][0] == tb["columns"][1]
            rows.append(
                (
                    f"9 table {r['page']}{f' #{k + 1}' if len(r['tables']) > 1 else ''}: rows x columns",
                    f"{tb['rows'][0]} x {tb['columns'][0]}",
                    f"{tb['rows'][1]} x {tb['columns'][1]}",
                    "",
                    "= the truth's",
                    verdict(shape_ok),
                    f"cells exact {tb['cells_exact']:.1%} (case and dot leaders aside; rows aligned "
                    f"{tb.get('cells_exact_aligned', 0.0):.1%}), mean cell CER {tb['cell_cer']:.3f}; "
                    f"reference: {ref}",
                )
            )
    for r in ds["pages"]:
        t = r.get("tesseract")
        rows.append(
            (
                f"9 CER {r['page']} ({r['kind']})",
                fmt(r["ours"]["cer"]),
                fmt(t["cer"] if t else None),
                "",
                "",
                "",
                f"bag-of-words {fmt(r['ours']['bow'])} vs {fmt(t['bow'] if t else None)}; "
                f"{r['ref_words']} words, {r['lines']} lines, turned {r['rotation']}; "
                f"{r['engine_ms']:.0f} ms (layout {r['layout_ms']:.1f}) vs "
                + (f"{r['tesseract_ms']:.0f} ms" if t else "-"),
            )
        )
    return rows


def _statuses(statuses: dict[str, int]) -> str:
    return ", ".join(f"{n}x {code}" for code, n in statuses.items()) or "none answered"


def attack_rows(at: dict | None) -> list[tuple[str, str, str, str, str, str, str]]:
    """Measurement 6's rows: /healthz p50 and p99 under attack, then what the attack was and got."""
    if not at:
        return []
    mp, pdf = at["multipart"], at["nested_pdf"]
    depths = "/".join(sorted(pdf["depths"], reverse=True)) or str(pdf["depth"])
    by_depth = len(pdf["depths"]) > 1  # a depth refused early, then a shallower one: each one's statuses
    what = f"{mp['bytes'] / 2**20:.0f} MiB multipart of {mp['parts']} parts + nested PDF depth {depths}"

    def attacker(a: dict, label: str) -> str:
        more = [f"{a[k]} {k.replace('_', ' ')}" for k in ("timed_out", "abandoned") if a[k]]
        took = f"p50 {fmt(a['latency_p50_s'], '.1f')} s"
        return f"{label} {_statuses(a['statuses'])} ({', '.join([took, *more])})"

    return [
        (f"6 /healthz p50 under attack ({what})  ms", fmt(at["p50_ms"], ".1f"), *[""] * 4, f"n={at['n']}"),
        healthz_p99_row(
            "6 /healthz p99 under attack  ms",
            at,
            f"max {at['max_ms']:.1f} ms, /healthz {_statuses(at['healthz_statuses'])}",
        ),
        (
            f"6 attack requests started in {at['window_s']:g} s (HTTP status)",
            "",
            "",
            "",
            "",
            "",
            attacker(mp, f"A multipart at {mp['upload_mbit_s']:g} Mbit/s:")
            + "; "
            + attacker(pdf, "B nested PDF:")
            + "".join(f"; depth {d}: {_statuses(st)}" for d, st in pdf["depths"].items() if by_depth)
            + f"; drained {fmt(at['drain_s'], '.1f')} s after",
        ),
    ]


def print_report(res: dict) -> None:
    header = ("measurement", "ours", "reference", "ratio", "goal", "result", "n / notes")
    rows = [header, *build_rows(res)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)
    print()
    print(f"ocrfleet bench ({res['mode']}), {res['machine']['cpus']} CPUs, load {res['machine']['loadavg']}")
    print(f"ours: {res['settings_text']}")
    print("documents: " + "; ".join(res["documents"]))
    print(line)
    for i, r in enumerate(rows):
        print(
            "  ".join(
                c.ljust(w) if j == 0 or j == 6 else c.rjust(w)
                for j, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
        if i == 0:
            print(line)
    print(line)
    for name, m in (res.get("service_vs_peer") or {}).items():
        lines_ours = m["service"]["lines"]
        lines_peer = m["rapidocr_api"]["lines"]
        print(
            f"lines recognised per doc ({name}) ours / rapidocr-api: "
            + ", ".join(f"{k} {lines_ours.get(k, '-')}/{lines_peer.get(k, '-')}" for k in lines_ours)
        )
        break
    for err in res["errors"]:
        print(f"ERROR: {err}")
    print()
