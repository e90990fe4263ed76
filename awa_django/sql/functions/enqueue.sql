-- The keys a job object of awa.enqueue_v1 may have.
CREATE OR REPLACE FUNCTION awa._job_keys_v1()
 RETURNS text[]
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
    SELECT '{kind,queue,priority,args,max_attempts,run_at,delay,deadline,metadata,tags}'::text[]
$$;

-- The first key of a job object that awa.enqueue_v1 does not know (NULL when none).
CREATE OR REPLACE FUNCTION awa._unknown_key_v1(p_job jsonb)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
    SELECT left(k, 100) FROM jsonb_object_keys(p_job - awa._job_keys_v1()) AS k LIMIT 1
$$;

-- The limits in p_limits (keys args_max_bytes, metadata_max_bytes, json_max_depth, max_tags,
-- tag_max_length; all optional), with the documented defaults.
CREATE OR REPLACE FUNCTION awa._limit_v1(p_limits jsonb, p_key text)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
    SELECT COALESCE((p_limits ->> p_key)::integer, CASE p_key
        WHEN 'args_max_bytes' THEN 1048576 WHEN 'metadata_max_bytes' THEN 65536
        WHEN 'json_max_depth' THEN 32 WHEN 'max_tags' THEN 20 WHEN 'tag_max_length' THEN 100 END)
$$;

-- What is wrong with the limits of awa.enqueue_v1 / enqueue_one_v1 (NULL when nothing): a JSON
-- object of _limit_v1's keys, each a JSON integer in its range (json_max_depth 1..256, max_tags
-- from 0, the others from 1; at most 2147483647).
CREATE OR REPLACE FUNCTION awa._limits_error_v1(p_limits jsonb)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
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

-- What is wrong with an integer field of a job object (NULL when nothing): not given (SQL NULL),
-- or a JSON number written without a fraction (5 or 5e0, not 5.0, "5" or true) within
-- p_low..p_high. Compared as numeric, so 2^63 is out of range, never a cast error.
CREATE OR REPLACE FUNCTION awa._json_integer_error_v1(
    p_value jsonb, p_field text, p_low integer, p_high integer)
 RETURNS text
 LANGUAGE sql
 STABLE PARALLEL SAFE
AS $$
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

-- The timing error of a request (NULL when fine): run_at must be a finite time, delay a number
-- of seconds within +/- 100 years.
CREATE OR REPLACE FUNCTION awa._timing_error_v1(
    p_run_at timestamp with time zone, p_delay double precision)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $$
    SELECT CASE
        WHEN p_run_at IS NOT NULL AND NOT isfinite(p_run_at) THEN
            'run_at: must be a finite point in time'
        WHEN p_run_at >= '10000-01-01 00:00:00+00'::timestamptz THEN
            'run_at: must be before the year 10000 (UTC)'
        WHEN p_delay IS NOT NULL AND NOT (p_delay >= -3155760000 AND p_delay <= 3155760000) THEN
            'delay: must be a number of seconds within 100 years (3155760000)'
    END
$$;

-- True when a tag is NULL, empty or longer than p_max_length (STRICT: NULL tags are fine).
CREATE OR REPLACE FUNCTION awa._bad_tags_v1(p_tags text[], p_max_length integer)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE STRICT
AS $$
    SELECT array_ndims(p_tags) > 1
        OR EXISTS (SELECT 1 FROM unnest(p_tags) t WHERE t IS NULL OR t = '' OR length(t) > p_max_length)
$$;

-- What is wrong with the JSON types of one job object of awa.enqueue_v1 (NULL when nothing),
-- checked before any value is converted: only the known keys; kind, queue and run_at strings;
-- priority and max_attempts integers within their bounds; delay and deadline numbers within
-- 100 years; metadata an object; tags an array of strings. The fields come as jsonb from
-- jsonb_to_record (so each is looked up once), SQL NULL when absent or JSON null ("not given":
-- the default). args is checked after conversion by _job_request_error_v1. Never raises.
CREATE OR REPLACE FUNCTION awa._job_fields_error_v1(
    p_job jsonb, p_kind jsonb, p_queue jsonb, p_priority jsonb, p_max_attempts jsonb,
    p_run_at jsonb, p_delay jsonb, p_deadline jsonb, p_metadata jsonb, p_tags jsonb)
 RETURNS text
 LANGUAGE sql
 STABLE PARALLEL SAFE
AS $$
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
CREATE OR REPLACE FUNCTION awa._job_shape_error_v1(p_job jsonb)
 RETURNS text
 LANGUAGE sql
 STABLE PARALLEL SAFE
AS $$
    SELECT awa._job_fields_error_v1(p_job, s.kind, s.queue, s.priority, s.max_attempts,
                                    s.run_at, s.delay, s.deadline, s.metadata, s.tags)
    FROM jsonb_to_record(p_job) AS s(kind jsonb, queue jsonb, priority jsonb,
        max_attempts jsonb, run_at jsonb, delay jsonb, deadline jsonb, metadata jsonb, tags jsonb)
