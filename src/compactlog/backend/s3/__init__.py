"""The S3 backend: a store's data under an s3:// prefix, through one bucket client.

Invariant: this package is the only one in compactlog that imports boto3 or botocore
(an import-linter contract in pyproject.toml), and every request it makes goes through
bucket.py's Bucket (but probe.py's, which reads a store's raw refusal of a conditional
header) and fails, if it fails, as error_mapping.py's one-line error, never carrying a
credential. Importing this package itself imports nothing.
"""
