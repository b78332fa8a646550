"""The engines and GPUs of each host, as rows the other tables point at."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from collector.storage.database import Database, nul_free
from collector.storage.models import EngineRow, GpuRow


class EngineStore:
    def __init__(self, database: Database) -> None:
        self.d = database

    def engine_id(self, conn: Connection, name: str, *, url: str | None = None, pair: str | None = None) -> int:
        d = self.d
        cached = d.engine_ids.get(name)
        if cached is not None:
            return cached
        row = conn.execute(select(EngineRow.id).where(EngineRow.host == d.host, EngineRow.name == name)).first()
        if row is None:
            now = time.time()
            try:
                with conn.begin_nested():
                    new_id = conn.execute(
                        insert(EngineRow)
                        .values(host=d.host, name=name, url=url, pair=pair, state="unknown", first_seen=now, last_seen=now)
                        .returning(EngineRow.id)
                    ).scalar_one()
            except IntegrityError:
                new_id = conn.execute(select(EngineRow.id).where(EngineRow.host == d.host, EngineRow.name == name)).scalar_one()
        else:
            new_id = row[0]
        d.engine_ids[name] = new_id
        return int(new_id)

    def gpu_id(self, conn: Connection, gpu: str, *, index: int, bus_id: str | None, name: str | None) -> int:
        d = self.d
        cached = d.gpu_ids.get(gpu)
        if cached is not None:
            return cached
        row = conn.execute(select(GpuRow.id).where(GpuRow.host == d.host, GpuRow.gpu == gpu)).first()
        if row is None:
            now = time.time()
            new_id = conn.execute(
                insert(GpuRow).values(host=d.host, gpu=gpu, index=index, bus_id=bus_id, name=name, first_seen=now, last_seen=now).returning(GpuRow.id)
            ).scalar_one()
        else:
            new_id = row[0]
        d.gpu_ids[gpu] = new_id
        return int(new_id)

    def register(self, name: str, *, url: str | None, pair: str | None) -> int:
        with self.d.tx() as conn:
            eid = self.engine_id(conn, name, url=url, pair=pair)
            conn.execute(update(EngineRow).where(EngineRow.id == eid).values(url=url, pair=pair))
            return eid

    def update(self, name: str, **values: Any) -> None:
        with self.d.tx() as conn:
            eid = self.engine_id(conn, name)
            conn.execute(update(EngineRow).where(EngineRow.id == eid).values(**nul_free(values)))

    def list_engines(self) -> list[dict[str, Any]]:
        with self.d.tx() as conn:
            return [dict(r) for r in conn.execute(select(EngineRow).order_by(EngineRow.host, EngineRow.name)).mappings()]

    def list_gpus(self) -> list[dict[str, Any]]:
        with self.d.tx() as conn:
            return [dict(r) for r in conn.execute(select(GpuRow).order_by(GpuRow.host, GpuRow.index)).mappings()]
