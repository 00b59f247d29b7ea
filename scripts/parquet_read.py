"""Reads a file sink's Parquet output with readers no one here wrote,
pyarrow's dataset reader and DuckDB, and prints one JSON object per reader.

    python parquet_read.py OUT RECORDS

OUT is a directory or an s3://bucket/prefix URL (endpoint and credentials
from the AWS_* variables). Both readers use Hive partitioning (`dt=…/hour=…`
directories become columns) and skip hidden files and directories (a
leading dot: what the sink has not committed). Each object says how many
rows were read, how many distinct ids, which ids of 0..RECORDS are missing
or duplicated (the first 20 of each), and how many rows lie in a `dt` or
`hour` directory other than their `ts`'s. The exit status is 0 when both
readers saw every id once, each in its own directory.

DuckDB reads the directory with `read_parquet('OUT/**/*.parquet',
hive_partitioning = true)`. On S3, it reads a local copy of the visible
objects made with pyarrow's S3 client (DuckDB's S3 support is an extension
that is not on PyPI).
"""

import json
import os
import sys
import tempfile
from collections import Counter
from urllib.parse import urlparse

import duckdb
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs


def s3_filesystem() -> pafs.S3FileSystem:
    endpoint = urlparse(os.environ["AWS_ENDPOINT_URL"])
    return pafs.S3FileSystem(
        access_key=os.environ.get("AWS_ACCESS_KEY_ID"),
        secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
        region=os.environ.get("AWS_REGION", "us-east-1"),
        endpoint_override=endpoint.netloc,
        scheme=endpoint.scheme or "http",
        allow_bucket_creation=False,
    )


def summary(ids, misplaced, records):
    counts = Counter(ids)
    return {
        "rows": len(ids),
        "distinct_ids": len(counts),
        "missing": [i for i in range(records) if i not in counts][:20],
        "duplicated": sorted(i for i, n in counts.items() if n > 1)[:20],
        "out_of_range": sorted(i for i in counts if not 0 <= i < records)[:20],
        "misplaced": misplaced,
    }


def read_pyarrow(source, filesystem, records):
    dataset = ds.dataset(
        source,
        filesystem=filesystem,
        format="parquet",
        partitioning="hive",
        ignore_prefixes=[".", "_"],
    )
    table = dataset.to_table(columns=["id", "ts", "dt", "hour"])
    ts = table.column("ts")
    day = pc.strftime(ts, format="%Y-%m-%d")
    hour = pc.hour(ts)
    dt = pc.cast(table.column("dt"), "string")
    wrong = pc.or_(pc.not_equal(day, dt), pc.not_equal(hour, pc.cast(table.column("hour"), hour.type)))
    misplaced = pc.sum(pc.cast(wrong, "int64")).as_py() or 0
    return summary(table.column("id").to_pylist(), misplaced, records)


def read_duckdb(directory, records):
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    glob = os.path.join(directory, "**", "*.parquet")
    relation = f"read_parquet('{glob}', hive_partitioning = true)"
    ids = [row[0] for row in con.execute(f"SELECT id FROM {relation}").fetchall()]
    misplaced = con.execute(
        f"SELECT count(*) FROM {relation} "
        "WHERE strftime(ts, '%Y-%m-%d') <> CAST(dt AS VARCHAR) OR hour(ts) <> CAST(hour AS BIGINT)"
    ).fetchone()[0]
    return summary(ids, misplaced, records)


def copy_visible(filesystem, prefix, into):
    """Copies every visible object under `prefix` (no path segment below it
    starting with a dot) into the directory `into`."""
    selector = pafs.FileSelector(prefix, recursive=True)
    for info in filesystem.get_file_info(selector):
        if info.type != pafs.FileType.File:
            continue
        relative = info.path[len(prefix):].lstrip("/")
        if any(part.startswith(".") for part in relative.split("/")):
            continue
        target = os.path.join(into, relative)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with filesystem.open_input_stream(info.path) as source, open(target, "wb") as out:
            out.write(source.read())


def main() -> None:
    out, records = sys.argv[1], int(sys.argv[2])
    if out.startswith("s3://"):
        filesystem = s3_filesystem()
        prefix = out[len("s3://"):].rstrip("/")
        result = {"pyarrow": read_pyarrow(prefix, filesystem, records)}
        with tempfile.TemporaryDirectory() as copy:
            copy_visible(filesystem, prefix, copy)
            result["duckdb"] = read_duckdb(copy, records)
    else:
        result = {
            "pyarrow": read_pyarrow(out, None, records),
            "duckdb": read_duckdb(out, records),
        }
    print(json.dumps(result))
    good = all(
        r["rows"] == records
        and r["distinct_ids"] == records
        and not r["missing"]
        and not r["duplicated"]
        and not r["out_of_range"]
        and r["misplaced"] == 0
        for r in result.values()
    )
    sys.exit(0 if good else 1)


if __name__ == "__main__":
    main()
