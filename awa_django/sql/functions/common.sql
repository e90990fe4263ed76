-- Helpers every part of the engine uses. Each function of the engine is defined once, in its
-- current form, in the file of its concern (functions/*.sql); docs/storage.md and
-- docs/maintenance.md describe the behaviour, and tables.sql lists the advisory-lock classes.
--
-- Read surfaces (live_jobs, terminal_jobs, jobs, queue_stats, queue_counts_v1, queue_stats_v1,
-- throughput_v1) cost what the live planes hold plus bounded index ranges of history, never a
-- scan of retained history, whatever the statistics say (docs/storage.md, "Read surfaces").

-- Bounds ------------------------------------------------------------------------------------------

-- The longest delay, deadline or timeout awa_django accepts: 100 years, in seconds. Anything
-- larger could not be added to now() as a timestamptz.
CREATE OR REPLACE FUNCTION awa._max_seconds_v1()
 RETURNS double precision
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$ SELECT 3155760000::double precision $$;

-- Raise SQLSTATE 25000 unless the transaction runs at READ COMMITTED (READ UNCOMMITTED, which
-- PostgreSQL runs as READ COMMITTED, is fine too): the engine's functions rely on each statement
-- seeing what committed before it (after a lock is taken).
CREATE OR REPLACE FUNCTION awa._require_read_committed_v1(p_what text)
 RETURNS void
 LANGUAGE plpgsql
AS $$
BEGIN
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION '% needs READ COMMITTED isolation (this transaction is %)',
            p_what, current_setting('transaction_isolation') USING ERRCODE = '25000';
    END IF;
END
$$;

-- The key of one job in the callback lock class (collisions only serialise two jobs needlessly).
CREATE OR REPLACE FUNCTION awa._job_key_v1(p_job_id bigint)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$ SELECT (p_job_id & 2147483647)::integer $$;

-- An error message with every quoted value over 40 characters cut (PostgreSQL quotes the whole
-- input of a failed conversion, which can be a 400-digit number).
CREATE OR REPLACE FUNCTION awa._short_message_v1(p_message text)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
    SELECT left(regexp_replace(p_message, '"([^"]{37})[^"]{4,}"', '"\1..."', 'g'), 500)
$$;

-- A JSON value for an error message: its text, cut to 40 characters.
CREATE OR REPLACE FUNCTION awa._json_show_v1(p_value jsonb)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN length(p_value::text) <= 40 THEN p_value::text
                ELSE left(p_value::text, 37) || '...' END
$$;

-- The depth probe for _job_request_error_v1: matches any value nested deeper than p_depth
-- levels below the level the probe is applied to.
CREATE OR REPLACE FUNCTION awa._depth_probe_v1(p_depth integer)
 RETURNS jsonpath
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
    SELECT format('strict $.**{%s}', p_depth + 1)::jsonpath
$$;

-- A stored deadline (seconds) as an interval that now() can always take: at most
-- _max_seconds_v1(), at least 1 ms (rows written by raw SQL before the bounds existed).
CREATE OR REPLACE FUNCTION awa._deadline_secs_v1(p_secs double precision)
 RETURNS double precision
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_secs IS NULL THEN NULL
                ELSE GREATEST(LEAST(p_secs, awa._max_seconds_v1()), 0.001) END
$$;

-- The weight a job counts for: metadata "awa:weight" when it is an integer 1 .. 10000, else 1;
-- never above p_cap (when given).
CREATE OR REPLACE FUNCTION awa._job_weight_v1(p_metadata jsonb, p_cap integer)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
    SELECT LEAST(
        CASE WHEN jsonb_typeof(p_metadata -> 'awa:weight') = 'number'
                  AND (p_metadata ->> 'awa:weight') ~ '^[0-9]{1,5}$'
                  AND (p_metadata ->> 'awa:weight')::integer BETWEEN 1 AND 10000
             THEN (p_metadata ->> 'awa:weight')::integer ELSE 1 END,
        GREATEST(COALESCE(p_cap, 10000), 1))
$$;

-- History's counts (awa.done_counts) -----------------------------------------------------------

-- Every (queue, state, ready slot) that holds counts, with its latest fold (NULLs: none yet): a
-- skip scan of done_counts_key_idx and one backward probe a key. The counts' reader
-- (awa._history_counts_v2) and the leader's folds (awa.done_counts_fold_v1) start from it.
CREATE OR REPLACE FUNCTION awa._done_count_folds_v1()
 RETURNS TABLE(queue text, state text, ready_slot integer, fold_n bigint, folded_before xid8)
 LANGUAGE sql
 STABLE
AS $$
    WITH RECURSIVE keys AS (
        -- Every (queue, state, slot) holding counts: a skip scan of done_counts_key_idx.
        (SELECT c.queue, c.state, c.ready_slot FROM awa.done_counts c
         ORDER BY c.queue, c.state, c.ready_slot LIMIT 1)
        UNION ALL
        SELECT x.queue, x.state, x.ready_slot
        FROM keys k
        CROSS JOIN LATERAL (
            SELECT c.queue, c.state, c.ready_slot FROM awa.done_counts c
            WHERE (c.queue, c.state, c.ready_slot) > (k.queue, k.state, k.ready_slot)
            ORDER BY c.queue, c.state, c.ready_slot LIMIT 1) x
    ), latest AS (
        SELECT k.queue, k.state, k.ready_slot, f.n AS fold_n, f.folded_before
        FROM keys k
        LEFT JOIN LATERAL (
            SELECT c.n, c.folded_before FROM awa.done_counts c
            WHERE c.queue = k.queue AND c.state = k.state AND c.ready_slot = k.ready_slot
              AND c.folded_before IS NOT NULL
            ORDER BY c.folded_before DESC LIMIT 1) f ON true
    )
    SELECT l.queue, l.state, l.ready_slot, l.fold_n, l.folded_before FROM latest l
$$;
