"""A throwaway PgBouncer in transaction mode on loopback, in front of a real Postgres.

For tests and benchmarks (not shipped in the package): ``LocalPgBouncer`` writes a config that
passes every database name through to the server (``* = host=... port=...``), trusts its
clients as the server does, pools server connections per transaction (``pool_mode =
transaction``, the mode docs/fleet.md has 1,000 nodes use), starts Debian's ``pgbouncer`` on a
free port (as ``postgres`` when run as root: it refuses root), and stops it again (the process
itself, checked gone). Its
``server_connections`` counts what it holds open on the server (``SHOW POOLS`` on its admin
console).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from collector.errors import FlightrecError
from tests.support.alertmanager import free_port


class LocalPgBouncerError(FlightrecError):
    """The binary is missing or did not start."""


def find_binary() -> str | None:
    return shutil.which("pgbouncer") or next((p for p in ("/usr/sbin/pgbouncer",) if os.access(p, os.X_OK)), None)


class LocalPgBouncer:
    def __init__(self, server_url: str, *, pool_size: int = 4, max_client_conn: int = 200) -> None:
        """``server_url``: the Postgres behind it (a SQLAlchemy or libpq URL); ``pool_size``:
        server connections per database and user, the cap a fleet's many clients share."""
        u = make_url(server_url)
        self.server_host, self.server_port = u.host or "127.0.0.1", u.port or 5432
        self.pool_size = pool_size
        self.max_client_conn = max_client_conn
        self.port = 0
        self.dir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, server_url: str, *, database: str | None = None) -> str:
        """``server_url`` pointed at this PgBouncer, marked for transaction pooling."""
        u = make_url(server_url).set(host="127.0.0.1", port=self.port)
        if database is not None:
            u = u.set(database=database)
        return u.update_query_dict({"pool_mode": "transaction"}).render_as_string(hide_password=False)

    def start(self) -> LocalPgBouncer:
        binary = find_binary()
        if binary is None:
            raise LocalPgBouncerError("pgbouncer not found (Debian's pgbouncer: scripts/install-test-deps.sh installs it)")
        self.dir = Path(tempfile.mkdtemp(prefix="flightrec-pgbouncer-"))
        self.port = free_port()
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host={self.server_host} port={self.server_port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.dir / 'users.txt'}\n"
            "admin_users = postgres\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\nmax_client_conn = {self.max_client_conn}\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n"
            "server_reset_query =\n"
        )
        (self.dir / "users.txt").write_text('"postgres" ""\n')
        user: list[str] = []
        if os.geteuid() == 0:  # its own -u, not runuser: the process started is the one stop() signals
            pw = pwd.getpwnam("postgres")
            for p in (self.dir, *self.dir.iterdir()):
                os.chown(p, pw.pw_uid, pw.pw_gid)
            user = ["-u", "postgres"]
        self.proc = subprocess.Popen([binary, *user, str(ini)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LocalPgBouncerError(f"pgbouncer exited {self.proc.returncode}: {self.log()[-2000:]}")
            try:
                self.admin("SHOW VERSION")
                return self
            except Exception:  # noqa: BLE001 (not listening yet)
                time.sleep(0.1)
        self.stop()
        raise LocalPgBouncerError(f"pgbouncer did not start within 10 s: {self.log()[-2000:]}")

    def admin(self, command: str) -> list[tuple[Any, ...]]:
        """A command on the admin console (the ``pgbouncer`` database: simple protocol only)."""
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, dbname="pgbouncer", user="postgres", autocommit=True, connect_timeout=2) as c:
            cur = c.cursor()
            cur.execute(command.encode(), prepare=False)  # type: ignore[arg-type]
            return list(cur.fetchall()) if cur.description else []

    def server_connections(self, database: str) -> int:
        """Server connections PgBouncer holds for ``database`` (active, idle, used, tested, login)."""
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, dbname="pgbouncer", user="postgres", autocommit=True, connect_timeout=2) as c:
            cur = psycopg.ClientCursor(c)
            cur.execute("SHOW POOLS")
            names = [d.name for d in cur.description or []]
            total = 0
            for row in cur.fetchall():
                r = dict(zip(names, row, strict=True))
                if r["database"] == database:
                    total += sum(int(r.get(k) or 0) for k in ("sv_active", "sv_idle", "sv_used", "sv_tested", "sv_login"))
            return total

    def log(self) -> str:
        if self.dir is None or not (self.dir / "pgbouncer.log").exists():
            return ""
        return (self.dir / "pgbouncer.log").read_text(errors="replace")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # PgBouncer's immediate shutdown
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalPgBouncer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
