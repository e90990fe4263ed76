-- awa_django migration 0013: jobs of limited kinds go through the claim's one statement when
-- their kinds do not bind (issue 16: limits set but not binding cost at most 10 %).
--
-- Before (0012), a lane whose next job was of a kind with flow limits went to the slow path
-- (awa._claim_kind_v1) from that job on, which reads the rows into arrays, decides on them and
-- writes from them. Now, per lane, awa.claim_v3 probes the next job (as 0012 did, but before
-- it locks the lane, at the cursor the lanes statement read: the lane's lock is where claims
-- meet, and a probe that saw a job since taken only asks a kind the statement may not need):
--   * a serial key: the slow path, as before;
--   * a job of a kind without limits: the statement runs as on a queue without kind limits, up
--     to the first job of a limited kind; when such a job is what stopped it (not a job before
--     it that did not fit the units left), the kinds of the run from that job are read (below)
--     and the statement runs again from it ("second pass");
--   * a job of a limited kind whose limit is at least the units left (or that has only a
--     rate): without reading the run, and before the lane is locked, the kind is asked for as
--     many rate tokens and permits as the units left, which covers any run of its jobs the
--     statement can take (a lane found held gives them back); if it cannot have them all, the
--     run is read and decided exactly, as for any other limited kind;
--   * else: the kinds of the run the statement could take are read (one range read of the
--     lane, up to as many rows as units are left; a row after a serial key, beyond the units or
--     tombstoned counts too), and each limited kind there is asked, in the order of its first
--     row, for a rate token per row (its state row locked as the slow path locks it) and the
--     permits all its rows want (one awa._flow_kind_take_v1 call).
-- A kind that gets them is "cleared": its rows go through the statement with the others, each
-- drawing its min(weight, limit) keys from the kind's pool in lane order (one cleared kind
-- with permits: its slice by a running sum in the statement's window; several: offsets per
-- kind, an init plan computed only then). A kind that does not (it binds, or another claim
-- holds its rate state) gives back what it took and stops the statement at its first row; the
-- slow path decides from there, as before. Keys taken but not drawn (rows the statement did
-- not take after all) go back before the next lane, and tokens are counted for the rows taken.
-- The decisions are those of 0012: a cleared kind had the tokens and permits for every row it
-- let through. Only rows up to the last position the read saw with no gap before it may use a
-- cleared kind's keys (a row committed in a gap since was not counted); a queue with no kind
-- limits runs the statement of 0012 (the new terms are NULL there).

-- Claim jobs of one queue within its flow limits: the contract and lane order of claim_v2 (see
-- its comment), with weights, permits and the rate limit, and (0012) the limits of job kinds:
-- a job of a limited kind carries its kind permits after its queue permits; it goes through
-- the claim's statement when its kind has the rate tokens and permits for all its rows there
-- (0013), else the slow path (awa._claim_kind_v1) decides; jobs its kind parked are un-parked first
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
    -- The lane's limited kinds (0013), in the order of their first rows among the rows the
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
        v_locked := false;
        v_skipped := false;
        v_pool := '{}';
        -- The lane's cursor as the lanes statement read it: the probe below runs before the
        -- lane is locked (the lock is the claims' one serial point on a lane), and may see a
        -- job another claim has taken since; the statement decides on the lane as locked.
        v_cursor := v_cursors[array_position(v_lanes, r.lane_id)];
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
            WHERE e.ready_slot = v_qslot AND e.lane_id = r.lane_id AND e.lane_seq = v_cursor + 1
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
                FROM awa.queue_lanes l WHERE l.lane_id = r.lane_id FOR UPDATE SKIP LOCKED;
                IF NOT FOUND THEN
                    v_skipped := true;  -- another claim holds the lane
                    EXIT;
                END IF;
                v_locked := true;
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
                        WHERE e.ready_slot = v_qslot AND e.lane_id = r.lane_id
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
                              WHERE e.ready_slot = v_qslot AND e.lane_id = r.lane_id
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

-- (0013: the reset of max_seen skips a row another claim holds.)
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
            -- Only when no other claim holds the row (it is resetting it too): a claim that
            -- waited here, holding another kind's row, could deadlock with one taking the two
            -- kinds in the other order.
            UPDATE awa.flow_kind_limits f SET max_seen = f.max_running
            WHERE f.kind = p_kind AND f.max_seen > f.max_running
              AND f.kind IN (SELECT l.kind FROM awa.flow_kind_limits l
                             WHERE l.kind = p_kind FOR UPDATE SKIP LOCKED);
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

-- Every kind with a rate limit has its rate state row, made when the limit is set (by any
-- writer: the trigger below) rather than by its first claim. A claim made it before, and two
-- claims making the states of two kinds in opposite orders could deadlock: the insert of a row
-- another claim had just inserted (not committed, so invisible to SKIP LOCKED) waits for it.
INSERT INTO awa.flow_kind_rate_state (kind, tat)
SELECT f.kind, now() FROM awa.flow_kind_limits f WHERE f.rate IS NOT NULL
ON CONFLICT (kind) DO NOTHING;

CREATE FUNCTION awa._flow_kind_rate_row_v1() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.rate IS NOT NULL THEN
        INSERT INTO awa.flow_kind_rate_state (kind, tat) VALUES (NEW.kind, now())
        ON CONFLICT (kind) DO NOTHING;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER flow_kind_rate_row AFTER INSERT OR UPDATE OF rate ON awa.flow_kind_limits
FOR EACH ROW EXECUTE FUNCTION awa._flow_kind_rate_row_v1();
