-- awa_django migration 0004: a cheap claim and a lean finalize (issue 14).
--
-- 1. Plans. PL/pgSQL caches its statements' plans, but for statements over the ring-partitioned
--    tables the plan cache kept choosing custom plans (a generic plan's estimate counts every
--    partition) and so planned each statement again on every call: claim_v1 spent ~1.1 ms and
--    finalize_v1 ~1.5 ms of server time on one job, most of it planning. The v2 entry points run
--    with plan_cache_mode = force_generic_plan: partitions are pruned when the plan starts.
-- 2. The lane cursor. claim_v1 derived each lane's cursor from every claim slot (8 partition
--    probes per lane) and probed every ready slot (16) for each lane's head. claim_v2 reads the
--    cursor from the current claim slot (one probe), falling back to every slot only for a lane
--    with no claim there yet, and reads heads only when more than one lane has work, all in one
--    statement. A lane's rows are still read from every ready slot: a producer in a REPEATABLE
--    READ transaction appends to the queue slot its snapshot saw, which can be older than the
--    slot of rows before it in the lane.
--
--    Why the current slot is enough: claims of one lane are made under its row lock, and every
--    claimer now reads the current claim slot after taking that lock (claim_v1 is redefined
--    below to do the same: it read the slot first, so its claim could land in the slot before
--    the current one), so a lane's claimed positions only grow with the claim ring's
--    generation. The rows that break this are claims carried forward by prune (an open
--    attempt's old position, re-appended to the current slot): carry-forward now keeps the
--    generation the claim was made in (_carry_claims_v1 is redefined below; nothing else reads
--    claim_generation). So the lane's highest claim in the current slot is its cursor when its
--    generation is the slot's; otherwise (no claim of the lane in this slot yet, or only
--    carried ones) the cursor comes from every slot and the lane's floor, as before. Claims of
--    the current slot written before this migration (carried ones among them) lose their
--    generation once, below, so each lane takes the full path until its next claim.
-- 3. Finalize. finalize_v2 writes a batch of plain completions (the common case: no attempt
--    state, no other outcome) with one statement over the claim and terminal planes only; any
--    other batch goes through finalize_v1. Either way an attempt not found open where it was
--    looked for is looked for again, up to three times: a carry-forward that committed while a
--    pass waited for it has moved the claim (finalize_v1 looked twice, and reported such a live
--    attempt stale).
-- 4. rotate_v3: a claim-ring rotation leaves a closed marker at every lane's cursor in the new
--    slot, so that idle lanes, and every lane right after a rotation, keep the one-probe cursor.
--
-- claim_v1 and _carry_claims_v1 are redefined in place (same signatures and results; unapplying
-- this migration keeps the new bodies, which are correct with or without claim_v2).

-- Serialise with rotate and prune of the claim ring (no carry-forward or rotation meanwhile)
-- while the claims of the current slot lose their generation.
SELECT pg_advisory_xact_lock(4282178, awa._ring_key_v1('claim'));

UPDATE awa.claims c
SET claim_generation = -1
FROM (SELECT r.generation, r.slot FROM awa.ring_rotations r
      WHERE r.ring = 'claim' ORDER BY r.generation DESC LIMIT 1) cur
WHERE c.claim_slot = cur.slot AND c.claim_generation = cur.generation;


CREATE OR REPLACE FUNCTION awa.claim_v1(
    p_queue text, p_max integer, p_worker uuid DEFAULT NULL,
    p_aging_secs double precision DEFAULT 60, p_default_deadline double precision DEFAULT NULL)
RETURNS TABLE (job_id bigint, run_lease bigint, attempt smallint, max_attempts smallint,
               claim_slot integer, kind text, args jsonb, queue text, priority smallint,
               deadline_at timestamptz, timeout_secs double precision, progress jsonb,
               metadata jsonb, tags text[], errors jsonb)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_remaining integer := p_max;
    v_got integer;
    v_cursor bigint;
    v_cslot integer;
    v_cgen bigint;
    v_aging double precision := GREATEST(COALESCE(p_aging_secs, 60), 0.001);
    v_default double precision := awa._deadline_secs_v1(p_default_deadline);
    r record;
