"""perf_analyzer load tests: concurrency sweeps over ``tts`` (and each stage), CSV and a plot.

    python -m perf_analyzer_configs.run            # full sweep (make perf), several minutes
    python -m perf_analyzer_configs.run --smoke    # a few seconds per stage (make perf-smoke, CI)

Starts its own tritonserver unless --grpc-port/--http-port point at a running one. Inputs for
``acoustic`` and ``vocoder`` alone are captured from the real phonemizer and acoustic outputs
for the same texts, so each stage can be loaded in isolation. Audio seconds per second are
requests/s x the mean audio duration of the input set (measured on the same texts).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tritonclient.utils import InferenceServerException

from bench.baselines import repository_for
from perf_analyzer_configs.report import STAGES, Row, make_row, plot, write_csv
from tests.support.processes import ServerProcess
from tts_front.security import admin_headers, admin_key
from tts_launcher.stub_healing import cpu_seconds, stubs_by_model
from tts_triton.statistics import model_statistics
from tts_wire.split import SENTENCE_END

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SMOKE_REQUESTS = 6  # per count window in --smoke
SMOKE_TEXTS = 6  # the first of tts_mixed.json's texts in --smoke: two of each length
SMOKE_STREAMS = 2  # the same for tts_stream
# perf_analyzer has no switch to turn its stability check off; a tolerance this wide does it.
# (999 % was not enough: the 2.51 Python backend stalls some requests ~500 ms, so a window's
# p99 can be 100 times the next one's; docs/performance.md.)
NO_STABILITY_GATE = 1_000_000


def perf_analyzer_binary() -> Path:
    return Path(sys.executable).parent / "perf_analyzer"


def perf_analyzer_env() -> dict[str, str]:
    """perf_analyzer links libcudart.so.12 even on a CPU machine: the pip CUDA runtime has it."""
    import nvidia.cuda_runtime

    # The folder that holds the .so.12 (beside a CUDA 13 torch, the namespace has others too).
    folders = [Path(p) / "lib" for p in nvidia.cuda_runtime.__path__]
    lib = next((f for f in folders if (f / "libcudart.so.12").exists()), folders[0])
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(lib), env.get("LD_LIBRARY_PATH")]))
    return env


def load_texts(path: Path) -> list[str]:
    return [entry["text"][0] for entry in json.loads(path.read_text())["data"]]


def write_texts(path: Path, texts: list[str]) -> None:
    """``texts`` as a perf_analyzer input file (the format :func:`load_texts` reads)."""
    path.write_text(json.dumps({"data": [{"text": [t]} for t in texts]}))


def capture_inputs(grpc_port: int, texts: list[str], out_dir: Path) -> dict[str, Path]:
    """Run the real stages once per text; write perf_analyzer input files for each stage."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"localhost:{grpc_port}")

    def infer(model: str, **arrays: np.ndarray) -> grpcclient.InferResult:
        inputs = []
        for name, array in arrays.items():
            dtype = (
                "BYTES" if array.dtype == np.object_ else grpcclient.np_to_triton_dtype(array.dtype)
            )
            tensor = grpcclient.InferInput(name, list(array.shape), dtype)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        return client.infer(model, inputs)

    acoustic, vocoder = [], []
    for text in texts:
        ids = infer("phonemizer", text=np.array([[text.encode()]], dtype=np.object_)).as_numpy(
            "phoneme_ids"
        )[0]
        speed = np.array([[1.0]], np.float32)
        latent = infer("acoustic", phoneme_ids=ids[None], speed=speed).as_numpy("latent")[0]
        acoustic.append(
            {"phoneme_ids": {"content": ids.tolist(), "shape": [len(ids)]}, "speed": [1.0]}
        )
        vocoder.append(
            {
                "latent": {
                    "content": np.round(latent, 4).reshape(-1).tolist(),
                    "shape": list(latent.shape),
                }
            }
        )
    files = {
        "phonemizer": out_dir / "phonemizer.json",
        "acoustic": out_dir / "acoustic.json",
        "vocoder": out_dir / "vocoder.json",
    }
    files["phonemizer"].write_text(json.dumps({"data": [{"text": [t]} for t in texts]}))
    files["acoustic"].write_text(json.dumps({"data": acoustic}))
    files["vocoder"].write_text(json.dumps({"data": vocoder}))
    return files


