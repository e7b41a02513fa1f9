"""The server's Prometheus metrics, in a registry of its own (not prometheus_client's global one,
so two servers in one process, or a test, never share counts)."""

from __future__ import annotations

# Seconds; a tiny CPU model answers in milliseconds, a large one on a GPU in tens of seconds.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0)


class Metrics:
    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.requests = Counter("dayzero_requests", "HTTP requests answered, by endpoint and "
                                "status code", ["endpoint", "status"], registry=r)
        self.finished = Counter("dayzero_sequences_finished", "Sequences ended, by reason "
                                "(stop, length, cancelled, error)", ["reason"], registry=r)
        self.ttft = Histogram("dayzero_time_to_first_token_seconds", "From a request's "
                              "admission to its first generated token", registry=r,
                              buckets=_LATENCY_BUCKETS)
        self.tpot = Histogram("dayzero_time_per_output_token_seconds", "Mean time between a "
                              "request's generated tokens after the first", registry=r,
                              buckets=_LATENCY_BUCKETS)
        self.queue_depth = Gauge("dayzero_queue_depth", "Requests admitted and still waiting "
                                 "for their first token", registry=r)
        self.running = Gauge("dayzero_running_sequences", "Sequences in the scheduler's "
                             "running set", registry=r)
        self.kv_used = Gauge("dayzero_kv_blocks_used", "KV cache blocks held by sequences",
                             registry=r)
        self.kv_free = Gauge("dayzero_kv_blocks_free", "KV cache blocks free", registry=r)
        self.kv_peak = Gauge("dayzero_kv_blocks_peak", "The most KV cache blocks held at once "
                             "since start-up", registry=r)
        self.preemptions = Counter("dayzero_preemptions", "Sequences preempted (blocks freed, "
                                   "recomputed later) when the KV cache ran out", registry=r)
        self.prompt_tokens = Counter("dayzero_prompt_tokens", "Prompt tokens admitted",
                                     registry=r)
        self.prefix_queries = Counter("dayzero_prefix_cache_queries", "Prompt tokens looked "
                                      "up in the prefix cache", registry=r)
        self.prefix_hits = Counter("dayzero_prefix_cache_hits", "Prompt tokens found in the "
                                   "prefix cache (their KV blocks reused, not computed)",
                                   registry=r)
        self.kv_cached = Gauge("dayzero_kv_blocks_cached", "KV cache blocks named by a prefix "
                               "digest, held by a sequence or kept for reuse", registry=r)
        self.generated_tokens = Counter("dayzero_generation_tokens", "Tokens generated",
                                        registry=r)
        # where the engine thread's time goes, and how full its steps are
        self.engine_seconds = Counter("dayzero_engine_seconds", "The engine thread's time by "
                                      "phase: step (planning, the model, sampling), stream "
                                      "(handing tokens to requests), commands (admissions, "
                                      "cancellations), idle (waiting for a request)",
                                      ["phase"], registry=r)
        self.steps = Counter("dayzero_steps", "Batched steps run", registry=r)
        self.step_tokens = Counter("dayzero_step_tokens", "Tokens the steps ran (prompt "
                                   "chunks and decoded tokens)", registry=r)
        self.step_sequences = Counter("dayzero_step_sequences", "Sequences in the steps, summed "
                                      "over steps (divided by dayzero_steps_total: the mean "
                                      "batch)", registry=r)

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