$$;

-- What is wrong with one job request (NULL when nothing), the rules Python checks first
-- (docs/jobs.md, "What is refused"). Arguments are {"args": [...], "kwargs": {...}} (other keys,
-- such as the django.tasks backend's "task", are allowed): the shape the worker decodes.
CREATE OR REPLACE FUNCTION awa._job_request_error_v1(
    p_kind text, p_queue text, p_priority integer, p_args jsonb, p_max_attempts integer,
    p_deadline double precision, p_metadata jsonb, p_tags text[], p_args_max integer,
    p_meta_max integer, p_depth integer, p_max_tags integer, p_tag_len integer)
 RETURNS text
 LANGUAGE sql
 STABLE
AS $$
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

-- The field of one job object whose value cannot be converted to its column type, and why
-- (NULL when every field converts). The error path of awa.enqueue_v1 only: one subtransaction
-- per field.
CREATE OR REPLACE FUNCTION awa._job_conversion_error_v1(p_job jsonb)
 RETURNS text
 LANGUAGE plpgsql
 IMMUTABLE
AS $$
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

-- Validate the job objects of an awa.enqueue_v1 call (numbered from p_first): the first error,
-- in job order ('job N: field: ...'), and how many jobs are deferred. Each job's shape comes first
-- (_job_fields_error_v1: a value of the wrong JSON type is named as such, not judged by a rule
-- after conversion), then its timing (so that a bad delay never reaches make_interval), then the
-- request rules. A value that cannot be converted (a run_at that is
-- not a timestamp, a number beyond double precision, or one of the wrong JSON type) raises a
-- data exception: awa.enqueue_v1 catches it and _enqueue_conversion_error_v1 names it.
CREATE OR REPLACE FUNCTION awa._enqueue_check_v1(
    p_jobs jsonb, p_now timestamp with time zone, p_first integer, p_args_max integer,
    p_meta_max integer, p_depth integer, p_max_tags integer, p_tag_len integer,
    OUT first_error text, OUT deferred_count bigint)
 RETURNS record
 LANGUAGE plpgsql
 STABLE
AS $$
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

-- The error path of awa.enqueue_v1 when its validation raised a data exception: the first error
-- of the batch, in job order, as 'job N: field: ...'. A bisection: the jobs before v_good are
-- fine and the first job that raises is below v_bad; the first half of that window is validated
-- alone (a window raises when one of its jobs does). If it does not raise but has an error, that
-- error is the first of the batch. The job that raises is named by its shape or conversion
-- error. About log2(jobs) validations, one subtransaction each, of windows that halve.
CREATE OR REPLACE FUNCTION awa._enqueue_conversion_error_v1(
    p_jobs jsonb, p_now timestamp with time zone, p_args_max integer, p_meta_max integer,
    p_depth integer, p_max_tags integer, p_tag_len integer)
 RETURNS text
 LANGUAGE plpgsql
 STABLE
AS $$
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

-- Enqueue one job from raw SQL, with the checks, messages and results of awa.enqueue_v1 for one
-- job and its size limits as a JSON object (p_limits, as enqueue_v1 takes them). Returns the
-- job's id and state ('available' or 'scheduled'). awa.enqueue_one_v2 takes the limits as
-- integers, in about half the server time.
CREATE OR REPLACE FUNCTION awa.enqueue_one_v1(
    p_kind text, p_queue text, p_priority integer, p_args jsonb, p_max_attempts integer,
    p_run_at timestamp with time zone DEFAULT NULL::timestamp with time zone,
    p_delay double precision DEFAULT NULL::double precision,
    p_deadline double precision DEFAULT NULL::double precision,
    p_metadata jsonb DEFAULT NULL::jsonb, p_tags text[] DEFAULT NULL::text[],
    p_limits jsonb DEFAULT '{}'::jsonb, OUT job_id bigint, OUT state text)
 RETURNS record
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
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

-- Enqueue one job (awa.enqueue_one_v2, and awa.enqueue_one_v3 with unique keys): the checks
-- and results of awa.enqueue_v1 for one job, at less than half the server time of a one-job
-- transaction:
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
CREATE OR REPLACE FUNCTION awa._enqueue_one_error_v2(
    p_kind text, p_queue text, p_priority integer, p_args jsonb, p_max_attempts integer,
    p_run_at timestamp with time zone DEFAULT NULL::timestamp with time zone,
    p_delay double precision DEFAULT NULL::double precision,
    p_deadline double precision DEFAULT NULL::double precision,
    p_metadata jsonb DEFAULT NULL::jsonb, p_tags text[] DEFAULT NULL::text[],
    p_args_max_bytes integer DEFAULT 1048576, p_metadata_max_bytes integer DEFAULT 65536,
    p_json_max_depth integer DEFAULT 32, p_max_tags integer DEFAULT 20,
    p_tag_max_length integer DEFAULT 100)
 RETURNS text
 LANGUAGE plpgsql
 STABLE
AS $$
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

-- Create the queue's metadata row and the lanes (one per enqueue shard) of (queue, priority).
-- Idempotent and safe to run concurrently. Returns the number of lanes.
CREATE OR REPLACE FUNCTION awa.ensure_lanes_v1(
    p_queue text, p_priority integer, p_shards integer DEFAULT NULL::integer)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
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
    -- Without p_shards (a lane made by the engine: a promotion, a periodic fire, a retry), the
    -- session's awa.enqueue_shards (worker and leader connections set AWA["ENQUEUE_SHARDS"]
    -- there), else 4.
    INSERT INTO awa.queue_meta (queue, enqueue_shards)
    VALUES (p_queue, COALESCE(
        p_shards,
        CASE WHEN current_setting('awa.enqueue_shards', true) ~ '^[0-9]{1,2}$'
             THEN LEAST(GREATEST(current_setting('awa.enqueue_shards', true)::integer, 1), 64)
        END,
        4))
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