def mean_audio_seconds(grpc_port: int, texts: list[str]) -> float:
    from tts_client import TTSClient

    with TTSClient(f"grpc://localhost:{grpc_port}") as client:
        return float(np.mean([a.duration for a in client.synthesize_many(texts)]))


def mean_stream_seconds(grpc_port: int, paragraphs: list[str]) -> float:
    from tts_client import TTSClient

    with TTSClient(f"grpc://localhost:{grpc_port}") as client:
        rate = client.sample_rate
        return float(
            np.mean([sum(len(c.samples) for c in client.stream(p)) / rate for p in paragraphs])
        )


def perf_analyzer_command(
    model: str,
    protocol: str,
    port: int,
    metrics_port: int,
    input_file: Path,
    concurrency: int,
    interval_ms: int,
    max_trials: int,
    stability: int,
    csv_path: Path,
    request_count: int = 0,
) -> list[str]:
    """perf_analyzer's command line for one point of the sweep."""
    cmd = [
        str(perf_analyzer_binary()),
        "-m", model,
        "-i", protocol,
        "-u", f"localhost:{port}",
        "--input-data", str(input_file),
        "--concurrency-range", f"{concurrency}:{concurrency}",
        "--measurement-interval", str(interval_ms),
        "--max-trials", str(max_trials),
        "--stability-percentage", str(stability),
        "--percentile", "99",
        "--collect-metrics",
        "--metrics-url", f"localhost:{metrics_port}/metrics",
        "-f", str(csv_path),
    ]  # fmt: skip
    if model == "tts_stream":
        cmd += ["--streaming"]  # decoupled model: gRPC streaming
        # A paragraph takes seconds: count requests per window instead of timing windows.
        request_count = request_count or max(2, concurrency * 2)
    if request_count:
        # Count windows end when that many requests completed, however busy the machine is,
        # so a slow machine gives slow figures instead of empty (unstable) time windows.
        cmd += ["--measurement-mode", "count_windows",
                "--measurement-request-count", str(request_count)]  # fmt: skip
    return cmd


def run_perf_analyzer(cmd: list[str], csv_path: Path, log) -> dict[str, str]:
    """One perf_analyzer run (``cmd``: :func:`perf_analyzer_command`, writing ``csv_path``);
    its CSV row, with ``stable`` and ``load_cpu_s`` added."""
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    started = os.times()
    result = subprocess.run(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=perf_analyzer_env(), timeout=600
    )
    stable = True
    stability = cmd.index("--stability-percentage") + 1
    if result.returncode == 2 and int(cmd[stability]) < NO_STABILITY_GATE:
        # Exit 2: no stable window on a noisy machine. Measure again without the stability
        # gate and say so in the results rather than dropping the point.
        stable = False
        cmd[stability] = str(NO_STABILITY_GATE)
        log.write("unstable: measuring again without the stability gate\n")
        log.flush()
        result = subprocess.run(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=perf_analyzer_env(), timeout=600
        )
    if result.returncode != 0:
        raise RuntimeError(f"perf_analyzer failed ({result.returncode}): {' '.join(cmd)}")
    with open(csv_path) as f:
        row = next(csv.DictReader(f))
    row["stable"] = str(stable).lower()
    ended = os.times()  # perf_analyzer's own CPU: is the load generator the limit?
    row["load_cpu_s"] = str(
        ended.children_user + ended.children_system
        - started.children_user - started.children_system
    )  # fmt: skip
    return row


def children(pids: set[int]) -> set[int]:
    """The direct children of ``pids`` (a stub's phonemizer workers), from /proc."""
    found = set()
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*/children"):
            try:
                found.update(int(c) for c in task.read_text().split())
            except OSError:
                continue
    return found


