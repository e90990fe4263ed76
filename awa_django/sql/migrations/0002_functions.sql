-- awa_django SQL functions and views v1: the engine over the tables of 0001_schema.sql. Every
-- function and view is defined once, in its current form; docs/storage.md and
-- docs/maintenance.md describe the behaviour. A later change ships as a new migration file (a
-- new _vN function when a contract changes).
--
-- Advisory-lock key spaces, one class per kind of object (two-int form):
--   4282177  lanes of producers, key lane_id
--   4282178  ring maintenance (rotate, prune), key 1 queue, 2 claim, 3 lease
--   4282179  the callback of one job, key awa._job_key_v1(job_id)
--   4282180  migrations (awa_django/sql/queries/migrations.sql)
-- The leader election uses the single-bigint key space (queries/storage.sql: leader_try).
--
-- Read surfaces (live_jobs, terminal_jobs, jobs, queue_stats, queue_counts_v1, queue_stats_v1,
-- throughput_v1) cost what the live planes hold plus bounded index ranges of history, never a
-- scan of retained history, whatever the statistics say (docs/storage.md, "Read surfaces").

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

-- Seconds before the next attempt of a job that failed its attempt number p_attempt: p_base ×
-- 2^attempt plus up to 25 % jitter, at most a day (RETRY_BACKOFF_BASE is p_base; NULL means 1).
-- Every SQL retry path (finalize without an explicit delay, callback resolutions, rescue) uses it;
-- the worker computes the same in Python (awa_django.worker.executor.backoff).
CREATE FUNCTION awa._backoff_v1(p_attempt integer, p_base double precision DEFAULT 1.0)
RETURNS double precision
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT LEAST(COALESCE(p_base, 1.0) * power(2, LEAST(GREATEST(p_attempt, 0), 40))
                 * (1 + random() * 0.25), 86400)::double precision
$$;

-- A stored deadline (seconds) as an interval that now() can always take: at most
-- _max_seconds_v1(), at least 1 ms (rows written by raw SQL before the bounds existed).
CREATE FUNCTION awa._deadline_secs_v1(p_secs double precision) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_secs IS NULL THEN NULL
                ELSE GREATEST(LEAST(p_secs, awa._max_seconds_v1()), 0.001) END
$$;

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
    IF NOT awa.valid_priority(p_priority) THEN
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
    SELECT array_ndims(p_tags) > 1
        OR EXISTS (SELECT 1 FROM unnest(p_tags) t WHERE t IS NULL OR t = '' OR length(t) > p_max_length)
$$;

