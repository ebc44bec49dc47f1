"""The group coordinator: Kafka's classic consumer-group protocol (group_coordinator)
and where the committed offsets are kept (offset_files).
"""
