"""Exactly once: the run's branch (`branch`) and the checkpoint that main's snapshot summary carries (`checkpoint`).

A batch is written on a branch and published by one checked fast-forward; the consumed offsets travel in the same
snapshot as the data. Imports `table` and the top-level contracts; writers see only the `Branch` it hands them.
"""
