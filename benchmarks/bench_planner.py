"""Latency and throughput of the trip planner service (POST /plan) on loopback.

    .venv/bin/python benchmarks/bench_planner.py [--region c101] [--clients 4] [--requests 25]
        [--beams 16] [--method beam] [--checkpoint FILE | --use-registry]

Starts the planner on a local Ray (127.0.0.1, a free port). By default it registers a model in a
temporary MLflow sqlite store (``--checkpoint``, else an untrained PointerNet: same network and
cost per step as a trained one); ``--use-registry`` serves the existing champion of
``$MLFLOW_TRACKING_URI`` / the project's store instead. Requests are the region's validation
tourists (start, times, scores). After a warm-up it measures one client alone, then
``--clients`` concurrent clients of ``--requests`` requests each, and prints p50/p95 latency
(client side, HTTP included), the server's solve time and the throughput. Target: p50 under
300 ms with beam width 16 on a 100-point region on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np


def _post(url: str, body: dict) -> tuple[int, float, dict]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            out = json.loads(resp.read())
            status = resp.status
    except urllib.error.HTTPError as exc:
        status, out = exc.code, json.loads(exc.read() or b"{}")
    return status, (time.perf_counter() - t0) * 1e3, out


def _bodies(cat, region_id: str, method: str, beams: int) -> list[dict]:
    val = cat.validation(region_id)
    out = []
    for i in range(len(val)):
        body = {"region": region_id, "start": {"x": float(val.start_xy[i, 0]),
                                               "y": float(val.start_xy[i, 1])},
                "t_start": max(0.0, float(val.t_start[i])), "t_end": float(val.t_end[i]),
                "scores": [float(s) for s in val.scores[i, 1:-1]], "method": method}
        if method == "beam":
            body["beams"] = beams
        out.append(body)
    return out


def _summary(name: str, ms: list[float], solve_ms: list[float], seconds: float) -> None:
    a = np.asarray(ms)
    print(f"{name:<22} n={a.size:<4} p50 {np.median(a):7.1f} ms  p95 "
          f"{np.percentile(a, 95):7.1f} ms  max {a.max():7.1f} ms  server solve p50 "
          f"{statistics.median(solve_ms):6.1f} ms  throughput {a.size / seconds:6.2f} req/s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--region", default="c101")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--requests", type=int, default=25, help="requests per client")
    parser.add_argument("--sequential", type=int, default=20,
                        help="requests of the single-client pass (0 = skip)")
    parser.add_argument("--method", default="beam", choices=["greedy", "beam", "active-search"])
    parser.add_argument("--beams", type=int, default=16)
    parser.add_argument("--checkpoint", type=Path, default=None)
    parser.add_argument("--use-registry", action="store_true",
                        help="serve the existing champion instead of registering a model")
    parser.add_argument("--solve-threads", type=int, default=1,
                        help="concurrent solves in the replica (default 1)")
    parser.add_argument("--catalog", type=Path, default=None)
    args = parser.parse_args(argv)
    if not (1 <= args.clients <= 16 and 1 <= args.requests <= 200):
        parser.error("keep the load bounded: 1..16 clients, 1..200 requests each")

    from optw.catalog import open_catalog
    from optw.serve import start_planner, stop_planner
    from optw.tracking import champion, get_client, tracking_uri
    from optw.tracking.server import free_port

    cat = open_catalog(args.catalog)
    region = cat.region(args.region)
    tmp = tempfile.TemporaryDirectory(prefix="optw-bench-planner-")
    if args.use_registry:
        uri = tracking_uri()
        if champion(args.region, uri=uri) is None:
            parser.error(f"no champion for {args.region} in {uri}")
    else:
        import torch

        from optw.model import ModelConfig, PointerNet, save_model
        from optw.tracking import register_version, start_job_run

        uri = f"sqlite:///{Path(tmp.name) / 'mlflow.db'}"
        os.environ["MLFLOW_TRACKING_URI"] = uri
        get_client(uri)
        ckpt = args.checkpoint
        if ckpt is None:
            torch.manual_seed(0)
            ckpt = save_model(PointerNet(ModelConfig()), Path(tmp.name) / "untrained.pt")
        run_id = start_job_run("bench-planner", {"checkpoint": str(ckpt)}, uri=uri).child(
            "train", args.region)
        register_version(args.region, ckpt, run_id, {"val_score": 0.0}, uri=uri,
                         region_data=region)
    print(f"region {args.region} ({region.n_points} points), {args.method}"
          + (f" width {args.beams}" if args.method == "beam" else "") + f", store {uri}")

    t0 = time.perf_counter()
    url = start_planner(port=free_port(), catalog=cat.path, tracking_uri=uri,
                        solve_threads=args.solve_threads, ray_cpus=os.cpu_count())
    print(f"planner up at {url} in {time.perf_counter() - t0:.1f} s")
    try:
        bodies = _bodies(cat, args.region, args.method, args.beams)
        plan = f"{url}/plan"
        for body in bodies[:3]:  # warm-up: model load, first passes
            status, _, out = _post(plan, body)
            if status != 200:
                raise SystemExit(f"warm-up request failed: {status} {out}")
        failures = 0
        if args.sequential:
            ms, solve = [], []
            t0 = time.perf_counter()
            for i in range(args.sequential):
                status, lat, out = _post(plan, bodies[i % len(bodies)])
                failures += status != 200
                ms.append(lat)
                solve.append(out.get("solve_ms", float("nan")))
            _summary("1 client", ms, solve, time.perf_counter() - t0)

        def client(c: int) -> list[tuple[int, float, float]]:
            res = []
            for i in range(args.requests):
                status, lat, out = _post(plan, bodies[(c * args.requests + i) % len(bodies)])
                res.append((status, lat, out.get("solve_ms", float("nan"))))
            return res

        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            results = [r for rs in pool.map(client, range(args.clients)) for r in rs]
        wall = time.perf_counter() - t0
        failures += sum(status != 200 for status, _, _ in results)
        _summary(f"{args.clients} clients x {args.requests}", [r[1] for r in results],
                 [r[2] for r in results], wall)
        print(f"failed requests: {failures}")
        return 1 if failures else 0
    finally:
        stop_planner()
        tmp.cleanup()


if __name__ == "__main__":
    raise SystemExit(main())
