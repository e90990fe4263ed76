-- Read surfaces for the Django admin's unmanaged models.

-- One row per queue: exact counts, lag and last-hour throughput (computed on read).
CREATE VIEW awa.queue_stats AS SELECT * FROM awa.queue_stats_v1();
