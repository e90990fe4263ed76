-- The state, queue and priority of one job, from whichever plane holds it (jobs parked by their
-- serial key or their kind included), for the operator's paths.
CREATE OR REPLACE FUNCTION awa._job_brief_v1(p_job_id bigint)
 RETURNS TABLE(state text, queue text, priority integer)
 LANGUAGE sql
 STABLE
AS $$
    SELECT b.state, b.queue, b.priority FROM (
        SELECT 1 AS o, d.state, d.queue, d.priority::integer
        FROM awa.deferred_jobs d WHERE d.job_id = p_job_id
        UNION ALL
        SELECT 2, 'failed', q.queue, q.priority::integer
        FROM awa.dlq_entries q WHERE q.job_id = p_job_id
        UNION ALL
        SELECT 2, 'available', w.queue, w.priority::integer
        FROM awa.serial_waiting w WHERE w.job_id = p_job_id
        UNION ALL
        SELECT 2, 'available', w.queue, w.priority::integer
        FROM awa.flow_waiting w WHERE w.job_id = p_job_id
        UNION ALL
        SELECT 2, 'scheduled', w.queue, w.priority::integer
        FROM awa.workflow_waiting w WHERE w.job_id = p_job_id
        UNION ALL
        (SELECT 3, CASE WHEN EXISTS (
                        SELECT 1 FROM awa.leases ls
                        WHERE ls.job_id = c.job_id AND ls.run_lease = c.run_lease
                          AND ls.state = 'waiting_external')
                   THEN 'waiting_external' ELSE 'running' END,
                l.queue, l.priority::integer
         FROM awa.claims c JOIN awa.queue_lanes l ON l.lane_id = c.lane_id
         WHERE c.job_id = p_job_id
           AND NOT EXISTS (
               SELECT 1 FROM awa.claim_closures z
               WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                 AND z.claim_slot = c.claim_slot)
         ORDER BY c.run_lease DESC LIMIT 1)
        UNION ALL
        (SELECT 4, 'available', l.queue, l.priority::integer
         FROM awa.ready_entries e JOIN awa.queue_lanes l ON l.lane_id = e.lane_id
         WHERE e.job_id = p_job_id
           AND e.lane_seq > awa.lane_cursor_v1(e.lane_id)
           AND NOT EXISTS (
               SELECT 1 FROM awa.ready_tombstones t
               WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                 AND t.ready_slot = e.ready_slot)
         LIMIT 1)
        UNION ALL
        (SELECT 5, t.state, t.queue, l.priority::integer
         FROM awa.done_entries t LEFT JOIN awa.queue_lanes l ON l.lane_id = t.lane_id
         WHERE t.job_id = p_job_id
         ORDER BY t.finalized_at DESC LIMIT 1)
    ) b
    ORDER BY b.o
    LIMIT 1
$$;

CREATE OR REPLACE FUNCTION awa.cancel_v1(p_job_id bigint, p_reason text DEFAULT 'cancelled'::text)
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
DECLARE
    v_state text;
BEGIN
    -- The bounds of awa_django.cancel (limits.MAX_TEXT), for callers that skip Python.
    IF p_reason IS NULL THEN
        RAISE EXCEPTION 'reason: must be text, not NULL' USING ERRCODE = '22023';
    ELSIF length(p_reason) > 10000 THEN
        RAISE EXCEPTION 'reason: % characters exceeds the limit of 10000', length(p_reason)
            USING ERRCODE = '22023';
    END IF;
    PERFORM awa._require_read_committed_v1('awa.cancel_v1');
    -- A workflow step still waiting for its dependencies.
    IF cardinality(awa._workflow_cancel_waiting_v1(ARRAY[p_job_id], p_reason)) = 1 THEN
        RETURN 'scheduled';
    END IF;
    v_state := awa._cancel_one_v1(p_job_id, p_reason);
    IF v_state IS NOT NULL THEN
        PERFORM awa._workflow_settle_v1(ARRAY[p_job_id], ARRAY['cancelled']);
    END IF;
    RETURN v_state;
END
$$;

-- awa.cancel_v1 for a job in any plane but a workflow's waiting steps; NULL when no live job
-- was found. Its workflow, if any, is the caller's to settle.
CREATE OR REPLACE FUNCTION awa._cancel_one_v1(p_job_id bigint, p_reason text)
 RETURNS text
 LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_try integer := 0;
    v_gen bigint;
    v_slot integer;
    v_state text;
    d awa.deferred_jobs%ROWTYPE;
    w awa.serial_waiting%ROWTYPE;
    fw awa.flow_waiting%ROWTYPE;
    c awa.claims%ROWTYPE;
    r awa.ready_entries%ROWTYPE;
    v_error jsonb;
