-- awa_django maintenance v1: rescue, ring rotation, truncate-only prune, retention.
-- Run by the elected maintenance leader (docs/maintenance.md). Every function is one short
-- transaction, bounded per call, and safe to run concurrently with workers and producers.

-- Rescue scans read old claims by claim time; the ring keeps this index small (pruned slots).
CREATE INDEX claims_claimed_at_idx ON awa.claims (claimed_at);

-- Rescue -----------------------------------------------------------------------------------------

-- Close up to p_limit open attempts whose heartbeat (or, for attempts that never heartbeated,
-- claim time) is older than p_staleness seconds, or whose hard deadline has passed, and route
-- each through the normal retry / fail / DLQ path (backoff p_backoff_base × 2^attempt plus up
-- to 25 % jitter) with the error "heartbeat stale: worker
-- presumed dead" or "hard deadline exceeded". Attempts waiting for a callback are rescued only
-- once their callback timeout passes ("callback timed out"). The old worker is told over NOTIFY
-- awa_cancel; its late finalization then loses. Returns the attempts rescued.
CREATE FUNCTION awa.rescue_v1(p_staleness double precision, p_limit integer DEFAULT 500,
                              p_backoff_base double precision DEFAULT 1.0)
RETURNS TABLE (job_id bigint, run_lease bigint, reason text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_cutoff timestamptz := now() - make_interval(secs => p_staleness);
    v_items jsonb;
    v_stale jsonb;
BEGIN
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
               'delay', LEAST(p_backoff_base * power(2, x.attempt) * (1 + random() * 0.25), 86400),
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

-- Rings ------------------------------------------------------------------------------------------

-- The advisory lock key of one ring's rotate/prune (class 4282177, keys 1..3).
CREATE FUNCTION awa._ring_key_v1(p_ring text) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE p_ring WHEN 'queue' THEN 1 WHEN 'claim' THEN 2 WHEN 'lease' THEN 3 END
$$;

-- The child tables of one ring slot.
CREATE FUNCTION awa._ring_children_v1(p_ring text, p_slot integer) RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE p_ring
        WHEN 'queue' THEN ARRAY['ready_entries_' || p_slot, 'ready_tombstones_' || p_slot,
                                'done_entries_' || p_slot]
        WHEN 'claim' THEN ARRAY['claims_' || p_slot, 'claim_closures_' || p_slot]
        WHEN 'lease' THEN ARRAY['leases_' || p_slot]
    END
$$;

-- Whether any child of a ring slot holds a row.
CREATE FUNCTION awa._slot_has_rows_v1(p_ring text, p_slot integer) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_table text;
    v_found boolean;
BEGIN
    FOREACH v_table IN ARRAY awa._ring_children_v1(p_ring, p_slot) LOOP
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM awa.%I)', v_table) INTO v_found;
        IF v_found THEN
            RETURN true;
        END IF;
    END LOOP;
    RETURN false;
END
$$;

-- Advance a ring to its next slot. Rotates only when the incoming slot is empty (else
-- 'skipped_busy': it still waits for prune) and the current slot holds something (else
-- 'skipped_idle': an idle ring stops rotating). The append to the rotation ledger is a
-- compare-and-swap on its primary key. Returns 'rotated', 'skipped_busy', 'skipped_idle' or
-- 'skipped_locked' (another rotate or prune of this ring is running).
CREATE FUNCTION awa.rotate_v1(p_ring text)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_count integer;
    v_gen bigint;
    v_slot integer;
    v_next integer;
