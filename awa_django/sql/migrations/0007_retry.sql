-- awa_django migration 0007: per-job retry policies (issue 15).
--
-- A job may carry its own retry policy in its metadata, under the reserved key "awa:retry"
-- (docs/jobs.md, "Retry policies"):
--   {"backoff": "exponential" | "linear" | "constant",   default "exponential"
--    "base": seconds, 0..86400,                           default RETRY_BACKOFF_BASE
--    "cap": seconds, 0..86400,                            default 86400
--    "jitter": fraction, 0..1,                            default 0.25
--    "max_age": seconds, above 0, at most 100 years,      default none
--    "retry_on": [exception class names],                 default none: every exception retries
--    "fail_on": [exception class names]}                  default none
-- The metadata travels with the job through every plane (ready, deferred, DLQ), so every retry
-- path follows it: the worker's (a handler error), the callback's (an error resolution, parked
-- or early) and rescue's (a dead worker, a deadline, a callback timeout). All of them reach
-- awa._finalize_pass_v1, which now computes every retry's wait with awa._backoff_v2 from the
-- job's stored policy; rescue no longer precomputes a delay, and awa._backoff_v1 is now
-- awa._backoff_v2 without a policy (one backoff function). A job without a policy waits what it
-- waited before: base × 2^attempt plus up to 25 % jitter, at most a day.
--
-- retry_on and fail_on are evaluated by the worker (awa_django/retry.py), against the names of
-- the exception's classes (module.qualname, its whole MRO): nothing is imported from them.
--
-- Producers' writes (run_lease 0: enqueue, a scheduled job's promotion) are checked by a CHECK
-- constraint on ready_entries and deferred_jobs, which raises SQLSTATE 22023 with the policy's
-- problem ("metadata: awa:retry: base: ..."), so raw-SQL producers and COPY are held to the
-- rules Python applies. The constraints are NOT VALID (existing rows are not scanned);
-- scheduled, retryable and dead-lettered rows written before this migration whose "awa:retry"
-- is not a valid policy have it moved to "awa:retry:refused", so that their promotion or DLQ
-- retry is never refused.
--
-- _finalize_pass_v1, rescue_v1 and _backoff_v1 are redefined in place (same signatures and
-- results).

-- Bounds -----------------------------------------------------------------------------------------

-- The longest backoff base and cap: a day, in seconds (the cap every backoff always had).
CREATE FUNCTION awa._max_backoff_v1() RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 86400::double precision $$;

-- The most exception class names in one of retry_on / fail_on, and the longest name.
CREATE FUNCTION awa._max_retry_names_v1() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 32 $$;

-- Whether a policy's value is absent (or JSON null) or a number from p_low (above it when
-- p_above) to p_high, compared as numeric: a JSON number may be far beyond double precision.
CREATE FUNCTION awa._retry_number_ok_v1(p_value jsonb, p_low numeric, p_high numeric,
                                        p_above boolean DEFAULT false)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE COALESCE(jsonb_typeof(p_value), 'null')
        WHEN 'null' THEN true
        WHEN 'number' THEN p_value::numeric BETWEEN p_low AND p_high
                           AND NOT (p_above AND p_value::numeric = p_low)
        ELSE false
    END
$$;