BEGIN
    v_error := jsonb_build_object('type', 'Cancelled', 'message', p_reason);
    WHILE v_try < 5 LOOP
        v_try := v_try + 1;

        DELETE FROM awa.deferred_jobs WHERE job_id = p_job_id RETURNING * INTO d;
        IF FOUND THEN
            IF d.state = 'retryable' AND d.deferred_at >= now() - interval '25 hours' THEN
                -- Still a retry its minute scheduled (queue charts).
                INSERT INTO awa.queue_minute_retries AS t (queue, minute, retries)
                VALUES (d.queue, date_trunc('minute', d.deferred_at), 1)
                ON CONFLICT (queue, minute) DO UPDATE SET retries = t.retries + 1;
            END IF;
            SELECT generation, slot INTO v_gen, v_slot
            FROM awa.ring_rotations WHERE ring = 'queue' ORDER BY generation DESC LIMIT 1;
            INSERT INTO awa.done_entries (
                ready_slot, ready_generation, job_id, run_lease, state, attempt, attempted_at,
                errors, progress, kind, queue, priority, args, max_attempts, run_at, created_at,
                metadata, tags)
            VALUES (v_slot, v_gen, d.job_id, d.run_lease, 'cancelled', d.attempt, d.attempted_at,
                    COALESCE(d.errors, '[]'::jsonb)
                    || jsonb_build_array(v_error || jsonb_build_object('attempt', d.attempt, 'at', now())),
                    d.progress, d.kind, d.queue, d.priority, d.args, d.max_attempts, d.run_at,
                    d.created_at, d.metadata, d.tags);
            INSERT INTO awa.done_counts (ready_slot, queue, state, n)
            VALUES (v_slot, d.queue, 'cancelled', 1);
            RETURN d.state;
        END IF;

        -- Parked behind its serial key: available, in the eyes of everyone but the claim.
        DELETE FROM awa.serial_waiting WHERE job_id = p_job_id RETURNING * INTO w;
        IF FOUND THEN
            SELECT generation, slot INTO v_gen, v_slot
            FROM awa.ring_rotations WHERE ring = 'queue' ORDER BY generation DESC LIMIT 1;
            INSERT INTO awa.done_entries (
                ready_slot, ready_generation, job_id, run_lease, state, attempt, attempted_at,
                errors, progress, kind, queue, priority, args, max_attempts, run_at, created_at,
                metadata, tags)
            VALUES (v_slot, v_gen, w.job_id, w.run_lease, 'cancelled', w.attempt, NULL,
                    COALESCE(w.errors, '[]'::jsonb)
                    || jsonb_build_array(v_error || jsonb_build_object('attempt', w.attempt, 'at', now())),
                    w.progress, w.kind, w.queue, w.priority, w.args, w.max_attempts, w.run_at,
                    w.created_at, w.metadata, w.tags);
            INSERT INTO awa.done_counts (ready_slot, queue, state, n)
            VALUES (v_slot, w.queue, 'cancelled', 1);
            RETURN 'available';
        END IF;

        -- Parked by its kind's flow limits: the same.
        DELETE FROM awa.flow_waiting WHERE job_id = p_job_id RETURNING * INTO fw;
        IF FOUND THEN
            SELECT generation, slot INTO v_gen, v_slot
            FROM awa.ring_rotations WHERE ring = 'queue' ORDER BY generation DESC LIMIT 1;
            INSERT INTO awa.done_entries (
                ready_slot, ready_generation, job_id, run_lease, state, attempt, attempted_at,
                errors, progress, kind, queue, priority, args, max_attempts, run_at, created_at,
                metadata, tags)
            VALUES (v_slot, v_gen, fw.job_id, fw.run_lease, 'cancelled', fw.attempt, NULL,
                    COALESCE(fw.errors, '[]'::jsonb)
                    || jsonb_build_array(v_error || jsonb_build_object('attempt', fw.attempt, 'at', now())),
                    fw.progress, fw.kind, fw.queue, fw.priority, fw.args, fw.max_attempts,
                    fw.run_at, fw.created_at, fw.metadata, fw.tags);
            INSERT INTO awa.done_counts (ready_slot, queue, state, n)
            VALUES (v_slot, fw.queue, 'cancelled', 1);
            RETURN 'available';
        END IF;

        SELECT * INTO c FROM awa.claims cl
        WHERE cl.job_id = p_job_id
          AND NOT EXISTS (
              SELECT 1 FROM awa.claim_closures z
              WHERE z.job_id = cl.job_id AND z.run_lease = cl.run_lease AND z.claim_slot = cl.claim_slot)
        ORDER BY cl.run_lease DESC LIMIT 1;
        IF FOUND THEN
            INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome)
            VALUES (c.claim_slot, c.job_id, c.run_lease, 'cancel')
            ON CONFLICT DO NOTHING;
            IF NOT FOUND THEN
                CONTINUE;  -- another closer won; look again
            END IF;
            v_state := CASE WHEN EXISTS (
                SELECT 1 FROM awa.leases ls
                WHERE ls.job_id = c.job_id AND ls.run_lease = c.run_lease
                  AND ls.state = 'waiting_external') THEN 'waiting_external' ELSE 'running' END;
            WITH done AS (
                INSERT INTO awa.done_entries (
                    ready_slot, ready_generation, job_id, run_lease, lane_id, lane_seq, state,
                    attempt, attempted_at, errors, progress, queue, kind)
                SELECT c.ready_slot, c.ready_generation, c.job_id, c.run_lease, c.lane_id,
                       c.lane_seq, 'cancelled', c.attempt, c.claimed_at,
                       COALESCE(e.errors, '[]'::jsonb)
                       || jsonb_build_array(v_error || jsonb_build_object('attempt', c.attempt, 'at', now())),
                       COALESCE(s.progress, e.progress), e.queue, e.kind
                FROM awa.ready_entries e
                LEFT JOIN awa.attempt_state s ON s.job_id = c.job_id AND s.run_lease = c.run_lease
                WHERE e.lane_id = c.lane_id AND e.lane_seq = c.lane_seq
                  AND e.ready_slot = c.ready_slot
                RETURNING ready_slot, queue, state)
            INSERT INTO awa.done_counts (ready_slot, queue, state, n)
            SELECT d.ready_slot, d.queue, d.state, count(*) FROM done d
            GROUP BY d.ready_slot, d.queue, d.state;
            DELETE FROM awa.attempt_state WHERE job_id = c.job_id AND run_lease = c.run_lease;
            PERFORM pg_notify('awa_cancel',
                              json_build_object('id', c.job_id, 'lease', c.run_lease)::text);
            RETURN v_state;
        END IF;

        SELECT * INTO r FROM awa.ready_entries e
        WHERE e.job_id = p_job_id
          AND NOT EXISTS (
              SELECT 1 FROM awa.ready_tombstones t
              WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq AND t.ready_slot = e.ready_slot)
        ORDER BY e.run_lease DESC, e.lane_seq DESC LIMIT 1;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        -- Serialise with claimers of the lane, then look again with a fresh snapshot.
        PERFORM 1 FROM awa.queue_lanes l WHERE l.lane_id = r.lane_id FOR UPDATE;
        IF r.lane_seq <= awa.lane_cursor_v1(r.lane_id) THEN
            CONTINUE;  -- claimed meanwhile (or long ago): look for the open claim
        END IF;
        INSERT INTO awa.ready_tombstones (ready_slot, ready_generation, lane_id, lane_seq, job_id)
        VALUES (r.ready_slot, r.ready_generation, r.lane_id, r.lane_seq, r.job_id)
        ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            RETURN NULL;  -- cancelled concurrently
        END IF;
        INSERT INTO awa.done_entries (
            ready_slot, ready_generation, job_id, run_lease, lane_id, lane_seq, state, attempt,
            errors, progress, queue, kind)
        VALUES (r.ready_slot, r.ready_generation, r.job_id, r.run_lease, r.lane_id, r.lane_seq,
                'cancelled', r.attempt,
                COALESCE(r.errors, '[]'::jsonb)
                || jsonb_build_array(v_error || jsonb_build_object('attempt', r.attempt, 'at', now())),
                r.progress, r.queue, r.kind);
        INSERT INTO awa.done_counts (ready_slot, queue, state, n)
        VALUES (r.ready_slot, r.queue, 'cancelled', 1);
        PERFORM awa._lane_skip_v1(r.lane_id);
        RETURN 'available';
    END LOOP;
    RETURN NULL;
