"""The log store: records and batches, log and sealed segments, manifests, partitions."""
