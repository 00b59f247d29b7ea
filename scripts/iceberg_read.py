"""Reads an Iceberg table with PyIceberg from PyPI (not this project's code)
and prints one JSON object: the rows, the distinct values of its `id` column,
its snapshots oldest first (id, operation, the sink's lineage and checkpoint
from the summary, rows and files added), the table's `eo-sink.*` properties,
and its live data files (each one's partition value, and the days of the
first and last `ts` it holds, if the table has that column).

    python iceberg_read.py CATALOG_DB WAREHOUSE NAMESPACE.NAME [OPTIONS]
    python iceberg_read.py rest:URI - NAMESPACE.NAME [OPTIONS]

The first form reads through the SQL catalog named `default` in the SQLite
database CATALOG_DB; WAREHOUSE is a directory or an s3:// URL, for which the
endpoint and credentials come from the AWS_* variables (scripts/with-s3 sets
them). The second reads through a REST catalog, with the credential,
warehouse and S3 settings scripts/with-seaweedfs names (ICEBERG_REST_*,
SEAWEEDFS_*).

Options:
  --expire-snapshots   first expire every snapshot but the current one (table
                       maintenance, as an operator runs it), then read
  --filter EXPR        read only the rows PyIceberg's row filter EXPR selects
                       (such as "ts >= '2026-01-02T00:00:00+00:00'"); the
                       counts and ids are of those rows
  --evolve-spec FIELD  first add the partition field FIELD (day(ts), hour(ts),
                       bucket(N,id) or identity(col)) to the table's spec, as
                       a user changing the table while a job writes it would
  --append FIRST COUNT BATCHES
                       first append COUNT rows (ids FIRST.., the demo's
                       columns) in BATCHES commits, each tried again on a
                       commit conflict, as another writer racing a job would;
                       prints how many commits conflicted

Each change is committed through the catalog's own checks; a conflict is read
again and tried again, up to 50 times.
"""

import datetime
import json
import os
import sys
import time

from pyiceberg.catalog.sql import SqlCatalog


def open_catalog(database, warehouse):
    if database.startswith("rest:"):
        from pyiceberg.catalog.rest import RestCatalog

        return RestCatalog(
            "rest",
            **{
                "uri": database[len("rest:"):],
                "credential": os.environ["ICEBERG_REST_CREDENTIAL"],
                "warehouse": os.environ["ICEBERG_REST_WAREHOUSE"],
                "s3.endpoint": os.environ["SEAWEEDFS_S3_ENDPOINT"],
                "s3.access-key-id": os.environ["SEAWEEDFS_ACCESS_KEY_ID"],
                "s3.secret-access-key": os.environ["SEAWEEDFS_SECRET_ACCESS_KEY"],
                "s3.region": os.environ["SEAWEEDFS_REGION"],
            },
        )
    properties = {"uri": f"sqlite:///{os.path.abspath(database)}"}
    if warehouse.startswith("s3://"):
        properties["warehouse"] = warehouse
        for key, variable in (
            ("s3.endpoint", "AWS_ENDPOINT_URL"),
            ("s3.access-key-id", "AWS_ACCESS_KEY_ID"),
            ("s3.secret-access-key", "AWS_SECRET_ACCESS_KEY"),
            ("s3.region", "AWS_REGION"),
        ):
            if variable in os.environ:
                properties[key] = os.environ[variable]
    else:
        properties["warehouse"] = f"file://{os.path.abspath(warehouse)}"
    return SqlCatalog("default", **properties)


def as_json(value):
    """A partition value as JSON holds it: a date as days since the epoch."""
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1_000_000)
    if isinstance(value, datetime.date):
        return (value - datetime.date(1970, 1, 1)).days
    return value


