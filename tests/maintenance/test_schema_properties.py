"""Property test: random sequences of allowed schema changes interleaved with batches,
snapshots, cleanup and restarts, on real files and a real SQLite catalog (no Spark: the store,
the catalog and the maintenance passes are driven as the runtime and the CLI drive them).

After every step, every retained committed version of every store reads, with a fresh
provider, as a dict model says: under the schema of its time and through the newest. Forbidden
changes (narrowing, a key type change, an undeclared drop or rename) are refused by the
planner and leave the catalog and the files untouched.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from state_runtime import CheckpointInfo, SchemaChange, SchemaHistory, StateStoreProvider
from state_runtime.catalog import Catalog
from state_runtime.errors import SchemaMismatch
from state_runtime.identity import StoreId
from state_runtime.maintenance import Fleet, cleanup_pass, run_checks, snapshot_pass
from state_runtime.maintenance.policy import PRESETS
from state_runtime.storage import LocalStorage
from state_runtime.store.state_schema import StateSchema

KEY = "user string"
TYPES = ["tinyint", "smallint", "int", "bigint"]
STORES = [StoreId(0, 0), StoreId(0, 1)]
QUERY = "evolving"
POLICY = PRESETS["demo"]

Rows = dict[str, dict[str, int | None]]
"""A version's state: key -> {field name: value} under the schema of its time."""


class SchemaEvolutionModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="schema-props-"))
        self.catalog = Catalog.open(f"sqlite:///{self.folder / 'catalog.db'}", upgrade=True)
        self.storage = LocalStorage(self.folder / "ckpt")
        self.root = self.storage.uri
        self.fields: list[tuple[str, str]] = [("f0", "tinyint")]
        self.names = 1
        self.next_batch = 0
        self.history = SchemaHistory.of(self._schema())
        self.catalog.record_schema_history(self.root, 0, "default", self.history)
        for store in STORES:
            self.catalog.register_store(
                self.root, store, KEY, self._schema().value.simpleString()[7:-1]
            )
        self.committed: dict[StoreId, list[CheckpointInfo]] = {s: [] for s in STORES}
        # versions[store][v] = (history index of the schema it was written under, rows)
        self.versions: dict[StoreId, list[tuple[int, Rows]]] = {s: [(0, {})] for s in STORES}
        self.providers = {s: self._provider(s, self.history) for s in STORES}

    def teardown(self) -> None:
        self.catalog.engine.dispose()
        shutil.rmtree(self.folder, ignore_errors=True)

    # --- helpers --------------------------------------------------------------------------

    def _schema(self) -> StateSchema:
        return StateSchema.of(KEY, ", ".join(f"{n} {t}" for n, t in self.fields))

    def _provider(self, store: StoreId, history: SchemaHistory) -> StateStoreProvider:
        return StateStoreProvider(
            self.storage, store.operator_id, store.partition_id, history=history
        )

    def _evolve(self, fields: list[tuple[str, str]], change: SchemaChange) -> None:
        """Plan, record (as the driver does before a batch) and switch to the new schema."""
        self.fields = fields
        recorded = self.catalog.schema_history(self.root, 0, "default")
        assert recorded == self.history
        self.history, projection = recorded.evolve(self._schema(), change, self.next_batch)
        assert projection is not None
        self.catalog.record_schema_history(self.root, 0, "default", self.history)
        self.providers = {s: self._provider(s, self.history) for s in STORES}

    def _fresh(self) -> str:
        self.names += 1
        return f"f{self.names}"

    def _project(self, rows: Rows, since: int, until: int) -> Rows:
        """``rows`` written under history entry ``since`` as entry ``until`` reads them."""
        out = {k: dict(v) for k, v in rows.items()}
        for entry in self.history.entries[since + 1 : until + 1]:
            change = entry.change
            names = entry.schema.value.names
            for value in out.values():
                for old, new in change.renamed.items():
                    if old in value:
                        value[new] = value.pop(old)
                for name in change.dropped:
                    value.pop(name, None)
                for name in names:
                    if name not in value:
                        value[name] = change.defaults.get(name)
            out = {k: {n: v[n] for n in names} for k, v in out.items()}
        return out

    def _read(self, provider: StateStoreProvider, info: CheckpointInfo) -> Rows:
        names = provider.schema.value.names
        store = provider.get_read_store(info.version, info.checkpoint_id)
        return {k[0]: dict(zip(names, v, strict=True)) for k, v in store.items()}

    # --- rules ----------------------------------------------------------------------------

    @rule(puts=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 100)), max_size=6))
    def batch(self, puts: list[tuple[int, int]]) -> None:
        infos = []
        for store in STORES:
            chain = self.committed[store]
            handle = (
                self.providers[store].get_store(chain[-1].version, chain[-1].checkpoint_id)
                if chain
                else self.providers[store].get_store(0)
            )
            _, before = self.versions[store][-1]
            index = len(self.history.entries) - 1
            rows = self._project(before, self.versions[store][-1][0], index)
            for i, value in puts:
                key = f"k{i}"
                rows[key] = {n: value for n, _ in self.fields}
                handle.put((key,), tuple(value for _ in self.fields))
            if rows and len(puts) % 3 == 2:
                gone = sorted(rows)[0]
                del rows[gone]
                handle.remove((gone,))
            infos.append(handle.commit())
            self.versions[store].append((index, rows))
        self.catalog.commit_batch(self.root, QUERY, self.next_batch, infos)
        for store, info in zip(STORES, infos, strict=True):
            self.committed[store].append(info)
        self.next_batch += 1

    @rule(default=st.one_of(st.none(), st.integers(0, 100)))
    def add_field(self, default: int | None) -> None:
        name = self._fresh()
        defaults = {} if default is None else {name: default}
        typ = "bigint not null" if default is not None else "int"
        self._evolve([*self.fields, (name, typ)], SchemaChange(defaults=defaults))

    @rule(data=st.data())
    def rename_field(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.fields) - 1))
        old, typ = self.fields[i]
        new = self._fresh()
        fields = [*self.fields]
        fields[i] = (new, typ)
        self._evolve(fields, SchemaChange(renamed={old: new}))

    @precondition(lambda self: any(t.split()[0] != "bigint" for _, t in self.fields))
    @rule(data=st.data())
    def widen_field(self, data: st.DataObject) -> None:
        narrow = [i for i, (_, t) in enumerate(self.fields) if t.split()[0] != "bigint"]
        i = data.draw(st.sampled_from(narrow))
        name, typ = self.fields[i]
        base, *rest = typ.split(" ", 1)
        wider = data.draw(st.sampled_from(TYPES[TYPES.index(base) + 1 :]))
        fields = [*self.fields]
        fields[i] = (name, " ".join([wider, *rest]))
        self._evolve(fields, SchemaChange())

    @precondition(lambda self: len(self.fields) > 1)
    @rule(data=st.data())
    def drop_field(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.fields) - 1))
        name = self.fields[i][0]
        self._evolve(self.fields[:i] + self.fields[i + 1 :], SchemaChange(dropped=(name,)))

    @rule(kind=st.sampled_from(["narrow", "key type", "undeclared drop", "undeclared rename"]))
    def forbidden_change(self, kind: str) -> None:
        fields = [*self.fields]
        key = KEY
        name, typ = fields[0]
        if kind == "narrow" and typ.split()[0] != "tinyint":
            fields[0] = (name, TYPES[TYPES.index(typ.split()[0]) - 1])
        elif kind == "narrow":
            fields[0] = (name, "string")
        elif kind == "key type":
            key = "user bigint"
        elif kind == "undeclared drop" and len(fields) > 1:
            fields = fields[1:]
        else:
            fields[0] = (self._fresh(), typ)
        proposed = StateSchema.of(key, ", ".join(f"{n} {t}" for n, t in fields))
        files = sorted(p for p in self.folder.joinpath("ckpt").rglob("*") if p.is_file())
        recorded = self.catalog.schema_history(self.root, 0, "default")
        try:
            recorded.evolve(proposed, SchemaChange(), self.next_batch)  # type: ignore[union-attr]
        except SchemaMismatch as e:
            assert "refused" in e.reason
        else:
            raise AssertionError(f"a {kind} change was allowed: {proposed.describe()}")
        assert self.catalog.schema_history(self.root, 0, "default") == recorded
        assert sorted(p for p in self.folder.joinpath("ckpt").rglob("*") if p.is_file()) == files

    @rule()
    def snapshot(self) -> None:
        report = snapshot_pass(Fleet(self.catalog, owner="props"), POLICY)
        assert not report.failed, report

    @rule()
    def cleanup(self) -> None:
        report = cleanup_pass(Fleet(self.catalog, owner="props"), POLICY, dry_run=False)
        assert not report.failed, report

    @rule()
    def restart(self) -> None:
        """A new driver process: the history from the catalog, providers with empty caches."""
        self.history = self.catalog.schema_history(self.root, 0, "default")  # type: ignore[assignment]
        self.providers = {s: self._provider(s, self.history) for s in STORES}

    # --- the property ---------------------------------------------------------------------

    @invariant()
    def every_retained_version_reads_as_the_model_says(self) -> None:
        newest = len(self.history.entries) - 1
        for store in STORES:
            fresh = self._provider(store, self.history)
            for retained in self.catalog.retained_versions(self.root, store):
                info = self.committed[store][retained.ref.version - 1]
                written, rows = self.versions[store][retained.ref.version]
                assert self._read(fresh, info) == self._project(rows, written, newest)
                as_written = self.history.entries[written].schema_id
                assert self._read(fresh.as_of(as_written), info) == rows
        if self.next_batch:
            checks = run_checks(Fleet(self.catalog, owner="props"), POLICY)
            assert checks.ok, checks


SchemaEvolutionModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("STATE_PROPERTY_EXAMPLES", "25")),
    stateful_step_count=14,
    deadline=None,
)
test_schema_evolution_model = SchemaEvolutionModel.TestCase