-- What is wrong with one job request (NULL when nothing), the rules Python checks first
-- (docs/jobs.md, "What is refused"). Arguments are {"args": [...], "kwargs": {...}} (other keys,
-- such as the django.tasks backend's "task", are allowed): the shape the worker decodes.
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
        WHEN NOT awa.valid_priority(p_priority) THEN
            format('priority: %s is outside -100..100', COALESCE(p_priority::text, 'NULL'))
        WHEN NOT awa.valid_max_attempts(p_max_attempts) THEN
            format('max_attempts: %s is outside 1..1000', COALESCE(p_max_attempts::text, 'NULL'))
        WHEN p_args IS NULL THEN 'args: must be {"args": [...], "kwargs": {...}}'
        WHEN pg_column_size(p_args) > p_args_max THEN
            format('args: %s bytes exceeds the limit of %s bytes', pg_column_size(p_args), p_args_max)
        WHEN pg_column_size(p_args) > 4 * (p_depth + 2)
             AND jsonb_path_exists(p_args, awa._depth_probe_v1(p_depth + 2)) THEN
            format('args: nesting deeper than %s levels', p_depth)
        WHEN jsonb_typeof(p_args) <> 'object'
             OR jsonb_typeof(p_args -> 'args') IS DISTINCT FROM 'array'
             OR jsonb_typeof(p_args -> 'kwargs') IS DISTINCT FROM 'object' THEN
            'args: must be {"args": [...], "kwargs": {...}}'
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

-- The keys a job object of awa.enqueue_v1 may have.
CREATE FUNCTION awa._job_keys_v1() RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT '{kind,queue,priority,args,max_attempts,run_at,delay,deadline,metadata,tags}'::text[]
$$;

-- A JSON value for an error message: its text, cut to 40 characters.
CREATE FUNCTION awa._json_show_v1(p_value jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN length(p_value::text) <= 40 THEN p_value::text
                ELSE left(p_value::text, 37) || '...' END
$$;

-- What is wrong with an integer field of a job object (NULL when nothing): not given (SQL NULL),
-- or a JSON number written without a fraction (5 or 5e0, not 5.0, "5" or true) within
-- p_low..p_high. Compared as numeric, so 2^63 is out of range, never a cast error.
CREATE FUNCTION awa._json_integer_error_v1(p_value jsonb, p_field text, p_low integer,
                                           p_high integer)
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN p_value IS NULL THEN NULL
        WHEN jsonb_typeof(p_value) <> 'number' THEN  -- the cast below needs a number
            format('%s: must be an integer, not %s', p_field, awa._json_show_v1(p_value))
        WHEN scale(p_value::numeric) > 0 THEN
            format('%s: must be an integer, not %s', p_field, awa._json_show_v1(p_value))
        WHEN p_value::numeric < p_low OR p_value::numeric > p_high THEN
            format('%s: %s is outside %s..%s', p_field, awa._json_show_v1(p_value), p_low, p_high)
    END
$$;

-- The first key of a job object that awa.enqueue_v1 does not know (NULL when none).
CREATE FUNCTION awa._unknown_key_v1(p_job jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT left(k, 100) FROM jsonb_object_keys(p_job - awa._job_keys_v1()) AS k LIMIT 1
$$;

-- What is wrong with the JSON types of one job object of awa.enqueue_v1 (NULL when nothing),
-- checked before any value is converted: only the known keys; kind, queue and run_at strings;
-- priority and max_attempts integers within their bounds; delay and deadline numbers within
-- 100 years; metadata an object; tags an array of strings. The fields come as jsonb from
-- jsonb_to_record (so each is looked up once), SQL NULL when absent or JSON null ("not given":
-- the default). args is checked after conversion by _job_request_error_v1. Never raises.
CREATE FUNCTION awa._job_fields_error_v1(
    p_job jsonb, p_kind jsonb, p_queue jsonb, p_priority jsonb, p_max_attempts jsonb,
    p_run_at jsonb, p_delay jsonb, p_deadline jsonb, p_metadata jsonb, p_tags jsonb)
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN p_job - awa._job_keys_v1() <> '{}'::jsonb THEN
            format('%s: unknown key (the keys are %s)', awa._unknown_key_v1(p_job),
                   array_to_string(awa._job_keys_v1(), ', '))
        WHEN jsonb_typeof(p_kind) <> 'string' THEN
            format('kind: must be a string, not %s', awa._json_show_v1(p_kind))
        WHEN jsonb_typeof(p_queue) <> 'string' THEN
            format('queue: must be a string, not %s', awa._json_show_v1(p_queue))
        WHEN jsonb_typeof(p_run_at) <> 'string' THEN
            format('run_at: must be a string (a timestamp), not %s', awa._json_show_v1(p_run_at))
        WHEN jsonb_typeof(p_delay) <> 'number' THEN
            format('delay: must be a number of seconds, not %s', awa._json_show_v1(p_delay))
        WHEN abs(p_delay::numeric) > 3155760000 THEN
            'delay: must be a number of seconds within 100 years (3155760000)'
        WHEN jsonb_typeof(p_deadline) <> 'number' THEN
            format('deadline: must be a number of seconds, not %s', awa._json_show_v1(p_deadline))
        WHEN NOT (p_deadline::numeric > 0 AND p_deadline::numeric <= 3155760000) THEN
            'deadline: must be a positive number of seconds, at most 3155760000 (100 years)'
        WHEN jsonb_typeof(p_metadata) <> 'object' THEN
            format('metadata: must be a JSON object, not %s', awa._json_show_v1(p_metadata))
        WHEN jsonb_typeof(p_tags) <> 'array' THEN
            format('tags: must be an array of strings, not %s', awa._json_show_v1(p_tags))
        WHEN jsonb_path_exists(p_tags, 'strict $[*] ? (@.type() != "string")') THEN
            'tags: must be an array of strings'
        ELSE COALESCE(awa._json_integer_error_v1(p_priority, 'priority', -100, 100),
                      awa._json_integer_error_v1(p_max_attempts, 'max_attempts', 1, 1000))
    END
$$;

-- _job_fields_error_v1 of one job object (the error path of awa.enqueue_v1).
CREATE FUNCTION awa._job_shape_error_v1(p_job jsonb) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT awa._job_fields_error_v1(p_job, s.kind, s.queue, s.priority, s.max_attempts,
                                    s.run_at, s.delay, s.deadline, s.metadata, s.tags)
    FROM jsonb_to_record(p_job) AS s(kind jsonb, queue jsonb, priority jsonb,
        max_attempts jsonb, run_at jsonb, delay jsonb, deadline jsonb, metadata jsonb, tags jsonb)
$$;

-- The limits in p_limits (keys args_max_bytes, metadata_max_bytes, json_max_depth, max_tags,
-- tag_max_length; all optional), with the documented defaults.
CREATE FUNCTION awa._limit_v1(p_limits jsonb, p_key text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT COALESCE((p_limits ->> p_key)::integer, CASE p_key
        WHEN 'args_max_bytes' THEN 1048576 WHEN 'metadata_max_bytes' THEN 65536
        WHEN 'json_max_depth' THEN 32 WHEN 'max_tags' THEN 20 WHEN 'tag_max_length' THEN 100 END)
$$;

-- What is wrong with the limits of awa.enqueue_v1 / enqueue_one_v1 (NULL when nothing): a JSON
-- object of _limit_v1's keys, each a JSON integer in its range (json_max_depth 1..256, max_tags
-- from 0, the others from 1; at most 2147483647).
CREATE FUNCTION awa._limits_error_v1(p_limits jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN p_limits IS NULL THEN NULL
        WHEN jsonb_typeof(p_limits) <> 'object' THEN 'limits: must be a JSON object'
        ELSE (
            SELECT CASE
                WHEN b.low IS NULL THEN format(
                    'limits: unknown key %s (known: args_max_bytes, metadata_max_bytes, '
                    'json_max_depth, max_tags, tag_max_length)', quote_literal(e.key))
                ELSE format('limits: %s: %s is not an integer from %s to %s',
                            e.key, awa._json_show_v1(e.value), b.low, b.high)
            END
            FROM jsonb_each(p_limits) e
            LEFT JOIN (VALUES ('args_max_bytes', 1, 2147483647), ('metadata_max_bytes', 1, 2147483647),
                              ('json_max_depth', 1, 256), ('max_tags', 0, 2147483647),
                              ('tag_max_length', 1, 2147483647)) AS b(key, low, high)
                   ON b.key = e.key
            WHERE b.low IS NULL
               OR NOT CASE WHEN jsonb_typeof(e.value) = 'number' AND e.value::text ~ '^[0-9]{1,10}$'
                           THEN e.value::text::numeric BETWEEN b.low AND b.high
                           ELSE false END
            ORDER BY e.key
            LIMIT 1)
    END
$$;

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
    v_error := awa._limits_error_v1(p_limits);
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION '%', v_error USING ERRCODE = '22023';
    END IF;
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

-- Validate the job objects of an awa.enqueue_v1 call (numbered from p_first): the first error,
-- in job order ('job N: field: ...'), and how many jobs are deferred. Each job's shape comes first
-- (_job_fields_error_v1: a value of the wrong JSON type is named as such, not judged by a rule
-- after conversion), then its timing (so that a bad delay never reaches make_interval), then the
-- request rules. A value that cannot be converted (a run_at that is
-- not a timestamp, a number beyond double precision, or one of the wrong JSON type) raises a
-- data exception: awa.enqueue_v1 catches it and _enqueue_conversion_error_v1 names it.
CREATE FUNCTION awa._enqueue_check_v1(
    p_jobs jsonb, p_now timestamptz, p_first integer, p_args_max integer, p_meta_max integer,
    p_depth integer, p_max_tags integer, p_tag_len integer, OUT first_error text, OUT deferred_count bigint)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    SELECT (array_agg(format('job %s: %s', x.ord - 1 + p_first, x.err) ORDER BY x.ord)
                FILTER (WHERE x.err IS NOT NULL))[1],
           count(*) FILTER (WHERE x.err IS NULL AND x.deferred)
    INTO first_error, deferred_count
    FROM (
        SELECT t.ord, COALESCE(t.shape, t.timing, awa._job_request_error_v1(
                   t.kind, COALESCE(t.queue, 'default'), COALESCE(t.priority, 0),
                   COALESCE(t.args, '{"args": [], "kwargs": {}}'), COALESCE(t.max_attempts, 25),
                   t.deadline, t.metadata, t.tags, p_args_max, p_meta_max, p_depth, p_max_tags,
                   p_tag_len)) AS err,
               CASE WHEN t.timing IS NULL THEN
                   COALESCE(t.run_at, p_now + make_interval(secs => COALESCE(t.delay, 0))) > p_now
               END AS deferred
        FROM (
            SELECT e.ord, r.*,
                   awa._job_fields_error_v1(e.value, s.kind, s.queue, s.priority,
                       s.max_attempts, s.run_at, s.delay, s.deadline, s.metadata, s.tags) AS shape,
                   awa._timing_error_v1(r.run_at, r.delay) AS timing
            FROM jsonb_array_elements(p_jobs) WITH ORDINALITY AS e(value, ord),
                 -- The fields as given (args left out: it is not copied), then converted.
                 jsonb_to_record(e.value) AS s(kind jsonb, queue jsonb, priority jsonb,
                     max_attempts jsonb, run_at jsonb, delay jsonb, deadline jsonb,
                     metadata jsonb, tags jsonb),
                 jsonb_to_record(e.value) AS r(kind text, queue text, priority integer, args jsonb,
                     max_attempts integer, run_at timestamptz, delay double precision,
                     deadline double precision, metadata jsonb, tags text[])
        ) t
        OFFSET 0  -- each job's error is computed once, not once per aggregate that reads it
    ) x;
END
$$;

-- An error message with every quoted value over 40 characters cut (PostgreSQL quotes the whole
-- input of a failed conversion, which can be a 400-digit number).
CREATE FUNCTION awa._short_message_v1(p_message text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT left(regexp_replace(p_message, '"([^"]{37})[^"]{4,}"', '"\1..."', 'g'), 500)
$$;

-- The field of one job object whose value cannot be converted to its column type, and why
-- (NULL when every field converts). The error path of awa.enqueue_v1 only: one subtransaction
-- per field.
CREATE FUNCTION awa._job_conversion_error_v1(p_job jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_field text;
BEGIN
    FOREACH v_field IN ARRAY awa._job_keys_v1() LOOP
        BEGIN
            PERFORM FROM jsonb_to_record(jsonb_build_object(v_field, p_job -> v_field))
                AS r(kind text, queue text, priority integer, args jsonb, max_attempts integer,
                     run_at timestamptz, delay double precision, deadline double precision,
                     metadata jsonb, tags text[]);
        EXCEPTION WHEN data_exception THEN
            RETURN format('%s: %s', v_field, awa._short_message_v1(SQLERRM));
        END;
    END LOOP;
    RETURN NULL;
END
$$;

-- The error path of awa.enqueue_v1 when its validation raised a data exception: the first error
-- of the batch, in job order, as 'job N: field: ...'. A bisection: the jobs before v_good are
-- fine and the first job that raises is below v_bad; the first half of that window is validated
-- alone (a window raises when one of its jobs does). If it does not raise but has an error, that
-- error is the first of the batch. The job that raises is named by its shape or conversion
-- error. About log2(jobs) validations, one subtransaction each, of windows that halve.
CREATE FUNCTION awa._enqueue_conversion_error_v1(
    p_jobs jsonb, p_now timestamptz, p_args_max integer, p_meta_max integer, p_depth integer,
    p_max_tags integer, p_tag_len integer)
RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_good integer := 0;
    v_bad integer := jsonb_array_length(p_jobs);
    v_mid integer;
    v_error text;
    v_job jsonb;
BEGIN
    WHILE v_bad - v_good > 1 LOOP
        v_mid := (v_good + v_bad) / 2;
        BEGIN
            SELECT c.first_error INTO v_error
            FROM awa._enqueue_check_v1(
                jsonb_path_query_array(p_jobs,
                                       format('strict $[%s to %s]', v_good, v_mid - 1)::jsonpath),
                p_now, v_good, p_args_max, p_meta_max, p_depth, p_max_tags, p_tag_len) c;
            IF v_error IS NOT NULL THEN
                RETURN v_error;
            END IF;
            v_good := v_mid;
        EXCEPTION WHEN data_exception THEN
            v_bad := v_mid;
        END;
    END LOOP;
    v_job := p_jobs -> v_good;  -- the first job that raises; every job before it is fine
    v_error := COALESCE(awa._job_shape_error_v1(v_job), awa._job_conversion_error_v1(v_job));
    IF v_error IS NULL THEN
        BEGIN
            PERFORM awa._enqueue_check_v1(jsonb_build_array(v_job), p_now, v_good, p_args_max,
                                          p_meta_max, p_depth, p_max_tags, p_tag_len);
        EXCEPTION WHEN data_exception THEN
            v_error := awa._short_message_v1(SQLERRM);
        END;
    END IF;
    RETURN format('job %s: %s', v_good, v_error);
END
$$;

-- Enqueue a batch of job objects (docs/jobs.md, "Raw SQL producers"): each {"kind": ...} with
-- optional queue ('default'), priority (0), args ({"args": [], "kwargs": {}}), max_attempts
-- (25), run_at or delay, deadline, metadata, tags. Refused batches write nothing: SQLSTATE
-- 22023, 'job N: field: ...' naming the first bad job (from 0) and field.
CREATE FUNCTION awa.enqueue_v1(p_jobs jsonb, p_limits jsonb DEFAULT '{}')
RETURNS TABLE (job_id bigint, state text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_args_max integer;
    v_meta_max integer;
    v_depth integer;
    v_max_tags integer;
    v_tag_len integer;
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
    v_error := awa._limits_error_v1(p_limits);
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION '%', v_error USING ERRCODE = '22023';
    END IF;
    v_args_max := awa._limit_v1(p_limits, 'args_max_bytes');
    v_meta_max := awa._limit_v1(p_limits, 'metadata_max_bytes');
    v_depth := awa._limit_v1(p_limits, 'json_max_depth');
    v_max_tags := awa._limit_v1(p_limits, 'max_tags');
    v_tag_len := awa._limit_v1(p_limits, 'tag_max_length');
    v_n := jsonb_array_length(p_jobs);
    IF v_n = 0 THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(p_jobs) e WHERE jsonb_typeof(e.value) <> 'object')
    THEN
        RAISE EXCEPTION 'jobs: every element must be a JSON object' USING ERRCODE = '22023';
    END IF;
    -- One pass validates every job and counts the deferred ones. Its block is one read-only
    -- subtransaction per call (no transaction id, no per-job cost); only a value that cannot be
    -- converted takes the handler, which finds and names it.
    BEGIN
        SELECT c.first_error, c.deferred_count INTO v_error, v_deferred
        FROM awa._enqueue_check_v1(p_jobs, v_now, 0, v_args_max, v_meta_max, v_depth,
                                   v_max_tags, v_tag_len) c;
    EXCEPTION WHEN data_exception THEN
        v_error := awa._enqueue_conversion_error_v1(p_jobs, v_now, v_args_max, v_meta_max,
                                                     v_depth, v_max_tags, v_tag_len);
        IF v_error IS NULL THEN
            RAISE;
        END IF;
    END;
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION '%', v_error USING ERRCODE = '22023';
    END IF;

    v_ids := ARRAY(SELECT nextval('awa.job_id_seq') FROM generate_series(1, v_n));

    IF v_deferred > 0 THEN
        INSERT INTO awa.deferred_jobs (
            job_id, state, queue, priority, kind, args, attempt, max_attempts, run_lease, run_at,
            created_at, deadline_secs, metadata, tags)
        SELECT v_ids[e.ord], 'scheduled', COALESCE(r.queue, 'default'), COALESCE(r.priority, 0),
               r.kind, COALESCE(r.args, '{"args": [], "kwargs": {}}'), 0,
               COALESCE(r.max_attempts, 25), 0,
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
               COALESCE(r.args, '{"args": [], "kwargs": {}}'), v_now, v_now, r.deadline,
               r.metadata, r.tags
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
    lane_ids := '{}';
    first_seqs := '{}';
    FOR i IN 1..COALESCE(cardinality(p_queues), 0) LOOP
        IF NOT awa.valid_queue_name(p_queues[i]) OR NOT awa.valid_priority(p_priorities[i])
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

-- Claim -----------------------------------------------------------------------------------------

-- Claim up to p_max available jobs of one queue for worker p_worker, as one short transaction.
-- Lanes are taken in order of effective priority (priority + 1 per p_aging_secs that the lane's
-- head has waited), then oldest head; each lane is locked FOR UPDATE SKIP LOCKED so concurrent
-- claimers take different lanes. Within a lane, rows come in FIFO order. Each claimed attempt is
-- appended to the claim ring and returned with attempt + 1 and run_lease + 1; deadline_at is the
-- attempt's hard deadline on the database clock and timeout_secs the same as a duration.
-- Also returned: the job's metadata, tags and the errors of its previous attempts (for the
-- handler's context; mostly NULL, so nearly free). The claim receipt names the job's kind, which
-- finalize copies into the terminal row. A stored deadline is bounded (awa._deadline_secs_v1), so
-- a row written by raw SQL cannot make the claim fail for the whole queue.
--
-- Ring partitions are analyzed while small (a fresh or just-truncated claim slot, a quiet ready
-- slot) and then grow by thousands of rows per second before autovacuum analyzes them again.
-- With those statistics the planner scans them sequentially, and every claim costs O(rows
-- claimed so far) (measured by benchmarks/run: 8 ms -> 37 ms per claim of 128 jobs over a
-- backlog of 20,000). The claim's lookups are all selective index probes: never plan a seq scan.
CREATE FUNCTION awa.claim_v1(
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
                 closed_as text, backoff_base double precision)
    ), cl AS MATERIALIZED (
        -- A lateral lookup (not a join) keeps the row estimate at the item count, so the
        -- planner hash-joins the CTEs below instead of nesting loops over them.
        SELECT i.id, i.lease, i.outcome, i.result, i.error, i.delay, i.backoff_base, i.progress,
               COALESCE(i.st, false) AS st, COALESCE(i.closed_as, i.outcome) AS closed_as,
               c.claim_slot, c.ready_slot, c.ready_generation,
               c.lane_id, c.lane_seq, c.attempt, c.claimed_at, c.kind AS claim_kind
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
            attempted_at, result, queue, kind)
        SELECT w.ready_slot, w.ready_generation, w.id, w.lease, w.lane_id, w.lane_seq, 'completed',
               w.attempt, w.claimed_at, w.result, l.queue,
               -- A claim without a kind (written by raw SQL): read it from the ready row.
               COALESCE(w.claim_kind, (SELECT r.kind FROM awa.ready_entries r
                                 WHERE r.lane_id = w.lane_id AND r.lane_seq = w.lane_seq
                                   AND r.ready_slot = w.ready_slot))
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
            attempted_at, errors, progress, queue, kind)
        SELECT o.ready_slot, o.ready_generation, o.id, o.lease, o.lane_id, o.lane_seq, o.dest,
               o.attempt, o.claimed_at, o.new_errors, o.new_progress, o.queue, o.kind
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
                        THEN awa._backoff_v1(o.attempt, o.backoff_base)
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

-- Resolve a callback: complete the attempt with p_result, or fail it (p_error, retried like any
-- failure unless p_terminal), through the normal fenced finalization. A parked attempt is
-- finalized at once; an attempt that registered the id but has not parked yet keeps the
-- resolution, which its park then applies. Returns 'resolved', 'stale' (already resolved,
-- rescued after its timeout, cancelled, or finished otherwise) or 'unknown'.
CREATE FUNCTION awa.callback_resolve_v1(
    p_callback_id uuid, p_result jsonb DEFAULT NULL, p_error jsonb DEFAULT NULL,
    p_terminal boolean DEFAULT false, p_backoff_base double precision DEFAULT 1.0)
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
            'result', p_result, 'error', p_error, 'backoff_base', p_backoff_base)), false);
        RETURN CASE WHEN v_stale IS NULL THEN 'resolved' ELSE 'stale' END;
    END IF;
    -- Registered but not parked yet: keep the first resolution for the park.
    UPDATE awa.attempt_state s
    SET callback_result = jsonb_build_object('result', p_result, 'error', p_error,
                                             'terminal', COALESCE(p_terminal, false),
                                             'backoff_base', p_backoff_base),
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
--
-- Also: every item is validated first (SQLSTATE 22023 naming the item,
-- nothing written), READ COMMITTED is required, and parking is idempotent and applies a
-- callback resolution that arrived before the park.
CREATE FUNCTION awa.finalize_v1(p_items jsonb)
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

-- Cancel ----------------------------------------------------------------------------------------

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

-- Promotion -------------------------------------------------------------------------------------

-- Move up to p_limit due scheduled/retryable jobs of unpaused queues into the ready ring, oldest
-- first, never twice (rows are locked SKIP LOCKED and deleted in the same transaction). A
-- (queue, priority) whose every enqueue shard is held by open producer transactions is skipped
-- and retried on the next call. Returns the number of jobs promoted.
--
-- A a (queue, priority) whose every lane is held by open producer
-- transactions no longer stalls the others: its rows are skipped and the next due rows of other
-- groups are promoted in the same call, up to p_limit in all.
CREATE FUNCTION awa.promote_v1(p_limit integer DEFAULT 4096)
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
    IF p_priority IS NOT NULL AND NOT awa.valid_priority(p_priority) THEN
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
--
-- Paused queues do not count: their available jobs cannot be
-- claimed, so a burst worker would otherwise wait for them forever.
CREATE FUNCTION awa.queues_idle_v1(p_queues text[])
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

-- Rescue -----------------------------------------------------------------------------------------

-- Close up to p_limit open attempts whose heartbeat (or, for attempts that never heartbeated,
-- claim time) is older than p_staleness seconds, or whose hard deadline has passed, and route
-- each through the normal retry / fail / DLQ path (backoff p_backoff_base × 2^attempt plus up
-- to 25 % jitter) with the error "heartbeat stale: worker
-- presumed dead" or "hard deadline exceeded". Attempts waiting for a callback are rescued only
-- once their callback timeout passes ("callback timed out"). The old worker is told over NOTIFY
-- awa_cancel; its late finalization then loses. Returns the attempts rescued.
--
-- READ COMMITTED is required (it closes attempts with fresh snapshots).
CREATE FUNCTION awa.rescue_v1(p_staleness double precision, p_limit integer DEFAULT 500,
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
               'delay', awa._backoff_v1(x.attempt, p_backoff_base),
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
            lane_id, lane_seq, attempt, claimed_at, deadline_at, worker_id, kind)
        SELECT v_cur, v_gen, o.job_id, o.run_lease, o.ready_slot, o.ready_generation, o.lane_id,
               o.lane_seq, o.attempt, o.claimed_at, o.deadline_at, o.worker_id, o.kind
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

-- Per ring and slot: the rows its children hold and the last prune outcome. rows is exact for
-- children of up to 1,000 pages (8 MB); a bigger child is estimated from its size and the row
-- density PostgreSQL last measured (pg_class), as the planner does, or, when it has none, from a
-- sample of about 100 of its pages. This never counts history row by row.
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
    v_pages double precision;
    v_relpages double precision;
    v_reltuples double precision;
BEGIN
    FOR g IN SELECT s.ring, s.slot_count, s.current_slot FROM awa.ring_state s ORDER BY s.ring LOOP
        FOR v_slot IN 0..(g.slot_count - 1) LOOP
            v_rows := 0;
            FOREACH v_table IN ARRAY awa._ring_children_v1(g.ring, v_slot) LOOP
                SELECT pg_relation_size(c.oid) / current_setting('block_size')::double precision,
                       c.relpages, c.reltuples
                INTO v_pages, v_relpages, v_reltuples
                FROM pg_class c
                WHERE c.oid = format('awa.%I', v_table)::regclass;
                IF v_pages <= 1000 THEN
                    EXECUTE format('SELECT count(*) FROM awa.%I', v_table) INTO v_n;
                ELSIF v_relpages > 0 AND v_reltuples > 0 THEN
                    v_n := round(v_reltuples / v_relpages * v_pages);
                ELSE
                    EXECUTE format('SELECT round(count(*) * %s) FROM awa.%I '
                                   'TABLESAMPLE SYSTEM (%s) REPEATABLE (0)',
                                   v_pages / 100, v_table, 10000 / v_pages) INTO v_n;
                END IF;
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

-- awa_django operator functions v1: queue pause/resume/drain and statistics, for the admin and
-- the management commands (awa_queue, awa_status, awa_dlq, awa_job).

-- Pause or resume claiming from a queue (producers may still enqueue; promotion skips it).
CREATE FUNCTION awa.queue_pause_v1(p_queue text, p_paused boolean)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT awa.valid_queue_name(p_queue) THEN
        RAISE EXCEPTION 'queue: % is not a valid queue name ([a-z0-9_.-]{1,63})', quote_nullable(p_queue)
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO awa.queue_meta AS m (queue, paused) VALUES (p_queue, p_paused)
    ON CONFLICT (queue) DO UPDATE SET paused = EXCLUDED.paused, updated_at = now();
    RETURN p_paused;
END
$$;

-- Completions per minute of the last hour for one queue (NULL: all), oldest first, 60 buckets:
-- one index range of the last hour (every outcome of the last hour when p_queue is NULL; the
-- queue's completions only otherwise), whatever the statistics say.
CREATE FUNCTION awa.throughput_v1(p_queue text DEFAULT NULL)
RETURNS TABLE (minute timestamptz, completed bigint)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_start timestamptz := date_trunc('minute', now()) - interval '59 minutes';
BEGIN
    IF p_queue IS NULL THEN
        RETURN QUERY
        SELECT g.minute, COALESCE(c.n, 0)::bigint
        FROM generate_series(v_start, v_start + interval '59 minutes', interval '1 minute')
             AS g (minute)
        LEFT JOIN (
            SELECT date_trunc('minute', d.finalized_at) AS minute,
                   count(*) FILTER (WHERE d.state = 'completed') AS n
            FROM awa.done_entries d
            WHERE d.finalized_at >= v_start
            GROUP BY 1) c ON c.minute = g.minute
        ORDER BY g.minute;
    ELSE
        RETURN QUERY
        SELECT g.minute, COALESCE(c.n, 0)::bigint
        FROM generate_series(v_start, v_start + interval '59 minutes', interval '1 minute')
             AS g (minute)
        LEFT JOIN (
            SELECT date_trunc('minute', d.finalized_at) AS minute, count(*) AS n
            FROM awa.done_entries d
            WHERE d.queue = p_queue AND d.state = 'completed' AND d.finalized_at >= v_start
            GROUP BY 1) c ON c.minute = g.minute
        ORDER BY g.minute;
    END IF;
END
$$;

-- The timing error of a request (NULL when fine): run_at must be a finite time, delay a number
-- of seconds within +/- 100 years.
CREATE FUNCTION awa._timing_error_v1(p_run_at timestamptz, p_delay double precision)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_run_at IS NOT NULL AND NOT isfinite(p_run_at) THEN
            'run_at: must be a finite point in time'
        WHEN p_run_at >= '10000-01-01 00:00:00+00'::timestamptz THEN
            'run_at: must be before the year 10000 (UTC)'
        WHEN p_delay IS NOT NULL AND NOT (p_delay >= -3155760000 AND p_delay <= 3155760000) THEN
            'delay: must be a number of seconds within 100 years (3155760000)'
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
               'backoff_base', p.result -> 'backoff_base', 'progress', p.progress))
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

