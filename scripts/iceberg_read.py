"""Reads an Iceberg table with PyIceberg from PyPI (not this project's code)
through the SQL catalog named `default` and prints one JSON object: the rows,
the distinct values of its `id` column, its snapshots oldest first (id,
operation, the sink's lineage and checkpoint from the summary, rows and
files added), and the table's `eo-sink.*` properties.

    python iceberg_read.py CATALOG_DB WAREHOUSE NAMESPACE.NAME [--expire-snapshots]

With --expire-snapshots it first expires every snapshot but the current one
(table maintenance, as an operator runs it), then reads.

WAREHOUSE is a directory or an s3:// URL; for s3:// the endpoint and
credentials come from the AWS_* variables (scripts/with-s3 sets them).
"""

import json
import os
import sys

from pyiceberg.catalog.sql import SqlCatalog


def main() -> None:
    database, warehouse, name = sys.argv[1:4]
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
    catalog = SqlCatalog("default", **properties)
    table = catalog.load_table(name)
    if "--expire-snapshots" in sys.argv[4:]:
        current = table.current_snapshot()
        old = [s.snapshot_id for s in table.snapshots() if current is None or s.snapshot_id != current.snapshot_id]
        if old:
            table.maintenance.expire_snapshots().by_ids(old).commit()
        table = catalog.load_table(name)
    ids = table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()
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
            }
        )
    )


if __name__ == "__main__":
    main()