BEGIN
    SELECT slot_count INTO v_count FROM awa.rings WHERE ring = p_ring;
    IF v_count IS NULL THEN
        RAISE EXCEPTION 'ring: % is not a ring (queue, claim, lease)', quote_nullable(p_ring)
            USING ERRCODE = '22023';
    END IF;
    IF NOT pg_try_advisory_xact_lock(4282177, awa._ring_key_v1(p_ring)) THEN
        RETURN 'skipped_locked';
    END IF;
    SELECT generation, slot INTO v_gen, v_slot
    FROM awa.ring_rotations WHERE ring = p_ring ORDER BY generation DESC LIMIT 1;
    v_next := (v_slot + 1) % v_count;
    IF awa._slot_has_rows_v1(p_ring, v_next) THEN
        RETURN 'skipped_busy';
    END IF;
    IF NOT awa._slot_has_rows_v1(p_ring, v_slot) THEN
        RETURN 'skipped_idle';
    END IF;
    INSERT INTO awa.ring_rotations (ring, generation, slot)
    VALUES (p_ring, v_gen + 1, v_next)
    ON CONFLICT DO NOTHING;
    RETURN CASE WHEN FOUND THEN 'rotated' ELSE 'skipped_locked' END;
END
$$;

-- Why a sealed slot cannot be truncated yet (NULL when it can). Checked before and again after
-- the slot's children are locked.
CREATE FUNCTION awa._prune_blocker_v1(p_ring text, p_slot integer)
RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_ring = 'queue' THEN
        IF EXISTS (
            SELECT 1 FROM awa.claims c
            WHERE c.ready_slot = p_slot
              AND NOT EXISTS (
                  SELECT 1 FROM awa.claim_closures z
                  WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                    AND z.claim_slot = c.claim_slot)) THEN
            RETURN 'open attempt of a job in this slot';
        END IF;
        IF EXISTS (
            SELECT 1
            FROM (SELECT e.lane_id, max(e.lane_seq) AS top
                  FROM awa.ready_entries e WHERE e.ready_slot = p_slot GROUP BY e.lane_id) m
            CROSS JOIN LATERAL (SELECT awa.lane_cursor_v1(m.lane_id) AS c) k
            WHERE m.top > k.c
              AND EXISTS (
                  SELECT 1 FROM awa.ready_entries e
                  WHERE e.ready_slot = p_slot AND e.lane_id = m.lane_id AND e.lane_seq > k.c
                    AND NOT EXISTS (
                        SELECT 1 FROM awa.ready_tombstones t
                        WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                          AND t.ready_slot = e.ready_slot))) THEN
            RETURN 'available job not yet claimed';
        END IF;
    ELSIF p_ring = 'claim' THEN
        IF EXISTS (
            SELECT 1 FROM awa.claims c
            WHERE c.claim_slot = p_slot
              AND NOT EXISTS (
                  SELECT 1 FROM awa.claim_closures z
                  WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                    AND z.claim_slot = c.claim_slot)) THEN
            RETURN 'open claim';
        END IF;
    ELSIF p_ring = 'lease' THEN
        IF EXISTS (
            SELECT 1 FROM awa.leases ls
            JOIN awa.claims c ON c.job_id = ls.job_id AND c.run_lease = ls.run_lease
            WHERE ls.lease_slot = p_slot
              AND NOT EXISTS (
                  SELECT 1 FROM awa.claim_closures z
                  WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                    AND z.claim_slot = c.claim_slot)) THEN
            RETURN 'open lease';
        END IF;
    END IF;
    RETURN NULL;
END
$$;

-- Move open claims out of a claim slot about to be pruned: close each in the old slot
-- ('carried') and append the same attempt (job_id, run_lease, claimed_at …) to the current
-- slot, in one transaction. A finalizer racing this loses nothing: exactly one closure per slot
-- wins, and finalize looks again in the other slots. Returns the number carried.
CREATE FUNCTION awa._carry_claims_v1(p_slot integer)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_gen bigint;
    v_cur integer;
    v_n integer;
