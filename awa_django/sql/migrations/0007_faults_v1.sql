-- awa_django v1 under faults: bounded values, one key space per kind of advisory lock, READ
-- COMMITTED enforced, early callbacks, idempotent parks, rotation on the database clock, fair
-- promotion, set-based drains, and lane cursors that pass tombstoned prefixes.
--
-- Same contracts as before (functions keep their names and signatures) unless a new _v2 says
-- otherwise. docs/storage.md and docs/maintenance.md describe the behaviour.
--
-- Advisory-lock key spaces, one class per kind of object (two-int form):
--   4282177  lanes of producers, key lane_id (unchanged)
--   4282178  ring maintenance (rotate, prune), key 1 queue, 2 claim, 3 lease
--   4282179  the callback of one job, key awa._job_key_v1(job_id)
--   4282180  migrations (awa_django/sql/queries/migrations.sql)
-- The leader election uses the single-bigint key space (queries/storage.sql: leader_try).

-- Bounds ------------------------------------------------------------------------------------------

-- The longest delay, deadline or timeout awa_django accepts: 100 years, in seconds. Anything
-- larger could not be added to now() as a timestamptz.
CREATE FUNCTION awa._max_seconds_v1() RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 3155760000::double precision $$;

-- Raise SQLSTATE 25000 unless the transaction runs at READ COMMITTED (READ UNCOMMITTED, which
-- PostgreSQL runs as READ COMMITTED, is fine too): the engine's functions rely on each statement
-- seeing what committed before it (after a lock is taken).
CREATE FUNCTION awa._require_read_committed_v1(p_what text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION '% needs READ COMMITTED isolation (this transaction is %)',
            p_what, current_setting('transaction_isolation') USING ERRCODE = '25000';
    END IF;
END
$$;

-- The key of one job in the callback lock class (collisions only serialise two jobs needlessly).
CREATE FUNCTION awa._job_key_v1(p_job_id bigint) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT (p_job_id & 2147483647)::integer $$;

-- A stored deadline (seconds) as an interval that now() can always take: at most
-- _max_seconds_v1(), at least 1 ms (rows written by raw SQL before the bounds existed).
CREATE FUNCTION awa._deadline_secs_v1(p_secs double precision) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_secs IS NULL THEN NULL
                ELSE GREATEST(LEAST(p_secs, awa._max_seconds_v1()), 0.001) END
$$;

-- Registered callbacks: the attempt's callback id, written before the handler can hand it out,
-- and a resolution that arrived before the attempt parked.
ALTER TABLE awa.attempt_state ADD COLUMN callback_id uuid;
CREATE INDEX attempt_state_callback_idx ON awa.attempt_state (callback_id)
    WHERE callback_id IS NOT NULL;

-- Validation (second line behind Python) --------------------------------------------------------

CREATE OR REPLACE FUNCTION awa._job_request_error_v1(
    p_kind text, p_queue text, p_priority integer, p_args jsonb, p_max_attempts integer,
    p_deadline double precision, p_metadata jsonb, p_tags text[], p_args_max integer,
    p_meta_max integer, p_depth integer, p_max_tags integer, p_tag_len integer)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN p_kind IS NULL OR p_kind = '' OR length(p_kind) > 255 THEN
            'kind: must be a non-empty string of at most 255 characters'
        WHEN NOT awa.valid_queue_name(p_queue) THEN
            format('queue: %s is not a valid queue name ([a-z0-9_.-]{1,63})', quote_nullable(p_queue))
        WHEN p_priority IS NULL OR p_priority NOT BETWEEN -100 AND 100 THEN
            format('priority: %s is outside -100..100', p_priority)
        WHEN p_max_attempts IS NULL OR p_max_attempts NOT BETWEEN 1 AND 1000 THEN
            format('max_attempts: %s is outside 1..1000', p_max_attempts)
        WHEN p_args IS NULL THEN 'args: must be JSON'
        WHEN pg_column_size(p_args) > p_args_max THEN
            format('args: %s bytes exceeds the limit of %s bytes', pg_column_size(p_args), p_args_max)
        WHEN pg_column_size(p_args) > 4 * (p_depth + 2)
             AND jsonb_path_exists(p_args, awa._depth_probe_v1(p_depth + 2)) THEN
            format('args: nesting deeper than %s levels', p_depth)
        WHEN p_deadline IS NOT NULL AND NOT (p_deadline > 0 AND p_deadline <= 3155760000) THEN
            'deadline: must be a positive number of seconds, at most 3155760000 (100 years)'
        WHEN p_metadata IS NOT NULL AND jsonb_typeof(p_metadata) <> 'object' THEN
            'metadata: must be a JSON object'
        WHEN pg_column_size(p_metadata) > p_meta_max THEN
            format('metadata: %s bytes exceeds the limit of %s bytes', pg_column_size(p_metadata), p_meta_max)
        WHEN pg_column_size(p_metadata) > 4 * p_depth
             AND jsonb_path_exists(p_metadata, awa._depth_probe_v1(p_depth)) THEN
            format('metadata: nesting deeper than %s levels', p_depth)
        WHEN cardinality(p_tags) > p_max_tags THEN
            format('tags: %s tags exceeds the limit of %s', cardinality(p_tags), p_max_tags)
        WHEN awa._bad_tags_v1(p_tags, p_tag_len) THEN
            format('tags: every tag must be a non-empty string of at most %s characters', p_tag_len)
    END
$$;

-- The timing error of a request (NULL when fine): run_at must be a finite time, delay a number
-- of seconds within +/- 100 years.
CREATE FUNCTION awa._timing_error_v1(p_run_at timestamptz, p_delay double precision)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_run_at IS NOT NULL AND NOT isfinite(p_run_at) THEN
            'run_after: must be a finite point in time'
        WHEN p_delay IS NOT NULL AND NOT (p_delay >= -3155760000 AND p_delay <= 3155760000) THEN
            'run_after: a delay must be a number of seconds within 100 years'
    END
$$;

-- Enqueue -----------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION awa.enqueue_one_v1(
    p_kind text, p_queue text, p_priority integer, p_args jsonb, p_max_attempts integer,
    p_run_at timestamptz DEFAULT NULL, p_delay double precision DEFAULT NULL,
    p_deadline double precision DEFAULT NULL, p_metadata jsonb DEFAULT NULL,
    p_tags text[] DEFAULT NULL, p_limits jsonb DEFAULT '{}',
    OUT job_id bigint, OUT state text)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_error text;
    v_run_at timestamptz;
    v_lane integer;
    v_seq regclass;
    v_gen bigint;
    v_slot integer;
BEGIN
    v_error := COALESCE(awa._job_request_error_v1(
        p_kind, p_queue, p_priority, p_args, p_max_attempts, p_deadline, p_metadata, p_tags,
        awa._limit_v1(p_limits, 'args_max_bytes'), awa._limit_v1(p_limits, 'metadata_max_bytes'),
        awa._limit_v1(p_limits, 'json_max_depth'), awa._limit_v1(p_limits, 'max_tags'),
        awa._limit_v1(p_limits, 'tag_max_length')), awa._timing_error_v1(p_run_at, p_delay));
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION '%', v_error USING ERRCODE = '22023';
    END IF;
    v_run_at := GREATEST(COALESCE(p_run_at, v_now + make_interval(secs => COALESCE(p_delay, 0))), v_now);
    job_id := nextval('awa.job_id_seq');
    IF v_run_at > v_now THEN
        INSERT INTO awa.deferred_jobs (
            job_id, state, queue, priority, kind, args, attempt, max_attempts, run_lease, run_at,
            created_at, deadline_secs, metadata, tags)
        VALUES (job_id, 'scheduled', p_queue, p_priority, p_kind, p_args, 0, p_max_attempts, 0,
                v_run_at, v_now, p_deadline, p_metadata, p_tags);
        state := 'scheduled';
        RETURN;
    END IF;
    v_lane := awa._lane_for_v1(p_queue, p_priority, true);
    SELECT l.enqueue_seq INTO v_seq FROM awa.queue_lanes l WHERE l.lane_id = v_lane;
    -- The ring slot is read after the lane lock is held (the wait may have spanned a rotation).
    SELECT r.generation, r.slot INTO v_gen, v_slot
    FROM awa.ring_rotations r WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1;
    INSERT INTO awa.ready_entries (
        ready_slot, ready_generation, lane_id, lane_seq, job_id, priority, attempt, max_attempts,
        run_lease, queue, kind, args, run_at, created_at, deadline_secs, metadata, tags)
    VALUES (v_slot, v_gen, v_lane, nextval(v_seq), job_id, p_priority, 0, p_max_attempts, 0,
            p_queue, p_kind, p_args, v_now, v_now, p_deadline, p_metadata, p_tags);
    PERFORM pg_notify('awa_jobs', p_queue);
    state := 'available';
END
$$;

CREATE OR REPLACE FUNCTION awa.enqueue_v1(p_jobs jsonb, p_limits jsonb DEFAULT '{}')
RETURNS TABLE (job_id bigint, state text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_args_max integer := awa._limit_v1(p_limits, 'args_max_bytes');
    v_meta_max integer := awa._limit_v1(p_limits, 'metadata_max_bytes');
    v_depth integer := awa._limit_v1(p_limits, 'json_max_depth');
    v_max_tags integer := awa._limit_v1(p_limits, 'max_tags');
    v_tag_len integer := awa._limit_v1(p_limits, 'tag_max_length');
    v_n integer;
    v_ids bigint[];
    v_error text;
    v_deferred bigint;
    g record;
    v_lane integer;
    v_seq regclass;
    v_first bigint;
    v_gen bigint;
    v_slot integer;
BEGIN
    IF p_jobs IS NULL OR jsonb_typeof(p_jobs) <> 'array' THEN
        RAISE EXCEPTION 'jobs: expected a JSON array of job objects' USING ERRCODE = '22023';
    END IF;
    v_n := jsonb_array_length(p_jobs);
    IF v_n = 0 THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(p_jobs) e WHERE jsonb_typeof(e.value) <> 'object')
    THEN
        RAISE EXCEPTION 'jobs: every element must be a JSON object' USING ERRCODE = '22023';
    END IF;
    -- One pass validates every job (timing first, so that a bad delay never reaches
    -- make_interval) and counts the deferred ones.
    SELECT (array_agg(format('job %s: %s', x.ord - 1, x.err) ORDER BY x.ord)
                FILTER (WHERE x.err IS NOT NULL))[1],
           count(*) FILTER (WHERE x.err IS NULL AND x.deferred)
    INTO v_error, v_deferred
    FROM (
        SELECT t.ord, COALESCE(t.timing, awa._job_request_error_v1(
                   t.kind, COALESCE(t.queue, 'default'), COALESCE(t.priority, 0),
                   COALESCE(t.args, '{}'), COALESCE(t.max_attempts, 25), t.deadline, t.metadata,
                   t.tags, v_args_max, v_meta_max, v_depth, v_max_tags, v_tag_len)) AS err,
               CASE WHEN t.timing IS NULL THEN
                   COALESCE(t.run_at, v_now + make_interval(secs => COALESCE(t.delay, 0))) > v_now
               END AS deferred
        FROM (
            SELECT e.ord, r.*, awa._timing_error_v1(r.run_at, r.delay) AS timing
            FROM jsonb_array_elements(p_jobs) WITH ORDINALITY AS e(value, ord),
                 jsonb_to_record(e.value) AS r(kind text, queue text, priority integer, args jsonb,
                     max_attempts integer, run_at timestamptz, delay double precision,
                     deadline double precision, metadata jsonb, tags text[])
        ) t
    ) x;
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION '%', v_error USING ERRCODE = '22023';
    END IF;

    v_ids := ARRAY(SELECT nextval('awa.job_id_seq') FROM generate_series(1, v_n));

    IF v_deferred > 0 THEN
        INSERT INTO awa.deferred_jobs (
            job_id, state, queue, priority, kind, args, attempt, max_attempts, run_lease, run_at,
            created_at, deadline_secs, metadata, tags)
        SELECT v_ids[e.ord], 'scheduled', COALESCE(r.queue, 'default'), COALESCE(r.priority, 0),
               r.kind, COALESCE(r.args, '{}'), 0, COALESCE(r.max_attempts, 25), 0,
               COALESCE(r.run_at, v_now + make_interval(secs => COALESCE(r.delay, 0))), v_now,
               r.deadline, r.metadata, r.tags
        FROM jsonb_array_elements(p_jobs) WITH ORDINALITY AS e(value, ord),
             jsonb_to_record(e.value) AS r(kind text, queue text, priority integer, args jsonb,
                 max_attempts integer, run_at timestamptz, delay double precision,
                 deadline double precision, metadata jsonb, tags text[])
        WHERE COALESCE(r.run_at, v_now + make_interval(secs => COALESCE(r.delay, 0))) > v_now;
    END IF;
    IF v_deferred = v_n THEN
        RETURN QUERY SELECT v_ids[i], 'scheduled'::text FROM generate_series(1, v_n) AS i;
        RETURN;
    END IF;

    FOR g IN
        SELECT COALESCE(r.queue, 'default') AS queue, COALESCE(r.priority, 0) AS priority,
               count(*) AS n
        FROM jsonb_to_recordset(p_jobs) AS r(queue text, priority integer, run_at timestamptz,
                                             delay double precision)
        WHERE COALESCE(r.run_at, v_now + make_interval(secs => COALESCE(r.delay, 0))) <= v_now
        GROUP BY 1, 2
        ORDER BY 1, 2
    LOOP
        v_lane := awa._lane_for_v1(g.queue, g.priority, true);
        SELECT l.enqueue_seq INTO v_seq FROM awa.queue_lanes l WHERE l.lane_id = v_lane;
        -- Read after the lane lock is held (the wait may have spanned a rotation).
        SELECT r.generation, r.slot INTO v_gen, v_slot
        FROM awa.ring_rotations r WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1;
        -- The lane lock is held, so nobody else moves this sequence between the two calls.
        v_first := nextval(v_seq);
        IF g.n > 1 THEN
            PERFORM setval(v_seq, v_first + g.n - 1);
        END IF;
        INSERT INTO awa.ready_entries (
            ready_slot, ready_generation, lane_id, lane_seq, job_id, priority, attempt,
            max_attempts, run_lease, queue, kind, args, run_at, created_at, deadline_secs,
            metadata, tags)
        SELECT v_slot, v_gen, v_lane, v_first + row_number() OVER (ORDER BY e.ord) - 1,
               v_ids[e.ord], g.priority, 0, COALESCE(r.max_attempts, 25), 0, g.queue, r.kind,
               COALESCE(r.args, '{}'), v_now, v_now, r.deadline, r.metadata, r.tags
        FROM jsonb_array_elements(p_jobs) WITH ORDINALITY AS e(value, ord),
             jsonb_to_record(e.value) AS r(kind text, queue text, priority integer, args jsonb,
                 max_attempts integer, run_at timestamptz, delay double precision,
                 deadline double precision, metadata jsonb, tags text[])
        WHERE COALESCE(r.queue, 'default') = g.queue AND COALESCE(r.priority, 0) = g.priority
          AND COALESCE(r.run_at, v_now + make_interval(secs => COALESCE(r.delay, 0))) <= v_now;
        PERFORM pg_notify('awa_jobs', g.queue);
    END LOOP;

    RETURN QUERY
    SELECT v_ids[e.ord],
           CASE WHEN COALESCE(r.run_at, v_now + make_interval(secs => COALESCE(r.delay, 0))) > v_now
                THEN 'scheduled' ELSE 'available' END
    FROM jsonb_array_elements(p_jobs) WITH ORDINALITY AS e(value, ord),
         jsonb_to_record(e.value) AS r(run_at timestamptz, delay double precision)
    ORDER BY e.ord;
END
$$;

CREATE OR REPLACE FUNCTION awa.reserve_v1(
    p_queues text[], p_priorities integer[], p_counts integer[], p_total integer,
    OUT lane_ids integer[], OUT first_seqs bigint[], OUT ready_slot integer,
    OUT ready_generation bigint, OUT job_ids bigint[], OUT db_now timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    v_lane integer;
    v_seq regclass;
    v_first bigint;
    i integer;
BEGIN
    IF COALESCE(cardinality(p_queues), 0) <> COALESCE(cardinality(p_priorities), 0)
       OR COALESCE(cardinality(p_queues), 0) <> COALESCE(cardinality(p_counts), 0) THEN
        RAISE EXCEPTION 'reserve: queues, priorities and counts must have one entry per group'
            USING ERRCODE = '22023';
    END IF;
    lane_ids := '{}';
    first_seqs := '{}';
    FOR i IN 1..COALESCE(cardinality(p_queues), 0) LOOP
        IF NOT awa.valid_queue_name(p_queues[i]) OR p_priorities[i] NOT BETWEEN -100 AND 100
           OR p_counts[i] < 1 THEN
            RAISE EXCEPTION 'reserve: group % (queue %, priority %, count %) is invalid',
                i, quote_nullable(p_queues[i]), p_priorities[i], p_counts[i]
                USING ERRCODE = '22023';
        END IF;
        v_lane := awa._lane_for_v1(p_queues[i], p_priorities[i], true);
        SELECT l.enqueue_seq INTO v_seq FROM awa.queue_lanes l WHERE l.lane_id = v_lane;
        -- The lane lock is held, so nobody else moves this sequence between the two calls.
        v_first := nextval(v_seq);
        IF p_counts[i] > 1 THEN
            PERFORM setval(v_seq, v_first + p_counts[i] - 1);
        END IF;
        lane_ids := lane_ids || v_lane;
        first_seqs := first_seqs || v_first;
        PERFORM pg_notify('awa_jobs', p_queues[i]);
    END LOOP;
    -- After every lane lock is held: the slot the rows go to, and the clock they carry.
    db_now := clock_timestamp();
    job_ids := ARRAY(SELECT nextval('awa.job_id_seq') FROM generate_series(1, p_total));
    SELECT r.generation, r.slot INTO ready_generation, ready_slot
    FROM awa.ring_rotations r WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1;
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
CREATE FUNCTION awa._lane_skip_v1(p_lane integer)
RETURNS bigint
LANGUAGE plpgsql AS $$
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

-- Claim -------------------------------------------------------------------------------------------

-- Same contract as 0006. A stored deadline is bounded (awa._deadline_secs_v1), so a row written
-- by raw SQL before the bounds existed cannot make the claim fail for the whole queue.
CREATE OR REPLACE FUNCTION awa.claim_v1(
    p_queue text, p_max integer, p_worker uuid DEFAULT NULL,
    p_aging_secs double precision DEFAULT 60, p_default_deadline double precision DEFAULT NULL)
RETURNS TABLE (job_id bigint, run_lease bigint, attempt smallint, max_attempts smallint,
               claim_slot integer, kind text, args jsonb, queue text, priority smallint,
               deadline_at timestamptz, timeout_secs double precision, progress jsonb)
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
    SELECT r2.generation, r2.slot INTO v_cgen, v_cslot
    FROM awa.ring_rotations r2 WHERE r2.ring = 'claim' ORDER BY r2.generation DESC LIMIT 1;

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
                lane_id, lane_seq, attempt, deadline_at, worker_id)
            SELECT v_cslot, v_cgen, p.job_id, p.run_lease + 1, p.ready_slot, p.ready_generation,
                   p.lane_id, p.lane_seq, p.attempt + 1,
                   now() + make_interval(secs => p.timeout),
                   p_worker
            FROM picked p
            RETURNING lane_seq, deadline_at
        )
        SELECT p.job_id, p.run_lease + 1, (p.attempt + 1)::smallint, p.max_attempts, v_cslot,
               p.kind, p.args, p.queue, p.priority, i.deadline_at, p.timeout, p.progress
        FROM picked p JOIN ins i ON i.lane_seq = p.lane_seq
        ORDER BY p.lane_seq;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_remaining := v_remaining - v_got;
        EXIT WHEN v_remaining <= 0;
    END LOOP;
