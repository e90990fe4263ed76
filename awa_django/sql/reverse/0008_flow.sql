-- Unapplies awa_django migration 0008 (sql/migrations/0008_flow.sql), before RunAwaSQL drops
-- the functions that file created: the index that calls awa._serial_lock_v1 goes, and the
-- view and functions it redefined in place get their bodies of migrations 0002 and 0005 back
-- (which do not read awa.serial_waiting). Jobs parked behind a serial key stay in
-- awa.serial_waiting (tables stay), unread: migrate forward again to run them.

DROP INDEX IF EXISTS awa.ready_entries_serial_idx;

CREATE OR REPLACE FUNCTION awa._job_brief_v1(p_job_id bigint)
RETURNS TABLE (state text, queue text, priority integer)
LANGUAGE sql STABLE AS $$
    SELECT b.state, b.queue, b.priority FROM (
        SELECT 1 AS o, d.state, d.queue, d.priority::integer
        FROM awa.deferred_jobs d WHERE d.job_id = p_job_id
        UNION ALL
        SELECT 2, 'failed', q.queue, q.priority::integer
        FROM awa.dlq_entries q WHERE q.job_id = p_job_id
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

CREATE OR REPLACE FUNCTION awa.cancel_v1(p_job_id bigint, p_reason text DEFAULT 'cancelled')
RETURNS text
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_try integer := 0;
    v_gen bigint;
    v_slot integer;
    v_state text;
    d awa.deferred_jobs%ROWTYPE;
    c awa.claims%ROWTYPE;
    r awa.ready_entries%ROWTYPE;
    v_error jsonb;
BEGIN
    -- The bounds of awa_django.cancel (limits.MAX_TEXT), for callers that skip Python.
    IF p_reason IS NULL THEN
        RAISE EXCEPTION 'reason: must be text, not NULL' USING ERRCODE = '22023';
    ELSIF length(p_reason) > 10000 THEN
        RAISE EXCEPTION 'reason: % characters exceeds the limit of 10000', length(p_reason)
            USING ERRCODE = '22023';
    END IF;
    v_error := jsonb_build_object('type', 'Cancelled', 'message', p_reason);
    PERFORM awa._require_read_committed_v1('awa.cancel_v1');
    WHILE v_try < 5 LOOP
        v_try := v_try + 1;

        DELETE FROM awa.deferred_jobs WHERE job_id = p_job_id RETURNING * INTO d;
        IF FOUND THEN
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
            RETURN d.state;
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
            INSERT INTO awa.done_entries (
                ready_slot, ready_generation, job_id, run_lease, lane_id, lane_seq, state, attempt,
                attempted_at, errors, progress, queue, kind)
            SELECT c.ready_slot, c.ready_generation, c.job_id, c.run_lease, c.lane_id, c.lane_seq,
                   'cancelled', c.attempt, c.claimed_at,
                   COALESCE(e.errors, '[]'::jsonb)
                   || jsonb_build_array(v_error || jsonb_build_object('attempt', c.attempt, 'at', now())),
                   COALESCE(s.progress, e.progress), e.queue, e.kind
            FROM awa.ready_entries e
            LEFT JOIN awa.attempt_state s ON s.job_id = c.job_id AND s.run_lease = c.run_lease
            WHERE e.lane_id = c.lane_id AND e.lane_seq = c.lane_seq AND e.ready_slot = c.ready_slot;
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
        PERFORM awa._lane_skip_v1(r.lane_id);
        RETURN 'available';
    END LOOP;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION awa.queue_drain_v2(p_queue text, p_limit integer DEFAULT 1000,
                                   p_max_job_id bigint DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_error jsonb := jsonb_build_object('type', 'Cancelled', 'message', 'queue drained');
    v_gen bigint;
    v_slot integer;
    v_lane integer;
    v_cursor bigint;
    v_n integer := 0;
    v_got integer;
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
    )
    INSERT INTO awa.done_entries (
        ready_slot, ready_generation, job_id, run_lease, state, attempt, attempted_at, errors,
        progress, kind, queue, priority, args, max_attempts, run_at, created_at, metadata, tags)
    SELECT v_slot, v_gen, g.job_id, g.run_lease, 'cancelled', g.attempt, g.attempted_at,
           COALESCE(g.errors, '[]'::jsonb)
           || jsonb_build_array(v_error || jsonb_build_object('attempt', g.attempt, 'at', now())),
           g.progress, g.kind, g.queue, g.priority, g.args, g.max_attempts, g.run_at, g.created_at,
           g.metadata, g.tags
    FROM gone g;
    GET DIAGNOSTICS v_n = ROW_COUNT;

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
        )
        INSERT INTO awa.done_entries (
            ready_slot, ready_generation, job_id, run_lease, lane_id, lane_seq, state, attempt,
            errors, progress, queue, kind)
        SELECT p.ready_slot, p.ready_generation, p.job_id, p.run_lease, p.lane_id, p.lane_seq,
               'cancelled', p.attempt,
               COALESCE(p.errors, '[]'::jsonb)
               || jsonb_build_array(v_error || jsonb_build_object('attempt', p.attempt, 'at', now())),
               p.progress, p.queue, p.kind
        FROM picked p
        JOIN tomb t ON t.lane_id = p.lane_id AND t.lane_seq = p.lane_seq AND t.ready_slot = p.ready_slot;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_n := v_n + v_got;
        PERFORM awa._lane_skip_v1(v_lane);
    END LOOP;
    RETURN v_n;
END
$$;

