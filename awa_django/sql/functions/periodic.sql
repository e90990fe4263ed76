-- A fire time as the text stored in cron_fire_time: UTC, ISO 8601, 'Z' (2030-03-31T01:30:00Z).
CREATE OR REPLACE FUNCTION awa._cron_time_v1(p_at timestamp with time zone)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
    SELECT to_char(p_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS') ||
           CASE WHEN extract(microseconds FROM p_at)::bigint % 1000000 = 0 THEN ''
                ELSE to_char(p_at AT TIME ZONE 'UTC', '.US') END || 'Z'
$$;

-- Replace the set of schedules with p_schedules, a JSON array of objects with the columns
-- name, kind, cron_expr, timezone, catch_up, queue, priority, max_attempts, args,
-- deadline_secs, metadata, tags (as the table names them). New schedules start firing after
-- now(); a changed expression or time zone starts again from now() (fires are never computed
-- across two definitions); other changes keep the schedule's place. Rows not in p_schedules
-- are deleted: a schedule removed from code stops firing. Rows whose definition is unchanged
-- are not written (no dead tuple per start). Pause state is never touched. Returns one row per
-- schedule created, updated or removed.
CREATE OR REPLACE FUNCTION awa.cron_sync_v1(p_schedules jsonb)
 RETURNS TABLE(name text, change text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
#variable_conflict use_column
BEGIN
    IF jsonb_typeof(p_schedules) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'schedules: must be a JSON array' USING ERRCODE = '22023';
    END IF;
    PERFORM pg_advisory_xact_lock(4282181, 0);
    RETURN QUERY
    WITH input AS (
        SELECT s.name, s.kind, s.cron_expr, s.timezone, s.catch_up, s.queue, s.priority,
               s.max_attempts, s.args, s.deadline_secs, s.metadata, s.tags
        FROM jsonb_to_recordset(p_schedules) AS s(
            name text, kind text, cron_expr text, timezone text, catch_up integer, queue text,
            priority smallint, max_attempts smallint, args jsonb,
            deadline_secs double precision, metadata jsonb, tags text[])
    ), removed AS (
        DELETE FROM awa.cron_schedules c
        WHERE NOT EXISTS (SELECT 1 FROM input i WHERE i.name = c.name)
        RETURNING c.name
    ), written AS (
        INSERT INTO awa.cron_schedules AS c (
            name, kind, cron_expr, timezone, catch_up, queue, priority, max_attempts, args,
            deadline_secs, metadata, tags, fire_after)
        SELECT i.name, i.kind, i.cron_expr, i.timezone, i.catch_up, i.queue, i.priority,
               i.max_attempts, i.args, i.deadline_secs, i.metadata, i.tags, now()
        FROM input i
        ON CONFLICT ON CONSTRAINT cron_schedules_pkey DO UPDATE SET
            kind = EXCLUDED.kind, cron_expr = EXCLUDED.cron_expr, timezone = EXCLUDED.timezone,
            catch_up = EXCLUDED.catch_up, queue = EXCLUDED.queue, priority = EXCLUDED.priority,
            max_attempts = EXCLUDED.max_attempts, args = EXCLUDED.args,
            deadline_secs = EXCLUDED.deadline_secs, metadata = EXCLUDED.metadata,
            tags = EXCLUDED.tags, updated_at = now(),
            fire_after = CASE
                WHEN (c.cron_expr, c.timezone) IS DISTINCT FROM
                     (EXCLUDED.cron_expr, EXCLUDED.timezone)
                THEN GREATEST(c.fire_after, now())
                ELSE c.fire_after END
        WHERE (c.kind, c.cron_expr, c.timezone, c.catch_up, c.queue, c.priority,
               c.max_attempts, c.args, c.deadline_secs, c.metadata, c.tags)
              IS DISTINCT FROM
              (EXCLUDED.kind, EXCLUDED.cron_expr, EXCLUDED.timezone, EXCLUDED.catch_up,
               EXCLUDED.queue, EXCLUDED.priority, EXCLUDED.max_attempts, EXCLUDED.args,
               EXCLUDED.deadline_secs, EXCLUDED.metadata, EXCLUDED.tags)
        RETURNING c.name, (c.xmax = 0) AS created
    )
    SELECT r.name, 'removed'::text FROM removed r
    UNION ALL
    SELECT w.name, CASE WHEN w.created THEN 'created' ELSE 'updated' END FROM written w;
END
$$;

-- Fire one schedule at p_fire_at if, on the database clock and in this transaction, its
-- fire_after is still p_after, p_fire_at is above it and not in the future, and it is not
-- paused: enqueue its job (metadata cron_name, cron_fire_time) and move fire_after and
-- last_fire_at to p_fire_at. Returns the job id, or NULL when the schedule did not fire
-- (another leader fired it, it was paused, resumed, changed or removed, or p_fire_at is not
-- due). Needs READ COMMITTED: a racing fire then waits and finds the condition false, instead
-- of failing with a serialization error. The limits are awa.enqueue_one_v2's.
CREATE OR REPLACE FUNCTION awa.cron_fire_v1(
    p_name text, p_after timestamp with time zone, p_fire_at timestamp with time zone,
    p_args_max_bytes integer DEFAULT 1048576, p_metadata_max_bytes integer DEFAULT 65536,
    p_json_max_depth integer DEFAULT 32, p_max_tags integer DEFAULT 20,
    p_tag_max_length integer DEFAULT 100)
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
DECLARE
    v_row awa.cron_schedules;
    v_job bigint;
BEGIN
    PERFORM awa._require_read_committed_v1('awa.cron_fire_v1');
    SELECT * INTO v_row FROM awa.cron_schedules c
    WHERE c.name = p_name AND c.fire_after = p_after AND p_fire_at > c.fire_after
      AND p_fire_at <= now() AND c.paused_at IS NULL
    -- A row locked elsewhere (another leader firing it, an operator's transaction) is not
    -- waited for: this fire is tried again on the next pass, and no other schedule waits.
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    -- The job is unique by (schedule, fire time) in every state (functions/unique.sql): a second job
    -- for one fire time is refused even if this row's guard were ever bypassed.
    SELECT e.job_id INTO v_job FROM awa.enqueue_one_v3(
        v_row.kind, v_row.queue, v_row.priority, v_row.args, v_row.max_attempts, NULL, NULL,
        v_row.deadline_secs,
        (COALESCE(v_row.metadata, '{}'::jsonb) - 'cron_trigger') || jsonb_build_object(
            'cron_name', p_name, 'cron_fire_time', awa._cron_time_v1(p_fire_at)),
        v_row.tags, p_args_max_bytes, p_metadata_max_bytes, p_json_max_depth, p_max_tags,
        p_tag_max_length,
        p_unique_key => 'cron:' || p_name || '@' || awa._cron_time_v1(p_fire_at),
        p_unique_states => awa.unique_states_v1()) e;
    UPDATE awa.cron_schedules c
    SET fire_after = p_fire_at, last_fire_at = p_fire_at, last_job_id = v_job
    WHERE c.name = p_name;
    RETURN v_job;
END
$$;

-- Enqueue one job of a schedule now, whatever its pause state, without touching its fire
-- times (metadata cron_name, cron_fire_time = now, cron_trigger = 'manual'). Returns the job
-- id, or NULL for an unknown schedule.
CREATE OR REPLACE FUNCTION awa.cron_trigger_v1(
    p_name text, p_args_max_bytes integer DEFAULT 1048576,
    p_metadata_max_bytes integer DEFAULT 65536, p_json_max_depth integer DEFAULT 32,
    p_max_tags integer DEFAULT 20, p_tag_max_length integer DEFAULT 100)
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
DECLARE
    v_row awa.cron_schedules;
    v_job bigint;
BEGIN
    SELECT * INTO v_row FROM awa.cron_schedules c WHERE c.name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT e.job_id INTO v_job FROM awa.enqueue_one_v2(
        v_row.kind, v_row.queue, v_row.priority, v_row.args, v_row.max_attempts, NULL, NULL,
        v_row.deadline_secs,
        COALESCE(v_row.metadata, '{}'::jsonb) || jsonb_build_object(
            'cron_name', p_name, 'cron_fire_time', awa._cron_time_v1(now()),
            'cron_trigger', 'manual'),
        v_row.tags, p_args_max_bytes, p_metadata_max_bytes, p_json_max_depth, p_max_tags,
        p_tag_max_length) e;
    UPDATE awa.cron_schedules c SET last_job_id = v_job WHERE c.name = p_name;
    RETURN v_job;
END
$$;

-- Pause (p_paused) or resume a schedule. A paused schedule does not fire; on resume it starts
-- again from now(): fires that fell in the pause are skipped, not caught up. Returns whether
-- the schedule exists; a schedule already in the asked state is not written.
CREATE OR REPLACE FUNCTION awa.cron_pause_v1(
    p_name text, p_paused boolean, p_by text DEFAULT NULL::text)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
BEGIN
    IF p_paused IS NULL THEN
        RAISE EXCEPTION 'paused: must be true or false' USING ERRCODE = '22023';
    END IF;
    UPDATE awa.cron_schedules c SET
        paused_at = CASE WHEN p_paused THEN now() END,
        paused_by = CASE WHEN p_paused THEN p_by END,
        fire_after = CASE WHEN p_paused THEN c.fire_after ELSE GREATEST(c.fire_after, now()) END
    WHERE c.name = p_name AND (c.paused_at IS NOT NULL) IS DISTINCT FROM p_paused;
    RETURN EXISTS (SELECT 1 FROM awa.cron_schedules c WHERE c.name = p_name);
END
$$;
