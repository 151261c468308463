"""Chopped test sets: L5Kit's ``create_chopped_dataset`` (``zarr_scenes_chop``, ``mask.npz``, ``gt.csv``).

The chopped dataset keeps the first ``N`` frames of every scene with their agents and faces,
intervals rebased (a scene's ``start_time`` and ``end_time`` kept), written by the surgery's
chunk-parallel copy (:mod:`l5dask.prediction.surgery`: a piece per scene and array, each task writing whole
output chunks). ``mask.npz`` flags the agents of each scene's last kept frame whose future count
in the agents mask is at least ``min_future`` (the mask computed on the fly when the dataset has
none: nothing is written into the input), and ``gt.csv`` is their ground truth from the
unchopped data (:mod:`l5dask.evaluation.ground_truth`).

Nothing is left half-written: the ground truth is written first (it is where bad input such as a
selected agent failing the label filter shows), then ``mask.npz``, then the dataset, whose
``.zgroup`` comes last; a failure removes whatever of the three was written.
"""

from __future__ import annotations

import contextlib
import io
import os
import posixpath
from dataclasses import dataclass
from typing import Any

import numpy as np

from l5dask.core.engine import Job
from l5dask.core.outputs import atomic_write, check_writable, filesystem, made_folder
from l5dask.core.policy import where_keywords
from l5dask.errors import OutputError, UsageError
from l5dask.evaluation.agents import (
    Thresholds,
    rows_per_task,
    span_frames,
    span_mask,
    spans,
    task_ranges,
)
from l5dask.evaluation.ground_truth import export_zarr_to_csv
from l5dask.prediction import format as fmt
from l5dask.prediction.dataset import open_dataset
from l5dask.prediction.surgery import (
    Output,
    Piece,
    pick_rows,
    remove,
    scene_table,
    target,
    tl_field,
    write_outputs,
)


@dataclass(frozen=True)
class Memory:
    """Rows held in memory, read as a piece's source (the chopped scenes: one row per scene)."""

    records: np.ndarray
    name: str = fmt.SCENES

    def read_rows(self, lo: int, hi: int, out: np.ndarray) -> np.ndarray:
        out[:] = self.records[lo:hi]
        return out


def _mask_at(agents: Any, frames: Any, span: Any, lo: int, hi: int, th: Thresholds, wanted: np.ndarray) -> np.ndarray:
    return span_mask(agents, span_frames(frames, span), span, th, lo, hi)[0][wanted - lo]


def future_counts(ds: Any, rows: np.ndarray, th: Thresholds, job: Any) -> np.ndarray:
    """The agents mask's ``(past, future)`` of agent ``rows`` (sorted): from the dataset's mask
    array, else computed over the scenes that hold them."""

    name = str(th.threshold)
    if name in ds.masks:
        return (
            pick_rows(ds.masks[name], rows, ("value",), job)["value"].reshape(-1, 2)
            if len(rows)
            else np.zeros((0, 2), np.uint32)
        )
    table = scene_table(ds, job)
    calls = []
    for lo, hi in task_ranges(len(ds[fmt.AGENTS]), rows_per_task(ds[fmt.AGENTS], job, table), align=1):
        w = rows[(rows >= lo) & (rows < hi)]
        if len(w):
            calls.append((ds[fmt.AGENTS], ds[fmt.FRAMES], spans(table, lo, hi), lo, hi, th, w))
    parts = job.map(_mask_at, calls, name="l5-mask-at") if calls else []
    return np.concatenate(parts) if parts else np.zeros((0, 2), np.uint32)