END
$$;

-- Callbacks -----------------------------------------------------------------------------------------

-- Register p_callback_id as the callback of the open attempt (p_job_id, p_run_lease), before
-- the handler hands it to an external system, so that a resolution arriving before the attempt
-- parks is kept (see callback_resolve_v1). A new id replaces the attempt's previous one.
-- Returns false when the attempt is no longer open (nothing is written).
CREATE FUNCTION awa.callback_register_v1(p_job_id bigint, p_run_lease bigint, p_callback_id uuid)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM awa._require_read_committed_v1('awa.callback_register_v1');
    IF p_callback_id IS NULL THEN
        RAISE EXCEPTION 'callback_id: must not be NULL' USING ERRCODE = '22023';
    END IF;
    PERFORM pg_advisory_xact_lock(4282179, awa._job_key_v1(p_job_id));
    IF NOT EXISTS (
        SELECT 1 FROM awa.claims c
        WHERE c.job_id = p_job_id AND c.run_lease = p_run_lease
          AND NOT EXISTS (
              SELECT 1 FROM awa.claim_closures z
              WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                AND z.claim_slot = c.claim_slot)) THEN
        RETURN false;
    END IF;
    INSERT INTO awa.attempt_state AS s (job_id, run_lease, callback_id)
    VALUES (p_job_id, p_run_lease, p_callback_id)
    ON CONFLICT (job_id, run_lease) DO UPDATE
    SET callback_id = EXCLUDED.callback_id,
        callback_result = CASE WHEN s.callback_id IS NOT DISTINCT FROM EXCLUDED.callback_id
                               THEN s.callback_result END,
        heartbeat_at = now(), updated_at = now();
    RETURN true;