END
$$;

-- awa_django operator functions v1: queue pause/resume/drain and statistics, for the admin and
-- the management commands (awa_queue, awa_status, awa_dlq, awa_job).

-- Pause or resume claiming from a queue (producers may still enqueue; promotion skips it).
-- Resuming wakes the workers (a NOTIFY sent when the transaction commits), as an enqueue does.
CREATE OR REPLACE FUNCTION awa.queue_pause_v1(p_queue text, p_paused boolean)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
BEGIN
    IF NOT awa.valid_queue_name(p_queue) THEN
        RAISE EXCEPTION 'queue: % is not a valid queue name ([a-z0-9_.-]{1,63})', quote_nullable(p_queue)
            USING ERRCODE = '22023';
    END IF;
    IF p_paused IS NULL THEN
        RAISE EXCEPTION 'paused: must be true or false' USING ERRCODE = '22023';
    END IF;
    INSERT INTO awa.queue_meta AS m (queue, paused) VALUES (p_queue, p_paused)
    ON CONFLICT (queue) DO UPDATE SET paused = EXCLUDED.paused, updated_at = now();
    IF NOT p_paused THEN
        PERFORM pg_notify('awa_jobs', p_queue);
    END IF;
    RETURN p_paused;
END
$$;

-- Dead letter queue on or off, per queue ----------------------------------------------------------