BEGIN
    SELECT generation, slot INTO v_gen, v_cur
    FROM awa.ring_rotations WHERE ring = 'claim' ORDER BY generation DESC LIMIT 1;
    IF v_cur = p_slot THEN
        RETURN 0;
    END IF;
    WITH open AS (
        SELECT c.* FROM awa.claims c
        WHERE c.claim_slot = p_slot
          AND NOT EXISTS (
              SELECT 1 FROM awa.claim_closures z
              WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                AND z.claim_slot = c.claim_slot)
    ), closed AS (
        INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome)
        SELECT p_slot, o.job_id, o.run_lease, 'carried' FROM open o
        ON CONFLICT DO NOTHING
        RETURNING job_id, run_lease
    ), moved AS (
        INSERT INTO awa.claims (
            claim_slot, claim_generation, job_id, run_lease, ready_slot, ready_generation,
            lane_id, lane_seq, attempt, claimed_at, deadline_at, worker_id)
        SELECT v_cur, v_gen, o.job_id, o.run_lease, o.ready_slot, o.ready_generation, o.lane_id,
               o.lane_seq, o.attempt, o.claimed_at, o.deadline_at, o.worker_id
        FROM open o JOIN closed k ON k.job_id = o.job_id AND k.run_lease = o.run_lease
        RETURNING 1
    )
    SELECT count(*) INTO v_n FROM moved;
    RETURN v_n;
END
$$;

-- Truncate the oldest sealed slot of a ring (the next one rotation will reuse) once nothing
-- live points into it: no unclaimed job and no open attempt (queue ring); no open claim after
-- open claims are carried forward (claim ring); no open lease (lease ring). The gates are
-- checked, the slot's children are locked ACCESS EXCLUSIVE with a short lock_timeout, the gates
-- are checked again, and only then is the slot truncated; a claim slot first records each lane's
-- highest claimed position in lane_floors. Never waits long, never truncates live work.
-- Returns 'pruned', 'empty', 'skipped_busy: <why>', 'blocked_lock' or 'skipped_locked'.
CREATE FUNCTION awa.prune_v1(p_ring text, p_lock_timeout_ms integer DEFAULT 50)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_count integer;
    v_gen bigint;
    v_cur integer;
    v_slot integer;
    v_why text;
    v_table text;
    v_outcome text;
BEGIN
    SELECT slot_count INTO v_count FROM awa.rings WHERE ring = p_ring;
    IF v_count IS NULL THEN
        RAISE EXCEPTION 'ring: % is not a ring (queue, claim, lease)', quote_nullable(p_ring)
            USING ERRCODE = '22023';
    END IF;
    IF NOT pg_try_advisory_xact_lock(4282177, awa._ring_key_v1(p_ring)) THEN
        RETURN 'skipped_locked';
    END IF;
    SELECT generation, slot INTO v_gen, v_cur
    FROM awa.ring_rotations WHERE ring = p_ring ORDER BY generation DESC LIMIT 1;
    v_slot := (v_cur + 1) % v_count;
    IF NOT awa._slot_has_rows_v1(p_ring, v_slot) THEN
        RETURN 'empty';
    END IF;
    IF p_ring = 'claim' THEN
        PERFORM awa._carry_claims_v1(v_slot);
    END IF;
    v_why := awa._prune_blocker_v1(p_ring, v_slot);
    IF v_why IS NOT NULL THEN
        v_outcome := 'skipped_busy: ' || v_why;
    ELSE
        BEGIN
            PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
            FOREACH v_table IN ARRAY awa._ring_children_v1(p_ring, v_slot) LOOP
                EXECUTE format('LOCK TABLE awa.%I IN ACCESS EXCLUSIVE MODE', v_table);
            END LOOP;
            -- Locked: rows committed while we waited are visible to this new statement.
            v_why := awa._prune_blocker_v1(p_ring, v_slot);
            IF v_why IS NOT NULL THEN
                v_outcome := 'skipped_busy: ' || v_why;
            ELSE
                IF p_ring = 'claim' THEN
                    INSERT INTO awa.lane_floors AS f (lane_id, floor_seq)
                    SELECT c.lane_id, max(c.lane_seq) FROM awa.claims c
                    WHERE c.claim_slot = v_slot GROUP BY c.lane_id
                    ON CONFLICT (lane_id) DO UPDATE
                    SET floor_seq = GREATEST(f.floor_seq, EXCLUDED.floor_seq), updated_at = now()
                    WHERE EXCLUDED.floor_seq > f.floor_seq;
                END IF;
                FOREACH v_table IN ARRAY awa._ring_children_v1(p_ring, v_slot) LOOP
                    EXECUTE format('TRUNCATE awa.%I', v_table);
                END LOOP;
                v_outcome := 'pruned';
            END IF;
            PERFORM set_config('lock_timeout', '0', true);
        EXCEPTION WHEN lock_not_available THEN
            v_outcome := 'blocked_lock';
        END;
    END IF;
    INSERT INTO awa.ring_prunes (ring, slot, generation, outcome)
    VALUES (p_ring, v_slot, v_gen - v_count + 1, v_outcome);
    RETURN v_outcome;
