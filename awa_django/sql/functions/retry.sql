-- Retry policies. A job may carry its own retry policy in its metadata, under the reserved key
-- "awa:retry" (docs/jobs.md, "Retry policies"):
--   {"backoff": "exponential" | "linear" | "constant",   default "exponential"
--    "base": seconds, 0..86400,                           default RETRY_BACKOFF_BASE
--    "cap": seconds, 0..86400,                            default 86400
--    "jitter": fraction, 0..1,                            default 0.25
--    "max_age": seconds, above 0, at most 100 years,      default none
--    "retry_on": [exception class names],                 default none: every exception retries
--    "fail_on": [exception class names]}                  default none
-- The metadata travels with the job through every plane (ready, deferred, DLQ), so every retry
-- path follows it: the worker's (a handler error), the callback's (an error resolution, parked
-- or early) and rescue's (a dead worker, a deadline, a callback timeout). All of them reach
-- awa._finalize_pass_v1, which computes every retry's wait with awa._backoff_v2 from the job's
-- stored policy. A job without a policy waits base × 2^attempt plus up to 25 % jitter, at most
-- a day.
--
-- retry_on and fail_on are evaluated by the worker (awa_django/retry.py), against the names of
-- the exception's classes (module.qualname, its whole MRO): nothing is imported from them.
--
-- Producers' writes (run_lease 0: enqueue, a scheduled job's promotion) are checked by a CHECK
-- constraint on ready_entries and deferred_jobs (tables.sql), which raises SQLSTATE 22023 with
-- the policy's problem ("metadata: awa:retry: base: ..."), so raw-SQL producers and COPY are
-- held to the rules Python applies.

-- Bounds -----------------------------------------------------------------------------------------

-- The longest backoff base and cap: a day, in seconds (the cap every backoff always had).
CREATE OR REPLACE FUNCTION awa._max_backoff_v1()
 RETURNS double precision
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$ SELECT 86400::double precision $$;

-- The most exception class names in one of retry_on / fail_on, and the longest name.
CREATE OR REPLACE FUNCTION awa._max_retry_names_v1()
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$ SELECT 32 $$;

-- One number of a stored policy as double precision, held to p_low..p_high; NULL when the
-- policy does not give it as a number. Never raises, whatever the row holds (a row written by
-- raw SQL, a retry's row, which the CHECK constraints do not see): a retry path must not fail
-- on a policy.
CREATE OR REPLACE FUNCTION awa._retry_number_v1(
    p_policy jsonb, p_key text, p_low double precision, p_high double precision)
 RETURNS double precision
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
    -- Rounded to 1e-12 first: a number below double precision's range (1e-400, written by raw
    -- SQL) or of thousands of digits becomes one that converts, so this never raises.
    SELECT CASE WHEN jsonb_typeof(p_policy -> p_key) = 'number'
                THEN LEAST(GREATEST(round((p_policy -> p_key)::numeric, 12), p_low::numeric),
                           p_high::numeric)::double precision
           END
$$;

-- Whether a policy's value is absent (or JSON null) or a number from p_low (above it when
-- p_above) to p_high, compared as numeric: a JSON number may be far beyond double precision.
CREATE OR REPLACE FUNCTION awa._retry_number_ok_v1(
    p_value jsonb, p_low numeric, p_high numeric, p_above boolean DEFAULT false)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE COALESCE(jsonb_typeof(p_value), 'null')
        WHEN 'null' THEN true
        WHEN 'number' THEN p_value::numeric BETWEEN p_low AND p_high
                           AND NOT (p_above AND p_value::numeric = p_low)
        ELSE false
    END
$$;

