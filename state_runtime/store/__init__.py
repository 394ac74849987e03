"""The store: versioned key-value state in memory and in checkpoint files (deltas, snapshots).

Public names are exported from :mod:`state_runtime`; the modules here are the store's rooms.
"""
