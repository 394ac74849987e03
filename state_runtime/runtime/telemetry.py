"""Per-batch and per-store figures over OpenTelemetry, from the process that commits.

``StatefulQuery(..., telemetry=OtelExport("http://collector:4318"))`` (the ``otel`` extra)
exports, after each committed batch, the figures the catalog records (:meth:`BatchMetrics.
figures`: rows in, keys updated, bytes written, commit and batch time, cache hit rate, ...) and
the watermark's lag behind the wall clock, as gauges named ``state_runtime.batch.<figure>``
with the attributes ``state.root`` and ``state.query``; and for each store of the batch its
rows, keys updated, bytes written, load time and status (0 healthy, 2 broken: the code of
``statestore health``'s exit) as ``state_runtime.store.<figure>``, with ``state.operator``,
``state.partition`` and ``state.store`` too. A batch that finds a store's file lost exports
that store's status 2 before it fails.

OTLP over HTTP (protobuf). The export is pushed at the end of each batch (a flush), and is best
effort: a collector that is down costs a warning, never a batch. The query travels to a Spark
Connect server's foreachBatch worker pickled: the exporter is built on first use in the
process that commits.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from state_runtime.catalog import BatchMetrics, StoreKey
from state_runtime.errors import MissingExtra
from state_runtime.redaction import get_logger

log = get_logger(__name__)

HEALTHY, BROKEN = 0, 2  # statestore health's exit codes (the monitoring-plugin convention)


@dataclass(frozen=True)
class StoreFigures:
    """One store's share of a committed batch."""

    key: StoreKey
    rows: int
    keys_updated: int
    bytes_written: int
    load_ms: float


def _unit(name: str) -> str:
    if name.endswith("_ms"):
        return "ms"
    return "By" if name.startswith("bytes") or name.endswith("bytes") else "1"


@dataclass
class OtelExport:
    """Where to send the figures: an OTLP/HTTP endpoint (``http://host:4318``; the metrics go
    to ``<endpoint>/v1/metrics``), with ``headers`` (an API key) and a ``timeout_s``."""

    endpoint: str
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 10.0
    _meter: Any = field(default=None, repr=False)
    _provider: Any = field(default=None, repr=False)
    _gauges: dict[str, Any] = field(default_factory=dict, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_meter": None, "_provider": None, "_gauges": {}}

    def _gauge(self, name: str) -> Any:
        if self._meter is None:
            self._start()
        found = self._gauges.get(name)
        if found is None:
            found = self._gauges[name] = self._meter.create_gauge(name, unit=_unit(name))
        return found

    def _start(self) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
            from opentelemetry.sdk.resources import Resource
        except ModuleNotFoundError as exc:
            raise MissingExtra("exporting figures over OpenTelemetry", "otel", exc.name) from exc
        exporter = OTLPMetricExporter(
            endpoint=self.endpoint.rstrip("/") + "/v1/metrics",
            headers=self.headers,
            timeout=self.timeout_s,
        )
        # pushed by flush() after each batch; the periodic export only backs it up
        reader = PeriodicExportingMetricReader(exporter, export_interval_millis=60_000)
        resource = Resource.create({"service.name": "state_runtime"})
        self._provider = MeterProvider(metric_readers=[reader], resource=resource)
        self._meter = self._provider.get_meter("state_runtime")

    def batch(
        self,
        root: str,
        query_id: str,
        metrics: BatchMetrics,
        stores: Sequence[StoreFigures],
    ) -> None:
        """Export a committed batch's figures and its stores' (best effort)."""
        query = {"state.root": root, "state.query": query_id}
        try:
            figures = dict(metrics.figures())
            watermark = metrics.extra.get("watermark_ms")
            if isinstance(watermark, int | float) and watermark > 0:
                figures["watermark_lag_ms"] = time.time() * 1000 - watermark
            for name, value in figures.items():
                self._gauge(f"state_runtime.batch.{name}").set(value, query)
            for store in stores:
                labels = query | _store_labels(store.key)
                for name, value in (
                    ("rows", store.rows),
                    ("keys_updated", store.keys_updated),
                    ("bytes_written", store.bytes_written),
                    ("load_ms", store.load_ms),
                    ("status", HEALTHY),
                ):
                    self._gauge(f"state_runtime.store.{name}").set(value, labels)
            self.flush()
        except MissingExtra:
            raise
        except Exception as exc:  # the collector is down or refuses: a warning, not a failure
            log.warning("OpenTelemetry export to %s failed: %s", self.endpoint, exc)

    def lost(self, query_id: str, key: StoreKey) -> None:
        """A store whose state is lost: status 2 (broken), exported at once."""
        labels = {"state.root": key.root, "state.query": query_id} | _store_labels(key)
        try:
            self._gauge("state_runtime.store.status").set(BROKEN, labels)
            self.flush()
        except MissingExtra:
            raise
        except Exception as exc:
            log.warning("OpenTelemetry export to %s failed: %s", self.endpoint, exc)

    def flush(self) -> None:
        if self._provider is not None:
            self._provider.force_flush(timeout_millis=int(self.timeout_s * 1000))

    def close(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()
            self._provider = self._meter = None
            self._gauges = {}


def _store_labels(key: StoreKey) -> dict[str, str | int]:
    return {
        "state.operator": key.store.operator_id,
        "state.partition": key.store.partition_id,
        "state.store": key.store.store_name,
    }
