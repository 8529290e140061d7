"""Local, Docker-free stand-ins for the infrastructure spendbus runs on (Kafka broker, ...).

These are what `spendbus up` / `spendbus down` and the integration and fault tests start when no
existing cluster is given (KAFKA_BOOTSTRAP). Nothing here is imported by the pipeline stages.
"""
