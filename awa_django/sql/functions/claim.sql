-- Lanes -----------------------------------------------------------------------------------------

-- Every transition is one call per batch.
--
-- Lock and visibility contract (docs/storage.md has the long form):
--   * Producers of one lane are serialised by a transaction-scoped advisory lock on the lane
--     (class 4282177, key lane_id), held until the producer commits. So the rows of a lane that a
--     claimer's snapshot sees are a prefix in lane order, apart from gaps left by rollbacks.
--   * Claim locks the lane row FOR UPDATE SKIP LOCKED, then reads the lane cursor and the ready
--     rows in later statements (fresh READ COMMITTED snapshots that include the previous
--     claimer's commit). The cursor is the highest claimed lane position, derived from the
--     append-only claims, so it is transactional and leaves no dead tuples.
--   * Every closing write (finalize, rescue, cancel, carry-forward) inserts closure evidence
--     keyed by (job_id, run_lease, claim_slot) with ON CONFLICT DO NOTHING: exactly one closer
--     of an attempt wins, the others learn they are stale and change nothing.

-- Highest lane position consumed by a claim (0 when none): rows at or below it are spent.
-- STABLE: it reads in its caller's snapshot, consistent with the caller's other reads. A claim
-- prune truncates a slot and writes the lanes' cursors into the current slot in one
-- transaction, and TRUNCATE is not MVCC-safe: a caller whose snapshot predates a prune must
-- hold the claim ring's locks before it takes that snapshot, or its first lock here may wait
-- for the prune and then see the slot empty and not the markers, a cursor below spent rows
-- (docs/design/derived-claim-cursor.md).
CREATE OR REPLACE FUNCTION awa.lane_cursor_v1(p_lane_id integer)
 RETURNS bigint
 LANGUAGE sql
 STABLE
AS $$
    SELECT GREATEST(
        COALESCE((SELECT max(c.lane_seq) FROM awa.claims c WHERE c.lane_id = p_lane_id), 0),
        COALESCE((SELECT f.floor_seq FROM awa.lane_floors f WHERE f.lane_id = p_lane_id), 0))
$$;

-- The cursor of a lane from every claim slot and its floor: awa.lane_cursor_v1, through
-- PL/pgSQL so that a statement that falls back to it (rarely) does not carry its plan (and the
-- locks of every claim partition) when it does not. STABLE: it reads the caller's snapshot.
CREATE OR REPLACE FUNCTION awa._lane_cursor_v2(p_lane_id integer)
 RETURNS bigint
 LANGUAGE plpgsql
 STABLE
AS $$
BEGIN
    RETURN awa.lane_cursor_v1(p_lane_id);
END
$$;

-- Lane cursors past tombstones ----------------------------------------------------------------------

-- The claim cursor of a lane is the highest claimed lane position. A run of cancelled
-- (tombstoned) rows right above it would be rescanned by every claim until work is claimed past
-- it; this appends a closed marker claim at the top of that run so the cursor passes it. A
-- marker's job_id is -lane_id and its run_lease the lane position: it is never an attempt, and
-- being closed it never counts as open. The caller holds the lane row FOR UPDATE (serialised
-- with claimers). Safe because the rows a snapshot sees of a lane are a prefix apart from
-- rollback gaps: everything at or below a visible tombstoned row is spent. Returns the new
-- cursor, or NULL when nothing moved.
CREATE OR REPLACE FUNCTION awa._lane_skip_v1(p_lane integer)
 RETURNS bigint
 LANGUAGE plpgsql
AS $$
DECLARE
    v_cursor bigint := awa.lane_cursor_v1(p_lane);
    v_first bigint;
    v_top bigint;
    v_gen bigint;
    v_slot integer;
BEGIN
    SELECT e.lane_seq INTO v_first FROM awa.ready_entries e
    WHERE e.lane_id = p_lane AND e.lane_seq > v_cursor
      AND NOT EXISTS (
          SELECT 1 FROM awa.ready_tombstones t
          WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq AND t.ready_slot = e.ready_slot)
    ORDER BY e.lane_seq LIMIT 1;
    SELECT max(t.lane_seq) INTO v_top FROM awa.ready_tombstones t
    WHERE t.lane_id = p_lane AND t.lane_seq > v_cursor
      AND (v_first IS NULL OR t.lane_seq < v_first);
    IF v_top IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT generation, slot INTO v_gen, v_slot
    FROM awa.ring_rotations WHERE ring = 'claim' ORDER BY generation DESC LIMIT 1;
    INSERT INTO awa.claims (claim_slot, claim_generation, job_id, run_lease, ready_slot,
                            ready_generation, lane_id, lane_seq, attempt)
    VALUES (v_slot, v_gen, -p_lane, v_top, -1, -1, p_lane, v_top, 0)
    ON CONFLICT DO NOTHING;
    INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome)
    VALUES (v_slot, -p_lane, v_top, 'marker')
    ON CONFLICT DO NOTHING;
    RETURN v_top;
END
$$;

-- The kind of a ready row (for a claim receipt written without one). A function rather than a
-- sub-select, so that finalize_v2 opens the ready ring only for such a receipt.
CREATE OR REPLACE FUNCTION awa._ready_kind_v2(p_lane integer, p_seq bigint, p_slot integer)
 RETURNS text
 LANGUAGE sql
 STABLE
AS $$
    SELECT r.kind FROM awa.ready_entries r
    WHERE r.lane_id = p_lane AND r.lane_seq = p_seq AND r.ready_slot = p_slot
$$;

-- The claim ----------------------------------------------------------------------------------