BEGIN
    IF p_max IS NULL OR p_max <= 0 THEN
        RETURN;
    END IF;
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'awa.claim_v1 needs READ COMMITTED isolation' USING ERRCODE = '25000';
    END IF;
    IF EXISTS (SELECT 1 FROM awa.queue_meta m WHERE m.queue = p_queue AND m.paused) THEN
        RETURN;
    END IF;

    FOR r IN
        WITH k AS MATERIALIZED (
            SELECT l.lane_id, l.priority, l.enqueue_seq, awa.lane_cursor_v1(l.lane_id) AS c
            FROM awa.queue_lanes l
            WHERE l.queue = p_queue
        )
        SELECT k.lane_id
        FROM k
        CROSS JOIN LATERAL (
            SELECT e.run_at FROM awa.ready_entries e
            WHERE e.lane_id = k.lane_id AND e.lane_seq > k.c
              AND NOT EXISTS (
                  SELECT 1 FROM awa.ready_tombstones t
                  WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                    AND t.ready_slot = e.ready_slot)
            ORDER BY e.lane_seq LIMIT 1) h
        WHERE COALESCE(pg_sequence_last_value(k.enqueue_seq), 0) > k.c
        ORDER BY k.priority + floor(extract(epoch FROM now() - h.run_at) / v_aging) DESC,
                 h.run_at, k.lane_id
    LOOP
        PERFORM 1 FROM awa.queue_lanes l WHERE l.lane_id = r.lane_id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        -- After the lane lock: claims of a lane go to the claim slot current when they are made.
        SELECT r2.generation, r2.slot INTO v_cgen, v_cslot
        FROM awa.ring_rotations r2 WHERE r2.ring = 'claim' ORDER BY r2.generation DESC LIMIT 1;
        v_cursor := awa.lane_cursor_v1(r.lane_id);
        RETURN QUERY
        WITH picked AS MATERIALIZED (
            SELECT e.*, COALESCE(awa._deadline_secs_v1(e.deadline_secs), v_default) AS timeout
            FROM awa.ready_entries e
            WHERE e.lane_id = r.lane_id AND e.lane_seq > v_cursor
              AND NOT EXISTS (
                  SELECT 1 FROM awa.ready_tombstones t
                  WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                    AND t.ready_slot = e.ready_slot)
            ORDER BY e.lane_seq
            LIMIT v_remaining
        ), ins AS (
            INSERT INTO awa.claims (
                claim_slot, claim_generation, job_id, run_lease, ready_slot, ready_generation,
                lane_id, lane_seq, attempt, deadline_at, worker_id, kind)
            SELECT v_cslot, v_cgen, p.job_id, p.run_lease + 1, p.ready_slot, p.ready_generation,
                   p.lane_id, p.lane_seq, p.attempt + 1,
                   now() + make_interval(secs => p.timeout),
                   p_worker, p.kind
            FROM picked p
            RETURNING lane_seq, deadline_at
        )
        SELECT p.job_id, p.run_lease + 1, (p.attempt + 1)::smallint, p.max_attempts, v_cslot,
               p.kind, p.args, p.queue, p.priority, i.deadline_at, p.timeout, p.progress,
               p.metadata, p.tags, p.errors
        FROM picked p JOIN ins i ON i.lane_seq = p.lane_seq
        ORDER BY p.lane_seq;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_remaining := v_remaining - v_got;
        EXIT WHEN v_remaining <= 0;
    END LOOP;
END
$$;


-- Carry-forward keeps the generation a claim was made in (see the top of this file).
CREATE OR REPLACE FUNCTION awa._carry_claims_v1(p_slot integer)
RETURNS integer
LANGUAGE plpgsql AS $$
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

-- Rotate a ring (awa.rotate_v2: same arguments and outcomes). A claim ring rotation also appends,
-- in the same transaction, a closed marker claim at the cursor of every lane it can lock
-- (FOR UPDATE SKIP LOCKED: a lane being claimed right now gets a real claim instead), so that
-- claim_v2 finds each lane's cursor with one probe of the new slot, idle lanes included, instead
-- of reading every slot until the lane's next claim. Needs READ COMMITTED (SQLSTATE 25000
-- otherwise): a marker computed from an older snapshot would put a cursor below claims made
-- since, and hand their jobs out again.
CREATE FUNCTION awa.rotate_v3(p_ring text, p_interval double precision DEFAULT 0)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_outcome text;
    v_lanes integer[];
