"""Ingest counters: records accepted by kind, rejected by reason, unknown protobuf fields seen.

These count events in this process (Prometheus sums them across replicas); everything derived from
stored data is exported by the scrape-time collector instead.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class IngestStats:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.records = Counter(
            "smon_ingest_records",
            "Records accepted by ingest, by kind (step, gpu_sample, heartbeat, batch).",
            ["kind"],
            registry=registry,
        )
        self.rejected = Counter(
            "smon_ingest_rejected",
            "Records or batches rejected by ingest, by reason.",
            ["reason"],
            registry=registry,
        )
        self.unknown_fields = Counter(
            "smon_ingest_unknown_fields",
            "Protobuf fields this server does not know (sent by a newer agent); ignored.",
            registry=registry,
        )
        self.folded_spans = Counter(
            "smon_ingest_spans_folded",
            "Spans stored as `other` because their phase name came past their job's "
            "SMON_MAX_PHASE_NAMES distinct names (the job's summary says which job).",
            registry=registry,
        )
        self.duplicates = Counter(
            "smon_ingest_duplicate_batches",
            "Batches received again after they had been stored (agent resends); stored once.",
            registry=registry,
        )
        self.streams = Gauge(
            "smon_ingest_streams",
            "Agent streams open on this replica.",
            registry=registry,
        )
        self.flush_seconds = Gauge(
            "smon_ingest_flush_seconds",
            "The flush interval this replica's Acks ask agents for (0: as configured); past "
            "smon.shipper.MAX_FLUSH_SECONDS the replica serves more agents than it is sized for.",
            registry=registry,
        )
        self.overloaded = Counter(
            "smon_ingest_overloaded_acks",
            "Acks that asked their agent to hold back because batches waited past "
            "OVERLOAD_SECONDS from arrival to commit (the replica is past its capacity).",
            registry=registry,
        )
