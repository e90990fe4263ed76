-- Rings ------------------------------------------------------------------------------------------

-- The advisory lock key of one ring's rotate/prune (class 4282178, keys 1..3).
CREATE OR REPLACE FUNCTION awa._ring_key_v1(p_ring text)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE
AS $$
    SELECT CASE p_ring WHEN 'queue' THEN 1 WHEN 'claim' THEN 2 WHEN 'lease' THEN 3 END
$$;

-- Take the maintenance lock of one ring (its own key space) for this transaction: the ring's
-- slot count, or NULL when another rotate or prune of the ring holds it. An unknown ring raises
-- SQLSTATE 22023.
CREATE OR REPLACE FUNCTION awa._ring_lock_v1(p_ring text)
 RETURNS integer
 LANGUAGE plpgsql
AS $$
DECLARE
    v_count integer;
BEGIN
    SELECT slot_count INTO v_count FROM awa.rings WHERE ring = p_ring;
    IF v_count IS NULL THEN
        RAISE EXCEPTION 'ring: % is not a ring (queue, claim, lease)', quote_nullable(p_ring)
            USING ERRCODE = '22023';
    END IF;
    IF NOT pg_try_advisory_xact_lock(4282178, awa._ring_key_v1(p_ring)) THEN
        RETURN NULL;
    END IF;
    RETURN v_count;
END
$$;

-- The child tables of one ring slot.
CREATE OR REPLACE FUNCTION awa._ring_children_v1(p_ring text, p_slot integer)
 RETURNS text[]
 LANGUAGE sql
 IMMUTABLE
AS $$
    SELECT CASE p_ring
        WHEN 'queue' THEN ARRAY['ready_entries_' || p_slot, 'ready_tombstones_' || p_slot,
                                'done_entries_' || p_slot, 'done_counts_' || p_slot]
        WHEN 'claim' THEN ARRAY['claims_' || p_slot, 'claim_closures_' || p_slot]
        WHEN 'lease' THEN ARRAY['leases_' || p_slot]
    END
$$;

-- Whether any child of a ring slot holds a row.
CREATE OR REPLACE FUNCTION awa._slot_has_rows_v1(p_ring text, p_slot integer)
 RETURNS boolean
 LANGUAGE plpgsql
 STABLE
AS $$
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

-- Advance a ring to its next slot once its current slot is at least p_interval seconds old on
-- the database clock ('skipped_recent' before; 0: whatever its age), so that a new leader, or
-- awa_maintenance --once from cron, keeps the cadence instead of rotating every ring at once.
-- Rotates only when the incoming slot is empty (else 'skipped_busy': it still waits for prune)
-- and the current slot holds something (else 'skipped_idle': an idle ring stops rotating). The
-- append to the rotation ledger is a compare-and-swap on its primary key. Returns 'rotated',
-- 'skipped_busy', 'skipped_idle', 'skipped_recent' or 'skipped_locked' (another rotate or prune
-- of this ring is running).
CREATE OR REPLACE FUNCTION awa.rotate_v2(p_ring text, p_interval double precision DEFAULT 0)
 RETURNS text
 LANGUAGE plpgsql
AS $$
DECLARE
    v_count integer;
    v_gen bigint;
    v_slot integer;
    v_at timestamptz;
    v_next integer;
BEGIN
    v_count := awa._ring_lock_v1(p_ring);
    IF v_count IS NULL THEN
        RETURN 'skipped_locked';
    END IF;
    SELECT generation, slot, rotated_at INTO v_gen, v_slot, v_at
    FROM awa.ring_rotations WHERE ring = p_ring ORDER BY generation DESC LIMIT 1;
    IF now() - v_at < make_interval(secs => LEAST(GREATEST(COALESCE(p_interval, 0), 0),
                                                  awa._max_seconds_v1())) THEN
        RETURN 'skipped_recent';
    END IF;
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