-- Whether a policy's list of exception class names is absent (or JSON null) or an array of at
-- most 32 strings of 1 to 255 characters.
CREATE FUNCTION awa._retry_names_ok_v1(p_value jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE COALESCE(jsonb_typeof(p_value), 'null')
        WHEN 'null' THEN true
        WHEN 'array' THEN jsonb_array_length(p_value) <= awa._max_retry_names_v1()
            AND NOT EXISTS (
                SELECT 1 FROM jsonb_array_elements(p_value) e
                WHERE jsonb_typeof(e.value) <> 'string'
                   OR length(e.value #>> '{}') NOT BETWEEN 1 AND 255)
        ELSE false
    END
$$;

-- What is wrong with a retry policy (NULL when nothing, or when there is none): the rules of
-- awa_django.retry.RetryPolicy, with its messages. JSON null is the same as leaving a key out.
CREATE FUNCTION awa._retry_policy_error_v1(p_policy jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN p_policy IS NULL OR jsonb_typeof(p_policy) = 'null' THEN NULL
        WHEN jsonb_typeof(p_policy) <> 'object' THEN 'must be a JSON object'
        ELSE COALESCE(
            (SELECT format('unknown key %s (known: backoff, base, cap, jitter, max_age, '
                           'retry_on, fail_on)', to_jsonb(k))
             FROM jsonb_object_keys(p_policy) k
             WHERE k NOT IN ('backoff', 'base', 'cap', 'jitter', 'max_age', 'retry_on', 'fail_on')
             ORDER BY k LIMIT 1),
            CASE
                WHEN COALESCE(p_policy ->> 'backoff', 'exponential')
                         NOT IN ('exponential', 'linear', 'constant')
                     OR jsonb_typeof(p_policy -> 'backoff') NOT IN ('string', 'null') THEN
                    format('backoff: %s is not "exponential", "linear" or "constant"',
                           awa._json_show_v1(p_policy -> 'backoff'))
                WHEN NOT awa._retry_number_ok_v1(p_policy -> 'base', 0, 86400) THEN
                    format('base: %s is not a number of seconds from 0 to 86400 (24 hours)',
                           awa._json_show_v1(p_policy -> 'base'))
                WHEN NOT awa._retry_number_ok_v1(p_policy -> 'cap', 0, 86400) THEN
                    format('cap: %s is not a number of seconds from 0 to 86400 (24 hours)',
                           awa._json_show_v1(p_policy -> 'cap'))
                WHEN NOT awa._retry_number_ok_v1(p_policy -> 'jitter', 0, 1) THEN
                    format('jitter: %s is not a number from 0 to 1',
                           awa._json_show_v1(p_policy -> 'jitter'))
                WHEN NOT awa._retry_number_ok_v1(p_policy -> 'max_age', 0,
                                                 awa._max_seconds_v1()::numeric, true) THEN
                    format('max_age: %s is not a number of seconds above 0, at most 3155760000 '
                           '(100 years)', awa._json_show_v1(p_policy -> 'max_age'))
                WHEN NOT awa._retry_names_ok_v1(p_policy -> 'retry_on') THEN
                    'retry_on: must be a list of at most 32 exception class names (strings of '
                    '1 to 255 characters)'
                WHEN NOT awa._retry_names_ok_v1(p_policy -> 'fail_on') THEN
                    'fail_on: must be a list of at most 32 exception class names (strings of '
                    '1 to 255 characters)'
            END)
    END
$$;

-- One number of a stored policy as double precision, held to p_low..p_high; NULL when the
-- policy does not give it as a number. Never raises, whatever the row holds (rows written
-- before migration 0007 were not checked): a retry path must not fail on a policy.
CREATE FUNCTION awa._retry_number_v1(p_policy jsonb, p_key text, p_low double precision,
                                     p_high double precision)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    -- Rounded to 1e-12 first: a number below double precision's range (1e-400, written by raw
    -- SQL) or of thousands of digits becomes one that converts, so this never raises.
    SELECT CASE WHEN jsonb_typeof(p_policy -> p_key) = 'number'
                THEN LEAST(GREATEST(round((p_policy -> p_key)::numeric, 12), p_low::numeric),
                           p_high::numeric)::double precision
           END
$$;

-- True, or SQLSTATE 22023 naming what is wrong with the retry policy in p_metadata (the CHECK
-- constraints below).
CREATE FUNCTION awa._check_retry_policy_v1(p_metadata jsonb) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    v_error text := awa._retry_policy_error_v1(p_metadata -> 'awa:retry');
BEGIN
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION 'metadata: awa:retry: %', v_error USING ERRCODE = '22023';
    END IF;
    RETURN true;
END
$$;

-- Backoff ----------------------------------------------------------------------------------------

-- Seconds before the next attempt of a job that failed its attempt number p_attempt, by the
-- job's retry policy p_policy (metadata "awa:retry"; NULL: none): base × 2^attempt
-- (exponential), base × attempt (linear) or base (constant), plus up to jitter × that, at most
-- cap. Without a policy, or for what the policy leaves out: base p_base (RETRY_BACKOFF_BASE;
-- NULL means 1), jitter 0.25, cap a day. The only backoff function: every retry path (a
-- handler's error, a callback's error, rescue) reaches it through awa._finalize_pass_v1.
-- Never raises, whatever the policy holds.
CREATE FUNCTION awa._backoff_v2(p_attempt integer, p_base double precision, p_policy jsonb)
RETURNS double precision
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT LEAST(
        COALESCE(awa._retry_number_v1(p_policy, 'base', 0, awa._max_backoff_v1()), p_base, 1.0)
        * CASE p_policy ->> 'backoff'
              WHEN 'constant' THEN 1
              WHEN 'linear' THEN GREATEST(p_attempt, 0)
              ELSE power(2, LEAST(GREATEST(p_attempt, 0), 40))
          END
        * (1 + random() * COALESCE(awa._retry_number_v1(p_policy, 'jitter', 0, 1), 0.25)),
        COALESCE(awa._retry_number_v1(p_policy, 'cap', 0, awa._max_backoff_v1()),
                 awa._max_backoff_v1()))::double precision
$$;

-- Seconds before the next attempt without a policy (see awa._backoff_v2). Kept for callers of
-- migration 0002; nothing in awa_django calls it any more.
CREATE OR REPLACE FUNCTION awa._backoff_v1(p_attempt integer, p_base double precision DEFAULT 1.0)
RETURNS double precision
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT awa._backoff_v2(p_attempt, p_base, NULL)
$$;

-- Producers' writes are held to the policy rules ---------------------------------------------------

-- Rows written before this migration keep working: an invalid "awa:retry" of a row that may be
-- written again (promotion, DLQ retry) is set aside under "awa:retry:refused".
UPDATE awa.deferred_jobs
SET metadata = (metadata - 'awa:retry')
               || jsonb_build_object('awa:retry:refused', metadata -> 'awa:retry')
WHERE metadata ? 'awa:retry' AND awa._retry_policy_error_v1(metadata -> 'awa:retry') IS NOT NULL;
UPDATE awa.dlq_entries
SET metadata = (metadata - 'awa:retry')
               || jsonb_build_object('awa:retry:refused', metadata -> 'awa:retry')
WHERE metadata ? 'awa:retry' AND awa._retry_policy_error_v1(metadata -> 'awa:retry') IS NOT NULL;

-- Only first writes (run_lease 0: a producer's, a scheduled job's promotion) are checked: a
-- retry of a row written before this migration is never refused (its policy is read by
-- awa._backoff_v2, which never raises).
ALTER TABLE awa.ready_entries ADD CONSTRAINT ready_entries_retry_policy_check
    CHECK (run_lease > 0 OR metadata IS NULL OR NOT metadata ? 'awa:retry'
           OR awa._check_retry_policy_v1(metadata)) NOT VALID;
ALTER TABLE awa.deferred_jobs ADD CONSTRAINT deferred_jobs_retry_policy_check
    CHECK (run_lease > 0 OR metadata IS NULL OR NOT metadata ? 'awa:retry'
           OR awa._check_retry_policy_v1(metadata)) NOT VALID;

-- Finalize ---------------------------------------------------------------------------------------

-- Every retry's wait now comes from awa._backoff_v2 and the job's policy (explicit delays of
-- RetryAfter and Snooze aside); a retry that would run after created_at + max_age goes to the
-- DLQ (or failed) like exhausted attempts, with the reason "max_age exceeded: ...".
CREATE OR REPLACE FUNCTION awa._finalize_pass_v1(p_items jsonb, p_hint boolean)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_stale jsonb;
BEGIN
    WITH items AS (
        SELECT x.*, e.value AS raw
        FROM jsonb_array_elements(p_items) AS e(value),
             jsonb_to_record(e.value) AS x(id bigint, lease bigint, slot integer, outcome text,
                 result jsonb, error jsonb, delay double precision, progress jsonb, st boolean,
                 closed_as text, backoff_base double precision)
    ), cl AS MATERIALIZED (
        -- A lateral lookup (not a join) keeps the row estimate at the item count, so the
        -- planner hash-joins the CTEs below instead of nesting loops over them.
        SELECT i.id, i.lease, i.outcome, i.result, i.error, i.delay, i.backoff_base, i.progress,
               COALESCE(i.st, false) AS st, COALESCE(i.closed_as, i.outcome) AS closed_as,
               c.claim_slot, c.ready_slot, c.ready_generation,
               c.lane_id, c.lane_seq, c.attempt, c.claimed_at, c.kind AS claim_kind
        FROM items i
        CROSS JOIN LATERAL (
            SELECT c.* FROM awa.claims c
            WHERE c.job_id = i.id AND c.run_lease = i.lease
              AND (c.claim_slot = i.slot OR NOT p_hint)
              AND (p_hint OR NOT EXISTS (
                  SELECT 1 FROM awa.claim_closures z
                  WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                    AND z.claim_slot = c.claim_slot))
            LIMIT 1) c
    ), closed AS (
        INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome)
        SELECT claim_slot, id, lease, closed_as FROM cl
        ON CONFLICT DO NOTHING
        RETURNING claim_slot, job_id, run_lease
    ), won AS MATERIALIZED (
        SELECT cl.* FROM cl
        JOIN closed k ON k.job_id = cl.id AND k.run_lease = cl.lease AND k.claim_slot = cl.claim_slot
    ), completed AS (
        INSERT INTO awa.done_entries (
            ready_slot, ready_generation, job_id, run_lease, lane_id, lane_seq, state, attempt,
            attempted_at, result, queue, kind)
        SELECT w.ready_slot, w.ready_generation, w.id, w.lease, w.lane_id, w.lane_seq, 'completed',
               w.attempt, w.claimed_at, w.result, l.queue,
               -- A claim without a kind (written by raw SQL): read it from the ready row.
               COALESCE(w.claim_kind, (SELECT r.kind FROM awa.ready_entries r
                                 WHERE r.lane_id = w.lane_id AND r.lane_seq = w.lane_seq
                                   AND r.ready_slot = w.ready_slot))
        FROM won w JOIN awa.queue_lanes l ON l.lane_id = w.lane_id
        WHERE w.outcome = 'completed'
    ), other AS MATERIALIZED (
        SELECT w.*, r.queue, r.priority, r.kind, r.args, r.max_attempts, r.run_at, r.created_at,
               r.deadline_secs, r.metadata, r.tags,
               CASE WHEN w.outcome = 'snooze' THEN r.errors
                    ELSE COALESCE(r.errors, '[]'::jsonb) || jsonb_build_array(
                        COALESCE(w.error, jsonb_build_object('message', w.outcome))
                        || jsonb_build_object('attempt', w.attempt, 'at', now()))
               END AS new_errors,
               COALESCE(w.progress, s.progress, r.progress) AS new_progress, b.wait,
               CASE
                   WHEN w.outcome = 'snooze' THEN 'scheduled'
                   WHEN w.outcome = 'cancel' THEN 'cancelled'
                   WHEN w.outcome = 'retry' AND w.attempt < r.max_attempts AND NOT b.too_old
                       THEN 'retryable'
                   WHEN COALESCE(m.dlq_enabled, true) THEN 'dlq'
                   ELSE 'failed'
               END AS dest
        FROM won w
        JOIN awa.ready_entries r
          ON r.lane_id = w.lane_id AND r.lane_seq = w.lane_seq AND r.ready_slot = w.ready_slot
        LEFT JOIN awa.queue_meta m ON m.queue = r.queue
        LEFT JOIN awa.attempt_state s ON w.st AND s.job_id = w.id AND s.run_lease = w.lease
        -- The wait before the next run: the explicit delay (RetryAfter, Snooze), else the
        -- backoff of the job's own retry policy (metadata "awa:retry"). A retry that would run
        -- after created_at + the policy's max_age is given up like exhausted attempts.
        CROSS JOIN LATERAL (
            SELECT x.wait,
                   COALESCE(w.outcome = 'retry'
                            AND now() + make_interval(secs => x.wait) > r.created_at
                                + make_interval(secs => awa._retry_number_v1(
                                      r.metadata -> 'awa:retry', 'max_age', 0.001,
                                      awa._max_seconds_v1())),
                            false) AS too_old
            FROM (SELECT CASE WHEN w.outcome = 'retry'
                              THEN COALESCE(w.delay, awa._backoff_v2(
                                  w.attempt, w.backoff_base, r.metadata -> 'awa:retry'))
                              ELSE COALESCE(w.delay, 0) END AS wait) x) b
        WHERE w.outcome <> 'completed'
    ), terminal AS (
        INSERT INTO awa.done_entries (
            ready_slot, ready_generation, job_id, run_lease, lane_id, lane_seq, state, attempt,
            attempted_at, errors, progress, queue, kind)
        SELECT o.ready_slot, o.ready_generation, o.id, o.lease, o.lane_id, o.lane_seq, o.dest,
               o.attempt, o.claimed_at, o.new_errors, o.new_progress, o.queue, o.kind
        FROM other o WHERE o.dest IN ('cancelled', 'failed')
    ), deferred AS (
        INSERT INTO awa.deferred_jobs (
            job_id, state, queue, priority, kind, args, attempt, max_attempts, run_lease, run_at,
            created_at, attempted_at, deadline_secs, metadata, tags, errors, progress)
        SELECT o.id, o.dest, o.queue, o.priority, o.kind, o.args,
               CASE WHEN o.dest = 'scheduled' THEN o.attempt - 1 ELSE o.attempt END,
               o.max_attempts, o.lease,
               now() + make_interval(secs => o.wait),
               o.created_at, o.claimed_at, o.deadline_secs, o.metadata, o.tags, o.new_errors,
               o.new_progress
        FROM other o WHERE o.dest IN ('scheduled', 'retryable')
    ), dead AS (
        INSERT INTO awa.dlq_entries (
            job_id, queue, priority, kind, args, attempt, max_attempts, run_lease,
            original_run_lease, run_at, created_at, attempted_at, deadline_secs, metadata, tags,
            errors, progress, dlq_reason)
        SELECT o.id, o.queue, o.priority, o.kind, o.args, o.attempt, o.max_attempts, o.lease,
               o.lease, o.run_at, o.created_at, o.claimed_at, o.deadline_secs, o.metadata, o.tags,
               o.new_errors, o.new_progress,
               CASE WHEN o.outcome <> 'retry' THEN 'terminal error: '
                    WHEN o.attempt < o.max_attempts THEN 'max_age exceeded: '
                    ELSE 'max_attempts exhausted: ' END
               || COALESCE(o.error ->> 'message', o.outcome)
        FROM other o WHERE o.dest = 'dlq'
    ), cleared AS (
        DELETE FROM awa.attempt_state s
        USING won w
        WHERE w.st AND s.job_id = w.id AND s.run_lease = w.lease
    )
    SELECT jsonb_agg(i.raw) INTO v_stale
    FROM items i
    WHERE NOT EXISTS (SELECT 1 FROM closed k WHERE k.job_id = i.id AND k.run_lease = i.lease);
    RETURN v_stale;
END
$$;

-- Rescue -----------------------------------------------------------------------------------------

-- Close up to p_limit open attempts whose heartbeat (or, for attempts that never heartbeated,
-- claim time) is older than p_staleness seconds, or whose hard deadline has passed, and route
-- each through the normal retry / fail / DLQ path (the backoff of the job's retry policy, by
-- default p_backoff_base × 2^attempt plus up to 25 % jitter) with the error "heartbeat stale: worker
-- presumed dead" or "hard deadline exceeded". Attempts waiting for a callback are rescued only
-- once their callback timeout passes ("callback timed out"). The old worker is told over NOTIFY
-- awa_cancel; its late finalization then loses. Returns the attempts rescued.
--
-- READ COMMITTED is required (it closes attempts with fresh snapshots).
CREATE OR REPLACE FUNCTION awa.rescue_v1(p_staleness double precision, p_limit integer DEFAULT 500,
                                         p_backoff_base double precision DEFAULT 1.0)
RETURNS TABLE (job_id bigint, run_lease bigint, reason text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_cutoff timestamptz := now() - make_interval(secs => LEAST(p_staleness, awa._max_seconds_v1()));
    v_items jsonb;
    v_stale jsonb;
BEGIN
    PERFORM awa._require_read_committed_v1('awa.rescue_v1');
    WITH timed_out AS (
        SELECT c.job_id, c.run_lease, c.claim_slot, c.attempt, 'callback timed out' AS reason,
               c.claimed_at
        FROM awa.leases ls
        JOIN awa.claims c ON c.job_id = ls.job_id AND c.run_lease = ls.run_lease
        WHERE ls.state = 'waiting_external' AND ls.callback_timeout_at < now()
          AND NOT EXISTS (
              SELECT 1 FROM awa.claim_closures z
              WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                AND z.claim_slot = c.claim_slot)
    ), stale AS (
        SELECT c.job_id, c.run_lease, c.claim_slot, c.attempt,
               CASE WHEN c.deadline_at < now() THEN 'hard deadline exceeded'
                    ELSE 'heartbeat stale: worker presumed dead' END AS reason, c.claimed_at
        FROM awa.claims c
        LEFT JOIN awa.attempt_state s ON s.job_id = c.job_id AND s.run_lease = c.run_lease
        WHERE (c.claimed_at < v_cutoff OR c.deadline_at < now())
          AND (c.deadline_at < now() OR COALESCE(s.heartbeat_at, c.claimed_at) < v_cutoff)
          AND NOT EXISTS (
              SELECT 1 FROM awa.claim_closures z
              WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                AND z.claim_slot = c.claim_slot)
          AND NOT EXISTS (
              SELECT 1 FROM awa.leases ls
              WHERE ls.job_id = c.job_id AND ls.run_lease = c.run_lease
                AND ls.state = 'waiting_external')
    ), candidates AS (
        SELECT * FROM timed_out UNION ALL SELECT * FROM stale
        ORDER BY claimed_at
        LIMIT p_limit
    )
    SELECT jsonb_agg(jsonb_build_object(
               'id', x.job_id, 'lease', x.run_lease, 'slot', x.claim_slot, 'outcome', 'retry',
               'st', true, 'closed_as', 'rescued',
               'backoff_base', p_backoff_base,
               'error', jsonb_build_object('type', 'awa_django.Rescued', 'message', x.reason)))
    INTO v_items FROM candidates x;
    IF v_items IS NULL THEN
        RETURN;
    END IF;
    v_stale := COALESCE(awa._finalize_pass_v1(v_items, true), '[]'::jsonb);
    RETURN QUERY
    WITH won AS (
        SELECT (e.value ->> 'id')::bigint AS id, (e.value ->> 'lease')::bigint AS lease,
               e.value -> 'error' ->> 'message' AS why
        FROM jsonb_array_elements(v_items) AS e(value)
        WHERE NOT EXISTS (
            SELECT 1 FROM jsonb_array_elements(v_stale) AS s(value)
            WHERE s.value -> 'id' = e.value -> 'id' AND s.value -> 'lease' = e.value -> 'lease')
    ), told AS (
        SELECT pg_notify('awa_cancel', json_build_object('id', w.id, 'lease', w.lease)::text)
        FROM won w
    )
    SELECT w.id, w.lease, w.why FROM won w WHERE (SELECT count(*) FROM told) >= 0;
END
$$;

