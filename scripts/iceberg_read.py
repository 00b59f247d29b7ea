"""Reads an Iceberg table with PyIceberg from PyPI (not this project's code)
through the SQL catalog named `default` and prints one JSON object: the rows,
the distinct values of its `id` column, its snapshots oldest first (id,
operation, the sink's lineage and checkpoint from the summary, rows and
files added), and the table's `eo-sink.*` properties.

    python iceberg_read.py CATALOG_DB WAREHOUSE NAMESPACE.NAME
"""

import json
import os
import sys

from pyiceberg.catalog.sql import SqlCatalog


def main() -> None:
    database, warehouse, name = sys.argv[1:4]
    catalog = SqlCatalog(
        "default",
        uri=f"sqlite:///{os.path.abspath(database)}",
        warehouse=f"file://{os.path.abspath(warehouse)}",
    )
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
