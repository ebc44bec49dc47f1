"""The Kafka listeners and their client connections: which listeners there are
(listeners), admission, framing and ordered responses (connections), and the request
memory budget the connections share (request_budget).
"""