END
$$;

-- Resolve a callback: complete the attempt with p_result, or fail it (p_error, retried like any
-- failure unless p_terminal), through the normal fenced finalization. A parked attempt is
-- finalized at once; an attempt that registered the id but has not parked yet keeps the
-- resolution, which its park then applies. Returns 'resolved', 'stale' (already resolved,
-- rescued after its timeout, cancelled, or finished otherwise) or 'unknown'.
CREATE OR REPLACE FUNCTION awa.callback_resolve_v1(
    p_callback_id uuid, p_result jsonb DEFAULT NULL, p_error jsonb DEFAULT NULL,
    p_terminal boolean DEFAULT false)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    l awa.leases%ROWTYPE;
    v_job bigint;
    v_lease bigint;
    v_stale jsonb;
BEGIN
    PERFORM awa._require_read_committed_v1('awa.callback_resolve_v1');
    IF p_error IS NOT NULL AND jsonb_typeof(p_error) <> 'object' THEN
        RAISE EXCEPTION 'error: must be a JSON object' USING ERRCODE = '22023';
    END IF;
    SELECT ls.job_id, ls.run_lease INTO v_job, v_lease FROM awa.leases ls
    WHERE ls.callback_id = p_callback_id ORDER BY ls.run_lease DESC LIMIT 1;
    IF NOT FOUND THEN
        SELECT s.job_id, s.run_lease INTO v_job, v_lease FROM awa.attempt_state s
        WHERE s.callback_id = p_callback_id ORDER BY s.run_lease DESC LIMIT 1;
        IF NOT FOUND THEN
            RETURN 'unknown';
        END IF;
    END IF;
    -- Serialised with the attempt's park (finalize_v1); later statements see what it committed.
    PERFORM pg_advisory_xact_lock(4282179, awa._job_key_v1(v_job));
    SELECT * INTO l FROM awa.leases ls
    WHERE ls.callback_id = p_callback_id AND ls.job_id = v_job AND ls.run_lease = v_lease
      AND ls.state = 'waiting_external'
    LIMIT 1;
    IF FOUND THEN
        v_stale := awa._finalize_pass_v1(jsonb_build_array(jsonb_build_object(
            'id', l.job_id, 'lease', l.run_lease, 'slot', l.claim_slot, 'st', true,
            'outcome', CASE WHEN p_error IS NULL THEN 'completed'
                            WHEN p_terminal THEN 'fail' ELSE 'retry' END,
            'result', p_result, 'error', p_error)), false);
        RETURN CASE WHEN v_stale IS NULL THEN 'resolved' ELSE 'stale' END;
    END IF;
    -- Registered but not parked yet: keep the first resolution for the park.
    UPDATE awa.attempt_state s
    SET callback_result = jsonb_build_object('result', p_result, 'error', p_error,
                                             'terminal', COALESCE(p_terminal, false)),
        updated_at = now()
    WHERE s.job_id = v_job AND s.run_lease = v_lease AND s.callback_id = p_callback_id
      AND s.callback_result IS NULL
      AND EXISTS (
          SELECT 1 FROM awa.claims c
          WHERE c.job_id = s.job_id AND c.run_lease = s.run_lease
            AND NOT EXISTS (
                SELECT 1 FROM awa.claim_closures z
                WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                  AND z.claim_slot = c.claim_slot));
    RETURN CASE WHEN FOUND THEN 'resolved' ELSE 'stale' END;
