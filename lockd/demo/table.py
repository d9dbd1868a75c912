"""The demo's protected table, ``demo_writes``: one row per write the fencing proxy accepted.

It must exist before the proxy starts, because the proxy reflects its allow-listed tables at
start-up. The embedded demo creates it before starting the proxy; docker-compose.yml runs
``python -m lockd.demo --init-only`` in the proxy's container just before ``resource-proxy serve``.
Each row's key contains the demo run's id, so reruns against the same database never collide.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TABLE", "COLUMNS", "create_table", "row", "row_id"]

TABLE = "demo_writes"
COLUMNS = ["id", "run", "scene", "worker", "fence", "step"]


def create_table(database_url: str) -> None:
    """Create ``demo_writes`` in ``database_url`` (a SQLAlchemy URL) unless it exists.

    Idempotent, also when two processes race to create it. Raises
    ``sqlalchemy.exc.SQLAlchemyError`` when the database cannot be reached.
    """
    import sqlalchemy as sa  # here, not at the top: workers import this module and start faster

    table = sa.Table(
        TABLE, sa.MetaData(),
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("run", sa.Text, nullable=False),
        sa.Column("scene", sa.Text, nullable=False),
        sa.Column("worker", sa.Text, nullable=False),
        sa.Column("fence", sa.BigInteger, nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
    )
    engine = sa.create_engine(database_url)
    try:
        try:
            table.create(engine, checkfirst=True)
        except sa.exc.SQLAlchemyError:
            if not sa.inspect(engine).has_table(TABLE):  # lost a creation race: fine
                raise
    finally:
        engine.dispose()


def row_id(run: str, scene: str, worker: str, step: int) -> str:
    """The primary key of one write: unique per demo run."""
    return f"{run}-{scene}-{worker}-{step}"


def row(run: str, scene: str, worker: str, fence: int, step: int) -> dict[str, Any]:
    """The row a worker inserts for its ``step``-th write under ``fence``."""
    return {"id": row_id(run, scene, worker, step), "run": run, "scene": scene,
            "worker": worker, "fence": fence, "step": step}
