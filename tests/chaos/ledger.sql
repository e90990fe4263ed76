-- The chaos lane's ledger: what the harness did and what the handlers saw, in schema `chaos` of
-- each run's database. Named statements (`-- name: x`) are loaded by tests/chaos/db.py; values
-- are always parameters. Every write is idempotent (keyed), so a write retried after a lost
-- connection never records one event twice.

-- name: schema
CREATE SCHEMA chaos;
-- Jobs whose enqueue certainly committed (written in the producer's transaction, or after an
-- autocommit enqueue returned).
CREATE TABLE chaos.committed (
    job_id bigint PRIMARY KEY,
    token text NOT NULL UNIQUE,
    path text NOT NULL,
    kind text NOT NULL,
    behaviour text NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- Jobs enqueued in a transaction (or savepoint) that certainly rolled back; job_id is NULL when
-- the enqueue call itself failed.
CREATE TABLE chaos.rolled_back (
    token text PRIMARY KEY,
    job_id bigint,
    path text NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- Jobs whose enqueue may or may not have committed (a connection error at or around COMMIT).
CREATE TABLE chaos.indeterminate (
    token text PRIMARY KEY,
    job_id bigint,
    path text NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- One row per handler execution, written by the handler itself in its own statement.
-- run_lease is NULL for django.tasks tasks (their handler does not see it).
CREATE TABLE chaos.exec (
    exec_key uuid PRIMARY KEY,
    job_id bigint NOT NULL,
    run_lease bigint,
    attempt integer NOT NULL,
    pid integer NOT NULL,
    behaviour text NOT NULL,
    token text,
    action text,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz
);
CREATE INDEX exec_job_idx ON chaos.exec (job_id);
-- Callbacks a handler parked on, for the driver's resolver thread.
CREATE TABLE chaos.callbacks (
    callback_id uuid PRIMARY KEY,
    job_id bigint NOT NULL,
    run_lease bigint NOT NULL,
    resolve_after double precision NOT NULL,
    with_error boolean NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    resolved_at timestamptz,
    outcome text
);
-- Worker processes that died (killed by a fault, or exited on their own).
CREATE TABLE chaos.worker_deaths (
    pid integer PRIMARY KEY,
    died_at timestamptz NOT NULL,
    cause text NOT NULL
);
-- DLQ retries done by the operator thread (certain = false: the call's commit was unknown).
CREATE TABLE chaos.dlq_retried (
    id bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    certain boolean NOT NULL,
    retried_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- Every distinct terminal fact the observer saw (terminal history ages out after
-- HISTORY_RETENTION, so it is sampled while the run goes on).
CREATE TABLE chaos.terminal_seen (
    job_id bigint NOT NULL,
    state text NOT NULL,
    in_dlq boolean NOT NULL,
    run_lease bigint NOT NULL,
    attempt integer NOT NULL,
    errors jsonb,
    token text,
    seen_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, state, in_dlq, run_lease)
);
-- Jobs the observer saw more than once in awa.jobs at the same moment.
CREATE TABLE chaos.duplicates (
    job_id bigint NOT NULL,
    copies integer NOT NULL,
    states text NOT NULL,
    seen_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, states)
);
-- Faults injected (pid is the worker targeted, when one was).
CREATE TABLE chaos.faults (
    id bigserial PRIMARY KEY,
    kind text NOT NULL,
    pid integer,
    detail text NOT NULL,
    started_at timestamptz NOT NULL,
    ended_at timestamptz NOT NULL
);

-- name: committed_insert
INSERT INTO chaos.committed (job_id, token, path, kind, behaviour)
VALUES (%s, %s, %s, %s, %s)
ON CONFLICT DO NOTHING

-- name: rolled_back_insert
INSERT INTO chaos.rolled_back (token, job_id, path) VALUES (%s, %s, %s)
ON CONFLICT DO NOTHING

-- name: indeterminate_insert
INSERT INTO chaos.indeterminate (token, job_id, path) VALUES (%s, %s, %s)
ON CONFLICT DO NOTHING

-- name: exec_start
INSERT INTO chaos.exec (exec_key, job_id, run_lease, attempt, pid, behaviour, token)
VALUES (%s, %s, %s, %s, %s, %s, %s)
ON CONFLICT DO NOTHING

-- name: exec_finish
UPDATE chaos.exec SET finished_at = clock_timestamp(), action = %s
WHERE exec_key = %s AND finished_at IS NULL

-- name: callback_park
INSERT INTO chaos.callbacks (callback_id, job_id, run_lease, resolve_after, with_error)
VALUES (%s, %s, %s, %s, %s)
ON CONFLICT DO NOTHING

-- name: callbacks_due
SELECT callback_id, with_error FROM chaos.callbacks
WHERE resolved_at IS NULL
  AND created_at + make_interval(secs => resolve_after) <= clock_timestamp()
ORDER BY created_at, callback_id

-- name: callback_resolved
UPDATE chaos.callbacks SET resolved_at = clock_timestamp(), outcome = %s
WHERE callback_id = %s

-- name: worker_death
INSERT INTO chaos.worker_deaths (pid, died_at, cause) VALUES (%s, %s, %s)
ON CONFLICT (pid) DO UPDATE SET died_at = LEAST(chaos.worker_deaths.died_at, EXCLUDED.died_at)

-- name: fault_insert
INSERT INTO chaos.faults (kind, pid, detail, started_at, ended_at) VALUES (%s, %s, %s, %s, %s)

-- name: dlq_retried_insert
INSERT INTO chaos.dlq_retried (job_id, certain) VALUES (%s, %s)

-- name: dlq_candidates
SELECT job_id FROM awa.dlq_entries ORDER BY job_id LIMIT 200

-- name: recent_jobs
SELECT job_id FROM chaos.committed ORDER BY job_id DESC LIMIT 200

-- name: observe_terminal
INSERT INTO chaos.terminal_seen (job_id, state, in_dlq, run_lease, attempt, errors, token)
SELECT j.id, j.state, j.in_dlq, j.run_lease, j.attempt, j.errors, j.args -> 'args' ->> 0
FROM awa.jobs j
WHERE j.state IN ('completed', 'failed', 'cancelled')
ON CONFLICT DO NOTHING

-- name: observe_duplicates
INSERT INTO chaos.duplicates (job_id, copies, states)
SELECT j.id, count(*), string_agg(j.state || CASE WHEN j.in_dlq THEN '(dlq)' ELSE '' END,
                                  ',' ORDER BY j.state)
FROM awa.jobs j
GROUP BY j.id
HAVING count(*) > 1
ON CONFLICT DO NOTHING

-- name: ring_rows
SELECT ring, sum(rows)::bigint FROM awa.ring_slots_v1() GROUP BY ring

-- name: lane_count
SELECT count(*) FROM awa.queue_lanes

-- name: leader_pid
SELECT pid FROM awa.runtime_instances WHERE is_leader ORDER BY last_seen_at DESC LIMIT 1

-- name: awa_backends
SELECT a.pid, a.application_name, r.pid
FROM pg_stat_activity a
LEFT JOIN awa.runtime_instances r ON a.application_name = 'awa:worker:' || r.instance_id::text
WHERE a.application_name LIKE 'awa:%%' AND a.datname = current_database()
ORDER BY a.pid

-- name: terminate_backend
SELECT pg_terminate_backend(%s)

-- name: fresh_runtimes
SELECT pid FROM awa.runtime_instances
WHERE last_seen_at > now() - make_interval(secs => %s)

-- name: lock_begin
BEGIN

-- name: lock_child
LOCK TABLE {table} IN ACCESS SHARE MODE

-- name: pin_begin
BEGIN ISOLATION LEVEL REPEATABLE READ

-- name: pin_xid
SELECT txid_current()

-- name: unfinished
SELECT c.job_id FROM chaos.committed c
WHERE EXISTS (SELECT 1 FROM awa.live_jobs l WHERE l.id = c.job_id)
   OR NOT EXISTS (SELECT 1 FROM chaos.terminal_seen t WHERE t.job_id = c.job_id)
ORDER BY c.job_id