END
$$;

-- Finalize ----------------------------------------------------------------------------------------

-- The first invalid item of a finalize batch, as a message naming its index and job (NULL when
-- every item is valid). Same bounds as the Python outcome constructors.
CREATE FUNCTION awa._finalize_error_v1(p_items jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('item %s (job %s): %s', x.ord - 1, x.value ->> 'id', x.err)
    FROM (
        SELECT e.ord, e.value, CASE
            WHEN jsonb_typeof(e.value) <> 'object' THEN 'must be a JSON object'
            WHEN jsonb_typeof(e.value -> 'id') IS DISTINCT FROM 'number'
                 OR jsonb_typeof(e.value -> 'lease') IS DISTINCT FROM 'number'
                 OR jsonb_typeof(e.value -> 'slot') IS DISTINCT FROM 'number' THEN
                'id, lease and slot must be numbers'
            WHEN e.value ->> 'outcome' IS NULL OR e.value ->> 'outcome' NOT IN (
                     'completed', 'retry', 'snooze', 'cancel', 'fail', 'wait') THEN
                'outcome: expected completed, retry, snooze, cancel, fail or wait'
            WHEN jsonb_typeof(e.value -> 'delay') NOT IN ('number', 'null') THEN
                'delay: must be a number of seconds'
            WHEN jsonb_typeof(e.value -> 'delay') = 'number'
                 AND NOT ((e.value ->> 'delay')::float8 BETWEEN 0 AND 3155760000) THEN
                'delay: must be a number of seconds in 0..3155760000 (100 years)'
            WHEN jsonb_typeof(e.value -> 'error') NOT IN ('object', 'null') THEN
                'error: must be a JSON object'
            WHEN e.value ->> 'outcome' <> 'wait' THEN NULL
            WHEN e.value ->> 'callback_id' IS NULL
                 OR e.value ->> 'callback_id' !~* '^[0-9a-f]{8}-?([0-9a-f]{4}-?){3}[0-9a-f]{12}$' THEN
                'callback_id: must be a uuid'
            WHEN jsonb_typeof(e.value -> 'timeout') IS DISTINCT FROM 'number'
                 OR NOT ((e.value ->> 'timeout')::float8 > 0
                         AND (e.value ->> 'timeout')::float8 <= 3155760000) THEN
                'timeout: must be a number of seconds in (0, 3155760000]'
        END AS err
        FROM jsonb_array_elements(p_items) WITH ORDINALITY AS e(value, ord)
    ) x
    WHERE x.err IS NOT NULL
    ORDER BY x.ord
    LIMIT 1
$$;

-- Park the 'wait' items of a batch (see finalize_v1). Idempotent: an attempt that is already
-- parked stays parked (a batch resent after a reconnect changes nothing). An attempt whose
-- registered callback was resolved before it parked is not parked: its resolution comes back as
-- a finalize item. Returns {"finalize": [items], "stale": [items]}.
CREATE FUNCTION awa._park_v2(p_items jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_gen bigint;
    v_slot integer;
    v_rows jsonb;
    v_early jsonb;
    v_stale jsonb;
BEGIN
    -- Serialise with callback_resolve_v1 for these jobs, in a stable order.
    PERFORM pg_advisory_xact_lock(4282179, awa._job_key_v1(s.id))
    FROM (SELECT DISTINCT (e.value ->> 'id')::bigint AS id
          FROM jsonb_array_elements(p_items) e ORDER BY 1) s;
    -- From here on, each statement sees every resolution committed before the locks.
    SELECT generation, slot INTO v_gen, v_slot
    FROM awa.ring_rotations WHERE ring = 'lease' ORDER BY generation DESC LIMIT 1;
    SELECT jsonb_agg(jsonb_build_object(
               'id', x.id, 'lease', x.lease, 'callback_id', x.callback_id, 'timeout', x.timeout,
               'progress', x.progress, 'raw', e.value,
               'open_slot', (
                   SELECT c.claim_slot FROM awa.claims c
                   WHERE c.job_id = x.id AND c.run_lease = x.lease
                     AND NOT EXISTS (
                         SELECT 1 FROM awa.claim_closures z
                         WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                           AND z.claim_slot = c.claim_slot)
                   LIMIT 1),
               'parked', EXISTS (
                   SELECT 1 FROM awa.leases ls WHERE ls.job_id = x.id AND ls.run_lease = x.lease),
               'result', (
                   SELECT s.callback_result FROM awa.attempt_state s
                   WHERE s.job_id = x.id AND s.run_lease = x.lease
                     AND s.callback_id = x.callback_id)))
    INTO v_rows
    FROM jsonb_array_elements(p_items) e,
         jsonb_to_record(e.value) AS x(id bigint, lease bigint, callback_id uuid,
                                        timeout double precision, progress jsonb);

    -- Resolved before parking: finalize now with the kept resolution.
    SELECT jsonb_agg(jsonb_build_object(
               'id', p.id, 'lease', p.lease, 'slot', p.open_slot, 'st', true,
               'outcome', CASE WHEN jsonb_typeof(p.result -> 'error') IS DISTINCT FROM 'object'
                                   THEN 'completed'
                               WHEN (p.result ->> 'terminal')::boolean THEN 'fail'
                               ELSE 'retry' END,
               'result', p.result -> 'result', 'error', p.result -> 'error',
               'progress', p.progress))
    INTO v_early
    FROM jsonb_to_recordset(v_rows) AS p(id bigint, lease bigint, open_slot integer,
                                          parked boolean, result jsonb, progress jsonb)
    WHERE p.open_slot IS NOT NULL AND NOT p.parked AND p.result IS NOT NULL;

    -- Park the others once, keeping their latest progress for the resolution. The early ones get
    -- their lease too (closed with the attempt just after), so that a later resolution of the
    -- same callback finds it and is told 'stale', not 'unknown'.
    INSERT INTO awa.leases (lease_slot, lease_generation, job_id, run_lease, claim_slot, state,
                            callback_id, callback_timeout_at)
    SELECT v_slot, v_gen, p.id, p.lease, p.open_slot, 'waiting_external', p.callback_id,
           now() + make_interval(secs => p.timeout)
    FROM jsonb_to_recordset(v_rows) AS p(id bigint, lease bigint, open_slot integer,
                                          parked boolean, callback_id uuid,
                                          timeout double precision)
    WHERE p.open_slot IS NOT NULL AND NOT p.parked
    ON CONFLICT DO NOTHING;
    INSERT INTO awa.attempt_state AS s (job_id, run_lease, progress, callback_id)
    SELECT p.id, p.lease, p.progress, p.callback_id
    FROM jsonb_to_recordset(v_rows) AS p(id bigint, lease bigint, open_slot integer,
                                          parked boolean, result jsonb, callback_id uuid,
                                          progress jsonb)
    WHERE p.open_slot IS NOT NULL AND NOT p.parked AND p.result IS NULL
      AND p.progress IS NOT NULL
    ON CONFLICT (job_id, run_lease) DO UPDATE
    SET progress = EXCLUDED.progress, updated_at = now();

    SELECT jsonb_agg(p.raw) INTO v_stale
    FROM jsonb_to_recordset(v_rows) AS p(open_slot integer, raw jsonb)
    WHERE p.open_slot IS NULL;
    RETURN jsonb_build_object('finalize', COALESCE(v_early, '[]'::jsonb),
                              'stale', COALESCE(v_stale, '[]'::jsonb));
END
$$;

-- Same contract as 0002, plus: every item is validated first (SQLSTATE 22023 naming the item,
-- nothing written), READ COMMITTED is required, and parking is idempotent and applies a
-- callback resolution that arrived before the park.
CREATE OR REPLACE FUNCTION awa.finalize_v1(p_items jsonb)
RETURNS TABLE (job_id bigint, run_lease bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_error text;
    v_stale jsonb;
    v_park jsonb;
    v_wait_stale jsonb := '[]'::jsonb;
BEGIN
    PERFORM awa._require_read_committed_v1('awa.finalize_v1');
    IF p_items IS NULL OR jsonb_typeof(p_items) <> 'array' THEN
        RAISE EXCEPTION 'items: expected a JSON array' USING ERRCODE = '22023';
    END IF;
    v_error := awa._finalize_error_v1(p_items);
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION '%', v_error USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(p_items) e WHERE e.value ->> 'outcome' = 'wait')
    THEN
        v_park := awa._park_v2(
            (SELECT jsonb_agg(e.value) FROM jsonb_array_elements(p_items) e
             WHERE e.value ->> 'outcome' = 'wait'));
        v_wait_stale := v_park -> 'stale';
        p_items := (SELECT COALESCE(jsonb_agg(e.value), '[]'::jsonb)
                    FROM jsonb_array_elements(p_items) e WHERE e.value ->> 'outcome' <> 'wait')
                   || (v_park -> 'finalize');
    END IF;
    v_stale := awa._finalize_pass_v1(p_items, true);
    IF v_stale IS NOT NULL THEN
        -- A concurrent carry-forward may have moved the claim to another slot; this second
        -- statement runs with a snapshot taken after any closure we conflicted with.
        v_stale := awa._finalize_pass_v1(v_stale, false);
    END IF;
    RETURN QUERY
    SELECT (e.value ->> 'id')::bigint, (e.value ->> 'lease')::bigint
    FROM jsonb_array_elements(COALESCE(v_stale, '[]'::jsonb) || v_wait_stale) AS e(value);
END
$$;

-- Cancel ------------------------------------------------------------------------------------------

-- Same contract as 0002, plus READ COMMITTED is required, and cancelling the head of a lane lets
-- the lane's cursor pass the tombstoned run (awa._lane_skip_v1).
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
    v_error jsonb := jsonb_build_object('type', 'Cancelled', 'message', COALESCE(p_reason, 'cancelled'));
BEGIN
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
                attempted_at, errors, progress, queue)
            SELECT c.ready_slot, c.ready_generation, c.job_id, c.run_lease, c.lane_id, c.lane_seq,
                   'cancelled', c.attempt, c.claimed_at,
                   COALESCE(e.errors, '[]'::jsonb)
                   || jsonb_build_array(v_error || jsonb_build_object('attempt', c.attempt, 'at', now())),
                   COALESCE(s.progress, e.progress), e.queue
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
            errors, progress, queue)
        VALUES (r.ready_slot, r.ready_generation, r.job_id, r.run_lease, r.lane_id, r.lane_seq,
                'cancelled', r.attempt,
                COALESCE(r.errors, '[]'::jsonb)
                || jsonb_build_array(v_error || jsonb_build_object('attempt', r.attempt, 'at', now())),
                r.progress, r.queue);
        PERFORM awa._lane_skip_v1(r.lane_id);
        RETURN 'available';
    END LOOP;
    RETURN NULL;
