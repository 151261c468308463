"""The three queries of the aggregation benchmark, through one of the three paths, as a whole
process: ``python aggregate_queries.py DATASET q1|q2|q3 aggregate|aggregate_result|dataframe|xarray OUT.parquet``;
and the baseline a user would pick instead: the same queries in DuckDB (2 threads) over l5dask's
own Parquet export of the dataset (``l5dask export DATASET EXPORT``):
``python aggregate_queries.py EXPORT q1|q2|q3 duckdb OUT.parquet``.

Written as a user would write them (see notebooks/04_custom_aggregations.ipynb); the result is
saved as a long table (keys, then one column per value) for the benchmark to check against numpy.
"""

from __future__ import annotations

import sys

QUANTILES = [0.5, 0.9, 0.99]


def duckdb_query(export: str, query: str) -> str:
    """The query in DuckDB's SQL over the export's tables: ``label`` is the first label column
    with the row's greatest probability (numpy's argmax), speed and distance in float64."""
    from l5dask.prediction.format import LABELS

    m = "greatest(" + ", ".join(f'"{n}"' for n in LABELS) + ")"
    code = "CASE " + " ".join(f'WHEN "{n}" = {m} THEN {i}' for i, n in enumerate(LABELS)) + " END"
    name = "[" + ", ".join(f"'{n}'" for n in LABELS) + "][code + 1]"
    agents, frames, scenes = (f"read_parquet('{export}/{t}/*.parquet')" for t in ("agents", "frames", "scenes"))
    if query == "q1":
        return f"""
            SELECT scene_index, {name} AS label, value FROM (
                SELECT scene_index, {code} AS code,
                       avg(sqrt(velocity_x::DOUBLE * velocity_x::DOUBLE + velocity_y::DOUBLE * velocity_y::DOUBLE))
                           AS value
                FROM {agents} GROUP BY ALL) ORDER BY scene_index, code"""
    if query == "q2":
        return f"""
            SELECT host, hour, {name} AS label, value FROM (
                SELECT s.host, a.timestamp // 3600000000000 % 24 AS hour, {code} AS code, count(*) AS value
                FROM {agents} a JOIN {frames} f ON a.frame_index = f.frame_index
                     JOIN {scenes} s ON a.scene_index = s.scene_index
                WHERE sqrt((a.centroid_x - f.ego_x) * (a.centroid_x - f.ego_x)
                           + (a.centroid_y - f.ego_y) * (a.centroid_y - f.ego_y)) < 20
                GROUP BY ALL) ORDER BY host, hour, code"""
    qs = ", ".join(map(str, QUANTILES))
    return f"""
        SELECT {name} AS label, q[1] AS q50, q[2] AS q90, q[3] AS q99 FROM (
            SELECT {code} AS code, quantile_cont(extent_length::DOUBLE, [{qs}]) AS q
            FROM {agents} GROUP BY ALL) ORDER BY code"""


def aggregate_kwargs(query: str) -> dict:
    """The query's arguments of ``l5dask.aggregate`` (after the dataset and ``"agents"``)."""
    if query == "q1":
        return {"by": ["scene_index", "label"], "values": {"speed": ["mean"]}}
    if query == "q2":
        return {"by": ["host", "hour", "label"], "values": {"agent_index": ["count"]}, "where": "distance_to_ego < 20"}
    return {"by": ["label"], "values": {"extent_length": ["q50", "q90", "q99"]}}


def main(path: str, query: str, api: str, out: str) -> None:
    if api == "duckdb":
        import duckdb

        con = duckdb.connect(config={"threads": 2})
        con.execute(f"COPY ({duckdb_query(path, query)}) TO '{out}' (FORMAT parquet)")
        return
    import numpy as np

    import l5dask  # (no pandas import of our own: the paths bring it when they use it)

    ds = l5dask.open_dataset(path)
    if api in ("aggregate", "aggregate_result"):
        # (aggregate_result: the same pass, its table written as Arrow, no pandas: what a script
        # that writes a file needs, as `l5dask agg` does)
        from l5dask.prediction.aggregation import aggregate_result

        run = l5dask.aggregate if api == "aggregate" else aggregate_result
        res = run(ds, "agents", **aggregate_kwargs(query))
        if api == "aggregate_result":
            import pyarrow.parquet as pq

            pq.write_table(res.to_arrow(), out)
            return
    elif api == "dataframe":
        if query == "q1":
            df = ds.to_dask_dataframe("agents", columns=["speed", "label"], joins=["scene_index"])
            res = df.groupby(["scene_index", "label"], observed=True).speed.mean().compute().sort_index().reset_index()
        elif query == "q2":
            df = ds.to_dask_dataframe("agents", columns=["label", "distance_to_ego"], joins=["host", "hour"])
            res = (
                df[df.distance_to_ego < 20]
                .groupby(["host", "hour", "label"], observed=True)
                .size()
                .compute()
                .sort_index()
                .reset_index()
            )
        else:
            from l5dask.prediction.dataframe import quantiles

            df = ds.to_dask_dataframe("agents", columns=["label", "extent_length"])
            res = quantiles(df, "label", "extent_length", QUANTILES).reset_index()
    else:
        view = ds.joined("agents")
        if query == "q1":
            v = view.velocity.astype("float64")
            speed = np.sqrt(v.sel(xy="x") ** 2 + v.sel(xy="y") ** 2)
            res = speed.l5.groupby("scene_index", "label").mean().to_series().dropna().reset_index()
        elif query == "q2":
            dx = view.centroid.sel(xy="x") - view.ego_translation.sel(xyz="x")
            dy = view.centroid.sel(xy="y") - view.ego_translation.sel(xyz="y")
            near = np.sqrt(dx * dx + dy * dy) < 20
            res = near.l5.groupby("host", "hour", "label").sum().to_series()
            res = res[res > 0].reset_index()
        else:
            length = view.extent.sel(lwh="length").astype("float64")
            res = length.l5.groupby("label").quantile(QUANTILES).to_series().unstack().dropna(how="all").reset_index()
    res.columns = [str(c) for c in res.columns]
    res.astype({c: str for c in res.columns if str(res[c].dtype) in ("category", "object", "str")}).to_parquet(out)


#: The same queries as batch jobs: ``l5dask agg`` (the aggregate API without pandas: Arrow out).
CLI = {
    "q1": ["--by", "scene_index,label", "--value", "speed:mean"],
    "q2": ["--by", "host,hour,label", "--value", "agent_index:count", "--where", "distance_to_ego < 20"],
    "q3": ["--by", "label", "--value", "extent_length:q50,q90,q99"],
}


if __name__ == "__main__":
    main(*sys.argv[1:5])
