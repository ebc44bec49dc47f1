"""The admin HTTP listener: its routes and metrics (http_api), who calls it and what
they may do (route_access), and the read-only Iceberg REST catalog's routes
(iceberg_catalog). The Kafka protocol handlers never import it.
"""