END
$$;

-- Drain -------------------------------------------------------------------------------------------

-- Cancel up to p_limit waiting jobs (available, scheduled, retryable) of a queue, set-based, in
-- one short transaction; with p_max_job_id only jobs with an id at or below it (so that a drain
-- in batches ends even while producers keep enqueueing). Each lane is locked FOR UPDATE (claimers
-- skip it meanwhile) and its cursor moved past what was cancelled. Running jobs finish. Returns
-- the number cancelled; call again while it returns p_limit.
CREATE FUNCTION awa.queue_drain_v2(p_queue text, p_limit integer DEFAULT 1000,
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
            errors, progress, queue)
        SELECT p.ready_slot, p.ready_generation, p.job_id, p.run_lease, p.lane_id, p.lane_seq,
               'cancelled', p.attempt,
               COALESCE(p.errors, '[]'::jsonb)
               || jsonb_build_array(v_error || jsonb_build_object('attempt', p.attempt, 'at', now())),
               p.progress, p.queue
        FROM picked p
        JOIN tomb t ON t.lane_id = p.lane_id AND t.lane_seq = p.lane_seq AND t.ready_slot = p.ready_slot;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_n := v_n + v_got;
        PERFORM awa._lane_skip_v1(v_lane);
    END LOOP;
    RETURN v_n;
