"""A Kafka-protocol server over the log store (`compactlog serve`)."""
