#!/usr/bin/env python3
"""The whole path, sandflow against PostgreSQL 15 in one run (`make bench`).

Both servers run on this machine on temporary directories and ports, with
fsync on; the same psycopg client code sends the same rows to both, and runs
alternate (sandflow, PostgreSQL, sandflow, ...). Printed: each figure for both
systems and their ratio, the machine's load at the start and the end.

1. Ingest: ROWS rows (1,000 keys, increasing times) in multi-row INSERTs of
   1,000 rows. PostgreSQL: INSERT ... ON CONFLICT (k, ts) DO UPDATE, the same
   replace-on-key semantics as sandflow's INSERT. Rows/s, server CPU per row
   (user + system time of the server's processes), bytes written to disk per
   row (/proc/<pid>/io write_bytes of the server's processes).
2. The same with a continuous aggregate attached (count, sum, min, max per key
   and minute): sandflow's flow against PostgreSQL's statement triggers that
   recompute the touched groups into a rollup table. Then both rollups are
   checked equal to the query over the source (the run fails if not).
3. Freshness: single-row inserts, the rollup polled from a second connection
   until the row shows; p50/p99/max, at a 10 ms tick and at the default tick
   (PostgreSQL: the trigger is synchronous); then the same at the default
   tick while a third connection writes single rows back to back.
   Concurrent writers: 32 connections each inserting single rows for a few
   seconds; rows/s and per-insert latency p50/p99/max.
4. Recompute against incremental: PostgreSQL's REFRESH MATERIALIZED VIEW of the
   rollup at 10 k, 100 k and ROWS rows, beside sandflow's insert-to-visible
   time of one change at the same sizes.
5. sandflow alone: line protocol (bodies of 5,000 lines), COPY FROM STDIN,
   back-fill (CREATE FLOW over the ROWS rows of the source, to flushed; the
   median of BACKFILLS new flows), and
   ingest with 1, 10 and 100 flows on the same source.

Usage: whole_path.py --sandflow PATH [--rows N] [--runs N]
(`SANDFLOW_BENCH_ROWS` and `SANDFLOW_BENCH_RUNS` set the defaults.)
"""

import argparse
import http.client
import os
import pwd
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone

import psycopg

KEYS = 1000
BATCH = 1000
LINE_BODY = 5000
BACKFILLS = 5
BASE = datetime(2026, 1, 1, tzinfo=timezone.utc)
PG_BIN = "/usr/lib/postgresql/15/bin"