-- Drain -------------------------------------------------------------------------------------------

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
-- the database clock ('skipped_recent' before; 0: whatever its age), so that a new leader, or
-- awa_maintenance --once from cron, keeps the cadence instead of rotating every ring at once.
-- Rotates only when the incoming slot is empty (else 'skipped_busy': it still waits for prune)
-- and the current slot holds something (else 'skipped_idle': an idle ring stops rotating). The
-- append to the rotation ledger is a compare-and-swap on its primary key. Returns 'rotated',
-- 'skipped_busy', 'skipped_idle', 'skipped_recent' or 'skipped_locked' (another rotate or prune
-- of this ring is running).
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

-- Counts ------------------------------------------------------------------------------------------

-- Terminal history per queue and outcome: exact up to p_cap rows per (queue, state) (an index
-- range of done_entries_queue_state_idx that stops at p_cap + 1 rows); beyond that, an estimate
-- scaled from a sample of about p_sample_pages pages of history (TABLESAMPLE SYSTEM ...
-- REPEATABLE: the same pages while history does not change), never below p_cap + 1. exact says
-- which. Costs at most queues x 3 x (p_cap + 1) index entries plus the sample, whatever history
-- holds. Queues come from history itself (a skip scan of the same index: one probe per queue).
CREATE FUNCTION awa._history_counts_v1(p_cap integer DEFAULT 10000,
                                       p_sample_pages integer DEFAULT 1000)
