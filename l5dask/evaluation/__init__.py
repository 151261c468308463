"""Evaluation at scale: L5Kit's ground-truth and prediction CSVs, metrics, agent masks, ground
truth and chopped test sets, exact against L5Kit 1.5.0 and chunk-parallel.

The names mirror ``l5kit.evaluation``: ``read_gt_csv``, ``write_pred_csv``, ``select_agents``,
``export_zarr_to_csv``, ``create_chopped_dataset``, ``evaluate``... Each is imported on first use
(the command line lists the evaluation commands without importing dask).
"""

from __future__ import annotations

from l5dask.core.lazy import attach

#: public name -> its module
_PUBLIC = {
    **dict.fromkeys(
        ("MAX_MODES", "CSVError", "open_csv", "read_gt_csv", "read_pred_csv", "scan", "write_gt_csv", "write_pred_csv"),
        "csvfiles",
    ),
    "select_agents": "agents",
    "create_chopped_dataset": "chop",
    "export_zarr_to_csv": "ground_truth",
    "evaluate": "metrics",
}

__getattr__, __dir__, __all__ = attach(__name__, _PUBLIC)