ROLLUP_SANDFLOW = (
    "SELECT k, date_bin(INTERVAL '1 minute', ts) AS minute, count(*) AS n, sum(v) AS total, "
    "min(v) AS lo, max(v) AS hi FROM {src} GROUP BY k, minute"
)
ROLLUP_PG = (
    "SELECT k, date_trunc('minute', ts) AS minute, count(*) AS n, sum(v) AS total, "
    "min(v) AS lo, max(v) AS hi FROM {src} GROUP BY k, date_trunc('minute', ts)"
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def ts_of(i):
    # Increasing times, 10 ms apart: 6,000 rows per minute.
    return (BASE + timedelta(milliseconds=10 * i)).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def row_of(i):
    return (f"k{i % KEYS}", ts_of(i), float(i % 97) * 1.5)


def values(rows):
    return ", ".join(f"('{k}', '{t}', {v})" for k, t, v in rows)


def proc_tree(root):
    """The pids of `root` and its descendants."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    children = {}
    pairs = [tuple(map(int, l.split())) for l in out.strip().splitlines()]
    for pid, ppid in pairs:
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def usage(root):
    """(CPU seconds, bytes written) of `root`'s process tree so far.
    Processes that exited before are not counted: read it while the
    connections are open."""
    tick = os.sysconf("SC_CLK_TCK")
    cpu, written = 0.0, 0
    for pid in proc_tree(root):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / tick
            with open(f"/proc/{pid}/io") as f:
                for line in f:
                    if line.startswith("write_bytes:"):
                        written += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError):
            pass
    return cpu, written


class System:
    """What the two servers share of the client code."""

    name = ""

    def rollup_rows(self, c, src, name):
        return c.execute(
            f"SELECT k, minute, n, total, lo, hi FROM {name}_sink ORDER BY k, minute"
        ).fetchall()

    def truth(self, c, src):
        return c.execute(
            "SELECT k, minute, n, total, lo, hi FROM (" + self.rollup.format(src=src)
            + ") q ORDER BY k, minute"
        ).fetchall()

    def sink_count(self, c, name, k, minute):
        r = c.execute(
            f"SELECT n FROM {name}_sink WHERE k = '{k}' AND minute = '{minute}'"
        ).fetchone()
        return r[0] if r else 0


class Sandflow(System):
    name = "sandflow"
    rollup = ROLLUP_SANDFLOW

    def __init__(self, binary, tick=None):
        self.dir = tempfile.mkdtemp(prefix="sandflow-bench-")
        self.pg_port, self.http_port, self.mysql_port = free_port(), free_port(), free_port()
        args = [
            binary, "start", "--data-dir", self.dir, "--auth", "none",
            "--postgres-addr", f"127.0.0.1:{self.pg_port}",
            "--http-addr", f"127.0.0.1:{self.http_port}",
            "--mysql-addr", f"127.0.0.1:{self.mysql_port}",
        ]
        if tick:
            args += ["--flow-tick-interval", tick]
        self.log = open(os.path.join(self.dir, "server.log"), "w")
        env = dict(os.environ, RUST_LOG="warn")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.pid = self.proc.pid
        deadline = time.time() + 120
        while True:
            try:
                psycopg.connect(self.dsn(), connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if time.time() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"sandflow did not start; see {self.dir}/server.log")
                time.sleep(0.2)

    def dsn(self):
        return f"host=127.0.0.1 port={self.pg_port} user=sandflow dbname=public"

    def connect(self):
        return psycopg.connect(self.dsn(), autocommit=True)

    def create_source(self, c, name):
        c.execute(f"DROP TABLE IF EXISTS {name}")
        c.execute(
            f"CREATE TABLE {name} (k STRING, ts TIMESTAMP TIME INDEX, v DOUBLE, PRIMARY KEY (k))"
        )

    def insert(self, c, table, rows):
        c.execute(f"INSERT INTO {table} VALUES {values(rows)}")

    def attach_rollup(self, c, src, name):
        # min and max keep every value of a group (a retraction may remove the
        # extreme one). A back-fill over 1,000,000 rows peaks under 100 MiB of
        # guest memory; the generous limit keeps larger --rows runs measuring
        # speed, not the limit.
        c.execute(
            f"CREATE FLOW {name} SINK TO {name}_sink WITH (memory_limit = '2GiB') AS "
            + ROLLUP_SANDFLOW.format(src=src)
        )

    def rollup_rows(self, c, src, name):
        c.execute(f"ADMIN FLUSH_FLOW('{name}')")
        return super().rollup_rows(c, src, name)

    def drop_flow(self, c, name):
        c.execute(f"DROP FLOW IF EXISTS {name}")
        c.execute(f"DROP TABLE IF EXISTS {name}_sink")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Postgres(System):
    name = "PostgreSQL"
    rollup = ROLLUP_PG

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="pg-bench-")
        self.port = free_port()
        owner = pwd.getpwnam("postgres")
        os.chown(self.dir, owner.pw_uid, owner.pw_gid)
        data = os.path.join(self.dir, "data")
        as_pg = ["runuser", "-u", "postgres", "--"]
        subprocess.run(
            as_pg + [f"{PG_BIN}/initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8"],
            check=True, capture_output=True,
        )
        opts = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=on "
            "-c synchronous_commit=on -c shared_buffers=256MB -c max_wal_size=4GB"
        )
        subprocess.run(
            as_pg + [f"{PG_BIN}/pg_ctl", "-D", data, "-o", opts, "-l",
                     os.path.join(self.dir, "log"), "-w", "start"],
            check=True, capture_output=True,
        )
        with open(os.path.join(data, "postmaster.pid")) as f:
            self.pid = int(f.readline())
        self.data = data

    def connect(self):
        return psycopg.connect(
            f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True
        )

    def create_source(self, c, name):
        c.execute(f"DROP TABLE IF EXISTS {name} CASCADE")
        c.execute(
            f"CREATE TABLE {name} (k TEXT, ts TIMESTAMP, v DOUBLE PRECISION, PRIMARY KEY (k, ts))"
        )

    def insert(self, c, table, rows):
        c.execute(
            f"INSERT INTO {table} VALUES {values(rows)} "
            "ON CONFLICT (k, ts) DO UPDATE SET v = EXCLUDED.v"
        )

    def attach_rollup(self, c, src, name):
        # Statement triggers that recompute every group the statement touched:
        # exact under updates (min and max included), as the flow is.
        c.execute(
            f"CREATE TABLE {name}_sink (k TEXT, minute TIMESTAMP, n BIGINT, total DOUBLE PRECISION, "
            "lo DOUBLE PRECISION, hi DOUBLE PRECISION, PRIMARY KEY (k, minute))"
        )
        c.execute(
            f"""CREATE FUNCTION {name}_fn() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              INSERT INTO {name}_sink
                SELECT k, date_trunc('minute', ts), count(*), sum(v), min(v), max(v)
                FROM {src}
                WHERE (k, date_trunc('minute', ts)) IN
                  (SELECT DISTINCT k, date_trunc('minute', ts) FROM changed)
                GROUP BY k, date_trunc('minute', ts)
              ON CONFLICT (k, minute) DO UPDATE SET n = EXCLUDED.n, total = EXCLUDED.total,
                lo = EXCLUDED.lo, hi = EXCLUDED.hi;
              RETURN NULL;
            END $$"""
        )
        c.execute(
            f"CREATE TRIGGER {name}_ins AFTER INSERT ON {src} REFERENCING NEW TABLE AS changed "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {name}_fn()"
        )
        c.execute(
            f"CREATE TRIGGER {name}_upd AFTER UPDATE ON {src} REFERENCING NEW TABLE AS changed "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {name}_fn()"
        )

    def drop_flow(self, c, name):
        c.execute(f"DROP TABLE IF EXISTS {name}_sink")
        c.execute(f"DROP FUNCTION IF EXISTS {name}_fn() CASCADE")

    def stop(self):
        subprocess.run(
            ["runuser", "-u", "postgres", "--", f"{PG_BIN}/pg_ctl", "-D", self.data, "-m", "fast",
             "-w", "stop"],
            capture_output=True,
        )
        shutil.rmtree(self.dir, ignore_errors=True)


def load(system, c, table, n):
    """Inserts rows 0..n into `table` in statements of BATCH rows."""
    for start in range(0, n, BATCH):
        system.insert(c, table, [row_of(i) for i in range(start, min(n, start + BATCH))])


def ingest(system, rows, table="m", rollup=None):
    """Creates `table` (and the rollup), inserts `rows` rows in statements of
    BATCH rows; returns (rows/s, CPU µs per row, bytes per row)."""
    with system.connect() as c:
        if rollup:
            system.drop_flow(c, rollup)
        system.create_source(c, table)
        if rollup:
            system.attach_rollup(c, table, rollup)
        cpu0, w0 = usage(system.pid)
        started = time.perf_counter()
        load(system, c, table, rows)
        elapsed = time.perf_counter() - started
        cpu1, w1 = usage(system.pid)
    return rows / elapsed, (cpu1 - cpu0) / rows * 1e6, (w1 - w0) / rows


def check_rollup(system, table, rollup):
    with system.connect() as c:
        got = system.rollup_rows(c, table, rollup)
        want = system.truth(c, table)
    norm = lambda rs: [(k, m.replace(tzinfo=None), n, float(t), float(lo), float(hi))
                       for k, m, n, t, lo, hi in rs]
    if norm(got) != norm(want):
        raise SystemExit(
            f"{system.name}: the rollup differs from its query ({len(got)} rows against "
            f"{len(want)}); first differences: "
            f"{[p for p in zip(norm(got), norm(want)) if p[0] != p[1]][:3]}"
        )
    return len(got)


def freshness(system, rollup, table, n=300, base=10_000_000):
    """Insert-to-visible latency of single-row inserts (ms): p50, p99, max.
    Rows `base`.. must be new to `table` (an upsert of the same row would not
    change the count)."""
    lat = []
    with system.connect() as w, system.connect() as r:
        for j in range(n):
            i = base + j
            k, t, v = row_of(i)
            minute = t[:16] + ":00"
            before = system.sink_count(r, rollup, k, minute)
            started = time.perf_counter()
            system.insert(w, table, [(k, t, v)])
            deadline = started + 10
            while system.sink_count(r, rollup, k, minute) <= before:
                if time.perf_counter() > deadline:
                    raise SystemExit(f"{system.name}: a row did not reach the rollup in 10 s")
                time.sleep(0.0005)
            lat.append((time.perf_counter() - started) * 1e3)
    lat.sort()
    return lat[len(lat) // 2], lat[int(len(lat) * 0.99) - 1], lat[-1]


def freshness_under_writes(system, rollup, table, n=200):
    """`freshness` while another connection inserts single rows (on other
    keys) back to back; also returns that writer's rows/s."""
    stop = threading.Event()
    written = [0]

    def writer():
        with system.connect() as w:
            i = 20_000_000
            while not stop.is_set():
                _, t, v = row_of(i)
                system.insert(w, table, [(f"w{i % KEYS}", t, v)])
                written[0] += 1
                i += 1

    th = threading.Thread(target=writer)
    started = time.perf_counter()
    th.start()
    try:
        f = freshness(system, rollup, table, n, base=11_000_000)
    finally:
        stop.set()
        th.join()
    return f + (written[0] / (time.perf_counter() - started),)


def concurrent_writers(system, table, writers=32, seconds=5.0):
    """`writers` connections insert single rows for `seconds`: (rows/s, latency
    p50, p99, max in ms)."""
    with system.connect() as c:
        system.create_source(c, table)
    conns = [system.connect() for _ in range(writers)]
    barrier = threading.Barrier(writers)
    lat = [[] for _ in range(writers)]

    def run(t):
        c = conns[t]
        barrier.wait()
        deadline = time.perf_counter() + seconds
        i = 30_000_000 + t * 1_000_000
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            system.insert(c, table, [row_of(i)])
            lat[t].append((time.perf_counter() - started) * 1e3)
            i += 1

    threads = [threading.Thread(target=run, args=(t,)) for t in range(writers)]
    started = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - started
    for c in conns:
        c.close()
    all_lat = sorted(x for l in lat for x in l)
    return (len(all_lat) / elapsed, all_lat[len(all_lat) // 2],
            all_lat[int(len(all_lat) * 0.99) - 1], all_lat[-1])


def fmt_ratio(a, b):
    return f"{a / b:6.2f}" if b else "   n/a"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sandflow", required=True, help="the sandflow binary (release build)")
    ap.add_argument("--rows", type=int, default=int(os.environ.get("SANDFLOW_BENCH_ROWS", 1_000_000)))
    ap.add_argument("--runs", type=int, default=int(os.environ.get("SANDFLOW_BENCH_RUNS", 2)))
    a = ap.parse_args()
    rows, runs = a.rows, a.runs
    print(f"whole path: sandflow against PostgreSQL 15, {rows} rows, {KEYS} keys, "
          f"INSERTs of {BATCH} rows, {runs} alternating runs (medians); load at start: {loadavg()}")
    sys.stdout.flush()

    pg = Postgres()
    sf = Sandflow(a.sandflow)
    try:
        results = {}
        for what, rollup in [("ingest", None), ("ingest + rollup", "r")]:
            per = {sf.name: [], pg.name: []}
            for _ in range(runs):
                for system in (sf, pg):
                    per[system.name].append(ingest(system, rows, rollup=rollup))
                    if rollup:
                        check_rollup(system, "m", rollup)
            results[what] = {n: tuple(statistics.median(x[i] for x in v) for i in range(3))
                             for n, v in per.items()}
            s, p = results[what][sf.name], results[what][pg.name]
            print(f"{what:<16} rows/s  sandflow {s[0]:>10,.0f}  PostgreSQL {p[0]:>10,.0f}  "
                  f"ratio {fmt_ratio(s[0], p[0])}")
            print(f"{'':<16} CPU µs/row sandflow {s[1]:>7.1f}  PostgreSQL {p[1]:>7.1f}  "
                  f"ratio {fmt_ratio(s[1], p[1])}")
            print(f"{'':<16} disk B/row sandflow {s[2]:>7.0f}  PostgreSQL {p[2]:>7.0f}  "
                  f"ratio {fmt_ratio(s[2], p[2])}")
            sys.stdout.flush()
        print("rollups equal to their query in every run: yes")

        # Freshness at the default tick (this server), PostgreSQL's trigger.
        f_pg = freshness(pg, "r", "m")
        f_def = freshness(sf, "r", "m")
        fw_pg = freshness_under_writes(pg, "r", "m")
        fw_def = freshness_under_writes(sf, "r", "m")
        cw = {}
        for system in (sf, pg):
            cw[system.name] = concurrent_writers(system, "cw")
        # Back-fill: a new flow over the ROWS rows already in the source; the
        # median of BACKFILLS, each a new flow (one takes a third of a second
        # at a million rows: alone it says more about the machine's moment).
        backfills = []
        with sf.connect() as c:
            for _ in range(BACKFILLS):
                started = time.perf_counter()
                sf.attach_rollup(c, "m", "bf")
                c.execute("ADMIN FLUSH_FLOW('bf')")
                backfills.append(rows / (time.perf_counter() - started))
                sf.drop_flow(c, "bf")
        backfill = statistics.median(backfills)
        sf.stop()
        sf = Sandflow(a.sandflow, tick="10ms")
        with sf.connect() as c:
            sf.create_source(c, "m")
            sf.attach_rollup(c, "m", "r")
        f_10 = freshness(sf, "r", "m")
        for label, f in [("sandflow, 10 ms tick", f_10), ("sandflow, default tick", f_def),
                         ("PostgreSQL trigger", f_pg)]:
            print(f"freshness ms      {label:<24} p50 {f[0]:7.1f}  p99 {f[1]:7.1f}  max {f[2]:7.1f}")
        for label, f in [("sandflow, default tick", fw_def), ("PostgreSQL trigger", fw_pg)]:
            print(f"freshness ms under single-row writes  {label:<24} p50 {f[0]:7.1f}  "
                  f"p99 {f[1]:7.1f}  max {f[2]:7.1f}  (writer {f[3]:,.0f} rows/s)")
        s, p = cw[sf.name], cw[pg.name]
        print(f"32 writers, single-row INSERTs  rows/s sandflow {s[0]:>8,.0f}  PostgreSQL "
              f"{p[0]:>8,.0f}  ratio {fmt_ratio(s[0], p[0])}")
        print(f"{'':<32}latency ms sandflow p50 {s[1]:6.1f} p99 {s[2]:6.1f} max {s[3]:6.1f}   "
              f"PostgreSQL p50 {p[1]:6.1f} p99 {p[2]:6.1f} max {p[3]:6.1f}")
        print(f"sandflow alone    back-fill of a new flow over {rows:,} rows: {backfill:>12,.0f} rows/s "
              f"(median of {BACKFILLS}: {', '.join(f'{b:,.0f}' for b in backfills)})")
        sys.stdout.flush()

        # Recompute against incremental.
        for n in [10_000, 100_000, rows]:
            if n > rows:
                continue
            with pg.connect() as c:
                pg.create_source(c, "mv_src")
                load(pg, c, "mv_src", n)
                c.execute("DROP MATERIALIZED VIEW IF EXISTS mv")
                c.execute("CREATE MATERIALIZED VIEW mv AS " + ROLLUP_PG.format(src="mv_src"))
                started = time.perf_counter()
                c.execute("REFRESH MATERIALIZED VIEW mv")
                refresh = (time.perf_counter() - started) * 1e3
                c.execute("DROP MATERIALIZED VIEW mv")
                c.execute("DROP TABLE mv_src")
            with sf.connect() as c:
                sf.drop_flow(c, "inc")
                sf.create_source(c, "inc_src")
                load(sf, c, "inc_src", n)
                sf.attach_rollup(c, "inc_src", "inc")
                c.execute("ADMIN FLUSH_FLOW('inc')")
            change = freshness(sf, "inc", "inc_src", n=50)[0]
            print(f"{n:>9} rows  PostgreSQL REFRESH MATERIALIZED VIEW {refresh:9.1f} ms   "
                  f"sandflow one change to visible (10 ms tick, p50) {change:6.1f} ms")
            with sf.connect() as c:
                sf.drop_flow(c, "inc")
                c.execute("DROP TABLE inc_src")
        sys.stdout.flush()

        # sandflow alone.
        n = min(rows, 500_000)
        lines = [f"lp,k=k{i % KEYS} v={float(i % 97) * 1.5} {int((BASE + timedelta(milliseconds=10 * i)).timestamp() * 1000)}"
                 for i in range(n)]
        conn = http.client.HTTPConnection("127.0.0.1", sf.http_port, timeout=120)
        started = time.perf_counter()
        for start in range(0, n, LINE_BODY):
            body = "\n".join(lines[start:start + LINE_BODY]).encode()
            conn.request("POST", "/v1/influxdb/write?db=public&precision=ms", body)
            resp = conn.getresponse()
            resp.read()
            if resp.status // 100 != 2:
                raise SystemExit(f"line protocol write failed: {resp.status}")
        lp = n / (time.perf_counter() - started)
        with sf.connect() as c:
            sf.create_source(c, "cp")
            started = time.perf_counter()
            with c.cursor().copy("COPY cp (k, ts, v) FROM STDIN") as copy:
                for i in range(n):
                    k, t, v = row_of(i)
                    copy.write_row((k, t, v))
            cp = n / (time.perf_counter() - started)
        print(f"sandflow alone    line protocol ({LINE_BODY} lines a body) {lp:>10,.0f} rows/s   "
              f"COPY FROM STDIN {cp:>10,.0f} rows/s")
        sys.stdout.flush()

        n = min(rows, 200_000)
        base_rate = None
        for flows in [1, 10, 100]:
            with sf.connect() as c:
                sf.create_source(c, "many")
                for j in range(flows):
                    sf.attach_rollup(c, "many", f"f{j}")
                started = time.perf_counter()
                load(sf, c, "many", n)
                for j in range(flows):
                    c.execute(f"ADMIN FLUSH_FLOW('f{j}')")
                rate = n / (time.perf_counter() - started)
                for j in range(flows):
                    sf.drop_flow(c, f"f{j}")
            base_rate = base_rate or rate
            print(f"sandflow alone    {flows:>3} flows on one source: {rate:>10,.0f} rows/s "
                  f"(ingest and catch-up; {rate / base_rate:5.2f} of one flow's)")
            sys.stdout.flush()
    finally:
        sf.stop()
        pg.stop()
    print(f"load at end: {loadavg()}")


if __name__ == "__main__":
    main()