RETURNS TABLE (queue text, state text, n bigint, exact boolean)
LANGUAGE plpgsql STABLE
-- Index ranges that stop at p_cap + 1 rows: a bitmap scan would read each range to its end.
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_pages double precision;
    v_pct double precision;
BEGIN
    SELECT sum(pg_relation_size(i.inhrelid)) / current_setting('block_size')::double precision
    INTO v_pages
    FROM pg_inherits i WHERE i.inhparent = 'awa.done_entries'::regclass;
    v_pct := LEAST(100, 100.0 * GREATEST(p_sample_pages, 1) / GREATEST(v_pages, 1));
    RETURN QUERY
    WITH RECURSIVE names AS (
        (SELECT d.queue FROM awa.done_entries d ORDER BY d.queue LIMIT 1)
        UNION ALL
        SELECT (SELECT d.queue FROM awa.done_entries d WHERE d.queue > q.queue
                ORDER BY d.queue LIMIT 1)
        FROM names q WHERE q.queue IS NOT NULL
    ), capped AS MATERIALIZED (
        SELECT q.queue, s.state, x.n
        FROM names q
        CROSS JOIN (VALUES ('completed'), ('failed'), ('cancelled')) AS s (state)
        CROSS JOIN LATERAL (
            SELECT count(*) AS n
            FROM (SELECT 1 FROM awa.done_entries d
                  WHERE d.queue = q.queue AND d.state = s.state
                  LIMIT p_cap + 1) y) x
        WHERE q.queue IS NOT NULL
    ), sampled AS (
        SELECT d.queue, d.state, count(*) AS n
        FROM awa.done_entries d TABLESAMPLE SYSTEM (v_pct) REPEATABLE (0)
        WHERE EXISTS (SELECT 1 FROM capped c WHERE c.n > p_cap)
        GROUP BY d.queue, d.state
    )
    SELECT c.queue, c.state,
           CASE WHEN c.n <= p_cap THEN c.n
                ELSE GREATEST(p_cap + 1, round(COALESCE(m.n, 0) * 100.0 / v_pct))::bigint END,
           c.n <= p_cap
    FROM capped c
    LEFT JOIN sampled m ON m.queue = c.queue AND m.state = c.state
    WHERE c.n > 0;