BEGIN
    PERFORM awa._require_read_committed_v1('awa.rotate_v3');
    v_outcome := awa.rotate_v2(p_ring, p_interval);
    IF v_outcome <> 'rotated' OR p_ring <> 'claim' THEN
        RETURN v_outcome;
    END IF;
    v_lanes := ARRAY(SELECT l.lane_id FROM awa.queue_lanes l ORDER BY l.lane_id
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
        ON CONFLICT DO NOTHING
        RETURNING claim_slot, job_id, run_lease
    )
    INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome)
    SELECT m.claim_slot, m.job_id, m.run_lease, 'marker' FROM markers m
    ON CONFLICT DO NOTHING;
    RETURN v_outcome;
END
$$;

-- Claim up to p_max available jobs of one queue for worker p_worker, as one short transaction;
-- the same contract and results as claim_v1 (see its comment), at a fraction of its cost.
CREATE FUNCTION awa.claim_v2(
    p_queue text, p_max integer, p_worker uuid DEFAULT NULL,
    p_aging_secs double precision DEFAULT 60, p_default_deadline double precision DEFAULT NULL)
RETURNS TABLE (job_id bigint, run_lease bigint, attempt smallint, max_attempts smallint,
               claim_slot integer, kind text, args jsonb, queue text, priority smallint,
               deadline_at timestamptz, timeout_secs double precision, progress jsonb,
               metadata jsonb, tags text[], errors jsonb)
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_remaining integer := p_max;
    v_got integer;
    v_paused boolean;
    v_cursor bigint;
    v_cslot integer;
    v_cgen bigint;
    v_lanes integer[];
    v_priorities integer[];
    v_cursors bigint[];
    v_heads timestamptz[];
    v_head timestamptz;
    v_qslot integer;
    v_seq regclass;
    v_aging double precision := GREATEST(COALESCE(p_aging_secs, 60), 0.001);
    v_default double precision := awa._deadline_secs_v1(p_default_deadline);
    r record;
