-- Unapplies awa_django migration 0013 (sql/migrations/0013_kind_fast_claim.sql): the bodies of
-- awa.claim_v3 and awa._flow_kind_take_v1 of migration 0012 come back, and the trigger that
-- makes rate state rows goes (the rows stay).
DROP TRIGGER IF EXISTS flow_kind_rate_row ON awa.flow_kind_limits;

-- Claim jobs of one queue within its flow limits: the contract and lane order of claim_v2 (see
-- its comment), with weights, permits and the rate limit, and (0012) the limits of job kinds:
-- a job of a limited kind takes the slow path (awa._claim_kind_v1) and carries its kind
-- permits after its queue permits; jobs its kind parked are un-parked first
-- (awa._flow_unpark_v1). A marker row's wait_secs is a soft wait (a kind's next rate token:
-- wake on NOTIFY too); timeout_secs stays the hard one.
--   p_max         execution units the worker has free (a job takes its weight)
--   p_max_weight  the most units the worker could ever give one job (weights are capped to it)
--   p_held        permits this session holds for attempts still running (never taken twice)
--   p_release     permits to hand back first (attempts that ended)
--   p_serial_held, p_serial_release   the same for serial keys' run locks
-- Each job row carries its weight and, on a queue with a concurrency limit, the permit keys it
-- holds (hand them back with p_release, or awa.flow_release_v1, when its handler ends); a job
-- with a serial key carries its run lock in serial_lock (hand it back with p_serial_release,
-- or awa.serial_release_v1); wait_secs is how long it waited since it was due (run_at), on the
-- database clock (the queue-wait histogram). A marker row (job_id NULL) ends the result when a flow limit held
-- the claim back (see the file's header), or with timeout_secs 0.02 when a serial key being
-- decided by another claim stopped a lane. Also with p_max = 0, p_release and p_serial_release
-- are applied.
CREATE OR REPLACE FUNCTION awa.claim_v3(
    p_queue text, p_max integer, p_worker uuid DEFAULT NULL,
    p_aging_secs double precision DEFAULT 60, p_default_deadline double precision DEFAULT NULL,
    p_max_weight integer DEFAULT NULL, p_held integer[] DEFAULT NULL,
    p_release integer[] DEFAULT NULL, p_serial_held integer[] DEFAULT NULL,
    p_serial_release integer[] DEFAULT NULL)
RETURNS SETOF awa.claimed_v3
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_remaining integer;
    v_jobs_left integer := 2147483647;
    v_got integer;
    v_units integer;
    v_batch awa.claimed_v3[] := '{}';
    v_part awa.claimed_v3[];
    v_row awa.claimed_v3;
    v_weight integer;
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
    v_wcap integer := LEAST(GREATEST(COALESCE(p_max_weight, 10000), 1), 10000);
    v_limit awa.flow_limits%ROWTYPE;
    v_keys integer[];
    v_tat timestamptz;
    v_period double precision;
    v_wait double precision;
    v_bound boolean := false;
    v_jobs integer;
    v_used integer;
    v_all_lanes integer[];
    v_all_cursors bigint[];
    v_serial_at bigint;
    v_slow boolean;
    v_taken integer[] := '{}';
    v_retry boolean := false;
    -- The claim's time: now(), or for a rate-limited queue the clock once its rate state is
    -- locked (claims of the queue are serialised there, so their times only move forward:
    -- a claim whose transaction began before the last one committed never sees the state
    -- "ahead" and gives tokens back). Written as the attempts' claimed_at.
    v_now timestamptz := now();
    v_srows awa.claimed_v3[];
    v_sunits integer;
    v_sretry boolean;
    r record;
    v_waiting boolean;
    v_kinds text[];
    v_pheld integer[];
    v_kkeys integer[] := '{}';
    v_rkinds text[] := '{}';
    v_rtats timestamptz[] := '{}';
    v_rleft integer[] := '{}';
    v_rused integer[] := '{}';
    v_kwait double precision;
    v_soft double precision;
    v_kperiod double precision;
BEGIN
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'awa.claim_v3 needs READ COMMITTED isolation' USING ERRCODE = '25000';
    END IF;
    IF p_release IS NOT NULL THEN
        PERFORM awa.flow_release_v1(p_release);
    END IF;
    IF p_serial_release IS NOT NULL THEN
        PERFORM awa.serial_release_v1(p_serial_release);
    END IF;
    IF p_max IS NULL OR p_max <= 0 THEN
        RETURN;
    END IF;
    v_remaining := p_max;
    SELECT EXISTS (SELECT 1 FROM awa.queue_meta m WHERE m.queue = p_queue AND m.paused),
           c.generation, c.slot, q.slot,
           EXISTS (SELECT 1 FROM awa.flow_waiting w WHERE w.queue = p_queue)
    INTO v_paused, v_cgen, v_cslot, v_qslot, v_waiting
    FROM (SELECT r2.generation, r2.slot FROM awa.ring_rotations r2
          WHERE r2.ring = 'claim' ORDER BY r2.generation DESC LIMIT 1) c,
         (SELECT r2.slot FROM awa.ring_rotations r2
          WHERE r2.ring = 'queue' ORDER BY r2.generation DESC LIMIT 1) q;
    IF v_paused THEN
        RETURN;
    END IF;
    IF v_waiting THEN
        -- Jobs their kind parked: as many as their kinds let run now go back to the ready
        -- ring (hand-off lanes), before the lanes are read, so that this claim may take them.
        SELECT u.o_wait INTO v_soft FROM awa._flow_unpark_v1(p_queue, p_max, p_held) u;
    END IF;

    -- Lanes with work (as claim_v2): the flow limits are looked at only when there is some.
    -- Every lane's cursor is kept too: a lower bound of it for the serial-key tests below.
    SELECT array_agg(b.lane_id ORDER BY b.lane_id) FILTER (WHERE b.work),
           array_agg(b.priority ORDER BY b.lane_id) FILTER (WHERE b.work),
           array_agg(b.c ORDER BY b.lane_id) FILTER (WHERE b.work),
           array_agg(b.lane_id), array_agg(b.c)
    INTO v_lanes, v_priorities, v_cursors, v_all_lanes, v_all_cursors
    FROM (SELECT b0.*, COALESCE(pg_sequence_last_value(b0.enqueue_seq), 0) > b0.c AS work
          FROM (
        SELECT l.lane_id, l.priority, l.enqueue_seq,
               COALESCE(x.fast, awa.lane_cursor_v1(l.lane_id)) AS c
        FROM awa.queue_lanes l
        LEFT JOIN LATERAL (
            SELECT CASE WHEN c.claim_generation = v_cgen THEN c.lane_seq END AS fast
            FROM awa.claims c
            WHERE c.claim_slot = v_cslot AND c.lane_id = l.lane_id
            ORDER BY c.lane_seq DESC LIMIT 1) x ON true
        WHERE l.queue = p_queue AND pg_sequence_last_value(l.enqueue_seq) IS NOT NULL
    ) b0) b;
    IF v_lanes IS NULL THEN
        IF v_soft IS NOT NULL THEN
            -- Nothing ready, but jobs of a kind wait for its next rate token.
            RETURN NEXT ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, p_queue, NULL, NULL, NULL,
                            NULL, NULL, NULL, NULL, NULL, NULL, NULL, v_soft)::awa.claimed_v3;
        END IF;
        RETURN;
    END IF;

    -- The queue's limits and the kinds with limits, in one statement.
    SELECT f.max_running, f.max_seen, f.rate, f.burst,
           COALESCE((SELECT array_agg(k.kind) FROM awa.flow_kind_limits k
                     WHERE k.max_running IS NOT NULL OR k.rate IS NOT NULL), '{}')
    INTO v_limit.max_running, v_limit.max_seen, v_limit.rate, v_limit.burst, v_kinds
    FROM (SELECT p_queue AS queue) one
    LEFT JOIN awa.flow_limits f ON f.queue = one.queue;
    IF v_limit.max_running IS NOT NULL THEN
        v_wcap := LEAST(v_wcap, v_limit.max_running);
        v_keys := awa._flow_take_v1(p_queue, v_limit.max_running, v_limit.max_seen, p_max,
                                    p_held);
        IF cardinality(v_keys) < p_max THEN
            v_bound := true;
        END IF;
        v_remaining := cardinality(v_keys);
        IF v_remaining = 0 THEN
            RETURN NEXT ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, p_queue, NULL, NULL, NULL,
                            NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::awa.claimed_v3;
            RETURN;
        END IF;
    END IF;
    IF v_limit.rate IS NOT NULL THEN
        v_period := 1.0 / v_limit.rate;
        INSERT INTO awa.flow_rate_state (queue, tat) VALUES (p_queue, now())
        ON CONFLICT (queue) DO NOTHING;
        SELECT s.tat INTO v_tat FROM awa.flow_rate_state s WHERE s.queue = p_queue FOR UPDATE;
        v_now := clock_timestamp();
        -- Never further ahead than the current limits allow (burst × T): a state left by a
        -- slower rate, or by a cleared one, holds nothing back once the limit is raised.
        IF v_tat > v_now + make_interval(secs => COALESCE(
                v_limit.burst, GREATEST(1, ceil(v_limit.rate / 10)::integer)) * v_period) THEN
            v_tat := v_now + make_interval(secs => COALESCE(
                v_limit.burst, GREATEST(1, ceil(v_limit.rate / 10)::integer)) * v_period);
            UPDATE awa.flow_rate_state s SET tat = v_tat WHERE s.queue = p_queue;
        END IF;
        v_tat := GREATEST(v_tat, v_now);
        v_jobs := floor((extract(epoch FROM v_now - v_tat)
                         + COALESCE(v_limit.burst, GREATEST(1, ceil(v_limit.rate / 10)::integer))
                           * v_period) / v_period + 1e-9)::integer;
        v_jobs_left := GREATEST(v_jobs, 0);
        IF v_jobs_left = 0 THEN
            PERFORM awa.flow_release_v1(v_keys);
            v_wait := GREATEST(extract(epoch FROM v_tat - v_now)
                               - (COALESCE(v_limit.burst,
                                           GREATEST(1, ceil(v_limit.rate / 10)::integer)) - 1)
                                 * v_period, 0.001);
            RETURN NEXT ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, p_queue, NULL, NULL, v_wait,
                            NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::awa.claimed_v3;
            RETURN;
        END IF;
    END IF;
    v_units := v_remaining;
    v_pheld := COALESCE(p_held, '{}') || COALESCE(v_keys, '{}');

    -- Lane heads and order: as claim_v2.
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
        v_slow := false;
        IF cardinality(v_kinds) > 0 THEN
            -- When the lane's next job takes the slow path (a limited kind, a serial key), the
            -- statement below would read the lane's rows only to stop at the first: one probe.
            SELECT COALESCE(e.metadata ? 'awa:serial' OR e.kind = ANY (v_kinds), false)
            INTO v_slow
            FROM awa.ready_entries e
            WHERE e.ready_slot = v_qslot AND e.lane_id = r.lane_id AND e.lane_seq = v_cursor + 1
              AND NOT EXISTS (SELECT 1 FROM awa.ready_tombstones t
                              WHERE t.ready_slot = v_qslot AND t.lane_id = e.lane_id
                                AND t.lane_seq = e.lane_seq);
            v_slow := COALESCE(v_slow, false);
        END IF;
        -- The run of positions right after the cursor in the current queue slot, as claim_v2,
        -- taken while the running sum of weights fits the units left (a prefix: a job that
        -- does not fit stops the lane here, in order).
        WITH found AS MATERIALIZED (
            SELECT e.*,
                   EXISTS (SELECT 1 FROM awa.ready_tombstones t
                           WHERE t.ready_slot = v_qslot AND t.lane_id = e.lane_id
                             AND t.lane_seq = e.lane_seq) AS dead,
                   row_number() OVER (ORDER BY e.lane_seq) AS n
            FROM awa.ready_entries e
            WHERE NOT v_slow
              AND e.ready_slot = v_qslot AND e.lane_id = r.lane_id AND e.lane_seq > v_cursor
            ORDER BY e.lane_seq
            LIMIT v_remaining
        ), weighed AS MATERIALIZED (
            SELECT f.*, COALESCE(awa._deadline_secs_v1(f.deadline_secs), v_default) AS timeout,
                   awa._job_weight_v1(f.metadata, v_wcap) AS w,
                   COALESCE(f.metadata ? 'awa:serial' OR f.kind = ANY (v_kinds), false) AS s
            FROM found f
            WHERE f.lane_seq = v_cursor + f.n AND NOT f.dead
        ), picked AS MATERIALIZED (
            -- Up to the first job with a serial key (the slow path below decides about it).
            SELECT z.* FROM (
                SELECT g.*, sum(g.w) OVER (ORDER BY g.lane_seq) AS cw,
                       row_number() OVER (ORDER BY g.lane_seq) AS k,
                       bool_or(g.s) OVER (ORDER BY g.lane_seq) AS sk
                FROM weighed g) z
            WHERE z.cw <= v_remaining AND z.k <= v_jobs_left AND NOT z.sk
        ), ins AS (
            INSERT INTO awa.claims (
                claim_slot, claim_generation, job_id, run_lease, ready_slot, ready_generation,
                lane_id, lane_seq, attempt, deadline_at, worker_id, kind, claimed_at)
            SELECT v_cslot, v_cgen, p.job_id, p.run_lease + 1, p.ready_slot, p.ready_generation,
                   p.lane_id, p.lane_seq, p.attempt + 1,
                   now() + make_interval(secs => p.timeout), p_worker, p.kind, v_now
            FROM picked p
        )
        -- The rows of picked, not a join with ins (the planner, expecting one row from each,
        -- joined them in a nested loop: 512² comparisons): ins runs to completion anyway, and
        -- now() is the statement's, so the deadline is the one written.
        SELECT array_agg(ROW(p.job_id, p.run_lease + 1, (p.attempt + 1)::smallint,
                             p.max_attempts, v_cslot, p.kind, p.args, p.queue, p.priority,
                             now() + make_interval(secs => p.timeout), p.timeout, p.progress,
                             p.metadata, p.tags, p.errors, p.w, NULL, NULL,
                             extract(epoch FROM now() - p.run_at)::double precision
                            )::awa.claimed_v3
                         ORDER BY p.lane_seq),
               COALESCE(sum(p.w), 0),
               CASE WHEN v_slow THEN v_cursor + 1
                    ELSE (SELECT min(g.lane_seq) FROM weighed g WHERE g.s) END
        INTO v_part, v_weight, v_serial_at
        FROM picked p;
        v_got := COALESCE(cardinality(v_part), 0);
        IF v_got > 0 THEN
            v_batch := v_batch || v_part;
            v_remaining := v_remaining - v_weight;
            v_jobs_left := v_jobs_left - v_got;
        END IF;
        EXIT WHEN v_remaining <= 0 OR v_jobs_left <= 0;
        IF v_serial_at IS NOT NULL THEN
            -- A job with a serial key is next: the rest of this lane takes the slow path.
            SELECT x.o_rows, x.o_taken, x.o_units, x.o_retry, x.o_kkeys, x.o_rkinds, x.o_rtats,
                   x.o_rleft, x.o_rused, x.o_wait
            INTO v_srows, v_taken, v_sunits, v_sretry, v_kkeys, v_rkinds, v_rtats, v_rleft,
                 v_rused, v_kwait
            FROM awa._claim_kind_v1(r.lane_id, awa.lane_cursor_v1(r.lane_id), v_cslot, v_cgen,
                                    p_worker, v_remaining, v_jobs_left, v_wcap, v_default,
                                    p_serial_held, v_taken, v_all_lanes, v_all_cursors, v_kinds,
                                    v_pheld, v_kkeys, v_rkinds, v_rtats, v_rleft, v_rused) x;
            v_retry := v_retry OR v_sretry;
            v_soft := LEAST(COALESCE(v_soft, v_kwait), v_kwait);
            IF cardinality(v_srows) > 0 THEN
                v_batch := v_batch || v_srows;
                v_remaining := v_remaining - v_sunits;
                v_jobs_left := v_jobs_left - cardinality(v_srows);
            END IF;
            EXIT WHEN v_remaining <= 0 OR v_jobs_left <= 0;
            CONTINUE;
        END IF;
        -- Then, when the lane may hold more, from every ready slot (as claim_v2).
        CONTINUE WHEN COALESCE(pg_sequence_last_value(v_seq), 0) <= v_cursor + v_got;
        IF v_got > 0 THEN
            v_cursor := awa.lane_cursor_v1(r.lane_id);  -- sees the claims just made
        END IF;
        WITH weighed AS MATERIALIZED (
            SELECT e.*, COALESCE(awa._deadline_secs_v1(e.deadline_secs), v_default) AS timeout,
                   awa._job_weight_v1(e.metadata, v_wcap) AS w,
                   COALESCE(e.metadata ? 'awa:serial' OR e.kind = ANY (v_kinds), false) AS s
            FROM awa.ready_entries e
            WHERE e.lane_id = r.lane_id AND e.lane_seq > v_cursor
              AND NOT EXISTS (
                  SELECT 1 FROM awa.ready_tombstones t
                  WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                    AND t.ready_slot = e.ready_slot)
            ORDER BY e.lane_seq
            LIMIT v_remaining
        ), picked AS MATERIALIZED (
            -- Up to the first job with a serial key (the slow path below decides about it).
            SELECT z.* FROM (
                SELECT g.*, sum(g.w) OVER (ORDER BY g.lane_seq) AS cw,
                       row_number() OVER (ORDER BY g.lane_seq) AS k,
                       bool_or(g.s) OVER (ORDER BY g.lane_seq) AS sk
                FROM weighed g) z
            WHERE z.cw <= v_remaining AND z.k <= v_jobs_left AND NOT z.sk
        ), ins AS (
            INSERT INTO awa.claims (
                claim_slot, claim_generation, job_id, run_lease, ready_slot, ready_generation,
                lane_id, lane_seq, attempt, deadline_at, worker_id, kind, claimed_at)
            SELECT v_cslot, v_cgen, p.job_id, p.run_lease + 1, p.ready_slot, p.ready_generation,
                   p.lane_id, p.lane_seq, p.attempt + 1,
                   now() + make_interval(secs => p.timeout), p_worker, p.kind, v_now
            FROM picked p
        )
        -- The rows of picked, not a join with ins (the planner, expecting one row from each,
        -- joined them in a nested loop: 512² comparisons): ins runs to completion anyway, and
        -- now() is the statement's, so the deadline is the one written.
        SELECT array_agg(ROW(p.job_id, p.run_lease + 1, (p.attempt + 1)::smallint,
                             p.max_attempts, v_cslot, p.kind, p.args, p.queue, p.priority,
                             now() + make_interval(secs => p.timeout), p.timeout, p.progress,
                             p.metadata, p.tags, p.errors, p.w, NULL, NULL,
                             extract(epoch FROM now() - p.run_at)::double precision
                            )::awa.claimed_v3
                         ORDER BY p.lane_seq),
               COALESCE(sum(p.w), 0), (SELECT min(g.lane_seq) FROM weighed g WHERE g.s)
        INTO v_part, v_weight, v_serial_at
        FROM picked p;
        v_got := COALESCE(cardinality(v_part), 0);
        IF v_got > 0 THEN
            v_batch := v_batch || v_part;
            v_remaining := v_remaining - v_weight;
            v_jobs_left := v_jobs_left - v_got;
        END IF;
        EXIT WHEN v_remaining <= 0 OR v_jobs_left <= 0;
        IF v_serial_at IS NOT NULL THEN
            -- A job with a serial key is next: the rest of this lane takes the slow path.
            SELECT x.o_rows, x.o_taken, x.o_units, x.o_retry, x.o_kkeys, x.o_rkinds, x.o_rtats,
                   x.o_rleft, x.o_rused, x.o_wait
            INTO v_srows, v_taken, v_sunits, v_sretry, v_kkeys, v_rkinds, v_rtats, v_rleft,
                 v_rused, v_kwait
            FROM awa._claim_kind_v1(r.lane_id, awa.lane_cursor_v1(r.lane_id), v_cslot, v_cgen,
                                    p_worker, v_remaining, v_jobs_left, v_wcap, v_default,
                                    p_serial_held, v_taken, v_all_lanes, v_all_cursors, v_kinds,
                                    v_pheld, v_kkeys, v_rkinds, v_rtats, v_rleft, v_rused) x;
            v_retry := v_retry OR v_sretry;
            v_soft := LEAST(COALESCE(v_soft, v_kwait), v_kwait);
            IF cardinality(v_srows) > 0 THEN
                v_batch := v_batch || v_srows;
                v_remaining := v_remaining - v_sunits;
                v_jobs_left := v_jobs_left - cardinality(v_srows);
            END IF;
            EXIT WHEN v_remaining <= 0 OR v_jobs_left <= 0;
            CONTINUE;
        END IF;
    END LOOP;

    v_jobs := cardinality(v_batch);
    v_used := v_units - v_remaining;
    -- Each rate-limited kind's state moves once for the claim, by its jobs started.
    FOR i IN 1..COALESCE(cardinality(v_rkinds), 0) LOOP
        CONTINUE WHEN v_rused[i] = 0;
        SELECT 1.0 / k.rate INTO v_kperiod FROM awa.flow_kind_limits k WHERE k.kind = v_rkinds[i];
        UPDATE awa.flow_kind_rate_state s
        SET tat = v_rtats[i] + make_interval(secs => v_rused[i] * COALESCE(v_kperiod, 0))
        WHERE s.kind = v_rkinds[i];
    END LOOP;
    IF v_limit.rate IS NOT NULL THEN
        IF v_jobs > 0 THEN
            UPDATE awa.flow_rate_state s
            SET tat = v_tat + make_interval(secs => v_jobs * v_period)
            WHERE s.queue = p_queue;
        END IF;
        IF v_jobs_left <= 0 THEN
            v_bound := true;
            v_wait := GREATEST(extract(epoch FROM v_tat - v_now) + v_jobs * v_period
                               - (COALESCE(v_limit.burst,
                                           GREATEST(1, ceil(v_limit.rate / 10)::integer)) - 1)
                                 * v_period, 0.001);
        END IF;
    END IF;
    IF v_keys IS NOT NULL THEN
        -- Permits not needed after all (fewer or lighter jobs than units) go back at once.
        PERFORM awa.flow_release_v1(v_keys[v_used + 1:]);
        IF v_used < v_units THEN
            v_bound := v_bound AND v_jobs_left <= 0;  -- the lanes ran dry, not the permits
        END IF;
    END IF;
    -- Each job with its share of the permits, in claim order (no SQL statement: a loop).
    v_used := 0;
    FOREACH v_row IN ARRAY v_batch LOOP
        IF v_keys IS NOT NULL THEN
            -- The queue's permits, then the kind's (from the slow path).
            v_row.permits := v_keys[v_used + 1:v_used + v_row.weight]
                             || COALESCE(v_row.permits, '{}');
            v_used := v_used + v_row.weight;
        END IF;
        RETURN NEXT v_row;
    END LOOP;
    IF v_retry AND v_remaining > 0 AND v_jobs_left > 0 THEN
        -- A serial key was being decided by another claim, or rows are left to look at: claim
        -- again soon rather than after a poll interval.
        v_bound := true;
        v_wait := 0.02;
    END IF;
    IF v_bound OR v_soft IS NOT NULL AND v_remaining > 0 AND v_jobs_left > 0 THEN
        RETURN NEXT ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, p_queue, NULL, NULL, v_wait,
                        NULL, NULL, NULL, NULL, NULL, NULL, NULL, v_soft)::awa.claimed_v3;
    END IF;