CREATE OR REPLACE FUNCTION awa.queues_idle_v1(p_queues text[])
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (
        SELECT 1 FROM awa.queue_lanes l
        CROSS JOIN LATERAL (SELECT awa.lane_cursor_v1(l.lane_id) AS c) k
        WHERE l.queue = ANY (p_queues)
          AND NOT EXISTS (SELECT 1 FROM awa.queue_meta m WHERE m.queue = l.queue AND m.paused)
          AND EXISTS (
              SELECT 1 FROM awa.ready_entries e
              WHERE e.lane_id = l.lane_id AND e.lane_seq > k.c
                AND NOT EXISTS (
                    SELECT 1 FROM awa.ready_tombstones t
                    WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                      AND t.ready_slot = e.ready_slot)))
    AND NOT EXISTS (
        SELECT 1 FROM awa.claims c
        JOIN awa.queue_lanes l ON l.lane_id = c.lane_id
        WHERE l.queue = ANY (p_queues)
          AND NOT EXISTS (
              SELECT 1 FROM awa.claim_closures z
              WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                AND z.claim_slot = c.claim_slot))
$$;

CREATE OR REPLACE VIEW awa.live_jobs AS
SELECT r.job_id AS id, r.kind, l.queue, 'available'::text AS state, r.priority, r.attempt,
       r.max_attempts, r.run_lease, r.args, r.run_at, r.created_at,
       NULL::timestamptz AS attempted_at, NULL::timestamptz AS finalized_at,
       NULL::timestamptz AS deadline_at, NULL::timestamptz AS heartbeat_at,
       r.errors, NULL::jsonb AS result, r.progress, r.metadata, r.tags,
       false AS in_dlq, NULL::text AS dlq_reason
FROM awa.queue_lanes l
CROSS JOIN LATERAL (
    SELECT e.job_id, e.kind, e.priority, e.attempt, e.max_attempts, e.run_lease, e.args,
           e.run_at, e.created_at, e.errors, e.progress, e.metadata, e.tags,
           random() AS plan_fence
    FROM awa.ready_entries e
    WHERE e.lane_id = l.lane_id
      AND e.lane_seq > (SELECT awa.lane_cursor_v1(l.lane_id))
      AND e.lane_seq <= (SELECT max(x.lane_seq) FROM awa.ready_entries x
                         WHERE x.lane_id = l.lane_id)
      AND NOT EXISTS (
          SELECT 1 FROM awa.ready_tombstones t
          WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq AND t.ready_slot = e.ready_slot)
) r
UNION ALL
SELECT c.job_id, r.kind, l.queue, 'running', r.priority, c.attempt, r.max_attempts, c.run_lease,
       r.args, r.run_at, r.created_at, c.claimed_at, NULL, c.deadline_at, s.heartbeat_at,
       r.errors, NULL, COALESCE(s.progress, r.progress), r.metadata, r.tags, false, NULL
FROM (
    SELECT c.job_id, c.run_lease, c.lane_id, c.lane_seq, c.ready_slot, c.attempt, c.claimed_at,
           c.deadline_at, random() AS plan_fence
    FROM awa.claims c
    WHERE NOT EXISTS (
              SELECT 1 FROM awa.claim_closures z
              WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                AND z.claim_slot = c.claim_slot)
      AND NOT EXISTS (
              SELECT 1 FROM awa.leases ls
              WHERE ls.job_id = c.job_id AND ls.run_lease = c.run_lease
                AND ls.state = 'waiting_external')
) c
JOIN awa.queue_lanes l ON l.lane_id = c.lane_id
CROSS JOIN LATERAL (
    SELECT e.kind, e.priority, e.max_attempts, e.args, e.run_at, e.created_at, e.errors,
           e.progress, e.metadata, e.tags, random() AS plan_fence
    FROM awa.ready_entries e
    WHERE e.lane_id = c.lane_id AND e.lane_seq = c.lane_seq AND e.ready_slot = c.ready_slot
) r
LEFT JOIN awa.attempt_state s ON s.job_id = c.job_id AND s.run_lease = c.run_lease
UNION ALL
SELECT c.job_id, r.kind, l.queue, 'waiting_external', r.priority, c.attempt, r.max_attempts,
       c.run_lease, r.args, r.run_at, r.created_at, c.claimed_at, NULL, c.deadline_at,
       s.heartbeat_at, r.errors, NULL, COALESCE(s.progress, r.progress), r.metadata, r.tags,
       false, NULL
FROM (SELECT DISTINCT ls.job_id, ls.run_lease FROM awa.leases ls
      WHERE ls.state = 'waiting_external') w
JOIN awa.claims c ON c.job_id = w.job_id AND c.run_lease = w.run_lease
JOIN awa.queue_lanes l ON l.lane_id = c.lane_id
CROSS JOIN LATERAL (
    SELECT e.kind, e.priority, e.max_attempts, e.args, e.run_at, e.created_at, e.errors,
           e.progress, e.metadata, e.tags, random() AS plan_fence
    FROM awa.ready_entries e
    WHERE e.lane_id = c.lane_id AND e.lane_seq = c.lane_seq AND e.ready_slot = c.ready_slot
) r
LEFT JOIN awa.attempt_state s ON s.job_id = c.job_id AND s.run_lease = c.run_lease
WHERE NOT EXISTS (
          SELECT 1 FROM awa.claim_closures z
          WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease AND z.claim_slot = c.claim_slot)
UNION ALL
SELECT d.job_id, d.kind, d.queue, d.state, d.priority, d.attempt, d.max_attempts, d.run_lease,
       d.args, d.run_at, d.created_at, d.attempted_at, NULL, NULL, NULL, d.errors, NULL,
       d.progress, d.metadata, d.tags, false, NULL
FROM awa.deferred_jobs d;
