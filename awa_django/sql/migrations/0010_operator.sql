-- awa_django migration 0010: what operators and their probes need (issue 18).
--
-- * awa.queue_lag_v1(): per queue, the approximate depth (as awa.queue_depth_v1) and the lag
--   (age of the oldest unclaimed job at the head of any of its lanes), read from the lane
--   cursors and one index probe per lane: never a scan of the ready ring or of history. For
--   health probes (awa_health, the health view) and the metrics' observable gauges.
-- * awa.queue_dlq_v1(queue, enabled): switch a queue's dead letter queue on or off
--   (queue_meta.dlq_enabled, which every failing path already reads).
-- * awa.history_retry_v1(ids, by, queue, priority, retention): retry failed or cancelled jobs
--   from terminal history as new jobs, and awa.history_retries, which records each one (so a
--   job is retried from history at most once while it is there, and who did it).

-- Lag ----------------------------------------------------------------------------------------------

-- One row per queue that has lanes: available (approximate: enqueue sequence minus claim
-- cursor, summed over its lanes; it over-counts briefly, like awa.queue_depth_v1),
-- lag_seconds (now() minus the run_at of the oldest unclaimed, uncancelled job at the head of
-- a lane; NULL when nothing waits) and paused. Each lane costs its cursor, its sequence and one
-- index probe of ready_entries from the cursor on: the head of a lane is its oldest job in
-- lane order, so lag_seconds is the age of the oldest waiting job give or take the FIFO order
-- of lanes (a promoted job is appended when it is promoted, behind jobs enqueued after its
-- run_at).
CREATE FUNCTION awa.queue_lag_v1()
RETURNS TABLE (queue text, available bigint, lag_seconds double precision, paused boolean)
LANGUAGE sql STABLE AS $$
    WITH lanes AS (
        SELECT l.queue, l.lane_id, awa.lane_cursor_v1(l.lane_id) AS cursor,
               COALESCE(pg_sequence_last_value(l.enqueue_seq), 0) AS last_seq
        FROM awa.queue_lanes l
    )
    SELECT x.queue,
           sum(GREATEST(x.last_seq - x.cursor, 0))::bigint,
           extract(epoch FROM now() - min(h.run_at))::double precision,
           COALESCE(bool_or(m.paused), false)
    FROM lanes x
    LEFT JOIN LATERAL (
        SELECT e.run_at FROM awa.ready_entries e
        WHERE x.last_seq > x.cursor AND e.lane_id = x.lane_id AND e.lane_seq > x.cursor
          AND NOT EXISTS (
              SELECT 1 FROM awa.ready_tombstones t
              WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                AND t.ready_slot = e.ready_slot)
        ORDER BY e.lane_seq
        LIMIT 1
    ) h ON true
    LEFT JOIN awa.queue_meta m ON m.queue = x.queue
    GROUP BY x.queue
    ORDER BY x.queue
$$;

-- Dead letter queue on or off, per queue ----------------------------------------------------------