END

$$;

-- Take up to p_want free permits of kind p_kind (limit p_limit, highest limit in use p_seen)
-- for this session, skipping keys in p_held (held already: session locks are re-entrant).
-- As awa._flow_take_v1, for kinds. Returns the keys taken.
CREATE OR REPLACE FUNCTION awa._flow_kind_take_v1(p_kind text, p_limit integer, p_seen integer,
                                       p_want integer, p_held integer[])
RETURNS integer[]
LANGUAGE plpgsql AS $$
DECLARE
    v_keys integer[] := '{}';
    v_start integer;
    v_room integer := LEAST(p_want, p_limit);
    v_busy integer;
BEGIN
    IF v_room <= 0 THEN
        RETURN v_keys;
    END IF;
    IF p_seen IS NOT NULL AND p_seen > p_limit THEN
        -- The limit was lowered: permits above it may still be held. Count every held one.
        SELECT count(*) INTO v_busy
        FROM generate_series(0, p_seen - 1) AS g(i)
        JOIN pg_locks l
          ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
         AND l.classid = 4282182::oid
         AND l.objid = (awa._flow_kind_key_v1(p_kind, g.i)::bigint & 4294967295)::oid
         AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database());
        IF NOT EXISTS (
            SELECT 1 FROM generate_series(p_limit, p_seen - 1) AS g(i)
            JOIN pg_locks l
              ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
             AND l.classid = 4282182::oid
             AND l.objid = (awa._flow_kind_key_v1(p_kind, g.i)::bigint & 4294967295)::oid) THEN
            UPDATE awa.flow_kind_limits f SET max_seen = f.max_running
            WHERE f.kind = p_kind AND f.max_seen > f.max_running;
        END IF;
        v_room := LEAST(v_room, p_limit - v_busy);
        IF v_room <= 0 THEN
            RETURN v_keys;
        END IF;
    END IF;
    v_start := floor(random() * p_limit)::integer;
    SELECT COALESCE(array_agg(t.k), '{}') INTO v_keys
    FROM (
        SELECT c.k
        FROM (SELECT awa._flow_kind_key_v1(p_kind, (v_start + generate_series(0, p_limit - 1))
                                                   % p_limit) AS k) c
        WHERE CASE WHEN c.k IN (SELECT h.k FROM unnest(p_held) AS h(k)) THEN false
                   ELSE pg_try_advisory_lock(4282182, c.k) END
        LIMIT v_room) t;
    RETURN v_keys;
END
$$;
