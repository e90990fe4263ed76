-- Statements used by awa_django's admin.

-- name: admin_queue_names
-- The queue filter's choices: every queue with lanes or a queue_meta row. Both are small control
-- tables (one row per queue, priority and shard; one per queue): this never reads job history.
SELECT queue FROM awa.queue_lanes
UNION
SELECT queue FROM awa.queue_meta
ORDER BY 1
LIMIT %s