-- The lane a producer appends to (the inline lane choice of awa.enqueue_one_v2/v3 is the same):
-- never a hand-off lane (shard 64). The entry points run as their owner.
CREATE OR REPLACE FUNCTION awa._lane_for_v1(p_queue text, p_priority integer, p_wait boolean)
 RETURNS integer
 LANGUAGE plpgsql
AS $$
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

-- Append job bodies, in array order, to a lane the caller holds (see _lane_for_v1), in the
-- current queue-ring slot, and wake the lane's queue. Every path that makes work runnable
-- (enqueue, promotion, DLQ retry) goes through here.
CREATE OR REPLACE FUNCTION awa._append_ready_v1(p_lane integer, p_jobs awa.job_body[])
 RETURNS void
 LANGUAGE plpgsql
AS $$
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
CREATE OR REPLACE FUNCTION awa._append_ready_grouped_v1(p_jobs awa.job_body[], p_wait boolean)
 RETURNS integer
 LANGUAGE plpgsql
AS $$
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

CREATE OR REPLACE FUNCTION awa.reserve_v1(
    p_queues text[], p_priorities integer[], p_counts integer[], p_total integer,
    OUT lane_ids integer[], OUT first_seqs bigint[], OUT ready_slot integer,
    OUT ready_generation bigint, OUT job_ids bigint[], OUT db_now timestamp with time zone)
 RETURNS record
 LANGUAGE plpgsql
AS $$
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

CREATE OR REPLACE FUNCTION awa.enqueue_one_v2(
    p_kind text, p_queue text, p_priority integer, p_args jsonb, p_max_attempts integer,
    p_run_at timestamp with time zone DEFAULT NULL::timestamp with time zone,
    p_delay double precision DEFAULT NULL::double precision,
    p_deadline double precision DEFAULT NULL::double precision,
    p_metadata jsonb DEFAULT NULL::jsonb, p_tags text[] DEFAULT NULL::text[],
    p_args_max_bytes integer DEFAULT 1048576, p_metadata_max_bytes integer DEFAULT 65536,
    p_json_max_depth integer DEFAULT 32, p_max_tags integer DEFAULT 20,
    p_tag_max_length integer DEFAULT 100, OUT job_id bigint, OUT state text)
 RETURNS record
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
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
    p_run_at timestamp with time zone DEFAULT NULL::timestamp with time zone,
    p_delay double precision DEFAULT NULL::double precision,
    p_deadline double precision DEFAULT NULL::double precision,
    p_metadata jsonb DEFAULT NULL::jsonb, p_tags text[] DEFAULT NULL::text[],
    p_args_max_bytes integer DEFAULT 1048576, p_metadata_max_bytes integer DEFAULT 65536,
    p_json_max_depth integer DEFAULT 32, p_max_tags integer DEFAULT 20,
    p_tag_max_length integer DEFAULT 100, p_unique boolean DEFAULT false,
    p_unique_key text DEFAULT NULL::text,
    p_unique_for double precision DEFAULT NULL::double precision,
    p_unique_states text[] DEFAULT NULL::text[], p_isolation_state boolean DEFAULT false,
    OUT job_id bigint, OUT state text, OUT queue text, OUT priority integer,
    OUT duplicate boolean)
 RETURNS record
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
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

-- Enqueue a batch of job objects (docs/jobs.md, "Raw SQL producers"): each {"kind": ...} with
-- optional queue ('default'), priority (0), args ({"args": [], "kwargs": {}}), max_attempts
-- (25), run_at or delay, deadline, metadata, tags. Refused batches write nothing: SQLSTATE
-- 22023, 'job N: field: ...' naming the first bad job (from 0) and field.
CREATE OR REPLACE FUNCTION awa.enqueue_v1(p_jobs jsonb, p_limits jsonb DEFAULT '{}'::jsonb)
 RETURNS TABLE(job_id bigint, state text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET plan_cache_mode TO 'force_generic_plan'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
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
