#!/usr/bin/env python3
"""A flow on a flow node against the same flow on one node, and failover
(`make bench`).

Starts etcd and nats-server (JetStream) on loopback with temporary
directories, and the release `sandflow` binary as one node alone, then as a
storage node with two flow nodes. Printed, with the machine's load at the
start and the end:

1. Per-flow throughput: ROWS rows (1,000 keys, increasing times) in
   1,000-row INSERTs into a source with the rollup flow of whole_path.py
   (count, sum, min, max per key and minute), from the first INSERT until
   ADMIN FLUSH_FLOW returns; alone, and with the flow on a flow node (its
   input through JetStream, its output through the storage node's commit
   call). The ratio is the cost of the log. Both rollups are checked equal
   to the query.
2. Failover: the flow node that runs the flow (ROWS source rows, a
   snapshot) is killed with SIGKILL; one row is inserted; the time until the
   rollup shows it, with the lease TTL beside it.

Usage: cluster.py --sandflow PATH [--rows N] [--lease-ttl SECONDS]
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psycopg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from whole_path import (  # noqa: E402
    BATCH,
    ROLLUP_SANDFLOW,
    free_port,
    loadavg,
    row_of,
    values,
)


def program(name):
    for d in os.environ.get("PATH", "").split(":") + ["/usr/sbin", "/usr/local/sbin"]:
        p = os.path.join(d, name)
        if os.path.isfile(p):
            return p
    sys.exit(f"{name} not found: install Debian's etcd-server and nats-server (make setup)")


def wait_http(port, path, timeout=60):
    import http.client

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"nothing answered {path} on port {port}")


class Proc:
    def __init__(self, args, name):
        self.dir = tempfile.mkdtemp(prefix=f"sandflow-bench-{name}-")
        self.log = open(os.path.join(self.dir, "log"), "w")
        self.proc = subprocess.Popen(
            [a.replace("{dir}", self.dir) for a in args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, RUST_LOG="warn"),
        )

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def etcd():
    port, peer = free_port(), free_port()
    url, purl = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer}"
    p = Proc([program("etcd"), "--name", "b", "--data-dir", "{dir}/data",
              "--listen-client-urls", url, "--advertise-client-urls", url,
              "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
              "--initial-cluster", f"b={purl}"], "etcd")
    wait_http(port, "/health")
    return p, url


def nats():
    port, monitor = free_port(), free_port()
    p = Proc([program("nats-server"), "-js", "-a", "127.0.0.1", "-p", str(port),
              "-m", str(monitor), "-sd", "{dir}/js"], "nats")
    wait_http(monitor, "/healthz")
    return p, f"nats://127.0.0.1:{port}"


class Node(Proc):
    def __init__(self, binary, cluster=()):
        self.pg, self.http = free_port(), free_port()
        super().__init__([binary, "start", "--data-dir", "{dir}/data", "--auth", "none",
                          "--postgres-addr", f"127.0.0.1:{self.pg}",
                          "--http-addr", f"127.0.0.1:{self.http}",
                          "--mysql-addr", f"127.0.0.1:{free_port()}", *cluster], "node")
        wait_http(self.http, "/health", 120)

    def connect(self):
        return psycopg.connect(
            f"host=127.0.0.1 port={self.pg} user=sandflow dbname=public", autocommit=True
        )


def setup(c):
    c.execute("CREATE TABLE m (k STRING, ts TIMESTAMP TIME INDEX, v DOUBLE, PRIMARY KEY (k))")
    c.execute(
        "CREATE FLOW r SINK TO r_sink WITH (memory_limit = '2GiB') AS "
        + ROLLUP_SANDFLOW.format(src="m")
    )


def ingest(c, rows):
    start = time.perf_counter()
    for i in range(0, rows, BATCH):
        c.execute(f"INSERT INTO m VALUES {values([row_of(j) for j in range(i, min(rows, i + BATCH))])}")
    c.execute("ADMIN FLUSH_FLOW('r')")
    return rows / (time.perf_counter() - start)


def check(c):
    got = c.execute("SELECT k, minute, n, total, lo, hi FROM r_sink ORDER BY k, minute").fetchall()
    want = c.execute(
        "SELECT k, minute, n, total, lo, hi FROM (" + ROLLUP_SANDFLOW.format(src="m")
        + ") q ORDER BY k, minute"
    ).fetchall()
    if got != want:
        sys.exit("the rollup differs from its query")


def node_of(c):
    r = c.execute("SELECT node FROM information_schema.flows WHERE flow_name = 'r'").fetchone()
    return r[0] if r else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sandflow", required=True)
    ap.add_argument("--rows", type=int, default=int(os.environ.get("SANDFLOW_BENCH_ROWS", "200000")))
    ap.add_argument("--lease-ttl", type=int, default=3)
    a = ap.parse_args()
    print(f"load at start: {loadavg()}")

    alone = Node(a.sandflow)
    try:
        with alone.connect() as c:
            setup(c)
            single = ingest(c, a.rows)
            check(c)
    finally:
        alone.stop()

    procs = []
    try:
        e, etcd_url = etcd()
        n, nats_url = nats()
        procs += [e, n]

        def cluster(node_id, role):
            return ["--etcd", etcd_url, "--nats", nats_url, "--node-id", node_id,
                    "--role", role, "--lease-ttl", f"{a.lease_ttl}s"]

        storage = Node(a.sandflow, cluster("storage-1", "storage"))
        procs.append(storage)
        flow_nodes = {}
        for i in (1, 2):
            flow_nodes[f"flow-{i}"] = Node(a.sandflow, cluster(f"flow-{i}", "flow"))
            procs.append(flow_nodes[f"flow-{i}"])
        with storage.connect() as c:
            setup(c)
            deadline = time.time() + 120
            while not (node_of(c) or "").startswith("flow-"):
                if time.time() > deadline:
                    sys.exit("the flow never reached a flow node")
                time.sleep(0.1)
            remote = ingest(c, a.rows)
            check(c)
            print(f"per-flow throughput, {a.rows} rows in {BATCH}-row INSERTs to flushed:")
            print(f"  one node        {single:12,.0f} rows/s")
            print(f"  on a flow node  {remote:12,.0f} rows/s   ratio {remote / single:.2f}")

            # Failover: kill the node that runs the flow.
            time.sleep(11)  # a snapshot of the state (every 10 s)
            victim = node_of(c)
            flow_nodes[victim].kill()
            killed = time.perf_counter()
            c.execute("INSERT INTO m VALUES ('failover', '2030-01-01 00:00:00', 1)")
            while True:
                r = c.execute("SELECT n FROM r_sink WHERE k = 'failover'").fetchone()
                if r and r[0] == 1:
                    break
                if time.perf_counter() - killed > 300:
                    sys.exit("the flow never came back after its node was killed")
                time.sleep(0.01)
            took = time.perf_counter() - killed
            moved_to = node_of(c)
            check(c)
            print(f"failover of a flow with {a.rows} source rows and a snapshot "
                  f"({victim} killed, now on {moved_to}):")
            print(f"  kill to the next change visible {took:8.2f} s   (lease TTL {a.lease_ttl} s)")
    finally:
        for p in reversed(procs):
            p.stop()
    print(f"load at end: {loadavg()}")


if __name__ == "__main__":
    main()
