-- awa_django 0003: a cheaper single enqueue (issue 14). awa.enqueue_one_v2 does what
-- awa.enqueue_one_v1 does (v1 stays, unchanged, for raw-SQL producers that call it) in less than
-- half the server time of a one-job transaction (docs/performance.md, "Enqueue"):
--   * the limits are five integer arguments with the documented defaults, checked by integer
--     comparisons, instead of a JSON object parsed and validated on every call;
--   * PL/pgSQL initialises each expression it evaluates once per transaction, which for a
--     one-job transaction is every call: the common request is accepted by one compact test,
--     and only the others pay for the full check with its messages (awa._enqueue_one_error_v2,
--     the rules and messages of awa._job_request_error_v1 plus the limits);
--   * the lane protocol of awa._lane_for_v1 is inline for its common case, and the ring slot,
--     clock, lane position and job id come from the INSERT itself.
-- docs/jobs.md ("Raw SQL producers") documents the function.

-- What is wrong with a request of awa.enqueue_one_v2 (NULL when nothing): its limits, then the
-- rules of awa._job_request_error_v1 in its order and with its messages, then the timing.
CREATE FUNCTION awa._enqueue_one_error_v2(
    p_kind text, p_queue text, p_priority integer, p_args jsonb, p_max_attempts integer,
    p_run_at timestamptz DEFAULT NULL, p_delay double precision DEFAULT NULL,
    p_deadline double precision DEFAULT NULL, p_metadata jsonb DEFAULT NULL,
    p_tags text[] DEFAULT NULL,
    p_args_max_bytes integer DEFAULT 1048576, p_metadata_max_bytes integer DEFAULT 65536,
    p_json_max_depth integer DEFAULT 32, p_max_tags integer DEFAULT 20,
    p_tag_max_length integer DEFAULT 100)
RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_error text;
BEGIN
    v_error := CASE
        WHEN p_args_max_bytes IS NULL OR p_args_max_bytes < 1 THEN
            format('limits: args_max_bytes: %s is not an integer from 1 to 2147483647',
                   COALESCE(p_args_max_bytes::text, 'NULL'))
        WHEN p_metadata_max_bytes IS NULL OR p_metadata_max_bytes < 1 THEN
            format('limits: metadata_max_bytes: %s is not an integer from 1 to 2147483647',
                   COALESCE(p_metadata_max_bytes::text, 'NULL'))
        WHEN p_json_max_depth IS NULL OR p_json_max_depth NOT BETWEEN 1 AND 256 THEN
            format('limits: json_max_depth: %s is not an integer from 1 to 256',
                   COALESCE(p_json_max_depth::text, 'NULL'))
        WHEN p_max_tags IS NULL OR p_max_tags < 0 THEN
            format('limits: max_tags: %s is not an integer from 0 to 2147483647',
                   COALESCE(p_max_tags::text, 'NULL'))
        WHEN p_tag_max_length IS NULL OR p_tag_max_length < 1 THEN
            format('limits: tag_max_length: %s is not an integer from 1 to 2147483647',
                   COALESCE(p_tag_max_length::text, 'NULL'))
        -- The rules of awa._job_request_error_v1, in its order and with its messages.
        WHEN p_kind IS NULL OR p_kind = '' OR length(p_kind) > 255 THEN
            'kind: must be a non-empty string of at most 255 characters'
        WHEN NOT awa.valid_queue_name(p_queue) THEN
            format('queue: %s is not a valid queue name ([a-z0-9_.-]{1,63})', quote_nullable(p_queue))
        WHEN NOT awa.valid_priority(p_priority) THEN
            format('priority: %s is outside -100..100', COALESCE(p_priority::text, 'NULL'))
        WHEN NOT awa.valid_max_attempts(p_max_attempts) THEN
            format('max_attempts: %s is outside 1..1000', COALESCE(p_max_attempts::text, 'NULL'))
        WHEN p_args IS NULL THEN 'args: must be {"args": [...], "kwargs": {...}}'
        WHEN pg_column_size(p_args) > p_args_max_bytes THEN
            format('args: %s bytes exceeds the limit of %s bytes', pg_column_size(p_args),
                   p_args_max_bytes)
    END;
    -- Depth, probed only when the document is large enough to be that deep (n bytes of jsonb
    -- nest at most about n / 4 levels); the jsonpath is built only then.
    IF v_error IS NULL AND pg_column_size(p_args) > 4 * (p_json_max_depth + 2)
       AND jsonb_path_exists(p_args, awa._depth_probe_v1(p_json_max_depth + 2)) THEN
        v_error := format('args: nesting deeper than %s levels', p_json_max_depth);
    END IF;
    v_error := COALESCE(v_error, CASE
        WHEN jsonb_typeof(p_args) <> 'object'
             OR jsonb_typeof(p_args -> 'args') IS DISTINCT FROM 'array'
             OR jsonb_typeof(p_args -> 'kwargs') IS DISTINCT FROM 'object' THEN
            'args: must be {"args": [...], "kwargs": {...}}'
        WHEN p_deadline IS NOT NULL AND NOT (p_deadline > 0 AND p_deadline <= 3155760000) THEN
            'deadline: must be a positive number of seconds, at most 3155760000 (100 years)'
        WHEN p_metadata IS NOT NULL AND jsonb_typeof(p_metadata) <> 'object' THEN
            'metadata: must be a JSON object'
        WHEN pg_column_size(p_metadata) > p_metadata_max_bytes THEN
            format('metadata: %s bytes exceeds the limit of %s bytes', pg_column_size(p_metadata),
                   p_metadata_max_bytes)
    END);
    IF v_error IS NULL AND p_metadata IS NOT NULL
       AND pg_column_size(p_metadata) > 4 * p_json_max_depth
       AND jsonb_path_exists(p_metadata, awa._depth_probe_v1(p_json_max_depth)) THEN
        v_error := format('metadata: nesting deeper than %s levels', p_json_max_depth);
    END IF;
    v_error := COALESCE(v_error, CASE
        WHEN cardinality(p_tags) > p_max_tags THEN
            format('tags: %s tags exceeds the limit of %s', cardinality(p_tags), p_max_tags)
        WHEN awa._bad_tags_v1(p_tags, p_tag_max_length) THEN
            format('tags: every tag must be a non-empty string of at most %s characters',
                   p_tag_max_length)
    END);
    v_error := COALESCE(v_error, awa._timing_error_v1(p_run_at, p_delay));
    RETURN v_error;
END
$$;

-- Enqueue one job in the caller's transaction; returns its id and 'available' or 'scheduled'.
-- Refused requests raise SQLSTATE 22023 ('field: ...') and write nothing.
--
-- Written for the cost of its first call in a transaction, which is the cost of a single
-- enqueue: PL/pgSQL initialises every expression it evaluates once per transaction, so the
-- common request (no tags, no timing, small documents) is accepted by one compact test and
-- only the others pay for the full check with its messages (awa._enqueue_one_error_v2); the
-- ring slot, the clock, the lane position and the job id come from the INSERT itself.
CREATE FUNCTION awa.enqueue_one_v2(
    p_kind text, p_queue text, p_priority integer, p_args jsonb, p_max_attempts integer,
    p_run_at timestamptz DEFAULT NULL, p_delay double precision DEFAULT NULL,
    p_deadline double precision DEFAULT NULL, p_metadata jsonb DEFAULT NULL,
    p_tags text[] DEFAULT NULL,
    p_args_max_bytes integer DEFAULT 1048576, p_metadata_max_bytes integer DEFAULT 65536,
    p_json_max_depth integer DEFAULT 32, p_max_tags integer DEFAULT 20,
    p_tag_max_length integer DEFAULT 100,
    OUT job_id bigint, OUT state text)
LANGUAGE plpgsql AS $$
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
        FROM awa.queue_lanes l WHERE l.queue = p_queue AND l.priority = p_priority;
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
