"""Alert delivery: the shared alert topic to webhooks, each alert once per webhook (README.md)."""
