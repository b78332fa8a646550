"""Internal: Storage: SQLAlchemy 2 models, the database engine (SQLite WAL or Postgres), a batching
writer for the continuous series, and the queries the API and CLI use."""
