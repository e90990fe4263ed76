-- awa_django migration 0012: flow limits per job kind (issue 16): a kind's global concurrency
-- (counted by weight) and rate limit, across every queue its jobs are in, every process and host.
--
-- Limits live in awa.flow_kind_limits (one row per kind, like awa.flow_limits per queue: source
-- 'settings' rows written by awa.flow_kind_sync_v1 when a worker starts, from @job options and
-- AWA["KINDS"]; 'operator' overrides from the admin or `awa_queue limit --kind`).
--
-- Kind permits are session advisory locks in the class of queue permits (4282182), keys
-- awa._flow_kind_key_v1(kind, i) = hashtext('kind:' || kind || '/' || i): a queue name cannot
-- hold ':', so no kind key's input is a queue key's input; a hash collision only makes limits
-- stricter. A job of a limited kind carries its kind permits after its queue permits in the
-- permits column of awa.claimed_v3, so the worker's release, retake, reset and the leader's
-- awa.flow_reap_v1 handle them as they handle queue permits. Rate: GCRA on the database clock
-- (awa.flow_kind_rate_state, one row per rate-limited kind), updated once per claim per kind.
--
-- No head-of-line blocking: a job of a limited kind that cannot take its kind permits or a rate
-- token now is parked, like a job behind its serial key: its claim is closed at once (outcome
-- 'parked') and its body moves to awa.flow_waiting, so the lane moves on. A claim of a queue
-- with parked jobs first un-parks (awa._flow_unpark_v1) up to as many of each kind's oldest
-- waiting jobs as the kind has free permits and rate tokens now, into the queue's hand-off lane
-- of their priority (shard 64, which enqueue never picks: awa._lane_for_v1 and the inline lane
-- choice of awa.enqueue_one_v2/v3 are redefined here with `shard < 64`), where that claim (or
-- another) takes them. A job with a serial key and a limited kind is decided by its kind first
-- (parked by kind, it takes no key); younger jobs of its key see it waiting in flow_waiting
-- (column serial_lock) as they see one in serial_waiting, so enqueue order within the key holds.
--
-- Parked jobs show everywhere a serial-parked job does (awa.live_jobs and so the counts,
-- awa._job_brief_v1, cancel, queue drain, queues_idle): the bodies of migration 0008 with
-- flow_waiting added (sql/reverse/0012_kind_limits.sql restores them).
--
-- The claim's marker row (job_id NULL) gains a "soft" wait: wait_secs, the seconds until a
-- parked kind's next rate token, during which the worker still wakes on NOTIFY (timeout_secs
-- remains the queue rate's hard wait).

CREATE TABLE IF NOT EXISTS awa.flow_kind_limits (
    -- A name with a control character is refused: listings print one kind per line.
    kind text PRIMARY KEY CHECK (length(kind) BETWEEN 1 AND 255
                                 AND kind !~ '[\x01-\x1f\x7f-\x9f\u2028\u2029]'),
    max_running integer CHECK (max_running BETWEEN 1 AND 10000),
    rate double precision CHECK (rate >= 0.001 AND rate <= 1000000),
    burst integer CHECK (burst BETWEEN 1 AND 1000000),
    -- The highest max_running since every permit above max_running was last free.
    max_seen integer CHECK (max_seen BETWEEN 1 AND 10000),
    source text NOT NULL DEFAULT 'settings' CHECK (source IN ('settings', 'operator')),
    updated_by text,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK (burst IS NULL OR rate IS NOT NULL)
);

CREATE TABLE IF NOT EXISTS awa.flow_kind_rate_state (
    kind text PRIMARY KEY,
    tat timestamptz NOT NULL
) WITH (fillfactor = 50);