class CpuMeter:
    """CPU seconds of a server's processes over a run: tritonserver, each model's stubs and
    their children (the phonemizer's espeak-ng workers, as ``<model> workers``)."""

    def __init__(self, server_pid: int | None, models: list[str]) -> None:
        self.server_pid, self.models = server_pid, models

    def read(self) -> dict[str, float]:
        if self.server_pid is None:
            return {}
        cpu = {"tritonserver": cpu_seconds({self.server_pid})}
        for model, pids in stubs_by_model(self.server_pid, self.models).items():
            cpu[model] = cpu_seconds(pids)
            workers = children(pids)
            if workers:
                cpu[f"{model} workers"] = cpu_seconds(workers)
        return cpu


def prepare(args, grpc_port: int, work: Path) -> tuple[dict[str, Path], dict[str, float]]:
    """Each model's perf_analyzer input file (in ``work``) and the mean audio seconds of one of
    its requests."""
    texts = load_texts(args.texts)
    work.mkdir(parents=True, exist_ok=True)
    texts_file, paragraphs_file = args.texts, args.paragraphs
    if args.smoke:
        # Seconds, not minutes: a few texts of each length, and streams of two sentences
        # (a whole paragraph took a quarter of the smoke's time; two sentences are two chunks).
        texts = texts[:SMOKE_TEXTS]
        paragraphs = load_texts(args.paragraphs)
        paragraphs = [" ".join(SENTENCE_END.split(p.strip())[:2]) for p in paragraphs]
        texts_file, paragraphs_file = work / "tts_smoke.json", work / "tts_stream_smoke.json"
        write_texts(texts_file, texts)
        write_texts(paragraphs_file, paragraphs)
    # The stages' own inputs, only where a stage is measured (the public models need none).
    stages = set(args.models) & set(STAGES)
    inputs = capture_inputs(grpc_port, texts, work) if stages else {}
    inputs["tts"] = texts_file
    inputs["tts_stream"] = paragraphs_file
    # tts, acoustic and vocoder are loaded with the same texts: one mean duration serves all.
    per_text = mean_audio_seconds(grpc_port, texts)
    seconds = dict.fromkeys(("tts", *STAGES), per_text)
    if "tts_stream" in args.models:
        seconds["tts_stream"] = mean_stream_seconds(grpc_port, load_texts(inputs["tts_stream"]))
    print(
        f"{len(texts)} texts from {args.texts.name}, mean audio {seconds['tts']:.2f} s", flush=True
    )
    return inputs, seconds


