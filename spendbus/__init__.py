"""spendbus: meter and cap what LLM traffic costs.

The ``spendbus`` package is the command line and the local stack: a thin
layer over the stages (``ingest``, ``aggregator``, ``enforcer``), which talk
only through Kafka topics and the contract in ``schemas``.
"""

__version__ = "0.1.0"
