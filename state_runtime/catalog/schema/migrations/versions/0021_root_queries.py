"""Root queries: ``root_queries``, each (root, query) pair the commit log has ever held, with an id
in the order pairs first appear: what the stores' names follow (a root's label is the query
that committed below it), read by the discovery sensor as a count and a newest id, where
each query's latest batch missed a query that moved to a new root and numbered its batches
from below its old latest (docs/maintenance.md, *Partition keys a person can read*).

A trigger on ``commit_log`` adds the pairs of every insert (one statement per insert on
PostgreSQL, over its transition table; a row at a time on SQLite), so every writer of the
commit log keeps it, code from before this revision (a rolling upgrade) and bulk copies
included; the existing pairs are copied from the commit log here, once, after the trigger is
created: on PostgreSQL ``CREATE TRIGGER`` waits for the commits in flight (their inserts hold a
lock it conflicts with) and holds back new ones until the upgrade commits, so a commit in flight
lands in the copy and a later one fires the trigger (copied first, the pairs of a commit in
flight during the upgrade landed in neither). On PostgreSQL the
trigger runs with the committer's rights: the grants give the runtime INSERT on the table
(``grants.py``). The reading view ``read_root_queries`` is created with the others.

Revision ID: 0021_root_queries
Revises: 0020_commit_positions
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021_root_queries"
down_revision: str | None = "0020_commit_positions"
branch_labels: str | None = None
depends_on: str | None = None

PAIRS = (
    "SELECT DISTINCT (SELECT s.checkpoint_root FROM stores s WHERE s.store_id = c.store_id),"
    " c.query_id FROM {commits} c ORDER BY 1, 2"
)
"""The pairs of the commit rows in ``commits``, each row's root looked up by the stores' key
(a join let PostgreSQL hash the whole ``stores`` table for a batch's 200 rows: 4.4 ms added
to each batch's insert at 20,000 stores, growing with the fleet), in order: concurrent bulk
inserts take the pairs' unique-index locks in one order, so never deadlock on them."""
POSTGRESQL = [
    """CREATE FUNCTION state_root_queries_add() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
  INSERT INTO root_queries (checkpoint_root, query_id)
  """
    + PAIRS.format(commits="added")
    + """
  ON CONFLICT DO NOTHING;
  RETURN NULL;
END $$""",
    "CREATE TRIGGER state_root_queries AFTER INSERT ON commit_log"
    " REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION state_root_queries_add()",
]
SQLITE = [
    "CREATE TRIGGER state_root_queries AFTER INSERT ON commit_log FOR EACH ROW BEGIN"
    " INSERT OR IGNORE INTO root_queries (checkpoint_root, query_id)"
    " SELECT checkpoint_root, NEW.query_id FROM stores WHERE store_id = NEW.store_id; END"
]


def upgrade() -> None:
    op.create_table(
        "root_queries",
        sa.Column(
            "pair_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("checkpoint_root", sa.Text(), nullable=False),
        sa.Column("query_id", sa.String(128), nullable=False),
        sa.UniqueConstraint("checkpoint_root", "query_id", name="uq_root_queries_pair"),
    )
    for statement in POSTGRESQL if _pg() else SQLITE:
        op.execute(statement)
    op.execute(
        "INSERT INTO root_queries (checkpoint_root, query_id) " + PAIRS.format(commits="commit_log")
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER state_root_queries" + (" ON commit_log" if _pg() else ""))
    if _pg():
        op.execute("DROP FUNCTION state_root_queries_add()")
    op.drop_table("root_queries")


def _pg() -> bool:
    return op.get_bind().dialect.name == "postgresql"
