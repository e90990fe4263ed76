-- Statements used by awa_django's admin.

-- name: admin_queue_names
-- The queue filter's choices: every queue with lanes or a queue_meta row. Both are small control
-- tables (one row per queue, priority and shard; one per queue): this never reads job history.
SELECT queue FROM awa.queue_lanes
UNION
SELECT queue FROM awa.queue_meta
ORDER BY 1
LIMIT %s

-- name: database_now
-- The database's clock, for the confirmation of an action on everything a list matches: the
-- run leaves rows that join the list after it (awa_django/admin/bulk.py).
SELECT now()