-- awa.claim_v3 runs with plan_cache_mode = force_generic_plan: custom plans over the
-- ring-partitioned tables were planned again on every call. A generic plan over a partitioned
-- table is pruned when it starts, but only after every partition in it has been locked, so the
-- statements of the common path each name one ring partition: they are written once below,
-- between `--@each` and `--@end`, and rendered into one static branch per ring slot (a CASE on
-- the slot, each branch a statement with its own cached plan naming one child table); the ELSE
-- branch is the same statement on the parent, for a ring of another size. enable_seqscan and
-- enable_bitmapscan are off: a plan made while a partition looked empty (a slot just rotated
-- to) read the lane's index by bitmap, or scanned, for as long as the session kept it. Why, with
-- the figures: docs/design/static-per-slot-statements.md.
--
-- Claim up to p_max units of available jobs of one queue for worker p_worker, as one short
-- transaction, within the queue's flow limits (weights, permits, the rate limit) and the limits
-- of job kinds. Lanes are taken in order of effective priority (priority + 1 per p_aging_secs
-- that the lane's head has waited), then oldest head; each lane is locked FOR UPDATE SKIP
-- LOCKED so concurrent claimers take different lanes. Within a lane, rows come in FIFO order.
-- Each claimed attempt is appended to the claim ring and returned with attempt + 1 and
-- run_lease + 1; deadline_at is the attempt's hard deadline on the database clock and
-- timeout_secs the same as a duration. The claim receipt names the job's kind, which finalize
-- copies into the terminal row. A stored deadline is bounded (awa._deadline_secs_v1), so a row
-- written by raw SQL cannot make the claim fail for the whole queue. A lane's cursor is its
-- highest claim in the current claim slot when that claim was made in the slot's generation,
-- else it is read from every slot (docs/design/derived-claim-cursor.md).
-- A job of a limited kind carries its kind permits after its queue permits; it goes through the
-- claim's statement when its kind has the rate tokens and permits for all its rows there, else
-- the slow path (awa._claim_kind_v1) decides; jobs its kind parked are un-parked first
-- (awa._flow_unpark_v2). A marker row's wait_secs is a soft wait (a kind's next rate token:
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
-- database clock (the queue-wait histogram). A marker row (job_id NULL) ends the result when a
-- flow limit held the claim back (functions/flow.sql), or with timeout_secs 0.02 when a serial
-- key being decided by another claim stopped a lane. Also with p_max = 0, p_release and
-- p_serial_release are applied.
CREATE OR REPLACE FUNCTION awa.claim_v3(
    p_queue text, p_max integer, p_worker uuid DEFAULT NULL::uuid,
    p_aging_secs double precision DEFAULT 60,
    p_default_deadline double precision DEFAULT NULL::double precision,
    p_max_weight integer DEFAULT NULL::integer, p_held integer[] DEFAULT NULL::integer[],
    p_release integer[] DEFAULT NULL::integer[],
    p_serial_held integer[] DEFAULT NULL::integer[],
    p_serial_release integer[] DEFAULT NULL::integer[])
 RETURNS SETOF awa.claimed_v3
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
 SET search_path TO 'pg_catalog', 'pg_temp'
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
    v_pcap integer := LEAST(GREATEST(COALESCE(p_max_weight, 10000), 1), 10000);  -- the process's
    v_true integer;  -- a job's weight as the process counts it, whatever the limits
    v_klimit integer;
    v_mine integer[];
    v_above integer[];
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
    v_order integer[];  -- the lanes in claim order
    v_rlane integer;  -- the lane being claimed
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
    -- The lane's limited kinds, in the order of their first rows among the rows the
    -- statement could take: their limits, rows and permits wanted; of those cleared (tokens and
    -- permits for all those rows taken): their limit, rate index (v_rkinds) and keys in v_pool
    -- (v_okfrom .. v_okto); the last position the statement may take a cleared kind's row at.
    v_akinds text[];
    v_amax integer[];
    v_aseen integer[];
    v_arate double precision[];
    v_aburst integer[];
    v_ac integer[];
    v_awant integer[];
    v_okinds text[];
    v_okmax integer[];
    v_okri integer[];
    v_okfrom integer[];
    v_okto integer[];
    v_alast bigint;
    v_acount integer;
    v_fskey boolean;
    v_fkind text;
    v_apass boolean;
    v_need_a boolean;
    v_npk integer;
    v_locked boolean;
    v_skipped boolean;
    -- The lane's next job's kind (the probe), and whether to try it without reading the run.
    v_pkind text;
    v_guess boolean;
    v_glimit integer;
    v_gseen integer;
    v_grate double precision;
    v_gburst integer;
    v_left_at bigint;
    v_ok boolean;
    v_pool integer[];
    v_tkix integer[];
    v_tkn integer[];
    v_tc integer[];
    v_td integer[];
    v_free integer[];
    v_ri integer;
    v_kk integer[];
    v_ktat timestamptz;
    v_know timestamptz;
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
    -- With the queue's limits and the kinds with limits (read again below after an
    -- un-parking).
    SELECT EXISTS (SELECT 1 FROM awa.queue_meta m WHERE m.queue = p_queue AND m.paused),
           c.generation, c.slot, q.slot,
           EXISTS (SELECT 1 FROM awa.flow_waiting w WHERE w.queue = p_queue),
           f.max_running, f.max_seen, f.rate, f.burst,
           COALESCE((SELECT array_agg(k.kind) FROM awa.flow_kind_limits k
                     WHERE k.max_running IS NOT NULL OR k.rate IS NOT NULL), '{}')
    INTO v_paused, v_cgen, v_cslot, v_qslot, v_waiting,
         v_limit.max_running, v_limit.max_seen, v_limit.rate, v_limit.burst, v_kinds
    FROM (SELECT r2.generation, r2.slot FROM awa.ring_rotations r2
          WHERE r2.ring = 'claim' ORDER BY r2.generation DESC LIMIT 1) c
    CROSS JOIN (SELECT r2.slot FROM awa.ring_rotations r2
                WHERE r2.ring = 'queue' ORDER BY r2.generation DESC LIMIT 1) q
    LEFT JOIN awa.flow_limits f ON f.queue = p_queue;
    IF v_paused THEN
        RETURN;
    END IF;
    IF v_waiting THEN
        -- Jobs their kind parked: as many as their kinds let run now go back to the ready
        -- ring (hand-off lanes), before the lanes are read, so that this claim may take them.
        SELECT u.o_wait INTO v_soft FROM awa._flow_unpark_v2(p_queue, p_max, p_held, v_wcap) u;
    END IF;

    -- Lanes with work: the flow limits are looked at only when there is some.
    -- Every lane's cursor is kept too: a lower bound of it for the serial-key tests below.
    CASE v_cslot
    --@each claim_slot
    WHEN {claim_slot} THEN
        SELECT array_agg(b.lane_id ORDER BY b.lane_id) FILTER (WHERE b.work),
               array_agg(b.priority ORDER BY b.lane_id) FILTER (WHERE b.work),
               array_agg(b.c ORDER BY b.lane_id) FILTER (WHERE b.work),
               array_agg(b.lane_id), array_agg(b.c)
        INTO v_lanes, v_priorities, v_cursors, v_all_lanes, v_all_cursors
        FROM (SELECT b0.*, b0.last > b0.c AS work
              FROM (
            SELECT l.lane_id, l.priority, s.last,
                   COALESCE(x.fast, awa._lane_cursor_v2(l.lane_id)) AS c
            FROM awa.queue_lanes l
            CROSS JOIN LATERAL (SELECT pg_sequence_last_value(l.enqueue_seq) AS last) s  -- read once
            LEFT JOIN LATERAL (
                SELECT CASE WHEN c.claim_generation = v_cgen THEN c.lane_seq END AS fast
                FROM awa.claims_{claim_slot} c
                WHERE c.lane_id = l.lane_id
                ORDER BY c.lane_seq DESC LIMIT 1) x ON true
            WHERE l.queue = p_queue AND s.last IS NOT NULL
        ) b0) b;
    --@end
    ELSE
        SELECT array_agg(b.lane_id ORDER BY b.lane_id) FILTER (WHERE b.work),
               array_agg(b.priority ORDER BY b.lane_id) FILTER (WHERE b.work),
               array_agg(b.c ORDER BY b.lane_id) FILTER (WHERE b.work),
               array_agg(b.lane_id), array_agg(b.c)
        INTO v_lanes, v_priorities, v_cursors, v_all_lanes, v_all_cursors
        FROM (SELECT b0.*, b0.last > b0.c AS work
              FROM (
            SELECT l.lane_id, l.priority, s.last,
                   COALESCE(x.fast, awa._lane_cursor_v2(l.lane_id)) AS c
            FROM awa.queue_lanes l
            CROSS JOIN LATERAL (SELECT pg_sequence_last_value(l.enqueue_seq) AS last) s  -- read once
            LEFT JOIN LATERAL (
                SELECT CASE WHEN c.claim_generation = v_cgen THEN c.lane_seq END AS fast
                FROM awa.claims c
                WHERE c.claim_slot = v_cslot AND c.lane_id = l.lane_id
                ORDER BY c.lane_seq DESC LIMIT 1) x ON true
            WHERE l.queue = p_queue AND s.last IS NOT NULL
        ) b0) b;
    END CASE;
    IF v_lanes IS NULL THEN
        IF v_soft IS NOT NULL THEN
            -- Nothing ready, but jobs of a kind wait for its next rate token.
            RETURN NEXT ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, p_queue, NULL, NULL, NULL,
                            NULL, NULL, NULL, NULL, NULL, NULL, NULL, v_soft)::awa.claimed_v3;
        END IF;
        RETURN;
    END IF;

    IF v_waiting THEN
        -- The queue's limits and the kinds with limits, in one statement (read by the
        -- first statement already, again only after an un-parking).
        SELECT f.max_running, f.max_seen, f.rate, f.burst,
               COALESCE((SELECT array_agg(k.kind) FROM awa.flow_kind_limits k
                         WHERE k.max_running IS NOT NULL OR k.rate IS NOT NULL), '{}')
        INTO v_limit.max_running, v_limit.max_seen, v_limit.rate, v_limit.burst, v_kinds
        FROM (SELECT p_queue AS queue) one
        LEFT JOIN awa.flow_limits f ON f.queue = one.queue;
    END IF;
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

    -- Lane heads and order.
    IF cardinality(v_lanes) > 1 THEN
        CASE v_qslot
        --@each queue_slot
        WHEN {queue_slot} THEN
            SELECT array_agg(h.run_at ORDER BY u.i),
                   array_agg(u.lane_id ORDER BY u.priority + floor(extract(epoch FROM now() - h.run_at) / v_aging) DESC NULLS LAST,
                            h.run_at, u.lane_id)
            INTO v_heads, v_order
            FROM unnest(v_lanes, v_cursors, v_priorities) WITH ORDINALITY AS u(lane_id, c, priority, i)
            LEFT JOIN LATERAL (
                SELECT e.run_at FROM awa.ready_entries_{queue_slot} e
                WHERE e.lane_id = u.lane_id AND e.lane_seq > u.c
                  AND NOT EXISTS (
                      SELECT 1 FROM awa.ready_tombstones_{queue_slot} t
                      WHERE t.lane_id = e.lane_id
                        AND t.lane_seq = e.lane_seq)
                ORDER BY e.lane_seq
                LIMIT 1) h ON true;
        --@end
        ELSE
            SELECT array_agg(h.run_at ORDER BY u.i),
                   array_agg(u.lane_id ORDER BY u.priority + floor(extract(epoch FROM now() - h.run_at) / v_aging) DESC NULLS LAST,
                            h.run_at, u.lane_id)
            INTO v_heads, v_order
            FROM unnest(v_lanes, v_cursors, v_priorities) WITH ORDINALITY AS u(lane_id, c, priority, i)
            LEFT JOIN LATERAL (
                SELECT e.run_at FROM awa.ready_entries e
                WHERE e.ready_slot = v_qslot AND e.lane_id = u.lane_id AND e.lane_seq > u.c
                  AND NOT EXISTS (
                      SELECT 1 FROM awa.ready_tombstones t
                      WHERE t.ready_slot = v_qslot AND t.lane_id = e.lane_id
                        AND t.lane_seq = e.lane_seq)
                ORDER BY e.lane_seq
                LIMIT 1) h ON true;
        END CASE;
        FOR i IN 1..cardinality(v_lanes) LOOP
            CONTINUE WHEN v_heads[i] IS NOT NULL;
            v_order := NULL;  -- order by the heads found here
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

    -- The lanes in claim order (one lane: itself; several: the order the
    -- heads statement gave, or, when a head was looked for in every slot, this query's).
    IF cardinality(v_lanes) = 1 THEN
        v_order := v_lanes;
    ELSIF v_order IS NULL THEN
        v_order := ARRAY(
            SELECT u.lane_id
            FROM unnest(v_lanes, v_priorities, v_heads) AS u(lane_id, priority, head)
            ORDER BY u.priority + floor(extract(epoch FROM now() - u.head) / v_aging)
                         DESC NULLS LAST,
                     u.head, u.lane_id);
    END IF;
    FOREACH v_rlane IN ARRAY v_order LOOP
        v_locked := false;
        v_skipped := false;
        v_pool := '{}';
        -- The lane's cursor as the lanes statement read it: the probe below runs before the
        -- lane is locked (the lock is the claims' one serial point on a lane), and may see a
        -- job another claim has taken since; the statement decides on the lane as locked.
        v_cursor := v_cursors[array_position(v_lanes, v_rlane)];
        v_slow := false;
        v_okinds := '{}';
        v_npk := 0;
        v_apass := false;
        v_need_a := false;
        v_guess := false;
        IF cardinality(v_kinds) > 0 THEN
            -- One probe of the lane's next job: a serial key sends the lane to the slow path; a
            -- limited kind has the kinds of the run read first (below); any other job runs the
            -- statement as on a queue without kind limits, up to the first job of a limited kind.
            SELECT COALESCE(e.metadata ? 'awa:serial', false), e.kind = ANY (v_kinds), e.kind
            INTO v_fskey, v_need_a, v_pkind
            FROM awa.ready_entries e
            WHERE e.ready_slot = v_qslot AND e.lane_id = v_rlane AND e.lane_seq = v_cursor + 1
              AND NOT EXISTS (SELECT 1 FROM awa.ready_tombstones t
                              WHERE t.ready_slot = v_qslot AND t.lane_id = e.lane_id
                                AND t.lane_seq = e.lane_seq);
            v_slow := COALESCE(v_fskey, false);
            v_need_a := COALESCE(v_need_a, false) AND NOT v_slow;
            v_guess := v_need_a;
        END IF;
        LOOP
            IF NOT v_locked AND NOT (v_need_a AND v_guess) THEN
                SELECT l.enqueue_seq INTO v_seq
                FROM awa.queue_lanes l WHERE l.lane_id = v_rlane FOR UPDATE SKIP LOCKED;
                IF NOT FOUND THEN
                    v_skipped := true;  -- another claim holds the lane
                    EXIT;
                END IF;
                v_locked := true;
                CASE v_cslot
                --@each claim_slot
                WHEN {claim_slot} THEN
                    SELECT c.generation, c.slot,
                           CASE WHEN x.claim_generation = c.generation THEN x.lane_seq END
                    INTO v_cgen, v_cslot, v_cursor
                    FROM (SELECT r2.generation, r2.slot FROM awa.ring_rotations r2
                          WHERE r2.ring = 'claim' ORDER BY r2.generation DESC LIMIT 1) c
                    LEFT JOIN LATERAL (
                        SELECT cl.lane_seq, cl.claim_generation FROM awa.claims_{claim_slot} cl
                        WHERE c.slot = {claim_slot} AND cl.lane_id = v_rlane
                        ORDER BY cl.lane_seq DESC LIMIT 1) x ON true;
                --@end
                ELSE
                    SELECT c.generation, c.slot,
                           CASE WHEN x.claim_generation = c.generation THEN x.lane_seq END
                    INTO v_cgen, v_cslot, v_cursor
                    FROM (SELECT r2.generation, r2.slot FROM awa.ring_rotations r2
                          WHERE r2.ring = 'claim' ORDER BY r2.generation DESC LIMIT 1) c
                    LEFT JOIN LATERAL (
                        SELECT cl.lane_seq, cl.claim_generation FROM awa.claims cl
                        WHERE cl.claim_slot = c.slot AND cl.lane_id = v_rlane
                        ORDER BY cl.lane_seq DESC LIMIT 1) x ON true;
                END CASE;
                IF v_cursor IS NULL THEN
                    v_cursor := awa.lane_cursor_v1(v_rlane);
                END IF;
            END IF;
            IF v_need_a THEN
                v_need_a := false;
                v_apass := true;
                v_akinds := NULL;
                v_okinds := '{}';
                v_okmax := '{}';
                v_okri := '{}';
                v_okfrom := '{}';
                v_okto := '{}';
                v_pool := '{}';
                v_alast := v_cursor;
                v_glimit := NULL;
                IF v_guess THEN
                    SELECT f.max_running, f.max_seen, f.rate, f.burst
                    INTO v_glimit, v_gseen, v_grate, v_gburst
                    FROM awa.flow_kind_limits f WHERE f.kind = v_pkind;
                    v_guess := FOUND AND COALESCE(v_glimit >= v_remaining, true);
                END IF;
                IF v_guess THEN
                    -- The lane's next job is of a limited kind whose limit is at least the units
                    -- left (or that has only a rate): without reading the run, the kind is
                    -- asked for as many tokens and permits as the units left, which covers every
                    -- run of its jobs the statement can take; keys not drawn go back below. If
                    -- it cannot have them all, the run is read and decided exactly (again).
                    v_fskey := false;
                    v_fkind := v_pkind;
                    v_alast := 9223372036854775807;
                    v_akinds := ARRAY[v_pkind];
                    v_amax := ARRAY[v_glimit];
                    v_aseen := ARRAY[v_gseen];
                    v_arate := ARRAY[v_grate];
                    v_aburst := ARRAY[v_gburst];
                    v_ac := ARRAY[v_remaining];
                    v_awant := ARRAY[CASE WHEN v_glimit IS NOT NULL THEN v_remaining END];
                ELSE
                    -- The limited kinds among the rows the statement below could take (as many
                    -- as units are left, from the cursor on; jobs after a serial key or beyond the
                    -- units count too: keys they would draw go back below): per kind its limits,
                    -- rows and the permits they want (min(weight, limit) each); and the first
                    -- row's serial key and kind, the rows read and the last one's position.
                    WITH a AS MATERIALIZED (
                        SELECT e.lane_seq, e.kind, awa._job_weight_v1(e.metadata, v_wcap) AS w,
                               COALESCE(e.metadata ? 'awa:serial', false) AS skey
                        FROM awa.ready_entries e
                        WHERE e.ready_slot = v_qslot AND e.lane_id = v_rlane
                          AND e.lane_seq > v_cursor
                        ORDER BY e.lane_seq
                        LIMIT v_remaining
                    ), g0 AS (
                        -- By kind and weight first (a few groups), then the limits of each kind.
                        SELECT a.kind, a.w, min(a.lane_seq) AS first, count(*)::integer AS c
                        FROM a WHERE a.kind = ANY (v_kinds)
                        GROUP BY a.kind, a.w
                    ), g AS (
                        SELECT g0.kind, min(g0.first) AS first, sum(g0.c)::integer AS c,
                               sum(g0.c * LEAST(g0.w, f.max_running))::integer AS want,
                               f.max_running, f.max_seen, f.rate, f.burst
                        FROM g0 JOIN awa.flow_kind_limits f ON f.kind = g0.kind
                        GROUP BY g0.kind, f.max_running, f.max_seen, f.rate, f.burst
                    ), h AS (
                        SELECT bool_or(a.skey) FILTER (WHERE a.lane_seq = v_cursor + 1) AS skey,
                               min(a.kind) FILTER (WHERE a.lane_seq = v_cursor + 1) AS kind,
                               count(*)::integer AS c, max(a.lane_seq) AS last
                        FROM a
                    )
                    SELECT (SELECT h.skey FROM h), (SELECT h.kind FROM h), (SELECT h.c FROM h),
                           (SELECT h.last FROM h),
                           array_agg(g.kind ORDER BY g.first),
                           array_agg(g.max_running ORDER BY g.first),
                           array_agg(g.max_seen ORDER BY g.first),
                           array_agg(g.rate ORDER BY g.first),
                           array_agg(g.burst ORDER BY g.first), array_agg(g.c ORDER BY g.first),
                           array_agg(g.want ORDER BY g.first)
                    INTO v_fskey, v_fkind, v_acount, v_alast, v_akinds, v_amax, v_aseen, v_arate,
                         v_aburst, v_ac, v_awant
                    FROM g;
                    IF v_alast - v_cursor > v_acount THEN
                        -- A gap (a producer's rows not committed yet): only the run before it
                        -- may go through the statement (a row committed in the gap since was not
                        -- counted).
                        SELECT v_cursor + min(x.n) - 1 INTO v_alast
                        FROM (SELECT e.lane_seq, row_number() OVER (ORDER BY e.lane_seq) AS n
                              FROM awa.ready_entries e
                              WHERE e.ready_slot = v_qslot AND e.lane_id = v_rlane
                                AND e.lane_seq > v_cursor
                              ORDER BY e.lane_seq
                              LIMIT v_remaining) x
                        WHERE x.lane_seq <> v_cursor + x.n;
                    END IF;
                END IF;
                v_alast := COALESCE(v_alast, v_cursor);
                -- Each kind, in the order of its first row: a rate token per row (its state locked
                -- as the slow path locks it), then all the permits its rows want, or it is not
                -- cleared (what it took goes back; tokens are counted for rows taken only).
                FOR k IN 1..COALESCE(cardinality(v_akinds), 0) LOOP
                    v_ok := true;
                    v_ri := NULL;
                    IF v_arate[k] IS NOT NULL THEN
                        v_ri := array_position(v_rkinds, v_akinds[k]);
                        IF v_ri IS NULL THEN
                            -- Only the claim's first rate-limited kind waits for its state (never
                            -- two claims waiting for each other; held, the slow path decides). The
                            -- row is made when missing.
                            FOR i IN 1..2 LOOP
                                IF cardinality(v_rkinds) = 0 THEN
                                    SELECT s.tat INTO v_ktat FROM awa.flow_kind_rate_state s
                                    WHERE s.kind = v_akinds[k] FOR UPDATE;
                                ELSE
                                    SELECT s.tat INTO v_ktat FROM awa.flow_kind_rate_state s
                                    WHERE s.kind = v_akinds[k] FOR UPDATE SKIP LOCKED;
                                END IF;
                                v_ok := FOUND;
                                EXIT WHEN v_ok OR i = 2;
                                INSERT INTO awa.flow_kind_rate_state (kind, tat)
                                VALUES (v_akinds[k], now())
                                ON CONFLICT (kind) DO NOTHING;
                            END LOOP;
                            IF v_ok THEN
                                -- As the queue's rate: the clock once the state is locked.
                                v_know := clock_timestamp();
                                v_rkinds := v_rkinds || v_akinds[k];
                                v_rtats := v_rtats || awa._flow_kind_tat_v1(v_arate[k], v_aburst[k],
                                                                             v_ktat, v_know);
                                v_rleft := v_rleft || (awa._flow_kind_tokens_v1(
                                    v_arate[k], v_aburst[k], v_ktat, v_know)).o_tokens;
                                v_rused := v_rused || 0;
                                v_ri := cardinality(v_rkinds);
                            END IF;
                        END IF;
                        v_ok := v_ok AND v_rleft[v_ri] >= v_ac[k];  -- else the rate binds
                    END IF;
                    v_kk := NULL;
                    IF v_ok AND v_amax[k] IS NOT NULL THEN
                        IF v_awant[k] > v_amax[k] THEN
                            v_ok := false;  -- more than the limit
                        ELSE
                            v_kk := awa._flow_kind_take_v1(v_akinds[k], v_amax[k], v_aseen[k],
                                                           v_awant[k],
                                                           v_pheld || v_kkeys || v_pool);
                            IF cardinality(v_kk) < v_awant[k] THEN
                                PERFORM awa.flow_release_v1(v_kk);
                                v_ok := false;  -- the permits bind
                            END IF;
                        END IF;
                    END IF;
                    IF v_ok THEN
                        v_okinds := v_okinds || v_akinds[k];
                        v_okmax := array_append(v_okmax, v_amax[k]);
                        v_okri := array_append(v_okri, v_ri);
                        v_okfrom := array_append(v_okfrom, CASE WHEN v_kk IS NOT NULL
                                                                THEN cardinality(v_pool) + 1 END);
                        v_pool := v_pool || COALESCE(v_kk, '{}');
                        v_okto := array_append(v_okto, cardinality(v_pool));
                    END IF;
                END LOOP;
                IF v_guess THEN
                    v_guess := false;
                    IF cardinality(v_okinds) = 0 THEN
                        v_need_a := true;  -- the kind may bind: read the run, decide exactly
                        CONTINUE;
                    END IF;
                    v_apass := false;  -- a job of another limited kind may run a second pass
                END IF;
                v_npk := cardinality(array_remove(v_okfrom, NULL));
                v_slow := COALESCE(v_fskey, false)
                          OR v_fkind = ANY (v_kinds) AND NOT v_fkind = ANY (v_okinds);
            END IF;
            CONTINUE WHEN NOT v_locked;  -- the kind was asked before the lane is locked: lock it
            -- The run of positions right after the cursor in the current queue slot,
            -- taken while the running sum of weights fits the units left (a prefix: a job that
            -- does not fit stops the lane here, in order).
            CASE v_qslot
            --@each queue_slot
            WHEN {queue_slot} THEN
                IF cardinality(v_kinds) = 0 THEN
                    IF v_remaining = 1 THEN
                        -- One unit left: at most one row read, no window.
                        WITH c AS MATERIALIZED (
                            SELECT e.job_id, e.run_lease, e.ready_slot, e.ready_generation,
                                   e.lane_id, e.lane_seq, e.attempt, e.max_attempts, e.kind, e.args,
                                   e.queue, e.priority, e.progress, e.metadata, e.tags, e.errors,
                                   e.run_at, e.lane_seq = v_cursor + 1 AS run,
                                   EXISTS (SELECT 1 FROM awa.ready_tombstones_{queue_slot} t
                                           WHERE t.lane_id = e.lane_id
                                             AND t.lane_seq = e.lane_seq) AS dead,
                                   COALESCE(awa._deadline_secs_v1(e.deadline_secs), v_default)
                                       AS timeout,
                                   awa._job_weight_v1(e.metadata, v_wcap) AS w,
                                   COALESCE(e.metadata ? 'awa:serial', false) AS s
                            FROM awa.ready_entries_{queue_slot} e
                            WHERE NOT v_slow
                              AND e.lane_id = v_rlane AND e.lane_seq > v_cursor
                            ORDER BY e.lane_seq
                            LIMIT 1
                        ), ins AS (
                            INSERT INTO awa.claims (
                                claim_slot, claim_generation, job_id, run_lease, ready_slot,
                                ready_generation, lane_id, lane_seq, attempt, deadline_at, worker_id,
                                kind, claimed_at)
                            SELECT v_cslot, v_cgen, p.job_id, p.run_lease + 1, p.ready_slot,
                                   p.ready_generation, p.lane_id, p.lane_seq, p.attempt + 1,
                                   now() + make_interval(secs => p.timeout), p_worker, p.kind, v_now
                            FROM c p
                            WHERE p.run AND NOT p.dead AND p.w <= 1 AND v_jobs_left >= 1 AND NOT p.s
                        )
                        SELECT CASE WHEN p.run AND NOT p.dead AND p.w <= 1 AND v_jobs_left >= 1 AND NOT p.s THEN
                                   ARRAY[ROW(p.job_id, p.run_lease + 1, (p.attempt + 1)::smallint,
                                             p.max_attempts, v_cslot, p.kind, p.args, p.queue,
                                             p.priority, now() + make_interval(secs => p.timeout),
                                             p.timeout, p.progress, p.metadata, p.tags, p.errors, p.w,
                                             NULL,  -- no kind keys
                                             NULL,
                                             extract(epoch FROM now() - p.run_at)::double precision
                                            )::awa.claimed_v3] END,
                               CASE WHEN p.run AND NOT p.dead AND p.w <= 1 AND v_jobs_left >= 1 AND NOT p.s THEN p.w ELSE 0 END,
                               CASE WHEN v_slow THEN v_cursor + 1
                                    WHEN p.run AND NOT p.dead AND p.s THEN p.lane_seq END,
                               NULL::integer[], NULL::integer[],  -- no kind keys
                               CASE WHEN p.run AND NOT p.dead AND NOT (p.run AND NOT p.dead AND p.w <= 1 AND v_jobs_left >= 1 AND NOT p.s) THEN p.lane_seq END
                        INTO v_part, v_weight, v_serial_at, v_tkix, v_tkn, v_left_at
                        FROM (SELECT 1) one
                        LEFT JOIN c p ON true;
                    ELSE
                        -- One window over the run right after the cursor: it numbers every row
                        -- read (tombstoned ones too) for the run test, and its running weight,
                        -- count and serial-key flag count only live rows.
                        WITH c AS MATERIALIZED (
                            SELECT f.*,
                                   f.lane_seq = v_cursor + row_number() OVER w AS run,
                                   sum(f.w) FILTER (WHERE NOT f.dead) OVER w AS cw,
                                   count(*) FILTER (WHERE NOT f.dead) OVER w AS k,
                                   bool_or(f.s) FILTER (WHERE NOT f.dead) OVER w AS sk
                            FROM (
                                SELECT e.job_id, e.run_lease, e.ready_slot, e.ready_generation,
                                       e.lane_id, e.lane_seq, e.attempt, e.max_attempts, e.kind,
                                       e.args, e.queue, e.priority, e.progress, e.metadata, e.tags,
                                       e.errors, e.run_at,
                                       EXISTS (SELECT 1 FROM awa.ready_tombstones_{queue_slot} t
                                               WHERE t.lane_id = e.lane_id
                                                 AND t.lane_seq = e.lane_seq) AS dead,
                                       COALESCE(awa._deadline_secs_v1(e.deadline_secs), v_default)
                                           AS timeout,
                                       awa._job_weight_v1(e.metadata, v_wcap) AS w,
                                       COALESCE(e.metadata ? 'awa:serial', false) AS s
                                FROM awa.ready_entries_{queue_slot} e
                                WHERE NOT v_slow
                                  AND e.lane_id = v_rlane AND e.lane_seq > v_cursor
                                ORDER BY e.lane_seq
                                LIMIT v_remaining) f
                            WINDOW w AS (ORDER BY f.lane_seq)
                        ), ins AS (
                            INSERT INTO awa.claims (
                                claim_slot, claim_generation, job_id, run_lease, ready_slot,
                                ready_generation, lane_id, lane_seq, attempt, deadline_at, worker_id,
                                kind, claimed_at)
                            SELECT v_cslot, v_cgen, p.job_id, p.run_lease + 1, p.ready_slot,
                                   p.ready_generation, p.lane_id, p.lane_seq, p.attempt + 1,
                                   now() + make_interval(secs => p.timeout), p_worker, p.kind, v_now
                            FROM c p
                            WHERE p.run AND NOT p.dead AND p.cw <= v_remaining AND p.k <= v_jobs_left AND NOT p.sk
                        )
                        -- The rows of c, not a join with ins; now() is the statement's.
                        SELECT array_agg(ROW(p.job_id, p.run_lease + 1, (p.attempt + 1)::smallint,
                                             p.max_attempts, v_cslot, p.kind, p.args, p.queue,
                                             p.priority, now() + make_interval(secs => p.timeout),
                                             p.timeout, p.progress, p.metadata, p.tags, p.errors, p.w,
                                             NULL,  -- no kind keys
                                             NULL,
                                             extract(epoch FROM now() - p.run_at)::double precision
                                            )::awa.claimed_v3
                                         ORDER BY p.lane_seq)
                                   FILTER (WHERE p.run AND NOT p.dead AND p.cw <= v_remaining AND p.k <= v_jobs_left AND NOT p.sk),
                               COALESCE(sum(p.w) FILTER (WHERE p.run AND NOT p.dead AND p.cw <= v_remaining AND p.k <= v_jobs_left AND NOT p.sk), 0),
                               CASE WHEN v_slow THEN v_cursor + 1
                                    ELSE min(p.lane_seq) FILTER (WHERE p.run AND NOT p.dead AND p.s)
                               END,
                               NULL::integer[], NULL::integer[],  -- no kind keys
                               -- The first live row of the run not taken (the taken ones are a prefix).
                               min(p.lane_seq) FILTER (WHERE p.run AND NOT p.dead AND NOT (p.run AND NOT p.dead AND p.cw <= v_remaining AND p.k <= v_jobs_left AND NOT p.sk))
                        INTO v_part, v_weight, v_serial_at, v_tkix, v_tkn, v_left_at
                        FROM c p;
                    END IF;
                ELSE
                    WITH found AS MATERIALIZED (
                        SELECT e.*,
                               EXISTS (SELECT 1 FROM awa.ready_tombstones_{queue_slot} t
                                       WHERE t.lane_id = e.lane_id
                                         AND t.lane_seq = e.lane_seq) AS dead,
                               row_number() OVER (ORDER BY e.lane_seq) AS n
                        FROM awa.ready_entries_{queue_slot} e
                        WHERE NOT v_slow
                          AND e.lane_id = v_rlane AND e.lane_seq > v_cursor
                        ORDER BY e.lane_seq
                        LIMIT v_remaining
                    ), weighed AS MATERIALIZED (
                        SELECT f.*, COALESCE(awa._deadline_secs_v1(f.deadline_secs), v_default) AS timeout,
                               awa._job_weight_v1(f.metadata, v_wcap) AS w,
                               -- A job of a limited kind goes on only when its kind was cleared for it.
                               COALESCE(f.metadata ? 'awa:serial'
                                        OR f.kind = ANY (v_kinds)
                                           AND NOT (f.lane_seq <= v_alast AND f.kind = ANY (v_okinds)),
                                        false) AS s,
                               CASE WHEN cardinality(v_okinds) > 0 AND f.lane_seq <= v_alast
                                    THEN array_position(v_okinds, f.kind) END AS kix,
                               -- Its number of keys: min(weight, limit) for a cleared kind with a limit.
                               CASE WHEN v_npk > 0 AND f.lane_seq <= v_alast
                                         AND v_okmax[array_position(v_okinds, f.kind)] IS NOT NULL
                                    THEN LEAST(awa._job_weight_v1(f.metadata, v_wcap),
                                               v_okmax[array_position(v_okinds, f.kind)]) END AS kn
                        FROM found f
                        WHERE f.lane_seq = v_cursor + f.n AND NOT f.dead
                    ), picked AS MATERIALIZED (
                        -- Up to the first job with a serial key (the slow path below decides about it).
                        SELECT z.* FROM (
                            SELECT g.*, sum(g.w) OVER (ORDER BY g.lane_seq) AS cw,
                                   row_number() OVER (ORDER BY g.lane_seq) AS k,
                                   bool_or(g.s) OVER (ORDER BY g.lane_seq) AS sk,
                                   sum(g.kn) OVER (ORDER BY g.lane_seq) AS kcum
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
                    ), offs AS (
                        -- Each picked row's first key in its cleared kind's pool (rows of a kind draw in
                        -- lane order); read (so computed) only when some row has kind keys.
                        SELECT array_agg(o.off ORDER BY o.k) AS a
                        FROM (SELECT p.k, (sum(p.kn) OVER (PARTITION BY p.kix ORDER BY p.k) - p.kn)::integer
                                     AS off
                              FROM picked p) o
                    )
                    -- The rows of picked, not a join with ins (the planner, expecting one row from each,
                    -- joined them in a nested loop: 512² comparisons): ins runs to completion anyway, and
                    -- now() is the statement's, so the deadline is the one written.
                    SELECT array_agg(ROW(p.job_id, p.run_lease + 1, (p.attempt + 1)::smallint,
                                         p.max_attempts, v_cslot, p.kind, p.args, p.queue, p.priority,
                                         now() + make_interval(secs => p.timeout), p.timeout, p.progress,
                                         p.metadata, p.tags, p.errors, p.w,
                                         -- A cleared kind's keys: its rows draw them in lane order. With
                                         -- one such kind, the pool's in lane order; with more, by
                                         -- offsets per kind (an init plan, computed only then).
                                         CASE WHEN p.kn IS NULL THEN NULL
                                              WHEN v_npk = 1 THEN v_pool[p.kcum - p.kn + 1:p.kcum]
                                              ELSE v_pool[v_okfrom[p.kix] + (SELECT o.a FROM offs o)[p.k]
                                                          : v_okfrom[p.kix] + (SELECT o.a FROM offs o)[p.k]
                                                            + p.kn - 1] END,
                                         NULL,
                                         extract(epoch FROM now() - p.run_at)::double precision
                                        )::awa.claimed_v3
                                     ORDER BY p.lane_seq),
                           COALESCE(sum(p.w), 0),
                           CASE WHEN v_slow THEN v_cursor + 1
                                ELSE (SELECT min(g.lane_seq) FROM weighed g WHERE g.s) END,
                           array_agg(p.kix) FILTER (WHERE p.kix IS NOT NULL),
                           array_agg(p.kn) FILTER (WHERE p.kix IS NOT NULL),
                           -- The first row left (not taken, not dead): whether the job that stopped the
                           -- statement is the one at v_serial_at, or one before it that did not fit.
                           (SELECT min(g.lane_seq) FROM weighed g
                            WHERE g.lane_seq > COALESCE((SELECT max(p2.lane_seq) FROM picked p2),
                                                        v_cursor))
                    INTO v_part, v_weight, v_serial_at, v_tkix, v_tkn, v_left_at
                    FROM picked p;
                END IF;
            --@end
            ELSE
                IF cardinality(v_kinds) = 0 THEN
                    IF v_remaining = 1 THEN
                        -- One unit left: at most one row read, no window.
                        WITH c AS MATERIALIZED (
                            SELECT e.job_id, e.run_lease, e.ready_slot, e.ready_generation,
                                   e.lane_id, e.lane_seq, e.attempt, e.max_attempts, e.kind, e.args,
                                   e.queue, e.priority, e.progress, e.metadata, e.tags, e.errors,
                                   e.run_at, e.lane_seq = v_cursor + 1 AS run,
                                   EXISTS (SELECT 1 FROM awa.ready_tombstones t
                                           WHERE t.ready_slot = v_qslot AND t.lane_id = e.lane_id
                                             AND t.lane_seq = e.lane_seq) AS dead,
                                   COALESCE(awa._deadline_secs_v1(e.deadline_secs), v_default)
                                       AS timeout,
                                   awa._job_weight_v1(e.metadata, v_wcap) AS w,
                                   COALESCE(e.metadata ? 'awa:serial', false) AS s
                            FROM awa.ready_entries e
                            WHERE NOT v_slow
                              AND e.ready_slot = v_qslot AND e.lane_id = v_rlane AND e.lane_seq > v_cursor
                            ORDER BY e.lane_seq
                            LIMIT 1
                        ), ins AS (
                            INSERT INTO awa.claims (
                                claim_slot, claim_generation, job_id, run_lease, ready_slot,
                                ready_generation, lane_id, lane_seq, attempt, deadline_at, worker_id,
                                kind, claimed_at)
                            SELECT v_cslot, v_cgen, p.job_id, p.run_lease + 1, p.ready_slot,
                                   p.ready_generation, p.lane_id, p.lane_seq, p.attempt + 1,
                                   now() + make_interval(secs => p.timeout), p_worker, p.kind, v_now
                            FROM c p
                            WHERE p.run AND NOT p.dead AND p.w <= 1 AND v_jobs_left >= 1 AND NOT p.s
                        )
                        SELECT CASE WHEN p.run AND NOT p.dead AND p.w <= 1 AND v_jobs_left >= 1 AND NOT p.s THEN
                                   ARRAY[ROW(p.job_id, p.run_lease + 1, (p.attempt + 1)::smallint,
                                             p.max_attempts, v_cslot, p.kind, p.args, p.queue,
                                             p.priority, now() + make_interval(secs => p.timeout),
                                             p.timeout, p.progress, p.metadata, p.tags, p.errors, p.w,
                                             NULL,  -- no kind keys
                                             NULL,
                                             extract(epoch FROM now() - p.run_at)::double precision
                                            )::awa.claimed_v3] END,
                               CASE WHEN p.run AND NOT p.dead AND p.w <= 1 AND v_jobs_left >= 1 AND NOT p.s THEN p.w ELSE 0 END,
                               CASE WHEN v_slow THEN v_cursor + 1
                                    WHEN p.run AND NOT p.dead AND p.s THEN p.lane_seq END,
                               NULL::integer[], NULL::integer[],  -- no kind keys
                               CASE WHEN p.run AND NOT p.dead AND NOT (p.run AND NOT p.dead AND p.w <= 1 AND v_jobs_left >= 1 AND NOT p.s) THEN p.lane_seq END
                        INTO v_part, v_weight, v_serial_at, v_tkix, v_tkn, v_left_at
                        FROM (SELECT 1) one
                        LEFT JOIN c p ON true;
                    ELSE
                        -- One window over the run right after the cursor: it numbers every row
                        -- read (tombstoned ones too) for the run test, and its running weight,
                        -- count and serial-key flag count only live rows.
                        WITH c AS MATERIALIZED (
                            SELECT f.*,
                                   f.lane_seq = v_cursor + row_number() OVER w AS run,
                                   sum(f.w) FILTER (WHERE NOT f.dead) OVER w AS cw,
                                   count(*) FILTER (WHERE NOT f.dead) OVER w AS k,
                                   bool_or(f.s) FILTER (WHERE NOT f.dead) OVER w AS sk
                            FROM (
                                SELECT e.job_id, e.run_lease, e.ready_slot, e.ready_generation,
                                       e.lane_id, e.lane_seq, e.attempt, e.max_attempts, e.kind,
                                       e.args, e.queue, e.priority, e.progress, e.metadata, e.tags,
                                       e.errors, e.run_at,
                                       EXISTS (SELECT 1 FROM awa.ready_tombstones t
                                               WHERE t.ready_slot = v_qslot AND t.lane_id = e.lane_id
                                                 AND t.lane_seq = e.lane_seq) AS dead,
                                       COALESCE(awa._deadline_secs_v1(e.deadline_secs), v_default)
                                           AS timeout,
                                       awa._job_weight_v1(e.metadata, v_wcap) AS w,
                                       COALESCE(e.metadata ? 'awa:serial', false) AS s
                                FROM awa.ready_entries e
                                WHERE NOT v_slow
                                  AND e.ready_slot = v_qslot AND e.lane_id = v_rlane AND e.lane_seq > v_cursor
                                ORDER BY e.lane_seq
                                LIMIT v_remaining) f
                            WINDOW w AS (ORDER BY f.lane_seq)
                        ), ins AS (
                            INSERT INTO awa.claims (
                                claim_slot, claim_generation, job_id, run_lease, ready_slot,
                                ready_generation, lane_id, lane_seq, attempt, deadline_at, worker_id,
                                kind, claimed_at)
                            SELECT v_cslot, v_cgen, p.job_id, p.run_lease + 1, p.ready_slot,
                                   p.ready_generation, p.lane_id, p.lane_seq, p.attempt + 1,
                                   now() + make_interval(secs => p.timeout), p_worker, p.kind, v_now
                            FROM c p
                            WHERE p.run AND NOT p.dead AND p.cw <= v_remaining AND p.k <= v_jobs_left AND NOT p.sk
                        )
                        -- The rows of c, not a join with ins; now() is the statement's.
                        SELECT array_agg(ROW(p.job_id, p.run_lease + 1, (p.attempt + 1)::smallint,
                                             p.max_attempts, v_cslot, p.kind, p.args, p.queue,
                                             p.priority, now() + make_interval(secs => p.timeout),
                                             p.timeout, p.progress, p.metadata, p.tags, p.errors, p.w,
                                             NULL,  -- no kind keys
                                             NULL,
                                             extract(epoch FROM now() - p.run_at)::double precision
                                            )::awa.claimed_v3
                                         ORDER BY p.lane_seq)
                                   FILTER (WHERE p.run AND NOT p.dead AND p.cw <= v_remaining AND p.k <= v_jobs_left AND NOT p.sk),
                               COALESCE(sum(p.w) FILTER (WHERE p.run AND NOT p.dead AND p.cw <= v_remaining AND p.k <= v_jobs_left AND NOT p.sk), 0),
                               CASE WHEN v_slow THEN v_cursor + 1
                                    ELSE min(p.lane_seq) FILTER (WHERE p.run AND NOT p.dead AND p.s)
                               END,
                               NULL::integer[], NULL::integer[],  -- no kind keys
                               -- The first live row of the run not taken (the taken ones are a prefix).
                               min(p.lane_seq) FILTER (WHERE p.run AND NOT p.dead AND NOT (p.run AND NOT p.dead AND p.cw <= v_remaining AND p.k <= v_jobs_left AND NOT p.sk))
                        INTO v_part, v_weight, v_serial_at, v_tkix, v_tkn, v_left_at
                        FROM c p;
                    END IF;
                ELSE
                    WITH found AS MATERIALIZED (
                        SELECT e.*,
                               EXISTS (SELECT 1 FROM awa.ready_tombstones t
                                       WHERE t.ready_slot = v_qslot AND t.lane_id = e.lane_id
                                         AND t.lane_seq = e.lane_seq) AS dead,
                               row_number() OVER (ORDER BY e.lane_seq) AS n
                        FROM awa.ready_entries e
                        WHERE NOT v_slow
                          AND e.ready_slot = v_qslot AND e.lane_id = v_rlane AND e.lane_seq > v_cursor
                        ORDER BY e.lane_seq
                        LIMIT v_remaining
                    ), weighed AS MATERIALIZED (
                        SELECT f.*, COALESCE(awa._deadline_secs_v1(f.deadline_secs), v_default) AS timeout,
                               awa._job_weight_v1(f.metadata, v_wcap) AS w,
                               -- A job of a limited kind goes on only when its kind was cleared for it.
                               COALESCE(f.metadata ? 'awa:serial'
                                        OR f.kind = ANY (v_kinds)
                                           AND NOT (f.lane_seq <= v_alast AND f.kind = ANY (v_okinds)),
                                        false) AS s,
                               CASE WHEN cardinality(v_okinds) > 0 AND f.lane_seq <= v_alast
                                    THEN array_position(v_okinds, f.kind) END AS kix,
                               -- Its number of keys: min(weight, limit) for a cleared kind with a limit.
                               CASE WHEN v_npk > 0 AND f.lane_seq <= v_alast
                                         AND v_okmax[array_position(v_okinds, f.kind)] IS NOT NULL
                                    THEN LEAST(awa._job_weight_v1(f.metadata, v_wcap),
                                               v_okmax[array_position(v_okinds, f.kind)]) END AS kn
                        FROM found f
                        WHERE f.lane_seq = v_cursor + f.n AND NOT f.dead
                    ), picked AS MATERIALIZED (
                        -- Up to the first job with a serial key (the slow path below decides about it).
                        SELECT z.* FROM (
                            SELECT g.*, sum(g.w) OVER (ORDER BY g.lane_seq) AS cw,
                                   row_number() OVER (ORDER BY g.lane_seq) AS k,
                                   bool_or(g.s) OVER (ORDER BY g.lane_seq) AS sk,
                                   sum(g.kn) OVER (ORDER BY g.lane_seq) AS kcum
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
                    ), offs AS (
                        -- Each picked row's first key in its cleared kind's pool (rows of a kind draw in
                        -- lane order); read (so computed) only when some row has kind keys.
                        SELECT array_agg(o.off ORDER BY o.k) AS a
                        FROM (SELECT p.k, (sum(p.kn) OVER (PARTITION BY p.kix ORDER BY p.k) - p.kn)::integer
                                     AS off
                              FROM picked p) o
                    )
                    -- The rows of picked, not a join with ins (the planner, expecting one row from each,
                    -- joined them in a nested loop: 512² comparisons): ins runs to completion anyway, and
                    -- now() is the statement's, so the deadline is the one written.
                    SELECT array_agg(ROW(p.job_id, p.run_lease + 1, (p.attempt + 1)::smallint,
                                         p.max_attempts, v_cslot, p.kind, p.args, p.queue, p.priority,
                                         now() + make_interval(secs => p.timeout), p.timeout, p.progress,
                                         p.metadata, p.tags, p.errors, p.w,
                                         -- A cleared kind's keys: its rows draw them in lane order. With
                                         -- one such kind, the pool's in lane order; with more, by
                                         -- offsets per kind (an init plan, computed only then).
                                         CASE WHEN p.kn IS NULL THEN NULL
                                              WHEN v_npk = 1 THEN v_pool[p.kcum - p.kn + 1:p.kcum]
                                              ELSE v_pool[v_okfrom[p.kix] + (SELECT o.a FROM offs o)[p.k]
                                                          : v_okfrom[p.kix] + (SELECT o.a FROM offs o)[p.k]
                                                            + p.kn - 1] END,
                                         NULL,
                                         extract(epoch FROM now() - p.run_at)::double precision
                                        )::awa.claimed_v3
                                     ORDER BY p.lane_seq),
                           COALESCE(sum(p.w), 0),
                           CASE WHEN v_slow THEN v_cursor + 1
                                ELSE (SELECT min(g.lane_seq) FROM weighed g WHERE g.s) END,
                           array_agg(p.kix) FILTER (WHERE p.kix IS NOT NULL),
                           array_agg(p.kn) FILTER (WHERE p.kix IS NOT NULL),
                           -- The first row left (not taken, not dead): whether the job that stopped the
                           -- statement is the one at v_serial_at, or one before it that did not fit.
                           (SELECT min(g.lane_seq) FROM weighed g
                            WHERE g.lane_seq > COALESCE((SELECT max(p2.lane_seq) FROM picked p2),
                                                        v_cursor))
                    INTO v_part, v_weight, v_serial_at, v_tkix, v_tkn, v_left_at
                    FROM picked p;
                END IF;
            END CASE;
            v_got := COALESCE(cardinality(v_part), 0);
            IF v_got > 0 THEN
                v_batch := v_batch || v_part;
                v_remaining := v_remaining - v_weight;
                v_jobs_left := v_jobs_left - v_got;
            END IF;
            IF cardinality(v_okinds) > 0 THEN
                -- Each cleared kind's rows taken use its rate tokens; the keys they drew (the first
                -- of its pool) are the claim's, the rest (rows not taken after all) go back.
                SELECT array_agg(COALESCE(x.c, 0) ORDER BY g.i),
                       array_agg(COALESCE(x.d, 0) ORDER BY g.i)
                INTO v_tc, v_td
                FROM generate_series(1, cardinality(v_okinds)) AS g(i)
                LEFT JOIN (SELECT t.i, count(*)::integer AS c, COALESCE(sum(t.kn), 0)::integer AS d
                           FROM unnest(v_tkix, v_tkn) AS t(i, kn) GROUP BY t.i) x ON x.i = g.i;
                v_free := '{}';
                FOR k IN 1..cardinality(v_okinds) LOOP
                    IF v_okri[k] IS NOT NULL THEN
                        v_rleft[v_okri[k]] := v_rleft[v_okri[k]] - v_tc[k];
                        v_rused[v_okri[k]] := v_rused[v_okri[k]] + v_tc[k];
                    END IF;
                    IF v_okfrom[k] IS NOT NULL THEN
                        v_kkeys := v_kkeys || v_pool[v_okfrom[k]:v_okfrom[k] + v_td[k] - 1];
                        v_free := v_free || v_pool[v_okfrom[k] + v_td[k]:v_okto[k]];
                    END IF;
                END LOOP;
                IF cardinality(v_free) > 0 THEN
                    PERFORM awa.flow_release_v1(v_free);
                END IF;
            END IF;
            IF v_serial_at IS NOT NULL AND v_left_at = v_serial_at AND NOT v_apass
               AND NOT v_slow AND v_remaining > 0 AND v_jobs_left > 0 THEN
                -- A job of a limited kind (or with a serial key) stopped the statement: the
                -- kinds of the run from it on are read, and the statement runs again from it
                -- (every position before it is claimed or dead).
                v_cursor := v_serial_at - 1;
                v_need_a := true;
                CONTINUE;
            END IF;
            EXIT;
        END LOOP;
        IF v_skipped THEN
            -- Keys the lane's next kind was asked for before its lock go back.
            IF cardinality(v_pool) > 0 THEN
                PERFORM awa.flow_release_v1(v_pool);
            END IF;
            CONTINUE;
        END IF;
        EXIT WHEN v_remaining <= 0 OR v_jobs_left <= 0;
        IF v_serial_at IS NOT NULL THEN
            -- A job with a serial key is next: the rest of this lane takes the slow path.
            SELECT x.o_rows, x.o_taken, x.o_units, x.o_retry, x.o_kkeys, x.o_rkinds, x.o_rtats,
                   x.o_rleft, x.o_rused, x.o_wait
            INTO v_srows, v_taken, v_sunits, v_sretry, v_kkeys, v_rkinds, v_rtats, v_rleft,
                 v_rused, v_kwait
            FROM awa._claim_kind_v1(v_rlane, awa.lane_cursor_v1(v_rlane), v_cslot, v_cgen,
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
        -- Then, when the lane may hold more, from every ready slot.
        CONTINUE WHEN COALESCE(pg_sequence_last_value(v_seq), 0) <= v_cursor + v_got;
        IF v_got > 0 THEN
            v_cursor := awa.lane_cursor_v1(v_rlane);  -- sees the claims just made
        END IF;
        WITH weighed AS MATERIALIZED (
            SELECT e.*, COALESCE(awa._deadline_secs_v1(e.deadline_secs), v_default) AS timeout,
                   awa._job_weight_v1(e.metadata, v_wcap) AS w,
                   COALESCE(e.metadata ? 'awa:serial' OR e.kind = ANY (v_kinds), false) AS s
            FROM awa.ready_entries e
            WHERE e.lane_id = v_rlane AND e.lane_seq > v_cursor
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
            FROM awa._claim_kind_v1(v_rlane, awa.lane_cursor_v1(v_rlane), v_cslot, v_cgen,
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
    -- Every permit this session holds or hands out now: a permit above a limit is taken only
    -- when none of these is it (advisory locks are re-entrant within a session).
    v_mine := COALESCE(p_held, '{}') || COALESCE(v_keys, '{}')
              || ARRAY(SELECT k FROM unnest(v_batch) AS b, unnest(b.permits) AS k);
    FOREACH v_row IN ARRAY v_batch LOOP
        IF v_keys IS NOT NULL THEN
            -- The queue's permits, then the kind's (from the slow path).
            v_row.permits := v_keys[v_used + 1:v_used + v_row.weight]
                             || COALESCE(v_row.permits, '{}');
            v_used := v_used + v_row.weight;
        END IF;
        -- A job heavier than a limit counts as the limit while it holds, so that it can run;
        -- it also takes the permits above the limit up to its weight (bounded by what this
        -- process could give it), which nobody takes while the limit holds, so that a raised
        -- limit counts it in full and the sum of what runs never passes the limit in force.
        v_true := awa._job_weight_v1(v_row.metadata, v_pcap);
        IF v_true > 1 THEN
            IF v_limit.max_running IS NOT NULL AND v_true > v_limit.max_running THEN
                v_above := awa._flow_take_above_v1(
                    ARRAY(SELECT awa._flow_key_v1(p_queue, i)
                          FROM generate_series(v_limit.max_running, v_true - 1) AS i),
                    v_mine);
                v_row.permits := v_row.permits || v_above;
                v_mine := v_mine || v_above;
            END IF;
            IF v_row.kind = ANY (v_kinds) THEN
                SELECT k.max_running INTO v_klimit
                FROM awa.flow_kind_limits k WHERE k.kind = v_row.kind;
                IF v_klimit IS NOT NULL AND v_true > v_klimit THEN
                    v_above := awa._flow_take_above_v1(
                        ARRAY(SELECT awa._flow_kind_key_v1(v_row.kind, i)
                              FROM generate_series(v_klimit, v_true - 1) AS i),
                        v_mine);
                    v_row.permits := COALESCE(v_row.permits, '{}') || v_above;
                    v_mine := v_mine || v_above;
                END IF;
            END IF;
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

-- The slow path of awa.claim_v3 for one lane whose next rows include a job with a serial key
-- or of a kind with flow limits (p_kinds): as awa._claim_serial_v1, and a job of a
-- limited kind is decided by its kind first: it takes min(weight, limit) permits of its kind
-- (p_pheld and p_kkeys: this session's permits, never taken twice) and, when the kind has a
-- rate, one of its rate tokens, or it is parked in awa.flow_waiting (taking no serial key).
-- Rate state per kind lives for the whole claim in the p_r*/o_r* arrays (kind, base time,
-- tokens left, jobs started); the first rate-limited kind of a claim waits for its state row,
-- later ones do not (another claim holding one stops the lane with o_retry: never two claims
-- waiting for each other). o_kkeys: kind permits taken by the claim so far; o_wait: the
-- seconds until the next token of a kind whose job the rate parked (NULL: none).
--
-- How (the decisions are those of one pass over the rows in lane order; only the statements
-- differ). The lane's next rows are read into arrays, first as many as could be taken
-- (min(p_units, p_jobs, 512)). When none of them has a serial key, the run of them that fits
-- the units and jobs is looked at per limited kind (one statement); each kind's rate state is
-- read and its permits are taken in bulk (one awa._flow_kind_take_v1 call, for the sum of
-- min(weight, limit) over its rows in the run); when every kind has the tokens and permits for
-- all its rows there (the common case: no limit binds), the run is taken. Else every permit
-- taken goes back (rate states read stay, no token used) and the rest of the window (v_scan
-- rows in all) is read. With a serial key in the window, its rows are decided one by one with
-- statements per row (the serial tests read claims and waiting rows this claim may just have
-- written). Without, in lane order on the arrays: a kind's permits are taken at its first row
-- that needs them, as many as its rows here could use (at most the limit and the units left,
-- over no more rows than the jobs and rate tokens left); its rows draw their keys from that
-- pool in lane order, a row the pool cannot serve is parked (the kind is not asked again in
-- this call), and keys no taken row drew go back before the function returns. Either way one
-- statement then writes the claims of the rows decided, the closures and awa.flow_waiting rows
-- of the parked ones, and builds the rows taken.
CREATE OR REPLACE FUNCTION awa._claim_kind_v1(
    p_lane integer, p_cursor bigint, p_cslot integer, p_cgen bigint, p_worker uuid,
    p_units integer, p_jobs integer, p_wcap integer, p_default double precision,
    p_held integer[], p_taken integer[], p_lanes integer[], p_bounds bigint[], p_kinds text[],
    p_pheld integer[], p_kkeys integer[], p_rkinds text[], p_rtats timestamp with time zone[],
    p_rleft integer[], p_rused integer[], OUT o_rows awa.claimed_v3[], OUT o_taken integer[],
    OUT o_units integer, OUT o_retry boolean, OUT o_kkeys integer[], OUT o_rkinds text[],
    OUT o_rtats timestamp with time zone[], OUT o_rleft integer[], OUT o_rused integer[],
    OUT o_wait double precision)
 RETURNS record
 LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    e record;
    kl awa.flow_kind_limits%ROWTYPE;
    v_lock integer;
    v_park boolean;
    v_kpark boolean;
    v_kk integer[];
    v_i integer;
    v_tat timestamptz;
    v_know timestamptz;
    v_tokens integer;
    v_period double precision;
    v_burst integer;
    v_w double precision;
    v_lease bigint;
    v_deadline timestamptz;
    v_scan integer := LEAST(LEAST(p_units, p_jobs) * 2 + 64, 512);
    v_first integer := LEAST(p_units, p_jobs, 512);
    v_seen integer := 0;
    v_jobs integer := 0;
    -- The window, in lane order: the rows, their kinds, weights and whether the kind is limited.
    v_win awa.ready_entries[];
    v_wkind text[];
    v_ww integer[];
    v_wlim boolean[];
    v_serial boolean;
    -- The rest of the window, when read.
    v_more awa.ready_entries[];
    v_mkind text[];
    v_mw integer[];
    v_mlim boolean[];
    v_mserial boolean;
    -- The prefix that fits: its rows and units.
    v_fit integer;
    v_fitw integer;
    v_fast boolean := false;
    -- Per limited kind (of the prefix, then of the window): its limits, its rows in the prefix
    -- and the permits they want, its index in o_rkinds (when rate-limited), and its pool of
    -- permits v_pool[v_pfrom:v_pto], of which v_pnext is the next to draw.
    v_kinds text[];
    v_lmax integer[];
    v_lseen integer[];
    v_lrate double precision[];
    v_lburst integer[];
    v_kc integer[];
    v_kwant integer[];
    v_rix integer[];
    v_pool integer[] := '{}';
    v_pfrom integer[];
    v_pnext integer[];
    v_pto integer[];
    -- Rows 1 .. v_m are decided: all taken, or (the loop) parked by their kind when v_parked.
    v_parked boolean[] := '{}';
    v_m integer := 0;
    v_k integer;
    v_need integer;
    v_want integer;
    v_cap integer;
    v_left integer;
    v_free integer[] := '{}';
BEGIN
    o_rows := '{}';
    o_taken := COALESCE(p_taken, '{}');
    o_units := 0;
    o_retry := false;
    o_kkeys := COALESCE(p_kkeys, '{}');
    o_rkinds := COALESCE(p_rkinds, '{}');
    o_rtats := COALESCE(p_rtats, '{}');
    o_rleft := COALESCE(p_rleft, '{}');
    o_rused := COALESCE(p_rused, '{}');
    SELECT array_agg(s.r ORDER BY s.lane_seq), array_agg(s.kind ORDER BY s.lane_seq),
           array_agg(s.w ORDER BY s.lane_seq), array_agg(s.lim ORDER BY s.lane_seq),
           COALESCE(bool_or(s.skey), false),
           count(*) FILTER (WHERE s.cw <= p_units AND s.n <= p_jobs),
           max(s.cw) FILTER (WHERE s.cw <= p_units AND s.n <= p_jobs)
    INTO v_win, v_wkind, v_ww, v_wlim, v_serial, v_fit, v_fitw
    FROM (SELECT y.*, sum(y.w) OVER (ORDER BY y.lane_seq) AS cw,
                 row_number() OVER (ORDER BY y.lane_seq) AS n
          FROM (SELECT x AS r, x.lane_seq, x.kind, awa._job_weight_v1(x.metadata, p_wcap) AS w,
                       COALESCE(x.kind = ANY (p_kinds), false) AS lim,
                       x.metadata ->> 'awa:serial' IS NOT NULL AS skey
                FROM awa.ready_entries x
                WHERE x.lane_id = p_lane AND x.lane_seq > p_cursor
                  AND NOT EXISTS (
                      SELECT 1 FROM awa.ready_tombstones t
                      WHERE t.lane_id = x.lane_id AND t.lane_seq = x.lane_seq
                        AND t.ready_slot = x.ready_slot)
                ORDER BY x.lane_seq
                LIMIT v_first) y) s;
    IF v_win IS NULL THEN
        RETURN;
    END IF;

    IF NOT v_serial THEN
        -- The prefix that fits, when no kind binds there. Its limited kinds in the order of
        -- their first rows, with their limits, rows and permits wanted.
        v_fast := true;
        SELECT array_agg(g.kind ORDER BY g.first), array_agg(f.max_running ORDER BY g.first),
               array_agg(f.max_seen ORDER BY g.first), array_agg(f.rate ORDER BY g.first),
               array_agg(f.burst ORDER BY g.first), array_agg(g.c ORDER BY g.first),
               array_agg((SELECT sum(LEAST(x.w, f.max_running)) FROM unnest(g.ws) AS x(w))::integer
                         ORDER BY g.first)
        INTO v_kinds, v_lmax, v_lseen, v_lrate, v_lburst, v_kc, v_kwant
        FROM (SELECT u.kind, min(u.i) AS first, count(*)::integer AS c, array_agg(u.w) AS ws
              FROM unnest(v_wkind[1:v_fit], v_ww[1:v_fit], v_wlim[1:v_fit])
                   WITH ORDINALITY AS u(kind, w, lim, i)
              WHERE u.lim
              GROUP BY u.kind) g
        LEFT JOIN awa.flow_kind_limits f ON f.kind = g.kind;
        IF v_kinds IS NOT NULL THEN
            v_rix := array_fill(NULL::integer, ARRAY[cardinality(v_kinds)]);
            v_pfrom := v_rix;
            v_pnext := v_rix;
            v_pto := v_rix;
        END IF;
        FOR k IN 1..COALESCE(cardinality(v_kinds), 0) LOOP
            IF v_lrate[k] IS NOT NULL THEN
                v_i := array_position(o_rkinds, v_kinds[k]);
                IF v_i IS NULL THEN
                    -- As in the loop below: the first rate-limited kind of the claim waits for
                    -- its state, a later one held by another claim makes the loop decide.
                    v_period := 1.0 / v_lrate[k];
                    v_burst := COALESCE(v_lburst[k], GREATEST(1, ceil(v_lrate[k] / 10)::integer));
                    INSERT INTO awa.flow_kind_rate_state (kind, tat) VALUES (v_kinds[k], now())
                    ON CONFLICT (kind) DO NOTHING;
                    IF cardinality(o_rkinds) = 0 THEN
                        SELECT s.tat INTO v_tat FROM awa.flow_kind_rate_state s
                        WHERE s.kind = v_kinds[k] FOR UPDATE;
                    ELSE
                        SELECT s.tat INTO v_tat FROM awa.flow_kind_rate_state s
                        WHERE s.kind = v_kinds[k] FOR UPDATE SKIP LOCKED;
                        IF NOT FOUND THEN
                            v_fast := false;
                            EXIT;
                        END IF;
                    END IF;
                    v_know := clock_timestamp();
                    v_tokens := (awa._flow_kind_tokens_v1(v_lrate[k], v_lburst[k], v_tat,
                                                          v_know)).o_tokens;
                    o_rkinds := o_rkinds || v_kinds[k];
                    o_rtats := o_rtats || awa._flow_kind_tat_v1(v_lrate[k], v_lburst[k], v_tat,
                                                                 v_know);
                    o_rleft := o_rleft || v_tokens;
                    o_rused := o_rused || 0;
                    v_i := cardinality(o_rkinds);
                END IF;
                v_rix[k] := v_i;
                IF o_rleft[v_i] < v_kc[k] THEN
                    v_fast := false;  -- the rate binds
                    EXIT;
                END IF;
            END IF;
            IF v_lmax[k] IS NOT NULL THEN
                IF v_kwant[k] > v_lmax[k] THEN
                    v_fast := false;  -- more than the limit
                    EXIT;
                END IF;
                v_kk := awa._flow_kind_take_v1(v_kinds[k], v_lmax[k], v_lseen[k], v_kwant[k],
                                               COALESCE(p_pheld, '{}') || o_kkeys || v_pool);
                v_pfrom[k] := cardinality(v_pool) + 1;
                v_pool := v_pool || v_kk;
                v_pto[k] := cardinality(v_pool);
                v_pnext[k] := v_pto[k] + 1;  -- all drawn, when the prefix is taken
                IF cardinality(v_kk) < v_kwant[k] THEN
                    v_fast := false;  -- the permits bind
                    EXIT;
                END IF;
            END IF;
        END LOOP;
        IF v_fast THEN
            v_m := v_fit;
            o_units := COALESCE(v_fitw, 0);
            v_jobs := v_fit;
            v_seen := LEAST(v_fit + 1, cardinality(v_win));
            FOR k IN 1..COALESCE(cardinality(v_kinds), 0) LOOP
                CONTINUE WHEN v_rix[k] IS NULL;
                o_rleft[v_rix[k]] := o_rleft[v_rix[k]] - v_kc[k];
                o_rused[v_rix[k]] := o_rused[v_rix[k]] + v_kc[k];
            END LOOP;
        ELSE
            -- A kind binds: its permits and the others' go back, the loop decides. Rate states
            -- read stay in o_r* (no token used), as the loop would have read them.
            PERFORM awa.flow_release_v1(v_pool);
            v_pool := '{}';
        END IF;
    END IF;

    IF NOT v_fast THEN
        -- The rest of the window.
        IF cardinality(v_win) = v_first AND v_first < v_scan THEN
            SELECT array_agg(y.r ORDER BY y.lane_seq), array_agg(y.kind ORDER BY y.lane_seq),
                   array_agg(y.w ORDER BY y.lane_seq), array_agg(y.lim ORDER BY y.lane_seq),
                   COALESCE(bool_or(y.skey), false)
            INTO v_more, v_mkind, v_mw, v_mlim, v_mserial
            FROM (SELECT x AS r, x.lane_seq, x.kind,
                         awa._job_weight_v1(x.metadata, p_wcap) AS w,
                         COALESCE(x.kind = ANY (p_kinds), false) AS lim,
                         x.metadata ->> 'awa:serial' IS NOT NULL AS skey
                  FROM awa.ready_entries x
                  WHERE x.lane_id = p_lane
                    AND x.lane_seq > (v_win[cardinality(v_win)]).lane_seq
                    AND NOT EXISTS (
                        SELECT 1 FROM awa.ready_tombstones t
                        WHERE t.lane_id = x.lane_id AND t.lane_seq = x.lane_seq
                          AND t.ready_slot = x.ready_slot)
                  ORDER BY x.lane_seq
                  LIMIT v_scan - v_first) y;
            IF v_more IS NOT NULL THEN
                v_win := v_win || v_more;
                v_wkind := v_wkind || v_mkind;
                v_ww := v_ww || v_mw;
                v_wlim := v_wlim || v_mlim;
                v_serial := v_serial OR v_mserial;
            END IF;
        END IF;
    END IF;

    IF v_serial THEN
        -- Row by row, statements per row.
        FOR e IN
            SELECT x.*, COALESCE(awa._deadline_secs_v1(x.deadline_secs), p_default) AS timeout,
                   awa._job_weight_v1(x.metadata, p_wcap) AS w,
                   x.metadata ->> 'awa:serial' AS skey,
                   COALESCE(x.kind = ANY (p_kinds), false) AS limited
            FROM unnest(v_win) WITH ORDINALITY AS x
            ORDER BY x.ordinality
        LOOP
            v_seen := v_seen + 1;
            v_park := false;
            v_kpark := false;
            v_kk := NULL;
            v_i := NULL;
            v_lock := CASE WHEN e.skey IS NOT NULL THEN awa._serial_lock_v1(e.queue, e.skey) END;
            IF e.limited THEN
                -- Its kind first. A job that would not fit stops the lane (in order) before it
                -- takes anything.
                EXIT WHEN e.w > p_units - o_units OR v_jobs >= p_jobs;
                kl := NULL;
                SELECT * INTO kl FROM awa.flow_kind_limits f WHERE f.kind = e.kind;
                IF kl.rate IS NOT NULL THEN
                    v_period := 1.0 / kl.rate;
                    v_burst := COALESCE(kl.burst, GREATEST(1, ceil(kl.rate / 10)::integer));
                    v_i := array_position(o_rkinds, e.kind);
                    IF v_i IS NULL THEN
                        INSERT INTO awa.flow_kind_rate_state (kind, tat) VALUES (e.kind, now())
                        ON CONFLICT (kind) DO NOTHING;
                        IF cardinality(o_rkinds) = 0 THEN
                            SELECT s.tat INTO v_tat FROM awa.flow_kind_rate_state s
                            WHERE s.kind = e.kind FOR UPDATE;
                        ELSE
                            SELECT s.tat INTO v_tat FROM awa.flow_kind_rate_state s
                            WHERE s.kind = e.kind FOR UPDATE SKIP LOCKED;
                            IF NOT FOUND THEN
                                o_retry := true;  -- another claim holds it: claim again soon
                                EXIT;
                            END IF;
                        END IF;
                        -- As the queue's rate: the time is the clock once the state is locked.
                        v_know := clock_timestamp();
                        v_tokens := (awa._flow_kind_tokens_v1(kl.rate, kl.burst, v_tat,
                                                          v_know)).o_tokens;
                        o_rkinds := o_rkinds || e.kind;
                        o_rtats := o_rtats || awa._flow_kind_tat_v1(kl.rate, kl.burst, v_tat,
                                                                     v_know);
                        o_rleft := o_rleft || v_tokens;
                        o_rused := o_rused || 0;
                        v_i := cardinality(o_rkinds);
                    END IF;
                    IF o_rleft[v_i] <= 0 THEN
                        v_kpark := true;  -- no token now: it waits for one
                        v_w := GREATEST(extract(epoch FROM o_rtats[v_i]
                                                + make_interval(secs => o_rused[v_i] * v_period)
                                                - clock_timestamp())
                                        - (v_burst - 1) * v_period, 0.001);
                        o_wait := LEAST(COALESCE(o_wait, v_w), v_w);
                    END IF;
                END IF;
                IF NOT v_kpark AND kl.max_running IS NOT NULL THEN
                    v_kk := awa._flow_kind_take_v1(e.kind, kl.max_running, kl.max_seen,
                                                   LEAST(e.w, kl.max_running),
                                                   COALESCE(p_pheld, '{}') || o_kkeys);
                    IF cardinality(v_kk) < LEAST(e.w, kl.max_running) THEN
                        PERFORM awa.flow_release_v1(v_kk);
                        v_kk := NULL;
                        v_kpark := true;  -- the kind's permits are taken: it waits for one
                    END IF;
                END IF;
            END IF;
            IF v_kpark THEN
                NULL;  -- parked by its kind, before (and without) its serial key
            ELSIF e.skey IS NULL THEN
                EXIT WHEN e.w > p_units - o_units OR v_jobs >= p_jobs;
            ELSE
                IF v_lock = ANY (COALESCE(p_held, '{}')) OR v_lock = ANY (o_taken) THEN
                    v_park := true;  -- a job of the key runs (here, or from this claim)
                ELSIF NOT pg_try_advisory_xact_lock(4282184, v_lock) THEN
                    PERFORM awa.flow_release_v1(v_kk);
                    o_retry := true;  -- another claim or a release decides about the key now
                    EXIT;
                ELSIF EXISTS (SELECT 1 FROM awa.serial_waiting w
                              WHERE w.lock_key = v_lock AND w.job_id < e.job_id)
                   OR EXISTS (SELECT 1 FROM awa.flow_waiting w
                              WHERE w.serial_lock = v_lock AND w.job_id < e.job_id) THEN
                    v_park := true;  -- older jobs of the key wait (behind the key or their kind)
                ELSIF NOT pg_try_advisory_lock(4282183, v_lock) THEN
                    v_park := true;  -- a job of the key runs elsewhere
                ELSIF awa._serial_older_ready_v1(e.queue, v_lock, e.job_id, p_lanes, p_bounds) THEN
                    PERFORM pg_advisory_unlock(4282183, v_lock);
                    v_park := true;  -- an older job of the key is ready: it goes first
                ELSIF e.w > p_units - o_units OR v_jobs >= p_jobs THEN
                    PERFORM pg_advisory_unlock(4282183, v_lock);
                    PERFORM awa.flow_release_v1(v_kk);
                    EXIT;  -- it would run, but does not fit: the lane stops here, in order
                END IF;
                IF v_park AND v_kk IS NOT NULL THEN
                    PERFORM awa.flow_release_v1(v_kk);  -- parked behind its key: no kind permits
                    v_kk := NULL;
                END IF;
            END IF;
            v_lease := e.run_lease + 1;
            INSERT INTO awa.claims (
                claim_slot, claim_generation, job_id, run_lease, ready_slot, ready_generation,
                lane_id, lane_seq, attempt, deadline_at, worker_id, kind)
            VALUES (p_cslot, p_cgen, e.job_id, v_lease, e.ready_slot, e.ready_generation, e.lane_id,
                    e.lane_seq, e.attempt + 1, now() + make_interval(secs => e.timeout), p_worker,
                    e.kind)
            RETURNING deadline_at INTO v_deadline;
            IF v_kpark THEN
                INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome)
                VALUES (p_cslot, e.job_id, v_lease, 'parked');
                INSERT INTO awa.flow_waiting (
                    job_id, serial_lock, queue, priority, kind, args, attempt, max_attempts,
                    run_lease, run_at, created_at, deadline_secs, metadata, tags, errors, progress)
                VALUES (e.job_id, v_lock, e.queue, e.priority, e.kind, e.args, e.attempt,
                        e.max_attempts, v_lease, e.run_at, e.created_at, e.deadline_secs,
                        e.metadata, e.tags, e.errors, e.progress);
            ELSIF v_park THEN
                INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome)
                VALUES (p_cslot, e.job_id, v_lease, 'parked');
                INSERT INTO awa.serial_waiting (
                    job_id, lock_key, serial_key, queue, priority, kind, args, attempt,
                    max_attempts, run_lease, run_at, created_at, deadline_secs, metadata, tags,
                    errors, progress)
                VALUES (e.job_id, v_lock, e.skey, e.queue, e.priority, e.kind, e.args, e.attempt,
                        e.max_attempts, v_lease, e.run_at, e.created_at, e.deadline_secs,
                        e.metadata, e.tags, e.errors, e.progress);
            ELSE
                o_rows := o_rows || ROW(e.job_id, v_lease, (e.attempt + 1)::smallint,
                                        e.max_attempts, p_cslot, e.kind, e.args, e.queue,
                                        e.priority, v_deadline, e.timeout, e.progress, e.metadata,
                                        e.tags, e.errors, e.w, v_kk,
                                        CASE WHEN e.skey IS NOT NULL THEN v_lock END,
                                        extract(epoch FROM now() - e.run_at)::double precision
                                       )::awa.claimed_v3;
                o_units := o_units + e.w;
                v_jobs := v_jobs + 1;
                IF e.skey IS NOT NULL THEN
                    o_taken := o_taken || v_lock;
                END IF;
                IF v_kk IS NOT NULL THEN
                    o_kkeys := o_kkeys || v_kk;
                END IF;
                IF v_i IS NOT NULL THEN
                    o_rleft[v_i] := o_rleft[v_i] - 1;
                    o_rused[v_i] := o_rused[v_i] + 1;
                END IF;
                EXIT WHEN o_units >= p_units OR v_jobs >= p_jobs;
            END IF;
        END LOOP;
        IF v_seen >= v_scan AND o_units < p_units AND v_jobs < p_jobs THEN
            o_retry := true;  -- looked at as many rows as allowed: the rest next claim, soon
        END IF;
        RETURN;
    END IF;

    IF NOT v_fast THEN
        -- In lane order on the arrays. The window's limited kinds and their limits.
        SELECT array_agg(u.kind ORDER BY u.kind), array_agg(f.max_running ORDER BY u.kind),
               array_agg(f.max_seen ORDER BY u.kind), array_agg(f.rate ORDER BY u.kind),
               array_agg(f.burst ORDER BY u.kind)
        INTO v_kinds, v_lmax, v_lseen, v_lrate, v_lburst
        FROM (SELECT DISTINCT w.kind FROM unnest(v_wkind) AS w(kind)
              WHERE w.kind = ANY (p_kinds)) u
        LEFT JOIN awa.flow_kind_limits f ON f.kind = u.kind;
        IF v_kinds IS NOT NULL THEN
            v_rix := array_fill(NULL::integer, ARRAY[cardinality(v_kinds)]);
            v_pfrom := v_rix;
            v_pnext := v_rix;
            v_pto := v_rix;
        END IF;
        FOR i IN 1..cardinality(v_win) LOOP
            v_seen := i;
            v_kpark := false;
            v_need := NULL;
            v_i := NULL;
            -- A job that would not fit stops the lane (in order) before it takes anything.
            EXIT WHEN v_ww[i] > p_units - o_units OR v_jobs >= p_jobs;
            IF v_wlim[i] THEN
                -- Its kind decides: a rate token, then its permits, or it is parked.
                v_k := array_position(v_kinds, v_wkind[i]);
                IF v_lrate[v_k] IS NOT NULL THEN
                    v_period := 1.0 / v_lrate[v_k];
                    v_burst := COALESCE(v_lburst[v_k],
                                        GREATEST(1, ceil(v_lrate[v_k] / 10)::integer));
                    v_i := COALESCE(v_rix[v_k], array_position(o_rkinds, v_wkind[i]));
                    IF v_i IS NULL THEN
                        INSERT INTO awa.flow_kind_rate_state (kind, tat)
                        VALUES (v_wkind[i], now())
                        ON CONFLICT (kind) DO NOTHING;
                        IF cardinality(o_rkinds) = 0 THEN
                            SELECT s.tat INTO v_tat FROM awa.flow_kind_rate_state s
                            WHERE s.kind = v_wkind[i] FOR UPDATE;
                        ELSE
                            SELECT s.tat INTO v_tat FROM awa.flow_kind_rate_state s
                            WHERE s.kind = v_wkind[i] FOR UPDATE SKIP LOCKED;
                            IF NOT FOUND THEN
                                o_retry := true;  -- another claim holds it: claim again soon
                                EXIT;
                            END IF;
                        END IF;
                        -- As the queue's rate: the time is the clock once the state is locked.
                        v_know := clock_timestamp();
                        v_tokens := (awa._flow_kind_tokens_v1(v_lrate[v_k], v_lburst[v_k],
                                                              v_tat, v_know)).o_tokens;
                        o_rkinds := o_rkinds || v_wkind[i];
                        o_rtats := o_rtats || awa._flow_kind_tat_v1(v_lrate[v_k], v_lburst[v_k],
                                                                     v_tat, v_know);
                        o_rleft := o_rleft || v_tokens;
                        o_rused := o_rused || 0;
                        v_i := cardinality(o_rkinds);
                    END IF;
                    v_rix[v_k] := v_i;
                    IF o_rleft[v_i] <= 0 THEN
                        v_kpark := true;  -- no token now: it waits for one
                        v_w := GREATEST(extract(epoch FROM o_rtats[v_i]
                                                + make_interval(secs => o_rused[v_i] * v_period)
                                                - clock_timestamp())
                                        - (v_burst - 1) * v_period, 0.001);
                        o_wait := LEAST(COALESCE(o_wait, v_w), v_w);
                    END IF;
                END IF;
                IF NOT v_kpark AND v_lmax[v_k] IS NOT NULL THEN
                    v_need := LEAST(v_ww[i], v_lmax[v_k]);
                    IF v_pfrom[v_k] IS NULL THEN
                        -- The kind's first row that needs permits: take what its rows here
                        -- could use, at once.
                        v_cap := LEAST(v_lmax[v_k], p_units - o_units);
                        v_left := p_jobs - v_jobs;
                        IF v_i IS NOT NULL THEN
                            v_left := LEAST(v_left, o_rleft[v_i]);
                        END IF;
                        v_want := 0;
                        FOR j IN i..cardinality(v_win) LOOP
                            CONTINUE WHEN v_wkind[j] <> v_wkind[i];
                            v_want := v_want + LEAST(v_ww[j], v_lmax[v_k]);
                            v_left := v_left - 1;
                            EXIT WHEN v_want >= v_cap OR v_left <= 0;
                        END LOOP;
                        v_kk := awa._flow_kind_take_v1(v_wkind[i], v_lmax[v_k], v_lseen[v_k],
                                                       LEAST(v_want, v_cap),
                                                       COALESCE(p_pheld, '{}') || o_kkeys
                                                       || v_pool);
                        v_pfrom[v_k] := cardinality(v_pool) + 1;
                        v_pnext[v_k] := v_pfrom[v_k];
                        v_pool := v_pool || v_kk;
                        v_pto[v_k] := cardinality(v_pool);
                    END IF;
                    IF v_pto[v_k] - v_pnext[v_k] + 1 < v_need THEN
                        v_kpark := true;  -- the kind's permits are taken: it waits for one
                    END IF;
                END IF;
            END IF;
            v_m := i;
            v_parked[i] := v_kpark;
            IF NOT v_kpark THEN
                IF v_need IS NOT NULL THEN
                    v_pnext[v_k] := v_pnext[v_k] + v_need;
                END IF;
                o_units := o_units + v_ww[i];
                v_jobs := v_jobs + 1;
                IF v_i IS NOT NULL THEN
                    o_rleft[v_i] := o_rleft[v_i] - 1;
                    o_rused[v_i] := o_rused[v_i] + 1;
                END IF;
                EXIT WHEN o_units >= p_units OR v_jobs >= p_jobs;
            END IF;
        END LOOP;
    END IF;

    IF v_m > 0 THEN
        -- Every decided row's claim (a parked one's closed at once, its body in flow_waiting),
        -- and the taken rows, each with its min(weight, limit) keys of its kind's pool: a
        -- kind's taken rows drew them in lane order.
        WITH r AS (
            SELECT u.*, COALESCE(u.parked, false) AS pk, array_position(v_kinds, u.kind) AS k
            FROM ROWS FROM (unnest(v_parked), unnest(v_ww[1:v_m]), unnest(v_win[1:v_m]))
                 WITH ORDINALITY AS u(parked, w)
        ), d AS MATERIALIZED (
            SELECT n.*, v_pfrom[n.k] + sum(n.kn) OVER (PARTITION BY n.k ORDER BY n.ordinality)
                        - n.kn AS kfrom,
                   now() + make_interval(secs => n.timeout) AS deadline
            FROM (SELECT r.*,
                         CASE WHEN NOT r.pk AND v_lmax[r.k] IS NOT NULL
                              THEN LEAST(r.w, v_lmax[r.k]) END AS kn,
                         COALESCE(awa._deadline_secs_v1(r.deadline_secs), p_default) AS timeout
                  FROM r) n
        ), claimed AS (
            INSERT INTO awa.claims (
                claim_slot, claim_generation, job_id, run_lease, ready_slot, ready_generation,
                lane_id, lane_seq, attempt, deadline_at, worker_id, kind)
            SELECT p_cslot, p_cgen, d.job_id, d.run_lease + 1, d.ready_slot, d.ready_generation,
                   d.lane_id, d.lane_seq, d.attempt + 1, d.deadline, p_worker, d.kind
            FROM d
        ), closed AS (
            INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome)
            SELECT p_cslot, d.job_id, d.run_lease + 1, 'parked' FROM d WHERE d.pk
        ), waiting AS (
            INSERT INTO awa.flow_waiting (
                job_id, serial_lock, queue, priority, kind, args, attempt, max_attempts,
                run_lease, run_at, created_at, deadline_secs, metadata, tags, errors, progress)
            SELECT d.job_id, NULL, d.queue, d.priority, d.kind, d.args, d.attempt,
                   d.max_attempts, d.run_lease + 1, d.run_at, d.created_at, d.deadline_secs,
                   d.metadata, d.tags, d.errors, d.progress
            FROM d WHERE d.pk
        )
        SELECT COALESCE(array_agg(ROW(d.job_id, d.run_lease + 1, (d.attempt + 1)::smallint,
                                      d.max_attempts, p_cslot, d.kind, d.args, d.queue,
                                      d.priority, d.deadline, d.timeout, d.progress, d.metadata,
                                      d.tags, d.errors, d.w,
                                      CASE WHEN d.kn IS NOT NULL
                                           THEN v_pool[d.kfrom:d.kfrom + d.kn - 1] END,
                                      NULL,
                                      extract(epoch FROM now() - d.run_at)::double precision
                                     )::awa.claimed_v3 ORDER BY d.ordinality)
                            FILTER (WHERE NOT d.pk), '{}')
        INTO o_rows
        FROM d;
    END IF;
    -- The keys drawn are the claim's; the rest of each pool goes back.
    FOR k IN 1..COALESCE(cardinality(v_kinds), 0) LOOP
        CONTINUE WHEN v_pfrom[k] IS NULL;
        o_kkeys := o_kkeys || v_pool[v_pfrom[k]:v_pnext[k] - 1];
        v_free := v_free || v_pool[v_pnext[k]:v_pto[k]];
    END LOOP;
    IF cardinality(v_free) > 0 THEN
        PERFORM awa.flow_release_v1(v_free);
    END IF;
    IF v_seen >= v_scan AND o_units < p_units AND v_jobs < p_jobs THEN
        o_retry := true;  -- looked at as many rows as allowed: the rest next claim, soon
    END IF;
END
$$;

-- The slow path of awa.claim_v3 for one lane whose next rows include a job with a serial key:
-- the lane's rows after p_cursor, in order (at most a bounded number looked at), each taken
-- (it fits in the units and jobs left; for a job with a key, as functions/flow.sql says) or
-- parked; the first job that would run but does not fit stops the lane, as does a key another
-- claim is deciding about (o_retry: claim again soon). p_taken: keys taken by this claim so
-- far; o_taken: with those of this lane.
CREATE OR REPLACE FUNCTION awa._claim_serial_v1(
    p_lane integer, p_cursor bigint, p_cslot integer, p_cgen bigint, p_worker uuid,
    p_units integer, p_jobs integer, p_wcap integer, p_default double precision,
    p_held integer[], p_taken integer[], p_lanes integer[], p_bounds bigint[],
    OUT o_rows awa.claimed_v3[], OUT o_taken integer[], OUT o_units integer,
    OUT o_retry boolean)
 RETURNS record
 LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    e record;
    v_lock integer;
    v_park boolean;
    v_lease bigint;
    v_deadline timestamptz;
    v_scan integer := LEAST(LEAST(p_units, p_jobs) * 2 + 64, 512);
    v_seen integer := 0;
    v_jobs integer := 0;
BEGIN
    o_rows := '{}';
    o_taken := COALESCE(p_taken, '{}');
    o_units := 0;
    o_retry := false;
    FOR e IN
        SELECT x.*, COALESCE(awa._deadline_secs_v1(x.deadline_secs), p_default) AS timeout,
               awa._job_weight_v1(x.metadata, p_wcap) AS w,
               x.metadata ->> 'awa:serial' AS skey
        FROM awa.ready_entries x
        WHERE x.lane_id = p_lane AND x.lane_seq > p_cursor
          AND NOT EXISTS (
              SELECT 1 FROM awa.ready_tombstones t
              WHERE t.lane_id = x.lane_id AND t.lane_seq = x.lane_seq
                AND t.ready_slot = x.ready_slot)
        ORDER BY x.lane_seq
        LIMIT v_scan
    LOOP
        v_seen := v_seen + 1;
        v_park := false;
        v_lock := NULL;
        IF e.skey IS NULL THEN
            EXIT WHEN e.w > p_units - o_units OR v_jobs >= p_jobs;
        ELSE
            v_lock := awa._serial_lock_v1(e.queue, e.skey);
            IF v_lock = ANY (COALESCE(p_held, '{}')) OR v_lock = ANY (o_taken) THEN
                v_park := true;  -- a job of the key runs (here, or from this claim)
            ELSIF NOT pg_try_advisory_xact_lock(4282184, v_lock) THEN
                o_retry := true;  -- another claim or a release decides about the key now
                EXIT;
            ELSIF EXISTS (SELECT 1 FROM awa.serial_waiting w
                          WHERE w.lock_key = v_lock AND w.job_id < e.job_id) THEN
                v_park := true;  -- older jobs of the key wait
            ELSIF NOT pg_try_advisory_lock(4282183, v_lock) THEN
                v_park := true;  -- a job of the key runs elsewhere
            ELSIF awa._serial_older_ready_v1(e.queue, v_lock, e.job_id, p_lanes, p_bounds) THEN
                PERFORM pg_advisory_unlock(4282183, v_lock);
                v_park := true;  -- an older job of the key is ready: it goes first
            ELSIF e.w > p_units - o_units OR v_jobs >= p_jobs THEN
                PERFORM pg_advisory_unlock(4282183, v_lock);
                EXIT;  -- it would run, but does not fit: the lane stops here, in order
            END IF;
        END IF;
        v_lease := e.run_lease + 1;
        INSERT INTO awa.claims (
            claim_slot, claim_generation, job_id, run_lease, ready_slot, ready_generation,
            lane_id, lane_seq, attempt, deadline_at, worker_id, kind)
        VALUES (p_cslot, p_cgen, e.job_id, v_lease, e.ready_slot, e.ready_generation, e.lane_id,
                e.lane_seq, e.attempt + 1, now() + make_interval(secs => e.timeout), p_worker,
                e.kind)
        RETURNING deadline_at INTO v_deadline;
        IF v_park THEN
            INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome)
            VALUES (p_cslot, e.job_id, v_lease, 'parked');
            INSERT INTO awa.serial_waiting (
                job_id, lock_key, serial_key, queue, priority, kind, args, attempt, max_attempts,
                run_lease, run_at, created_at, deadline_secs, metadata, tags, errors, progress)
            VALUES (e.job_id, v_lock, e.skey, e.queue, e.priority, e.kind, e.args, e.attempt,
                    e.max_attempts, v_lease, e.run_at, e.created_at, e.deadline_secs,
                    e.metadata, e.tags, e.errors, e.progress);
        ELSE
            o_rows := o_rows || ROW(e.job_id, v_lease, (e.attempt + 1)::smallint,
                                    e.max_attempts, p_cslot, e.kind, e.args, e.queue,
                                    e.priority, v_deadline, e.timeout, e.progress, e.metadata,
                                    e.tags, e.errors, e.w, NULL, v_lock,
                                    extract(epoch FROM now() - e.run_at)::double precision
                                   )::awa.claimed_v3;
            o_units := o_units + e.w;
            v_jobs := v_jobs + 1;
            IF v_lock IS NOT NULL THEN
                o_taken := o_taken || v_lock;
            END IF;
            EXIT WHEN o_units >= p_units OR v_jobs >= p_jobs;
        END IF;
    END LOOP;
    IF v_seen >= v_scan AND o_units < p_units AND v_jobs < p_jobs THEN
        o_retry := true;  -- looked at as many rows as allowed: the rest next claim, soon
    END IF;
END
$$;

-- Which queues have work, for many queues in one statement: the sweep of a worker's idle
-- queues (awa_django/worker/sweep.py; docs/worker.md, "Many queues").
--
-- A queue is reported ready when a claim now would take a job from it: it is not paused, a
-- permit of its concurrency limit is free (if it has one), and a lane of it holds a committed
-- row that no tombstone covers past the lane's claim cursor, or a job its kind parked
-- (awa.flow_waiting) could start now (awa._flow_parked_ready_v1). Nothing else counts: a lane
-- position a producer still holds uncommitted, or one it rolled back (a trailing gap: the
-- lane's sequence ahead of its rows), is no work, so a queue whose only "work" is a gap, or
-- whose parked jobs wait for a limit, is not reported.
--
-- The queues of p_queues are read in order, as many as their lanes fit in p_max_lanes (each
-- lane's sequence read locks it until the statement ends, so the locks of one call are
-- bounded); a queue with more lanes than that is read in parts: p_after_lane, the last lane
-- id read, continues the first queue after it. A row per queue read, in order:
--   ready  whether to claim from it;
--   stamp  a digest of its lanes and their last positions, when each of those positions is
--          claimed or was rolled back (its lanes hold nothing, and nothing that may still
--          commit); else NULL. Handed back in p_stamps, an unchanged stamp proves its lanes
--          still hold nothing without reading their cursors: a lane position only comes from
--          its sequence. NULL for a queue read in parts;
--   upto   for a queue read in part, the last lane id read (call again after it), else NULL.
-- p_caps: per queue, the most units the worker could give one job (as awa.claim_v3's
-- p_max_weight). Permits are probed by taking and releasing them at once, so the calling
-- session must hold none (a worker's sweep connection). Needs READ COMMITTED: a lane that
-- looks like a gap is read again, under its producers' lock, in a later snapshot.
CREATE OR REPLACE FUNCTION awa.queues_ready_v2(
    p_queues text[], p_stamps bigint[] DEFAULT NULL::bigint[],
    p_caps integer[] DEFAULT NULL::integer[], p_max_lanes integer DEFAULT 128,
    p_after_lane integer DEFAULT NULL::integer)
 RETURNS TABLE(queue text, ready boolean, stamp bigint, upto integer)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
#variable_conflict use_column
DECLARE
    v_budget integer := LEAST(GREATEST(COALESCE(p_max_lanes, 128), 1), 10000);
    v_nq integer := COALESCE(cardinality(p_queues), 0);
    v_n integer;  -- queues read
    v_m integer;  -- lanes read
    v_cut integer;  -- the first queue read in part: the last lane read
    v_part boolean := p_after_lane IS NOT NULL;  -- the first queue is read in parts
    v_li integer[];  -- per lane: its queue's index in p_queues
    v_lane integer[];
    v_seq regclass[];
    v_last bigint[];
    v_sum bigint[];  -- per queue read: the digest of its lanes' last positions
    v_cgen bigint;
    v_cslot integer;
    v_sk integer[];  -- lanes (their index) with positions past their cursor
    v_sc bigint[];  -- and those cursors
    v_work integer[] := '{}';  -- queues (index) whose lanes hold a claimable row
    v_open integer[] := '{}';  -- queues with a lane position that may still commit
    v_gap integer[];  -- lanes past their cursor with no row to claim, whose producers we hold
    v_fq integer[];  -- queues (index) with parked jobs and nothing to claim in their lanes
    v_parked text[] := '{}';
    v_ready integer[] := '{}';
    v_moved boolean := false;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'awa.queues_ready_v2 needs READ COMMITTED isolation'
            USING ERRCODE = '25000';
    END IF;
    IF v_nq = 0 THEN
        RETURN;
    END IF;
    -- 1. The lanes of the queues, in order, one more than fit.
    SELECT array_agg(x.i ORDER BY x.i, x.lane_id), array_agg(x.lane_id ORDER BY x.i, x.lane_id),
           array_agg(x.enqueue_seq ORDER BY x.i, x.lane_id)
    INTO v_li, v_lane, v_seq
    FROM (SELECT q.i::integer AS i, l.lane_id, l.enqueue_seq
          FROM unnest(p_queues) WITH ORDINALITY AS q(queue, i)
          JOIN awa.queue_lanes l ON l.queue = q.queue
          WHERE q.i > 1 OR p_after_lane IS NULL OR l.lane_id > p_after_lane
          ORDER BY q.i, l.lane_id
          LIMIT v_budget + 1) x;
    v_n := v_nq;
    v_m := COALESCE(cardinality(v_lane), 0);
    IF v_m > v_budget THEN
        IF v_li[v_budget + 1] > 1 THEN
            v_n := v_li[v_budget + 1] - 1;  -- the queues before the first that does not fit
            SELECT count(*) INTO v_m FROM unnest(v_li) AS u(i) WHERE u.i <= v_n;
        ELSE
            v_n := 1;  -- the first queue alone has more lanes: read it in parts
            v_m := v_budget;
            v_cut := v_lane[v_budget];
            v_part := true;
        END IF;
    END IF;
    -- 2. Their sequences (a lock each until the statement ends) and the queues' stamps.
    SELECT array_agg(pg_sequence_last_value(s.seq) ORDER BY s.o) INTO v_last
    FROM unnest(v_seq[1:v_m]) WITH ORDINALITY AS s(seq, o);
    v_sum := array_fill(0::bigint, ARRAY[v_n]);
    FOR k IN 1..v_m LOOP
        v_sum[v_li[k]] := v_sum[v_li[k]] # hashint8extended(COALESCE(v_last[k], 0), v_lane[k]);
    END LOOP;
    FOR i IN 1..v_n LOOP
        IF p_stamps[i] IS DISTINCT FROM v_sum[i] OR (v_part AND i = 1) THEN
            v_moved := true;
            EXIT;
        END IF;
    END LOOP;
    -- 3. The cursors of the lanes of queues whose stamp moved (or is not known), as
    -- awa.claim_v3 reads them: lanes with positions past their cursor.
    IF v_moved THEN
        SELECT r.generation, r.slot INTO v_cgen, v_cslot
        FROM awa.ring_rotations r WHERE r.ring = 'claim' ORDER BY r.generation DESC LIMIT 1;
        SELECT array_agg(u.k ORDER BY u.k), array_agg(c.cur ORDER BY u.k) INTO v_sk, v_sc
        FROM unnest(v_li[1:v_m], v_lane[1:v_m], v_last) WITH ORDINALITY AS u(i, lane, last, k)
        CROSS JOIN LATERAL (
            SELECT COALESCE(
                (SELECT CASE WHEN c.claim_generation = v_cgen THEN c.lane_seq END
                 FROM awa.claims c
                 WHERE c.claim_slot = v_cslot AND c.lane_id = u.lane
                 ORDER BY c.lane_seq DESC LIMIT 1),
                awa.lane_cursor_v1(u.lane)) AS cur
            OFFSET 0) c
        WHERE u.last IS NOT NULL
          AND ((v_part AND u.i = 1) OR p_stamps[u.i] IS NULL OR p_stamps[u.i] <> v_sum[u.i])
          AND u.last > c.cur;
    END IF;
    IF v_sk IS NOT NULL THEN
        -- 4. Of those, the lanes with a committed row to claim. In the others the positions
        -- past the cursor are a gap (their producer rolled back) or still held by an open
        -- transaction; with the lane's producers' lock free (held here until the statement
        -- ends), only a gap, or rows committed since this snapshot: read again, in a new one.
        SELECT COALESCE(array_agg(DISTINCT v_li[s.k]), '{}') INTO v_work
        FROM unnest(v_sk, v_sc) AS s(k, cur)
        WHERE EXISTS (
            SELECT 1 FROM awa.ready_entries e
            WHERE e.lane_id = v_lane[s.k] AND e.lane_seq > s.cur
              AND NOT EXISTS (
                  SELECT 1 FROM awa.ready_tombstones t
                  WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                    AND t.ready_slot = e.ready_slot));
        SELECT array_agg(s.k) FILTER (WHERE s.free),
               COALESCE(array_agg(DISTINCT v_li[s.k]) FILTER (WHERE NOT s.free), '{}')
        INTO v_gap, v_open
        FROM (SELECT u.k, pg_try_advisory_xact_lock(4282177, v_lane[u.k]) AS free
              FROM unnest(v_sk) AS u(k)
              WHERE NOT v_li[u.k] = ANY (v_work)
              OFFSET 0) s;
        IF v_gap IS NOT NULL THEN
            SELECT v_work || COALESCE(array_agg(DISTINCT v_li[g.k]), '{}') INTO v_work
            FROM (SELECT u.k, awa.lane_cursor_v1(v_lane[u.k]) AS cur
                  FROM unnest(v_gap) AS u(k) OFFSET 0) g
            WHERE EXISTS (
                SELECT 1 FROM awa.ready_entries e
                WHERE e.lane_id = v_lane[g.k] AND e.lane_seq > g.cur
                  AND NOT EXISTS (
                      SELECT 1 FROM awa.ready_tombstones t
                      WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                        AND t.ready_slot = e.ready_slot));
        END IF;
    END IF;
    -- 5. Parked jobs that could start now, in queues whose lanes have nothing to claim.
    IF EXISTS (SELECT 1 FROM awa.flow_waiting w WHERE w.queue = ANY (p_queues[1:v_n])) THEN
        SELECT array_agg(g.i ORDER BY g.i) INTO v_fq
        FROM generate_series(1, v_n) AS g(i)
        WHERE NOT g.i = ANY (v_work)
          AND EXISTS (SELECT 1 FROM awa.flow_waiting w WHERE w.queue = p_queues[g.i]);
        IF v_fq IS NOT NULL THEN
            v_parked := awa._flow_parked_ready_v1(
                ARRAY(SELECT p_queues[u.i] FROM unnest(v_fq) WITH ORDINALITY AS u(i, o)
                      ORDER BY u.o),
                ARRAY(SELECT p_caps[u.i] FROM unnest(v_fq) WITH ORDINALITY AS u(i, o)
                      ORDER BY u.o));
        END IF;
    END IF;
    -- 6. A row per queue read: ready unless paused or its concurrency limit has no permit free.
    IF cardinality(v_work) > 0 OR cardinality(v_parked) > 0 THEN
        SELECT COALESCE(array_agg(c.i), '{}') INTO v_ready
        FROM (SELECT g.i FROM generate_series(1, v_n) AS g(i)
              WHERE g.i = ANY (v_work) OR p_queues[g.i] = ANY (v_parked)
              OFFSET 0) c
        WHERE NOT EXISTS (SELECT 1 FROM awa.queue_meta m
                          WHERE m.queue = p_queues[c.i] AND m.paused)
          AND NOT EXISTS (SELECT 1 FROM awa.flow_limits f
                          WHERE f.queue = p_queues[c.i] AND f.max_running IS NOT NULL
                            AND COALESCE(f.max_seen, 0) <= f.max_running
                            AND awa._flow_free_v1(f.queue, false, f.max_running, 1) = 0);
    END IF;
    RETURN QUERY
    SELECT p_queues[g.i], g.i = ANY (v_ready),
           CASE WHEN (v_part AND g.i = 1) OR g.i = ANY (v_work) OR g.i = ANY (v_open)
                THEN NULL ELSE v_sum[g.i] END,
           CASE WHEN g.i = 1 THEN v_cut END
    FROM generate_series(1, v_n) AS g(i);
END
$$;

-- Whether the queues p_queues have nothing available, parked or running: the exit check of
-- burst workers, paid every POLL_INTERVAL in which such a worker has nothing in flight. It
-- answers from the cheapest evidence first, each step a bounded probe, and stops at the first
-- that says "not idle" (all in one snapshot, taken after the rings are locked: see below):
--   1. available: per lane of a queue not paused, its cursor, then the first ready row above
--      it that no tombstone covers (an index probe per lane, never a scan of the backlog);
--   2. parked: a job of a queue not paused waiting for its serial key (serial_waiting) or its
--      kind's limits (flow_waiting) (index probes);
--   3. running: per lane of the queues (paused ones too), its 128 latest claims are looked for
--      one without a closure (the attempts in flight are nearly always there);
--   4. only then every claim of those lanes against the closures: the answer "idle", or an
--      attempt open behind 128 later closed ones (a stuck handler).
-- Scheduled and retryable jobs (deferred_jobs) do not count.
--
-- The rings are locked first, in a statement of their own, and the steps then run in one
-- snapshot taken after those locks (awa._queues_idle_v1 is STABLE): a prune that truncated a
-- claim slot while this waited is seen whole, with the open claims it carried forward, not as
-- a slot gone empty (docs/design/derived-claim-cursor.md).
CREATE OR REPLACE FUNCTION awa.queues_idle_v2(p_queues text[])
 RETURNS boolean
 LANGUAGE plpgsql
 VOLATILE
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
BEGIN
    LOCK TABLE awa.claims, awa.claim_closures, awa.ready_entries, awa.ready_tombstones
        IN ACCESS SHARE MODE;
    RETURN awa._queues_idle_v1(p_queues);
END
$$;

CREATE OR REPLACE FUNCTION awa._queues_idle_v1(p_queues text[])
 RETURNS boolean
 LANGUAGE plpgsql
 STABLE
 SET enable_seqscan TO 'off'
 SET max_parallel_workers_per_gather TO '0'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
DECLARE
    v_lanes integer[];
    v_open integer[];
    v_cursors bigint[];
BEGIN
    SELECT array_agg(l.lane_id),
           array_agg(l.lane_id) FILTER (WHERE NOT EXISTS (
               SELECT 1 FROM awa.queue_meta m WHERE m.queue = l.queue AND m.paused))
    INTO v_lanes, v_open
    FROM awa.queue_lanes l
    WHERE l.queue = ANY (p_queues);
    -- 1. Available. The cursors first, in a statement of their own: inside the probe below the
    -- planner would evaluate lane_cursor_v1 once per ready row.
    SELECT array_agg(awa.lane_cursor_v1(u.lane_id) ORDER BY u.i) INTO v_cursors
    FROM unnest(v_open) WITH ORDINALITY AS u(lane_id, i);
    IF EXISTS (
        SELECT 1
        FROM unnest(v_open, v_cursors) AS u(lane_id, c)
        CROSS JOIN LATERAL (
            SELECT 1 FROM awa.ready_entries e
            WHERE e.lane_id = u.lane_id AND e.lane_seq > u.c
              AND NOT EXISTS (
                  SELECT 1 FROM awa.ready_tombstones t
                  WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                    AND t.ready_slot = e.ready_slot)
            LIMIT 1) x) THEN
        RETURN false;
    END IF;
    -- 2. Parked.
    IF EXISTS (
        SELECT 1 FROM awa.serial_waiting w
        WHERE w.queue = ANY (p_queues)
          AND NOT EXISTS (SELECT 1 FROM awa.queue_meta m WHERE m.queue = w.queue AND m.paused))
    OR EXISTS (
        SELECT 1 FROM awa.flow_waiting w
        WHERE w.queue = ANY (p_queues)
          AND NOT EXISTS (SELECT 1 FROM awa.queue_meta m WHERE m.queue = w.queue AND m.paused))
    THEN
        RETURN false;
    END IF;
    -- 3. Running, where an attempt in flight nearly always is: among its lane's latest claims.
    IF EXISTS (
        SELECT 1
        FROM unnest(v_lanes) AS u(lane_id)
        CROSS JOIN LATERAL (
            SELECT c.job_id, c.run_lease, c.claim_slot FROM awa.claims c
            WHERE c.lane_id = u.lane_id
            ORDER BY c.lane_seq DESC
            LIMIT 128) c
        WHERE NOT EXISTS (
            SELECT 1 FROM awa.claim_closures z
            WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
              AND z.claim_slot = c.claim_slot)) THEN
        RETURN false;
    END IF;
    -- 4. Running, anywhere in the lanes' claims.
    RETURN NOT EXISTS (
        SELECT 1 FROM awa.claims c
        WHERE c.lane_id = ANY (v_lanes)
          AND NOT EXISTS (
              SELECT 1 FROM awa.claim_closures z
              WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                AND z.claim_slot = c.claim_slot));
END
$$;
