"""The Kafka wire protocol as the server speaks it: request frames checked and decoded
(frame_guard, messages), responses encoded from the handlers' version-neutral dicts
(messages), compactlog's errors as Kafka error codes (error_codes), and the record
batches that Fetch serves (record_batches). Nothing here imports the rest of the server.
"""
