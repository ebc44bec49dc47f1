"""The local backend: a store's data in a local directory.

Invariant: every file a reader may open is published whole by an atomic rename of an
fsynced temporary file (compactlog.fsutil), and a metadata document is committed by
compare-and-swap under an flock (document.py). Importing this package itself imports
nothing.
"""