END
$$;

-- The 0004 signature, now one set-based batch of queue_drain_v2.
CREATE OR REPLACE FUNCTION awa.queue_drain_v1(p_queue text, p_limit integer DEFAULT 10000)
RETURNS integer
LANGUAGE sql AS $$ SELECT awa.queue_drain_v2(p_queue, p_limit, NULL) $$;

-- Promotion ---------------------------------------------------------------------------------------

-- Same contract as 0002, but a (queue, priority) whose every lane is held by open producer
-- transactions no longer stalls the others: its rows are skipped and the next due rows of other
-- groups are promoted in the same call, up to p_limit in all.
CREATE OR REPLACE FUNCTION awa.promote_v1(p_limit integer DEFAULT 4096)
RETURNS integer
LANGUAGE plpgsql AS $$
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

-- Rescue ------------------------------------------------------------------------------------------

-- Same contract as 0003; READ COMMITTED is required (it closes attempts with fresh snapshots).
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
               'delay', LEAST(p_backoff_base * power(2, LEAST(x.attempt, 40)) * (1 + random() * 0.25), 86400),
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

-- Rings -------------------------------------------------------------------------------------------

-- Take the maintenance lock of one ring (its own key space) for this transaction: the ring's
-- slot count, or NULL when another rotate or prune of the ring holds it. An unknown ring raises
-- SQLSTATE 22023.
CREATE FUNCTION awa._ring_lock_v1(p_ring text) RETURNS integer
LANGUAGE plpgsql AS $$
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

