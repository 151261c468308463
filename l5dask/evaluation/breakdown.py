"""Which agent of a dataset each GT row is: its scene and its label, for the metrics' breakdowns.

A GT row is ``(timestamp, track_id)``: the frames with that timestamp come from one pass over the
frames (their timestamps only), the agents of those frames from one pass over the agents that
picks just their rows (track id and label probabilities). Nothing else is read.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from dask.base import tokenize

from l5dask.core.engine import Pass, Reduction
from l5dask.core.intervals import check_intervals
from l5dask.evaluation.csvfiles import CSVError
from l5dask.prediction import format as fmt
from l5dask.prediction.dataset import open_dataset
from l5dask.prediction.surgery import pick_rows

#: Keys shown when rows do not join (the rest counted).
SHOW_KEYS = 5


def _frames_chunk(wanted: np.ndarray, data: np.ndarray, start: int, parent: Any) -> tuple:
    hit = np.flatnonzero(np.isin(data["timestamp"], wanted))
    return (
        (start + hit).astype(np.int64),
        data["timestamp"][hit].astype(np.int64),
        data["agent_index_interval"][hit].reshape(-1, 2).astype(np.int64),
    )


def _concat3(a: tuple, b: tuple) -> tuple:
    return tuple(np.concatenate([x, y]) for x, y in zip(a, b))


def _empty3() -> tuple:
    return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, 2), np.int64)


def frames_at(ds: Any, timestamps: np.ndarray, job: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The frames whose timestamp is one of ``timestamps``: rows, timestamps, agent intervals."""
    wanted = np.unique(timestamps)
    red = Reduction(f"frames-at-{tokenize(wanted)}", functools.partial(_frames_chunk, wanted), _concat3, _empty3)
    frames = ds[fmt.FRAMES].select(("timestamp", "agent_index_interval"))
    return job.compute([Pass(frames, red, blocks=True, name="frames-at")])[0]


def agent_groups(
    dataset: Any, timestamps: np.ndarray, track_ids: np.ndarray, job: Any, storage_options: dict | None = None
) -> tuple[dict, dict]:
    """Per GT row, its agent's label (argmax of label probabilities) and scene, as group codes."""

    ds = dataset if hasattr(dataset, "arrays") else open_dataset(dataset, storage_options=storage_options)
    frame_rows, frame_ts, iv = frames_at(ds, timestamps, job)
    lengths = iv[:, 1] - iv[:, 0]
    agents = np.concatenate([np.arange(a, b) for a, b in iv]) if len(iv) else np.zeros(0, np.int64)
    agent_frame = np.repeat(np.arange(len(frame_rows)), lengths)
    order = np.argsort(agents, kind="stable")
    wanted = agents[order]
    if len(wanted) and (np.diff(wanted) == 0).any():
        raise CSVError("frames share agents: the dataset's intervals are broken")
    got = (
        pick_rows(ds[fmt.AGENTS], wanted, ("track_id", "label_probabilities"), job)
        if len(wanted)
        else {"track_id": np.zeros(0, np.int64), "label_probabilities": np.zeros((0, len(ds.labels)), np.float32)}
    )
    tid = np.empty(len(agents), np.int64)
    tid[order] = np.asarray(got["track_id"], np.int64)
    probs = np.asarray(got["label_probabilities"])
    probs = probs.reshape(len(wanted), -1) if len(wanted) else np.zeros((0, 1))  # (no frame found: none)
    label = np.empty(len(agents), np.int64)
    label[order] = np.argmax(probs, axis=1)
    # join GT rows to agents on (timestamp, track_id); the first agent (frame order) wins
    a_ts = frame_ts[agent_frame]
    key_ts = np.unique(np.concatenate([a_ts, timestamps]))
    key_tid = np.unique(np.concatenate([tid, track_ids]))

    def key(ts: np.ndarray, k: np.ndarray) -> np.ndarray:
        return np.searchsorted(key_ts, ts).astype(np.int64) * len(key_tid) + np.searchsorted(key_tid, k)

    akey = key(a_ts, tid)
    first = np.lexsort((np.arange(len(akey)), akey))
    akey_sorted = akey[first]
    gkey = key(timestamps, track_ids)
    pos = np.minimum(np.searchsorted(akey_sorted, gkey), max(len(akey_sorted) - 1, 0))
    found = (akey_sorted[pos] == gkey) if len(akey_sorted) else np.zeros(len(gkey), bool)
    if not found.all():
        bad = np.flatnonzero(~found)
        shown = ", ".join(f"(timestamp {timestamps[i]}, track {track_ids[i]})" for i in bad[:SHOW_KEYS])
        raise CSVError(f"{len(bad)} GT rows are not agents of {ds.url}: {shown}")
    agent = first[pos]
    scenes = ds[fmt.SCENES]
    iv_scenes = job.read(scenes.select(("frame_index_interval",)))["frame_index_interval"].reshape(-1, 2)
    check_intervals(iv_scenes, fmt.SCENES, "frame_index_interval", ds.counts()["frames"])  # (ends sorted)
    ends = iv_scenes[:, 1]
    scene = np.searchsorted(ends, frame_rows[agent_frame[agent]], side="right")
    labels = list(ds.labels)
    return (
        {"by_label": (label[agent], len(labels)), "by_scene": (scene.astype(np.int64), len(ends))},
        {"by_label": labels, "by_scene": list(range(len(ends)))},
    )
