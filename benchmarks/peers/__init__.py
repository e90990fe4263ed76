"""Cross-system benchmark: awa_django side by side with its Postgres peers (``benchmarks/run``)."""