-- Claim-ring rotation at any number of lanes (awa.rotate_v3, same arguments and outcomes):
--
-- 1. A ring whose current slot holds only cursor markers is idle: it stops rotating. Before,
--    the markers a rotation appends made the new slot look busy, so the ring rotated every
--    CLAIM_ROTATE_INTERVAL for ever, on an idle database too.
-- 2. Markers go to the lanes claimed from in the slot just left (a real claim there), not to
--    every lane: the rotation locks each lane it marks until it commits, and claims pass over
--    locked lanes, so with 40,000 lanes (10,000 queues) every rotation took 0.6 s during which
--    claims came back empty. A lane without a marker in the current slot reads its cursor
--    from every slot on its next claim (the cursor is the same); a slot's prune still appends
--    a marker for each cursor in the slot it truncates.
CREATE OR REPLACE FUNCTION awa.rotate_v3(p_ring text, p_interval double precision DEFAULT 0)
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
DECLARE
    v_outcome text;
    v_lanes integer[];
    v_left integer;
BEGIN
    PERFORM awa._require_read_committed_v1('awa.rotate_v3');
    IF p_ring = 'claim' THEN
        SELECT g.slot INTO v_left FROM awa.ring_rotations g
        WHERE g.ring = 'claim' ORDER BY g.generation DESC LIMIT 1;
        IF NOT EXISTS (SELECT 1 FROM awa.claims c WHERE c.claim_slot = v_left AND c.job_id > 0)
        THEN
            RETURN 'skipped_idle';
        END IF;
    END IF;
    v_outcome := awa.rotate_v2(p_ring, p_interval);
    IF v_outcome <> 'rotated' OR p_ring <> 'claim' THEN
        RETURN v_outcome;
    END IF;
    v_lanes := ARRAY(SELECT l.lane_id FROM awa.queue_lanes l
                     WHERE l.lane_id IN (SELECT c.lane_id FROM awa.claims c
                                         WHERE c.claim_slot = v_left AND c.job_id > 0)
                     ORDER BY l.lane_id
                     FOR UPDATE SKIP LOCKED);
    -- Locked: a new statement sees every claim committed before the locks were taken.
    WITH cur AS (
        SELECT g.generation, g.slot FROM awa.ring_rotations g
        WHERE g.ring = 'claim' ORDER BY g.generation DESC LIMIT 1
    ), tops AS (
        SELECT l.lane_id,
               GREATEST(COALESCE(f.floor_seq, 0), COALESCE(t.lane_seq, 0)) AS top
        FROM unnest(v_lanes) AS l(lane_id)
        LEFT JOIN LATERAL (
            SELECT c.lane_seq FROM awa.claims c
            WHERE c.lane_id = l.lane_id ORDER BY c.lane_seq DESC LIMIT 1) t ON true
        LEFT JOIN awa.lane_floors f ON f.lane_id = l.lane_id
    ), markers AS (
        INSERT INTO awa.claims (claim_slot, claim_generation, job_id, run_lease, ready_slot,
                                ready_generation, lane_id, lane_seq, attempt)
        SELECT cur.slot, cur.generation, -t.lane_id, t.top, -1, -1, t.lane_id, t.top, 0
        FROM tops t CROSS JOIN cur
        WHERE t.top > 0
        ON CONFLICT DO NOTHING
        RETURNING claim_slot, job_id, run_lease
    )
    INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome)
    SELECT m.claim_slot, m.job_id, m.run_lease, 'marker' FROM markers m
    ON CONFLICT DO NOTHING;
    RETURN v_outcome;
END
$$;

-- Why a sealed slot cannot be truncated yet (NULL when it can). Checked before and again after
-- the slot's children are locked. VOLATILE: each statement reads in a snapshot taken after its
-- locks, so a prune of another ring committed while it waited is seen whole.
CREATE OR REPLACE FUNCTION awa._prune_blocker_v1(p_ring text, p_slot integer)
 RETURNS text
 LANGUAGE plpgsql
 VOLATILE
AS $$
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

-- Carry-forward keeps the generation a claim was made in (see the top of this file).
CREATE OR REPLACE FUNCTION awa._carry_claims_v1(p_slot integer)
 RETURNS integer
 LANGUAGE plpgsql