-- Advance a ring to its next slot once its current slot is at least p_interval seconds old on
-- the database clock ('skipped_recent' before), so that a new leader, or awa_maintenance --once
-- from cron, keeps the cadence instead of rotating every ring at once. Otherwise as rotate_v1:
-- 'rotated', 'skipped_busy', 'skipped_idle' or 'skipped_locked'.
CREATE FUNCTION awa.rotate_v2(p_ring text, p_interval double precision DEFAULT 0)
RETURNS text
LANGUAGE plpgsql AS $$
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

-- The 0003 signature: rotate now, whatever the age of the current slot.
CREATE OR REPLACE FUNCTION awa.rotate_v1(p_ring text)
RETURNS text
LANGUAGE sql AS $$ SELECT awa.rotate_v2(p_ring, 0) $$;

-- Same contract as 0003, with three changes: the ring lock has a key space of its own (open
-- producer transactions on the first lanes no longer make it skip); READ COMMITTED is required
-- (the gates are re-checked with a fresh snapshot after the lock); and before a claim slot is
-- truncated, each lane whose cursor lies in it gets a closed marker claim at that position in
-- the current slot (append-only, instead of updating lane_floors in place).
CREATE OR REPLACE FUNCTION awa.prune_v1(p_ring text, p_lock_timeout_ms integer DEFAULT 50)
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

-- Leadership ----------------------------------------------------------------------------------------

-- The holder of the maintenance leader lock (pg_try_advisory_lock(4708303813012965710), see
-- queries/storage.sql: leader_try) and whether it is alive. A holder that is an awa process
-- (application_name 'awa:worker:<instance id>') whose runtime row is older than p_staleness
-- seconds, or gone, is frozen (SIGSTOP), wedged, or partitioned while its connection lives on:
-- its backend is terminated so that the lock is freed and a live process takes over. action is
-- 'alive', 'terminated', 'not_permitted' (pg_terminate_backend refused: another role without
-- pg_signal_backend) or 'foreign' (not an awa process: left alone).
CREATE FUNCTION awa.leader_takeover_v1(p_staleness double precision)
RETURNS TABLE (pid integer, instance text, seen_ago double precision, action text)
LANGUAGE plpgsql AS $$
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

-- Burst mode ----------------------------------------------------------------------------------------

-- Same contract as 0002, except that paused queues do not count: their available jobs cannot be
-- claimed, so a burst worker would otherwise wait for them forever.
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
