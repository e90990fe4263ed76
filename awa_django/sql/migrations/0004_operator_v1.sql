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

-- Cancel every job of a queue that is waiting to run (available, scheduled, retryable), up to
-- p_limit per call; running jobs finish. Returns the number cancelled.
CREATE FUNCTION awa.queue_drain_v1(p_queue text, p_limit integer DEFAULT 10000)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
    v_n integer := 0;
BEGIN
    FOR v_id IN
        SELECT j.id FROM awa.live_jobs j
        WHERE j.queue = p_queue AND j.state IN ('available', 'scheduled', 'retryable')
        ORDER BY j.id LIMIT p_limit
    LOOP
        IF awa.cancel_v1(v_id, 'queue drained') IS NOT NULL THEN
            v_n := v_n + 1;
        END IF;
    END LOOP;
    RETURN v_n;
END
$$;

-- Per queue: exact counts, the age of the oldest available job (lag, seconds) and jobs
-- completed in the last hour. For operators; scans the live planes and recent history.
CREATE FUNCTION awa.queue_stats_v1()
RETURNS TABLE (queue text, available bigint, running bigint, waiting_external bigint,
               scheduled bigint, retryable bigint, completed bigint, failed bigint,
               cancelled bigint, dlq bigint, paused boolean, lag_seconds double precision,
               completed_last_hour bigint)
LANGUAGE sql STABLE AS $$
    SELECT c.*,
           (SELECT extract(epoch FROM now() - min(j.run_at)) FROM awa.live_jobs j
            WHERE j.queue = c.queue AND j.state = 'available'),
           (SELECT count(*) FROM awa.done_entries d
            WHERE d.queue = c.queue AND d.state = 'completed'
              AND d.finalized_at > now() - interval '1 hour')
    FROM awa.queue_counts_v1() c
$$;

-- Completions per minute of the last hour for one queue (NULL: all), oldest first, 60 buckets.
CREATE FUNCTION awa.throughput_v1(p_queue text DEFAULT NULL)
RETURNS TABLE (minute timestamptz, completed bigint)
LANGUAGE sql STABLE AS $$
    SELECT b.minute, count(d.job_id)
    FROM generate_series(date_trunc('minute', now()) - interval '59 minutes',
                         date_trunc('minute', now()), interval '1 minute') AS b(minute)
    LEFT JOIN awa.done_entries d
      ON d.state = 'completed' AND (p_queue IS NULL OR d.queue = p_queue)
     AND d.finalized_at >= b.minute AND d.finalized_at < b.minute + interval '1 minute'
    GROUP BY b.minute
    ORDER BY b.minute
$$;
