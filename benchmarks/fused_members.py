"""Where the CPU of one fused pass goes, member by member (issue 48): the report, the catalog and the
three aggregations of ``analyze_benchmark.py``, in one ``l5dask.analyze`` on one thread.

    python benchmarks/fused_members.py [--scenes 1700] [--repeat 3] [--before CHECKOUT] [--breakdown]

Each member's ``chunk`` and ``combine`` (its thread CPU seconds, its gathers from the stored bytes
left out) and the block's gathers (``Encoded.gather``, all members together), averaged over
``--repeat`` runs after one to warm up, on the synchronous scheduler (one thread: no time counted
twice, none lost to the other thread). Finer and steadier than whole processes
(``before_after.py --jobs run``), whose CPU seconds move by 5% from one round to the next here.
With ``--before``, the same in a process of that checkout (first on ``PYTHONPATH``), the two
alternating ``--repeat`` times, and both printed side by side.

``--breakdown``: the run beside the report alone (``report alone: ...`` rows), with each
member's calls, the tasks of each source (``tasks ...``), the process's CPU seconds and what the
members and gathers leave of them (``other``: reading the stored bytes, the scheduler, the tasks'
and the tree's Python): where the run's time beyond the report goes.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def measure(path: str, repeat: int, report_alone: bool = False) -> dict[str, float]:
    """CPU seconds per member's chunk and combine, and the gathers, of ``repeat`` runs (averaged);
    calls and tasks counted; ``report_alone``: the report's own run instead."""
    from analyze_benchmark import analyses

    import l5dask
    from l5dask.core import engine
    from l5dask.prediction import reading

    acc: collections.Counter = collections.Counter()
    inside = [0, 0.0]  # (depth of gathers, their seconds so far)
    gather = reading.Encoded.gather

    def timed_gather(self, *a, **k):
        t = time.thread_time()
        inside[0] += 1
        try:
            return gather(self, *a, **k)
        finally:
            inside[0] -= 1
            if inside[0] == 0:
                dt = time.thread_time() - t
                acc["gather"] += dt
                inside[1] += dt

    def wrap(red: engine.Reduction) -> engine.Reduction:
        def chunk(*a):
            g, t = inside[1], time.thread_time()
            out = red.chunk(*a)
            acc[f"{red.name[:16]}: chunk"] += time.thread_time() - t - (inside[1] - g)
            acc[f"{red.name[:16]}: calls"] += 1
            return out

        def combine(*a):
            t = time.thread_time()
            out = red.combine(*a)
            acc[f"{red.name[:16]}: combine"] += time.thread_time() - t
            return out

        return dataclasses.replace(red, chunk=chunk, combine=combine)

    fused = engine.fused_reduction

    def fused_reduction(members, source):
        return fused([dataclasses.replace(m, reduction=wrap(m.reduction)) for m in members], source)

    stage = engine.Pass.stage

    def timed_stage(self):  # (a pass alone: its reduction timed as a member's)
        s = stage(self)
        if s.reduction is not None and not s.reduction.name.startswith("fused("):
            s = s._replace(reduction=wrap(s.reduction))
        return s

    run_group = engine.run_group

    def counted_group(spec, *a):
        acc[f"tasks {spec.source.name}"] += 1
        return run_group(spec, *a)

    reading.Encoded.gather = timed_gather  # type: ignore[method-assign]
    engine.fused_reduction = fused_reduction  # type: ignore[assignment]
    engine.Pass.stage = timed_stage  # type: ignore[method-assign]
    engine.run_group = counted_group  # type: ignore[assignment]
    what = {"report": analyses()["report"]} if report_alone else None
    l5dask.analyze(path, what or analyses(), scheduler="sync")
    acc.clear()
    t = time.process_time()
    for _ in range(repeat):
        l5dask.analyze(path, what or analyses(), scheduler="sync")
    cpu = time.process_time() - t
    timed = sum(v for k, v in acc.items() if not k.endswith(": calls") and not k.startswith("tasks "))
    acc["process CPU"], acc["other"] = cpu, cpu - timed
    return {k: v / repeat for k, v in sorted(acc.items())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenes", type=int, default=1700)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--before")
    parser.add_argument("--breakdown", action="store_true")
    parser.add_argument("--child", metavar="PATH")
    parser.add_argument("--alone", action="store_true")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, 1, args.alone)))
        return
    from common import checkouts, child_json, dataset, print_means

    path = dataset(args.scenes)
    trees = checkouts(args.before)
    got: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
    for _ in range(args.repeat):
        for name, tree in trees.items():
            runs = {
                alone: child_json(__file__, tree, path, *(["--alone"] if alone else []))
                for alone in ([False, True] if args.breakdown else [False])
            }
            if args.breakdown:
                report = runs[True]
                runs[False].update({f"report alone: {k}": v for k, v in report.items()})
                runs[False]["run / report alone (CPU)"] = runs[False]["process CPU"] / report["process CPU"]
            got[name].append(runs[False])
    print_means(f"dataset: {path}; CPU seconds a run, mean of {args.repeat} (one thread)", got, 44)


if __name__ == "__main__":
    main()
