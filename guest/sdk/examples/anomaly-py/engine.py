"""A per-key anomaly score, exact under deletes: a sandflow user component
written in Python and built with componentize-py.

It reads one source table and keeps, per key, the multiset of its values (each
value with its multiplicity), so a delete or an upsert takes a value out
exactly. Its output has one row per key:

    (key, n, mean, stddev, score)

where `n` is how many non-NULL values the key has, `mean` their mean,
`stddev` their population standard deviation and `score` the largest
|value - mean| / stddev among them (0 when stddev is 0): how far the key's
most unusual value lies from the others. Sums are `math.fsum` over the
current values, so the result does not depend on the order rows arrived in,
and a flow restored from its snapshot writes what an uninterrupted one would.

On each tick it emits, for the keys that changed, `-1` for the key's old row
and `+1` for its new one. Rows whose value is NULL are ignored.

Options (`CREATE FLOW ... USING COMPONENT anomaly WITH (...)`):
- `key`: the key column (default: the source's first column);
- `value`: the value column (default: the first numeric column that is not
  the key).

The query's plan is not read: only the source's schema and the options. The
component is built with `--stub-wasi`: it imports nothing but the contract's
types, so it cannot read a clock, a file or the network, and it writes no log.
"""

import json
import math

from componentize_py_types import Err
from wit_world.exports import engine
from wit_world.imports.types import (
    Batch,
    Column,
    DataType,
    Field,
    FlowError_BadInput,
    FlowError_Internal,
    FlowError_Unsupported,
    TickOutput,
)

SNAPSHOT_VERSION = 1

INT_TYPES = {
    DataType.BOOLEAN,
    DataType.INT8,
    DataType.INT16,
    DataType.INT32,
    DataType.INT64,
    DataType.UINT8,
    DataType.UINT16,
    DataType.UINT32,
    DataType.UINT64,
    DataType.TIMESTAMP_SECOND,
    DataType.TIMESTAMP_MILLISECOND,
    DataType.TIMESTAMP_MICROSECOND,
    DataType.TIMESTAMP_NANOSECOND,
    DataType.DATE32,
}
FLOAT_TYPES = {DataType.FLOAT32, DataType.FLOAT64}
NUMERIC_TYPES = (INT_TYPES - {DataType.BOOLEAN, DataType.DATE32}) | FLOAT_TYPES
KEY_TYPES = INT_TYPES | FLOAT_TYPES | {DataType.UTF8}


def bad(message):
    return Err(FlowError_BadInput(message))


def option(options, name):
    for k, v in options:
        if k == name:
            return v
    return None


def column_index(fields, name):
    for i, f in enumerate(fields):
        if f.name == name:
            return i
    names = ", ".join(f.name for f in fields)
    raise bad(f"the source has no column '{name}' (its columns: {names})")


def cell(column, data_type, i):
    """Row i of a column as a Python value (None for NULL)."""
    if column.nulls and column.nulls[i]:
        return None
    if data_type in FLOAT_TYPES:
        return column.floats[i]
    if data_type in INT_TYPES:
        return column.ints[i]
    start, end = column.offsets[i], column.offsets[i + 1]
    return column.bytes[start:end].decode("utf-8")


def key_column(keys, data_type, nullable):
    """A batch column of keys of the source key's type."""
    nulls = bytes(1 if k is None else 0 for k in keys) if any(k is None for k in keys) else b""
    if data_type in FLOAT_TYPES:
        return Column([], [0.0 if k is None else k for k in keys], b"", [], nulls)
    if data_type in INT_TYPES:
        return Column([0 if k is None else k for k in keys], [], b"", [], nulls)
    data, offsets = bytearray(), [0]
    for k in keys:
        if k is not None:
            data += k.encode("utf-8")
        offsets.append(len(data))
    return Column([], [], bytes(data), offsets, nulls)


def ints(values):
    return Column(list(values), [], b"", [], b"")


def floats(values):
    return Column([], list(values), b"", [], b"")