BEGIN
    IF p_max IS NULL OR p_max <= 0 THEN
        RETURN;
    END IF;
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'awa.claim_v2 needs READ COMMITTED isolation' USING ERRCODE = '25000';
    END IF;
    SELECT EXISTS (SELECT 1 FROM awa.queue_meta m WHERE m.queue = p_queue AND m.paused),
           c.generation, c.slot, q.slot
    INTO v_paused, v_cgen, v_cslot, v_qslot
    FROM (SELECT r2.generation, r2.slot FROM awa.ring_rotations r2
          WHERE r2.ring = 'claim' ORDER BY r2.generation DESC LIMIT 1) c,
         (SELECT r2.slot FROM awa.ring_rotations r2
          WHERE r2.ring = 'queue' ORDER BY r2.generation DESC LIMIT 1) q;
    IF v_paused THEN
        RETURN;
    END IF;

    -- Lanes with work: cursor below the lane's last enqueued position. The cursor read here,
    -- without the lane lock, only chooses and orders lanes: it is read again under the lock.
    SELECT array_agg(b.lane_id ORDER BY b.lane_id), array_agg(b.priority ORDER BY b.lane_id),
           array_agg(b.c ORDER BY b.lane_id)
    INTO v_lanes, v_priorities, v_cursors
    FROM (
        SELECT l.lane_id, l.priority, l.enqueue_seq,
               -- A function call, not sub-selects: only evaluated (and its partitions only
               -- opened) for a lane without a claim of this generation.
               COALESCE(x.fast, awa.lane_cursor_v1(l.lane_id)) AS c
        FROM awa.queue_lanes l
        LEFT JOIN LATERAL (
            SELECT CASE WHEN c.claim_generation = v_cgen THEN c.lane_seq END AS fast
            FROM awa.claims c
            WHERE c.claim_slot = v_cslot AND c.lane_id = l.lane_id
            ORDER BY c.lane_seq DESC LIMIT 1) x ON true
        -- A lane never enqueued to (its sequence never used) has no work and no cursor to read.
        WHERE l.queue = p_queue AND pg_sequence_last_value(l.enqueue_seq) IS NOT NULL
    ) b
    WHERE COALESCE(pg_sequence_last_value(b.enqueue_seq), 0) > b.c;
    -- Several lanes: order them by effective priority (priority + 1 per p_aging_secs that the
    -- lane's head has waited), then oldest head. Heads are looked for in the current queue
    -- slot first (one partition, one statement for all lanes); a lane with none there (its
    -- rows are older, or not committed yet) is read from every slot.
    IF cardinality(v_lanes) > 1 THEN
        SELECT array_agg(h.run_at ORDER BY u.i) INTO v_heads
        FROM unnest(v_lanes, v_cursors) WITH ORDINALITY AS u(lane_id, c, i)
        LEFT JOIN LATERAL (
            SELECT e.run_at FROM awa.ready_entries e
            WHERE e.ready_slot = v_qslot AND e.lane_id = u.lane_id AND e.lane_seq > u.c
              AND NOT EXISTS (
                  SELECT 1 FROM awa.ready_tombstones t
                  WHERE t.ready_slot = v_qslot AND t.lane_id = e.lane_id
                    AND t.lane_seq = e.lane_seq)
            ORDER BY e.lane_seq
            LIMIT 1) h ON true;
        FOR i IN 1..cardinality(v_lanes) LOOP
            CONTINUE WHEN v_heads[i] IS NOT NULL;
            SELECT e.run_at INTO v_head FROM awa.ready_entries e
            WHERE e.lane_id = v_lanes[i] AND e.lane_seq > v_cursors[i]
              AND NOT EXISTS (
                  SELECT 1 FROM awa.ready_tombstones t
                  WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                    AND t.ready_slot = e.ready_slot)
            ORDER BY e.lane_seq
            LIMIT 1;
            v_heads[i] := v_head;
        END LOOP;
    END IF;

    FOR r IN
        SELECT u.lane_id
        FROM unnest(v_lanes, v_priorities, v_heads) AS u(lane_id, priority, head)
        ORDER BY u.priority + floor(extract(epoch FROM now() - u.head) / v_aging) DESC NULLS LAST,
                 u.head, u.lane_id
    LOOP
        SELECT l.enqueue_seq INTO v_seq
        FROM awa.queue_lanes l WHERE l.lane_id = r.lane_id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        -- Under the lane lock, in a new statement (a snapshot with the previous claimer's
        -- commit): the claim slot this claim goes to, and the lane's cursor. The lane's highest
        -- claim in the current slot is its cursor when it was made in the slot's generation (a
        -- carried claim keeps the generation it was made in, and lies below any claim made
        -- since); otherwise the cursor comes from every slot and the lane's floor.
        SELECT c.generation, c.slot,
               CASE WHEN x.claim_generation = c.generation THEN x.lane_seq END
        INTO v_cgen, v_cslot, v_cursor
        FROM (SELECT r2.generation, r2.slot FROM awa.ring_rotations r2
              WHERE r2.ring = 'claim' ORDER BY r2.generation DESC LIMIT 1) c
        LEFT JOIN LATERAL (
            SELECT cl.lane_seq, cl.claim_generation FROM awa.claims cl
            WHERE cl.claim_slot = c.slot AND cl.lane_id = r.lane_id
            ORDER BY cl.lane_seq DESC LIMIT 1) x ON true;
        IF v_cursor IS NULL THEN
            v_cursor := awa.lane_cursor_v1(r.lane_id);
        END IF;
        -- The lane's rows after the cursor. First from the current queue slot, where they
        -- normally are: only the run of positions right after the cursor (cancelled rows
        -- count as present and are passed over), so that no position is ever skipped.
        RETURN QUERY
        WITH found AS MATERIALIZED (
            SELECT e.*,
                   EXISTS (SELECT 1 FROM awa.ready_tombstones t
                           WHERE t.ready_slot = v_qslot AND t.lane_id = e.lane_id
                             AND t.lane_seq = e.lane_seq) AS dead,
                   row_number() OVER (ORDER BY e.lane_seq) AS n
            FROM awa.ready_entries e
            WHERE e.ready_slot = v_qslot AND e.lane_id = r.lane_id AND e.lane_seq > v_cursor
            ORDER BY e.lane_seq
            LIMIT v_remaining
        ), picked AS MATERIALIZED (
            SELECT f.*, COALESCE(awa._deadline_secs_v1(f.deadline_secs), v_default) AS timeout
            FROM found f
            WHERE f.lane_seq = v_cursor + f.n AND NOT f.dead
        ), ins AS (
            INSERT INTO awa.claims (
                claim_slot, claim_generation, job_id, run_lease, ready_slot, ready_generation,
                lane_id, lane_seq, attempt, deadline_at, worker_id, kind)
            SELECT v_cslot, v_cgen, p.job_id, p.run_lease + 1, p.ready_slot, p.ready_generation,
                   p.lane_id, p.lane_seq, p.attempt + 1,
                   now() + make_interval(secs => p.timeout), p_worker, p.kind
            FROM picked p
            RETURNING lane_seq, deadline_at
        )
        SELECT p.job_id, p.run_lease + 1, (p.attempt + 1)::smallint, p.max_attempts, v_cslot,
               p.kind, p.args, p.queue, p.priority, i.deadline_at, p.timeout, p.progress,
               p.metadata, p.tags, p.errors
        FROM picked p JOIN ins i ON i.lane_seq = p.lane_seq
        ORDER BY p.lane_seq;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_remaining := v_remaining - v_got;
        EXIT WHEN v_remaining <= 0;
        -- Then, when the lane may hold more (its last position is past what was claimed), from
        -- every ready slot, merged by position: rows in an older slot (a producer in a
        -- REPEATABLE READ transaction appends to the queue slot its snapshot saw), rows in a
        -- newer one, rows after a gap left by a rollback.
        CONTINUE WHEN COALESCE(pg_sequence_last_value(v_seq), 0) <= v_cursor + v_got;
        IF v_got > 0 THEN
            v_cursor := awa.lane_cursor_v1(r.lane_id);  -- sees the claims just made
        END IF;
        RETURN QUERY
        WITH picked AS MATERIALIZED (
            SELECT e.*, COALESCE(awa._deadline_secs_v1(e.deadline_secs), v_default) AS timeout
            FROM awa.ready_entries e
            WHERE e.lane_id = r.lane_id AND e.lane_seq > v_cursor
              AND NOT EXISTS (
                  SELECT 1 FROM awa.ready_tombstones t
                  WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                    AND t.ready_slot = e.ready_slot)
            ORDER BY e.lane_seq
            LIMIT v_remaining
        ), ins AS (
            INSERT INTO awa.claims (
                claim_slot, claim_generation, job_id, run_lease, ready_slot, ready_generation,
                lane_id, lane_seq, attempt, deadline_at, worker_id, kind)
            SELECT v_cslot, v_cgen, p.job_id, p.run_lease + 1, p.ready_slot, p.ready_generation,
                   p.lane_id, p.lane_seq, p.attempt + 1,
                   now() + make_interval(secs => p.timeout), p_worker, p.kind
            FROM picked p
            RETURNING lane_seq, deadline_at
        )
        SELECT p.job_id, p.run_lease + 1, (p.attempt + 1)::smallint, p.max_attempts, v_cslot,
               p.kind, p.args, p.queue, p.priority, i.deadline_at, p.timeout, p.progress,
               p.metadata, p.tags, p.errors
        FROM picked p JOIN ins i ON i.lane_seq = p.lane_seq
        ORDER BY p.lane_seq;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_remaining := v_remaining - v_got;
        EXIT WHEN v_remaining <= 0;
    END LOOP;
