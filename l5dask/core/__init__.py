"""The core: what knows no dataset format (the engine, stores, outputs, the cluster, intervals,
the chunk codec's rule). No module here imports a system (prediction, evaluation, perception)."""
