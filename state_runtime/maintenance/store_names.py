"""Store names a person can read: ``<query>/<operator>/<partition>/<store>``, the root once.

A store's full identity is its root URI and ``operator/partition/store``
(``file:///data/runs/7/checkpoint#0/1/default``). Where every store is listed (Dagster's
partitions, the CLI's tables) the root is mostly noise repeated on every row, so each root gets
a short *label*: the one query that committed below it (``clicks``), which names the stream; if
another root carries the same query (the query moved to a new checkpoint location) or the root
has several queries or none, the label is the root's tail, its last path segments, as few as
tell it apart from the other roots (``clicks@7/checkpoint``, ``runs/7/checkpoint``). A root's
label changes only when another root with its query appears.

A process that names stores again and again (Dagster's sensors, a tick every 30 s) keeps the
labels between reads (:meth:`StoreNames.current`) while the catalog's ``names_mark`` (the
stores' count and newest id, the roots, the count and newest id of the (root, query) pairs
the commit log has ever held: each read by an index or a table of one row a pair) is
unchanged. The full read takes its pairs from the same table (``root_queries``, migration
0021), so the mark and the labels have one source.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from state_runtime.catalog import Catalog, NamesMark, StoreKey
from state_runtime.errors import InvalidArgument
from state_runtime.maintenance.fleet import parse_store_key

SEPARATOR = "@"
_HELD: dict[str, tuple[NamesMark, StoreNames]] = {}
"""The labels last read from each catalog (by its URL), with the mark they were read at."""


def _segments(root: str) -> list[str]:
    path = root.split("://", 1)[-1]
    return [s for s in path.split("/") if s]


def distinct_tails(roots: Sequence[str]) -> dict[str, str]:
    """Each root's shortest tail of path segments that no other root in ``roots`` ends with
    (every tail of every root counted once: linear in the roots, where comparing each root
    with every other took minutes at 500 roots)."""
    segments = {root: _segments(root) for root in roots}
    counts = Counter(tuple(own[-n:]) for own in segments.values() for n in range(1, len(own) + 1))
    tails: dict[str, str] = {}
    for root, own in segments.items():
        length = next((n for n in range(1, len(own) + 1) if counts[tuple(own[-n:])] == 1), len(own))
        tails[root] = "/".join(own[-length:]) if own else root
    return tails


def root_labels(queries: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Each root's label (see the module), from the queries that committed below each root."""
    single = {root: q[0] for root, q in queries.items() if len(q) == 1}
    by_query: dict[str, list[str]] = {}
    for root, query in single.items():
        by_query.setdefault(query, []).append(root)
    tails = distinct_tails(sorted(queries))
    shared = {q: distinct_tails(roots) for q, roots in by_query.items() if len(roots) > 1}
    labels: dict[str, str] = {}
    for root in queries:
        if root not in single:
            labels[root] = tails[root]
        elif len(by_query[single[root]]) == 1:
            labels[root] = single[root]
        else:
            tail = shared[single[root]][root]
            labels[root] = f"{single[root]}{SEPARATOR}{tail}"
    return labels


@dataclass(frozen=True)
class StoreNames:
    """Readable names of the stores below some roots, both ways."""

    labels: Mapping[str, str]
    """root -> label"""

    @classmethod
    def of(cls, catalog: Catalog) -> StoreNames:
        """The labels of every root the catalog knows (one read): over all of them, so that a
        store has one name whatever scope a pass works on."""
        return cls(root_labels(catalog.root_queries()))

    @classmethod
    def current(cls, catalog: Catalog) -> StoreNames:
        """:meth:`of`, read again only when the catalog's ``names_mark`` changed since this
        process last read them from the same catalog. The mark is read first: a change
        committed between the two reads is read again next time."""
        mark = catalog.names_mark()
        held = _HELD.get(catalog.url)
        if held is not None and held[0] == mark:
            return held[1]
        names = cls.of(catalog)
        _HELD[catalog.url] = (mark, names)
        return names

    @staticmethod
    def forget() -> None:
        """Drops the labels this process holds (each catalog's next :meth:`current` reads
        them): for tests that reuse a catalog URL, so that one test's labels never serve
        another's."""
        _HELD.clear()

    def name(self, key: StoreKey) -> str:
        """``<label>/<operator>/<partition>/<store>`` (the full key for a root not listed)."""
        label = self.labels.get(key.root)
        return str(key) if label is None else f"{label}/{key.store}"

    def key(self, text: str) -> StoreKey:
        """The store a name (or a full ``<root>#op/part/store`` key) stands for."""
        if "#" in text:
            return parse_store_key(text)
        label, _, store = text.rpartition("/")
        label, _, partition = label.rpartition("/")
        label, _, operator = label.rpartition("/")
        roots = [root for root, known in self.labels.items() if known == label]
        if len(roots) != 1:
            known = ", ".join(sorted(self.labels.values())) or "none"
            raise InvalidArgument(
                f"unknown store {text!r}: expected <query or root label>/<operator>/"
                f"<partition>/<store> (labels: {known}) or <root>#<operator>/<partition>/<store>"
            )
        return parse_store_key(f"{operator}/{partition}/{store}", root=roots[0])
