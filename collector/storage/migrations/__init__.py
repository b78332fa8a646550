"""The database's Alembic migrations (``env.py``, ``versions/``), shipped inside the package so
every kind of install has them (``pip install --target`` too); ``collector.storage.migrate`` runs
them. Nothing here is imported by the sidecar itself."""
