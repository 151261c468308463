"""Ground truth from a dataset: L5Kit's ``export_zarr_to_csv``, as a vectorized self-join.

For each selected agent (row ``a`` in frame ``f`` of scene ``s``, track ``k``), in agent order:
the current agent is the first of frame ``f`` with track ``k`` that passes the label filter (the
agent itself unless a frame repeats a track id; none: L5Kit raises, and so do we, naming it);
for ``i = 1..T`` the future position is the first agent of frame ``f + i`` with track ``k`` (no
label filter) if that frame is still in scene ``s``. Positions go to the agent's frame and back
as L5Kit's ``AgentDataset`` moves them (through float32), minus the current centroid.

Each task owns a range of agent rows; it reads the frames of the whole scenes that hold them and
only the agents of the frames its selected agents need (their own and the next T of their
scene; all of them when it computes the agents mask itself); the lookups ``(frame, track) ->
first agent`` are one sort and a ``searchsorted`` of every ``(agent, step)``.
Tasks return their rows formatted as L5Kit writes them; the file is appended in order and moved
into place whole.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from l5dask.core.engine import Job
from l5dask.core.outputs import check_writable
from l5dask.core.policy import where_keywords
from l5dask.core.store import file_store
from l5dask.errors import ChunkError, L5DaskError, StoreError, UsageError
from l5dask.evaluation.agents import (
    Thresholds,
    as_stored,
    check_threshold,
    label_ok,
    rows_per_task,
    span_frames,
    span_mask,
    spans,
    task_ranges,
)
from l5dask.evaluation.csvfiles import gt_bytes, gt_header, windows, write_ordered
from l5dask.prediction import format as fmt
from l5dask.prediction.dataset import open_dataset
from l5dask.prediction.surgery import scene_table

#: ``AgentDataset``'s defaults.
MIN_FRAME_HISTORY = 10
MIN_FRAME_FUTURE = 1


class MaskError(L5DaskError, ValueError):
    """A mask that does not fit the dataset, or selects an agent L5Kit cannot use."""


def _keys(frame: np.ndarray, track: np.ndarray, codes: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """One int64 key per ``(frame, track)`` (frames and tracks under 2**31: ``frame << 32 | track``;
    else ``frame * len(codes) + code``), and whether the track is among ``codes``."""
    if codes is None:
        return (frame.astype(np.int64) << 32) | track.astype(np.int64), np.ones(len(track), bool)
    code = np.searchsorted(codes, track)
    known = code < len(codes)
    known[known] = codes[code[known]] == track[known]
    return frame * len(codes) + np.minimum(code, max(len(codes) - 1, 0)), known


def _first_lookups(frame: np.ndarray, track: np.ndarray, passing: np.ndarray) -> tuple[tuple, tuple]:
    """Sorted keys ``(frame, track)`` and the first row of each: among all rows, and among the rows
    ``passing`` (one stable sort for both)."""
    small = not len(track) or (int(track.max()) < 2**31 and int(frame.max()) < 2**31)
    codes = None if small else np.unique(track)
    key = _keys(frame, track, codes)[0]
    order = np.argsort(key, kind="stable")  # rows in order within a key
    skey = key[order]

    def first(keys: np.ndarray, rows: np.ndarray) -> tuple:
        head = np.r_[True, keys[1:] != keys[:-1]] if len(keys) else np.zeros(0, bool)
        return keys[head], rows[head], codes

    keep = passing[order]
    return first(skey, order), first(skey[keep], order[keep])


def _find(table: tuple, frame: np.ndarray, track: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``(frame, track)`` in a lookup, and whether each was found."""
    keys, rows, codes = table
    q, known = _keys(frame, track, codes)
    pos = np.minimum(np.searchsorted(keys, q), max(len(keys) - 1, 0))
    found = known & (keys[pos] == q) if len(keys) else np.zeros(len(q), bool)
    return rows[pos] if len(rows) else np.zeros(len(q), np.int64), found