AS $$
DECLARE
    v_cur integer;
    v_n integer;
BEGIN
    SELECT slot INTO v_cur
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
            lane_id, lane_seq, attempt, claimed_at, deadline_at, worker_id, kind)
        SELECT v_cur, o.claim_generation, o.job_id, o.run_lease, o.ready_slot,
               o.ready_generation, o.lane_id, o.lane_seq, o.attempt, o.claimed_at,
               o.deadline_at, o.worker_id, o.kind
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
--
-- the ring lock has a key space of its own (open
-- producer transactions on the first lanes no longer make it skip); READ COMMITTED is required
-- (the gates are re-checked with a fresh snapshot after the lock); and before a claim slot is
-- truncated, each lane whose cursor lies in it gets a closed marker claim at that position in
-- the current slot (append-only, instead of updating lane_floors in place).
CREATE OR REPLACE FUNCTION awa.prune_v1(p_ring text, p_lock_timeout_ms integer DEFAULT 50)
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
DECLARE
    v_count integer;
    v_gen bigint;
    v_cur integer;
    v_slot integer;
    v_why text;
    v_table text;
    v_outcome text;
BEGIN
    PERFORM awa._require_read_committed_v1('awa.prune_v1');
    v_count := awa._ring_lock_v1(p_ring);
    IF v_count IS NULL THEN
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
                    WITH tops AS (
                        SELECT c.lane_id, max(c.lane_seq) AS top
                        FROM awa.claims c WHERE c.claim_slot = v_slot GROUP BY c.lane_id
                    ), keep AS (
                        SELECT t.lane_id, t.top FROM tops t
                        WHERE t.top > COALESCE((
                                  SELECT max(c.lane_seq) FROM awa.claims c
                                  WHERE c.lane_id = t.lane_id AND c.claim_slot <> v_slot), 0)
                          AND t.top > COALESCE((
                                  SELECT f.floor_seq FROM awa.lane_floors f
                                  WHERE f.lane_id = t.lane_id), 0)
                    ), markers AS (
                        INSERT INTO awa.claims (claim_slot, claim_generation, job_id, run_lease,
                                                ready_slot, ready_generation, lane_id, lane_seq,
                                                attempt)
                        SELECT v_cur, v_gen, -k.lane_id, k.top, -1, -1, k.lane_id, k.top, 0
                        FROM keep k
                        ON CONFLICT DO NOTHING
                        RETURNING job_id, run_lease
                    )
                    INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome)
                    SELECT v_cur, m.job_id, m.run_lease, 'marker' FROM markers m
                    ON CONFLICT DO NOTHING;
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

-- Promotion -------------------------------------------------------------------------------------

-- Move up to p_limit due scheduled/retryable jobs of unpaused queues into the ready ring, oldest
-- first, never twice (rows are locked SKIP LOCKED and deleted in the same transaction). A
-- (queue, priority) whose every enqueue shard is held by open producer transactions is skipped
-- and retried on the next call. Returns the number of jobs promoted.
--
-- A a (queue, priority) whose every lane is held by open producer
-- transactions no longer stalls the others: its rows are skipped and the next due rows of other
-- groups are promoted in the same call, up to p_limit in all.
CREATE OR REPLACE FUNCTION awa.promote_v1(p_limit integer DEFAULT 4096)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
#variable_conflict use_column
DECLARE
    g record;
    v_lane integer;
    v_jobs awa.job_body[];
    v_total integer := 0;
    v_busy text[] := '{}';
    v_seen boolean;