-- Jobs parked by their kind's limits (the columns of awa.serial_waiting; serial_lock is the
-- job's serial key number, awa._serial_lock_v1, when it has a key).
CREATE TABLE IF NOT EXISTS awa.flow_waiting (
    job_id bigint PRIMARY KEY,
    serial_lock integer,
    queue text NOT NULL,
    priority smallint NOT NULL,
    kind text NOT NULL,
    args jsonb NOT NULL,
    attempt smallint NOT NULL,
    max_attempts smallint NOT NULL,
    run_lease bigint NOT NULL,
    run_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    deadline_secs double precision,
    metadata jsonb,
    tags text[],
    errors jsonb,
    progress jsonb,
    parked_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS flow_waiting_kind_idx ON awa.flow_waiting (kind, job_id);
-- (queue, kind, job_id): "any waiting in this queue" (a prefix probe), the kinds waiting in a
-- queue (a skip scan) and each kind's oldest there.
CREATE INDEX IF NOT EXISTS flow_waiting_queue_idx ON awa.flow_waiting (queue, kind, job_id);
CREATE INDEX IF NOT EXISTS flow_waiting_serial_idx ON awa.flow_waiting (serial_lock, job_id)
    WHERE serial_lock IS NOT NULL;

-- Shard 64 of a (queue, priority) is its hand-off lane: un-parked jobs are appended there, never
-- by producers, so they do not queue behind the lanes' backlog.
ALTER TABLE awa.queue_lanes DROP CONSTRAINT IF EXISTS queue_lanes_shard_check;
ALTER TABLE awa.queue_lanes ADD CONSTRAINT queue_lanes_shard_check CHECK (shard BETWEEN 0 AND 64);

-- The advisory-lock key (class 4282182, shared with queue permits) of permit p_i of kind p_kind.
CREATE FUNCTION awa._flow_kind_key_v1(p_kind text, p_i integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtext('kind:' || p_kind || '/' || p_i::text)
$$;

-- Take up to p_want free permits of kind p_kind (limit p_limit, highest limit in use p_seen)
-- for this session, skipping keys in p_held (held already: session locks are re-entrant).
-- As awa._flow_take_v1, for kinds. Returns the keys taken.
CREATE FUNCTION awa._flow_kind_take_v1(p_kind text, p_limit integer, p_seen integer,
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

-- The state time a kind's rate counts from at p_now: p_tat (NULL: none yet) but never in the
-- past, and, when p_tat is further ahead than the current limits allow (burst x T: it was
-- left by a slower rate, or by a limit since cleared), p_now + (burst - 1) x T: one token now,
-- then the current rate. So a raised rate takes effect at once, and a state no claim writes
-- (jobs of the kind all parked) never holds the kind back for what an old rate accumulated.
-- A state within the limits is never moved: no token is given early.
CREATE FUNCTION awa._flow_kind_tat_v1(p_rate double precision, p_burst integer,
                                      p_tat timestamptz, p_now timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_tat IS NULL OR p_tat < p_now THEN p_now
        WHEN p_tat > p_now + make_interval(secs => b.n / p_rate)
            THEN p_now + make_interval(secs => (b.n - 1) / p_rate)
        ELSE p_tat END
    FROM (SELECT COALESCE(p_burst, GREATEST(1, ceil(p_rate / 10)::integer))::double precision
                 AS n) b
$$;

-- The rate tokens kind limits row p_limit allows now given state p_tat (no lock, no write), and
-- the seconds until the next one when none (else NULL). As the queue rate of awa.claim_v3,
-- from the state time awa._flow_kind_tat_v1 gives.
CREATE FUNCTION awa._flow_kind_tokens_v1(p_rate double precision, p_burst integer,
                                         p_tat timestamptz, p_now timestamptz,
                                         OUT o_tokens integer, OUT o_wait double precision)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_period double precision := 1.0 / p_rate;
    v_burst integer := COALESCE(p_burst, GREATEST(1, ceil(p_rate / 10)::integer));
    v_tat timestamptz := awa._flow_kind_tat_v1(p_rate, p_burst, p_tat, p_now);
BEGIN
    o_tokens := GREATEST(floor((extract(epoch FROM p_now - v_tat) + v_burst * v_period)
                               / v_period + 1e-9)::integer, 0);
    IF o_tokens = 0 THEN
        o_wait := GREATEST(extract(epoch FROM v_tat - p_now) - (v_burst - 1) * v_period, 0.001);
    END IF;
END
$$;

-- The hand-off lane (shard 64) of (p_queue, p_priority), created when missing. Runs as its
-- owner (it creates the lane's sequence); granted like awa.ensure_lanes_v1 (sql/roles.sql).
CREATE FUNCTION awa.flow_handoff_lane_v1(p_queue text, p_priority integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id integer;
    v_seq text;
BEGIN
    SELECT l.lane_id INTO v_id FROM awa.queue_lanes l
    WHERE l.queue = p_queue AND l.priority = p_priority AND l.shard = 64;
    IF FOUND THEN
        RETURN v_id;
    END IF;
    IF NOT awa.valid_queue_name(p_queue) OR NOT awa.valid_priority(p_priority) THEN
        RAISE EXCEPTION 'hand-off lane: % / % is not a valid queue and priority',
            quote_nullable(p_queue), p_priority USING ERRCODE = '22023';
    END IF;
    v_id := nextval('awa.lane_id_seq');
    v_seq := 'lane_seq_' || v_id;
    EXECUTE format('CREATE SEQUENCE awa.%I AS bigint', v_seq);
    INSERT INTO awa.queue_lanes (lane_id, queue, priority, shard, enqueue_seq)
    VALUES (v_id, p_queue, p_priority, 64, format('awa.%I', v_seq)::regclass)
    ON CONFLICT (queue, priority, shard) DO NOTHING;
    IF NOT FOUND THEN
        EXECUTE format('DROP SEQUENCE awa.%I', v_seq);
        SELECT l.lane_id INTO v_id FROM awa.queue_lanes l
        WHERE l.queue = p_queue AND l.priority = p_priority AND l.shard = 64;
    END IF;
    RETURN v_id;
END
$$;
REVOKE EXECUTE ON FUNCTION awa.flow_handoff_lane_v1(text, integer) FROM PUBLIC;

-- Un-park jobs of p_queue parked by their kind (called by awa.claim_v3 when flow_waiting has
-- rows of the queue): per kind waiting there, up to min(its waiting jobs, its free permits now,
-- its rate tokens now, p_max) of its oldest go back to the ready ring, in the hand-off lane of
-- their (queue, priority), keeping their run_at. Permits are counted by taking and releasing
-- them (p_held: this session's, never counted as free); a claim racing for the same permits
-- may take them first, and the job is parked again. A hand-off lane another claim is filling
-- is passed over. o_moved: jobs moved; o_wait: seconds until the next rate token of a kind
-- whose waiting jobs the rate holds back (NULL: none).
CREATE FUNCTION awa._flow_unpark_v1(p_queue text, p_max integer, p_held integer[],
                                    OUT o_moved integer, OUT o_wait double precision)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    k record;
    lim awa.flow_kind_limits%ROWTYPE;
    v_room integer;
    v_keys integer[];
    v_tat timestamptz;
    v_tokens integer;
    v_wait double precision;
    v_lane integer;
    p record;
    v_moved integer;
    v_bodies awa.job_body[];
BEGIN
    o_moved := 0;
    FOR k IN
        WITH RECURSIVE kinds AS (
            (SELECT w.kind FROM awa.flow_waiting w WHERE w.queue = p_queue
             ORDER BY w.kind LIMIT 1)
            UNION ALL
            SELECT (SELECT w.kind FROM awa.flow_waiting w
                    WHERE w.queue = p_queue AND w.kind > s.kind ORDER BY w.kind LIMIT 1)
            FROM kinds s WHERE s.kind IS NOT NULL
        )
        SELECT s.kind FROM kinds s WHERE s.kind IS NOT NULL
    LOOP
        EXIT WHEN o_moved >= p_max;
        v_room := p_max - o_moved;
        lim := NULL;
        SELECT * INTO lim FROM awa.flow_kind_limits f WHERE f.kind = k.kind;
        IF lim.rate IS NOT NULL THEN
            SELECT s.tat INTO v_tat FROM awa.flow_kind_rate_state s WHERE s.kind = k.kind;
            SELECT t.o_tokens, t.o_wait INTO v_tokens, v_wait
            FROM awa._flow_kind_tokens_v1(lim.rate, lim.burst, v_tat, clock_timestamp()) t;
            IF v_tokens = 0 THEN
                o_wait := LEAST(COALESCE(o_wait, v_wait), v_wait);
                CONTINUE;
            END IF;
            v_room := LEAST(v_room, v_tokens);
        END IF;
        IF lim.max_running IS NOT NULL THEN
            v_keys := awa._flow_kind_take_v1(k.kind, lim.max_running, lim.max_seen,
                                             LEAST(v_room, lim.max_running), p_held);
            PERFORM awa.flow_release_v1(v_keys);
            v_room := LEAST(v_room, cardinality(v_keys));
            CONTINUE WHEN v_room <= 0;
        END IF;
        -- The oldest waiting jobs of the kind in the queue while their weights (as the claim
        -- counts them against the kind: at most its limit) fit the free permits, in job order:
        -- a heavy job waits, parked, until enough are free at once (never moved only to be
        -- parked again), and younger jobs of its kind wait behind it. By priority, one
        -- hand-off lane each.
        FOR p IN
            SELECT DISTINCT x.priority FROM (
                SELECT w.priority, w.job_id,
                       sum(awa._job_weight_v1(w.metadata, lim.max_running))
                           OVER (ORDER BY w.job_id) AS cw
                FROM awa.flow_waiting w
                WHERE w.queue = p_queue AND w.kind = k.kind
                ORDER BY w.job_id
                LIMIT v_room) x
            WHERE (lim.max_running IS NULL OR x.cw <= v_room)
        LOOP
            v_lane := awa.flow_handoff_lane_v1(p_queue, p.priority);
            CONTINUE WHEN NOT pg_try_advisory_xact_lock(4282177, v_lane);
            WITH picked AS MATERIALIZED (
                SELECT x.job_id FROM (
                    SELECT w.job_id, w.priority,
                           sum(awa._job_weight_v1(w.metadata, lim.max_running))
                               OVER (ORDER BY w.job_id) AS cw
                    FROM awa.flow_waiting w
                    WHERE w.queue = p_queue AND w.kind = k.kind
                    ORDER BY w.job_id
                    LIMIT v_room) x
                WHERE x.priority = p.priority
                  AND (lim.max_running IS NULL OR x.cw <= v_room)
            ), gone AS (
                -- SKIP LOCKED: a job being cancelled is passed over.
                DELETE FROM awa.flow_waiting w
                WHERE w.job_id IN (
                    SELECT w2.job_id FROM awa.flow_waiting w2
                    WHERE w2.job_id IN (SELECT job_id FROM picked)
                    FOR UPDATE SKIP LOCKED)
                RETURNING w.*
            )
            SELECT array_agg(ROW(
                       g.job_id, g.kind, g.queue, g.priority, g.args, g.attempt, g.max_attempts,
                       g.run_lease, g.run_at, g.created_at, g.deadline_secs, g.metadata, g.tags,
                       g.errors, g.progress)::awa.job_body ORDER BY g.job_id)
            INTO v_bodies
            FROM gone g;
            v_moved := COALESCE(cardinality(v_bodies), 0);
            IF v_moved > 0 THEN
                PERFORM awa._append_ready_v1(v_lane, v_bodies);
                o_moved := o_moved + v_moved;
            END IF;
        END LOOP;
    END LOOP;
END
$$;

-- The slow path of awa.claim_v3 for one lane whose next rows include a job with a serial key
-- or of a kind with flow limits (p_kinds): as awa._claim_serial_v1 (0008), and a job of a
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
CREATE FUNCTION awa._claim_kind_v1(
    p_lane integer, p_cursor bigint, p_cslot integer, p_cgen bigint, p_worker uuid,
    p_units integer, p_jobs integer, p_wcap integer, p_default double precision,
    p_held integer[], p_taken integer[], p_lanes integer[], p_bounds bigint[],
    p_kinds text[], p_pheld integer[], p_kkeys integer[], p_rkinds text[],
    p_rtats timestamptz[], p_rleft integer[], p_rused integer[],
    OUT o_rows awa.claimed_v3[], OUT o_taken integer[], OUT o_units integer,
    OUT o_retry boolean, OUT o_kkeys integer[], OUT o_rkinds text[],
    OUT o_rtats timestamptz[], OUT o_rleft integer[], OUT o_rused integer[],
    OUT o_wait double precision)
LANGUAGE plpgsql AS $$
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

-- Kind limits: settings sync, operator set/clear, status --------------------------------------

-- Write the kind limits the project's settings give (p_limits: {"kind": {"max_running": n |
-- null, "rate": r | null, "burst": b | null}, ...}: @job options and AWA["KINDS"]) as source
-- 'settings' rows; operator rows are left alone; settings rows of kinds p_limits does not name
-- lose their limits when p_prune (a worker that registers every kind of the project; a
-- process that knows only some kinds passes false). One transaction.
CREATE FUNCTION awa.flow_kind_sync_v1(p_limits jsonb, p_prune boolean DEFAULT true)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_changed integer := 0;
    v_n integer;
BEGIN
    IF p_limits IS NULL OR jsonb_typeof(p_limits) <> 'object' THEN
        RAISE EXCEPTION 'kind flow limits: expected a JSON object' USING ERRCODE = '22023';
    END IF;
    IF p_prune THEN
        UPDATE awa.flow_kind_limits f SET max_running = NULL, rate = NULL, burst = NULL,
                                          updated_by = 'settings', updated_at = now()
        WHERE f.source = 'settings' AND NOT p_limits ? f.kind
          AND (f.max_running IS NOT NULL OR f.rate IS NOT NULL);
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_changed := v_changed + v_n;
    END IF;
    INSERT INTO awa.flow_kind_limits AS f (kind, max_running, rate, burst, max_seen, source,
                                           updated_by)
    SELECT e.key, (e.value ->> 'max_running')::integer, (e.value ->> 'rate')::double precision,
           (e.value ->> 'burst')::integer, (e.value ->> 'max_running')::integer, 'settings',
           'settings'
    FROM jsonb_each(p_limits) e
    ON CONFLICT (kind) DO UPDATE
    SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst,
        max_seen = GREATEST(f.max_running, f.max_seen, excluded.max_running),
        updated_by = 'settings', updated_at = now()
    WHERE f.source = 'settings'
      AND (f.max_running, f.rate, f.burst) IS DISTINCT FROM
          (excluded.max_running, excluded.rate, excluded.burst);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_changed + v_n;
END
$$;

-- Set (source 'operator') or clear the limits of one kind, as awa.flow_set_v1 for a queue.
-- Returns the row now in force, if it limits anything.
CREATE FUNCTION awa.flow_kind_set_v1(p_kind text, p_max_running integer,
                                     p_rate double precision, p_burst integer, p_actor text,
                                     p_clear boolean, p_settings jsonb DEFAULT NULL)
RETURNS SETOF awa.flow_kind_limits
LANGUAGE plpgsql AS $$
BEGIN
    IF p_kind IS NULL OR length(p_kind) NOT BETWEEN 1 AND 255
       OR p_kind ~ '[\x01-\x1f\x7f-\x9f\u2028\u2029]' THEN
        RAISE EXCEPTION 'kind: % is not a job kind (1-255 characters, no control characters)',
            quote_nullable(p_kind) USING ERRCODE = '22023';
    END IF;
    IF p_clear THEN
        IF p_settings IS NULL OR jsonb_typeof(p_settings) <> 'object'
           OR (p_settings ->> 'max_running') IS NULL AND (p_settings ->> 'rate') IS NULL THEN
            UPDATE awa.flow_kind_limits f
            SET max_running = NULL, rate = NULL, burst = NULL, source = 'settings',
                updated_by = p_actor, updated_at = now()
            WHERE f.kind = p_kind;
            RETURN;
        END IF;
        INSERT INTO awa.flow_kind_limits AS f (kind, max_running, rate, burst, max_seen, source,
                                               updated_by)
        VALUES (p_kind, (p_settings ->> 'max_running')::integer,
                (p_settings ->> 'rate')::double precision,
                (p_settings ->> 'burst')::integer, (p_settings ->> 'max_running')::integer,
                'settings', p_actor)
        ON CONFLICT (kind) DO UPDATE
        SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst,
            max_seen = GREATEST(f.max_running, f.max_seen, excluded.max_running),
            source = 'settings', updated_by = p_actor, updated_at = now();
    ELSE
        INSERT INTO awa.flow_kind_limits AS f (kind, max_running, rate, burst, max_seen, source,
                                               updated_by)
        VALUES (p_kind, p_max_running, p_rate, p_burst, p_max_running, 'operator', p_actor)
        ON CONFLICT (kind) DO UPDATE
        SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst,
            max_seen = GREATEST(f.max_running, f.max_seen, excluded.max_running),
            source = 'operator', updated_by = p_actor, updated_at = now();
    END IF;
    RETURN QUERY SELECT * FROM awa.flow_kind_limits f
                 WHERE f.kind = p_kind AND (f.max_running IS NOT NULL OR f.rate IS NOT NULL);
END
$$;

-- Every kind with flow limits: the limits, their source, the permits in use now and the jobs
-- the kind's limits hold parked.
CREATE FUNCTION awa.flow_kind_status_v1()
RETURNS TABLE (kind text, max_running integer, in_use integer, rate double precision,
               burst integer, waiting bigint, source text, updated_by text,
               updated_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT f.kind, f.max_running,
           CASE WHEN f.max_running IS NOT NULL THEN (
               SELECT count(l.pid)::integer
               FROM generate_series(0, GREATEST(f.max_running, COALESCE(f.max_seen, 0)) - 1)
                   AS g(i)
               JOIN pg_locks l
                 ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
                AND l.classid = 4282182::oid
                AND l.objid = (awa._flow_kind_key_v1(f.kind, g.i)::bigint & 4294967295)::oid
                AND l.database = (SELECT d.oid FROM pg_database d
                                  WHERE d.datname = current_database())) END,
           f.rate, f.burst,
           (SELECT count(*) FROM awa.flow_waiting w WHERE w.kind = f.kind),
           f.source, f.updated_by, f.updated_at
    FROM awa.flow_kind_limits f
    WHERE f.max_running IS NOT NULL OR f.rate IS NOT NULL
       OR EXISTS (SELECT 1 FROM awa.flow_waiting w WHERE w.kind = f.kind)
    ORDER BY f.kind
$$;

-- Producers never pick a hand-off lane (shard 64): awa._lane_for_v1 and the inline lane choice
-- of awa.enqueue_one_v2/v3, the bodies of migrations 0011, 0003 and 0005 with `shard < 64`
-- (one more condition on the same index range). The entry points keep running as their owner.
CREATE OR REPLACE FUNCTION awa._lane_for_v1(p_queue text, p_priority integer, p_wait boolean)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_lanes integer[];
    v_held text := COALESCE(current_setting('awa.xact_lanes', true), '');
    v_n integer;
    v_home integer;
    v_lane integer;
    i integer;
BEGIN
    SELECT array_agg(l.lane_id ORDER BY l.shard) INTO v_lanes
    FROM awa.queue_lanes l WHERE l.queue = p_queue AND l.priority = p_priority AND l.shard < 64;
    IF v_lanes IS NULL THEN
        PERFORM awa.ensure_lanes_v1(p_queue, p_priority);
        SELECT array_agg(l.lane_id ORDER BY l.shard) INTO v_lanes
        FROM awa.queue_lanes l WHERE l.queue = p_queue AND l.priority = p_priority AND l.shard < 64;
    END IF;
    IF v_held <> '' THEN
        -- A held lane's lock is taken again at once (the transaction holds it); a lane named
        -- but not held is taken only when free (then it is held), else passed over.
        FOR v_lane IN
            SELECT x.h::integer
            FROM unnest(string_to_array(v_held, ',')) WITH ORDINALITY AS x(h, ord)
            -- Entries that are not lane ids are passed over (a session-level value, left by
            -- another client of a pooled connection, or forged, is anyone's to set).
            WHERE x.h ~ '^[0-9]{1,9}$' AND x.h::integer = ANY (v_lanes)
            ORDER BY x.ord
        LOOP
            IF pg_try_advisory_xact_lock(4282177, v_lane) THEN
                RETURN v_lane;
            END IF;
        END LOOP;
    END IF;
    v_n := cardinality(v_lanes);
    v_home := pg_backend_pid() % v_n;
    v_lane := NULL;
    FOR i IN 0..(v_n - 1) LOOP
        IF pg_try_advisory_xact_lock(4282177, v_lanes[((v_home + i) % v_n) + 1]) THEN
            v_lane := v_lanes[((v_home + i) % v_n) + 1];
            EXIT;
        END IF;
    END LOOP;
    IF v_lane IS NULL THEN
        IF NOT p_wait THEN
            RETURN NULL;
        END IF;
        v_lane := v_lanes[v_home + 1];
        PERFORM pg_advisory_xact_lock(4282177, v_lane);
    END IF;
    PERFORM set_config('awa.xact_lanes',
                       CASE WHEN v_held = '' THEN v_lane::text ELSE v_held || ',' || v_lane END,
                       true);
    RETURN v_lane;
END
$$;

CREATE OR REPLACE FUNCTION awa.enqueue_one_v2(
    p_kind text, p_queue text, p_priority integer, p_args jsonb, p_max_attempts integer,
    p_run_at timestamptz DEFAULT NULL, p_delay double precision DEFAULT NULL,
    p_deadline double precision DEFAULT NULL, p_metadata jsonb DEFAULT NULL,
    p_tags text[] DEFAULT NULL,
    p_args_max_bytes integer DEFAULT 1048576, p_metadata_max_bytes integer DEFAULT 65536,
    p_json_max_depth integer DEFAULT 32, p_max_tags integer DEFAULT 20,
    p_tag_max_length integer DEFAULT 100,
    OUT job_id bigint, OUT state text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_error text;
    v_now timestamptz;
    v_run_at timestamptz;
    v_lanes integer[];
    v_seqs regclass[];
    v_n integer;
    v_home integer;
    v_lane integer;
    v_seq regclass;
    i integer;
BEGIN
    -- Enough to be valid (the depth bound: n bytes of jsonb nest at most about n / 4 levels).
    IF NOT COALESCE(
        p_json_max_depth BETWEEN 1 AND 256 AND p_args_max_bytes >= 1
        AND p_metadata_max_bytes >= 1 AND p_max_tags >= 0 AND p_tag_max_length >= 1
        AND p_kind <> '' AND length(p_kind) <= 255 AND awa.valid_queue_name(p_queue)
        AND p_priority BETWEEN -100 AND 100 AND p_max_attempts BETWEEN 1 AND 1000
        AND pg_column_size(p_args) <= LEAST(p_args_max_bytes, 4 * (p_json_max_depth + 2))
        AND jsonb_typeof(p_args) = 'object' AND jsonb_typeof(p_args -> 'args') = 'array'
        AND jsonb_typeof(p_args -> 'kwargs') = 'object'
        AND (p_deadline IS NULL OR (p_deadline > 0 AND p_deadline <= 3155760000))
        AND (p_metadata IS NULL
             OR (jsonb_typeof(p_metadata) = 'object'
                 AND pg_column_size(p_metadata) <= LEAST(p_metadata_max_bytes, 4 * p_json_max_depth)))
        AND p_tags IS NULL AND p_run_at IS NULL AND p_delay IS NULL, false)
    THEN
        v_error := awa._enqueue_one_error_v2(
            p_kind, p_queue, p_priority, p_args, p_max_attempts, p_run_at, p_delay, p_deadline,
            p_metadata, p_tags, p_args_max_bytes, p_metadata_max_bytes, p_json_max_depth,
            p_max_tags, p_tag_max_length);
        IF v_error IS NOT NULL THEN
            RAISE EXCEPTION '%', v_error USING ERRCODE = '22023';
        END IF;
        IF p_run_at IS NOT NULL OR p_delay > 0 THEN
            v_now := clock_timestamp();
            v_run_at := GREATEST(COALESCE(p_run_at, v_now + make_interval(secs => COALESCE(p_delay, 0))), v_now);
            IF v_run_at > v_now THEN
                job_id := nextval('awa.job_id_seq');
                INSERT INTO awa.deferred_jobs (
                    job_id, state, queue, priority, kind, args, attempt, max_attempts, run_lease,
                    run_at, created_at, deadline_secs, metadata, tags)
                VALUES (job_id, 'scheduled', p_queue, p_priority, p_kind, p_args, 0,
                        p_max_attempts, 0, v_run_at, v_now, p_deadline, p_metadata, p_tags);
                state := 'scheduled';
                RETURN;
            END IF;
        END IF;
    END IF;
    -- The lane protocol of awa._lane_for_v1 (same lock class, home shard and awa.xact_lanes
    -- record), inline for its common case: this transaction holds no lane yet and the lanes
    -- exist. Otherwise awa._lane_for_v1 itself.
    IF COALESCE(current_setting('awa.xact_lanes', true), '') = '' THEN
        SELECT array_agg(l.lane_id ORDER BY l.shard), array_agg(l.enqueue_seq ORDER BY l.shard)
        INTO v_lanes, v_seqs
        FROM awa.queue_lanes l
        WHERE l.queue = p_queue AND l.priority = p_priority AND l.shard < 64;
    END IF;
    IF v_lanes IS NULL THEN
        v_lane := awa._lane_for_v1(p_queue, p_priority, true);
        SELECT l.enqueue_seq INTO v_seq FROM awa.queue_lanes l WHERE l.lane_id = v_lane;
    ELSE
        v_n := cardinality(v_lanes);
        v_home := pg_backend_pid() % v_n;
        FOR i IN 0..(v_n - 1) LOOP
            v_lane := v_lanes[((v_home + i) % v_n) + 1];
            EXIT WHEN pg_try_advisory_xact_lock(4282177, v_lane);
            v_lane := NULL;
        END LOOP;
        IF v_lane IS NULL THEN
            v_lane := v_lanes[v_home + 1];
            PERFORM pg_advisory_xact_lock(4282177, v_lane);
        END IF;
        v_seq := v_seqs[array_position(v_lanes, v_lane)];
        PERFORM set_config('awa.xact_lanes', v_lane::text, true);
    END IF;
    -- The ring slot and the clock are read after the lane lock is held (the wait may have
    -- spanned a rotation).
    INSERT INTO awa.ready_entries AS e (
        ready_slot, ready_generation, lane_id, lane_seq, job_id, priority, attempt, max_attempts,
        run_lease, queue, kind, args, run_at, created_at, deadline_secs, metadata, tags)
    SELECT r.slot, r.generation, v_lane, nextval(v_seq), nextval('awa.job_id_seq'), p_priority,
           0, p_max_attempts, 0, p_queue, p_kind, p_args, n.now, n.now, p_deadline, p_metadata,
           p_tags
    FROM (SELECT clock_timestamp() AS now) n,
         (SELECT r.slot, r.generation FROM awa.ring_rotations r WHERE r.ring = 'queue'
          ORDER BY r.generation DESC LIMIT 1) r
    RETURNING e.job_id INTO job_id;
    PERFORM pg_notify('awa_jobs', p_queue);
    state := 'available';
END
$$;

CREATE OR REPLACE FUNCTION awa.enqueue_one_v3(
    p_kind text, p_queue text, p_priority integer, p_args jsonb, p_max_attempts integer,
    p_run_at timestamptz DEFAULT NULL, p_delay double precision DEFAULT NULL,
    p_deadline double precision DEFAULT NULL, p_metadata jsonb DEFAULT NULL,
    p_tags text[] DEFAULT NULL,
    p_args_max_bytes integer DEFAULT 1048576, p_metadata_max_bytes integer DEFAULT 65536,
    p_json_max_depth integer DEFAULT 32, p_max_tags integer DEFAULT 20,
    p_tag_max_length integer DEFAULT 100,
    p_unique boolean DEFAULT false, p_unique_key text DEFAULT NULL,
    p_unique_for double precision DEFAULT NULL, p_unique_states text[] DEFAULT NULL,
    p_isolation_state boolean DEFAULT false,
    OUT job_id bigint, OUT state text, OUT queue text, OUT priority integer,
    OUT duplicate boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    v_error text;
    v_now timestamptz;
    v_run_at timestamptz;
    v_lanes integer[];
    v_seqs regclass[];
    v_n integer;
    v_home integer;
    v_lane integer;
    v_seq regclass;
    v_id bigint;
    v_key text;
    v_digest bytea;
    v_states text[];
    v_holder bigint;
    v_metadata jsonb := p_metadata;
    i integer;
BEGIN
    queue := p_queue;
    priority := p_priority;
    duplicate := false;
    -- Enough to be valid (the depth bound: n bytes of jsonb nest at most about n / 4 levels).
    IF NOT COALESCE(
        p_json_max_depth BETWEEN 1 AND 256 AND p_args_max_bytes >= 1
        AND p_metadata_max_bytes >= 1 AND p_max_tags >= 0 AND p_tag_max_length >= 1
        AND p_kind <> '' AND length(p_kind) <= 255 AND awa.valid_queue_name(p_queue)
        AND p_priority BETWEEN -100 AND 100 AND p_max_attempts BETWEEN 1 AND 1000
        AND pg_column_size(p_args) <= LEAST(p_args_max_bytes, 4 * (p_json_max_depth + 2))
        AND jsonb_typeof(p_args) = 'object' AND jsonb_typeof(p_args -> 'args') = 'array'
        AND jsonb_typeof(p_args -> 'kwargs') = 'object'
        AND (p_deadline IS NULL OR (p_deadline > 0 AND p_deadline <= 3155760000))
        AND (p_metadata IS NULL
             OR (jsonb_typeof(p_metadata) = 'object'
                 AND pg_column_size(p_metadata) <= LEAST(p_metadata_max_bytes, 4 * p_json_max_depth)))
        AND p_tags IS NULL AND p_run_at IS NULL AND p_delay IS NULL, false)
    THEN
        v_error := awa._enqueue_one_error_v2(
            p_kind, p_queue, p_priority, p_args, p_max_attempts, p_run_at, p_delay, p_deadline,
            p_metadata, p_tags, p_args_max_bytes, p_metadata_max_bytes, p_json_max_depth,
            p_max_tags, p_tag_max_length);
        IF v_error IS NOT NULL THEN
            RAISE EXCEPTION '%', v_error USING ERRCODE = '22023';
        END IF;
    END IF;
    IF p_unique OR p_unique_key IS NOT NULL OR p_unique_for IS NOT NULL
       OR p_unique_states IS NOT NULL THEN
        v_error := awa._unique_error_v1(p_unique_key, p_unique_for, p_unique_states);
        IF v_error IS NOT NULL THEN
            RAISE EXCEPTION '%', v_error USING ERRCODE = '22023';
        END IF;
        IF p_isolation_state
           AND current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
            state := current_setting('transaction_isolation');
            RETURN;  -- nothing written, the transaction usable: the caller raises
        END IF;
        v_key := awa.unique_key_text_v1(p_unique_key, p_args);
        v_digest := awa.unique_digest_v1(p_kind, v_key);
        v_states := COALESCE(p_unique_states, awa.unique_default_states_v1());
        v_id := nextval('awa.job_id_seq');
        -- The key first, the lane after: a producer waiting for a key holds no lane.
        SELECT t.holder, t.holder_state, t.holder_queue, t.holder_priority
        INTO v_holder, state, queue, priority
        FROM awa._unique_take_v1(v_digest, v_id, p_kind, v_key, v_states, p_unique_for) t;
        IF v_holder IS NOT NULL THEN
            job_id := v_holder;
            duplicate := true;
            RETURN;
        END IF;
        queue := p_queue;
        priority := p_priority;
        v_metadata := COALESCE(p_metadata, '{}'::jsonb) || jsonb_build_object(
            'awa:unique', jsonb_build_object('key', p_unique_key, 'states', v_states,
                                             'for', p_unique_for));
    END IF;
    IF p_run_at IS NOT NULL OR p_delay > 0 THEN
        v_now := clock_timestamp();
        v_run_at := GREATEST(COALESCE(p_run_at, v_now + make_interval(secs => COALESCE(p_delay, 0))), v_now);
        IF v_run_at > v_now THEN
            job_id := COALESCE(v_id, nextval('awa.job_id_seq'));
            INSERT INTO awa.deferred_jobs (
                job_id, state, queue, priority, kind, args, attempt, max_attempts, run_lease,
                run_at, created_at, deadline_secs, metadata, tags)
            VALUES (job_id, 'scheduled', p_queue, p_priority, p_kind, p_args, 0,
                    p_max_attempts, 0, v_run_at, v_now, p_deadline, v_metadata, p_tags);
            state := 'scheduled';
            RETURN;
        END IF;
    END IF;
    -- The lane protocol of awa._lane_for_v1 (same lock class, home shard and awa.xact_lanes
    -- record), inline for its common case: this transaction holds no lane yet and the lanes
    -- exist. Otherwise awa._lane_for_v1 itself.
    IF COALESCE(current_setting('awa.xact_lanes', true), '') = '' THEN
        SELECT array_agg(l.lane_id ORDER BY l.shard), array_agg(l.enqueue_seq ORDER BY l.shard)
        INTO v_lanes, v_seqs
        FROM awa.queue_lanes l
        WHERE l.queue = p_queue AND l.priority = p_priority AND l.shard < 64;
    END IF;
    IF v_lanes IS NULL THEN
        v_lane := awa._lane_for_v1(p_queue, p_priority, true);
        SELECT l.enqueue_seq INTO v_seq FROM awa.queue_lanes l WHERE l.lane_id = v_lane;
    ELSE
        v_n := cardinality(v_lanes);
        v_home := pg_backend_pid() % v_n;
        FOR i IN 0..(v_n - 1) LOOP
            v_lane := v_lanes[((v_home + i) % v_n) + 1];
            EXIT WHEN pg_try_advisory_xact_lock(4282177, v_lane);
            v_lane := NULL;
        END LOOP;
        IF v_lane IS NULL THEN
            v_lane := v_lanes[v_home + 1];
            PERFORM pg_advisory_xact_lock(4282177, v_lane);
        END IF;
        v_seq := v_seqs[array_position(v_lanes, v_lane)];
        PERFORM set_config('awa.xact_lanes', v_lane::text, true);
    END IF;
    -- The ring slot and the clock are read after the lane lock is held (the wait may have
    -- spanned a rotation).
    INSERT INTO awa.ready_entries AS e (
        ready_slot, ready_generation, lane_id, lane_seq, job_id, priority, attempt, max_attempts,
        run_lease, queue, kind, args, run_at, created_at, deadline_secs, metadata, tags)
    SELECT r.slot, r.generation, v_lane, nextval(v_seq), COALESCE(v_id, nextval('awa.job_id_seq')),
           p_priority, 0, p_max_attempts, 0, p_queue, p_kind, p_args, n.now, n.now, p_deadline,
           v_metadata, p_tags
    FROM (SELECT clock_timestamp() AS now) n,
         (SELECT r.slot, r.generation FROM awa.ring_rotations r WHERE r.ring = 'queue'
          ORDER BY r.generation DESC LIMIT 1) r
    RETURNING e.job_id INTO job_id;
    PERFORM pg_notify('awa_jobs', p_queue);
    state := 'available';
END
$$;

-- Jobs parked by their kind on the read surfaces and the operator's paths: the bodies of
-- migration 0008 with awa.flow_waiting beside awa.serial_waiting.

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
        SELECT 2, 'available', w.queue, w.priority::integer
        FROM awa.serial_waiting w WHERE w.job_id = p_job_id
        UNION ALL
        SELECT 2, 'available', w.queue, w.priority::integer
        FROM awa.flow_waiting w WHERE w.job_id = p_job_id
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
    w awa.serial_waiting%ROWTYPE;
    fw awa.flow_waiting%ROWTYPE;
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
    -- Jobs parked behind their serial keys.
    WITH gone AS (
        DELETE FROM awa.serial_waiting w
        WHERE w.job_id IN (
            SELECT w2.job_id FROM awa.serial_waiting w2
            WHERE w2.queue = p_queue AND (p_max_job_id IS NULL OR w2.job_id <= p_max_job_id)
            ORDER BY w2.job_id LIMIT GREATEST(p_limit - v_n, 0)
            FOR UPDATE SKIP LOCKED)
        RETURNING w.*
    )
    INSERT INTO awa.done_entries (
        ready_slot, ready_generation, job_id, run_lease, state, attempt, errors, progress, kind,
        queue, priority, args, max_attempts, run_at, created_at, metadata, tags)
    SELECT v_slot, v_gen, g.job_id, g.run_lease, 'cancelled', g.attempt,
           COALESCE(g.errors, '[]'::jsonb)
           || jsonb_build_array(v_error || jsonb_build_object('attempt', g.attempt, 'at', now())),
           g.progress, g.kind, g.queue, g.priority, g.args, g.max_attempts, g.run_at, g.created_at,
           g.metadata, g.tags
    FROM gone g;
    GET DIAGNOSTICS v_got = ROW_COUNT;
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
    )
    INSERT INTO awa.done_entries (
        ready_slot, ready_generation, job_id, run_lease, state, attempt, errors, progress, kind,
        queue, priority, args, max_attempts, run_at, created_at, metadata, tags)
    SELECT v_slot, v_gen, g.job_id, g.run_lease, 'cancelled', g.attempt,
           COALESCE(g.errors, '[]'::jsonb)
           || jsonb_build_array(v_error || jsonb_build_object('attempt', g.attempt, 'at', now())),
           g.progress, g.kind, g.queue, g.priority, g.args, g.max_attempts, g.run_at, g.created_at,
           g.metadata, g.tags
    FROM gone g;
    GET DIAGNOSTICS v_got = ROW_COUNT;
    v_n := v_n + v_got;

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
        -- OFFSET 0: the cursor is computed once per lane. Flattened, the call became a filter
        -- evaluated per row of every ready partition the planner chose to scan (470 s for one
        -- call over 450,000 retained rows without maintenance).
        CROSS JOIN LATERAL (SELECT awa.lane_cursor_v1(l.lane_id) AS c OFFSET 0) k
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
    AND NOT EXISTS (
        SELECT 1 FROM awa.serial_waiting w
        WHERE w.queue = ANY (p_queues)
          AND NOT EXISTS (SELECT 1 FROM awa.queue_meta m WHERE m.queue = w.queue AND m.paused))
    AND NOT EXISTS (
        SELECT 1 FROM awa.flow_waiting w
        WHERE w.queue = ANY (p_queues)
          AND NOT EXISTS (SELECT 1 FROM awa.queue_meta m WHERE m.queue = w.queue AND m.paused))
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
FROM awa.deferred_jobs d
UNION ALL
SELECT w.job_id, w.kind, w.queue, 'available', w.priority, w.attempt, w.max_attempts,
       w.run_lease, w.args, w.run_at, w.created_at, NULL, NULL, NULL, NULL, w.errors, NULL,
       w.progress, w.metadata, w.tags, false, NULL
FROM awa.serial_waiting w
UNION ALL
SELECT w.job_id, w.kind, w.queue, 'available', w.priority, w.attempt, w.max_attempts,
       w.run_lease, w.args, w.run_at, w.created_at, NULL, NULL, NULL, NULL, w.errors, NULL,
       w.progress, w.metadata, w.tags, false, NULL
FROM awa.flow_waiting w;