def gt_rows(
    ag: np.ndarray,
    frame: np.ndarray,
    timestamps: np.ndarray,
    selected: np.ndarray,
    future_len: int,
    threshold: float,
    scene_end: np.ndarray,
    name: Any,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """GT of the agents ``selected`` (positions in ``ag``, whose rows are in frames ``frame``:
    every agent of each frame from a selected agent's to ``future_len`` frames later, or its
    scene's end): timestamps, track ids, coords (n, T, 2), avails (n, T) as
    ``export_zarr_to_csv`` writes them. ``timestamps``: per frame; ``scene_end``: each selected
    agent's scene's end frame; ``name(position)``: the agent's row and frame, for errors."""
    n = len(ag)
    track = ag["track_id"].astype(np.uint64)
    anyone, passing = _first_lookups(frame, track, label_ok(as_stored(ag), threshold).view(bool))
    cur_rows, ok = _find(passing, frame[selected], track[selected])
    if not ok.all():
        i = int(selected[np.flatnonzero(~ok)[0]])
        row, at = name(i)
        raise MaskError(
            f"the mask selects agent {row} (track {int(track[i])}, frame {at}), which "
            f"fails the label filter > {threshold}: L5Kit's ground truth raises there"
        )
    steps = np.arange(1, future_len + 1)
    fut_frame = frame[selected][:, None] + steps
    in_scene = fut_frame < scene_end[:, None]
    k = np.broadcast_to(track[selected][:, None], fut_frame.shape)
    fut_rows, found = _find(anyone, np.where(in_scene, fut_frame, 0).ravel(), k.ravel())
    avail = (found.reshape(fut_frame.shape) & in_scene).astype(np.float32)
    centroid = ag["centroid"].reshape(n, 2).astype(np.float64)
    c = centroid[cur_rows]
    yaw = ag["yaw"][cur_rows].astype(np.float64)
    pos = np.where(avail[..., None] > 0, centroid[fut_rows.reshape(fut_frame.shape)], 0.0)
    # AgentDataset: world -> agent (float64), * availability, cast to float32, agent -> world, - centroid
    cos, sin = np.cos(yaw)[:, None], np.sin(yaw)[:, None]
    tx = -(cos[:, 0] * c[:, 0] + sin[:, 0] * c[:, 1])[:, None]
    ty = (sin[:, 0] * c[:, 0] - cos[:, 0] * c[:, 1])[:, None]
    ax = (pos[..., 0] * cos + pos[..., 1] * sin + tx) * avail
    ay = (pos[..., 0] * -sin + pos[..., 1] * cos + ty) * avail
    ax, ay = ax.astype(np.float32).astype(np.float64), ay.astype(np.float32).astype(np.float64)
    wx = ax * cos + ay * -sin + c[:, 0, None]
    wy = ax * sin + ay * cos + c[:, 1, None]
    coords = np.stack([wx - c[:, 0, None], wy - c[:, 1, None]], axis=-1)
    return timestamps[frame[selected]].astype(np.int64), track[selected].astype(np.int64), coords, avail


def _gt_task(
    agents: Any,
    frames: Any,
    span: Any,
    lo: int,
    hi: int,
    future_len: int,
    th: Thresholds,
    mask_source: Any,
    history: int,
    future: int,
    scene_f1: np.ndarray,
) -> bytes:
    """The GT rows of the selected agents among rows ``[lo, hi)``, formatted. Only the agents of
    the frames a selected agent needs (its own and the next ``future_len`` of its scene) are read."""
    fr = span_frames(frames, span)
    whole = None  # the span's agents, when the mask is computed here (then read once, for both)
    if isinstance(mask_source, np.ndarray) and mask_source.dtype == bool:
        chosen = mask_source
    else:
        if mask_source is None:
            whole = agents.read_rows(span.a0, span.a1, np.empty(span.a1 - span.a0, agents.dtype))
            counts = span_mask(agents, fr, span, th, lo, hi, records=whole)[0]
        else:  # the dataset's agents mask array
            counts = mask_source.read_rows(lo, hi, np.empty(hi - lo, mask_source.dtype))["value"]
        chosen = (counts[:, 0] >= history) & (counts[:, 1] >= future)
    rows = np.flatnonzero(chosen) + lo
    if not len(rows):
        return b""
    iv = fr["agent_index_interval"].reshape(-1, 2).astype(np.int64)
    sel_frame = np.searchsorted(iv[:, 1], rows, side="right")  # relative to the span's first frame
    scene_end = np.repeat(scene_f1 - span.f0, span.frames_per_scene)[sel_frame]
    # the frames needed: [f, min(f + T, scene end - 1)] of each selected agent, merged
    mark = np.zeros(len(fr) + 1, np.int64)
    np.add.at(mark, sel_frame, 1)
    np.add.at(mark, np.minimum(sel_frame + future_len + 1, scene_end), -1)
    needed = np.cumsum(mark[:-1]) > 0
    edges = np.diff(np.concatenate([[0], needed.view(np.int8), [0]]))
    f_lo, f_hi = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    if whole is None:
        ag = agents.read_ranges(iv[f_lo, 0], iv[f_hi - 1, 1])
    else:
        ag = np.concatenate([whole[a - span.a0 : b - span.a0] for a, b in zip(iv[f_lo, 0], iv[f_hi - 1, 1])])
    counts = iv[needed, 1] - iv[needed, 0]
    frame = np.repeat(np.flatnonzero(needed), counts)
    # positions of the selected rows among the rows read
    start = np.concatenate([[0], np.cumsum(iv[f_hi - 1, 1] - iv[f_lo, 0])[:-1]])
    piece = np.searchsorted(iv[f_lo, 0], rows, side="right") - 1
    selected = start[piece] + rows - iv[f_lo, 0][piece]
    ts, tid, coords, avail = gt_rows(
        ag,
        frame,
        fr["timestamp"],
        selected,
        future_len,
        th.threshold,
        scene_end,
        lambda i: (int(rows[np.searchsorted(selected, i)]), int(frame[i]) + span.f0),
    )
    return gt_bytes(ts, tid, coords, avail)


def load_mask(mask: Any, n: int, storage_options: dict | None = None) -> np.ndarray:
    """A boolean agents mask: an array, L5Kit's ``mask.npz`` (key ``arr_0``), or a ``.npy`` of the
    array (told by their first bytes: a zip, numpy's magic string); its length must be the number of
    agents. Never unpickled."""
    if isinstance(mask, (str, bytes)) or hasattr(mask, "__fspath__"):
        import zipfile
        import zlib

        path = str(mask)
        try:
            store, key = file_store(path, storage_options)  # (the store's retries and errors)
            raw = store.get(key, what="the mask")
            if raw[:6] == b"\x93NUMPY":
                mask = np.load(io.BytesIO(raw), allow_pickle=False)
            elif raw[:2] == b"PK":
                with np.load(io.BytesIO(raw), allow_pickle=False) as z:
                    if "arr_0" not in z.files:
                        raise MaskError(f"{path}: no array 'arr_0' (L5Kit's mask.npz holds one): {z.files}")
                    mask = z["arr_0"]
            else:
                raise MaskError(
                    f"{path}: not a numpy .npz file (L5Kit's mask.npz, as select-agents writes it) nor a .npy file"
                )
        except (FileNotFoundError, ChunkError):
            raise MaskError(f"{path}: no such file") from None
        except StoreError:
            raise
        except (ValueError, OSError, EOFError, NotImplementedError, zipfile.BadZipFile, zlib.error) as exc:
            # (an .npz is a zip: zipfile's own errors are none of numpy's, and were tracebacks)
            if isinstance(exc, MaskError):
                raise
            raise MaskError(f"{path}: not a numpy .npz or .npy file that can be read ({exc})") from None
    mask = np.asarray(mask)
    if mask.ndim != 1 or len(mask) != n:
        raise MaskError(f"the mask has shape {mask.shape}; the dataset has {n:,} agents (one flag per agent)")
    if mask.dtype != bool:
        if mask.dtype.kind not in "iu" or not np.isin(mask, (0, 1)).all():
            raise MaskError(f"the mask is {mask.dtype}, not booleans")
        mask = mask.astype(bool)
    return mask


@where_keywords
def export_zarr_to_csv(
    dataset: Any,
    csv_file_path: str,
    future_num_frames: int = 50,
    filter_agents_threshold: float = 0.5,
    agents_mask: Any = None,
    *,
    min_frame_history: int = MIN_FRAME_HISTORY,
    min_frame_future: int = MIN_FRAME_FUTURE,
    storage_options: dict | None = None,
    scheduler: Any = None,
    progress: bool = False,
) -> int:
    """The GT CSV that L5Kit's ``export_zarr_to_csv`` writes (same rows, order and header).

    ``agents_mask``: a boolean array (or a ``mask.npz`` path) of the agents to export; else the
    dataset's ``agents_mask/{threshold}`` with ``min_frame_history`` / ``min_frame_future`` (as
    ``AgentDataset``), computed on the fly when the dataset has none. Returns the rows written.
    ``scheduler``: where to run (a ``distributed.Client`` or its address, ``"threads"``...;
    default: the active client, else local threads); ``job=`` and ``client=`` are its old names
    (until the next release, with a ``FutureWarning``).
    """

    # (a threshold past 1 wrote a header alone; below 0, every agent: a new user's trial)
    check_threshold("filter_agents_threshold", float(filter_agents_threshold), probability=True)
    check_writable(csv_file_path, storage_options)
    if int(future_num_frames) < 1:
        raise UsageError(f"future frames must be at least 1, got {future_num_frames}")
    job = Job.of(scheduler, progress=progress)
    ds = dataset if hasattr(dataset, "arrays") else open_dataset(dataset, storage_options=storage_options)
    th = Thresholds(float(filter_agents_threshold))
    n = len(ds[fmt.AGENTS])
    mask: Any = None
    if agents_mask is not None:
        mask = load_mask(agents_mask, n, storage_options)
    else:
        mask = ds.masks.get(str(th.threshold))
    table = scene_table(ds, job)
    calls = []
    for lo, hi in task_ranges(n, rows_per_task(ds[fmt.AGENTS], job, table), align=1):
        span = spans(table, lo, hi)
        src = mask[lo:hi] if isinstance(mask, np.ndarray) else mask
        if isinstance(src, np.ndarray) and not src.any():
            continue
        calls.append(
            (
                ds[fmt.AGENTS],
                ds[fmt.FRAMES],
                span,
                lo,
                hi,
                int(future_num_frames),
                th,
                src,
                int(min_frame_history),
                int(min_frame_future),
                table.f1[span.s0 : span.s1],
            )
        )
    written = [0]

    def counted():
        for b in windows(job, _gt_task, calls, "l5-ground-truth"):
            written[0] += b.count(b"\n")
            yield b

    write_ordered(csv_file_path, gt_header(int(future_num_frames)), counted(), storage_options)
    return written[0]
