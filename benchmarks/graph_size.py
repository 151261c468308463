"""Tasks of the report's graph on train_full, from the engine's own sizing (docs/scale.md's table).

    python benchmarks/graph_size.py [--threads 20 200 1000]

train_full's stored chunks: 133,000 of agents, 3,300 of frames, 32,000 of traffic-light faces,
14 of scenes. The counts use the functions the engine sizes a job with (l5dask.core.engine): every
pass is sized for the agents; the frames pass (persisted, its rows place the agent tasks) in
groups of at most 4 tasks a thread, and as many tasks that make each group's join rows again for
the agent tasks that need them (the pass does not hold them); the agents and the traffic-light
faces in guided groups (smaller at the end); ordered
tree combines of fan-in 16; plus the scenes read, the frames' interval bounds (a task per
interval field and one to gather them), a finalize per pass and the report.
"""

from __future__ import annotations

import argparse

from l5dask.core.engine import SPLIT_EVERY
from l5dask.core.policy import PARENT_TASKS_PER_THREAD, auto_chunks_per_task, task_groups

AGENTS, FRAMES, FACES = 133_000, 3_300, 32_000


def tree(n: int, fan_in: int = SPLIT_EVERY) -> int:
    tasks, level = 0, 0
    while n > 1 or level == 0:
        n, level = -(-n // fan_in), level + 1
        tasks += n
    return tasks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, nargs="+", default=[20, 200, 1000])
    args = parser.parse_args()
    print("| stage | 1 chunk per task | " + " | ".join(f"{t:,} threads (auto)" for t in args.threads) + " |")
    print("|---|---|" + "---|" * len(args.threads))
    rows = {
        "frames pass (persisted)": [FRAMES],
        "frames' join rows, made again": [FRAMES],
        "agents (read and reduce, fused)": [AGENTS],
        "traffic-light faces (read and reduce, fused)": [FACES],
        "ordered tree combines": [tree(AGENTS) + tree(FRAMES) + tree(FACES)],
        "scenes, bounds, finalizes, report": [8],
    }
    for t in args.threads:
        cpt = auto_chunks_per_task(AGENTS, t, "distributed")
        agents = len(task_groups(AGENTS, cpt, t))
        frames = -(
            -FRAMES
            // min(cpt, auto_chunks_per_task(FRAMES, t, "distributed", tasks_per_thread=PARENT_TASKS_PER_THREAD))
        )
        faces = len(task_groups(FACES, cpt, t))
        rows["frames pass (persisted)"].append(frames)
        rows["frames' join rows, made again"].append(frames)
        rows["agents (read and reduce, fused)"].append(agents)
        rows["traffic-light faces (read and reduce, fused)"].append(faces)
        rows["ordered tree combines"].append(tree(agents) + tree(frames) + tree(faces))
        rows["scenes, bounds, finalizes, report"].append(8)
    for name, values in rows.items():
        print(f"| {name} | " + " | ".join(f"{v:,}" for v in values) + " |")
    totals = [sum(v[i] for v in rows.values()) for i in range(len(args.threads) + 1)]
    print("| **total** | " + " | ".join(f"**{v:,}**" for v in totals) + " |")


if __name__ == "__main__":
    main()
