-- Health checks (awa_django.telemetry.health: awa_health and the health view). Each is one
-- cheap statement on control tables: never a scan of the rings or of history.

-- name: health_session
-- The probe never waits long on anything: a lock or a slow server fails it instead.
SET LOCAL statement_timeout = '5s'; SET LOCAL lock_timeout = '1s'

-- name: health_schema
-- With no check asked for: whether the awa schema is installed (its control tables exist).
SELECT to_regclass('awa.runtime_instances') IS NOT NULL

-- name: health_workers
-- Worker processes (concurrency > 0: not awa_maintenance) registered from one host: how many,
-- how many were seen within the staleness bound, and how long ago the freshest was seen.
SELECT count(*) AS registered,
       count(*) FILTER (
           WHERE last_seen_at > now() - make_interval(secs => %(stale)s)) AS live,
       extract(epoch FROM now() - max(last_seen_at))::double precision AS seen_ago
FROM awa.runtime_instances
WHERE hostname = %(host)s AND concurrency > 0

-- name: health_leader
-- Whether a session of this database holds the leader lock (class and object id of
-- 0x4157415f4d41494e, "AWA_MAIN", see leader_try), and the freshest process marked leader.
SELECT EXISTS (
           SELECT 1 FROM pg_locks k
           WHERE k.locktype = 'advisory' AND k.granted AND k.classid = 1096237407::oid
             AND k.objid = 1296124238::oid AND k.objsubid = 1
             AND k.database = (SELECT d.oid FROM pg_database d
                               WHERE d.datname = current_database())) AS held,
       (SELECT r.instance_id::text FROM awa.runtime_instances r
        WHERE r.is_leader ORDER BY r.last_seen_at DESC LIMIT 1) AS instance_id,
       (SELECT extract(epoch FROM now() - max(r.last_seen_at))::double precision
        FROM awa.runtime_instances r WHERE r.is_leader) AS seen_ago

-- name: queue_lag
SELECT queue, available, lag_seconds, paused FROM awa.queue_lag_v1()

-- name: queues_dlq_off
-- Queues whose DLQ is off (the metrics tell dead-lettered from failed with it).
SELECT queue FROM awa.queue_meta WHERE NOT dlq_enabled

-- name: workers_alive
-- Worker processes (not awa_maintenance) seen within the staleness bound.
SELECT count(*) FROM awa.runtime_instances
WHERE concurrency > 0 AND last_seen_at > now() - make_interval(secs => %s)