-- Set whether the jobs of p_queue that fail for good go to the DLQ (true, the default of every
-- queue) or to history as failed (false). Every failing path (a handler's failure, rescue, a
-- callback's error) reads queue_meta.dlq_enabled when it decides. Returns whether the setting
-- changed; an unchanged one is not written (no dead tuple for a process that syncs
-- AWA["QUEUES"] at start).
CREATE FUNCTION awa.queue_dlq_v1(p_queue text, p_enabled boolean)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_old boolean;
BEGIN
    IF NOT awa.valid_queue_name(p_queue) THEN
        RAISE EXCEPTION 'queue: % is not a valid queue name ([a-z0-9_.-]{1,63})', quote_nullable(p_queue)
            USING ERRCODE = '22023';
    END IF;
    IF p_enabled IS NULL THEN
        RAISE EXCEPTION 'enabled: must be true or false' USING ERRCODE = '22023';
    END IF;
    SELECT m.dlq_enabled INTO v_old FROM awa.queue_meta m WHERE m.queue = p_queue;
    INSERT INTO awa.queue_meta AS m (queue, dlq_enabled) VALUES (p_queue, p_enabled)
    ON CONFLICT (queue) DO UPDATE SET dlq_enabled = EXCLUDED.dlq_enabled, updated_at = now()
    WHERE m.dlq_enabled IS DISTINCT FROM EXCLUDED.dlq_enabled;
    RETURN COALESCE(v_old, true) IS DISTINCT FROM p_enabled;
END
$$;

-- Retry from terminal history -----------------------------------------------------------------

-- One row per job retried from history: the job, the job its retry enqueued, who asked and
-- when. A job is retried from history at most once while the row lives; rows older than the
-- history they refer to are deleted by awa.history_retry_v1 itself (operator-scale: one row
-- per retried job).
CREATE TABLE IF NOT EXISTS awa.history_retries (
    job_id bigint PRIMARY KEY,
    retry_job_id bigint,
    retried_by text,
    retried_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS history_retries_at_idx ON awa.history_retries (retried_at);

-- Retry failed and cancelled jobs of terminal history. Each one found is enqueued again as a
-- new job (a new id, attempt 0, available at once) through awa.enqueue_one_v3, with the
-- original's kind, arguments, queue and priority (or p_queue, p_priority), max_attempts, tags,
-- per-job deadline (when its body is still in the ready ring) and metadata, plus three reserved
-- keys: "awa:retried_from" (the original's id), "awa:retried_by" (p_by) and "awa:retried_at".
-- A unique job takes its key again; when another job holds it, the retry is refused. The
-- original stays in history unchanged (history is append-only).
--
-- Returns one row per requested id, with its kind and queue (the retry's queue when retried):
-- outcome 'retried' (retry_job_id: the new job),
-- 'already_retried' (by an earlier call: retry_job_id is that retry's job), 'refused' (a unique
-- job whose key another job holds: retry_job_id is the holder), 'not_retryable' (completed)
-- or 'not_found' (not in history: unknown, live, dead-lettered or pruned). Rows of
-- awa.history_retries older than p_keep seconds are deleted first.
--
-- READ COMMITTED is required (unique keys are taken with fresh snapshots).
CREATE FUNCTION awa.history_retry_v1(
    p_job_ids bigint[], p_by text DEFAULT NULL, p_queue text DEFAULT NULL,
    p_priority integer DEFAULT NULL, p_keep double precision DEFAULT 172800,
    p_args_max_bytes integer DEFAULT 1048576, p_metadata_max_bytes integer DEFAULT 65536,
    p_json_max_depth integer DEFAULT 32, p_max_tags integer DEFAULT 20,
    p_tag_max_length integer DEFAULT 100)
RETURNS TABLE (job_id bigint, outcome text, retry_job_id bigint, kind text, queue text)
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    d record;
    v_spec jsonb;
    v_new record;
    v_metadata jsonb;
    v_done bigint[] := '{}';
BEGIN
    PERFORM awa._require_read_committed_v1('awa.history_retry_v1');
    IF p_queue IS NOT NULL AND NOT awa.valid_queue_name(p_queue) THEN
        RAISE EXCEPTION 'queue: % is not a valid queue name ([a-z0-9_.-]{1,63})', quote_nullable(p_queue)
            USING ERRCODE = '22023';
    END IF;
    IF p_priority IS NOT NULL AND NOT awa.valid_priority(p_priority) THEN
        RAISE EXCEPTION 'priority: % is outside -100..100', p_priority USING ERRCODE = '22023';
    END IF;
    IF p_by IS NOT NULL AND length(p_by) > 255 THEN
        RAISE EXCEPTION 'by: at most 255 characters' USING ERRCODE = '22023';
    END IF;
    DELETE FROM awa.history_retries h
    WHERE h.retried_at < now() - make_interval(secs => LEAST(GREATEST(p_keep, 0), awa._max_seconds_v1()));
    FOR d IN
        SELECT x.job_id, x.state, x.kind, x.queue,
               COALESCE(x.priority, r.priority) AS priority,
               COALESCE(x.args, r.args) AS args,
               COALESCE(x.max_attempts, r.max_attempts) AS max_attempts,
               COALESCE(x.metadata, r.metadata) AS metadata,
               COALESCE(x.tags, r.tags) AS tags,
               r.deadline_secs
        FROM awa.done_entries x
        LEFT JOIN awa.ready_entries r
               ON r.lane_id = x.lane_id AND r.lane_seq = x.lane_seq AND r.ready_slot = x.ready_slot
        WHERE x.job_id = ANY (p_job_ids)
        ORDER BY x.job_id
    LOOP
        v_done := v_done || d.job_id;
        job_id := d.job_id;
        kind := d.kind;
        queue := d.queue;
        IF d.state NOT IN ('failed', 'cancelled') THEN
            outcome := 'not_retryable';
            retry_job_id := NULL;
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- Waits for a concurrent retry of the same job to commit or roll back.
        INSERT INTO awa.history_retries AS h (job_id, retry_job_id, retried_by)
        VALUES (d.job_id, NULL, p_by)
        ON CONFLICT ON CONSTRAINT history_retries_pkey DO NOTHING;
        IF NOT FOUND THEN
            outcome := 'already_retried';
            SELECT h.retry_job_id INTO retry_job_id FROM awa.history_retries h
            WHERE h.job_id = d.job_id;
            RETURN NEXT;
            CONTINUE;
        END IF;
        v_spec := d.metadata -> 'awa:unique';
        v_metadata := (COALESCE(d.metadata, '{}'::jsonb) - 'awa:unique' - 'awa:retried_from'
                       - 'awa:retried_by' - 'awa:retried_at')
                      || jsonb_build_object('awa:retried_from', d.job_id, 'awa:retried_by', p_by,
                                            'awa:retried_at', now());
        IF jsonb_typeof(v_spec) <> 'object' THEN
            v_spec := NULL;
        END IF;
        SELECT e.job_id, e.duplicate INTO v_new
        FROM awa.enqueue_one_v3(
            d.kind, COALESCE(p_queue, d.queue), COALESCE(p_priority, d.priority), d.args,
            d.max_attempts, NULL, NULL, d.deadline_secs, v_metadata, d.tags,
            p_args_max_bytes, p_metadata_max_bytes, p_json_max_depth, p_max_tags,
            p_tag_max_length,
            v_spec IS NOT NULL,
            CASE WHEN jsonb_typeof(v_spec -> 'key') = 'string' THEN v_spec ->> 'key' END,
            CASE WHEN jsonb_typeof(v_spec -> 'for') = 'number'
                 THEN LEAST((v_spec ->> 'for')::double precision, 3155760000) END,
            CASE WHEN jsonb_typeof(v_spec -> 'states') = 'array'
                 THEN (SELECT array_agg(DISTINCT s) FROM jsonb_array_elements_text(v_spec -> 'states') s
                       WHERE s = ANY (awa.unique_states_v1())) END) e;
        IF v_new.duplicate THEN
            DELETE FROM awa.history_retries h WHERE h.job_id = d.job_id;
            outcome := 'refused';
        ELSE
            UPDATE awa.history_retries h SET retry_job_id = v_new.job_id WHERE h.job_id = d.job_id;
            outcome := 'retried';
            queue := COALESCE(p_queue, d.queue);
        END IF;
        retry_job_id := v_new.job_id;
        RETURN NEXT;
    END LOOP;
    RETURN QUERY
    SELECT u.id, 'not_found'::text, NULL::bigint, NULL::text, NULL::text
    FROM unnest(p_job_ids) AS u(id) WHERE u.id <> ALL (v_done) GROUP BY u.id;
END
$$;
