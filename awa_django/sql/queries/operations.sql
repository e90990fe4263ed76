-- Statements of the operator API (awa_django.operator: reads.py and actions.py) and the
-- isolation statements of awa_django.db.transactions. The operator reads build typed rows by
-- column name: every column they select is named.

-- name: cancel
SELECT awa.cancel_v1(%s, %s)

-- name: dlq_retry
SELECT job_id, outcome FROM awa.dlq_retry_v2(%s::bigint[], %s, %s, %s)

-- name: dlq_purge
SELECT job_id FROM awa.dlq_purge_v1(%s::bigint[]) AS job_id

-- name: queue_pause
SELECT awa.queue_pause_v1(%s, %s)

-- name: queue_drain
-- One batch, in one short transaction; only jobs enqueued before the drain began (job id bound).
SELECT awa.queue_drain_v2(%s, %s, %s)

-- name: job_id_high_water
SELECT last_value FROM awa.job_id_seq

-- name: queue_stats
SELECT queue, available, running, waiting_external, scheduled, retryable, completed, failed,
       cancelled, dlq, paused, lag_seconds, completed_last_hour
FROM awa.queue_stats_v1()

-- name: queue_limits
SELECT queue, max_running AS global_concurrency, in_use, rate AS rate_limit, burst AS rate_burst,
       source, updated_by, updated_at
FROM awa.flow_status_v1()

-- name: queue_limits_of
SELECT queue, max_running AS global_concurrency, in_use, rate AS rate_limit, burst AS rate_burst,
       source, updated_by, updated_at
FROM awa.flow_status_v1() WHERE queue = %s

-- name: flow_set
-- Set (source 'operator') or clear one queue's limits; clearing writes p_settings back.
SELECT queue FROM awa.flow_set_v1(%s, %s, %s, %s, %s, %s, %s::jsonb)

-- name: kind_limits
SELECT kind, max_running AS global_concurrency, in_use, rate AS rate_limit, burst AS rate_burst,
       waiting, source, updated_by, updated_at
FROM awa.flow_kind_status_v1()

-- name: kind_limits_of
SELECT kind, max_running AS global_concurrency, in_use, rate AS rate_limit, burst AS rate_burst,
       waiting, source, updated_by, updated_at
FROM awa.flow_kind_status_v1()
WHERE kind = %s AND (max_running IS NOT NULL OR rate IS NOT NULL)

-- name: flow_kind_set
-- Set (source 'operator') or clear one job kind's limits; clearing writes p_settings back.
SELECT kind FROM awa.flow_kind_set_v1(%s, %s, %s, %s, %s, %s, %s::jsonb)

-- name: workers
SELECT instance_id, hostname, pid, queues, concurrency, is_leader, started_at, last_seen_at,
       extract(epoch FROM now() - last_seen_at) AS seen_seconds_ago
FROM awa.runtime_instances ORDER BY started_at

-- name: rings
SELECT ring, slot_count, current_slot, generation, rotated_at FROM awa.ring_state ORDER BY ring

-- name: job_show
-- Through awa.job_v1 (the one-job read every role that reads jobs may call; JIT off).
SELECT id, kind, queue, state, priority, attempt, max_attempts, run_lease, args, run_at,
       created_at, attempted_at, finalized_at, errors, result, progress, metadata, tags, in_dlq,
       dlq_reason
FROM awa.job_v1(%s)

-- name: history_retried_as
-- One column: the job a job of history was retried as (no row: not retried from history).
SELECT retry_job_id FROM awa.history_retries WHERE job_id = %s

-- name: job_callback_wait
-- The callback a waiting job waits for (awa_job show), by column name.
SELECT callback_id, parked_at, timeout_at, resume FROM awa.callback_waits WHERE job_id = %s

-- name: dlq_list
SELECT job_id, queue, kind, attempt, dlq_reason AS reason, dlq_at
FROM awa.dlq_entries
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s) AND (%(kind)s::text IS NULL OR kind = %(kind)s)
ORDER BY dlq_at DESC, job_id DESC
LIMIT %(limit)s

-- name: throughput
SELECT completed FROM awa.throughput_v1(%s)

-- name: outcomes_per_minute
SELECT completed, failed, cancelled, dead_lettered FROM awa.outcomes_per_minute_v1(%s)

-- name: queue_minutes
SELECT minute, recorded, completed, failed, cancelled, dead_lettered, retried, wait_p50,
       wait_p95, run_p50, run_p95, available, retryable, oldest_seconds
FROM awa.queue_minutes_v2(%s, %s)

-- name: read_committed
-- The first statement of a transaction awa_django opens for a function that needs it.
SET TRANSACTION ISOLATION LEVEL READ COMMITTED

-- name: isolation
SELECT current_setting('transaction_isolation')

-- name: queue_dlq
-- Returns whether the queue's DLQ setting changed.
SELECT awa.queue_dlq_v1(%s, %s)

-- name: paused_queues
-- One column: the name of each paused queue.
SELECT queue FROM awa.queue_meta WHERE paused

-- name: queue_dlq_enabled
-- One column: whether the queue's DLQ is on (no row: the queue has no metadata yet; it is on).
SELECT dlq_enabled FROM awa.queue_meta WHERE queue = %s

-- name: history_retry
SELECT job_id, outcome, retry_job_id, kind, queue
FROM awa.history_retry_v1(%s::bigint[], %s, %s, %s, %s, %s, %s, %s, %s, %s)

-- name: job_list
-- Newest first, through awa.job_list_v1, which pushes each filter into every plane of awa.jobs
-- (history: the kind, queue and state indexes of done_entries; a tag alone filters history rows
-- as they are read), with JIT off.
SELECT id, kind, queue, state, priority, attempt, max_attempts, run_at, created_at,
       finalized_at, tags, in_dlq
FROM awa.job_list_v1(%(state)s, %(queue)s, %(kind)s, %(tag)s, %(dlq)s, %(limit)s)

-- name: replica_status
-- Read on the database the admin and awa_status read from. Caught up (everything received is
-- replayed): no lag. Otherwise the age of the last transaction replayed, as the replica's clock
-- sees it: an upper bound (the primary may have committed nothing for a while before).
SELECT pg_is_in_recovery() AS in_recovery,
       CASE
           WHEN NOT pg_is_in_recovery() THEN NULL
           WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0.0
           ELSE greatest(
               extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp()), 0.0)
       END::float8 AS lag_seconds,
       pg_is_in_recovery() AND pg_get_wal_replay_pause_state() <> 'not paused' AS replay_paused,
       pg_last_xact_replay_timestamp() AS last_replayed_at

-- name: descriptors_report
SELECT awa.descriptors_report_v1(%s, %s, %s::jsonb)

-- name: descriptor_status
SELECT what, name, label, description, owner, links, declared_at, last_seen_at, live_workers,
       versions, stale, drift
FROM awa.descriptor_status ORDER BY what DESC, name

-- name: undeclared_kinds
SELECT kind, available FROM awa.undeclared_kinds_v1()

-- name: descriptors_prune
SELECT awa.descriptors_prune_v1(%s)
