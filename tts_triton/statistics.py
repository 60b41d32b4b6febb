"""Triton's per-model statistics (the statistics extension), as typed values with deltas."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

PARTS = ("compute_input", "compute_infer", "compute_output")  # of Triton's compute time
# On Triton's metrics port, per stage scheduling by levels (labels model, level): the batches
# its workers ran and the requests in them (Triton's own statistics time the hand-over there).
LEVEL_BATCHES_METRIC = "tts_level_batches_total"
LEVEL_ITEMS_METRIC = "tts_level_items_total"


@dataclass(frozen=True)
class ModelStatistics:
    requests: int  # successful requests
    inferences: int  # items inferred (a batch of 8 counts 8)
    executions: int  # model executions (one per dynamic batch)
    queue_ns: int  # total time requests waited in the queue
    compute_ns: int  # total compute (input + infer + output), per request
    batch_sizes: dict[int, int] = field(default_factory=dict)  # batch size -> executions
    # compute_ns in its three parts: inputs copied in, the model's execute, outputs copied out
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    failed: int = 0  # requests that ended in an error (a refusal included)

    def __sub__(self, before: ModelStatistics) -> ModelStatistics:
        """What happened between ``before`` and this reading."""
        sizes = {
            b: n - before.batch_sizes.get(b, 0)
            for b, n in self.batch_sizes.items()
            if n - before.batch_sizes.get(b, 0)
        }
        return ModelStatistics(
            self.requests - before.requests,
            self.inferences - before.inferences,
            self.executions - before.executions,
            self.queue_ns - before.queue_ns,
            self.compute_ns - before.compute_ns,
            dict(sorted(sizes.items())),
            self.input_ns - before.input_ns,
            self.infer_ns - before.infer_ns,
            self.output_ns - before.output_ns,
            self.failed - before.failed,
        )

    @property
    def average_batch(self) -> float:
        return self.inferences / max(1, self.executions)


def model_statistics(
    grpc_address: str, models: Sequence[str], headers: dict[str, str] | None = None
) -> dict[str, ModelStatistics]:
    """Read the statistics of ``models`` from a server's gRPC endpoint (``host:port``).

    Statistics are an admin API: ``headers`` carries the admin key (ServerProcess.admin_headers).
    """
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(grpc_address)
    out = {}
    for model in models:
        stats = client.get_inference_statistics(model, headers=headers, as_json=True)
        s = stats["model_stats"][0]
        st = s.get("inference_stats", {})
        parts = [int(st.get(k, {}).get("ns", 0)) for k in PARTS]
        out[model] = ModelStatistics(
            requests=int(st.get("success", {}).get("count", 0)),
            inferences=int(s.get("inference_count", 0)),
            executions=int(s.get("execution_count", 0)),
            queue_ns=int(st.get("queue", {}).get("ns", 0)),
            compute_ns=sum(parts),
            batch_sizes={
                int(b["batch_size"]): int(b["compute_infer"]["count"])
                for b in s.get("batch_stats", [])
            },
            input_ns=parts[0],
            infer_ns=parts[1],
            output_ns=parts[2],
            failed=int(st.get("fail", {}).get("count", 0)),
        )
    client.close()
    return out


def model_counters(metrics_url: str, names: Sequence[str]) -> dict[tuple[str, str], float]:
    """(counter, model) -> value, summed over the other labels (versions, levels), of the
    counters ``names`` at a Prometheus endpoint such as Triton's (``http://host:port/metrics``),
    read with prometheus_client's parser."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    # The parser names a counter's samples *_total, whether or not the exposition did.
    wanted = {name.removesuffix("_total"): name for name in names}
    found: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = wanted.get(s.name.removesuffix("_total"))
            if name is not None:
                key = (name, s.labels.get("model", ""))
                found[key] = found.get(key, 0.0) + s.value
    return found


def stage_statistics(
    grpc_address: str,
    metrics_url: str,
    models: Sequence[str],
    headers: dict[str, str] | None = None,
) -> dict[str, ModelStatistics]:
    """:func:`model_statistics`, with the batches (``inferences``, ``executions``; sizes
    unknown) of a model that schedules by levels taken from its own counters on the metrics
    port (Triton's statistics time only the hand-over there; a model that batches has none)."""
    stats = model_statistics(grpc_address, models, headers)
    counts = model_counters(metrics_url, (LEVEL_ITEMS_METRIC, LEVEL_BATCHES_METRIC))
    return {
        model: replace(
            s,
            inferences=int(counts[LEVEL_ITEMS_METRIC, model]),
            executions=int(counts.get((LEVEL_BATCHES_METRIC, model), 0)),
            batch_sizes={},
        )
        if (LEVEL_ITEMS_METRIC, model) in counts
        else s
        for model, s in stats.items()
    }
