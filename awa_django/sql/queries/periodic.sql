-- Periodic jobs (functions/periodic.sql, docs/periodic.md).

-- name: cron_sync
-- One JSON array of schedule rows; returns (name, change) per schedule created, updated or removed.
SELECT name, change FROM awa.cron_sync_v1(%s::jsonb)

-- name: cron_due
-- What the leader evaluates: unpaused schedules and the database clock's now().
SELECT now() AS now, name, cron_expr, timezone, catch_up, fire_after, kind, queue
FROM awa.cron_schedules WHERE paused_at IS NULL ORDER BY name

-- name: cron_fire
-- name, expected fire_after, fire time, then awa.enqueue_one_v2's five limits.
SELECT awa.cron_fire_v1(%s, %s, %s, %s, %s, %s, %s, %s)

-- name: cron_trigger
SELECT awa.cron_trigger_v1(%s, %s, %s, %s, %s, %s)

-- name: cron_pause
SELECT awa.cron_pause_v1(%s, %s, %s)

-- name: cron_list
SELECT now() AS now, name, kind, cron_expr, timezone, catch_up, queue, priority, fire_after,
       last_fire_at, last_job_id, last_job_state, enabled, paused_at, paused_by
FROM awa.cron_schedule_status
WHERE %(name)s::text IS NULL OR name = %(name)s
ORDER BY name