-- Whether a policy's list of exception class names is absent (or JSON null) or an array of at
-- most 32 strings of 1 to 255 characters.
CREATE OR REPLACE FUNCTION awa._retry_names_ok_v1(p_value jsonb)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE COALESCE(jsonb_typeof(p_value), 'null')
        WHEN 'null' THEN true
        WHEN 'array' THEN jsonb_array_length(p_value) <= awa._max_retry_names_v1()
            AND NOT EXISTS (
                SELECT 1 FROM jsonb_array_elements(p_value) e
                WHERE jsonb_typeof(e.value) <> 'string'
                   OR length(e.value #>> '{}') NOT BETWEEN 1 AND 255)
        ELSE false
    END
$$;

-- What is wrong with a retry policy (NULL when nothing, or when there is none): the rules of
-- awa_django.retry.RetryPolicy, with its messages. JSON null is the same as leaving a key out.
CREATE OR REPLACE FUNCTION awa._retry_policy_error_v1(p_policy jsonb)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN p_policy IS NULL OR jsonb_typeof(p_policy) = 'null' THEN NULL
        WHEN jsonb_typeof(p_policy) <> 'object' THEN 'must be a JSON object'
        ELSE COALESCE(
            (SELECT format('unknown key %s (known: backoff, base, cap, jitter, max_age, '
                           'retry_on, fail_on)', to_jsonb(k))
             FROM jsonb_object_keys(p_policy) k
             WHERE k NOT IN ('backoff', 'base', 'cap', 'jitter', 'max_age', 'retry_on', 'fail_on')
             ORDER BY k LIMIT 1),
            CASE
                WHEN COALESCE(p_policy ->> 'backoff', 'exponential')
                         NOT IN ('exponential', 'linear', 'constant')
                     OR jsonb_typeof(p_policy -> 'backoff') NOT IN ('string', 'null') THEN
                    format('backoff: %s is not "exponential", "linear" or "constant"',
                           awa._json_show_v1(p_policy -> 'backoff'))
                WHEN NOT awa._retry_number_ok_v1(p_policy -> 'base', 0, 86400) THEN
                    format('base: %s is not a number of seconds from 0 to 86400 (24 hours)',
                           awa._json_show_v1(p_policy -> 'base'))
                WHEN NOT awa._retry_number_ok_v1(p_policy -> 'cap', 0, 86400) THEN
                    format('cap: %s is not a number of seconds from 0 to 86400 (24 hours)',
                           awa._json_show_v1(p_policy -> 'cap'))
                WHEN NOT awa._retry_number_ok_v1(p_policy -> 'jitter', 0, 1) THEN
                    format('jitter: %s is not a number from 0 to 1',
                           awa._json_show_v1(p_policy -> 'jitter'))
                WHEN NOT awa._retry_number_ok_v1(p_policy -> 'max_age', 0,
                                                 awa._max_seconds_v1()::numeric, true) THEN
                    format('max_age: %s is not a number of seconds above 0, at most 3155760000 '
                           '(100 years)', awa._json_show_v1(p_policy -> 'max_age'))
                WHEN NOT awa._retry_names_ok_v1(p_policy -> 'retry_on') THEN
                    'retry_on: must be a list of at most 32 exception class names (strings of '
                    '1 to 255 characters)'
                WHEN NOT awa._retry_names_ok_v1(p_policy -> 'fail_on') THEN
                    'fail_on: must be a list of at most 32 exception class names (strings of '
                    '1 to 255 characters)'
            END)
    END
$$;

-- Backoff ----------------------------------------------------------------------------------------

-- Seconds before the next attempt of a job that failed its attempt number p_attempt, by the
-- job's retry policy p_policy (metadata "awa:retry"; NULL: none): base × 2^attempt
-- (exponential), base × attempt (linear) or base (constant), plus up to jitter × that, at most
-- cap. Without a policy, or for what the policy leaves out: base p_base (RETRY_BACKOFF_BASE;
-- NULL means 1), jitter 0.25, cap a day. The only backoff function: every retry path (a
-- handler's error, a callback's error, rescue) reaches it through awa._finalize_pass_v1.
-- Never raises, whatever the policy holds.
CREATE OR REPLACE FUNCTION awa._backoff_v2(
    p_attempt integer, p_base double precision, p_policy jsonb)
 RETURNS double precision
 LANGUAGE sql
 PARALLEL SAFE
AS $$
    SELECT LEAST(
        COALESCE(awa._retry_number_v1(p_policy, 'base', 0, awa._max_backoff_v1()), p_base, 1.0)
        * CASE p_policy ->> 'backoff'
              WHEN 'constant' THEN 1
              WHEN 'linear' THEN GREATEST(p_attempt, 0)
              ELSE power(2, LEAST(GREATEST(p_attempt, 0), 40))
          END
        * (1 + random() * COALESCE(awa._retry_number_v1(p_policy, 'jitter', 0, 1), 0.25)),
        COALESCE(awa._retry_number_v1(p_policy, 'cap', 0, awa._max_backoff_v1()),
                 awa._max_backoff_v1()))::double precision
$$;