def sweep(
    args,
    grpc_port: int,
    http_port: int,
    metrics_port: int,
    out_dir: Path,
    headers: dict | None,
    server_pid: int | None = None,
) -> list[Row]:
    work = out_dir / "inputs"
    inputs, seconds = prepare(args, grpc_port, work)
    rows: list[Row] = []
    meter = CpuMeter(server_pid, [*STAGES, "tts_stream"])
    with open(out_dir / "perf_analyzer.log", "w") as log:
        for model in args.models:
            # Triton streams (decoupled models) over gRPC only.
            for protocol in ["grpc"] if model == "tts_stream" else args.protocols:
                port = grpc_port if protocol == "grpc" else http_port
                for c in args.concurrency:
                    before = model_statistics(f"localhost:{grpc_port}", STAGES, headers)
                    cpu_before = meter.read()
                    csv_path = work / f"{model}_{protocol}_{c}.csv"
                    count = args.request_count
                    if args.smoke and model == "tts_stream":
                        # A stream lasts seconds: 3 windows of 6 took half the smoke's time.
                        count = SMOKE_STREAMS
                    cmd = perf_analyzer_command(
                        model, protocol, port, metrics_port, inputs[model], c,
                        args.interval_ms, args.max_trials, args.stability_percentage,
                        csv_path, count,
                    )  # fmt: skip
                    r = run_perf_analyzer(cmd, csv_path, log)
                    after = model_statistics(f"localhost:{grpc_port}", STAGES, headers)
                    cpu = {k: v - cpu_before.get(k, 0.0) for k, v in meter.read().items()}
                    cpu["perf_analyzer"] = float(r["load_cpu_s"])
                    rows.append(
                        make_row(model, protocol, c, r, before, after, seconds.get(model, 0.0), cpu)
                    )
                    row = rows[-1]
                    print(
                        f"{model:<10} {protocol:<4} c={c:<3} {row.requests_per_s:7.1f} req/s "
                        f"{row.audio_s_per_s:6.1f} audio s/s  p50 {row.p50_ms:7.0f} ms "
                        f"p99 {row.p99_ms:7.0f} ms",
                        flush=True,
                    )
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m perf_analyzer_configs.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--smoke", action="store_true", help="c=2, 1 s windows, a few seconds per stage"
    )
    parser.add_argument("--models", nargs="+", default=None, help="default: tts acoustic vocoder")
    parser.add_argument("--protocols", nargs="+", default=["grpc", "http"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--texts", type=Path, default=HERE / "tts_mixed.json")
    parser.add_argument("--paragraphs", type=Path, default=HERE / "tts_stream_paragraphs.json")
    parser.add_argument("--interval-ms", type=int, default=5000)
    parser.add_argument("--max-trials", type=int, default=4)
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "perf")
    parser.add_argument("--grpc-port", type=int, help="use a running server (with --http-port)")
    parser.add_argument("--http-port", type=int)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument(
        "--profile",
        help="start the server with --model-config-name=PROFILE (e.g. gpu, host-ceiling)",
    )
    parser.add_argument("--plot", type=Path, help="also copy the plot here (e.g. docs/perf.png)")
    parser.add_argument("--stability-percentage", type=int, default=25)
    parser.add_argument(
        "--request-count", type=int, default=0,
        help="count windows of this many requests instead of time windows (0: time windows)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.smoke:
        # Proves every config still loads and answers; no stable figures are asked of it.
        # Count windows: on a busy 2-core machine a 1 s time window may see no request end.
        args.concurrency, args.interval_ms, args.max_trials = [2], 1000, 3
        args.stability_percentage, args.request_count = NO_STABILITY_GATE, SMOKE_REQUESTS
        args.models = args.models or ["tts", "phonemizer", "acoustic", "vocoder", "tts_stream"]
    args.models = args.models or ["tts", "acoustic", "vocoder", "tts_stream"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not perf_analyzer_binary().exists():
        raise SystemExit(f"{perf_analyzer_binary()} missing: install tritonclient[all]==2.51.0")
    args.out.mkdir(parents=True, exist_ok=True)

    start = time.perf_counter()
    if args.grpc_port:
        # Statistics are open by default; a server that closed them needs its $TTS_ADMIN_KEY.
        key, configured = admin_key()
        headers = admin_headers(key) if configured else None
        http_port = args.http_port or 8000
        try:
            rows = sweep(args, args.grpc_port, http_port, args.metrics_port, args.out, headers)
        except InferenceServerException as e:
            if e.status() != "StatusCode.PERMISSION_DENIED":
                raise
            # The front door of `make serve` keeps the stages for the admin key, which
            # perf_analyzer could carry only on its command line (seen by every local user).
            raise SystemExit(
                f"{e.message()}\nMeasure the public models alone (--models tts tts_stream), or "
                "the stages on a server that opens them (make serve "
                "TTS_FRONT_PUBLIC_MODELS='*')."
            ) from None
    else:
        log = Path(tempfile.mkdtemp(prefix="perf-")) / "triton.log"
        extra = [f"--model-config-name={args.profile}"] if args.profile else []
        # A baseline (host-ceiling's null engine) is in a repository of its own.
        repository = repository_for(args.profile, log.parent / "repository")
        cache = ROOT / ".cache/triton"
        with ServerProcess(repository, log, cache_dir=cache, extra_args=extra) as srv:
            ports = (srv.grpc_port, srv.http_port, srv.metrics_port)
            rows = sweep(args, *ports, args.out, srv.admin_headers, srv.process.pid)
    write_csv(rows, args.out / "results.csv")
    wrote = [args.out / "results.csv"]
    if args.plot or not args.smoke:  # (matplotlib: the development set; a smoke run needs none)
        plot(
            rows, args.out / "perf.png", f"perf_analyzer, {args.texts.name}, {os.cpu_count()} CPUs"
        )
        wrote.append(args.out / "perf.png")
    if args.plot:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        args.plot.write_bytes((args.out / "perf.png").read_bytes())
    print(f"wrote {' and '.join(map(str, wrote))} in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
