-- awa_django SQL functions v1: every transition is one call per batch.
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

-- Lanes -----------------------------------------------------------------------------------------

-- Highest lane position consumed by a claim (0 when none): rows at or below it are spent.
CREATE FUNCTION awa.lane_cursor_v1(p_lane_id integer) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT GREATEST(
        COALESCE((SELECT max(c.lane_seq) FROM awa.claims c WHERE c.lane_id = p_lane_id), 0),
        COALESCE((SELECT f.floor_seq FROM awa.lane_floors f WHERE f.lane_id = p_lane_id), 0))
$$;

-- Create the queue's metadata row and the lanes (one per enqueue shard) of (queue, priority).
-- Idempotent and safe to run concurrently. Returns the number of lanes.
CREATE FUNCTION awa.ensure_lanes_v1(p_queue text, p_priority integer, p_shards integer DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_shards integer;
    v_shard integer;
    v_id integer;
    v_seq text;
BEGIN
    IF NOT awa.valid_queue_name(p_queue) THEN
        RAISE EXCEPTION 'queue: % is not a valid queue name ([a-z0-9_.-]{1,63})', quote_nullable(p_queue)
            USING ERRCODE = '22023';
    END IF;
    IF p_priority IS NULL OR p_priority NOT BETWEEN -100 AND 100 THEN
        RAISE EXCEPTION 'priority: % is outside -100..100', p_priority USING ERRCODE = '22023';
    END IF;
    INSERT INTO awa.queue_meta (queue, enqueue_shards)
    VALUES (p_queue, COALESCE(p_shards, 4))
    ON CONFLICT (queue) DO NOTHING;
    SELECT m.enqueue_shards INTO v_shards FROM awa.queue_meta m WHERE m.queue = p_queue;
    FOR v_shard IN 0..(v_shards - 1) LOOP
        CONTINUE WHEN EXISTS (
            SELECT 1 FROM awa.queue_lanes l
            WHERE l.queue = p_queue AND l.priority = p_priority AND l.shard = v_shard);
        v_id := nextval('awa.lane_id_seq');
        v_seq := 'lane_seq_' || v_id;
        EXECUTE format('CREATE SEQUENCE awa.%I AS bigint', v_seq);
        INSERT INTO awa.queue_lanes (lane_id, queue, priority, shard, enqueue_seq)
        VALUES (v_id, p_queue, p_priority, v_shard, format('awa.%I', v_seq)::regclass)
        ON CONFLICT (queue, priority, shard) DO NOTHING;
        IF NOT FOUND THEN
            EXECUTE format('DROP SEQUENCE awa.%I', v_seq);
        END IF;
    END LOOP;
    RETURN v_shards;
END
$$;

-- Lock one lane of (queue, priority) for this transaction and return it. A lane this transaction
-- already holds is reused (so one producer's jobs stay in one FIFO lane); otherwise the first
-- shard whose lock is free, starting from a per-backend home shard; when every shard is held,
-- wait for the home shard (p_wait) or return NULL.
CREATE FUNCTION awa._lane_for_v1(p_queue text, p_priority integer, p_wait boolean)
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
    FROM awa.queue_lanes l WHERE l.queue = p_queue AND l.priority = p_priority;
    IF v_lanes IS NULL THEN
        PERFORM awa.ensure_lanes_v1(p_queue, p_priority);
        SELECT array_agg(l.lane_id ORDER BY l.shard) INTO v_lanes
        FROM awa.queue_lanes l WHERE l.queue = p_queue AND l.priority = p_priority;
    END IF;
    IF v_held <> '' THEN
        SELECT h::integer INTO v_lane
        FROM unnest(string_to_array(v_held, ',')) AS h
        WHERE h::integer = ANY (v_lanes)
        LIMIT 1;
        IF v_lane IS NOT NULL THEN
            RETURN v_lane;
        END IF;
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

-- Append job bodies, in array order, to a lane the caller holds (see _lane_for_v1), in the
-- current queue-ring slot, and wake the lane's queue. Every path that makes work runnable
-- (enqueue, promotion, DLQ retry) goes through here.
CREATE FUNCTION awa._append_ready_v1(p_lane integer, p_jobs awa.job_body[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_n integer := COALESCE(cardinality(p_jobs), 0);
    v_seq regclass;
    v_queue text;
    v_first bigint;
    v_gen bigint;
    v_slot integer;
BEGIN
    IF v_n = 0 THEN
        RETURN;
    END IF;
    SELECT l.enqueue_seq, l.queue INTO v_seq, v_queue FROM awa.queue_lanes l WHERE l.lane_id = p_lane;
    SELECT r.generation, r.slot INTO v_gen, v_slot
    FROM awa.ring_rotations r WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1;
    -- The lane lock is held, so nobody else moves this sequence between the two calls.
    v_first := nextval(v_seq);
    IF v_n > 1 THEN
        PERFORM setval(v_seq, v_first + v_n - 1);
    END IF;
    INSERT INTO awa.ready_entries (
        ready_slot, ready_generation, lane_id, lane_seq, job_id, priority, attempt, max_attempts,
        run_lease, queue, kind, args, run_at, created_at, deadline_secs, metadata, tags, errors,
        progress)
    SELECT v_slot, v_gen, p_lane, v_first + u.ord - 1, u.job_id, u.priority, u.attempt,
           u.max_attempts, u.run_lease, u.queue, u.kind, u.args, u.run_at, u.created_at,
           u.deadline_secs, u.metadata, u.tags, u.errors, u.progress
    FROM unnest(p_jobs) WITH ORDINALITY AS u(job_id, kind, queue, priority, args, attempt,
        max_attempts, run_lease, run_at, created_at, deadline_secs, metadata, tags, errors,
        progress, ord);
    PERFORM pg_notify('awa_jobs', v_queue);
END
$$;

-- Append job bodies to their lanes, grouped by (queue, priority) in a stable lock order.
-- Returns the number of jobs appended (groups whose lanes are all busy are skipped when not
-- p_wait).
CREATE FUNCTION awa._append_ready_grouped_v1(p_jobs awa.job_body[], p_wait boolean)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    g record;
    v_lane integer;
    v_total integer := 0;
BEGIN
    FOR g IN
        SELECT u.queue, u.priority,
               array_agg(ROW(u.job_id, u.kind, u.queue, u.priority, u.args, u.attempt,
                             u.max_attempts, u.run_lease, u.run_at, u.created_at,
                             u.deadline_secs, u.metadata, u.tags, u.errors,
                             u.progress)::awa.job_body ORDER BY u.ord) AS jobs
        FROM unnest(p_jobs) WITH ORDINALITY AS u(job_id, kind, queue, priority, args, attempt,
            max_attempts, run_lease, run_at, created_at, deadline_secs, metadata, tags, errors,
            progress, ord)
        GROUP BY u.queue, u.priority
        ORDER BY u.queue, u.priority
    LOOP
        v_lane := awa._lane_for_v1(g.queue, g.priority, p_wait);
        CONTINUE WHEN v_lane IS NULL;
        PERFORM awa._append_ready_v1(v_lane, g.jobs);
        v_total := v_total + cardinality(g.jobs);
    END LOOP;
    RETURN v_total;
END
$$;

-- Enqueue ---------------------------------------------------------------------------------------

-- The depth probe for _job_request_error_v1: matches any value nested deeper than p_depth
-- levels below the level the probe is applied to.
CREATE FUNCTION awa._depth_probe_v1(p_depth integer) RETURNS jsonpath
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT format('strict $.**{%s}', p_depth + 1)::jsonpath
$$;

-- True when a tag is NULL, empty or longer than p_max_length (STRICT: NULL tags are fine).
CREATE FUNCTION awa._bad_tags_v1(p_tags text[], p_max_length integer) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT EXISTS (SELECT 1 FROM unnest(p_tags) t WHERE t IS NULL OR t = '' OR length(t) > p_max_length)
$$;

-- The first validation error of a job request, or NULL when it is valid. The Python producer
-- validates first; this is the second line for raw-SQL producers. Sizes are Postgres's binary
-- jsonb sizes. p_depth counts levels below the user's values, so the args document
-- {"args": [...], "kwargs": {...}} is probed two levels deeper. Written as one CASE expression
-- with no sub-select so that the planner inlines it into the caller's query. The depth probe is
-- skipped for documents too small to be that deep (every level costs at least 4 bytes).
CREATE FUNCTION awa._job_request_error_v1(
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
        WHEN p_deadline IS NOT NULL AND NOT (p_deadline > 0 AND p_deadline < 'infinity'::float8) THEN
            'deadline: must be a positive number of seconds'
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

-- The limits in p_limits (keys args_max_bytes, metadata_max_bytes, json_max_depth, max_tags,
-- tag_max_length; all optional), with the documented defaults.
CREATE FUNCTION awa._limit_v1(p_limits jsonb, p_key text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT COALESCE((p_limits ->> p_key)::integer, CASE p_key
        WHEN 'args_max_bytes' THEN 1048576 WHEN 'metadata_max_bytes' THEN 65536
        WHEN 'json_max_depth' THEN 32 WHEN 'max_tags' THEN 20 WHEN 'tag_max_length' THEN 100 END)
$$;

-- Enqueue one job, in the caller's transaction: the lean path for single enqueues. run_at (an
-- absolute time) or delay (seconds from now on the database clock) defers the job; otherwise
-- it is appended to the ready ring and workers are woken (NOTIFY) at commit. Returns the job id
-- and 'available' or 'scheduled'. Invalid input raises SQLSTATE 22023 and writes nothing.
CREATE FUNCTION awa.enqueue_one_v1(
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
    v_error := awa._job_request_error_v1(
        p_kind, p_queue, p_priority, p_args, p_max_attempts, p_deadline, p_metadata, p_tags,
        awa._limit_v1(p_limits, 'args_max_bytes'), awa._limit_v1(p_limits, 'metadata_max_bytes'),
        awa._limit_v1(p_limits, 'json_max_depth'), awa._limit_v1(p_limits, 'max_tags'),
        awa._limit_v1(p_limits, 'tag_max_length'));
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

-- Enqueue a batch of jobs, in the caller's transaction. p_jobs is a JSON array of objects with
-- keys kind, queue, priority, args, max_attempts, run_at (timestamptz) or delay (seconds from
-- now on the database clock), deadline (seconds), metadata, tags. Immediate jobs are appended to
-- the ready ring in input order per lane (waking workers with NOTIFY at commit); future ones go
-- to deferred_jobs. Returns (job_id, state) in input order. Nothing is written if any job is
-- invalid (SQLSTATE 22023, the message names the job's index and the field).
CREATE FUNCTION awa.enqueue_v1(p_jobs jsonb, p_limits jsonb DEFAULT '{}')
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
    -- One pass validates every job and counts the deferred ones.
    SELECT (array_agg(format('job %s: %s', x.ord - 1, x.err) ORDER BY x.ord)
                FILTER (WHERE x.err IS NOT NULL))[1],
           count(*) FILTER (WHERE x.deferred)
    INTO v_error, v_deferred
    FROM (
        SELECT e.ord,
               awa._job_request_error_v1(
                   r.kind, COALESCE(r.queue, 'default'), COALESCE(r.priority, 0),
                   COALESCE(r.args, '{}'), COALESCE(r.max_attempts, 25), r.deadline, r.metadata,
                   r.tags, v_args_max, v_meta_max, v_depth, v_max_tags, v_tag_len) AS err,
               COALESCE(r.run_at, v_now + make_interval(secs => COALESCE(r.delay, 0))) > v_now
                   AS deferred
        FROM jsonb_array_elements(p_jobs) WITH ORDINALITY AS e(value, ord),
             jsonb_to_record(e.value) AS r(kind text, queue text, priority integer, args jsonb,
                 max_attempts integer, run_at timestamptz, delay double precision,
                 deadline double precision, metadata jsonb, tags text[])
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

    SELECT r.generation, r.slot INTO v_gen, v_slot
    FROM awa.ring_rotations r WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1;
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

-- Reserve what a bulk producer needs to COPY jobs straight into the ready ring and the deferred
-- plane, in the caller's transaction (the path of the Python enqueue_many):
--   * p_total job ids, ascending;
--   * for each (p_queues[i], p_priorities[i]) group of immediate jobs, a lane locked for this
--     transaction and p_counts[i] consecutive lane positions starting at first_seqs[i];
--   * the current queue-ring slot and generation, and the database clock.
-- It also queues the NOTIFY for each group's queue, delivered when the transaction commits.
-- The caller must then write exactly those rows; the lane locks keep later producers of the same
-- lanes waiting, so the prefix property of each lane holds.
CREATE FUNCTION awa.reserve_v1(
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
    db_now := clock_timestamp();
    job_ids := ARRAY(SELECT nextval('awa.job_id_seq') FROM generate_series(1, p_total));
    SELECT r.generation, r.slot INTO ready_generation, ready_slot
    FROM awa.ring_rotations r WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1;
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
END
$$;

-- Claim -----------------------------------------------------------------------------------------

-- Claim up to p_max available jobs of one queue for worker p_worker, as one short transaction.
-- Lanes are taken in order of effective priority (priority + 1 per p_aging_secs that the lane's
-- head has waited), then oldest head; each lane is locked FOR UPDATE SKIP LOCKED so concurrent
-- claimers take different lanes. Within a lane, rows come in FIFO order. Each claimed attempt is
-- appended to the claim ring and returned with attempt + 1 and run_lease + 1; deadline_at is the
-- attempt's hard deadline on the database clock and timeout_secs the same as a duration.
CREATE FUNCTION awa.claim_v1(
    p_queue text, p_max integer, p_worker uuid DEFAULT NULL,
    p_aging_secs double precision DEFAULT 60, p_default_deadline double precision DEFAULT NULL)
RETURNS TABLE (job_id bigint, run_lease bigint, attempt smallint, max_attempts smallint,
               claim_slot integer, kind text, args jsonb, queue text, priority smallint,
               deadline_at timestamptz, timeout_secs double precision, progress jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_remaining integer := p_max;
    v_got integer;
    v_cursor bigint;
    v_cslot integer;
    v_cgen bigint;
    v_aging double precision := GREATEST(COALESCE(p_aging_secs, 60), 0.001);
    r record;
BEGIN
    IF p_max IS NULL OR p_max <= 0 THEN
        RETURN;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'awa.claim_v1 needs READ COMMITTED isolation' USING ERRCODE = '25000';
    END IF;
    IF EXISTS (SELECT 1 FROM awa.queue_meta m WHERE m.queue = p_queue AND m.paused) THEN
        RETURN;
    END IF;
    SELECT r2.generation, r2.slot INTO v_cgen, v_cslot
    FROM awa.ring_rotations r2 WHERE r2.ring = 'claim' ORDER BY r2.generation DESC LIMIT 1;

    FOR r IN
        SELECT l.lane_id
        FROM awa.queue_lanes l
        CROSS JOIN LATERAL (SELECT awa.lane_cursor_v1(l.lane_id) AS c) k
        CROSS JOIN LATERAL (
            SELECT e.run_at FROM awa.ready_entries e
            WHERE e.lane_id = l.lane_id AND e.lane_seq > k.c
              AND NOT EXISTS (
                  SELECT 1 FROM awa.ready_tombstones t
                  WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                    AND t.ready_slot = e.ready_slot)
            ORDER BY e.lane_seq LIMIT 1) h
        WHERE l.queue = p_queue
          AND COALESCE(pg_sequence_last_value(l.enqueue_seq), 0) > k.c
        ORDER BY l.priority + floor(extract(epoch FROM now() - h.run_at) / v_aging) DESC,
                 h.run_at, l.lane_id
    LOOP
        PERFORM 1 FROM awa.queue_lanes l WHERE l.lane_id = r.lane_id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        -- A new statement, so a new snapshot: it sees every claim committed before the lock.
        v_cursor := awa.lane_cursor_v1(r.lane_id);
        RETURN QUERY
        WITH picked AS MATERIALIZED (
            SELECT e.* FROM awa.ready_entries e
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
                   now() + make_interval(secs => COALESCE(p.deadline_secs, p_default_deadline)),
                   p_worker
            FROM picked p
            RETURNING lane_seq, deadline_at
        )
        SELECT p.job_id, p.run_lease + 1, (p.attempt + 1)::smallint, p.max_attempts, v_cslot,
               p.kind, p.args, p.queue, p.priority, i.deadline_at,
               COALESCE(p.deadline_secs, p_default_deadline), p.progress
        FROM picked p JOIN ins i ON i.lane_seq = p.lane_seq
        ORDER BY p.lane_seq;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_remaining := v_remaining - v_got;
        EXIT WHEN v_remaining <= 0;
    END LOOP;
END
$$;

-- Heartbeat -------------------------------------------------------------------------------------

-- Refresh the heartbeat (and, when given, the progress) of a batch of live attempts:
-- p_items is a JSON array of {"id", "lease", "progress"?}. Returns the attempts that are no
-- longer open (finished, rescued or cancelled elsewhere); nothing is written for those.
CREATE FUNCTION awa.heartbeat_v1(p_items jsonb)
RETURNS TABLE (job_id bigint, run_lease bigint)
LANGUAGE sql AS $$
    WITH items AS (
        SELECT x.id, x.lease, x.progress
        FROM jsonb_to_recordset(p_items) AS x(id bigint, lease bigint, progress jsonb)
    ), live AS (
        SELECT i.* FROM items i
        WHERE EXISTS (
            SELECT 1 FROM awa.claims c
            WHERE c.job_id = i.id AND c.run_lease = i.lease
              AND NOT EXISTS (
                  SELECT 1 FROM awa.claim_closures z
                  WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                    AND z.claim_slot = c.claim_slot))
    ), up AS (
        INSERT INTO awa.attempt_state AS s (job_id, run_lease, heartbeat_at, progress, updated_at)
        SELECT id, lease, now(), progress, now() FROM live
        ON CONFLICT (job_id, run_lease) DO UPDATE
        SET heartbeat_at = now(), progress = COALESCE(EXCLUDED.progress, s.progress),
            updated_at = now()
    )
    SELECT i.id, i.lease FROM items i
    WHERE NOT EXISTS (SELECT 1 FROM live l WHERE l.id = i.id AND l.lease = i.lease)
$$;

-- Finalize --------------------------------------------------------------------------------------

-- One pass of finalize_v1. With p_hint the claim is looked up in the slot the worker was given;
-- without it, in any live slot (after a carry-forward moved it). Returns the items that found no
-- open claim to close, as a JSON array (NULL when none).
CREATE FUNCTION awa._finalize_pass_v1(p_items jsonb, p_hint boolean)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_stale jsonb;
BEGIN
    WITH items AS (
        SELECT x.*, e.value AS raw
        FROM jsonb_array_elements(p_items) AS e(value),
             jsonb_to_record(e.value) AS x(id bigint, lease bigint, slot integer, outcome text,
                 result jsonb, error jsonb, delay double precision, progress jsonb, st boolean,
                 closed_as text)
    ), cl AS MATERIALIZED (
        -- A lateral lookup (not a join) keeps the row estimate at the item count, so the
        -- planner hash-joins the CTEs below instead of nesting loops over them.
        SELECT i.id, i.lease, i.outcome, i.result, i.error, i.delay, i.progress,
               COALESCE(i.st, false) AS st, COALESCE(i.closed_as, i.outcome) AS closed_as,
               c.claim_slot, c.ready_slot, c.ready_generation,
               c.lane_id, c.lane_seq, c.attempt, c.claimed_at
        FROM items i
        CROSS JOIN LATERAL (
            SELECT c.* FROM awa.claims c
            WHERE c.job_id = i.id AND c.run_lease = i.lease
              AND (c.claim_slot = i.slot OR NOT p_hint)
              AND (p_hint OR NOT EXISTS (
                  SELECT 1 FROM awa.claim_closures z
                  WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                    AND z.claim_slot = c.claim_slot))
            LIMIT 1) c
    ), closed AS (
        INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome)
        SELECT claim_slot, id, lease, closed_as FROM cl
        ON CONFLICT DO NOTHING
        RETURNING claim_slot, job_id, run_lease
    ), won AS MATERIALIZED (
        SELECT cl.* FROM cl
        JOIN closed k ON k.job_id = cl.id AND k.run_lease = cl.lease AND k.claim_slot = cl.claim_slot
    ), completed AS (
        INSERT INTO awa.done_entries (
            ready_slot, ready_generation, job_id, run_lease, lane_id, lane_seq, state, attempt,
            attempted_at, result, queue)
        SELECT w.ready_slot, w.ready_generation, w.id, w.lease, w.lane_id, w.lane_seq, 'completed',
               w.attempt, w.claimed_at, w.result, l.queue
        FROM won w JOIN awa.queue_lanes l ON l.lane_id = w.lane_id
        WHERE w.outcome = 'completed'
    ), other AS MATERIALIZED (
        SELECT w.*, r.queue, r.priority, r.kind, r.args, r.max_attempts, r.run_at, r.created_at,
               r.deadline_secs, r.metadata, r.tags,
               CASE WHEN w.outcome = 'snooze' THEN r.errors
                    ELSE COALESCE(r.errors, '[]'::jsonb) || jsonb_build_array(
                        COALESCE(w.error, jsonb_build_object('message', w.outcome))
                        || jsonb_build_object('attempt', w.attempt, 'at', now()))
               END AS new_errors,
               COALESCE(w.progress, s.progress, r.progress) AS new_progress,
               CASE
                   WHEN w.outcome = 'snooze' THEN 'scheduled'
                   WHEN w.outcome = 'cancel' THEN 'cancelled'
                   WHEN w.outcome = 'retry' AND w.attempt < r.max_attempts THEN 'retryable'
                   WHEN COALESCE(m.dlq_enabled, true) THEN 'dlq'
                   ELSE 'failed'
               END AS dest
        FROM won w
        JOIN awa.ready_entries r
          ON r.lane_id = w.lane_id AND r.lane_seq = w.lane_seq AND r.ready_slot = w.ready_slot
        LEFT JOIN awa.queue_meta m ON m.queue = r.queue
        LEFT JOIN awa.attempt_state s ON w.st AND s.job_id = w.id AND s.run_lease = w.lease
        WHERE w.outcome <> 'completed'
    ), terminal AS (
        INSERT INTO awa.done_entries (
            ready_slot, ready_generation, job_id, run_lease, lane_id, lane_seq, state, attempt,
            attempted_at, errors, progress, queue)
        SELECT o.ready_slot, o.ready_generation, o.id, o.lease, o.lane_id, o.lane_seq, o.dest,
               o.attempt, o.claimed_at, o.new_errors, o.new_progress, o.queue
        FROM other o WHERE o.dest IN ('cancelled', 'failed')
    ), deferred AS (
        INSERT INTO awa.deferred_jobs (
            job_id, state, queue, priority, kind, args, attempt, max_attempts, run_lease, run_at,
            created_at, attempted_at, deadline_secs, metadata, tags, errors, progress)
        SELECT o.id, o.dest, o.queue, o.priority, o.kind, o.args,
               CASE WHEN o.dest = 'scheduled' THEN o.attempt - 1 ELSE o.attempt END,
               o.max_attempts, o.lease,
               now() + make_interval(secs => COALESCE(
                   o.delay,
                   CASE WHEN o.dest = 'retryable'
                        THEN LEAST(power(2, o.attempt) * (1 + random() * 0.25), 86400)
                        ELSE 0 END)),
               o.created_at, o.claimed_at, o.deadline_secs, o.metadata, o.tags, o.new_errors,
               o.new_progress
        FROM other o WHERE o.dest IN ('scheduled', 'retryable')
    ), dead AS (
        INSERT INTO awa.dlq_entries (
            job_id, queue, priority, kind, args, attempt, max_attempts, run_lease,
            original_run_lease, run_at, created_at, attempted_at, deadline_secs, metadata, tags,
            errors, progress, dlq_reason)
        SELECT o.id, o.queue, o.priority, o.kind, o.args, o.attempt, o.max_attempts, o.lease,
               o.lease, o.run_at, o.created_at, o.claimed_at, o.deadline_secs, o.metadata, o.tags,
               o.new_errors, o.new_progress,
               CASE WHEN o.outcome = 'retry' THEN 'max_attempts exhausted: '
                    ELSE 'terminal error: ' END
               || COALESCE(o.error ->> 'message', o.outcome)
        FROM other o WHERE o.dest = 'dlq'
    ), cleared AS (
        DELETE FROM awa.attempt_state s
        USING won w
        WHERE w.st AND s.job_id = w.id AND s.run_lease = w.lease
    )
    SELECT jsonb_agg(i.raw) INTO v_stale
    FROM items i
    WHERE NOT EXISTS (SELECT 1 FROM closed k WHERE k.job_id = i.id AND k.run_lease = i.lease);
    RETURN v_stale;
END
$$;

-- Park open attempts waiting for an external callback: a lease row (lease ring, state
-- waiting_external) with the callback id and its timeout. The attempt stays open (its claim is
-- not closed), its execution slot is freed. Returns the attempts that were no longer open.
CREATE FUNCTION awa._park_v1(p_items jsonb)
RETURNS TABLE (job_id bigint, run_lease bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_gen bigint;
    v_slot integer;
BEGIN
    SELECT generation, slot INTO v_gen, v_slot
    FROM awa.ring_rotations WHERE ring = 'lease' ORDER BY generation DESC LIMIT 1;
    RETURN QUERY
    WITH items AS (
        SELECT x.* FROM jsonb_to_recordset(p_items) AS x(
            id bigint, lease bigint, callback_id uuid, timeout double precision, progress jsonb)
    ), parked AS (
        INSERT INTO awa.leases (lease_slot, lease_generation, job_id, run_lease, claim_slot,
                                state, callback_id, callback_timeout_at)
        SELECT v_slot, v_gen, c.job_id, c.run_lease, c.claim_slot, 'waiting_external',
               i.callback_id, now() + make_interval(secs => COALESCE(i.timeout, 3600))
        FROM items i
        JOIN awa.claims c ON c.job_id = i.id AND c.run_lease = i.lease
        WHERE NOT EXISTS (
            SELECT 1 FROM awa.claim_closures z
            WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
              AND z.claim_slot = c.claim_slot)
        RETURNING job_id, run_lease
    )
    SELECT i.id, i.lease FROM items i
    WHERE NOT EXISTS (SELECT 1 FROM parked p WHERE p.job_id = i.id AND p.run_lease = i.lease);
END
$$;

-- Resolve a parked attempt by its callback id: complete it with p_result, or fail it (p_error,
-- retried like any failure unless p_terminal), through the normal fenced finalization. Returns
-- 'resolved', 'stale' (already resolved, rescued after its timeout, or cancelled) or 'unknown'.
CREATE FUNCTION awa.callback_resolve_v1(
    p_callback_id uuid, p_result jsonb DEFAULT NULL, p_error jsonb DEFAULT NULL,
    p_terminal boolean DEFAULT false)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    l awa.leases%ROWTYPE;
    v_stale jsonb;
BEGIN
    SELECT * INTO l FROM awa.leases ls
    WHERE ls.callback_id = p_callback_id AND ls.state = 'waiting_external'
    ORDER BY ls.run_lease DESC LIMIT 1;
    IF NOT FOUND THEN
        RETURN 'unknown';
    END IF;
    v_stale := awa._finalize_pass_v1(jsonb_build_array(jsonb_build_object(
        'id', l.job_id, 'lease', l.run_lease, 'slot', l.claim_slot, 'st', true,
        'outcome', CASE WHEN p_error IS NULL THEN 'completed'
                        WHEN p_terminal THEN 'fail' ELSE 'retry' END,
        'result', p_result, 'error', p_error)), false);
    RETURN CASE WHEN v_stale IS NULL THEN 'resolved' ELSE 'stale' END;
END
$$;

-- Finalize a batch of attempts in one transaction. p_items is a JSON array of objects:
--   id, lease, slot    the attempt identity and the claim slot it was claimed in
--   outcome            completed | retry | snooze | cancel | fail | wait
--   callback_id,       (wait) the attempt parks, waiting_external, until awa.callback_resolve_v1
--   timeout            is called with callback_id or `timeout` seconds pass (then it is rescued)
--   result             (completed) the JSON return value
--   error              (retry, fail, cancel) {"type", "message", "traceback"}
--   delay              (retry: explicit RetryAfter delay; snooze) seconds
--   progress           the latest progress snapshot, kept across retries, cleared on success
--   st                 true when the attempt may have an attempt_state row to remove
--   closed_as          the closure's recorded outcome when it differs (rescue records 'rescued')
-- Each attempt is closed at most once; retry past max_attempts and fail go to the DLQ when the
-- queue's DLQ is on (default), else to terminal history as failed. Returns the attempts that
-- were stale (already closed by rescue, cancel or another finalizer): nothing was written for
-- them.
CREATE FUNCTION awa.finalize_v1(p_items jsonb)
RETURNS TABLE (job_id bigint, run_lease bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_stale jsonb;
BEGIN
    IF EXISTS (
        SELECT 1 FROM jsonb_array_elements(p_items) e
        WHERE e.value ->> 'outcome' IS NULL
           OR e.value ->> 'outcome' NOT IN ('completed', 'retry', 'snooze', 'cancel', 'fail',
                                            'wait')) THEN
        RAISE EXCEPTION 'outcome: expected completed, retry, snooze, cancel, fail or wait'
            USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(p_items) e WHERE e.value ->> 'outcome' = 'wait')
    THEN
        RETURN QUERY SELECT w.job_id, w.run_lease FROM awa._park_v1(
            (SELECT jsonb_agg(e.value) FROM jsonb_array_elements(p_items) e
             WHERE e.value ->> 'outcome' = 'wait')) AS w;
        p_items := (SELECT COALESCE(jsonb_agg(e.value), '[]'::jsonb)
                    FROM jsonb_array_elements(p_items) e WHERE e.value ->> 'outcome' <> 'wait');
    END IF;
    v_stale := awa._finalize_pass_v1(p_items, true);
    IF v_stale IS NOT NULL THEN
        -- A concurrent carry-forward may have moved the claim to another slot; this second
        -- statement runs with a snapshot taken after any closure we conflicted with.
        v_stale := awa._finalize_pass_v1(v_stale, false);
    END IF;
    RETURN QUERY
    SELECT (e.value ->> 'id')::bigint, (e.value ->> 'lease')::bigint
    FROM jsonb_array_elements(COALESCE(v_stale, '[]'::jsonb)) AS e(value);
END
$$;

-- Cancel ----------------------------------------------------------------------------------------

-- Cancel one job wherever it is. Returns the state it was cancelled from ('scheduled',
-- 'retryable', 'available', 'running', 'waiting_external'), or NULL when there was nothing to
-- cancel (unknown, terminal or dead-lettered). A running attempt is closed and its worker told
-- over NOTIFY awa_cancel, so the handler's is_cancelled() turns true.
CREATE FUNCTION awa.cancel_v1(p_job_id bigint, p_reason text DEFAULT 'cancelled')
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
        RETURN 'available';
    END LOOP;
    RETURN NULL;
END
$$;

-- Promotion -------------------------------------------------------------------------------------

-- Move up to p_limit due scheduled/retryable jobs of unpaused queues into the ready ring, oldest
-- first, never twice (rows are locked SKIP LOCKED and deleted in the same transaction). A
-- (queue, priority) whose every enqueue shard is held by open producer transactions is skipped
-- and retried on the next call. Returns the number of jobs promoted.
CREATE FUNCTION awa.promote_v1(p_limit integer DEFAULT 4096)
RETURNS integer
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    g record;
    v_lane integer;
    v_jobs awa.job_body[];
    v_total integer := 0;
BEGIN
    FOR g IN
        WITH due AS (
            SELECT d.job_id, d.queue, d.priority, d.run_at
            FROM awa.deferred_jobs d
            WHERE d.run_at <= now()
              AND NOT EXISTS (
                  SELECT 1 FROM awa.queue_meta m WHERE m.queue = d.queue AND m.paused)
            ORDER BY d.run_at, d.job_id
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        )
        SELECT due.queue, due.priority, array_agg(due.job_id ORDER BY due.run_at, due.job_id) AS ids
        FROM due
        GROUP BY due.queue, due.priority
        ORDER BY due.queue, due.priority
    LOOP
        v_lane := awa._lane_for_v1(g.queue, g.priority, false);
        CONTINUE WHEN v_lane IS NULL;
        WITH moved AS (
            DELETE FROM awa.deferred_jobs d WHERE d.job_id = ANY (g.ids) RETURNING d.*
        )
        SELECT array_agg(ROW(m.job_id, m.kind, m.queue, m.priority, m.args, m.attempt,
                             m.max_attempts, m.run_lease, m.run_at, m.created_at, m.deadline_secs,
                             m.metadata, m.tags, m.errors, m.progress)::awa.job_body
                         ORDER BY m.run_at, m.job_id)
        INTO v_jobs FROM moved m;
        PERFORM awa._append_ready_v1(v_lane, v_jobs);
        v_total := v_total + COALESCE(cardinality(v_jobs), 0);
    END LOOP;
    RETURN v_total;
END
$$;

-- Dead letter queue -----------------------------------------------------------------------------

-- Move dead-lettered jobs back into the queue (optionally another queue or priority) with
-- attempt 0 and their error history kept. run_lease is kept too, so attempt identities stay
-- unique for the job's whole life. Returns the ids retried.
CREATE FUNCTION awa.dlq_retry_v1(p_job_ids bigint[], p_queue text DEFAULT NULL,
                                 p_priority integer DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_jobs awa.job_body[];
BEGIN
    IF p_queue IS NOT NULL AND NOT awa.valid_queue_name(p_queue) THEN
        RAISE EXCEPTION 'queue: % is not a valid queue name ([a-z0-9_.-]{1,63})', quote_nullable(p_queue)
            USING ERRCODE = '22023';
    END IF;
    IF p_priority IS NOT NULL AND p_priority NOT BETWEEN -100 AND 100 THEN
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

-- Delete dead-lettered jobs for good. Returns the ids purged.
CREATE FUNCTION awa.dlq_purge_v1(p_job_ids bigint[])
RETURNS SETOF bigint
LANGUAGE sql AS $$
    DELETE FROM awa.dlq_entries WHERE job_id = ANY (p_job_ids) RETURNING job_id
$$;

-- Runtime instances ---------------------------------------------------------------------------

-- Register or refresh one worker process (a slow timer, not the hot path).
CREATE FUNCTION awa.runtime_upsert_v1(
    p_instance uuid, p_hostname text, p_pid integer, p_queues jsonb, p_concurrency integer,
    p_version text)
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO awa.runtime_instances AS r (
        instance_id, hostname, pid, queues, concurrency, version)
    VALUES (p_instance, p_hostname, p_pid, p_queues, p_concurrency, p_version)
    ON CONFLICT (instance_id) DO UPDATE
    SET last_seen_at = now(), queues = EXCLUDED.queues, concurrency = EXCLUDED.concurrency
$$;

-- Remove a worker process's row (clean exit).
CREATE FUNCTION awa.runtime_remove_v1(p_instance uuid)
RETURNS void
LANGUAGE sql AS $$
    DELETE FROM awa.runtime_instances WHERE instance_id = p_instance
$$;

-- True when none of p_queues has an available or running job (for `awa_worker --burst`).
-- Scheduled and retryable jobs do not count.
CREATE FUNCTION awa.queues_idle_v1(p_queues text[])
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (
        SELECT 1 FROM awa.queue_lanes l
        CROSS JOIN LATERAL (SELECT awa.lane_cursor_v1(l.lane_id) AS c) k
        WHERE l.queue = ANY (p_queues)
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

-- Read surfaces ---------------------------------------------------------------------------------

-- Terminal facts hydrated with their retained bodies.
CREATE VIEW awa.terminal_jobs AS
SELECT d.job_id AS id,
       COALESCE(d.kind, r.kind) AS kind,
       d.queue,
       d.state,
       COALESCE(d.priority, r.priority) AS priority,
       d.attempt,
       COALESCE(d.max_attempts, r.max_attempts) AS max_attempts,
       d.run_lease,
       COALESCE(d.args, r.args) AS args,
       COALESCE(d.run_at, r.run_at) AS run_at,
       COALESCE(d.created_at, r.created_at) AS created_at,
       d.attempted_at,
       d.finalized_at,
       COALESCE(d.errors, r.errors) AS errors,
       d.result,
       d.progress,
       COALESCE(d.metadata, r.metadata) AS metadata,
       COALESCE(d.tags, r.tags) AS tags,
       d.ready_slot,
       d.ready_generation
FROM awa.done_entries d
LEFT JOIN awa.ready_entries r
  ON r.lane_id = d.lane_id AND r.lane_seq = d.lane_seq AND r.ready_slot = d.ready_slot;

-- Jobs that are not finished: available, running, waiting_external, scheduled, retryable.
-- Reads only the live planes (never terminal history).
CREATE VIEW awa.live_jobs AS
SELECT r.job_id AS id, r.kind, r.queue, 'available'::text AS state, r.priority, r.attempt,
       r.max_attempts, r.run_lease, r.args, r.run_at, r.created_at,
       NULL::timestamptz AS attempted_at, NULL::timestamptz AS finalized_at,
       NULL::timestamptz AS deadline_at, NULL::timestamptz AS heartbeat_at,
       r.errors, NULL::jsonb AS result, r.progress, r.metadata, r.tags,
       false AS in_dlq, NULL::text AS dlq_reason
FROM awa.queue_lanes l
CROSS JOIN LATERAL (SELECT awa.lane_cursor_v1(l.lane_id) AS c) k
JOIN awa.ready_entries r ON r.lane_id = l.lane_id AND r.lane_seq > k.c
WHERE NOT EXISTS (
    SELECT 1 FROM awa.ready_tombstones t
    WHERE t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq AND t.ready_slot = r.ready_slot)
UNION ALL
SELECT c.job_id, r.kind, r.queue,
       CASE WHEN EXISTS (
           SELECT 1 FROM awa.leases ls
           WHERE ls.job_id = c.job_id AND ls.run_lease = c.run_lease
             AND ls.state = 'waiting_external') THEN 'waiting_external' ELSE 'running' END,
       r.priority, c.attempt, r.max_attempts, c.run_lease, r.args, r.run_at, r.created_at,
       c.claimed_at, NULL, c.deadline_at, s.heartbeat_at, r.errors, NULL,
       COALESCE(s.progress, r.progress), r.metadata, r.tags, false, NULL
FROM awa.claims c
JOIN awa.ready_entries r
  ON r.lane_id = c.lane_id AND r.lane_seq = c.lane_seq AND r.ready_slot = c.ready_slot
LEFT JOIN awa.attempt_state s ON s.job_id = c.job_id AND s.run_lease = c.run_lease
WHERE NOT EXISTS (
    SELECT 1 FROM awa.claim_closures z
    WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease AND z.claim_slot = c.claim_slot)
UNION ALL
SELECT d.job_id, d.kind, d.queue, d.state, d.priority, d.attempt, d.max_attempts, d.run_lease,
       d.args, d.run_at, d.created_at, d.attempted_at, NULL, NULL, NULL, d.errors, NULL,
       d.progress, d.metadata, d.tags, false, NULL
FROM awa.deferred_jobs d;

-- One row per job across every plane. state is one of scheduled, available, running,
-- waiting_external, retryable, completed, failed, cancelled; dead-lettered jobs show as failed
-- with in_dlq = true.
CREATE VIEW awa.jobs AS
SELECT * FROM awa.live_jobs
UNION ALL
SELECT t.id, t.kind, t.queue, t.state, t.priority, t.attempt, t.max_attempts, t.run_lease,
       t.args, t.run_at, t.created_at, t.attempted_at, t.finalized_at, NULL, NULL, t.errors,
       t.result, t.progress, t.metadata, t.tags, false, NULL
FROM awa.terminal_jobs t
UNION ALL
SELECT q.job_id, q.kind, q.queue, 'failed', q.priority, q.attempt, q.max_attempts, q.run_lease,
       q.args, q.run_at, q.created_at, q.attempted_at, q.dlq_at, NULL, NULL, q.errors, NULL,
       q.progress, q.metadata, q.tags, true, q.dlq_reason
FROM awa.dlq_entries q;

-- Cheap approximate depth per queue for the hot path and metrics: for each lane, the enqueue
-- sequence minus the claim cursor. Over-counts briefly (rollbacks, in-flight producers,
-- cancelled rows); never scans history.
CREATE FUNCTION awa.queue_depth_v1(p_queue text DEFAULT NULL)
RETURNS TABLE (queue text, available bigint)
LANGUAGE sql STABLE AS $$
    SELECT l.queue,
           sum(GREATEST(COALESCE(pg_sequence_last_value(l.enqueue_seq), 0)
                        - awa.lane_cursor_v1(l.lane_id), 0))::bigint
    FROM awa.queue_lanes l
    WHERE p_queue IS NULL OR l.queue = p_queue
    GROUP BY l.queue
    ORDER BY l.queue
$$;

-- Exact counts per queue and state, computed on demand (scans the live planes and retained
-- terminal history): for the admin and operators, not for the hot path.
CREATE FUNCTION awa.queue_counts_v1()
RETURNS TABLE (queue text, available bigint, running bigint, waiting_external bigint,
               scheduled bigint, retryable bigint, completed bigint, failed bigint,
               cancelled bigint, dlq bigint, paused boolean)
LANGUAGE sql STABLE AS $$
    WITH live AS (
        SELECT j.queue, j.state, count(*) AS n
        FROM awa.live_jobs j
        GROUP BY j.queue, j.state
    ), done AS (
        SELECT d.queue, d.state, count(*) AS n FROM awa.done_entries d GROUP BY d.queue, d.state
    ), dead AS (
        SELECT q.queue, 'dlq'::text AS state, count(*) AS n FROM awa.dlq_entries q GROUP BY q.queue
    ), allq AS (
        SELECT * FROM live UNION ALL SELECT * FROM done UNION ALL SELECT * FROM dead
    ), names AS (
        SELECT a.queue FROM allq a UNION SELECT m.queue FROM awa.queue_meta m
    )
    SELECT n.queue,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'available'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'running'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'waiting_external'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'scheduled'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'retryable'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'completed'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'failed'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'cancelled'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'dlq'), 0)::bigint,
           COALESCE((SELECT m.paused FROM awa.queue_meta m WHERE m.queue = n.queue), false)
    FROM names n
    LEFT JOIN allq a ON a.queue = n.queue
    GROUP BY n.queue
    ORDER BY n.queue
$$;

-- Current cursor of every ring.
CREATE VIEW awa.ring_state AS
SELECT g.ring, g.slot_count, c.slot AS current_slot, c.generation, c.rotated_at
FROM awa.rings g
CROSS JOIN LATERAL (
    SELECT r.slot, r.generation, r.rotated_at FROM awa.ring_rotations r
    WHERE r.ring = g.ring ORDER BY r.generation DESC LIMIT 1) c;
