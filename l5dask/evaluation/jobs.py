"""The evaluation analyses a job file can run (``l5dask run``, :mod:`l5dask.core.jobfile`):
``select-agents``, L5Kit's agents mask, declared once and registered in the job's registry."""

from __future__ import annotations

from typing import Any

from l5dask.core.engine import Job
from l5dask.core.jobfile import Key, Kind, at_key, register
from l5dask.core.outputs import write_json
from l5dask.errors import UsageError
from l5dask.evaluation.agents import (
    TH_DISTANCE_AV,
    TH_EXTENT_RATIO,
    TH_YAW_DEGREE,
    check_threshold,
    mask_name,
    select_agents,
)
from l5dask.prediction.jobs import open_l5, run_fingerprint


def check_select_agents(ds: Any, params: dict) -> None:
    for key in ("threshold", "yaw-degrees", "extent-ratio", "distance-m"):
        with at_key(key):  # (said at the key's line)
            check_threshold(key, float(params[key]), probability=key == "threshold")
    with at_key("report"):
        if params["report"] and not params["report"].lower().endswith(".json"):
            raise UsageError(f"report {params['report']!r}: name the file *.json")


def run_select_agents(ds: Any, params: dict, outputs: dict, ctx: Any) -> dict:
    rep = select_agents(
        ds,
        params["threshold"],
        params["yaw-degrees"],
        params["extent-ratio"],
        params["distance-m"],
        output=outputs.get("output"),
        overwrite=True,
        storage_options=ctx.storage_options,
        scheduler=Job(ctx.client, chunks_per_task=ctx.chunks_per_task, progress=ctx.progress),
    )
    if "report" in outputs:
        write_json(rep, outputs["report"], ctx.storage_options)
    where = outputs.get("output") or f"{ds.url}/{mask_name(params['threshold'])}"
    return {"mask": where, "agents": rep["total_agent_frames"], "rejected": rep["total_reject"]}


SELECT_AGENTS = register(
    Kind(
        "select-agents",
        "L5Kit's agents mask (``l5dask select-agents``), written into the dataset or at ``output``",
        (
            Key("output", "template", "write the mask (a zarr array: a folder) here; default: into the dataset"),
            Key("report", "template", "L5Kit's report of the mask (``*.json``)"),
            Key("threshold", "float", "the label probability threshold", default=0.5),
            Key("yaw-degrees", "float", "max yaw change between frames", default=TH_YAW_DEGREE),
            Key("extent-ratio", "float", "max ratio of extent areas", default=TH_EXTENT_RATIO),
            Key("distance-m", "float", "max distance from the ego", default=TH_DISTANCE_AV),
        ),
        open=open_l5,
        run=run_select_agents,
        check=check_select_agents,
        folders=("output",),
        fingerprint=run_fingerprint,
        needs_output=False,
    )
)
