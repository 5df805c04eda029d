"""The server's Prometheus metrics (`GET /metrics`), in a registry of its own per app."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("mdlm_requests",
                                "Requests answered, by endpoint and HTTP status.",
                                ["endpoint", "status"], registry=self.registry)
        self.queue = Gauge("mdlm_queue_depth", "Requests waiting for the worker.",
                           registry=self.registry)
        self.running = Gauge("mdlm_running_requests", "Requests being sampled.",
                             registry=self.registry)
        self.rows = Histogram("mdlm_batch_rows", "Rows of requests in each network call "
                              "(the rest of the call's fixed shape is padding).",
                              buckets=ROW_BUCKETS, registry=self.registry)
        self.calls = Counter("mdlm_network_calls", "Network calls of the model.",
                             registry=self.registry)
        self.call_seconds = Counter("mdlm_network_seconds", "Seconds spent in network calls.",
                                    registry=self.registry)
        self.latency = Histogram("mdlm_request_seconds", "Seconds from a request's arrival "
                                 "to its last byte, by endpoint.", ["endpoint"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.samples = Counter("mdlm_samples", "Sequences sampled (choices).",
                               registry=self.registry)

    # what the worker reports (from its thread)
    def network_call(self, rows: int, seconds: float) -> None:
        self.calls.inc()
        self.rows.observe(rows)
        self.call_seconds.inc(seconds)

    def queue_depth(self, n: int) -> None:
        self.queue.set(n)

    def answered(self, endpoint: str, status: int, seconds: float | None = None) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        if seconds is not None:
            self.latency.labels(endpoint).observe(seconds)

    def text(self) -> bytes:
        return generate_latest(self.registry)
