"""Figures over OpenTelemetry from the committing process, and the loss paragraph through
``foreachBatch``: a real Structured Streaming query exports each batch's and each store's
figures to an OTLP/HTTP endpoint served in this test (a real HTTP server decoding the OTLP
protobuf requests); after a store's folder is deleted, the restarted stream fails, its
``StreamingQueryException`` carries the loss paragraph that ``failure_paragraph`` shows once, and
the store's status 2 (broken) reaches the endpoint."""

from __future__ import annotations

import dataclasses
import gzip
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from state_runtime.catalog import Catalog
from state_runtime.errors import StateLost
from state_runtime.failures import failure_paragraph, typed_error
from state_runtime.runtime import Agg, StatefulOperator, StatefulQuery, running_aggregation
from state_runtime.runtime.telemetry import OtelExport
from state_runtime.store.config import StoreConfig

from .test_exactly_once import _events

pytestmark = pytest.mark.spark
PARTITIONS = 3
Point = tuple[str, tuple[tuple[str, Any], ...]]


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP metrics endpoint: every gauge point received, by (metric, attributes)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.points: dict[Point, float] = {}
        self.requests = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def metric(self, name: str) -> dict[tuple[tuple[str, Any], ...], float]:
        return {attrs: value for (metric, attrs), value in self.points.items() if metric == name}


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        assert self.path == "/v1/metrics"
        request = ExportMetricsServiceRequest.FromString(body)
        for resource in request.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.gauge.data_points:
                        attrs = tuple(
                            sorted(
                                (a.key, a.value.string_value or a.value.int_value)
                                for a in point.attributes
                            )
                        )
                        value = point.as_double if point.HasField("as_double") else point.as_int
                        self.server.points[(metric.name, attrs)] = value
        self.server.requests += 1
        reply = ExportMetricsServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _stream(spark: SparkSession, query: StatefulQuery, events: Path, checkpoint: Path) -> None:
    stream = (
        spark.readStream.schema("user string, amount bigint")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(events))
        .writeStream.foreachBatch(query.foreach_batch())
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    stream.awaitTermination()


def _write(events: Path, batch: int) -> None:
    rows = _events(batch)
    table = pa.table({"user": [u for u, _ in rows], "amount": [a for _, a in rows]})
    pq.write_table(table, events / f"part-{batch:03d}.parquet")


def test_figures_reach_an_otlp_endpoint_and_a_loss_reaches_the_user_once(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str, receiver: Receiver
) -> None:
    root, events, checkpoint = tmp_path / "ckpt", tmp_path / "events", tmp_path / "spark-ckpt"
    events.mkdir()
    op = running_aggregation(
        0, ["user"], "user string", [Agg("n", "count"), Agg("total", "sum", "amount")], PARTITIONS
    )

    exports: list[OtelExport] = []

    def query(operator: StatefulOperator = op) -> StatefulQuery:
        export = OtelExport(receiver.endpoint)
        exports.append(export)
        return StatefulQuery(
            "clicks",
            str(root),
            [operator],
            catalog_url=sqlite_catalog_url,
            telemetry=export,
            spark_checkpoint=str(checkpoint),
        )

    for batch in range(2):
        _write(events, batch)
    first = query()
    _stream(spark, first, events, checkpoint)
    with Catalog.open(sqlite_catalog_url) as catalog:
        [latest, _] = catalog.batch_metrics(first.root, "clicks")
    assert receiver.requests >= 2
    on_query = (("state.query", "clicks"), ("state.root", first.root))
    batch = {
        name: receiver.metric(f"state_runtime.batch.{name}")[on_query]
        for name in ("rows_in", "keys_updated", "bytes_written", "commit_ms", "batch_ms")
    }
    m = latest.metrics
    assert batch["rows_in"] == m.rows_in == 200
    assert batch["keys_updated"] == m.keys_updated and batch["bytes_written"] == m.bytes_written
    assert batch["commit_ms"] == pytest.approx(m.commit_ms)
    assert batch["batch_ms"] == pytest.approx(m.extra["batch_ms"])
    assert receiver.metric("state_runtime.batch.cache_hit_rate")[on_query] == pytest.approx(
        m.figures()["cache_hit_rate"]
    )
    rows = receiver.metric("state_runtime.store.rows")
    status = receiver.metric("state_runtime.store.status")
    stores = {dict(attrs)["state.partition"] for attrs in rows}
    assert stores == set(range(PARTITIONS)) and set(status.values()) == {0}
    assert sum(rows.values()) == m.state_rows

    shutil.rmtree(root / "state" / "0" / "1" / "default")
    _write(events, 2)
    with pytest.raises(StreamingQueryException) as failed:
        # a restarted application: no copy of the state in its workers' memory
        restarted = dataclasses.replace(op, config=StoreConfig(min_deltas_for_snapshot=11))
        _stream(spark, query(restarted), events, checkpoint)
    assert isinstance(typed_error(failed.value), StateLost)
    paragraph = failure_paragraph(failed.value)
    assert paragraph.startswith("error: [STATE_LOST] batch 2 of query clicks")
    assert len(paragraph.splitlines()) == 1 and "Traceback" not in paragraph
    assert paragraph.count("is missing from storage") == 1
    assert (  # the stream's own checkpoint, as the driver was told it
        f"`statestore restore {first.root} --query clicks --to-batch 1 --spark-checkpoint "
        f"{checkpoint} --allow-lost-state --execute`"
    ) in paragraph
    assert typed_error(RuntimeError("some other failure")) is None
    status = receiver.metric("state_runtime.store.status")
    assert {dict(a)["state.partition"]: v for a, v in status.items()} == {0: 0, 1: 2, 2: 0}
    for export in exports:  # before the endpoint goes: no retries at exit
        export.close()