class Flow(engine.Flow):
    def __init__(self, config):
        # config: key/value column indexes and the output's key field.
        self.config = config
        # key -> {value: multiplicity}, non-zero multiplicities only.
        self.values = {}
        # key -> the (n, mean, stddev, score) last emitted.
        self.emitted = {}
        # (time, key, value, diff) not yet applied: a row takes effect at the
        # first tick whose `now` is at or after its time.
        self.pending = []
        # Output rows (key, n, mean, stddev, score, diff) not yet drained.
        self.queue = []

    # -- the contract ------------------------------------------------------

    @classmethod
    def create(cls, plan, sources, options):
        if len(sources) != 1:
            raise Err(
                FlowError_Unsupported(
                    f"anomaly reads exactly one source table; the query reads {len(sources)}"
                )
            )
        fields = sources[0].fields
        if not fields:
            raise bad("the source has no columns")
        key_name, value_name = option(options, "key"), option(options, "value")
        key = column_index(fields, key_name) if key_name is not None else 0
        if value_name is not None:
            value = column_index(fields, value_name)
        else:
            value = next(
                (i for i, f in enumerate(fields) if i != key and f.data_type in NUMERIC_TYPES),
                None,
            )
            if value is None:
                raise bad("no numeric column for the value; name one with WITH (value = '...')")
        kf, vf = fields[key], fields[value]
        if kf.data_type not in KEY_TYPES:
            raise Err(
                FlowError_Unsupported(
                    f"the key column '{kf.name}' is {kf.data_type.name.lower()}; "
                    "anomaly keys by a number, a time or a string"
                )
            )
        if vf.data_type not in NUMERIC_TYPES:
            raise bad(f"the value column '{vf.name}' is not numeric")
        config = {
            "key": key,
            "value": value,
            "key_name": kf.name,
            "key_type": kf.data_type.value,
            "key_nullable": kf.nullable,
            "value_type": vf.data_type.value,
            "columns": [f.data_type.value for f in fields],
        }
        return cls(config)

    def output_schema(self):
        c = self.config
        return [
            Field(c["key_name"], DataType(c["key_type"]), c["key_nullable"], None),
            Field("n", DataType.INT64, False, None),
            Field("mean", DataType.FLOAT64, False, None),
            Field("stddev", DataType.FLOAT64, False, None),
            Field("score", DataType.FLOAT64, False, None),
        ]

    def push(self, source, input):
        if source != 0:
            raise bad(f"anomaly has one source; got rows for source {source}")
        types = [DataType(t) for t in self.config["columns"]]
        n = input.rows
        if len(input.columns) != len(types):
            raise bad(f"a batch of {len(input.columns)} columns; the source has {len(types)}")
        for name, side in (("times", input.times), ("diffs", input.diffs)):
            if n > 0 and len(side) not in (1, n):
                raise bad(f"a batch of {n} rows has {len(side)} {name}")
        key_i, value_i = self.config["key"], self.config["value"]
        kcol, vcol = input.columns[key_i], input.columns[value_i]
        try:
            for i in range(n):
                value = cell(vcol, types[value_i], i)
                if value is None:
                    continue
                time = input.times[i] if len(input.times) > 1 else input.times[0]
                diff = input.diffs[i] if len(input.diffs) > 1 else input.diffs[0]
                key = cell(kcol, types[key_i], i)
                self.pending.append((time, key, float(value), diff))
        except (IndexError, UnicodeDecodeError) as e:
            raise bad(f"a malformed batch: {e}")

    def tick(self, now, max_rows):
        ready = [p for p in self.pending if p[0] <= now]
        self.pending = [p for p in self.pending if p[0] > now]
        dirty = set()
        for _, key, value, diff in ready:
            per_key = self.values.setdefault(key, {})
            m = per_key.get(value, 0) + diff
            if m == 0:
                per_key.pop(value, None)
                if not per_key:
                    del self.values[key]
            else:
                per_key[value] = m
            dirty.add(key)
        for key in sorted(dirty, key=sort_key):
            new = self.stats(key)
            old = self.emitted.pop(key, None)
            if old == new:
                if old is not None:
                    self.emitted[key] = old
                continue
            if old is not None:
                self.queue.append((key, *old, -1))
            if new is not None:
                self.queue.append((key, *new, 1))
                self.emitted[key] = new
        out, self.queue = self.queue[:max_rows], self.queue[max_rows:]
        wakeup = min((p[0] for p in self.pending), default=None)
        return TickOutput(self.batch(out, now), bool(self.queue), wakeup)

    def snapshot(self):
        state = {
            "version": SNAPSHOT_VERSION,
            "config": self.config,
            "values": [[k, [[v, m] for v, m in vs.items()]] for k, vs in self.values.items()],
            "emitted": [[k, list(row)] for k, row in self.emitted.items()],
            "pending": [list(p) for p in self.pending],
            "queue": [list(r) for r in self.queue],
        }
        return json.dumps(state).encode("utf-8")

    @classmethod
    def restore(cls, state):
        try:
            s = json.loads(state.decode("utf-8"))
            if s.get("version") != SNAPSHOT_VERSION:
                raise ValueError(f"snapshot version {s.get('version')}, expected {SNAPSHOT_VERSION}")
            flow = cls(s["config"])
            flow.values = {k: {v: m for v, m in vs} for k, vs in s["values"]}
            flow.emitted = {k: tuple(row) for k, row in s["emitted"]}
            flow.pending = [tuple(p) for p in s["pending"]]
            flow.queue = [tuple(r) for r in s["queue"]]
            return flow
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as e:
            raise Err(FlowError_Internal(f"the snapshot cannot be read: {e}"))

    def state_size(self):
        entries = sum(len(vs) for vs in self.values.values())
        return 64 * entries + 96 * len(self.emitted) + 64 * (len(self.pending) + len(self.queue))

    # -- helpers -------------------------------------------------------------

    def stats(self, key):
        """(n, mean, stddev, score) of a key's current values, or None."""
        per_key = self.values.get(key)
        if not per_key:
            return None
        items = sorted(per_key.items())
        n = sum(m for _, m in items)
        if n <= 0:
            # More deletes than inserts so far: nothing to show until they balance.
            return None
        mean = math.fsum(v * 1.0 for v, m in items for _ in range(m)) / n
        var = math.fsum((v - mean) ** 2 for v, m in items for _ in range(m)) / n
        stddev = math.sqrt(var)
        score = 0.0 if stddev == 0 else max(abs(v - mean) for v, _ in items) / stddev
        return (n, mean, stddev, score)

    def batch(self, rows, now):
        c = self.config
        return Batch(
            len(rows),
            [
                key_column([r[0] for r in rows], DataType(c["key_type"]), c["key_nullable"]),
                ints(r[1] for r in rows),
                floats(r[2] for r in rows),
                floats(r[3] for r in rows),
                floats(r[4] for r in rows),
            ],
            [now] if rows else [],
            [r[5] for r in rows],
        )


def sort_key(key):
    # Keys of one flow share a type; NULL sorts first.
    return (key is not None, key if key is not None else 0)