END
$$;

-- The kind of a ready row (for a claim receipt written without one). A function rather than a
-- sub-select, so that finalize_v2 opens the ready ring only for such a receipt.
CREATE FUNCTION awa._ready_kind_v2(p_lane integer, p_seq bigint, p_slot integer)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT r.kind FROM awa.ready_entries r
    WHERE r.lane_id = p_lane AND r.lane_seq = p_seq AND r.ready_slot = p_slot
$$;

-- Finalize a batch of attempts: the items and results of awa.finalize_v1 (see its comment). A
-- batch of plain completions (every outcome 'completed', no attempt state, no recorded
-- closure other than the outcome) is written by one statement over the claim and terminal
-- planes; any other batch goes through awa.finalize_v1. An item not closed where it was looked
-- for (a carry-forward may have moved its claim, also while this call waited for it) is looked
-- for again, up to three more times, each in a new statement that sees what the transactions
-- it waited for committed; an attempt closed by rescue, cancel or another finalizer stays
-- stale. Parks ('wait' items) found stale are reported at once, as by finalize_v1.
CREATE FUNCTION awa.finalize_v2(p_items jsonb)
RETURNS TABLE (job_id bigint, run_lease bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_error text;
    v_stale jsonb;
    v_pairs jsonb;
    v_pass integer;
BEGIN
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'awa.finalize_v2 needs READ COMMITTED isolation' USING ERRCODE = '25000';
    END IF;
    IF p_items IS NULL OR jsonb_typeof(p_items) <> 'array' THEN
        RAISE EXCEPTION 'items: expected a JSON array' USING ERRCODE = '22023';
    END IF;
    v_error := awa._finalize_error_v1(p_items);
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION '%', v_error USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(p_items) e
               WHERE e.value ->> 'outcome' <> 'completed'
                  OR COALESCE(e.value -> 'st', 'null') NOT IN ('false', 'null')
                  OR e.value ? 'closed_as') THEN
        SELECT jsonb_agg(jsonb_build_array(f.job_id, f.run_lease)) INTO v_pairs
        FROM awa.finalize_v1(p_items) f;
        IF v_pairs IS NULL THEN
            RETURN;
        END IF;
        -- Items (not parks) reported stale are looked for again below; parks are reported.
        SELECT jsonb_agg(e.value) INTO v_stale
        FROM jsonb_array_elements(p_items) e
        WHERE e.value ->> 'outcome' <> 'wait'
          AND jsonb_build_array((e.value ->> 'id')::bigint, (e.value ->> 'lease')::bigint)
              IN (SELECT p.value FROM jsonb_array_elements(v_pairs) p);
        RETURN QUERY
        SELECT (p.value ->> 0)::bigint, (p.value ->> 1)::bigint
        FROM jsonb_array_elements(v_pairs) p
        WHERE NOT EXISTS (
            SELECT 1 FROM jsonb_array_elements(COALESCE(v_stale, '[]')) e
            WHERE (e.value ->> 'id')::bigint = (p.value ->> 0)::bigint
              AND (e.value ->> 'lease')::bigint = (p.value ->> 1)::bigint);
    ELSE
        WITH items AS (
            SELECT x.id, x.lease, x.slot, x.result, e.value AS raw
            FROM jsonb_array_elements(p_items) AS e(value),
                 jsonb_to_record(e.value) AS x(id bigint, lease bigint, slot integer, result jsonb)
        ), cl AS MATERIALIZED (
            SELECT i.id, i.lease, i.result, c.claim_slot, c.ready_slot, c.ready_generation,
                   c.lane_id, c.lane_seq, c.attempt, c.claimed_at, c.kind
            FROM items i
            CROSS JOIN LATERAL (
                SELECT c.* FROM awa.claims c
                WHERE c.job_id = i.id AND c.run_lease = i.lease AND c.claim_slot = i.slot
                LIMIT 1) c
        ), closed AS (
            INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome)
            SELECT cl.claim_slot, cl.id, cl.lease, 'completed' FROM cl
            ON CONFLICT DO NOTHING
            RETURNING claim_slot, job_id, run_lease
        ), completed AS (
            INSERT INTO awa.done_entries (
                ready_slot, ready_generation, job_id, run_lease, lane_id, lane_seq, state, attempt,
                attempted_at, result, queue, kind)
            SELECT w.ready_slot, w.ready_generation, w.id, w.lease, w.lane_id, w.lane_seq,
                   'completed', w.attempt, w.claimed_at, w.result, l.queue,
                   -- A claim without a kind (written by raw SQL): read it from the ready row.
                   COALESCE(w.kind, awa._ready_kind_v2(w.lane_id, w.lane_seq, w.ready_slot))
            FROM cl w
            JOIN closed k
              ON k.job_id = w.id AND k.run_lease = w.lease AND k.claim_slot = w.claim_slot
            JOIN awa.queue_lanes l ON l.lane_id = w.lane_id
        )
        SELECT jsonb_agg(i.raw) INTO v_stale
        FROM items i
        WHERE NOT EXISTS (SELECT 1 FROM closed k WHERE k.job_id = i.id AND k.run_lease = i.lease);
    END IF;
    FOR v_pass IN 1..3 LOOP
        EXIT WHEN v_stale IS NULL;
        v_stale := awa._finalize_pass_v1(v_stale, false);
    END LOOP;
    RETURN QUERY
    SELECT (e.value ->> 'id')::bigint, (e.value ->> 'lease')::bigint
    FROM jsonb_array_elements(COALESCE(v_stale, '[]')) e;
END
$$;
