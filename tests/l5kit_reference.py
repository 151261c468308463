"""L5Kit's per-agent code paths, transcribed where L5Kit cannot be imported without torch.

``export_zarr_to_csv`` runs ``AgentDataset`` (torch, the rasterizer stack, numpy aliases gone
since numpy 1.24); :func:`ground_truth` is its code path for one agent, line for line
(``AgentDataset.__getitem__`` -> ``generate_agent_sample`` -> ``get_relative_poses``, then
``transform_points(...) - centroid``), with L5Kit's own ``filter_agents_by_labels`` /
``filter_agents_by_track_id`` and its ``write_gt_csv``.
"""

from __future__ import annotations

import bisect
import sys

import numpy as np

from .conftest import l5kit_evaluation, l5kit_select_agents


def ground_truth(path: str, csv_path: str, future_len: int, threshold: float, mask: np.ndarray) -> None:
    l5kit_select_agents()
    from l5kit.data.zarr_dataset import ChunkedDataset

    flt = sys.modules["l5kit.data.filter"]
    cu = l5kit_evaluation()[0]
    z = ChunkedDataset(path)
    z.open()
    scenes, frames, agents = z.scenes[:], z.frames[:], z.agents[:]
    cum_agents = frames["agent_index_interval"][:, 1]
    cum_frames = scenes["frame_index_interval"][:, 1]
    out = {"timestamps": [], "track_ids": [], "coords": [], "avails": []}
    for index in np.nonzero(mask)[0]:
        frame_index = bisect.bisect_right(cum_agents, index)
        scene_index = bisect.bisect_right(cum_frames, frame_index)
        f_end = scenes[scene_index]["frame_index_interval"][1]
        track_id = agents[index]["track_id"]
        cur = frames[frame_index]
        cur_agents = agents[slice(*cur["agent_index_interval"])]
        agent = flt.filter_agents_by_track_id(flt.filter_agents_by_labels(cur_agents, threshold), track_id)[0]
        centroid, yaw = agent["centroid"], float(agent["yaw"])
        world_from_agent = np.array(
            [[np.cos(yaw), -np.sin(yaw), centroid[0]], [np.sin(yaw), np.cos(yaw), centroid[1]], [0, 0, 1]]
        )
        agent_from_world = np.linalg.inv(world_from_agent)
        positions = np.zeros((future_len, 2))
        avail = np.zeros(future_len, np.float32)
        for i, fr in enumerate(frames[frame_index + 1 : min(frame_index + 1 + future_len, f_end)]):
            found = flt.filter_agents_by_track_id(agents[slice(*fr["agent_index_interval"])], track_id)
            if len(found) == 0:
                continue
            positions[i] = found[0]["centroid"]
            avail[i] = 1.0
        target = ((positions @ agent_from_world[:2, :2].T + agent_from_world[:2, 2]) * avail[:, None]).astype(
            np.float32
        )
        offsets = target @ world_from_agent[:2, :2].T + world_from_agent[:2, 2] - centroid[:2]
        out["timestamps"].append(cur["timestamp"])
        out["track_ids"].append(np.int64(track_id))
        out["coords"].append(offsets)
        out["avails"].append(avail)
    cu.write_gt_csv(
        csv_path,
        np.asarray(out["timestamps"]),
        np.asarray(out["track_ids"]),
        np.asarray(out["coords"]).reshape(-1, future_len, 2),
        np.asarray(out["avails"]).reshape(-1, future_len),
    )