def live_files(table):
    """Each live data file's partition value, and the days of its first and
    last `ts` (read from the file itself)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    has_ts = any(field.name == "ts" for field in table.schema().fields)
    specs = table.specs()
    files = []
    for task in table.scan().plan_files():
        data_file = task.file
        spec = specs[data_file.spec_id]
        partition = {
            field.name: as_json(data_file.partition[position])
            for position, field in enumerate(spec.fields)
        }
        entry = {
            "path": data_file.file_path,
            "spec_id": data_file.spec_id,
            "partition": partition,
            "rows": data_file.record_count,
        }
        if has_ts:
            with table.io.new_input(data_file.file_path).open() as stream:
                ts = pq.read_table(stream, columns=["ts"]).column("ts")
            if len(ts) > 0:
                # microseconds since the epoch -> days since the epoch
                bounds = pc.min_max(pc.cast(ts, "int64"))
                day = 86_400_000_000
                entry["ts_days"] = [bounds["min"].as_py() // day, bounds["max"].as_py() // day]
        files.append(entry)
    return files


def retried(catalog, name, change):
    """Runs change(table) on the table read anew until it commits."""
    from pyiceberg.exceptions import CommitFailedException

    conflicts = 0
    for _ in range(50):
        try:
            change(catalog.load_table(name))
            return conflicts
        except CommitFailedException:
            conflicts += 1
            time.sleep(0.05)
    raise SystemExit(f"{name}: 50 commit conflicts in a row")


def evolve_spec(catalog, name, field):
    from pyiceberg.transforms import BucketTransform, DayTransform, HourTransform, IdentityTransform

    transform, _, rest = field.partition("(")
    arguments = [a.strip() for a in rest.rstrip(")").split(",")]
    column = arguments[-1]
    made = {
        "day": lambda: (DayTransform(), f"{column}_day"),
        "hour": lambda: (HourTransform(), f"{column}_hour"),
        "identity": lambda: (IdentityTransform(), column),
        "bucket": lambda: (BucketTransform(int(arguments[0])), f"{column}_bucket_{arguments[0]}"),
    }[transform]()

    def change(table):
        with table.update_spec() as update:
            update.add_field(column, made[0], made[1])

    return retried(catalog, name, change)


def append(catalog, name, first, count, batches):
    import pyarrow as pa

    conflicts = 0
    per_batch = -(-count // batches)
    for start in range(first, first + count, per_batch):
        ids = list(range(start, min(start + per_batch, first + count)))
        rows = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "ts": pa.array([(1_767_225_600 + i) * 1_000_000 for i in ids], pa.timestamp("us", tz="UTC")),
                "payload": pa.array(["appended by PyIceberg"] * len(ids), pa.string()),
            }
        )

        def change(table):
            table.append(rows.cast(table.schema().as_arrow()))

        conflicts += retried(catalog, name, change)
    return conflicts


def main() -> None:
    database, warehouse, name = sys.argv[1:4]
    options = sys.argv[4:]
    catalog = open_catalog(database, warehouse)
    changes = {}
    if "--evolve-spec" in options:
        field = options[options.index("--evolve-spec") + 1]
        changes["spec_conflicts"] = evolve_spec(catalog, name, field)
    if "--append" in options:
        at = options.index("--append")
        first, count, batches = (int(v) for v in options[at + 1 : at + 4])
        changes["append_conflicts"] = append(catalog, name, first, count, batches)
    table = catalog.load_table(name)
    if "--expire-snapshots" in options:
        current = table.current_snapshot()
        old = [s.snapshot_id for s in table.snapshots() if current is None or s.snapshot_id != current.snapshot_id]
        if old:
            table.maintenance.expire_snapshots().by_ids(old).commit()
        table = catalog.load_table(name)
    row_filter = options[options.index("--filter") + 1] if "--filter" in options else None
    scan = table.scan(selected_fields=("id",), row_filter=row_filter) if row_filter else table.scan(selected_fields=("id",))
    ids = scan.to_arrow().column("id").to_pylist()
    snapshots = []
    for snapshot in sorted(table.snapshots(), key=lambda s: s.sequence_number or 0):
        summary = snapshot.summary
        extra = summary.additional_properties if summary else {}
        checkpoint = extra.get("eo-sink.checkpoint")
        snapshots.append(
            {
                "id": snapshot.snapshot_id,
                "operation": summary.operation.value if summary else None,
                "lineage": extra.get("eo-sink.lineage"),
                "checkpoint": int(checkpoint) if checkpoint is not None else None,
                "added_records": int(extra.get("added-records", 0)),
                "added_files": int(extra.get("added-data-files", 0)),
            }
        )
    marks = {k: v for k, v in table.properties.items() if k.startswith("eo-sink.")}
    print(
        json.dumps(
            {
                "rows": len(ids),
                "distinct_ids": len(set(ids)),
                "min_id": min(ids) if ids else None,
                "max_id": max(ids) if ids else None,
                "snapshots": snapshots,
                "marks": marks,
                "files": live_files(table),
                **changes,
            }
        )
    )


if __name__ == "__main__":
    main()