END
$$;

-- Retention ----------------------------------------------------------------------------------------

-- Delete up to p_limit dead-lettered jobs older than p_retention seconds; returns the count.
CREATE FUNCTION awa.dlq_expire_v1(p_retention double precision, p_limit integer DEFAULT 1000)
RETURNS integer
LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM awa.dlq_entries WHERE job_id IN (
            SELECT job_id FROM awa.dlq_entries
            WHERE dlq_at < now() - make_interval(secs => p_retention)
            ORDER BY dlq_at LIMIT p_limit)
        RETURNING 1)
    SELECT count(*)::integer FROM gone
$$;

-- Delete runtime rows of processes not seen for p_retention seconds, prune-ledger rows older
-- than a day, and attempt_state rows of attempts that are no longer open (left by a heartbeat
-- racing a finalization). Returns the number of rows removed.
CREATE FUNCTION awa.cleanup_v1(p_retention double precision)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_runtimes integer;
    v_states integer;
BEGIN
    DELETE FROM awa.runtime_instances
    WHERE last_seen_at < now() - make_interval(secs => p_retention);
    GET DIAGNOSTICS v_runtimes = ROW_COUNT;
    DELETE FROM awa.attempt_state s
    WHERE s.updated_at < now() - interval '1 minute'
      AND NOT EXISTS (
          SELECT 1 FROM awa.claims c
          WHERE c.job_id = s.job_id AND c.run_lease = s.run_lease
            AND NOT EXISTS (
                SELECT 1 FROM awa.claim_closures z
                WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                  AND z.claim_slot = c.claim_slot));
    GET DIAGNOSTICS v_states = ROW_COUNT;
    DELETE FROM awa.ring_prunes WHERE pruned_at < now() - interval '1 day';
    RETURN v_runtimes + v_states;
END
$$;

-- Ring state for operators: per ring and slot, the rows it holds and the last prune outcome.
CREATE FUNCTION awa.ring_slots_v1()
RETURNS TABLE (ring text, slot integer, is_current boolean, rows bigint, last_prune text,
               last_prune_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    g record;
    v_slot integer;
    v_table text;
    v_rows bigint;
    v_n bigint;
BEGIN
    FOR g IN SELECT s.ring, s.slot_count, s.current_slot FROM awa.ring_state s ORDER BY s.ring LOOP
        FOR v_slot IN 0..(g.slot_count - 1) LOOP
            v_rows := 0;
            FOREACH v_table IN ARRAY awa._ring_children_v1(g.ring, v_slot) LOOP
                EXECUTE format('SELECT count(*) FROM awa.%I', v_table) INTO v_n;
                v_rows := v_rows + v_n;
            END LOOP;
            ring := g.ring;
            slot := v_slot;
            is_current := v_slot = g.current_slot;
            rows := v_rows;
            SELECT p.outcome, p.pruned_at INTO last_prune, last_prune_at
            FROM awa.ring_prunes p WHERE p.ring = g.ring AND p.slot = v_slot
            ORDER BY p.pruned_at DESC LIMIT 1;
            RETURN NEXT;
        END LOOP;
    END LOOP;
END
$$;
