"""The perception tables' type check: the compiled scan against DuckDB checking the types itself.

    python benchmarks/json_types.py [--rows 400000] [--rounds 3]

On a generated sample_annotation.json (the largest table; 400,000 rows are about 200 MB):
  (a) DuckDB's parse into the declared columns (what l5dask parses; one thread, as per task);
  (b) the compiled type scan of the same bytes (``l5dask.perception.tables.check_types``);
  (c) the alternative: DuckDB reading the declared values as JSON and checking ``json_type`` of
      each (and of each list element) in SQL.
Best of --rounds, rounds interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time


def table(path: str, rows: int) -> None:
    rng = random.Random(0)
    with open(path, "w") as f:
        json.dump(
            [
                {
                    "token": f"{i:064x}",
                    "sample_token": f"{i // 50:064x}",
                    "instance_token": f"{i % 997:064x}",
                    "attribute_tokens": [f"{i % 7:064x}"],
                    "visibility_token": str(1 + i % 4),
                    "translation": [rng.uniform(-500, 500), rng.uniform(-500, 500), rng.uniform(-2, 2)],
                    "size": [rng.uniform(1, 3), rng.uniform(2, 6), rng.uniform(1, 3)],
                    "rotation": [rng.random(), 0.0, 0.0, rng.random()],
                    "prev": "",
                    "next": "",
                    "num_lidar_pts": i % 50,
                    "num_radar_pts": 0,
                }
                for i in range(rows)
            ],
            f,
            indent=1,
        )


def main() -> None:
    import duckdb

    from l5dask.perception import tables

    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    schema = tables.SCHEMA["sample_annotation"]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "sample_annotation.json")
        table(path, args.rows)
        size = os.path.getsize(path)

        def parse():
            con = duckdb.connect(config={"threads": 1})
            con.read_json(path, format="array", columns=dict(schema)).to_arrow_table()

        def scan():
            tables.check_types(path, "sample_annotation", path)

        def duckdb_check():
            con = duckdb.connect(config={"threads": 1})
            cols = ", ".join(f"'{k}': 'JSON'" for k in schema)
            num = "'DOUBLE', 'UBIGINT', 'BIGINT', 'NULL'"
            conds = []
            for c, t in schema.items():
                if t.endswith("[]"):
                    allowed = "'VARCHAR', 'NULL'" if t == "VARCHAR[]" else num
                    conds.append(
                        f'("{c}" IS NULL OR json_type("{c}") = \'NULL\' OR (json_type("{c}") = \'ARRAY\' '
                        f"AND list_has_all([{allowed}], json_type(\"{c}\", '$[*]'))))"
                    )
                else:
                    allowed = {"VARCHAR": "'VARCHAR'", "DOUBLE": num, "BOOLEAN": "'BOOLEAN'"}[t]
                    conds.append(f'("{c}" IS NULL OR json_type("{c}") IN (\'NULL\', {allowed}))')
            con.sql(
                f"SELECT count(*) FROM read_json('{path}', format='array', columns={{{cols}}}) "
                f"WHERE NOT ({' AND '.join(conds)})"
            ).fetchall()

        best: dict[str, float] = {}
        for _ in range(args.rounds):
            for name, fn in (("parse", parse), ("scan", scan), ("duckdb", duckdb_check)):
                t = time.perf_counter()
                fn()
                best[name] = min(best.get(name, 1e9), time.perf_counter() - t)
    print(f"sample_annotation.json: {args.rows:,} rows, {size / 1e6:.0f} MB; best of {args.rounds}")
    print(f"(a) DuckDB parse of the declared columns   {best['parse']:6.3f} s")
    print(
        f"(b) the compiled type scan                 {best['scan']:6.3f} s   ({100 * best['scan'] / best['parse']:.0f}% of (a))"
    )
    print(
        f"(c) DuckDB checking json_type per value    {best['duckdb']:6.3f} s   ((c)/(b) = {best['duckdb'] / best['scan']:.1f}x)"
    )


if __name__ == "__main__":
    main()