BEGIN
    LOOP
        v_seen := false;
        FOR g IN
            WITH due AS (
                SELECT d.job_id, d.queue, d.priority, d.run_at
                FROM awa.deferred_jobs d
                WHERE d.run_at <= now()
                  AND NOT ((d.queue || ':' || d.priority) = ANY (v_busy))
                  AND NOT EXISTS (
                      SELECT 1 FROM awa.queue_meta m WHERE m.queue = d.queue AND m.paused)
                ORDER BY d.run_at, d.job_id
                LIMIT p_limit - v_total
                FOR UPDATE SKIP LOCKED
            )
            SELECT due.queue, due.priority,
                   array_agg(due.job_id ORDER BY due.run_at, due.job_id) AS ids
            FROM due
            GROUP BY due.queue, due.priority
            ORDER BY due.queue, due.priority
        LOOP
            v_seen := true;
            v_lane := awa._lane_for_v1(g.queue, g.priority, false);
            IF v_lane IS NULL THEN
                v_busy := v_busy || (g.queue || ':' || g.priority);
                CONTINUE;
            END IF;
            WITH moved AS (
                DELETE FROM awa.deferred_jobs d WHERE d.job_id = ANY (g.ids) RETURNING d.*
            ), retried AS (
                -- The queue charts' retries per minute of failure (awa.queue_minute_retries).
                INSERT INTO awa.queue_minute_retries AS t (queue, minute, retries)
                SELECT m.queue, date_trunc('minute', m.deferred_at), count(*)
                FROM moved m
                WHERE m.state = 'retryable' AND m.deferred_at >= now() - interval '25 hours'
                GROUP BY m.queue, date_trunc('minute', m.deferred_at)
                ON CONFLICT (queue, minute) DO UPDATE SET retries = t.retries + excluded.retries
            )
            SELECT array_agg(ROW(m.job_id, m.kind, m.queue, m.priority, m.args, m.attempt,
                                 m.max_attempts, m.run_lease, m.run_at, m.created_at,
                                 m.deadline_secs, m.metadata, m.tags, m.errors,
                                 m.progress)::awa.job_body
                             ORDER BY m.run_at, m.job_id)
            INTO v_jobs FROM moved m;
            PERFORM awa._append_ready_v1(v_lane, v_jobs);
            v_total := v_total + COALESCE(cardinality(v_jobs), 0);
        END LOOP;
        -- Done when nothing was due, or the limit is reached. Otherwise every pass either moved
        -- rows or found more busy groups (a finite set), so this ends.
        EXIT WHEN NOT v_seen OR v_total >= p_limit;
    END LOOP;
    RETURN v_total;
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
CREATE OR REPLACE FUNCTION awa.rescue_v1(
    p_staleness double precision, p_limit integer DEFAULT 500,
    p_backoff_base double precision DEFAULT 1.0)
 RETURNS TABLE(job_id bigint, run_lease bigint, reason text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
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

-- Retention ----------------------------------------------------------------------------------------

-- Delete up to p_limit dead-lettered jobs older than p_retention seconds; returns the count.
-- An expired step of a workflow ends there as failed (awa._workflow_settle_v1).
CREATE OR REPLACE FUNCTION awa.dlq_expire_v1(
    p_retention double precision, p_limit integer DEFAULT 1000)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
DECLARE
    v_ids bigint[];
BEGIN
    WITH gone AS (
        DELETE FROM awa.dlq_entries WHERE job_id IN (
            SELECT job_id FROM awa.dlq_entries
            WHERE dlq_at < now() - make_interval(secs => p_retention)
            ORDER BY dlq_at LIMIT p_limit)
        RETURNING job_id)
    SELECT array_agg(g.job_id ORDER BY g.job_id) INTO v_ids FROM gone g;
    PERFORM awa._workflow_settle_as_v1(v_ids, 'failed');
    RETURN COALESCE(cardinality(v_ids), 0);
END
$$;

-- Delete runtime rows of processes not seen for p_retention seconds, prune-ledger rows older
-- than a day, and attempt_state rows of attempts that are no longer open (left by a heartbeat
-- racing a finalization). Returns the number of rows removed.
CREATE OR REPLACE FUNCTION awa.cleanup_v1(p_retention double precision)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
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

-- Leadership ----------------------------------------------------------------------------------------

-- The holder of the maintenance leader lock (pg_try_advisory_lock(4708303813012965710), see
-- queries/storage.sql: leader_try) and whether it is alive. A holder that is an awa process
-- (application_name 'awa:worker:<instance id>') whose runtime row is older than p_staleness
-- seconds, or gone, is frozen (SIGSTOP), wedged, or partitioned while its connection lives on:
-- its backend is terminated so that the lock is freed and a live process takes over. action is
-- 'alive', 'terminated', 'not_permitted' (pg_terminate_backend refused: another role without
-- pg_signal_backend) or 'foreign' (not an awa process: left alone).
CREATE OR REPLACE FUNCTION awa.leader_takeover_v1(p_staleness double precision)
 RETURNS TABLE(pid integer, instance text, seen_ago double precision, action text)
 LANGUAGE plpgsql
AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT l.pid AS holder, a.application_name AS app
        FROM pg_locks l
        JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
          AND l.classid = (4708303813012965710 >> 32)::oid
          AND l.objid = (4708303813012965710 & 4294967295)::oid
          AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
    LOOP
        pid := r.holder;
        instance := r.app;
        seen_ago := NULL;
        IF r.app IS NULL OR r.app !~ '^awa:worker:[0-9a-f-]{36}$' THEN
            action := 'foreign';
            RETURN NEXT;
            CONTINUE;
        END IF;
        SELECT extract(epoch FROM now() - i.last_seen_at) INTO seen_ago
        FROM awa.runtime_instances i WHERE i.instance_id = substr(r.app, 12)::uuid;
        IF seen_ago IS NOT NULL AND seen_ago <= p_staleness THEN
            action := 'alive';
        ELSE
            BEGIN
                action := CASE WHEN pg_terminate_backend(r.holder) THEN 'terminated'
                               ELSE 'not_permitted' END;
            EXCEPTION WHEN insufficient_privilege THEN
                action := 'not_permitted';
            END;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;

-- Runtime instances ---------------------------------------------------------------------------

-- Register or refresh one worker process (a slow timer, not the hot path).
CREATE OR REPLACE FUNCTION awa.runtime_upsert_v1(
    p_instance uuid, p_hostname text, p_pid integer, p_queues jsonb, p_concurrency integer,
    p_version text)
 RETURNS void
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    INSERT INTO awa.runtime_instances AS r (
        instance_id, hostname, pid, queues, concurrency, version)
    VALUES (p_instance, p_hostname, p_pid, p_queues, p_concurrency, p_version)
    ON CONFLICT (instance_id) DO UPDATE
    SET last_seen_at = now(), queues = EXCLUDED.queues, concurrency = EXCLUDED.concurrency
$$;

-- Remove a worker process's row (clean exit).
CREATE OR REPLACE FUNCTION awa.runtime_remove_v1(p_instance uuid)
 RETURNS void
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    DELETE FROM awa.runtime_instances WHERE instance_id = p_instance
$$;

-- How long a leader elected now holds back (seconds; 0: not at all): the staleness bound after
-- the database's start, while a process seen before that start may still be alive. Such a
-- process could not reach the database while it was down, so its runtime row and heartbeats
-- are stale without it being dead, and it needs that long to reconnect and take its permits and
-- serial keys back; a database that started empty (no row from before) holds nothing back.
CREATE OR REPLACE FUNCTION awa.leader_grace_v1(p_staleness double precision)
 RETURNS double precision
 LANGUAGE sql
 STABLE
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    SELECT CASE
        WHEN EXISTS (SELECT 1 FROM awa.runtime_instances
                     WHERE last_seen_at < pg_postmaster_start_time())
        THEN GREATEST(0, LEAST(p_staleness, awa._max_seconds_v1())
                         - extract(epoch FROM now() - pg_postmaster_start_time()))::float8
        ELSE 0::float8
    END
$$;

-- Mark one process as the maintenance leader (and no other), for the admin and the health
-- checks: run by a process that just took the leader's lock. Its row is refreshed too: it is
-- alive, and a row left stale by an outage would have other processes end it as a frozen
-- leader (awa.leader_takeover_v1) before its own refresh comes round.
CREATE OR REPLACE FUNCTION awa.leader_mark_v1(p_instance uuid)
 RETURNS void
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    UPDATE awa.runtime_instances
    SET is_leader = (instance_id = p_instance),
        last_seen_at = CASE WHEN instance_id = p_instance THEN now() ELSE last_seen_at END
    WHERE is_leader OR instance_id = p_instance
$$;

-- One minute's outcomes per queue, for the queue charts' roll-up: the jobs each queue finished
-- in [p_minute, p_minute + 1 minute) (index ranges of terminal history by queue, state and
-- finalized_at, and of the DLQ by queue and dlq_at), and the p50 and p95 of the queue wait
-- (started minus run_at) and run time (finished minus started) of the attempts that finished,
-- over at most 2,000 of the minute's completed and failed jobs; and the retries it scheduled
-- (attempts that failed in the minute and run again): those promotion has moved back to the
-- queue since (awa.queue_minute_retries) and those still waiting out their backoff (retryable
-- rows of awa.deferred_jobs written in the minute). Only queues with an outcome or a retry.
CREATE OR REPLACE FUNCTION awa._queue_minute_outcomes_v2(p_minute timestamptz)
 RETURNS TABLE(
    queue text, completed integer, failed integer, cancelled integer, dead_lettered integer,
    retried integer, wait_p50 double precision, wait_p95 double precision,
    run_p50 double precision, run_p95 double precision)
 LANGUAGE sql
 STABLE
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    SELECT q.queue, o.completed, o.failed, o.cancelled, o.dead_lettered, o.retried,
           t.wait_p50, t.wait_p95, t.run_p50, t.run_p95
    FROM (SELECT DISTINCT ql.queue FROM awa.queue_lanes ql) q
    CROSS JOIN LATERAL (
        SELECT
            (SELECT count(*) FROM awa.done_entries d
             WHERE d.queue = q.queue AND d.state = 'completed' AND d.finalized_at >= p_minute
               AND d.finalized_at < p_minute + interval '1 minute')::integer AS completed,
            (SELECT count(*) FROM awa.done_entries d
             WHERE d.queue = q.queue AND d.state = 'failed' AND d.finalized_at >= p_minute
               AND d.finalized_at < p_minute + interval '1 minute')::integer AS failed,
            (SELECT count(*) FROM awa.done_entries d
             WHERE d.queue = q.queue AND d.state = 'cancelled' AND d.finalized_at >= p_minute
               AND d.finalized_at < p_minute + interval '1 minute')::integer AS cancelled,
            (SELECT count(*) FROM awa.dlq_entries x
             WHERE x.queue = q.queue AND x.dlq_at >= p_minute
               AND x.dlq_at < p_minute + interval '1 minute')::integer AS dead_lettered,
            (COALESCE((SELECT r.retries FROM awa.queue_minute_retries r
                       WHERE r.queue = q.queue AND r.minute = p_minute), 0)
             + (SELECT count(*) FROM awa.deferred_jobs dj
                WHERE dj.queue = q.queue AND dj.state = 'retryable'
                  AND dj.deferred_at >= p_minute
                  AND dj.deferred_at < p_minute + interval '1 minute'))::integer AS retried
    ) o
    LEFT JOIN LATERAL (
        SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s.wait) AS wait_p50,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY s.wait) AS wait_p95,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY s.run) AS run_p50,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY s.run) AS run_p95
        FROM (
            SELECT GREATEST(extract(epoch FROM d.attempted_at - COALESCE(d.run_at, e.run_at)),
                            0)::double precision AS wait,
                   GREATEST(extract(epoch FROM d.finalized_at - d.attempted_at), 0)
                       ::double precision AS run
            FROM awa.done_entries d
            LEFT JOIN awa.ready_entries e
              ON d.lane_id IS NOT NULL AND e.lane_id = d.lane_id
             AND e.lane_seq = d.lane_seq AND e.ready_slot = d.ready_slot
            WHERE d.queue = q.queue AND d.state IN ('completed', 'failed')
              AND d.finalized_at >= p_minute
              AND d.finalized_at < p_minute + interval '1 minute'
              AND d.attempted_at IS NOT NULL
            LIMIT 2000) s
    ) t ON o.completed + o.failed > 0
    WHERE o.completed + o.failed + o.cancelled + o.dead_lettered + o.retried > 0
