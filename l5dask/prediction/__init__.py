"""The prediction data: L5Kit's zarr datasets (scenes, frames, agents, traffic-light faces)."""