-- Set whether the jobs of p_queue that fail for good go to the DLQ (true, the default of every
-- queue) or to history as failed (false). Every failing path (a handler's failure, rescue, a
-- callback's error) reads queue_meta.dlq_enabled when it decides. Returns whether the setting
-- changed; an unchanged one is not written (no dead tuple for a process that syncs
-- AWA["QUEUES"] at start).
CREATE OR REPLACE FUNCTION awa.queue_dlq_v1(p_queue text, p_enabled boolean)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
DECLARE
    v_old boolean;
BEGIN
    IF NOT awa.valid_queue_name(p_queue) THEN
        RAISE EXCEPTION 'queue: % is not a valid queue name ([a-z0-9_.-]{1,63})', quote_nullable(p_queue)
            USING ERRCODE = '22023';
    END IF;
    IF p_enabled IS NULL THEN
        RAISE EXCEPTION 'enabled: must be true or false' USING ERRCODE = '22023';
    END IF;
    SELECT m.dlq_enabled INTO v_old FROM awa.queue_meta m WHERE m.queue = p_queue;
    INSERT INTO awa.queue_meta AS m (queue, dlq_enabled) VALUES (p_queue, p_enabled)
    ON CONFLICT (queue) DO UPDATE SET dlq_enabled = EXCLUDED.dlq_enabled, updated_at = now()
    WHERE m.dlq_enabled IS DISTINCT FROM EXCLUDED.dlq_enabled;
    RETURN COALESCE(v_old, true) IS DISTINCT FROM p_enabled;
END
$$;

CREATE OR REPLACE FUNCTION awa.queue_drain_v2(
    p_queue text, p_limit integer DEFAULT 1000, p_max_job_id bigint DEFAULT NULL::bigint)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
DECLARE
    v_error jsonb := jsonb_build_object('type', 'Cancelled', 'message', 'queue drained');
    v_gen bigint;
    v_slot integer;
    v_lane integer;
    v_cursor bigint;
    v_n integer := 0;
    v_got integer;
    v_ids bigint[] := '{}';
BEGIN
    PERFORM awa._require_read_committed_v1('awa.queue_drain_v2');
    IF NOT awa.valid_queue_name(p_queue) THEN
        RAISE EXCEPTION 'queue: % is not a valid queue name ([a-z0-9_.-]{1,63})', quote_nullable(p_queue)
            USING ERRCODE = '22023';
    END IF;
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'limit: must be at least 1' USING ERRCODE = '22023';
    END IF;
    SELECT generation, slot INTO v_gen, v_slot
    FROM awa.ring_rotations WHERE ring = 'queue' ORDER BY generation DESC LIMIT 1;
    WITH gone AS (
        DELETE FROM awa.deferred_jobs d
        WHERE d.job_id IN (
            SELECT d2.job_id FROM awa.deferred_jobs d2
            WHERE d2.queue = p_queue AND (p_max_job_id IS NULL OR d2.job_id <= p_max_job_id)
            ORDER BY d2.job_id LIMIT p_limit
            FOR UPDATE SKIP LOCKED)
        RETURNING d.*
    ), retried AS (
        -- A retry cancelled while it waits was still scheduled in its minute (queue charts).
        INSERT INTO awa.queue_minute_retries AS t (queue, minute, retries)
        SELECT g.queue, date_trunc('minute', g.deferred_at), count(*)
        FROM gone g
        WHERE g.state = 'retryable' AND g.deferred_at >= now() - interval '25 hours'
        GROUP BY g.queue, date_trunc('minute', g.deferred_at)
        ON CONFLICT (queue, minute) DO UPDATE SET retries = t.retries + excluded.retries
    ), done AS (
        INSERT INTO awa.done_entries (
            ready_slot, ready_generation, job_id, run_lease, state, attempt, attempted_at,
            errors, progress, kind, queue, priority, args, max_attempts, run_at, created_at,
            metadata, tags)
        SELECT v_slot, v_gen, g.job_id, g.run_lease, 'cancelled', g.attempt, g.attempted_at,
               COALESCE(g.errors, '[]'::jsonb)
               || jsonb_build_array(v_error || jsonb_build_object('attempt', g.attempt, 'at', now())),
               g.progress, g.kind, g.queue, g.priority, g.args, g.max_attempts, g.run_at,
               g.created_at, g.metadata, g.tags
        FROM gone g
        RETURNING ready_slot, queue, state, job_id
    ), counted AS (
        INSERT INTO awa.done_counts (ready_slot, queue, state, n)
        SELECT d.ready_slot, d.queue, d.state, count(*) FROM done d
        GROUP BY d.ready_slot, d.queue, d.state
    )
    SELECT count(*), COALESCE(array_agg(job_id), '{}') INTO v_n, v_ids FROM done;
    -- Jobs parked behind their serial keys.
    WITH gone AS (
        DELETE FROM awa.serial_waiting w
        WHERE w.job_id IN (
            SELECT w2.job_id FROM awa.serial_waiting w2
            WHERE w2.queue = p_queue AND (p_max_job_id IS NULL OR w2.job_id <= p_max_job_id)
            ORDER BY w2.job_id LIMIT GREATEST(p_limit - v_n, 0)
            FOR UPDATE SKIP LOCKED)
        RETURNING w.*
    ), done AS (
        INSERT INTO awa.done_entries (
            ready_slot, ready_generation, job_id, run_lease, state, attempt, errors, progress,
            kind, queue, priority, args, max_attempts, run_at, created_at, metadata, tags)
        SELECT v_slot, v_gen, g.job_id, g.run_lease, 'cancelled', g.attempt,
               COALESCE(g.errors, '[]'::jsonb)
               || jsonb_build_array(v_error || jsonb_build_object('attempt', g.attempt, 'at', now())),
               g.progress, g.kind, g.queue, g.priority, g.args, g.max_attempts, g.run_at,
               g.created_at, g.metadata, g.tags
        FROM gone g
        RETURNING ready_slot, queue, state, job_id
    ), counted AS (
        INSERT INTO awa.done_counts (ready_slot, queue, state, n)
        SELECT d.ready_slot, d.queue, d.state, count(*) FROM done d
        GROUP BY d.ready_slot, d.queue, d.state
    )
    SELECT count(*), v_ids || COALESCE(array_agg(job_id), '{}') INTO v_got, v_ids FROM done;
    v_n := v_n + v_got;
    -- Jobs parked by their kind's flow limits.
    WITH gone AS (
        DELETE FROM awa.flow_waiting w
        WHERE w.job_id IN (
            SELECT w2.job_id FROM awa.flow_waiting w2
            WHERE w2.queue = p_queue AND (p_max_job_id IS NULL OR w2.job_id <= p_max_job_id)
            ORDER BY w2.job_id LIMIT GREATEST(p_limit - v_n, 0)
            FOR UPDATE SKIP LOCKED)
        RETURNING w.*
    ), done AS (
        INSERT INTO awa.done_entries (
            ready_slot, ready_generation, job_id, run_lease, state, attempt, errors, progress,
            kind, queue, priority, args, max_attempts, run_at, created_at, metadata, tags)
        SELECT v_slot, v_gen, g.job_id, g.run_lease, 'cancelled', g.attempt,
               COALESCE(g.errors, '[]'::jsonb)
               || jsonb_build_array(v_error || jsonb_build_object('attempt', g.attempt, 'at', now())),
               g.progress, g.kind, g.queue, g.priority, g.args, g.max_attempts, g.run_at,
               g.created_at, g.metadata, g.tags
        FROM gone g
        RETURNING ready_slot, queue, state, job_id
    ), counted AS (
        INSERT INTO awa.done_counts (ready_slot, queue, state, n)
        SELECT d.ready_slot, d.queue, d.state, count(*) FROM done d
        GROUP BY d.ready_slot, d.queue, d.state
    )
    SELECT count(*), v_ids || COALESCE(array_agg(job_id), '{}') INTO v_got, v_ids FROM done;
    v_n := v_n + v_got;

    -- The claim ring's locks before the cursors are read, in a statement of its own: a claim
    -- prune that truncated a slot while this waited is then seen whole, with the cursor markers
    -- it wrote (awa.lane_cursor_v1), and no prune truncates one until this commits.
    LOCK TABLE awa.claims, awa.lane_floors IN ACCESS SHARE MODE;
    FOR v_lane IN SELECT l.lane_id FROM awa.queue_lanes l WHERE l.queue = p_queue ORDER BY l.lane_id
    LOOP
        EXIT WHEN v_n >= p_limit;
        PERFORM 1 FROM awa.queue_lanes l WHERE l.lane_id = v_lane FOR UPDATE;
        v_cursor := awa.lane_cursor_v1(v_lane);
        WITH picked AS MATERIALIZED (
            SELECT e.* FROM awa.ready_entries e
            WHERE e.lane_id = v_lane AND e.lane_seq > v_cursor
              AND (p_max_job_id IS NULL OR e.job_id <= p_max_job_id)
              AND NOT EXISTS (
                  SELECT 1 FROM awa.ready_tombstones t
                  WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                    AND t.ready_slot = e.ready_slot)
            ORDER BY e.lane_seq
            LIMIT p_limit - v_n
        ), tomb AS (
            INSERT INTO awa.ready_tombstones (ready_slot, ready_generation, lane_id, lane_seq, job_id)
            SELECT p.ready_slot, p.ready_generation, p.lane_id, p.lane_seq, p.job_id FROM picked p
            ON CONFLICT DO NOTHING
            RETURNING lane_id, lane_seq, ready_slot
        ), done AS (
            INSERT INTO awa.done_entries (
                ready_slot, ready_generation, job_id, run_lease, lane_id, lane_seq, state,
                attempt, errors, progress, queue, kind)
            SELECT p.ready_slot, p.ready_generation, p.job_id, p.run_lease, p.lane_id,
                   p.lane_seq, 'cancelled', p.attempt,
                   COALESCE(p.errors, '[]'::jsonb)
                   || jsonb_build_array(v_error || jsonb_build_object('attempt', p.attempt, 'at', now())),
                   p.progress, p.queue, p.kind
            FROM picked p
            JOIN tomb t
              ON t.lane_id = p.lane_id AND t.lane_seq = p.lane_seq AND t.ready_slot = p.ready_slot
            RETURNING ready_slot, queue, state, job_id
        ), counted AS (
            INSERT INTO awa.done_counts (ready_slot, queue, state, n)
            SELECT d.ready_slot, d.queue, d.state, count(*) FROM done d
            GROUP BY d.ready_slot, d.queue, d.state
        )
        SELECT count(*), v_ids || COALESCE(array_agg(job_id), '{}') INTO v_got, v_ids FROM done;
        v_n := v_n + v_got;
        PERFORM awa._lane_skip_v1(v_lane);
    END LOOP;
    -- Workflow steps of the queue still waiting for their dependencies, then what the
    -- cancellations do to their workflows.
    IF v_n < p_limit THEN
        v_got := cardinality(awa._workflow_cancel_waiting_v1(ARRAY(
            SELECT w.job_id FROM awa.workflow_waiting w
            WHERE w.queue = p_queue AND (p_max_job_id IS NULL OR w.job_id <= p_max_job_id)
            ORDER BY w.job_id LIMIT p_limit - v_n), 'queue drained'));
        v_n := v_n + COALESCE(v_got, 0);
    END IF;
    PERFORM awa._workflow_settle_as_v1(v_ids, 'cancelled');
    RETURN v_n;
END
$$;

-- Dead letter queue -----------------------------------------------------------------------------

-- Move dead-lettered jobs back into the queue (optionally another queue or priority) with
-- attempt 0 and their error history kept. run_lease is kept too, so attempt identities stay
-- unique for the job's whole life. Returns the ids retried.
CREATE OR REPLACE FUNCTION awa.dlq_retry_v1(
    p_job_ids bigint[], p_queue text DEFAULT NULL::text,
    p_priority integer DEFAULT NULL::integer)
 RETURNS SETOF bigint
 LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_jobs awa.job_body[];
BEGIN
    IF p_queue IS NOT NULL AND NOT awa.valid_queue_name(p_queue) THEN
        RAISE EXCEPTION 'queue: % is not a valid queue name ([a-z0-9_.-]{1,63})', quote_nullable(p_queue)
            USING ERRCODE = '22023';
    END IF;
    IF p_priority IS NOT NULL AND NOT awa.valid_priority(p_priority) THEN
        RAISE EXCEPTION 'priority: % is outside -100..100', p_priority USING ERRCODE = '22023';
    END IF;
    WITH moved AS (
        DELETE FROM awa.dlq_entries d WHERE d.job_id = ANY (p_job_ids) RETURNING d.*
    )
    SELECT array_agg(ROW(m.job_id, m.kind, COALESCE(p_queue, m.queue),
                         COALESCE(p_priority, m.priority)::smallint, m.args, 0, m.max_attempts,
                         m.run_lease, now(), m.created_at, m.deadline_secs, m.metadata, m.tags,
                         m.errors, m.progress)::awa.job_body ORDER BY m.job_id)
    INTO v_jobs FROM moved m;
    PERFORM awa._append_ready_grouped_v1(v_jobs, true);
    RETURN QUERY SELECT u.job_id FROM unnest(v_jobs) AS u ORDER BY u.job_id;
END
$$;

-- Retry dead-lettered jobs (awa.dlq_retry_v1's moves) with their unique keys: a job that held a
-- key takes it again; when another job holds it and blocks (an earlier job of the same call
-- included), p_on_conflict decides: 'refuse' (default) leaves the job in the DLQ, 'run' retries
-- it without the key. Returns one row per requested job found in the DLQ: 'retried' or
-- 'refused' (with the holder's id). The key is recomputed from the job's kind, its arguments
-- and the spec's explicit key: a spec written by hand names a key of its own kind only.
CREATE OR REPLACE FUNCTION awa.dlq_retry_v2(
    p_job_ids bigint[], p_queue text DEFAULT NULL::text,
    p_priority integer DEFAULT NULL::integer, p_on_conflict text DEFAULT 'refuse'::text)
 RETURNS TABLE(job_id bigint, outcome text, holder bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
#variable_conflict use_column
DECLARE
    d record;
    v_holder bigint;
    v_digest bytea;
    v_key text;
    v_taken bytea[] := '{}';
    v_takers bigint[] := '{}';
    v_retry bigint[] := '{}';
    v_refused bigint[] := '{}';
    v_holders bigint[] := '{}';
    v_spec jsonb;
    v_for numeric;
BEGIN
    IF p_on_conflict IS NULL OR p_on_conflict NOT IN ('refuse', 'run') THEN
        RAISE EXCEPTION 'on_conflict: % is not refuse or run', quote_nullable(p_on_conflict)
            USING ERRCODE = '22023';
    END IF;
    FOR d IN
        SELECT q.job_id, q.kind, q.args, q.metadata -> 'awa:unique' AS spec
        FROM awa.dlq_entries q WHERE q.job_id = ANY (p_job_ids)
        ORDER BY q.job_id
        FOR UPDATE
    LOOP
        v_spec := d.spec;
        v_holder := NULL;
        IF jsonb_typeof(v_spec) = 'object' AND jsonb_typeof(v_spec -> 'key') IN ('string', 'null')
           AND length(v_spec ->> 'key') <= 10000 IS NOT false THEN
            v_key := awa.unique_key_text_v1(v_spec ->> 'key', d.args);
            v_digest := awa.unique_digest_v1(d.kind, v_key);
            v_for := CASE WHEN jsonb_typeof(v_spec -> 'for') = 'number'
                          THEN (v_spec ->> 'for')::numeric END;
            -- An earlier job of this call took the key: it blocks (it is leaving the DLQ).
            v_holder := v_takers[array_position(v_taken, v_digest)];
            IF v_holder IS NULL THEN
                SELECT t.holder INTO v_holder FROM awa._unique_take_v1(
                    v_digest, d.job_id, d.kind, v_key,
                    COALESCE((SELECT array_agg(DISTINCT s) FROM jsonb_array_elements_text(
                                  CASE WHEN jsonb_typeof(v_spec -> 'states') = 'array'
                                       THEN v_spec -> 'states' END) s
                              WHERE s = ANY (awa.unique_states_v1())),
                             awa.unique_default_states_v1()),
                    CASE WHEN v_for > 0 THEN LEAST(v_for, 3155760000)::double precision END) t;
                IF v_holder IS NULL THEN
                    v_taken := v_taken || v_digest;
                    v_takers := v_takers || d.job_id;
                END IF;
            END IF;
        END IF;
        IF v_holder IS NOT NULL AND p_on_conflict = 'refuse' THEN
            v_refused := v_refused || d.job_id;
            v_holders := v_holders || v_holder;
        ELSE
            v_retry := v_retry || d.job_id;
        END IF;
    END LOOP;
    RETURN QUERY
    SELECT r, 'retried'::text, NULL::bigint
    FROM awa.dlq_retry_v1(v_retry, p_queue, p_priority) r;
    RETURN QUERY
    SELECT u.j, 'refused'::text, u.h FROM unnest(v_refused, v_holders) AS u(j, h);
END
$$;

-- Delete dead-lettered jobs for good. Returns the ids purged.
-- A purged step of a workflow ends there as failed (awa._workflow_settle_v1).
CREATE OR REPLACE FUNCTION awa.dlq_purge_v1(p_job_ids bigint[])
 RETURNS SETOF bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
DECLARE
    v_ids bigint[];
BEGIN
    WITH gone AS (
        DELETE FROM awa.dlq_entries WHERE job_id = ANY (p_job_ids) RETURNING job_id
    )
    SELECT array_agg(g.job_id ORDER BY g.job_id) INTO v_ids FROM gone g;
    PERFORM awa._workflow_settle_as_v1(v_ids, 'failed');
    RETURN QUERY SELECT u FROM unnest(v_ids) u;
END
$$;

-- Retry failed and cancelled jobs of terminal history. Each one found is enqueued again as a
-- new job (a new id, attempt 0, available at once) through awa.enqueue_one_v3, with the
-- original's kind, arguments, queue and priority (or p_queue, p_priority), max_attempts, tags,
-- per-job deadline (when its body is still in the ready ring) and metadata, plus three reserved
-- keys: "awa:retried_from" (the original's id), "awa:retried_by" (p_by) and "awa:retried_at".
-- A unique job takes its key again; when another job holds it, the retry is refused. The
-- original stays in history unchanged (history is append-only).
--
-- Returns one row per requested id, with its kind and queue (the retry's queue when retried):
-- outcome 'retried' (retry_job_id: the new job),
-- 'already_retried' (by an earlier call: retry_job_id is that retry's job), 'refused' (a unique
-- job whose key another job holds: retry_job_id is the holder), 'not_retryable' (completed)
-- or 'not_found' (not in history: unknown, live, dead-lettered or pruned). Rows of
-- awa.history_retries older than p_keep seconds are deleted first.
--
-- READ COMMITTED is required (unique keys are taken with fresh snapshots).
CREATE OR REPLACE FUNCTION awa.history_retry_v1(
    p_job_ids bigint[], p_by text DEFAULT NULL::text, p_queue text DEFAULT NULL::text,
    p_priority integer DEFAULT NULL::integer, p_keep double precision DEFAULT 172800,
    p_args_max_bytes integer DEFAULT 1048576, p_metadata_max_bytes integer DEFAULT 65536,
    p_json_max_depth integer DEFAULT 32, p_max_tags integer DEFAULT 20,
    p_tag_max_length integer DEFAULT 100)
 RETURNS TABLE(job_id bigint, outcome text, retry_job_id bigint, kind text, queue text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
#variable_conflict use_variable
DECLARE
    d record;
    v_spec jsonb;
    v_new record;
    v_metadata jsonb;
    v_done bigint[] := '{}';
BEGIN
    PERFORM awa._require_read_committed_v1('awa.history_retry_v1');
    IF p_queue IS NOT NULL AND NOT awa.valid_queue_name(p_queue) THEN
        RAISE EXCEPTION 'queue: % is not a valid queue name ([a-z0-9_.-]{1,63})', quote_nullable(p_queue)
            USING ERRCODE = '22023';
    END IF;
    IF p_priority IS NOT NULL AND NOT awa.valid_priority(p_priority) THEN
        RAISE EXCEPTION 'priority: % is outside -100..100', p_priority USING ERRCODE = '22023';
    END IF;
    IF p_by IS NOT NULL AND length(p_by) > 255 THEN
        RAISE EXCEPTION 'by: at most 255 characters' USING ERRCODE = '22023';
    END IF;
    DELETE FROM awa.history_retries h
    WHERE h.retried_at < now() - make_interval(secs => LEAST(GREATEST(p_keep, 0), awa._max_seconds_v1()));
    FOR d IN
        SELECT x.job_id, x.state, x.kind, x.queue,
               COALESCE(x.priority, r.priority) AS priority,
               COALESCE(x.args, r.args) AS args,
               COALESCE(x.max_attempts, r.max_attempts) AS max_attempts,
               COALESCE(x.metadata, r.metadata) AS metadata,
               COALESCE(x.tags, r.tags) AS tags,
               r.deadline_secs
        FROM awa.done_entries x
        LEFT JOIN awa.ready_entries r
               ON r.lane_id = x.lane_id AND r.lane_seq = x.lane_seq AND r.ready_slot = x.ready_slot
        WHERE x.job_id = ANY (p_job_ids)
        ORDER BY x.job_id
    LOOP
        v_done := v_done || d.job_id;
        job_id := d.job_id;
        kind := d.kind;
        queue := d.queue;
        IF d.state NOT IN ('failed', 'cancelled') THEN
            outcome := 'not_retryable';
            retry_job_id := NULL;
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- Waits for a concurrent retry of the same job to commit or roll back.
        INSERT INTO awa.history_retries AS h (job_id, retry_job_id, retried_by)
        VALUES (d.job_id, NULL, p_by)
        ON CONFLICT ON CONSTRAINT history_retries_pkey DO NOTHING;
        IF NOT FOUND THEN
            outcome := 'already_retried';
            SELECT h.retry_job_id INTO retry_job_id FROM awa.history_retries h
            WHERE h.job_id = d.job_id;
            RETURN NEXT;
            CONTINUE;
        END IF;
        v_spec := d.metadata -> 'awa:unique';
        -- A retried workflow step runs alone: its workflow does not wait for it.
        v_metadata := (COALESCE(d.metadata, '{}'::jsonb) - 'awa:unique' - 'awa:retried_from'
                       - 'awa:retried_by' - 'awa:retried_at' - 'awa:workflow')
                      || jsonb_build_object('awa:retried_from', d.job_id, 'awa:retried_by', p_by,
                                            'awa:retried_at', now());
        IF jsonb_typeof(v_spec) <> 'object' THEN
            v_spec := NULL;
        END IF;
        SELECT e.job_id, e.duplicate INTO v_new
        FROM awa.enqueue_one_v3(
            d.kind, COALESCE(p_queue, d.queue), COALESCE(p_priority, d.priority), d.args,
            d.max_attempts, NULL, NULL, d.deadline_secs, v_metadata, d.tags,
            p_args_max_bytes, p_metadata_max_bytes, p_json_max_depth, p_max_tags,
            p_tag_max_length,
            v_spec IS NOT NULL,
            CASE WHEN jsonb_typeof(v_spec -> 'key') = 'string' THEN v_spec ->> 'key' END,
            CASE WHEN jsonb_typeof(v_spec -> 'for') = 'number'
                 THEN LEAST((v_spec ->> 'for')::double precision, 3155760000) END,
            CASE WHEN jsonb_typeof(v_spec -> 'states') = 'array'
                 THEN (SELECT array_agg(DISTINCT s) FROM jsonb_array_elements_text(v_spec -> 'states') s
                       WHERE s = ANY (awa.unique_states_v1())) END) e;
        IF v_new.duplicate THEN
            DELETE FROM awa.history_retries h WHERE h.job_id = d.job_id;
            outcome := 'refused';
        ELSE
            UPDATE awa.history_retries h SET retry_job_id = v_new.job_id WHERE h.job_id = d.job_id;
            outcome := 'retried';
            queue := COALESCE(p_queue, d.queue);
        END IF;
        retry_job_id := v_new.job_id;
        RETURN NEXT;
    END LOOP;
    RETURN QUERY
    SELECT u.id, 'not_found'::text, NULL::bigint, NULL::text, NULL::text
    FROM unnest(p_job_ids) AS u(id) WHERE u.id <> ALL (v_done) GROUP BY u.id;
END
$$;