$$;

-- The queue charts' roll-up (awa.queue_minutes), run by the leader every few seconds.
--
-- First count: every minute that ended at least 10 s before p_now (default now(); a test may
-- pass an earlier time within 25 hours, never one ahead of the clock) and is after the last minute counted, at most the
-- last 60: each queue's outcomes and times (awa._queue_minute_outcomes_v2); the newest minute
-- also takes each queue's depth, retryable jobs and oldest available job's age as they are
-- now. A row only for a queue with something to show, and the minute's marker row (queue '':
-- available 0 when the depth was read for the minute, NULL when not).
--
-- Second count, 5 minutes after a minute ends: its outcomes and times again, so that a job
-- whose transaction began in the minute but committed after the first count is counted (a
-- transaction longer than that is not); the marker's recounted then reads true. A row changes
-- only when a count grew: a count never shrinks (dead letters retried or purged since, say,
-- still went to the DLQ in that minute).
--
-- Writes are idempotent (ON CONFLICT), so a second caller, or a retry, changes nothing. The
-- function waits at most 200 ms for a lock (it is retried on the leader's next turn, without
-- holding up promotion). Rows older than 25 hours are deleted. Returns the minutes counted.
-- Fold the terminal-count deltas of awa.done_counts (maintenance leader, every 15 s): for each
-- (queue, state, ready slot) with at least p_min deltas since its latest fold, append a fold
-- whose n is that fold's plus every delta since whose transaction ended before this call's
-- snapshot xmin (folded_before), which no transaction still running can join. Appends only:
-- the rows go with their slot's truncation. Returns the folds written.
CREATE OR REPLACE FUNCTION awa.done_counts_fold_v1(p_min integer DEFAULT 256)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
DECLARE
    v_before xid8 := pg_snapshot_xmin(pg_current_snapshot());
    v_n integer;