END
$$;

-- Jobs of one queue completed since p_since (the last hour, for queue_stats_v1): an index range
-- of done_entries_queue_state_idx, newest first.
CREATE FUNCTION awa._completed_since_v1(p_queue text, p_since timestamptz)
RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT count(*) FROM awa.done_entries d
    WHERE d.queue = p_queue AND d.state = 'completed' AND d.finalized_at > p_since
$$;

-- Every queue that queue_counts_v1() reports (one with metadata, history, deferred jobs or dead
-- letters), from the control table and a skip scan of each plane's queue index (one probe per
-- queue), without computing any statistic.
CREATE FUNCTION awa._queue_names_v1()
RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE done_q AS (
        (SELECT d.queue FROM awa.done_entries d ORDER BY d.queue LIMIT 1)
        UNION ALL
        SELECT (SELECT d.queue FROM awa.done_entries d WHERE d.queue > q.queue
                ORDER BY d.queue LIMIT 1)
        FROM done_q q WHERE q.queue IS NOT NULL
    ), deferred_q AS (
        (SELECT d.queue FROM awa.deferred_jobs d ORDER BY d.queue LIMIT 1)
        UNION ALL
        SELECT (SELECT d.queue FROM awa.deferred_jobs d WHERE d.queue > q.queue
                ORDER BY d.queue LIMIT 1)
        FROM deferred_q q WHERE q.queue IS NOT NULL
    ), dlq_q AS (
        (SELECT d.queue FROM awa.dlq_entries d ORDER BY d.queue LIMIT 1)
        UNION ALL
        SELECT (SELECT d.queue FROM awa.dlq_entries d WHERE d.queue > q.queue
                ORDER BY d.queue LIMIT 1)
        FROM dlq_q q WHERE q.queue IS NOT NULL
    )
    SELECT m.queue FROM awa.queue_meta m
    UNION SELECT q.queue FROM done_q q WHERE q.queue IS NOT NULL
    UNION SELECT q.queue FROM deferred_q q WHERE q.queue IS NOT NULL
    UNION SELECT q.queue FROM dlq_q q WHERE q.queue IS NOT NULL
