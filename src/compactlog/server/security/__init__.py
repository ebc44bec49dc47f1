"""Who a client is and what it may do, one question per module:
- tls: certificates for the Kafka listeners and the admin API;
- sasl_mechanisms: the PLAIN and SCRAM exchanges; sasl_users: the credentials they check;
- connection_security: one connection's principal, and the SASL gate before any request;
- acl_model: Kafka's ACL bindings and filters, and the rule that decides one request;
- authorizer: the server's ACLs, kept durable, and the decisions made from them;
- access: the checks every protocol handler makes, and Kafka's denial codes;
- code_allowlist: which code a client's topic config may name;
- log_escaping: no log line of the server's is written by a client.
"""