BEGIN
    IF p_min IS NULL OR p_min < 1 THEN
        RAISE EXCEPTION 'p_min: must be a positive integer, not %', quote_nullable(p_min)
            USING ERRCODE = '22023';
    END IF;
    WITH fresh AS (
        SELECT l.queue, l.state, l.ready_slot, COALESCE(l.fold_n, 0) + d.n AS n
        FROM awa._done_count_folds_v1() l
        CROSS JOIN LATERAL (
            SELECT sum(c.n) AS n, count(*) AS deltas FROM awa.done_counts c
            WHERE c.queue = l.queue AND c.state = l.state AND c.ready_slot = l.ready_slot
              AND c.folded_before IS NULL
              AND c.xid >= COALESCE(l.folded_before, '0'::xid8) AND c.xid < v_before) d
        WHERE d.deltas >= p_min
    )
    INSERT INTO awa.done_counts (ready_slot, queue, state, n, folded_before)
    SELECT f.ready_slot, f.queue, f.state, f.n, v_before FROM fresh f;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

CREATE OR REPLACE FUNCTION awa.queue_minutes_record_v1(p_now timestamptz DEFAULT NULL)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET jit TO 'off'
 SET lock_timeout TO '200ms'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
DECLARE
    v_now timestamptz := COALESCE(p_now, now());
    v_last timestamptz := date_trunc('minute', COALESCE(p_now, now()) - interval '70 seconds');
    v_minute timestamptz;
    v_n integer := 0;
