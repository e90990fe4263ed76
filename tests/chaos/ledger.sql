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
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- What the producer asked for (NULL: the kind's default): the checker holds the queue to
    -- these, not to what the job row says.
    queue text,
    weight integer,
    serial_key text,
    retry jsonb,
    unique_key text
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
-- run_lease is NULL for django.tasks tasks (their handler does not see it). The start row also
-- copies, from awa's own tables, what the attempt was claimed from: its claim time, the run_at
-- and last error of the ready row it was claimed from (a retry's wait is run_at - error.at),
-- how the previous lease was closed, and the queue, kind, weight and serial key of the row.
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
    finished_at timestamptz,
    claimed_at timestamptz,
    run_at timestamptz,
    queue text,
    kind text,
    last_error jsonb,
    prev_outcome text,
    weight integer,
    serial_key text,
    worker_id uuid
);
CREATE INDEX exec_job_idx ON chaos.exec (job_id);
-- Callbacks a handler parked on, for the driver's resolver thread.
-- mode: how the resolver resolves it (python, http, dup, conflict, race, race_http), or early
-- (the handler resolved it before parking) or never (it times out); neither of those two is the
-- resolver's.
CREATE TABLE chaos.callbacks (
    callback_id uuid PRIMARY KEY,
    job_id bigint NOT NULL,
    run_lease bigint NOT NULL,
    attempt integer NOT NULL,
    resolve_after double precision NOT NULL,
    with_error boolean NOT NULL,
    mode text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    resolved_at timestamptz,
    outcome text
);
-- Every resolution call and what it answered (outcome 'error': it raised, its effect unknown).
-- A result carries {"by": request_id} and an error message ends with the request_id, so the job
-- shows which request (if any) decided the attempt; two deliveries of one HTTP request share it.
CREATE TABLE chaos.callback_calls (
    call_id uuid PRIMARY KEY,
    request_id uuid NOT NULL,
    callback_id uuid NOT NULL,
    via text NOT NULL,
    body text NOT NULL,
    outcome text NOT NULL,
    replayed boolean NOT NULL DEFAULT false,
    called_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- Unique enqueues: the key, the job the call returned, whether it was a duplicate, and a time
-- after the key was taken (clock_timestamp() once the call returned, in its transaction).
CREATE TABLE chaos.unique_enqueues (
    token text PRIMARY KEY,
    unique_key text NOT NULL,
    kind text NOT NULL,
    job_id bigint NOT NULL,
    duplicate boolean NOT NULL,
    enqueued_at timestamptz NOT NULL
);
-- A unique job enqueued in a transaction that was rolled back while another producer waited
-- to enqueue the same key: that one must have taken the key (duplicate false).
CREATE TABLE chaos.unique_rollbacks (
    unique_key text PRIMARY KEY,
    rolled_token text NOT NULL,
    second_token text NOT NULL,
    second_job_id bigint,
    second_duplicate boolean,
    second_error text,
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- Two live jobs with one unique key at the same moment (sampled by the observer).
CREATE TABLE chaos.unique_overlaps (
    unique_key text NOT NULL,
    job_ids bigint[] NOT NULL,
    states text NOT NULL,
    seen_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (unique_key, job_ids)
);
-- Flow limit changes, with the database clock before the change's transaction wrote them and
-- after it committed (certain = false: the commit's outcome is unknown). scope is 'queue:NAME'
-- or 'kind:NAME'; NULL limits are no limit.
CREATE TABLE chaos.limit_changes (
    id bigserial PRIMARY KEY,
    scope text NOT NULL,
    max_running integer,
    rate double precision,
    burst integer,
    began_at timestamptz NOT NULL,
    ended_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    certain boolean NOT NULL,
    note text NOT NULL
);
-- Jobs fired by periodic schedules, as the observer saw them (manual: a trigger, not a fire).
CREATE TABLE chaos.cron_seen (
    job_id bigint PRIMARY KEY,
    name text NOT NULL,
    fire_time timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    manual boolean NOT NULL,
    seen_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- Schedule pauses, resumes and triggers by the operator (times as for limit_changes).
CREATE TABLE chaos.schedule_actions (
    id bigserial PRIMARY KEY,
    name text NOT NULL,
    action text NOT NULL,
    began_at timestamptz NOT NULL,
    ended_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    certain boolean NOT NULL
);
-- The workers' database sessions, sampled by the observer (each sample's time in
-- session_samples): a session last seen at one sample and gone at the next ended in between,
-- and with it whatever permits and serial keys it held.
CREATE TABLE chaos.sessions (
    backend_pid integer NOT NULL,
    backend_start timestamptz NOT NULL,
    application_name text NOT NULL,
    first_seen timestamptz NOT NULL,
    last_seen timestamptz NOT NULL,
    PRIMARY KEY (backend_pid, backend_start)
);
CREATE TABLE chaos.session_samples (
    sampled_at timestamptz PRIMARY KEY
);
-- The maintenance leader's pid, sampled by the observer.
CREATE TABLE chaos.leaders (
    sampled_at timestamptz PRIMARY KEY DEFAULT clock_timestamp(),
    pid integer
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
    finalized_at timestamptz,
    result jsonb,
    PRIMARY KEY (job_id, state, in_dlq, run_lease)
);
-- Every terminal write, recorded exactly by triggers on the tables that hold terminal rows, in
-- the writing transaction (one that rolls back records nothing): a job whose history was pruned
-- between two of the observer's samples is told apart from a job that was lost. A terminal row
-- holds only what changed (the rest is read from its ready row), hence a table of its own.
CREATE TABLE chaos.terminal_written (
    job_id bigint NOT NULL,
    state text NOT NULL,
    in_dlq boolean NOT NULL,
    run_lease bigint NOT NULL,
    written_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, state, in_dlq, run_lease)
);
CREATE FUNCTION chaos.note_done() RETURNS trigger
 LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
BEGIN
    INSERT INTO chaos.terminal_written (job_id, state, in_dlq, run_lease)
    VALUES (NEW.job_id, NEW.state, false, NEW.run_lease) ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;
CREATE FUNCTION chaos.note_dlq() RETURNS trigger
 LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
BEGIN
    INSERT INTO chaos.terminal_written (job_id, state, in_dlq, run_lease)
    VALUES (NEW.job_id, 'failed', true, NEW.run_lease) ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;
CREATE TRIGGER chaos_terminal AFTER INSERT ON awa.done_entries
    FOR EACH ROW EXECUTE FUNCTION chaos.note_done();
CREATE TRIGGER chaos_terminal AFTER INSERT ON awa.dlq_entries
    FOR EACH ROW EXECUTE FUNCTION chaos.note_dlq();
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
INSERT INTO chaos.committed (job_id, token, path, kind, behaviour, queue, weight, serial_key,
                             retry, unique_key)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s)
ON CONFLICT DO NOTHING

-- name: rolled_back_insert
INSERT INTO chaos.rolled_back (token, job_id, path) VALUES (%s, %s, %s)
ON CONFLICT DO NOTHING

-- name: indeterminate_insert
INSERT INTO chaos.indeterminate (token, job_id, path) VALUES (%s, %s, %s)
ON CONFLICT DO NOTHING

-- name: exec_start
INSERT INTO chaos.exec (exec_key, job_id, run_lease, attempt, pid, behaviour, token, claimed_at,
                        run_at, queue, kind, last_error, prev_outcome, weight, serial_key,
                        worker_id)
SELECT v.exec_key, v.job_id, v.run_lease, v.attempt, v.pid, v.behaviour, v.token, c.claimed_at,
       e.run_at, e.queue, e.kind, e.errors -> -1, z.outcome,
       CASE WHEN jsonb_typeof(e.metadata -> 'awa:weight') = 'number'
            THEN (e.metadata ->> 'awa:weight')::integer END,
       e.metadata ->> 'awa:serial', c.worker_id
FROM (VALUES (%s::uuid, %s::bigint, %s::bigint, %s::integer, %s::integer, %s::text, %s::text))
     AS v(exec_key, job_id, run_lease, attempt, pid, behaviour, token)
LEFT JOIN LATERAL (
    SELECT c.claimed_at, c.ready_slot, c.lane_id, c.lane_seq, c.worker_id FROM awa.claims c
    WHERE c.job_id = v.job_id AND c.run_lease = v.run_lease
    ORDER BY c.claimed_at LIMIT 1
) c ON true
LEFT JOIN awa.ready_entries e
  ON e.lane_id = c.lane_id AND e.lane_seq = c.lane_seq AND e.ready_slot = c.ready_slot
LEFT JOIN LATERAL (
    SELECT z.outcome FROM awa.claim_closures z
    WHERE z.job_id = v.job_id AND z.run_lease = v.run_lease - 1
    ORDER BY z.closed_at DESC LIMIT 1
) z ON true
ON CONFLICT DO NOTHING

-- name: exec_finish
UPDATE chaos.exec SET finished_at = clock_timestamp(), action = %s
WHERE exec_key = %s AND finished_at IS NULL

-- name: callback_park
INSERT INTO chaos.callbacks (callback_id, job_id, run_lease, attempt, resolve_after, with_error,
                             mode)
VALUES (%s, %s, %s, %s, %s, %s, %s)
ON CONFLICT DO NOTHING

-- name: callbacks_due
SELECT callback_id, with_error, mode FROM chaos.callbacks
WHERE resolved_at IS NULL AND mode NOT IN ('early', 'never')
  AND created_at + make_interval(secs => resolve_after) <= clock_timestamp()
ORDER BY created_at, callback_id

-- name: callback_call
INSERT INTO chaos.callback_calls (call_id, request_id, callback_id, via, body, outcome, replayed)
VALUES (%s, %s, %s, %s, %s, %s, %s)
ON CONFLICT DO NOTHING

-- name: unique_enqueue_insert
INSERT INTO chaos.unique_enqueues (token, unique_key, kind, job_id, duplicate, enqueued_at)
VALUES (%s, %s, %s, %s, %s, clock_timestamp())
ON CONFLICT DO NOTHING

-- name: unique_rollback_insert
INSERT INTO chaos.unique_rollbacks (unique_key, rolled_token, second_token, second_job_id,
                                    second_duplicate, second_error)
VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT DO NOTHING

-- name: clock
SELECT clock_timestamp()

-- name: limit_change_insert
INSERT INTO chaos.limit_changes (scope, max_running, rate, burst, began_at, certain, note)
VALUES (%s, %s, %s, %s, %s, %s, %s)

-- name: schedule_action_insert
INSERT INTO chaos.schedule_actions (name, action, began_at, certain) VALUES (%s, %s, %s, %s)

-- name: flow_limits_now
SELECT queue, max_running, rate, burst FROM awa.flow_limits ORDER BY queue

-- name: kind_limits_now
SELECT kind, max_running, rate, burst FROM awa.flow_kind_limits ORDER BY kind

-- name: observe_unique
INSERT INTO chaos.unique_overlaps (unique_key, job_ids, states)
SELECT c.kind || ':' || c.unique_key, array_agg(DISTINCT l.id ORDER BY l.id),
       string_agg(l.id || '=' || l.state, ',' ORDER BY l.id)
FROM awa.live_jobs l
JOIN chaos.committed c ON c.job_id = l.id
WHERE c.unique_key IS NOT NULL
GROUP BY c.kind, c.unique_key
HAVING count(DISTINCT l.id) > 1
ON CONFLICT DO NOTHING

-- name: recent_fire
SELECT name, fire_time FROM chaos.cron_seen WHERE NOT manual ORDER BY job_id DESC LIMIT 1

-- name: observe_sessions
WITH sample AS (
    INSERT INTO chaos.session_samples (sampled_at) VALUES (now()) ON CONFLICT DO NOTHING
)
INSERT INTO chaos.sessions (backend_pid, backend_start, application_name, first_seen, last_seen)
SELECT a.pid, a.backend_start, a.application_name, now(), now()
FROM pg_stat_activity a
WHERE a.application_name LIKE 'awa:worker:%%' AND a.datname = current_database()
  AND a.backend_start IS NOT NULL
ON CONFLICT (backend_pid, backend_start) DO UPDATE SET last_seen = EXCLUDED.last_seen

-- name: observe_leader
INSERT INTO chaos.leaders (pid)
SELECT (SELECT pid FROM awa.runtime_instances WHERE is_leader
        ORDER BY last_seen_at DESC LIMIT 1)
ON CONFLICT DO NOTHING

-- name: cron_caught_up
SELECT count(*) FROM awa.cron_schedules
WHERE name = ANY(%s) AND paused_at IS NULL AND fire_after < now() - make_interval(secs => %s)

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

-- name: observe_jobs
-- One read of awa.jobs per sample: terminal facts, jobs shown twice, and fired jobs.
WITH j AS MATERIALIZED (
    SELECT id, state, in_dlq, run_lease, attempt, errors, args -> 'args' ->> 0 AS token,
           finalized_at, result, created_at, metadata ->> 'cron_name' AS cron_name,
           metadata ->> 'cron_fire_time' AS cron_fire_time, metadata ? 'cron_trigger' AS manual
    FROM awa.jobs
), terminal AS (
    INSERT INTO chaos.terminal_seen (job_id, state, in_dlq, run_lease, attempt, errors, token,
                                     finalized_at, result)
    SELECT id, state, in_dlq, run_lease, attempt, errors, token, finalized_at, result
    FROM j WHERE state IN ('completed', 'failed', 'cancelled')
    ON CONFLICT DO NOTHING
), fired AS (
    INSERT INTO chaos.cron_seen (job_id, name, fire_time, created_at, manual)
    SELECT DISTINCT ON (id) id, cron_name, cron_fire_time::timestamptz, created_at, manual
    FROM j WHERE cron_name IS NOT NULL
    ORDER BY id
    ON CONFLICT DO NOTHING
)
INSERT INTO chaos.duplicates (job_id, copies, states)
SELECT id, count(*), string_agg(state || CASE WHEN in_dlq THEN '(dlq)' ELSE '' END, ','
                                ORDER BY state)
FROM j
GROUP BY id
HAVING count(*) > 1
ON CONFLICT DO NOTHING

-- name: ring_rows
-- Rows of attempts held by the claim and lease rings. The claim ring's cursor markers (closed
-- claims of job -lane_id, two rows per lane and live slot: bounded by the lanes, not by the work
-- done) are left out, so that a run over hundreds of queues still sees its rings shrink.
SELECT 'claim', (SELECT count(*) FROM awa.claims WHERE job_id > 0)
                + (SELECT count(*) FROM awa.claim_closures WHERE job_id > 0)
UNION ALL
SELECT 'lease', count(*) FROM awa.leases

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
WITH live AS MATERIALIZED (SELECT id FROM awa.live_jobs),
     tracked AS (SELECT job_id FROM chaos.committed UNION SELECT job_id FROM chaos.cron_seen)
SELECT c.job_id FROM tracked c
WHERE c.job_id IN (SELECT id FROM live)
   OR NOT EXISTS (SELECT 1 FROM chaos.terminal_seen t WHERE t.job_id = c.job_id)
ORDER BY c.job_id
