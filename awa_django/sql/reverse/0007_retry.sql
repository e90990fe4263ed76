-- Unapplies awa_django migration 0007 (sql/migrations/0007_retry.sql), before RunAwaSQL drops
-- the functions that file created: the CHECK constraints that call them go, and the functions
-- it redefined in place get their bodies of migration 0002 back (which do not call them).
-- Policies stored in jobs' metadata stay, unread.

ALTER TABLE awa.ready_entries DROP CONSTRAINT IF EXISTS ready_entries_retry_policy_check;
ALTER TABLE awa.deferred_jobs DROP CONSTRAINT IF EXISTS deferred_jobs_retry_policy_check;

-- Seconds before the next attempt of a job that failed its attempt number p_attempt: p_base ×
-- 2^attempt plus up to 25 % jitter, at most a day (RETRY_BACKOFF_BASE is p_base; NULL means 1).
-- Every SQL retry path (finalize without an explicit delay, callback resolutions, rescue) uses it;
-- the worker computes the same in Python (awa_django.worker.executor.backoff).
CREATE OR REPLACE FUNCTION awa._backoff_v1(p_attempt integer, p_base double precision DEFAULT 1.0)
RETURNS double precision
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT LEAST(COALESCE(p_base, 1.0) * power(2, LEAST(GREATEST(p_attempt, 0), 40))
                 * (1 + random() * 0.25), 86400)::double precision
$$;

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
               COALESCE(w.progress, s.progress, r.progress) AS new_progress,
               CASE
                   WHEN w.outcome = 'snooze' THEN 'scheduled'
                   WHEN w.outcome = 'cancel' THEN 'cancelled'
                   WHEN w.outcome = 'retry' AND w.attempt < r.max_attempts THEN 'retryable'
                   WHEN COALESCE(m.dlq_enabled, true) THEN 'dlq'
                   ELSE 'failed'
               END AS dest
        FROM won w
        JOIN awa.ready_entries r
          ON r.lane_id = w.lane_id AND r.lane_seq = w.lane_seq AND r.ready_slot = w.ready_slot
        LEFT JOIN awa.queue_meta m ON m.queue = r.queue
        LEFT JOIN awa.attempt_state s ON w.st AND s.job_id = w.id AND s.run_lease = w.lease
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
               now() + make_interval(secs => COALESCE(
                   o.delay,
                   CASE WHEN o.dest = 'retryable'
                        THEN awa._backoff_v1(o.attempt, o.backoff_base)
                        ELSE 0 END)),
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
               CASE WHEN o.outcome = 'retry' THEN 'max_attempts exhausted: '
                    ELSE 'terminal error: ' END
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

-- Close up to p_limit open attempts whose heartbeat (or, for attempts that never heartbeated,
-- claim time) is older than p_staleness seconds, or whose hard deadline has passed, and route
-- each through the normal retry / fail / DLQ path (backoff p_backoff_base × 2^attempt plus up
-- to 25 % jitter) with the error "heartbeat stale: worker
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
               'delay', awa._backoff_v1(x.attempt, p_backoff_base),
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