BEGIN
    IF v_now > clock_timestamp() OR v_now < clock_timestamp() - interval '25 hours' THEN
        -- Minutes counted ahead of the clock would never be counted again.
        RAISE EXCEPTION
            'awa: queue_minutes_record_v1: p_now % is ahead of the clock or older than 25 hours',
            p_now USING ERRCODE = '22023';
    END IF;
    SELECT max(m.minute) + interval '1 minute' INTO v_minute
    FROM awa.queue_minutes m WHERE m.queue = '';
    v_minute := GREATEST(COALESCE(v_minute, v_last), v_last - interval '59 minutes');
    WHILE v_minute <= v_last LOOP
        INSERT INTO awa.queue_minutes AS m (
            queue, minute, completed, failed, cancelled, dead_lettered, retried,
            wait_p50, wait_p95, run_p50, run_p95, available, retryable, oldest_seconds)
        SELECT COALESCE(o.queue, l.queue), v_minute, COALESCE(o.completed, 0),
               COALESCE(o.failed, 0), COALESCE(o.cancelled, 0), COALESCE(o.dead_lettered, 0),
               COALESCE(o.retried, 0), o.wait_p50, o.wait_p95, o.run_p50, o.run_p95,
               l.available, l.retryable, l.lag_seconds
        FROM awa._queue_minute_outcomes_v2(v_minute) o
        FULL JOIN (
            SELECT lag.queue, lag.available, COALESCE(r.n, 0) AS retryable, lag.lag_seconds
            FROM awa.queue_lag_v1() lag
            LEFT JOIN (
                SELECT dj.queue, count(*) AS n FROM awa.deferred_jobs dj
                WHERE dj.state = 'retryable' GROUP BY dj.queue
            ) r ON r.queue = lag.queue
            WHERE v_minute = v_last AND (lag.available > 0 OR r.n > 0)
        ) l ON l.queue = o.queue
        ON CONFLICT (queue, minute) DO NOTHING;
        INSERT INTO awa.queue_minutes (queue, minute, completed, failed, cancelled, dead_lettered,
                                       available)
        VALUES ('', v_minute, 0, 0, 0, 0, CASE WHEN v_minute = v_last THEN 0 END)
        ON CONFLICT (queue, minute) DO NOTHING;
        v_n := v_n + 1;
        v_minute := v_minute + interval '1 minute';
    END LOOP;
    FOR v_minute IN
        SELECT m.minute FROM awa.queue_minutes m
        WHERE m.queue = '' AND NOT m.recounted
          AND m.minute <= date_trunc('minute', v_now - interval '6 minutes')
        ORDER BY m.minute
        LIMIT 60
    LOOP
        INSERT INTO awa.queue_minutes AS m (
            queue, minute, completed, failed, cancelled, dead_lettered, retried,
            wait_p50, wait_p95, run_p50, run_p95)
        SELECT o.queue, v_minute, o.completed, o.failed, o.cancelled, o.dead_lettered,
               o.retried, o.wait_p50, o.wait_p95, o.run_p50, o.run_p95
        FROM awa._queue_minute_outcomes_v2(v_minute) o
        ON CONFLICT (queue, minute) DO UPDATE
        SET completed = GREATEST(m.completed, excluded.completed),
            failed = GREATEST(m.failed, excluded.failed),
            cancelled = GREATEST(m.cancelled, excluded.cancelled),
            dead_lettered = GREATEST(m.dead_lettered, excluded.dead_lettered),
            retried = GREATEST(m.retried, excluded.retried),
            wait_p50 = excluded.wait_p50, wait_p95 = excluded.wait_p95,
            run_p50 = excluded.run_p50, run_p95 = excluded.run_p95
        WHERE excluded.completed > m.completed OR excluded.failed > m.failed
           OR excluded.cancelled > m.cancelled OR excluded.dead_lettered > m.dead_lettered
           OR excluded.retried > m.retried;
        UPDATE awa.queue_minutes SET recounted = true WHERE queue = '' AND minute = v_minute;
        v_n := v_n + 1;
    END LOOP;
    IF v_n > 0 THEN
        DELETE FROM awa.queue_minutes WHERE minute < v_now - interval '25 hours';
        DELETE FROM awa.queue_minute_retries WHERE minute < v_now - interval '25 hours';
    END IF;
    RETURN v_n;
END
$$;