@where_keywords
def create_chopped_dataset(
    zarr_path: Any,
    th_agent_prob: float,
    num_frames_to_copy: int,
    num_frames_gt: int,
    min_frame_future: int,
    *,
    output: Any,
    overwrite: bool = False,
    storage_options: dict | None = None,
    scheduler: Any = None,
    progress: bool = False,
    chunks_per_task: int | None = None,
) -> str:
    """Write L5Kit's chopped test set of ``zarr_path`` into the folder ``output``: the chopped
    dataset under the input's own name, ``mask.npz`` and ``gt.csv``; returns ``output``.
    ``scheduler``: where to run (a ``distributed.Client`` or its address, ``"threads"``...;
    default: the active client, else local threads); ``client=`` is its old name
    (until the next release, with a ``FutureWarning``).
    """

    ds = zarr_path if hasattr(zarr_path, "arrays") else open_dataset(zarr_path, storage_options=storage_options)
    n_copy, n_gt = int(num_frames_to_copy), int(num_frames_gt)
    if n_copy < 1:
        raise UsageError(f"--frames must be at least 1, got {n_copy}")
    job = Job(scheduler, progress=progress, chunks_per_task=chunks_per_task)
    th = Thresholds(float(th_agent_prob))
    out_dir = str(output).rstrip("/")
    name = posixpath.basename(ds.url.rstrip("/")) or "chopped.zarr"
    data_url = f"{out_dir}/{name}"
    gt_path, mask_path = f"{out_dir}/gt.csv", f"{out_dir}/mask.npz"
    table = scene_table(ds, job)
    lengths = table.f1 - table.f0
    if len(lengths) and (lengths <= n_copy).any():
        s = int(np.flatnonzero(lengths <= n_copy)[0])
        raise UsageError(
            f"--frames {n_copy}: scene {s} has {int(lengths[s])} frames; every scene must have more "
            f"than the frames kept ({int((lengths <= n_copy).sum())} scenes do not)"
        )
    local = "://" not in out_dir
    if local and os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise OutputError(f"{out_dir}: is not a folder")
    # (a failed chop removes what it wrote, and the folders it made: nothing is left behind)
    with made_folder(out_dir) if local else contextlib.nullcontext():
        for p in (gt_path, mask_path):
            check_writable(p, storage_options)
            fs, q = filesystem(p, storage_options)
            if fs.exists(q) and not overwrite:
                raise OutputError(f"{p} exists (pass overwrite=True / --overwrite)")
        store = target(data_url, [ds], storage_options, overwrite)

        # the last kept frame of each scene, its agents (and the faces' end)
        last = (table.f0 + n_copy - 1).astype(np.int64)
        tl = tl_field(ds)
        fields = ("agent_index_interval",) + ((tl,) if tl else ())
        got = pick_rows(ds[fmt.FRAMES], np.unique(last), fields, job)
        pos = np.searchsorted(np.unique(last), last)
        last_iv = got["agent_index_interval"].reshape(-1, 2)[pos]
        a_end = last_iv[:, 1]
        rows = np.concatenate([np.arange(a, b) for a, b in last_iv]) if len(last_iv) else np.zeros(0, np.int64)
        counts = future_counts(ds, rows, th, job)
        keep = counts[:, 1] >= int(min_frame_future)
        orig = np.zeros(len(ds[fmt.AGENTS]), bool)
        orig[rows[keep]] = True
        kept_agents = a_end - table.a0
        out_a0 = np.r_[0, np.cumsum(kept_agents)[:-1]].astype(np.int64)
        chopped = np.zeros(int(kept_agents.sum()), bool)
        chopped_rows = (
            np.concatenate([o + np.arange(a - a0, b - a0) for o, a0, (a, b) in zip(out_a0, table.a0, last_iv)])
            if len(last_iv)
            else np.zeros(0, np.int64)
        )
        chopped[chopped_rows[keep]] = True

        def write_mask(tmp: str) -> None:
            with open(tmp, "wb") as f:
                buf = io.BytesIO()
                np.savez(buf, chopped)  # key arr_0, as L5Kit's np.savez(path, mask)
                f.write(buf.getvalue())

        written = []
        try:
            export_zarr_to_csv(ds, gt_path, n_gt, th.threshold, orig, storage_options=storage_options, scheduler=job)
            written.append(gt_path)
            atomic_write(mask_path, write_mask, storage_options)
            written.append(mask_path)
            o = Output(store, ds.labels)
            scenes = job.read(ds[fmt.SCENES]).copy()
            out_f0 = np.arange(len(scenes), dtype=np.int64) * n_copy
            iv = scenes["frame_index_interval"].reshape(-1, 2)
            iv[:, 0], iv[:, 1] = out_f0, out_f0 + n_copy
            o.pieces[fmt.SCENES] = [Piece(Memory(scenes), 0, len(scenes), 0)] if len(scenes) else []
            o.pieces[fmt.FRAMES], o.pieces[fmt.AGENTS] = [], []
            names = [fmt.SCENES, fmt.FRAMES, fmt.AGENTS]
            if tl:
                o.pieces[fmt.TL_FACES] = []
                names.append(fmt.TL_FACES)
                t_end = got[tl].reshape(-1, 2)[pos][:, 1]
                kept_faces = t_end - table.t0
                out_t0 = np.r_[0, np.cumsum(kept_faces)[:-1]].astype(np.int64)
            for s in range(len(scenes)):
                f0, a0 = int(table.f0[s]), int(table.a0[s])
                shifts: tuple[tuple[str, int], ...] = (("agent_index_interval", int(out_a0[s]) - a0),)
                if tl:
                    t0 = int(table.t0[s])
                    shifts += ((tl, int(out_t0[s]) - t0),)
                    o.pieces[fmt.TL_FACES].append(Piece(ds[fmt.TL_FACES], t0, int(t_end[s]), int(out_t0[s])))
                o.pieces[fmt.FRAMES].append(Piece(ds[fmt.FRAMES], f0, f0 + n_copy, int(out_f0[s]), shifts))
                o.pieces[fmt.AGENTS].append(Piece(ds[fmt.AGENTS], a0, int(a_end[s]), int(out_a0[s])))
            for n in names:
                o.dtypes[n], o.tails[n] = ds[n].dtype, ()
                o.pieces[n] = [p for p in o.pieces[n] if p.hi > p.lo]
            write_outputs([o], job)
        except BaseException:
            for p in written:
                fs, q = filesystem(p, storage_options)
                fs.rm(q)
            remove(store)
            raise
        return out_dir