$$;

-- Read surfaces ---------------------------------------------------------------------------------

-- Terminal facts hydrated with their retained bodies.
--
-- Terminal facts hydrated with their retained bodies, with the body read by one
-- primary-key probe of the done row's ready row (in its own partition), whatever the
-- statistics say: with statistics of empty partitions the planner estimated a lookup by id at
-- 0.5 % of history and hashed every retained ready row to hydrate it. Newest first, by outcome,
-- by queue, by kind and by finished time are index ranges of done_entries (the indexes above).
CREATE VIEW awa.terminal_jobs AS
SELECT d.job_id AS id,
       d.kind,
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
LEFT JOIN LATERAL (
    SELECT e.kind, e.priority, e.max_attempts, e.args, e.run_at, e.created_at, e.errors,
           e.metadata, e.tags, random() AS plan_fence
    FROM awa.ready_entries e
    WHERE e.lane_id = d.lane_id AND e.lane_seq = d.lane_seq AND e.ready_slot = d.ready_slot
) r ON true;

-- Jobs not finished yet, from the live planes only. Four things keep every plan bounded by the
-- live planes, whatever the statistics say (a volatile output column, plan_fence, keeps a
-- subquery from being flattened into the join while filters are still pushed into it):
--   * available: each lane's cursor and its highest position are read once per lane (init plans
--     of the per-lane subquery), and the lane's rows are read by that range of its primary key
--     (a range with both ends known is estimated small, so the planner reads it by index even
--     when statistics are missing). Flattened, this join could hash every retained ready row;
--     fenced, a lookup by id is still a probe of ready_entries_job_idx per lane;
--   * the body of a claimed job is one primary-key probe of its ready row per open claim,
--     after the claims are reduced to the open ones: with statistics of empty partitions the
--     planner otherwise hashed every retained ready row to find the bodies of a few thousand;
--   * running and waiting_external are two branches with constant states, so a state filter
--     removes a branch instead of being estimated at 0.5 % of the claim ring (which made the
--     planner nest a scan of a whole table inside a scan of every claim: of the closures in
--     the issue, of attempt_state in the benchmark); waiting_external
--     starts from the (few) waiting leases;
--   * queue is the lane's, so a queue filter starts from its lanes.
CREATE VIEW awa.live_jobs AS
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
FROM awa.deferred_jobs d;

