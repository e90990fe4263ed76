-- Statements used by the worker and maintenance (awa_django.db.storage), on their own
-- psycopg connections in autocommit mode: each call is one short transaction.

-- name: worker_session
-- Once per worker connection: the engine's functions need READ COMMITTED; JIT compilation
-- costs each statement over many partitions 100-300 ms (on servers built with it) and saves
-- nothing on statements that read a few rows; lanes the engine makes for a new queue (a
-- promotion, a periodic fire, a retry) get AWA["ENQUEUE_SHARDS"] shards. It also reads which
-- database this is (the cluster's system identifier where this role may read it, the database's
-- and the awa schema's oids): a reconnect that lands on a different one ends the process.
SELECT set_config('default_transaction_isolation', 'read committed', false),
       set_config('jit', 'off', false),
       set_config('awa.enqueue_shards', %s, false),
       CASE WHEN has_function_privilege('pg_catalog.pg_control_system()', 'EXECUTE')
            THEN (SELECT system_identifier FROM pg_catalog.pg_control_system()) END,
       (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database()),
       to_regnamespace('awa')::oid

-- name: claim
-- Each column is named after a field of ClaimedJob, which is built by column name.
SELECT job_id, run_lease, attempt, max_attempts, claim_slot, kind, args::text AS args_json,
       queue, priority, deadline_at, timeout_secs, progress, metadata, tags, errors, weight,
       permits, serial_lock, wait_secs
-- The lock-key arrays come as text ('{1,2}'): psycopg adapts a list of 1,000 ints in ~0.6 ms.
FROM awa.claim_v3(%s, %s, %s, %s, %s, %s, %s::integer[], %s::integer[], %s::integer[],
                  %s::integer[])

-- name: attempt_open
-- Whether an attempt is still open (a claim without closure): a cancel note is acted on only
-- when it is not.
SELECT awa._attempt_open_v1(%s, %s)

-- name: ping
-- Whether a connection lives (the claim connection, while it holds permits or serial keys).
SELECT 1

-- name: flow_release
SELECT awa.flow_release_v1(%s::integer[])

-- name: flow_retake
SELECT awa.flow_retake_v1(%s::integer[])

-- name: flow_reset
SELECT awa.flow_reset_v1(%s::integer[])

-- name: flow_reap
SELECT pid, instance, action FROM awa.flow_reap_v1(%s)

-- name: serial_release
SELECT awa.serial_release_v1(%s::integer[])

-- name: serial_retake
SELECT awa.serial_retake_v1(%s::integer[])

-- name: serial_reset
SELECT awa.serial_reset_v1(%s::integer[], %s::integer[])

-- name: serial_sweep
SELECT job_id FROM awa.serial_sweep_v1(%s) AS s(job_id)

-- name: flow_sync
SELECT awa.flow_sync_v1(%s::jsonb)

-- name: flow_kind_sync
SELECT awa.flow_kind_sync_v1(%s::jsonb)

-- name: finalize
SELECT job_id, run_lease FROM awa.finalize_v2(%s::jsonb)

-- name: finalize_waits
-- A batch that parks attempts (WaitForCallback): finalize_v2 plus each wait's mode and timeout.
SELECT job_id, run_lease FROM awa.finalize_v3(%s::jsonb)

-- name: heartbeat
SELECT job_id, run_lease FROM awa.heartbeat_v1(%s::jsonb)

-- name: promote
SELECT awa.promote_v1(%s)

-- name: queue_depth
SELECT queue, available FROM awa.queue_depth_v1(%s)

-- name: queue_counts
SELECT queue, available, running, waiting_external, scheduled, retryable, completed, failed,
       cancelled, dlq, paused
FROM awa.queue_counts_v1()

-- name: runtime_upsert
SELECT awa.runtime_upsert_v1(%s, %s, %s, %s::jsonb, %s, %s)

-- name: runtime_remove
SELECT awa.runtime_remove_v1(%s)

-- name: queues_ready
-- Which of these idle queues have work (the worker's sweep, awa_django/worker/sweep.py):
-- a row (queue, ready, stamp, upto) per queue read, as many as fit in max_lanes lanes.
SELECT queue, ready, stamp, upto
FROM awa.queues_ready_v2(%(queues)s::text[], %(stamps)s::bigint[], %(caps)s::integer[],
                         %(max_lanes)s, %(after_lane)s)

-- name: sweep_session
-- The sweep's connection: a statement that would wait longer than this for a lock fails (the
-- queues it asked about are swept again on the next pass).
SELECT set_config('lock_timeout', %s, false)

-- name: advisory_unlock_all
-- Let go of every session advisory lock of this connection (the sweep's, after a failure).
SELECT pg_advisory_unlock_all()

-- name: queues_idle
SELECT awa.queues_idle_v2(%s::text[])

-- name: listen_jobs
LISTEN awa_jobs

-- name: listen_cancel
LISTEN awa_cancel

-- name: hand_off
-- A family leader hands a wake-up on to the rest of its family (awa_django/worker/family.py).
SELECT pg_notify('awa_jobs', %s)

-- name: leader_allowed
-- Whether this session's role may run the maintenance functions (manage.py awa_roles grants
-- them to the maintenance role, awa.promote_v1 among them): a role that may not never stands.
SELECT has_function_privilege('awa.promote_v1(integer)', 'EXECUTE')

-- name: leader_try
-- Session-level: held while this connection lives; Postgres frees it if the leader dies.
SELECT pg_try_advisory_lock(4708303813012965710)  -- 0x4157415f4d41494e, "AWA_MAIN"

-- name: leader_takeover
-- A frozen leader whose connection lives on is ended (see awa.leader_takeover_v1).
SELECT pid, instance, seen_ago, action FROM awa.leader_takeover_v1(%s)

-- name: leader_session
-- Once per leader connection: no maintenance statement waits on a lock or runs for ever.
SET lock_timeout = '5s'; SET statement_timeout = '60s'

-- name: leader_grace
-- How long a leader elected now holds back after a database restart (see awa.leader_grace_v1).
SELECT awa.leader_grace_v1(%s)

-- name: leader_mark
SELECT awa.leader_mark_v1(%s)

-- name: rescue
SELECT job_id, run_lease, reason FROM awa.rescue_v1(%s, %s, %s)

-- name: rotate
-- Rotates only once the current slot is the given seconds old, on the database clock.
SELECT awa.rotate_v3(%s, %s)

-- name: prune
SELECT awa.prune_v1(%s, %s)

-- name: dlq_expire
SELECT awa.dlq_expire_v1(%s, %s)

-- name: workflows_prune
SELECT awa.workflows_prune_v1(%s, %s)

-- name: cleanup
SELECT awa.cleanup_v1(%s)

-- name: queue_minutes_record
SELECT awa.queue_minutes_record_v1()

-- name: done_counts_fold
SELECT awa.done_counts_fold_v1()

-- name: unique_sweep
SELECT deleted, next_taken, next_key FROM awa.unique_sweep_v1(%s, %s, %s)

-- name: connection_budget
-- The connections an ordinary role may open (max_connections less the slots reserved for
-- superusers and, from PostgreSQL 16, for roles with pg_use_reserved_connections), and how many
-- client connections are open, those named by the parameter mine (a worker's own) left out.
SELECT current_setting('max_connections')::integer
       - current_setting('superuser_reserved_connections')::integer
       - COALESCE(NULLIF(current_setting('reserved_connections', true), ''), '0')::integer,
       (SELECT count(*) FROM pg_stat_activity
        WHERE backend_type = 'client backend'
          AND application_name IS DISTINCT FROM %(mine)s)

-- name: jit_in_use
-- Whether this session would JIT-compile expensive statements (awa.W003).
SELECT pg_jit_available() AND current_setting('jit')::boolean

-- name: callback_register
SELECT awa.callback_register_v1(%s, %s, %s)

-- name: queues_known
SELECT DISTINCT queue FROM awa.queue_lanes ORDER BY queue

-- name: jobs_brief
-- Kind, queue, attempt and fate of rescued jobs, for their log fields and metrics: a rescue
-- sends a job to retryable (deferred), failed (history) or the DLQ; each plane is read by job id
-- index.
SELECT job_id, kind, queue, attempt, 'retried' AS fate
FROM awa.deferred_jobs WHERE job_id = ANY(%(ids)s::bigint[])
UNION ALL
SELECT job_id, kind, queue, attempt, 'dead_lettered'
FROM awa.dlq_entries WHERE job_id = ANY(%(ids)s::bigint[])
UNION ALL
SELECT id, kind, queue, attempt, CASE WHEN state = 'failed' THEN 'failed' END
FROM awa.terminal_jobs WHERE id = ANY(%(ids)s::bigint[])

-- name: failure_fates
-- Where a finalize batch's retry and fail outcomes went (the database decides: max_attempts, a
-- retry policy's max_age, the queue's DLQ policy as of the write), read right after the batch:
-- job id, attempt, fate (dead_lettered, failed, or retryable) and, for a retry, the seconds
-- until it runs again. A retry due at once is not deferred and has no row. Read by job id
-- index.
SELECT job_id, attempt, 'dead_lettered', NULL::double precision
FROM awa.dlq_entries WHERE job_id = ANY(%(ids)s::bigint[])
UNION ALL
SELECT id, attempt, 'failed', NULL FROM awa.terminal_jobs
WHERE id = ANY(%(ids)s::bigint[]) AND state = 'failed'
UNION ALL
SELECT job_id, attempt, 'retryable', extract(epoch FROM run_at - clock_timestamp())::float8
FROM awa.deferred_jobs WHERE job_id = ANY(%(ids)s::bigint[]) AND state = 'retryable'