-- Counts per queue and state. Live planes (available, running, waiting_external, scheduled,
-- retryable, dlq) are exact; terminal history (completed, failed, cancelled) is exact up to
-- 10,000 per queue and outcome and estimated beyond (awa._history_counts_v1). Costs what the
-- live planes hold plus a bounded part of history.
CREATE FUNCTION awa.queue_counts_v1()
RETURNS TABLE (queue text, available bigint, running bigint, waiting_external bigint,
               scheduled bigint, retryable bigint, completed bigint, failed bigint,
               cancelled bigint, dlq bigint, paused boolean)
LANGUAGE sql STABLE
-- The open claims are an anti-join of the claim ring with its closures (about 80 s of claims):
-- hashed in memory rather than in batches on disk.
SET work_mem = '32MB'
AS $$
    WITH live AS (
        SELECT j.queue, j.state, count(*) AS n
        FROM awa.live_jobs j
        GROUP BY j.queue, j.state
    ), done AS (
        SELECT h.queue, h.state, h.n FROM awa._history_counts_v1() h
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

-- Per queue: the counts of queue_counts_v1, the age of the oldest available job (lag, seconds)
-- and the jobs completed in the last hour.
CREATE FUNCTION awa.queue_stats_v1()
RETURNS TABLE (queue text, available bigint, running bigint, waiting_external bigint,
               scheduled bigint, retryable bigint, completed bigint, failed bigint,
               cancelled bigint, dlq bigint, paused boolean, lag_seconds double precision,
               completed_last_hour bigint)
LANGUAGE sql STABLE
SET work_mem = '32MB'
AS $$
    SELECT c.*,
           (SELECT extract(epoch FROM now() - min(j.run_at)) FROM awa.live_jobs j
            WHERE j.queue = c.queue AND j.state = 'available'),
           awa._completed_since_v1(c.queue, now() - interval '1 hour')
    FROM awa.queue_counts_v1() c
$$;

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

-- Current cursor of every ring.
CREATE VIEW awa.ring_state AS
SELECT g.ring, g.slot_count, c.slot AS current_slot, c.generation, c.rotated_at
FROM awa.rings g
CROSS JOIN LATERAL (
    SELECT r.slot, r.generation, r.rotated_at FROM awa.ring_rotations r
    WHERE r.ring = g.ring ORDER BY r.generation DESC LIMIT 1) c;

-- The admin's queue list. Same rows as queue_stats_v1(), but a query that reads only the queue
-- names (the admin's capped count of the list) computes no statistic: the statistics are
-- computed once per query, when a column needs them.
CREATE VIEW awa.queue_stats AS
WITH s AS MATERIALIZED (SELECT * FROM awa.queue_stats_v1())
SELECT n.queue,
       COALESCE((SELECT s.available FROM s WHERE s.queue = n.queue), 0) AS available,
       COALESCE((SELECT s.running FROM s WHERE s.queue = n.queue), 0) AS running,
       COALESCE((SELECT s.waiting_external FROM s WHERE s.queue = n.queue), 0)
           AS waiting_external,
       COALESCE((SELECT s.scheduled FROM s WHERE s.queue = n.queue), 0) AS scheduled,
       COALESCE((SELECT s.retryable FROM s WHERE s.queue = n.queue), 0) AS retryable,
       COALESCE((SELECT s.completed FROM s WHERE s.queue = n.queue), 0) AS completed,
       COALESCE((SELECT s.failed FROM s WHERE s.queue = n.queue), 0) AS failed,
       COALESCE((SELECT s.cancelled FROM s WHERE s.queue = n.queue), 0) AS cancelled,
       COALESCE((SELECT s.dlq FROM s WHERE s.queue = n.queue), 0) AS dlq,
       COALESCE((SELECT s.paused FROM s WHERE s.queue = n.queue), false) AS paused,
       (SELECT s.lag_seconds FROM s WHERE s.queue = n.queue) AS lag_seconds,
       COALESCE((SELECT s.completed_last_hour FROM s WHERE s.queue = n.queue), 0)
           AS completed_last_hour
FROM awa._queue_names_v1() AS n (queue);
